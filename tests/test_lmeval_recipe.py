"""docs/lmeval-offline.md runs as written: its first code block (an lm-eval 0.4.9.2 run of a local task on a local
model, then audit.py --lm-eval on it) is taken from the page and run line by line in a scratch directory that holds
what the commands name (the repository's scripts and the committed fixtures, linked), with an empty Hugging Face
home: nothing cached, nothing fetched. The run must write lm-eval's files and the audit must PASS."""
import json
import math
import os
import re
import subprocess

import pytest

from conftest import REPO
from evidence_audit import kernels

# whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = pytest.mark.kernels

DOC = REPO / "docs" / "lmeval-offline.md"
LINKED = (".venv", "audit.py", "registry.py", "evidence_audit", "tools", "tests")


def recipe_commands():
    """The first fenced block of the page, backslash continuations joined: one command per line."""
    block = re.search(r"```bash\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S).group(1)
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_recipe_is_two_commands_the_run_then_the_audit():
    run, audit = recipe_commands()
    assert run.startswith(".venv/bin/python tools/lmeval_offline_run.py --model hf ") and "--log_samples" in run
    assert audit.startswith(".venv/bin/python audit.py --lm-eval runs/offline ")


@pytest.mark.slow
def test_the_offline_recipe_runs_as_written(tmp_path):
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "NO_PROXY": "", "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9"}       # a request would fail at once: the recipe must need none
    run, audit = recipe_commands()
    proc = subprocess.run(["bash", "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = list((tmp_path / "runs" / "offline").glob("*/results_*.json"))
    assert len(results) == 1 and json.loads(results[0].read_text())["chat_template"] is not None
    proc = subprocess.run(["bash", "-c", audit], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-1000:]
    # the recipe's run (transformers' default sdpa attention, batch 4) made on this machine reaches the equality mode,
    # unless this process restricts the kernels (the AVX2 tier of .ci/run), which lm-eval would not record
    rescored = [ln for ln in proc.stdout.splitlines() if "loglikelihoods re-scored in the run's dtype" in ln]
    assert rescored and all("(sdpa attention), lm-eval's batches of 4" in ln for ln in rescored), rescored
    assert all(("equality expected" in ln) == (not kernels.kernel_settings()) for ln in rescored), rescored


AVX2_ONLY = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def without_avx512(results_path):
    """The results file as a virtual machine of this CPU that hides AVX-512 from its guest records it: the lscpu
    Flags line less the AVX-512 family (kernels.WIDER_THAN_AVX2)."""
    r = json.loads(results_path.read_text())
    r["pretty_env_info"] = re.sub(
        r"^(Flags:\s*)(.*)$",
        lambda m: m.group(1) + " ".join(f for f in m.group(2).split() if not f.startswith(kernels.WIDER_THAN_AVX2)),
        r["pretty_env_info"], flags=re.M)
    results_path.write_text(json.dumps(r, indent=2, ensure_ascii=False))


@pytest.mark.slow
def test_a_run_of_this_cpu_without_avx512_is_re_scored_in_a_child_held_to_avx2(tmp_path):
    """The recipe's run made in a process held to AVX2 and recorded as an AVX2-only machine of this CPU's kind
    records it: the audit re-scores it in a child process held to AVX2 (evidence_audit/lmeval/child.py) and finds
    every score bit for bit; a score moved by one float32 ulp then FAILs. (What an AVX2-only virtual machine of this
    CPU would compute was not available to measure: the variables select the libraries' AVX2 kernels here.)"""
    here = kernels.this_machine()
    if here is None or "avx512f" not in here.flags or kernels.kernel_settings():
        pytest.skip("needs a CPU with AVX-512 and an audit at default kernels: nothing to hold back otherwise")
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    clean = {k: v for k, v in os.environ.items() if k not in kernels.KERNEL_VARS}
    env = {**clean, "HF_HOME": str(tmp_path / "hf-home")}
    run, audit = recipe_commands()
    proc = subprocess.run(["bash", "-c", run], cwd=tmp_path, env={**env, **AVX2_ONLY}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = next((tmp_path / "runs" / "offline").glob("*/results_*.json"))
    without_avx512(results)
    report = tmp_path / "report.json"
    proc = subprocess.run(["bash", "-c", f"{audit} --report {report}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-1000:]
    got = json.loads(report.read_text())
    for task in ("toy_chat", "toy_prefix"):
        fig = got["details"][task]["forward"]
        assert fig["equality"] and fig["max_abs_diff"] == 0.0, fig["mode"]
        assert "without AVX-512" in fig["mode"] and "child process held to AVX2" in fig["mode"], fig["mode"]
    samples = next(results.parent.glob("samples_toy_chat_*.jsonl"))
    lines = samples.read_text().splitlines()
    first = json.loads(lines[0])
    ll = float(first["resps"][0][0][0])
    first["resps"][0][0][0] = first["filtered_resps"][0][0] = repr(math.nextafter(ll, 0.0))
    samples.write_text("\n".join([json.dumps(first, ensure_ascii=False)] + lines[1:]) + "\n")
    proc = subprocess.run(["bash", "-c", f"{audit} --report {report}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    bad = [r for r in json.loads(report.read_text())["checks"] if r["status"] == "FAIL"]
    assert proc.returncode == 1 and bad and all(r["level"] == "forward" for r in bad), bad
    assert any("equality expected" in (r["first_failure"] or "") for r in bad), bad
