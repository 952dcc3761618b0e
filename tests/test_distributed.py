"""Data parallelism (experiments/parallel.py, experiments/shards.py, run.py --shard/--merge, torchrun on gloo).

Fast tests: the assignment rule, launcher detection, shard-file refusals, the replay checks, the result cache with
several writers, a merge's choice of the shards' pre-registered audit sample. Slow tests (real processes, 2 ranks of one torch thread each on gloo): one torchrun run
and one --shard 1/2 + --shard 2/2 + --merge of every experiment's smoke against the one-process smoke run of the
session (records, summaries, identities identical but for the run id; extraction's pre-registered sample but for
its write time; harness latencies aside; the audit passes at every level), merge refusals, a rank that fails on a
real bad input, and a killed distributed run resumed from the result cache.
"""
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from multiprocessing import get_context
from pathlib import Path

import pytest

import conftest

from conftest import REPO, run_cli
from experiments import parallel, shards
from resources import ResourceError

EXPERIMENTS = ("protocol", "options", "mctaco")     # compared field for field; extraction and harness below


# ---- fast: the rule, the launcher, shard files, replay, the cache --------------------------------------------

def test_the_rule_keeps_groups_together_and_round_robins_sorted_keys():
    items = [{"idx": i, "q": i // 3} for i in (7, 0, 1, 2, 3, 4, 5, 6, 8)]
    owners = parallel.owners(items, lambda it: it["q"], 2)
    by_q = {}
    for it, r in zip(items, owners):
        by_q.setdefault(it["q"], set()).add(r)
    assert by_q == {0: {0}, 1: {1}, 2: {0}}                  # questions 0, 1, 2 -> ranks 0, 1, 0
    assert parallel.owners(items, parallel.default_key, 2) == [1, 0, 1, 0, 1, 0, 1, 0, 0]   # by sorted idx
    parts = [parallel.part_of(items, parallel.default_key, r, 3) for r in range(3)]
    assert sorted(i["idx"] for p in parts for i in p) == list(range(9))


@pytest.mark.parametrize("env,expected", [
    ({}, ""), ({"WORLD_SIZE": "1", "RANK": "0"}, ""),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "torchrun"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
      "ACCELERATE_MIXED_PRECISION": "no"}, "accelerate"),
    ({"WORLD_SIZE": "2"}, "unknown"),
])
def test_the_launcher_is_detected_from_its_environment(env, expected):
    assert parallel.launcher_from_env(env) == expected


def write_fake_shard(directory, k, n, identity=None, items=None):
    directory.mkdir(parents=True, exist_ok=True)
    items = items or []
    facts = {"rank": k - 1, "stages": [], "wall_s": 1.0, "peak_rss_bytes": 1, "host": "h", "pid": 1,
             "items_scored": {"official": [key for key, _ in items]}}        # parallel.rank_facts' shape
    shards.write_shard(directory, k, n, identity or {"args": {"smoke": True}, "n_shards": n},
                       {"protocol": {"official": {"items": items, "meta": {}}}},
                       {"run_id": f"{k:032x}", "environment": {"cpu": "c", "git_commit": None, "git_dirty": None,
                                                                "kernels": {"torch_cpu_capability": "default",
                                                                            "torch_threads": 1, "env": {}}},
                        "experiments": {"protocol": facts}})
    return directory


def test_shard_files_are_checked_before_anything_else(tmp_path):
    a = write_fake_shard(tmp_path / "a", 1, 2)
    b = write_fake_shard(tmp_path / "b", 2, 2)
    assert [d for d, _ in shards.check_shards([b, a])] == [a, b]
    other = write_fake_shard(tmp_path / "c", 2, 2, identity={"args": {"smoke": False}, "n_shards": 2})
    with pytest.raises(ResourceError, match=r"different run identity .*args\.smoke: true vs false"):
        shards.check_shards([a, other])
    with pytest.raises(ResourceError, match="shard 1/2 given twice"):
        shards.check_shards([a, a])
    with pytest.raises(ResourceError, match="shard 2/2 missing"):
        shards.check_shards([a])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / shards.NAME).write_text('{"format": "eval-shard/v1", "format": 1}')
    with pytest.raises(ResourceError, match="duplicate key"):
        shards.read_shard(tmp_path / "d")
    with pytest.raises(ResourceError, match="no SHARD.json"):
        shards.read_shard(tmp_path / "e")


class Ctx:
    """What shard_map reads of an experiment's Context: its name and the run's plan."""

    def __init__(self, name, plan):
        self.name, self.plan = name, plan


@pytest.fixture
def replay_plan():
    return parallel.Plan(mode="replay", world=2)


def replay(plan, parts):
    plan.replay = {"protocol": {"official": [(f"s{k}", k, {"items": items, "meta": {"k": k}})
                                             for k, items in enumerate(parts)]}}
    items = [{"idx": i} for i in range(4)]
    return parallel.shard_map(Ctx("protocol", plan), "official", items,
                              lambda part: pytest.fail("replay never scores"))


def test_replay_reassembles_in_item_order_and_refuses_missing_overlapping_and_foreign_items(replay_plan):
    per_item, meta = replay(replay_plan, [[[2, "c"], [0, "a"]], [[3, "d"], [1, "b"]]])
    assert list(per_item.items()) == [(0, "a"), (1, "b"), (2, "c"), (3, "d")] and meta == {"k": 0}
    with pytest.raises(ResourceError, match=r"item 3 is missing \(expected in shard 2/2"):
        replay(replay_plan, [[[0, "a"], [2, "c"]], [[1, "b"]]])
    with pytest.raises(ResourceError, match="item 2 is in both s0 and s1"):
        replay(replay_plan, [[[0, "a"], [2, "c"]], [[1, "b"], [3, "d"], [2, "c"]]])
    with pytest.raises(ResourceError, match="item 1 does not belong to shard 1/2"):
        replay(replay_plan, [[[0, "a"], [2, "c"], [1, "b"]], [[3, "d"]]])


def test_a_failed_part_names_rank_and_items_and_keeps_its_kind():
    from experiments.evidence import ScoringError

    def boom(part):
        raise ScoringError("idx 5: 2100 tokens, over the limit 2048")

    failed = [(1, parallel.run_part(boom, [{"idx": 5}, {"idx": 9}], parallel.default_key))]
    with pytest.raises(ScoringError, match=r"\[protocol\] rank 1 of 2 failed in independent \(its items: 5, 9\): "
                                           r"ScoringError: idx 5: 2100 tokens"):
        parallel.raise_failure(parallel.Plan(mode="distributed", world=2), "protocol", "independent", failed)


def _writer(path, worker, n):
    from experiments.result_cache import ResultCache

    cache = ResultCache(path, {"run": "same"})
    for i in range(n):
        with cache.batch():
            cache.put({"worker": worker, "i": i}, float(i) / 7)
    cache.close()


def test_the_result_cache_takes_several_concurrent_writers(tmp_path):
    path = tmp_path / "results.sqlite"
    procs = [get_context("spawn").Process(target=_writer, args=(path, w, 150)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM results").fetchone()[0] == 450
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_merge_keeps_the_shards_earliest_audit_sample_and_refuses_one_that_differs(replay_plan):
    from experiments.extraction import earliest_preregistration

    mine = {"items": [{"idx": 3}], "created_at_utc": "2026-12-01T09:00:03+00:00"}
    early = dict(mine, created_at_utc="2026-12-01T09:00:01+00:00")
    late = dict(mine, created_at_utc="2026-12-01T09:00:02+00:00")

    def agreed(samples):
        replay_plan.replay = {"extraction": {"preregistration": [(f"s{k}", k, {"items": [], "meta": m})
                                                                for k, m in enumerate(samples)]}}
        return parallel.agreed(Ctx("extraction", replay_plan), "preregistration", mine, earliest_preregistration)

    assert agreed([late, early]) == early
    with pytest.raises(ResourceError, match="s1: its pre-registered extraction audit sample is not the one"):
        agreed([early, dict(late, items=[{"idx": 4}])])
    with pytest.raises(ResourceError, match="1 of 2 shards hold the extraction preregistration"):
        agreed([early])


def test_shard_and_merge_are_parsed_and_refused_together():
    import run

    assert run.parse_shard("2/3") == (2, 3) and run.parse_shard("0/3") is None and run.parse_shard("3/2") is None
    with pytest.raises(SystemExit):
        run.parse_args(["--cache", "c", "--out", "o", "--shard", "1/2", "--merge", "a", "b"])


# ---- slow: real processes on the real model ------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args, env=None, cwd=REPO, nproc=2, timeout=1200, kill_after_batches=None):
    """`torchrun --nproc_per_node 2 run.py ARGS` (python -m torch.distributed.run), one torch thread per rank; with
    kill_after_batches=K, each rank is SIGKILLed once it committed K batches to the result cache."""
    full = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    full.update(env or {})
    killer = [] if kill_after_batches is None else [str(REPO / "tests" / "kill_after_batches.py"),
                                                    str(kill_after_batches)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), *killer, str(Path(cwd) / "run.py"), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


VOLATILE = {"run_id"}


def evidence(out, name):
    """records, summary and identity of one experiment (the run id left out)."""
    ident = json.loads((out / name / "identity.json").read_text())
    return ((out / name / "records.jsonl").read_text(), json.loads((out / name / "summary.json").read_text()),
            {k: v for k, v in ident.items() if k not in VOLATILE})


def audit_passes(out, cache):
    proc = run_cli("audit.py", out, "--strict", "--tokens", "--forward", "--cache", cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "RESULT: PASS" in proc.stdout


def whole_batches_on_rank_0(out):
    """The smoke's loglikelihood experiments are one forward batch each (2 items, 9 MC-TACO documents, at batch
    size 16), and a batch is never split between ranks: rank 0 scored all of it on both paths, rank 1 none (its
    lm-eval call would otherwise have formed other batches). MC-TACO's two limit runs went one to each rank."""
    for name in EXPERIMENTS:
        ranks = json.loads((out / name / "stages.json").read_text())["data_parallel"]["ranks"]
        shapes = json.loads((out / name / "config.json").read_text())["independent"]["batching"]["shapes"]
        assert len(shapes) == 1, name
        for call in ("official", "independent"):
            assert ranks[0]["items_scored"][call] and ranks[1]["items_scored"][call] == [], (name, call)
    ranks = json.loads((out / "mctaco" / "stages.json").read_text())["data_parallel"]["ranks"]
    assert [len(r["items_scored"]["official_limit_runs"]) for r in ranks] == [1, 1]


@pytest.fixture(scope="session")
def one_process(smoke_run):
    """The reference: the session's one-process `run.py --smoke` (conftest), which runs every experiment (reused,
    so the suite pays for no extra one-process run)."""
    return smoke_run[0]


def extraction_evidence(out):
    """evidence() of extraction, the summary's pre-registration sha256 left out (the file holds the time it was
    written, a timing) but checked against the file in `out`; and that file's sample without its time."""
    import hashlib

    records, summary, identity = evidence(out, "extraction")
    text = (out / "extraction.preregistration.json").read_text()
    assert summary["audit_sample"].pop("preregistration_sha256") == hashlib.sha256(text.encode()).hexdigest()
    sample = {k: v for k, v in json.loads(text).items() if k != "created_at_utc"}
    return records, summary, identity, sample


def without_latency(x):
    """A harness document without its latency fields (wall-clock measurements)."""
    if isinstance(x, dict):
        return {k: without_latency(v) for k, v in x.items() if not k.startswith("latency")}
    return [without_latency(v) for v in x] if isinstance(x, list) else x


def harness_evidence(out):
    records, summary, identity = evidence(out, "harness")
    return ([without_latency(json.loads(l)) for l in records.splitlines()], without_latency(summary), identity,
            (out / "private" / "harness" / "generations.jsonl").read_text())


def same_evidence_as_one_process(out, one_process):
    """Every experiment's evidence equals the one-process run's: records, summary and identity (the run id aside);
    extraction's pre-registered sample (its write time aside); harness latencies aside."""
    for name in EXPERIMENTS:
        assert evidence(out, name) == evidence(one_process, name), name
    assert extraction_evidence(out) == extraction_evidence(one_process)
    assert harness_evidence(out) == harness_evidence(one_process)


@pytest.fixture(scope="session")
def torchrun_run(prepared_cache, tmp_path_factory):
    """`torchrun --nproc_per_node 2 run.py --smoke` of every experiment, once per session (one launch: each rank
    pays for its imports once)."""
    out = tmp_path_factory.mktemp("torchrun") / "dist"
    proc = torchrun("--cache", prepared_cache, "--out", out, "--smoke")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out


@pytest.mark.slow
def test_torchrun_two_ranks_gives_the_one_process_evidence(one_process, torchrun_run, prepared_cache):
    out = torchrun_run
    same_evidence_as_one_process(out, one_process)
    for name in EXPERIMENTS + ("extraction", "harness"):
        dp = json.loads((out / name / "stages.json").read_text())["data_parallel"]
        assert (dp["world_size"], dp["backend"], dp["launcher"], [r["rank"] for r in dp["ranks"]]) == \
            (2, "gloo", "torchrun", [0, 1]), name
        assert all(r["peak_rss_bytes"] > 0 and r["wall_s"] > 0 for r in dp["ranks"]), name
    env = json.loads((out / "environment.json").read_text())["data_parallel"]
    assert env["world_size"] == 2 and len({r["pid"] for r in env["ranks"]}) == 2
    whole_batches_on_rank_0(out)
    ranks = json.loads((out / "extraction" / "stages.json").read_text())["data_parallel"]["ranks"]
    assert [len(r["items_scored"]["independent"]) for r in ranks] == [1, 1]        # 2 smoke items, one per rank
    ranks = json.loads((out / "harness" / "stages.json").read_text())["data_parallel"]["ranks"]
    assert all(r["items_scored"]["harness"] for r in ranks)                # both ranks answered examples
    audit_passes(out, prepared_cache)


@pytest.fixture(scope="session")
def two_shards(prepared_cache, tmp_path_factory):
    """--shard 1/2 and --shard 2/2 of the reference command (every experiment), run side by side as a Slurm array
    would."""
    outs = [tmp_path_factory.mktemp(f"shard{k}") / "o" for k in (1, 2)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    procs = [subprocess.Popen([sys.executable, "run.py", "--cache", str(prepared_cache), "--out", str(o), "--smoke",
                               "--shard", f"{k}/2"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k, o in zip((1, 2), outs)]
    for p in procs:
        stdout, stderr = p.communicate(timeout=1200)
        assert p.returncode == 0, stdout[-2000:] + stderr[-3000:]
    return outs


@pytest.mark.slow
def test_shards_merged_give_the_one_process_evidence(one_process, two_shards, prepared_cache, tmp_path):
    # a shard is not evidence: its results, its log, and (extraction) the sample it pre-registered before generating
    assert sorted(p.name for p in two_shards[0].iterdir()) == ["SHARD.json", "extraction.preregistration.json",
                                                                "run.log"]
    out = tmp_path / "merged"
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", out, "--merge", *two_shards)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "independent scores from the shards (--merge)" in proc.stdout and "from the result cache" not in proc.stdout
    same_evidence_as_one_process(out, one_process)
    env = json.loads((out / "environment.json").read_text())["data_parallel"]
    assert (env["mode"], env["world_size"], [r["shard"] for r in env["ranks"]]) == ("replay", 2, [1, 2])
    shard_envs = [json.loads((o / "SHARD.json").read_text())["run"]["environment"] for o in two_shards]
    assert [(r["git_commit"], r["git_dirty"]) for r in env["ranks"]] == \
        [(e["git_commit"], e["git_dirty"]) for e in shard_envs]                     # every shard's commit
    assert all(r["kernels"].startswith(f"torch {e['kernels']['torch_cpu_capability']}, ")
               for r, e in zip(env["ranks"], shard_envs))
    whole_batches_on_rank_0(out)
    written = sorted((o / "extraction.preregistration.json").read_text() for o in two_shards)
    assert (out / "extraction.preregistration.json").read_text() in written     # a shard's, never remade
    audit_passes(out, prepared_cache)
    # a forger moves one item to the other shard in both paths' lists (still a partition) and reseals O: the identity
    # level rebuilds the batches from the token ids and finds a batch split between shards
    from evidence_audit.mutations.tools import seal

    forged = tmp_path / "forged"
    shutil.copytree(out, forged)
    stages = json.loads((forged / "protocol" / "stages.json").read_text())
    ranks = stages["data_parallel"]["ranks"]
    for call in ("official", "independent"):
        ranks[1]["items_scored"][call].append(ranks[0]["items_scored"][call].pop())
    (forged / "protocol" / "stages.json").write_text(json.dumps(stages))
    seal(forged)
    assert run_cli("audit.py", forged, "--cache", prepared_cache).returncode == 0       # the partition still holds
    proc = run_cli("audit.py", forged, "--tokens", "--cache", prepared_cache)
    assert proc.returncode == 1 and "ranks took whole batches" in proc.stdout and "FAIL" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_a_merge_records_and_names_shards_from_other_kernels_and_commits(two_shards, prepared_cache, tmp_path):
    """A shard made under ATEN_CPU_CAPABILITY=default at another commit, beside one made here: the merge says so and
    environment.json records each shard's kernels and commit (not only the merging machine's)."""
    other = tmp_path / "other"
    shutil.copytree(two_shards[1], other)
    doc = json.loads((other / "SHARD.json").read_text())
    env = doc["run"]["environment"]
    env["kernels"]["torch_cpu_capability"] = "default"
    env["kernels"]["env"]["ATEN_CPU_CAPABILITY"] = "default"
    env["git_commit"] = "0123456789abcdef0123456789abcdef01234567"
    (other / "SHARD.json").write_text(json.dumps(doc))
    out = tmp_path / "merged"
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", out, "--merge", two_shards[0], other)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "different commits" in proc.stderr and "different kernels" in proc.stderr, proc.stderr
    ranks = json.loads((out / "environment.json").read_text())["data_parallel"]["ranks"]
    assert ranks[1]["git_commit"] == env["git_commit"] and ranks[0]["git_commit"] != env["git_commit"]
    assert ranks[1]["kernels"].startswith("torch default, ") and "ATEN_CPU_CAPABILITY=default" in ranks[1]["kernels"]
    assert not ranks[0]["kernels"].startswith("torch default")
    proc = run_cli("audit.py", out, "--cache", prepared_cache)          # the arithmetic level reads the ranks
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout[-3000:]
    doc["run"]["environment"]["kernels"]["env"]["LD_PRELOAD"] = "x"          # not a kernel variable: refused
    (other / "SHARD.json").write_text(json.dumps(doc))
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", tmp_path / "m2", "--merge", two_shards[0], other)
    assert "run.environment.kernels.env" in one_error_line(proc)


def one_error_line(proc):
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --merge"), proc.stderr
    return lines[0]


@pytest.mark.slow
def test_merge_refuses_foreign_missing_and_overlapping_shards(two_shards, prepared_cache, tmp_path):
    a, b = two_shards
    outs = []

    def merge(*dirs):
        outs.append(tmp_path / f"m{len(outs)}")
        return run_cli("run.py", "--cache", prepared_cache, "--out", outs[-1], "--merge", *dirs)

    def edited(src, name, edit):
        dst = tmp_path / name
        shutil.copytree(src, dst)
        doc = json.loads((dst / shards.NAME).read_text())
        edit(doc)
        (dst / shards.NAME).write_text(json.dumps(doc))
        return dst

    other = edited(b, "other", lambda d: d["identity"]["configs"]["protocol"].update(seed=1))
    assert "a different run identity" in one_error_line(merge(a, other))
    assert "shard 2/2 missing" in one_error_line(merge(a))
    assert "shard 1/2 given twice" in one_error_line(merge(a, a))
    # shard 2 scored no protocol item (the smoke is one batch, all on shard 1), but MC-TACO's second limit run
    def drop_last_limit_item(d):       # consistently: the results and the rank facts naming the items scored
        key = d["results"]["mctaco"]["official_limit_runs"]["items"].pop()[0]
        d["run"]["experiments"]["mctaco"]["items_scored"]["official_limit_runs"].remove(key)
    short = edited(b, "short", drop_last_limit_item)
    assert "is missing (expected in shard 2/2" in one_error_line(merge(a, short))
    first_of_a = json.loads((a / shards.NAME).read_text())["results"]["options"]["official"]["items"][0]
    def add_an_item_of_a(d):
        d["results"]["options"]["official"]["items"].append(first_of_a)
        d["run"]["experiments"]["options"]["items_scored"]["official"].append(first_of_a[0])
    overlap = edited(b, "overlap", add_an_item_of_a)
    assert f"item {first_of_a[0]} is in both" in one_error_line(merge(a, overlap))    # found before anything runs
    for out in outs:                   # nothing installed, not even the experiments replayed before the refusal
        assert not (out / "protocol").exists() and not (out / "MANIFEST.json").exists(), out


@pytest.fixture
def tiny_repo(tiny_cache, tmp_path):
    """(repo copy, private copy of the tiny-model cache): the code hash is the test's, the result cache its own."""
    return conftest.repo_and_cache_copy(tiny_cache, tmp_path)


def smoke_input_tokens(cache):
    """{idx: longest input (context + candidate) in tokens} of the protocol's smoke items."""
    import config
    from adapter import load_tokenizer
    from experiments import protocol
    from experiments.selection import load_rows, select_items

    cfg = config.effective(protocol.CONFIG_SECTIONS, {})
    rows = load_rows(cache / "data" / cfg["data"] / "validation.parquet")
    items = protocol.build_items(rows, select_items(cfg, "smoke", len(rows)), cfg)
    tok = load_tokenizer(cache / "models" / "tiny-random-llama")
    return {it["idx"]: max(len(tok(it["prompt"] + c)["input_ids"]) for c in it["candidates"]) for it in items}


def set_config(repo, key, value):
    """Set one literal setting in the repository copy's config.py."""
    cfg = repo / "config.py"
    text = cfg.read_text()
    assert text.count(f'"{key}": ') == 1, key
    start = text.index(f'"{key}": ') + len(f'"{key}": ')
    cfg.write_text(text[:start] + str(value) + text[text.index(",", start):])


@pytest.mark.slow
def test_a_rank_that_fails_stops_every_rank_naming_rank_and_item(tiny_repo, tmp_path):
    """A real bad input one rank meets: max_input_tokens set (in the copy's config.py) between the lengths of the
    two smoke items, so the longer one is over the limit on the rank that scores it. official_batch_size 1 makes
    each item a batch of its own, so the two go to different ranks: the longer first (batch 0, rank 0)."""
    repo, cache = tiny_repo
    lengths = smoke_input_tokens(cache)
    (short_idx, n_short), (long_idx, n_long) = sorted(lengths.items(), key=lambda kv: kv[1])
    assert n_short < n_long
    set_config(repo, "max_input_tokens", n_short)
    set_config(repo, "official_batch_size", 1)
    out = tmp_path / "out"
    proc = torchrun("--cache", cache, "--out", out, "--model", "tiny-random-llama", "--smoke", "--experiment",
                    "protocol", "--no-cache", cwd=repo, timeout=600)
    assert proc.returncode != 0
    rank = 0                                        # the rule: whole batches, longest first, the k-th to rank k mod 2
    assert f"rank {rank} of 2 failed in independent (its items: {long_idx})" in proc.stderr, proc.stderr[-3000:]
    assert f"idx {long_idx}" in proc.stderr
    assert not (out / "protocol").exists() and not (out / "MANIFEST.json").exists()
    assert not list(out.glob(".tmp-*")) and not (out / "environment.json").exists()


@pytest.mark.slow
def test_a_killed_distributed_run_resumes_from_the_result_cache(tiny_repo, tmp_path):
    repo, cache = tiny_repo
    args = ("--cache", cache, "--model", "tiny-random-llama", "--experiment", "protocol")
    proc = torchrun(*args, "--out", tmp_path / "killed", cwd=repo, kill_after_batches=1)
    assert proc.returncode != 0 and not (tmp_path / "killed" / "protocol").exists()
    db = sqlite3.connect(cache / "results.sqlite")
    batches = db.execute("SELECT count(*) FROM results").fetchone()[0]
    db.close()
    # 64 items are 4 batches of 16, two per rank: the rank that finished its first batch first committed it (32
    # scores); torchrun may stop the other one before its first
    assert 1 <= batches <= 2
    committed = 32 * batches
    proc = torchrun(*args, "--out", tmp_path / "resumed", cwd=repo)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    info = json.loads((tmp_path / "resumed" / "protocol" / "config.json").read_text())["independent"]["result_cache"]
    assert (info["from_cache"], info["computed"], info["candidate_scores"]) == (committed, 128 - committed, 128)
    fresh = run_cli(repo / "run.py", *args, "--out", tmp_path / "fresh", "--no-cache", cwd=repo)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    resumed, reference = evidence(tmp_path / "resumed", "protocol"), evidence(tmp_path / "fresh", "protocol")
    assert resumed[0] == reference[0] and resumed[1] == reference[1]           # records and summary: identical
