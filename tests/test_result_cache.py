"""The identity-keyed result cache: keys, exact floats, corruption, killed runs, and real reruns of run.py.

The run.py tests work on a snapshot of the repository in a temp directory, so the code hash (part of every key)
cannot change under them while other files in the working tree are being edited."""
import copy
import json
import shutil
import sqlite3
import struct
import subprocess
import sys

import pytest

import conftest

import config
from conftest import REPO, run_cli
from experiments import result_cache
from experiments.result_cache import ResultCache, cache_key, run_identity

CONFIG = config.effective(("shared", "protocol"))    # the protocol experiment's effective config

BASE_CONFIG = {"dtype": "float32", "attn_implementation": "eager", "threads": 2, "device": "cpu", "batch_size": 1,
               "max_input_tokens": 512, "target_delimiter": " ", "num_fewshot": 0, "tie_rule": "first",
               "sst2_choices": ["negative", "positive"], "fast_batch_size": 16}


def base_run():
    return run_identity(model_sha256="m" * 64, tokenizer_sha256="t" * 64, data_content_sha256="d" * 64,
                        prompt_template_sha256="p" * 64, config=BASE_CONFIG, scorer="independent-parity",
                        code_sha256="c" * 64, versions={"torch": "2.0", "transformers": "4.0"},
                        platform={"cpu": "X", "machine": "x86_64", "torch_cpu_capability": "AVX512",
                                  "kernels": {"env": {"MKL_ENABLE_INSTRUCTIONS": None}, "parallel_info": "x",
                                              "mkl": "Intel(R) oneAPI MKL Version 2024.2"}})


ROWS = [[5, 6, 7, 8, 9], [5, 6, 7, 1]]             # one forward batch: its rows' input ids, longest first
PICKS = [[0, [3524]], [0, [2731]], [1, [3524]]]       # each candidate's row and token ids
BASE_ITEM = result_cache.batch_item(ROWS, PICKS)

RUN_CHANGES = [
    ("model sha", lambda r: r.update(model_sha256="n" * 64)),
    ("tokenizer sha", lambda r: r.update(tokenizer_sha256="u" * 64)),
    ("data content hash", lambda r: r.update(data_content_sha256="e" * 64)),
    ("prompt/template hash", lambda r: r.update(prompt_template_sha256="r" * 64)),
    ("code hash", lambda r: r.update(code_sha256="b" * 64)),
    ("library version", lambda r: r["versions"].update(torch="2.1")),
    ("platform", lambda r: r["platform"].update(torch_cpu_capability="AVX2")),
    ("a kernel variable", lambda r: r["platform"]["kernels"]["env"].update(MKL_ENABLE_INSTRUCTIONS="AVX2")),
    ("torch's parallel info", lambda r: r["platform"]["kernels"].update(parallel_info="at::get_num_threads() : 3")),
    ("the MKL build", lambda r: r["platform"]["kernels"].update(mkl="Intel(R) oneAPI MKL Version 2025.0")),
    ("scorer", lambda r: r.update(scorer="independent-fast")),
    ("scoring config: a new key", lambda r: r["scoring_config"].update(new_setting=1)),
] + [(f"scoring config {k}", (lambda k: lambda r: r["scoring_config"].update({k: "changed"}))(k))
     for k in BASE_CONFIG]
ITEM_CHANGES = [      # a score depends on every row of its batch: each of these is another computation
    ("one token of another row", lambda i: i.update(result_cache.batch_item([ROWS[0], [5, 6, 7, 2]], PICKS))),
    ("one more row in the batch", lambda i: i.update(result_cache.batch_item(ROWS + [[5, 6]], PICKS))),
    ("the rows in another order", lambda i: i.update(result_cache.batch_item(ROWS[::-1], PICKS))),
    ("a candidate's row", lambda i: i.update(result_cache.batch_item(ROWS, [[1, [3524]], *PICKS[1:]]))),
    ("a candidate's token ids", lambda i: i.update(result_cache.batch_item(ROWS, [[0, [3525]], *PICKS[1:]]))),
    ("one candidate fewer", lambda i: i.update(result_cache.batch_item(ROWS, PICKS[:2]))),
]


@pytest.mark.parametrize("part,change", RUN_CHANGES, ids=[c[0] for c in RUN_CHANGES])
def test_key_misses_when_one_run_identity_part_changes(part, change):
    run = base_run()
    changed = copy.deepcopy(run)
    change(changed)
    assert changed != run, part
    assert cache_key(changed, BASE_ITEM) != cache_key(run, BASE_ITEM), part


@pytest.mark.parametrize("part,change", ITEM_CHANGES, ids=[c[0] for c in ITEM_CHANGES])
def test_key_misses_when_one_item_identity_part_changes(part, change):
    item = copy.deepcopy(BASE_ITEM)
    change(item)
    assert cache_key(base_run(), item) != cache_key(base_run(), BASE_ITEM), part


def test_key_is_stable_under_dict_order():
    run = base_run()
    other = run_identity(model_sha256="m" * 64, tokenizer_sha256="t" * 64, data_content_sha256="d" * 64,
                         prompt_template_sha256="p" * 64, config=dict(reversed(list(BASE_CONFIG.items()))),
                         scorer="independent-parity", code_sha256="c" * 64,
                         versions={"transformers": "4.0", "torch": "2.0"},
                         platform={"kernels": {"mkl": "Intel(R) oneAPI MKL Version 2024.2", "parallel_info": "x",
                                               "env": {"MKL_ENABLE_INSTRUCTIONS": None}},
                                   "torch_cpu_capability": "AVX512", "machine": "x86_64", "cpu": "X"})
    assert cache_key(other, dict(reversed(list(BASE_ITEM.items())))) == cache_key(run, BASE_ITEM)


def protocol_context(tmp_path, no_cache=False):
    """The Context run.py builds for the protocol experiment (run.context_for), on fake verified inputs."""
    import run as run_py
    from experiments import protocol
    from experiments.context import Data, Inputs
    from experiments.evidence import Stages

    argv = ["--cache", str(tmp_path), "--out", str(tmp_path / "o"), "--smoke"] + (["--no-cache"] if no_cache else [])
    args = run_py.parse_args(argv)
    inputs = Inputs(cache=tmp_path, model_dir=tmp_path / "m", model_identity={"id": "m", "model_sha256": "m" * 64,
                                                                              "tokenizer_sha256": "t" * 64},
                    data={"fixture-sentiment": Data(id="fixture-sentiment", schema="sst2",
                                        parquet_path=tmp_path / "p.parquet", content_sha256="d" * 64,
                                        split="validation")})
    return run_py.context_for(protocol, args, inputs, run_py.options_of(args), Stages())


def test_scoring_config_is_run_identitys(tmp_path):
    """The cache's scoring-config part is exactly run.py's identity.json scoring config (the scorer is separate):
    the protocol's effective config, its sections named in config_sections."""
    import run as run_py
    from experiments import protocol
    from experiments.context import Result

    ctx = protocol_context(tmp_path)
    env = {"git_commit": None, "git_dirty": None, "code_sha256": "c", "versions": {}, "run_id": "0" * 32}
    result = Result(config={}, records=[], summary={}, headline="", token_stats={}, prompt_template_sha256="p")
    ident = run_py.run_identity(env, ctx, protocol.CONFIG_SECTIONS, result)
    assert result_cache.scoring_config(ctx.config) == ident["scoring_config"] == ctx.config
    assert ident["config_sections"] == ["shared", "protocol"]
    assert not any(k.startswith(("harness_", "options_", "mctaco_", "extraction_")) for k in ident["scoring_config"])


def test_the_run_environment_is_computed_once_and_keys_the_cache(tmp_path, monkeypatch):
    """result_cache.open_for keys on the environment run.py computed once for the run (ctx.environment: code hash,
    versions, CPU and kernels) and the data the experiment read (ctx.data); it computes no environment of its own
    then, and a different kernel environment is a different key."""
    import dataclasses

    from experiments import evidence

    def refuse(*a, **k):
        raise AssertionError("the environment was computed again")

    monkeypatch.setattr(evidence, "environment", refuse)
    monkeypatch.setattr(evidence, "code_sha256", refuse)
    monkeypatch.setattr(evidence, "git_identity", refuse)
    monkeypatch.setattr(result_cache, "platform_identity", refuse)
    env = {"code_sha256": "c" * 64, "versions": {"torch": "x"}, "cpu": "a cpu", "platform": "linux",
           "kernels": {"env": {"MKL_ENABLE_INSTRUCTIONS": None}, "torch_threads": 2}}
    ctx = protocol_context(tmp_path)
    ctx = dataclasses.replace(ctx, environment=env, data=ctx.inputs.data["fixture-sentiment"])
    cache = result_cache.open_for(ctx, "independent-parity", "p" * 64)
    assert cache.run["code_sha256"] == "c" * 64 and cache.run["versions"] == {"torch": "x"}
    assert cache.run["platform"]["kernels"] == env["kernels"] and cache.run["data_content_sha256"] == "d" * 64
    cache.close()
    other = {**env, "kernels": {"env": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, "torch_threads": 2}}
    again = result_cache.open_for(dataclasses.replace(ctx, environment=other), "independent-parity", "p" * 64)
    assert again.run_sha != cache.run_sha
    again.close()


def test_other_sections_do_not_touch_protocol_scores_but_its_own_do(tmp_path, monkeypatch):
    """Through the identity computation run.py uses (run.context_for -> result_cache.open_for): a score stored
    under today's config is served after a harness / options / mctaco / extraction setting changes, and missed
    after a shared or protocol setting changes."""
    from experiments import evidence, protocol

    code = evidence.code_sha256()     # computed once: other files of the working tree may change meanwhile
    monkeypatch.setattr(evidence, "code_sha256", lambda: code)

    def stored_score():
        ctx = protocol_context(tmp_path)
        cache = result_cache.open_for(ctx, "independent-parity", protocol.prompt_template_sha256(ctx.config))
        try:
            return cache.get(BASE_ITEM)
        finally:
            cache.close()

    ctx = protocol_context(tmp_path)
    cache = result_cache.open_for(ctx, "independent-parity", protocol.prompt_template_sha256(ctx.config))
    with cache.batch():
        cache.put(BASE_ITEM, -1.25)
    cache.close()
    assert stored_score() == -1.25
    for section, key, value in (("harness", "harness_batch_size", 99), ("options", "options_letters", ["X", "Y"]),
                                ("mctaco", "mctaco_prompt", "{answer}?"), ("extraction", "extraction_max_new_tokens", 3)):
        monkeypatch.setitem(config.CONFIG[section], key, value)
        assert stored_score() == -1.25, key
    for section, key, value in (("protocol", "tie_rule", "last index wins"), ("shared", "max_input_tokens", 256)):
        with monkeypatch.context() as m:
            m.setitem(config.CONFIG[section], key, value)
            assert stored_score() is None, key
    assert stored_score() == -1.25
    assert result_cache.open_for(protocol_context(tmp_path, no_cache=True), "independent-parity", "p") is None


def test_code_hash_covers_the_listed_files_only(tmp_path, monkeypatch):
    """Editing a scoring module changes the code hash; editing config.py (its values enter the identity per
    section), report.py, audit.py or run.py does not."""
    from experiments import evidence

    others = ("config.py", "report.py", "audit.py", "run.py", "bench.py", "prepare.py")
    for rel in (*evidence.CODE_FILES, *others):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    monkeypatch.setattr(evidence, "REPO", tmp_path)
    before = evidence.code_sha256()
    for rel in others:
        (tmp_path / rel).write_text("# changed\n")
        assert evidence.code_sha256() == before, rel
    for rel in ("experiments/scoring.py", "adapter.py", "harness/metrics.py"):
        (tmp_path / rel).write_text("# changed\n")
        changed = evidence.code_sha256()
        assert changed != before, rel
        before = changed


def repository_imports(rel):
    """The repository files a module imports (at the top or inside a function), package __init__ files included."""
    import ast

    found = set()

    def module_files(dotted):
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):      # a package's __init__ runs before any of its modules
            init = "/".join(parts[:i]) + "/__init__.py"
            if (REPO / init).exists():
                found.add(init)
        for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
            if (REPO / candidate).exists():
                found.add(candidate)

    for node in ast.walk(ast.parse((REPO / rel).read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module_files(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module_files(node.module)
            for alias in node.names:
                module_files(f"{node.module}.{alias.name}")
    return found


def test_code_files_exist_and_every_module_the_experiments_import_is_listed_or_excluded():
    """Every module the experiments reach through their imports (adapter, harness, resources, ...) is either hashed
    (evidence.CODE_FILES) or left out with a stated reason (evidence.CODE_HASH_EXCLUDES)."""
    from experiments import evidence

    assert len(set(evidence.CODE_FILES)) == len(evidence.CODE_FILES)
    assert not set(evidence.CODE_FILES) & set(evidence.CODE_HASH_EXCLUDES)
    for rel in (*evidence.CODE_FILES, *evidence.CODE_HASH_EXCLUDES):
        assert (REPO / rel).is_file(), rel
    assert all(isinstance(why, str) and why for why in evidence.CODE_HASH_EXCLUDES.values())
    todo = [str(p.relative_to(REPO)) for p in sorted((REPO / "experiments").glob("*.py"))]
    reached = set(todo)
    while todo:
        for rel in repository_imports(todo.pop()) - reached:
            reached.add(rel)
            todo.append(rel)
    assert {"adapter.py", "harness/hf_model.py", "harness/sandbox.py", "resources.py"} <= reached
    unaccounted = reached - set(evidence.CODE_FILES) - set(evidence.CODE_HASH_EXCLUDES)
    assert not unaccounted, f"add to evidence.CODE_FILES or give a reason in CODE_HASH_EXCLUDES: {sorted(unaccounted)}"
    # the files harness/sandbox.py starts as a fresh interpreter are not imported, but they run the scored code
    assert {"harness/jail.py", "harness/proctree.py"} <= set(evidence.CODE_FILES)


def test_default_parts_are_this_process_code_hash_versions_and_platform():
    from experiments.evidence import code_sha256

    run = run_identity(model_sha256="m", tokenizer_sha256="t", data_content_sha256="d", prompt_template_sha256="p",
                       config=CONFIG, scorer="independent-parity")
    assert run["code_sha256"] == code_sha256()
    assert run["versions"]["torch"] and run["versions"]["transformers"]
    assert run["platform"]["torch_cpu_capability"]
    kernels = run["platform"]["kernels"]
    assert {"MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR",
            "OMP_NUM_THREADS"} <= set(kernels["env"])
    assert "at::get_num_threads()" in kernels["parallel_info"] and kernels["mkl"] and kernels["onednn"]
    assert run["scoring_config"]["threads"] == CONFIG["threads"]


def test_floats_round_trip_bit_exact(tmp_path):
    import torch

    torch.manual_seed(0)
    values = [float(x) for x in (torch.randn(500) * 30).float()] + [float(torch.finfo(torch.float32).tiny),
                                                                      5e-324, -0.0, 0.1, -1e-45, 1.0 / 3.0,
                                                                      float("-inf"), -17.0]
    cache = ResultCache(tmp_path / "r.sqlite", base_run())
    with cache.batch():
        for i, v in enumerate(values):
            cache.put({**BASE_ITEM, "n": i}, v)
    cache.close()
    cache = ResultCache(tmp_path / "r.sqlite", base_run())
    for i, v in enumerate(values):
        got = cache.get({**BASE_ITEM, "n": i})
        assert struct.pack("<d", got) == struct.pack("<d", v), (i, v, got)
    assert cache.stats()["hits"] == len(values) and cache.stats()["corrupted"] == 0


def test_other_identity_misses_in_the_same_file(tmp_path):
    a = ResultCache(tmp_path / "r.sqlite", base_run())
    with a.batch():
        a.put(BASE_ITEM, -1.5)
    run = base_run()
    run["code_sha256"] = "other"
    b = ResultCache(tmp_path / "r.sqlite", run)
    assert b.get(BASE_ITEM) is None and b.stats()["misses"] == 1
    assert a.get(BASE_ITEM) == -1.5


@pytest.mark.parametrize("tamper", [
    "UPDATE results SET value = '-1.25'",                    # a flipped value (still valid JSON)
    "UPDATE results SET value = 'not json'",
    "UPDATE results SET checksum = 'x'",
    "UPDATE results SET item = replace(item, '\"n_rows\":2', '\"n_rows\":3')",
])
def test_corrupted_row_is_detected_and_recomputed(tmp_path, tamper):
    path = tmp_path / "r.sqlite"
    cache = ResultCache(path, base_run())
    with cache.batch():
        cache.put(BASE_ITEM, -2.5)
    db = sqlite3.connect(path)
    db.execute(tamper)
    db.commit()
    db.close()
    assert cache.get(BASE_ITEM) is None
    st = cache.stats()
    assert st["corrupted"] == 1 and st["hits"] == 0 and st["corrupted_items"] == [BASE_ITEM]
    assert sqlite3.connect(path).execute("SELECT count(*) FROM results").fetchone()[0] == 0   # the row is gone
    with cache.batch():
        cache.put(BASE_ITEM, -2.5)                                                           # recomputed, stored
    assert cache.get(BASE_ITEM) == -2.5


def test_committed_batches_survive_sigkill(tmp_path):
    """A process killed with SIGKILL after K committed batches leaves exactly those K in the file (WAL mode)."""
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(REPO)!r})
sys.path.insert(0, {str(REPO / 'tests')!r})
from test_result_cache import base_run, ROWS, PICKS
from experiments.result_cache import ResultCache
cache = ResultCache({str(tmp_path / 'r.sqlite')!r}, base_run())
for i in range(100):
    cache.put_batch([[i] + ROWS[0], ROWS[1]], PICKS, [-float(i)] * 3)
    if i == 6:
        os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], env={"PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    cache = ResultCache(tmp_path / "r.sqlite", base_run())
    assert [cache.get_batch([[i] + ROWS[0], ROWS[1]], PICKS) for i in range(8)] == \
        [[-float(i)] * 3 for i in range(7)] + [None]


# ---- real runs of run.py (tiny random model: the cache plumbing, not the scores, is under test) -------------

@pytest.fixture
def snapshot(tiny_cache, tmp_path):
    """(repo copy, private cache copy): the code hash is fixed for the test, the results file is its own."""
    return conftest.repo_and_cache_copy(tiny_cache, tmp_path)


def run_protocol(repo, cache, out, *extra, env=None, kill_after_batches=None):
    """run.py's protocol experiment; with kill_after_batches=K, SIGKILLed once its K-th batch is committed."""
    # --replace: these tests rerun into one --out on purpose (one run per O; the old one is kept aside)
    killer = () if kill_after_batches is None else (REPO / "tests" / "kill_after_batches.py", kill_after_batches)
    return run_cli(*killer, repo / "run.py", "--cache", cache, "--out", out, "--replace", "--model",
                   "tiny-random-llama", "--experiment", "protocol", *extra, env=env, cwd=repo)


def cache_info(out):
    return json.loads((out / "protocol" / "config.json").read_text())["independent"]["result_cache"]


def scores(out):
    recs = [json.loads(l) for l in (out / "protocol" / "records.jsonl").read_text().splitlines()]
    return {r["idx"]: (r["independent"]["scores"], r["official"]["scores"]) for r in recs}


@pytest.mark.slow
def test_killed_run_resumes_then_hits_then_recomputes_a_corrupted_row(snapshot, tmp_path):
    repo, cache = snapshot
    out = tmp_path / "out"
    # 1. killed (SIGKILL) after 2 of the 4 forward batches of the 64 development items (16 items each): no
    #    evidence installed, 2 batches committed
    proc = run_protocol(repo, cache, out, kill_after_batches=2)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert not (out / "protocol").exists()
    # 2. rerun: resumes; the 2 finished batches (32 items, 64 candidate scores) come from the cache
    proc = run_protocol(repo, cache, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = cache_info(out)
    assert (info["from_cache"], info["items_from_cache"], info["computed"], info["corrupted"]) == (64, 32, 64, 0)
    assert "independent scores from the result cache: 64/128" in proc.stdout
    first = scores(out)
    # 3. flip one stored batch: detected, recomputed, reported; the other 3 batches are served; results unchanged
    db = sqlite3.connect(cache / "results.sqlite")
    assert db.execute("SELECT count(*) FROM results").fetchone()[0] == 4
    db.execute("UPDATE results SET value = replace(value, '-', '-1') WHERE rowid = (SELECT min(rowid) FROM results)")
    db.commit()
    db.close()
    proc = run_protocol(repo, cache, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = cache_info(out)
    assert (info["from_cache"], info["computed"], info["corrupted"]) == (96, 32, 1)
    assert "96/128 (1 corrupted rows detected and recomputed)" in proc.stdout
    assert scores(out) == first                       # exact: cached floats are the computed floats
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    assert summary["agreement"]["max_abs_diff"] == 0.0   # still bit-exact against lm-eval (which recomputed)


@pytest.mark.slow
def test_settings_no_cache_fast_and_a_code_change(snapshot, tmp_path):
    """End to end on a repository copy (one sequence of runs, each a protocol smoke storing or reading 4 scores):
    editing the harness section of config.py serves all 4 from the cache; --no-cache reads and writes nothing and
    --fast adds the fast-vs-parity figures, which the audit recomputes; editing the protocol section (its tie_rule
    text) misses all 4; so does any code change (the key carries evidence.code_sha256())."""
    repo, cache = snapshot
    proc = run_protocol(repo, cache, tmp_path / "a", "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cache_info(tmp_path / "a")["written"] == 1                  # the smoke's 2 items are one forward batch
    # another experiment's setting: served
    edit_config(repo, '"harness_batch_size": 4,', '"harness_batch_size": 5,')
    proc = run_protocol(repo, cache, tmp_path / "b", "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (cache_info(tmp_path / "b")["from_cache"], cache_info(tmp_path / "b")["computed"]) == (4, 0)
    assert "independent scores from the result cache: 4/4" in proc.stdout
    # --no-cache: nothing read, nothing written; --fast: the summary carries the fast-vs-parity figures
    proc = run_protocol(repo, cache, tmp_path / "c", "--smoke", "--no-cache", "--fast")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = cache_info(tmp_path / "c")
    assert (info["enabled"], info["from_cache"], info["computed"]) == (False, 0, 4)
    assert "result cache off (--no-cache)" in proc.stdout
    fast = json.loads((tmp_path / "c" / "protocol" / "summary.json").read_text())["fast"]
    assert fast["parity_source"].startswith("computed in this run") and fast["passed"]
    assert fast["vs_parity"]["n_argmax_changes"] == 0 and fast["vs_parity"]["max_abs_diff"] <= 1e-4
    n = CONFIG["fast_batch_size"]
    assert set(fast["batch_invariance"]) == {f"parity_vs_fast_batch{n}", "parity_vs_fast_batch1",
                                             f"fast_batch1_vs_batch{n}"}
    recs = [json.loads(l) for l in (tmp_path / "c" / "protocol" / "records.jsonl").read_text().splitlines()]
    assert all(len(r["fast"]["scores"]) == len(r["fast"]["scores_batch1"]) == 2 for r in recs)
    audit = run_cli("audit.py", tmp_path / "c")  # audit.py recomputes the fast figures from the records
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "fast mode records" in audit.stdout
    # the protocol's own setting: misses
    edit_config(repo, '"tie_rule": "first index wins', '"tie_rule": "the first index wins')
    proc = run_protocol(repo, cache, tmp_path / "d", "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (cache_info(tmp_path / "d")["from_cache"], cache_info(tmp_path / "d")["computed"]) == (0, 4)
    identity = json.loads((tmp_path / "d" / "protocol" / "identity.json").read_text())
    assert identity["scoring_config"]["tie_rule"].startswith("the first index wins")
    assert "harness_batch_size" not in identity["scoring_config"]
    assert scores(tmp_path / "a") == scores(tmp_path / "b") == scores(tmp_path / "d")
    # any code change misses
    with open(repo / "experiments" / "scoring.py", "a") as f:
        f.write("\n# a comment changes the code hash\n")
    proc = run_protocol(repo, cache, tmp_path / "e", "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = cache_info(tmp_path / "e")
    assert (info["from_cache"], info["computed"]) == (0, 4)


def edit_config(repo, old, new):
    path = repo / "config.py"
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


# ---- a damaged results.sqlite: detected before any scoring, set aside with one warning, rebuilt -----------------

def good_cache_file(path):
    cache = ResultCache(path, base_run())
    with cache.batch():
        for i in range(50):
            cache.put({"idx": i, "pad": "x" * 200}, -1.0 - i / 7)
    cache.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def damage_garbage(path):
    path.write_bytes(b"\x00garbage that is not SQLite" * 200)


def damage_truncated(path):
    data = path.read_bytes()
    assert len(data) > 8192
    path.write_bytes(data[:len(data) // 2 + 17])


def damage_wrong_schema(path):
    path.unlink()
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE results (key TEXT PRIMARY KEY, value TEXT)")
    db.commit()
    db.close()


def damage_flipped_page(path):
    data = bytearray(path.read_bytes())
    for k in range(4096 + 8, 4096 + 40):         # the second page's b-tree header: a malformed page
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES = {"garbage": damage_garbage, "truncated": damage_truncated, "wrong-schema": damage_wrong_schema,
           "flipped-page": damage_flipped_page}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_cache_file_is_set_aside_and_rebuilt(tmp_path, kind):
    path = tmp_path / "results.sqlite"
    good_cache_file(path)
    assert result_cache.damage(path) is None and result_cache.set_aside_if_corrupt(path) is None
    DAMAGES[kind](path)
    warning = result_cache.set_aside_if_corrupt(path)
    assert warning is not None and "\n" not in warning and "set aside as results.sqlite.corrupt-" in warning
    assert not path.exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("results.sqlite.corrupt-")]
    assert aside, "the damaged file is kept for inspection"
    cache = ResultCache(path, base_run())             # rebuilt: a new, working cache
    with cache.batch():
        cache.put({"idx": 1}, -0.5)
    assert cache.get({"idx": 1}) == -0.5
    cache.close()
    assert result_cache.damage(path) is None


def test_run_py_sets_a_damaged_cache_aside_before_any_scoring(tmp_path, monkeypatch, capsys):
    """run.py checks CACHE/results.sqlite at the start: one warning line, the file set aside before the first
    experiment runs (which then finds no damaged file), exit 0."""
    import run as run_py
    from experiments.context import Data, Inputs, Result
    from experiments.runlog import LibraryChatter

    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    damage_garbage(cache_dir / "results.sqlite")
    seen = []

    def run(ctx):
        seen.append(sorted(p.name.split("-2")[0] for p in cache_dir.iterdir()))
        return Result(config={}, records=[{"idx": 0}], summary={}, headline="done", token_stats={},
                      prompt_template_sha256="p" * 64, private={"texts.jsonl": ""})   # as registry.py declares
    import types
    module = types.ModuleType("fake_protocol")
    module.NAME, module.CONFIG_SECTIONS, module.data_label, module.run = "protocol", ("shared", "protocol"), \
        (lambda ctx: "d"), run
    monkeypatch.setattr(run_py, "import_experiments", lambda names, chatter: ({"protocol": module}, 0.0))
    monkeypatch.setattr(run_py, "write_report", lambda out, names: None)
    monkeypatch.setattr(run_py, "verified_inputs", lambda args, modules, routed=None: Inputs(
        cache=cache_dir, model_dir=tmp_path, model_identity={"id": "m", "model_sha256": "m" * 64,
                                                             "tokenizer_sha256": "t" * 64},
        data={"fixture-sentiment": Data(id="fixture-sentiment", schema="sst2",
                                        parquet_path=tmp_path / "p.parquet", content_sha256="d" * 64,
                                        split="validation")}))
    args = run_py.parse_args(["--cache", str(cache_dir), "--out", str(tmp_path / "o"), "--smoke", "--verbose",
                              "--experiment", "protocol"])
    assert run_py.run_all(args, LibraryChatter(verbose=True)) == 0
    assert seen == [["results.sqlite.corrupt"]]
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("warning: ") and "not a readable SQLite database" in err[0]


KERNEL_PROBE = """
import json, sys
sys.path.insert(0, {repo!r})
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from experiments import result_cache, scoring
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)).eval()
requests = [([1, 5, 9, 11], [7]), ([1, 5, 9, 11], [8]), ([1, 4], [3, 2])]
run = result_cache.run_identity(model_sha256="m", tokenizer_sha256="t", data_content_sha256="d",
                                prompt_template_sha256="p", config={{"threads": 1}}, scorer="independent-parity",
                                code_sha256="c", versions={{}})
cache = result_cache.ResultCache({path!r}, run)
scores, served = scoring.score_batches(model, scoring.lm_eval_batches(requests, 2), requests, cache)
print(json.dumps({{"served": sum(served), "scores": scores}}))
"""


@pytest.mark.slow
def test_a_score_computed_under_one_kernel_setting_is_not_served_under_another(tmp_path):
    """The same scores in one cache file, computed in a process per setting: a process with another kernel choice
    (MKL's instruction set, ATen's capability, the OpenMP threads) finds nothing of the first; the first setting
    again finds every score (3 scores in 2 batches)."""
    code = KERNEL_PROBE.format(repo=str(REPO), path=str(tmp_path / "r.sqlite"))

    def run_with(**env):
        full = {k: v for k, v in __import__("os").environ.items()
                if k not in ("MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")}
        proc = subprocess.run([sys.executable, "-c", code], env={**full, **env}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.splitlines()[-1])

    first = run_with()
    assert first["served"] == 0
    for env in ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, {"ATEN_CPU_CAPABILITY": "default"}, {"OMP_NUM_THREADS": "1"}):
        assert run_with(**env)["served"] == 0, env
    again = run_with()
    assert again["served"] == 3 and again["scores"] == first["scores"]
