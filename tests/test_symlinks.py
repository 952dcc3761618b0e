"""A venv, HOME, cache root or --out parent reached through a symlink runs exactly as the real path does.

Each case runs the real scripts in a subprocess and compares the protocol evidence with the real-path smoke run
(smoke_run): records.jsonl byte for byte, summary.json, identity.json and the official config, then audits it.
Symlinks *inside* an evidence directory stay refused (tests/test_audit.py); these are links a user gives."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SMOKE_PROTOCOL = ("--smoke", "--experiment", "protocol")
# Variables that would otherwise move the caches below HOME elsewhere: unset, so that HOME is what is exercised.
HOME_OVERRIDES = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "HF_HOME", "HF_DATASETS_CACHE",
                  "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "MPLCONFIGDIR")


def run_py(python, *args, env=None, drop=()):
    """A repository script under `python` (run_cli always uses the test's own interpreter)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    full_env.update(env or {})
    for name in drop:
        full_env.pop(name, None)
    return subprocess.run([str(python), *map(str, args)], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=1800)


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def linked(tmp_path, name, target):
    link = tmp_path / name
    link.symlink_to(target, target_is_directory=True)
    return link


def venv_link(tmp_path):
    """A symlink to the venv running the tests; its bin/python gets the link as sys.prefix."""
    return linked(tmp_path, "venv-link", Path(sys.executable).parents[1])


def assert_same_protocol_evidence(real, out, path_spelled_differently=False):
    """The protocol evidence of `out` is the real-path run's, but for the run id (one per run) and, when the cache
    path is spelled differently, what records that spelling: the model path in HFLM's arguments and the hash of
    the official config that holds it (two spellings of the real path differ the same way)."""
    assert (out / "protocol/records.jsonl").read_bytes() == (real / "protocol/records.jsonl").read_bytes()
    read = lambda o, f: json.loads((o / "protocol" / f).read_text())
    assert read(out, "summary.json") == read(real, "summary.json")
    varies = {"run_id"} | ({"official_config_sha256"} if path_spelled_differently else set())
    strip = lambda d: {k: v for k, v in d.items() if k not in varies}
    assert strip(read(out, "identity.json")) == strip(read(real, "identity.json"))
    official, real_official = read(out, "config.json")["official"], read(real, "config.json")["official"]
    if path_spelled_differently:
        official, real_official = ({k: v for k, v in o.items() if k != "hflm"} for o in (official, real_official))
    # lm_eval_files_sha256 included: the lm-eval files hash the same whichever path form reads them
    assert official == real_official


@pytest.mark.slow
def test_lm_eval_dir_is_the_form_lm_eval_itself_uses(tmp_path):
    """Under a symlinked venv, official.LM_EVAL_DIR is the directory as imported (what lm-eval's TaskManager
    compares its task paths with), and the file hashes equal those read through the resolved path."""
    script = """
import hashlib, json
from pathlib import Path
import lm_eval, lm_eval.tasks
from experiments import official
tasks_dir = Path(lm_eval.tasks.__file__).parent
assert official.LM_EVAL_DIR / "tasks" == tasks_dir, (official.LM_EVAL_DIR, tasks_dir)
name = official.task_config("tasks/glue/sst2/default.yaml", "never-read.parquet")["task"]
# what lm-eval's get_task_dict does with the index official.task_manager builds (tasks/__init__.py)
Path(official.task_manager(name).task_index[name]["yaml_path"]).relative_to(tasks_dir)
real = Path(lm_eval.__file__).resolve().parent
print(json.dumps({"link_form": str(official.LM_EVAL_DIR) != str(real), "hashes_equal": official.file_hashes() ==
                  {rel: hashlib.sha256((real / rel).read_bytes()).hexdigest() for rel in official.PATH_FILES}}))
"""
    proc = ok(run_py(venv_link(tmp_path) / "bin" / "python", "-c", script))
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"link_form": True, "hashes_equal": True}


@pytest.mark.slow
def test_symlinked_venv_runs_as_the_real_one(prepared_cache, smoke_run, tmp_path):
    out = tmp_path / "O"
    python = venv_link(tmp_path) / "bin" / "python"
    # --no-cache: both paths score under the linked venv, none of it served from the real run's result cache
    ok(run_py(python, "run.py", "--cache", prepared_cache, "--out", out, *SMOKE_PROTOCOL, "--no-cache"))
    assert_same_protocol_evidence(smoke_run[0], out)
    ok(run_py(python, "audit.py", out))


@pytest.mark.slow
def test_symlinked_home_runs_as_the_real_one(prepared_cache, smoke_run, tmp_path):
    real_home = tmp_path / "home"
    real_home.mkdir()
    env, drop = {"HOME": str(linked(tmp_path, "home-link", real_home))}, HOME_OVERRIDES
    out = tmp_path / "O"
    ok(run_py(sys.executable, "prepare.py", "--cache", prepared_cache, "--verify", env=env, drop=drop))
    ok(run_py(sys.executable, "run.py", "--cache", prepared_cache, "--out", out, *SMOKE_PROTOCOL, "--no-cache",
              env=env, drop=drop))
    # the libraries' caches under HOME were written through the link: the case was exercised, not bypassed
    assert any(real_home.iterdir()), "nothing used HOME: this test no longer exercises a symlinked HOME"
    assert_same_protocol_evidence(smoke_run[0], out)
    ok(run_py(sys.executable, "audit.py", out, "--tokens", env=env, drop=drop))


@pytest.mark.slow
def test_symlinked_cache_root_runs_as_the_real_one(prepared_cache, smoke_run, tmp_path):
    cache = linked(tmp_path, "cache-link", prepared_cache)
    out = tmp_path / "O"
    ok(run_py(sys.executable, "prepare.py", "--cache", cache, "--verify"))
    ok(run_py(sys.executable, "run.py", "--cache", cache, "--out", out, *SMOKE_PROTOCOL))
    # evidence format 3: the public files name the cache <cache> however it is spelled, so nothing differs (the
    # spelling, through the link, is in O/private/protocol/paths.json)
    assert_same_protocol_evidence(smoke_run[0], out)
    assert json.loads((out / "protocol/config.json").read_text())["model"]["dir"] == \
        "<cache>/models/smollm2-135m-instruct-q4_1"
    assert json.loads((out / "private/protocol/paths.json").read_text())["paths"]["<cache>"] == str(cache)
    ok(run_py(sys.executable, "audit.py", out))
    ok(run_py(sys.executable, "audit.py", out, "--tokens", "--cache", cache))


@pytest.mark.slow
def test_symlinked_out_parent_runs_as_the_real_one(prepared_cache, smoke_run, tmp_path):
    real_parent = tmp_path / "parent"
    real_parent.mkdir()
    out = linked(tmp_path, "parent-link", real_parent) / "O"
    ok(run_py(sys.executable, "run.py", "--cache", prepared_cache, "--out", out, *SMOKE_PROTOCOL))
    assert (real_parent / "O" / "MANIFEST.json").is_file()
    assert_same_protocol_evidence(smoke_run[0], out)
    ok(run_py(sys.executable, "audit.py", out))
