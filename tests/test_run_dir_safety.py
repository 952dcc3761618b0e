"""The run's output directory and its neighbours under misuse: prepare.py --data-file that is not a regular file,
run.py's absolute model location, one run per --out at a time (a lock), the sweep of what an earlier run left,
forged shard facts at --merge, and a rank that waits for a rank that never comes.

Fast: no real model. run.py runs in-process through tests/test_run_safety.py's fake experiments where the
experiment contract is enough, and as a real process where the behaviour is a process's (a lock held by another
pid, a FIFO that must never be opened, a rendezvous that times out)."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PY, REPO, run_cli


# what run.py --shard records of its machine (evidence.environment): the commit, a clean tree, the kernels
SHARD_MACHINE = {"git_commit": "ab" * 20, "git_dirty": False,
                 "kernels": {"torch_cpu_capability": "avx2", "torch_threads": 1, "env": {"ATEN_CPU_CAPABILITY": None}}}

def one_line(proc):
    """The single stderr line of a refused command (exit 2, no traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# ---- prepare.py --data-file that is not a regular file ------------------------------------------------------------

@pytest.mark.parametrize("kind", ["directory", "fifo", "device-symlink", "missing", "suffix"])
def test_data_file_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path, kind):
    """A directory, a FIFO (never opened: reading one would block), a symlink to /dev/zero (never read: it has no
    end) are each refused on one line saying what was found and that a regular .tsv or .parquet file is expected."""
    path = tmp_path / "data.tsv"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device-symlink":
        path.symlink_to("/dev/zero")
    elif kind == "suffix":
        path = tmp_path / "data.csv"
        path.write_text("sentence,label\n")
    found = {"directory": "a directory", "fifo": "a FIFO", "device-symlink": "a character device",
             "missing": "not found", "suffix": "suffix '.csv'"}[kind]
    for extra in ([], ["--name", "mine"]):
        proc = run_cli("prepare.py", "--cache", tmp_path / "cache", "--data-file", path, *extra, timeout=60)
        line = one_line(proc)
        assert str(path) in line and found in line and "regular" in line and ".tsv" in line, line
        assert not (tmp_path / "cache").exists(), "refused before the cache is touched"


# ---- where the evidence says the model is ----------------------------------------------------------------------

def test_the_model_directory_is_recorded_absolute_so_the_audit_finds_it_from_any_cwd(tmp_path, monkeypatch):
    """run.py --cache given relative (as the README's `--cache ./cache`): the model directory every config.json
    records (model.dir, from Inputs.model_identity) is absolute, spelled as given (a symlinked cache stays the
    link), so `cd /tmp && audit.py O --tokens` finds it; the cache root is its grandparent."""
    import resources
    import run as run_py

    cache = tmp_path / "work" / "cache"
    model = cache / "models" / "m"
    model.mkdir(parents=True)
    for name in ("model.safetensors", "tokenizer.json"):
        (model / name).write_bytes(name.encode())
    files = {f"models/m/{p.name}": {"sha256": resources.sha256_file(p), "size": p.stat().st_size}
             for p in sorted(model.iterdir())}
    resources.save_manifest(cache, {"resources": {"m": {"kind": "model", "source": {"kind": "test"}, "files": files}}})
    monkeypatch.chdir(tmp_path / "work")
    args = run_py.parse_args(["--cache", "cache", "--out", "o", "--model", "m"])
    inputs = run_py.verified_inputs(args, {})
    assert Path(inputs.model_identity["dir"]) == model and Path(inputs.model_identity["dir"]).is_absolute()
    assert inputs.model_dir == model and inputs.cache == cache


# ---- forged shard facts at --merge ---------------------------------------------------------------------------

def write_shard(directory, k, n, edit=None):
    """A SHARD.json as `run.py --shard K/N` writes it (experiments/shards.write_shard, the run facts of
    parallel.rank_facts), with `edit(doc)` applied to the parsed document before it is written back."""
    from experiments import shards

    directory.mkdir(parents=True, exist_ok=True)
    items = [[2 * k + j, {"score": -1.5}] for j in range(2)]
    facts = {"rank": k - 1, "stages": [{"name": "score", "wall_s": 0.5, "peak_rss_bytes_at_end": 1000}],
             "wall_s": 1.25, "peak_rss_bytes": 1000, "items_scored": {"official": [key for key, _ in items]},
             "host": "node1", "pid": 4242}
    shards.write_shard(directory, k, n, {"args": {"smoke": True}, "n_shards": n},
                       {"protocol": {"official": {"items": items, "meta": {}}}},
                       {"run_id": f"{k:032x}", "environment": {"cpu": "some cpu", "run_id": f"{k:032x}", **SHARD_MACHINE},
                        "experiments": {"protocol": facts}})
    if edit:
        doc = json.loads((directory / shards.NAME).read_text())
        edit(doc)
        # a float too large for a double: a literal the JSON parser reads as inf (its Infinity is refused already)
        (directory / shards.NAME).write_text(json.dumps(doc).replace("Infinity", "1e309"))
    return directory


def set_in(path, value):
    """An edit setting doc[path[0]][path[1]]... = value."""
    def edit(doc):
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value
    return edit


def test_well_formed_shards_are_accepted(tmp_path):
    from experiments import shards

    docs = shards.check_shards([write_shard(tmp_path / "a", 1, 2), write_shard(tmp_path / "b", 2, 2)])
    assert [doc["shard"]["k"] for _, doc in docs] == [1, 2]


FACTS = ("run", "experiments", "protocol")
FORGED = [
    ("shard.n", lambda d: set_in(("shard", "n"), 10 ** 9)(d)),
    ("shard.k", lambda d: set_in(("shard", "k"), True)(d)),
    ("identity.n_shards", set_in(("identity", "n_shards"), 3)),
    ("run.experiments", set_in(("run", "experiments"), {})),
    ("run.run_id", set_in(("run", "run_id"), "../../etc")),
    ("run.experiments.protocol.rank", set_in(FACTS + ("rank",), 1)),
    ("run.experiments.protocol.peak_rss_bytes", set_in(FACTS + ("peak_rss_bytes",), -1)),
    ("run.experiments.protocol.peak_rss_bytes", set_in(FACTS + ("peak_rss_bytes",), "1000")),
    ("run.experiments.protocol.peak_rss_bytes", set_in(FACTS + ("peak_rss_bytes",), 10 ** 30)),
    ("run.experiments.protocol.wall_s", set_in(FACTS + ("wall_s",), -0.5)),
    ("run.experiments.protocol.wall_s", set_in(FACTS + ("wall_s",), float("inf"))),
    ("run.experiments.protocol.wall_s", set_in(FACTS + ("wall_s",), False)),
    ("run.experiments.protocol.stages[0].wall_s", set_in(FACTS + ("stages", 0, "wall_s"), -3)),
    ("run.experiments.protocol.items_scored.official", set_in(FACTS + ("items_scored", "official"), [99])),
    ("run.experiments.protocol.host", set_in(FACTS + ("host",), ["x"])),
    ("run.experiments.protocol", set_in(FACTS + ("forged",), 1)),
    ("run.environment.cpu", set_in(("run", "environment", "cpu"), 7)),
    ("run.environment.git_commit", set_in(("run", "environment", "git_commit"), "not a commit")),
    ("run.environment.kernels.env", set_in(("run", "environment", "kernels", "env"), {"LD_PRELOAD": "x"})),
]


@pytest.mark.parametrize("field,edit", FORGED, ids=[f"{f}-{n}" for n, (f, _) in enumerate(FORGED)])
def test_forged_shard_facts_are_refused_naming_the_file_and_the_field(tmp_path, field, edit):
    from experiments import shards
    from resources import ResourceError

    a = write_shard(tmp_path / "a", 1, 2, edit)
    b = write_shard(tmp_path / "b", 2, 2, edit if field.startswith(("shard.n", "identity")) else None)
    with pytest.raises(ResourceError) as e:
        shards.check_shards([a, b])
    assert f"{a / shards.NAME}: field {field}" in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.slow                  # run.py or torch.distributed in subprocesses
def test_merge_of_a_forged_huge_shard_count_is_refused_at_once(tmp_path):
    """10**9 shards in both files: refused on one line (exit 2) before any list of shard numbers is built."""
    edit = set_in(("shard", "n"), 10 ** 9)
    dirs = [write_shard(tmp_path / s, k, 2, edit) for k, s in ((1, "a"), (2, "b"))]
    t0 = time.monotonic()
    proc = run_cli("run.py", "--cache", tmp_path / "cache", "--out", tmp_path / "o", "--merge", *dirs, timeout=120)
    line = one_line(proc)
    assert "SHARD.json: field shard.n" in line and "1000000000" in line and time.monotonic() - t0 < 60, line
    assert not (tmp_path / "o").exists()


# ---- one run per --out at a time; only a run's own leftovers are swept ------------------------------------------

from test_run_safety import fake_experiment, fake_run, two  # noqa: E402,F401  (fake_run is a fixture)


def lines_of(text, start):
    return [line for line in text.splitlines() if line.startswith(start)]


def test_a_users_files_that_look_like_run_outputs_are_never_swept(fake_run, tmp_path, capsys):
    """`mkdir O; echo mine > O/report.html; run.py --out O`: no run can be shown to have written those files (no
    O/.run-in-progress names them), so O is refused on one line and nothing is deleted."""
    out = tmp_path / "o"
    out.mkdir()
    mine = {"report.html": "mine", "run.log": "my log", "extraction.preregistration.json": "{}",
            ".tmp-protocol-x": "mine too"}
    for name, text in mine.items():
        (out / name).write_text(text)
    code, stdout, err = fake_run(["--out", str(out)], two(), capsys)
    line = [l for l in err.splitlines() if l.strip()]
    assert code == 2 and len(line) == 1 and "no run writes" in line[0] and "nothing was deleted" in line[0], err
    assert "report.html" in line[0] and not lines_of(stdout, "removed") and fake_run.loaded == []
    assert {p.name: p.read_text() for p in out.iterdir()} == mine


def test_a_marker_that_claims_a_users_file_is_refused(fake_run, tmp_path, capsys):
    """O/.run-in-progress is read like any outside byte: a forged one claiming notes.txt deletes nothing."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / ".run-in-progress").write_text(json.dumps({
        "format": "run-in-progress/v1", "run_id": "a" * 32, "pid": 1, "host": "h", "started_utc": "t",
        "claims": ["run.log", "notes.txt"]}))
    code, _, err = fake_run(["--out", str(out)], two(), capsys)
    assert code == 2 and "field claims" in err and "nothing was deleted" in err and len(err.strip().splitlines()) == 1
    assert (out / "notes.txt").read_text() == "mine"


def test_a_killed_runs_leftovers_plus_a_users_file_are_refused_whole(fake_run, tmp_path, capsys):
    """What a killed run claimed is swept only when nothing else is in O: a file put beside it makes the run refuse
    O, naming that file, and nothing (not even the killed run's own files) is deleted."""
    from test_run_safety import killed_run

    out = tmp_path / "o"
    rid = killed_run(out, "experiment")
    (out / "mine.txt").write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    code, _, err = fake_run(["--out", str(out)], two(), capsys)
    assert code == 2 and "mine.txt" in err and f"run {rid}" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_second_run_on_the_same_out_refuses_naming_the_first_runs_pid(fake_run, tmp_path, capsys):
    """While a run writes O (here: inside its experiment), `run.py --out O` started by another process refuses on
    one line naming the pid holding O's lock, touches nothing; the first run's printed digest is that of the
    MANIFEST.json O holds, and its lock is gone when it ends."""
    out = tmp_path / "o"
    module = fake_experiment("protocol")
    inner, seen = module.run, {}

    def run(ctx):
        seen["second"] = run_cli("run.py", "--cache", tmp_path / "cache", "--out", out, "--smoke", "--experiment",
                                 "protocol", timeout=120)
        return inner(ctx)
    module.run = run
    code, stdout, _ = fake_run(["--out", str(out)], {"protocol": module}, capsys)
    assert code == 0
    line = one_line(seen["second"])
    assert f"pid {os.getpid()}" in line and "o.lock" in line and "another run.py" in line, line
    digest = lines_of(stdout, "evidence digest: sha256:")
    manifest = (out / "MANIFEST.json").read_bytes()
    import hashlib

    assert digest == [f"evidence digest: sha256:{hashlib.sha256(manifest).hexdigest()}"]
    assert not (tmp_path / "o.lock").exists() and not [p for p in out.rglob(".*")]


def test_a_lock_left_by_a_killed_run_does_not_block(fake_run, tmp_path, capsys):
    """The kernel drops a killed run's flock: its <O>.lock file stays but is taken over."""
    from test_run_safety import killed_run

    out = tmp_path / "o"
    killed_run(out, "experiment")
    assert (tmp_path / "o.lock").exists()
    assert fake_run(["--out", str(out)], two(), capsys)[0] == 0


def test_no_digest_is_printed_for_a_manifest_o_no_longer_holds(fake_run, tmp_path, capsys, monkeypatch):
    """Fault injection: something replaces O/MANIFEST.json right after the run wrote it. The run prints no evidence
    digest (it would name evidence O does not hold) and exits 2 on one line."""
    import run as run_py

    real = run_py.write_manifest

    def replaced(out, *args):
        digest = real(out, *args)
        (Path(out) / "MANIFEST.json").write_text("{}")
        return digest
    monkeypatch.setattr(run_py, "write_manifest", replaced)
    code, stdout, err = fake_run(["--out", str(tmp_path / "o")], two(), capsys)
    assert code == 2 and not lines_of(stdout, "evidence digest") and "MANIFEST.json is not the one" in err
    assert len([l for l in err.splitlines() if l.strip()]) == 1


# ---- a rank that waits for a rank that never comes --------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow                  # run.py or torch.distributed in subprocesses
@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_alone_says_what_it_waits_for_and_gives_up_with_one_line(tmp_path, rank):
    """WORLD_SIZE=2 and the launcher's variables set, but only one rank started: it says which rank it waits for,
    where and how long (--join-timeout), then exits 2 on one line instead of waiting half an hour."""
    port = free_port()
    env = {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    t0 = time.monotonic()
    try:
        proc = run_cli("run.py", "--cache", tmp_path / "cache", "--out", tmp_path / "o", "--smoke",
                       "--join-timeout", "3", env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the lone rank was still waiting after 120 s")
    line = one_line(proc)
    waited_for = "rank 1" if rank == 0 else "rank 0"
    assert f"rank {rank} of 2: waiting up to 3 s for {waited_for}" in proc.stdout and f"127.0.0.1:{port}" in \
        proc.stdout, proc.stdout
    assert f"rank {rank} of 2" in line and "within 3 s" in line and "--join-timeout" in line, line
    assert time.monotonic() - t0 < 100 and not (tmp_path / "o").exists()


@pytest.mark.slow                  # run.py or torch.distributed in subprocesses
def test_join_timeout_must_be_a_positive_number_of_seconds(tmp_path):
    proc = run_cli("run.py", "--cache", tmp_path / "cache", "--out", tmp_path / "o", "--join-timeout", "0",
                   timeout=60)
    assert "--join-timeout 0" in one_line(proc)


JOIN_AND_GATHER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from experiments import parallel
plan = parallel.init_distributed("cpu", 60)
# one write per line: two ranks share the pipe, and print() writes the text and its newline separately
sys.stdout.write(f"gathered {parallel.all_gather(plan, plan.rank)} of {plan.world}\n")
sys.stdout.flush()
parallel.shutdown(plan)
"""


@pytest.mark.slow                  # run.py or torch.distributed in subprocesses
@pytest.mark.parametrize("how", ["torchrun", "by-hand"])
def test_ranks_that_all_start_join_and_gather(tmp_path, how):
    """The timed join works where every rank comes: under torchrun (its agent's store) and with the variables set
    by hand (rank 0's store)."""
    script = tmp_path / "join.py"
    script.write_text(JOIN_AND_GATHER)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    port = str(free_port())
    if how == "torchrun":
        cmds = [([PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                  "--master_port", port, str(script), str(REPO)], env)]
    else:
        cmds = [([PY, str(script), str(REPO)], dict(env, WORLD_SIZE="2", RANK=str(r), LOCAL_RANK=str(r),
                                                     MASTER_ADDR="127.0.0.1", MASTER_PORT=port)) for r in (0, 1)]
    procs = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, e in cmds]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert "".join(o for o, _ in outs).count("gathered [0, 1] of 2") == 2, outs


@pytest.mark.slow
def test_two_real_runs_on_one_out_the_second_refuses_and_the_first_keeps_its_evidence(tiny_cache, tmp_path):
    """Two `run.py --out O` processes (the tiny random model, protocol smoke), the second started while the first
    holds O: the second refuses on one line naming the first's pid; the first exits 0 and the digest it printed is
    the sha256 of the MANIFEST.json O holds."""
    import hashlib

    out = tmp_path / "o"
    args = ["run.py", "--cache", str(tiny_cache), "--out", str(out), "--model", "tiny-random-llama", "--smoke",
            "--experiment", "protocol", "--no-cache"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    first = subprocess.Popen([PY, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 120
    while not (out / ".run-in-progress").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    second = run_cli(*args, timeout=300)
    stdout, stderr = first.communicate(timeout=1200)
    assert first.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert f"pid {first.pid}" in one_line(second)
    digest = hashlib.sha256((out / "MANIFEST.json").read_bytes()).hexdigest()
    assert f"evidence digest: sha256:{digest}" in stdout
    assert not (tmp_path / "o.lock").exists()


def test_a_users_file_named_like_the_lock_is_neither_overwritten_nor_deleted(fake_run, tmp_path, capsys):
    """<O>.lock that run.py did not write (a user's results.lock beside results/) is refused, left as it was."""
    (tmp_path / "o.lock").write_text("my notes about o\n")
    code, _, err = fake_run(["--out", str(tmp_path / "o")], two(), capsys)
    assert code == 2 and "o.lock" in err and "not a lock file run.py writes" in err, err
    assert len(err.strip().splitlines()) == 1 and (tmp_path / "o.lock").read_text() == "my notes about o\n"
    assert not (tmp_path / "o").exists()


def test_an_empty_file_named_like_the_lock_is_a_users_and_is_left(fake_run, tmp_path, capsys):
    """An empty <O>.lock that run.py did not create (a user's placeholder) is refused and kept, not taken over and
    deleted at the end of the run."""
    (tmp_path / "o.lock").write_text("")
    code, _, err = fake_run(["--out", str(tmp_path / "o")], two(), capsys)
    assert code == 2 and "not a lock file run.py writes" in err, err
    assert (tmp_path / "o.lock").exists() and (tmp_path / "o.lock").read_text() == ""


def test_a_symlinked_out_is_refused_and_nothing_of_its_target_is_touched(fake_run, tmp_path, capsys):
    """--out L where L -> O: a second spelling of O would take another lock and sweep a live run's files; refused on
    one line, O and L as they were (a --replace through L would have renamed the link)."""
    real = tmp_path / "o"
    real.mkdir()
    (real / "notes.txt").write_text("mine\n")
    link = tmp_path / "l"
    link.symlink_to(real)
    for extra in ([], ["--replace"]):
        code, _, err = fake_run(["--out", str(link), *extra], two(), capsys)
        assert code == 2 and "a symbolic link" in err and len(err.strip().splitlines()) == 1, err
        assert link.is_symlink() and (real / "notes.txt").read_text() == "mine\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["l", "o"]


def test_two_spellings_through_a_symlinked_parent_share_one_lock(tmp_path):
    """P -> base: --out base/o and --out P/o are one directory and take one lock: the second refuses, naming the
    first's pid."""
    from experiments.evidence import take_out_lock
    from resources import ResourceError

    base = tmp_path / "base"
    base.mkdir()
    (tmp_path / "p").symlink_to(base)
    held = take_out_lock(base / "o")
    try:
        with pytest.raises(ResourceError, match=f"another run.py \\(pid {os.getpid()} "):
            take_out_lock(tmp_path / "p" / "o")
    finally:
        held.release()


def test_a_marker_of_a_live_run_py_is_never_swept(tmp_path):
    """O/.run-in-progress naming a pid of this host that still runs run.py (the lock bypassed, e.g. by another
    spelling of O): the sweep refuses and removes nothing."""
    import platform

    import run as run_py
    from resources import ResourceError

    out = tmp_path / "o"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "run.py"])
    for _ in range(100):        # /proc/<pid>/cmdline is empty for an instant after the process is created
        if b"run.py" in Path(f"/proc/{live.pid}/cmdline").read_bytes():
            break
        time.sleep(0.05)
    try:
        (out / ".run-in-progress").write_text(json.dumps({
            "format": "run-in-progress/v1", "run_id": "a" * 32, "pid": live.pid, "host": platform.node(),
            "started_utc": "2026-12-07T00:00:00Z", "claims": ["protocol", "run.log"]}))
        (out / "run.log").write_text("the live run's log\n")
        args = run_py.parse_args(["--cache", str(tmp_path), "--out", str(out)])
        with pytest.raises(ResourceError, match=f"pid {live.pid} on this host, which is still running run.py"):
            run_py.setup_out(args, ["protocol"], "b" * 32)
        assert (out / "run.log").read_text() == "the live run's log\n" and (out / ".run-in-progress").exists()
    finally:
        live.kill()
        live.wait()
