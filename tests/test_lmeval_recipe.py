"""docs/lmeval-offline.md runs as written: its first code block (an lm-eval 0.4.9.2 run of a local task on a local
model, then audit.py --lm-eval on it) is taken from the page and run line by line in a scratch directory that holds
what the commands name (the repository's scripts and the committed fixtures, linked), with an empty Hugging Face
home: nothing cached, nothing fetched. The run must write lm-eval's files and the audit must PASS."""
import json
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
