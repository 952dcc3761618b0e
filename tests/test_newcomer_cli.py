"""A newcomer's first commands: a small file of their own, a typo in --model or --data, a flag --merge ignores,
Ctrl-C, and what the console says about fast mode, a mismatch and an earlier run's leftovers.

The fast tests call run.py's and prepare.py's functions in this process (no model is loaded: the checks run
before the imports); the end-to-end ones run run.py on a tiny random Llama (test_local_model.build) and, once,
on the real model (slow).
"""
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import conftest
from conftest import REPO, link_or_copy, run_cli

SMALL_ROWS = 20
HOLD_IN_SCORING = Path(__file__).with_name("hold_in_scoring.py")


def small_tsv(path, n=SMALL_ROWS):
    """The first n rows of the sentiment fixture as a user's own .tsv."""
    lines = (REPO / "fixtures" / "sentiment_dev.tsv").read_text().splitlines(keepends=True)
    Path(path).write_text("".join(lines[:1 + n]))
    return Path(path)


def import_small(cache, tmp_path, name="mine", n=SMALL_ROWS, capsys=None):
    """`prepare.py --cache CACHE --data-file mine.tsv --name mine` in this process; its stdout."""
    import prepare

    prepare.main(["--cache", str(cache), "--data-file", str(small_tsv(tmp_path / f"{name}.tsv", n)), "--name", name])
    return capsys.readouterr().out if capsys else None


def run_main(argv, capsys):
    """run.main(argv) in this process: (exit code, stdout, stderr)."""
    import run

    code = run.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- 1. small data ------------------------------------------------------------------------------------------------

def test_import_says_which_splits_a_small_file_supports(tmp_path, capsys):
    """prepare.py names the splits run.py can draw from the file, with config.py's numbers."""
    import config

    shared = config.CONFIG["shared"]
    out = import_small(tmp_path / "cache", tmp_path, capsys=capsys)
    line = next(l for l in out.splitlines() if "splits:" in l)
    assert "--split smoke, all (every row in idx order)" in line
    assert f"dev needs {shared['n_dev']} rows" in line
    assert f"confirm needs {shared['n_dev'] + shared['n_confirm']} rows" in line
    assert f"this file has {SMALL_ROWS}" in line and "run.py scores split all on it" in line


def test_import_of_enough_rows_names_dev_and_confirm():
    import config
    import prepare
    import resources

    shared = config.CONFIG["shared"]
    enough = prepare.splits_supported(shared["n_dev"] + shared["n_confirm"], resources.SST2)
    assert enough.startswith("run.py --split smoke, dev, confirm, all") and "needs" not in enough
    middle = prepare.splits_supported(shared["n_dev"], resources.SST2)
    assert "smoke, dev, all" in middle and "confirm needs" in middle and "scores split all" not in middle


def fake_inputs(cache, rows):
    """Inputs over a cache holding data 'mine' of `rows` rows (imported; split_of reads only its manifest)."""
    from experiments.context import Data, Inputs

    import_small(cache, cache.parent, n=rows)
    return Inputs(cache=cache, model_dir=cache, model_identity={"id": "m"},
                  data={"mine": Data(id="mine", schema="sst2", parquet_path=cache / "p", content_sha256="d" * 64,
                                     split="validation")})


@pytest.mark.parametrize("flags, rows, want", [
    ([], SMALL_ROWS, {"protocol": "all", "options": "all", "extraction": "all", "mctaco": "dev", "harness": "dev"}),
    ([], 64, {"protocol": "dev", "mctaco": "dev"}),
    (["--split", "dev"], SMALL_ROWS, {"protocol": "dev"}),          # asked for: refused later, never re-selected
    (["--smoke"], SMALL_ROWS, {"protocol": "smoke"}),
])
def test_default_split_is_all_only_where_the_data_is_too_small_for_dev(tmp_path, flags, rows, want):
    import run
    from experiments import EXPERIMENTS
    import importlib
    import registry

    args = run.parse_args(["--cache", str(tmp_path), "--out", str(tmp_path / "o"), "--data", "mine", *flags])
    inputs = fake_inputs(tmp_path / "cache", rows)
    modules = {n: importlib.import_module(registry.find(n).runner) for n in EXPERIMENTS}
    assert {n: run.split_of(args, modules[n], inputs) for n in want} == want


def test_the_default_all_is_said_on_one_line(tmp_path, capsys):
    import importlib

    import registry
    import run

    modules = {n: importlib.import_module(registry.find(n).runner) for n in ("protocol", "mctaco")}
    args = run.parse_args(["--cache", str(tmp_path), "--out", str(tmp_path / "o"), "--data", "mine"])
    inputs = fake_inputs(tmp_path / "cache", SMALL_ROWS)
    capsys.readouterr()
    run.split_notes(args, modules, inputs)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"*** SPLIT ALL (protocol): data mine has {SMALL_ROWS} rows, fewer than the 64 the dev split needs: "
                     "protocol scores split all (every row in idx order; config.json records it, every output says "
                     "so); --split dev is refused on this data ***"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama with its own small tokenizer (no real model needed)."""
    from test_local_model import build

    return build("llama", tmp_path_factory.mktemp("newcomer") / "tiny")


def readme_recipe(cache, out, *extra):
    """README's own-data recipe, as written: prepare.py --data-file mine.tsv --name mine, then run.py."""
    return run_cli("run.py", "--cache", cache, "--out", out, "--experiment", "protocol", "--data", "mine", *extra)


def check_small_run(proc, out):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("fewer than the 64 the dev split needs") == 1
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    assert cfg["split"] == cfg["selection"]["split"] == "all"
    assert cfg["selection"]["item_idx"] == list(range(SMALL_ROWS))


@pytest.mark.slow
def test_readme_own_data_recipe_runs_on_twenty_rows_tiny(tiny_dir, tmp_path):
    cache = tmp_path / "cache"
    proc = run_cli("prepare.py", "--cache", cache, "--data-file", small_tsv(tmp_path / "mine.tsv"), "--name", "mine")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out-mine"
    proc = readme_recipe(cache, out, "--model", tiny_dir)
    check_small_run(proc, out)
    audit = run_cli("audit.py", out)
    assert audit.returncode == 0 and "RESULT: PASS" in audit.stdout, audit.stdout[-2000:] + audit.stderr


@pytest.mark.slow
def test_readme_own_data_recipe_runs_on_twenty_rows_real_model(prepared_cache, tmp_path):
    cache = tmp_path / "cache"
    import shutil

    shutil.copytree(prepared_cache, cache, copy_function=link_or_copy, ignore=shutil.ignore_patterns("results.sqlite*"))
    proc = run_cli("prepare.py", "--cache", cache, "--data-file", small_tsv(tmp_path / "mine.tsv"), "--name", "mine")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out-mine"
    proc = readme_recipe(cache, out)
    check_small_run(proc, out)
    audit = run_cli("audit.py", out)
    assert audit.returncode == 0 and "RESULT: PASS" in audit.stdout, audit.stdout[-2000:] + audit.stderr


# ---- 2. typos and paths -------------------------------------------------------------------------------------------

def one_error_line(code, err):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_model_path_that_is_not_there_is_no_such_directory(tmp_path, capsys):
    nope = tmp_path / "nope-model"
    line = one_error_line(*run_main(["--cache", tmp_path, "--out", tmp_path / "o", "--model", nope], capsys)[::2])
    assert line.startswith(f"error: --model {nope}: no such directory;")
    assert not (tmp_path / "o").exists()


def test_an_unknown_model_id_lists_the_known_ones_closest_first(tmp_path, capsys):
    line = one_error_line(*run_main(["--cache", tmp_path, "--out", tmp_path / "o", "--model", "smollm2"],
                                    capsys)[::2])
    assert "unknown model id 'smollm2'; known: smollm2-135m-instruct, smollm2-135m-instruct-q4_1 (closest first)" \
        in line


def test_an_unknown_data_id_lists_the_users_own_data_too_closest_first(tmp_path, capsys):
    cache = tmp_path / "cache"
    import_small(cache, tmp_path, name="my-reviews", capsys=capsys)
    line = one_error_line(*run_main(["--cache", cache, "--out", tmp_path / "o", "--data", "fixture-sentimnt"],
                                    capsys)[::2])
    known = re.search(r"known: (.*) \(closest first\)", line).group(1).split(", ")
    assert known[0] == "fixture-sentiment" and "my-reviews" in known and "glue-sst2" in known
    line = one_error_line(*run_main(["--cache", cache, "--out", tmp_path / "o", "--data", "my-review"], capsys)[::2])
    assert "unknown data id 'my-review'; known: my-reviews," in line and "--data-file FILE --name NAME" in line


def test_merge_refuses_a_flag_it_would_ignore_even_at_its_default(tmp_path, capsys):
    import config

    threads = str(config.CONFIG["shared"]["threads"])       # the default value: silently equal before
    base = ["--cache", tmp_path, "--out", tmp_path / "o", "--merge", tmp_path / "a", tmp_path / "b"]
    line = one_error_line(*run_main([*base, "--threads", threads], capsys)[::2])
    assert "--threads would do nothing" in line and "--merge" in line
    line = one_error_line(*run_main([*base, "--join-timeout", "5", "--dtype", "float32"], capsys)[::2])
    assert "--dtype, --join-timeout would do nothing" in line
    line = one_error_line(*run_main([*base, "--replace", "--verbose"], capsys)[::2])
    assert "would do nothing" not in line and "SHARD.json" in line      # the merge's own flags pass


# ---- 3. Ctrl-C ----------------------------------------------------------------------------------------------------

def progress_free(stderr):
    """stderr without tqdm's progress bars (carriage-return redrawn, never newline-ended until they close)."""
    return [l for l in stderr.split("\n") if l.strip() and "\r" not in l and not re.search(r"\d+%\|", l)]


@pytest.fixture(scope="module")
def sentiment_cache(tmp_path_factory):
    """A cache holding only the 200-row sentiment fixture (prepared from the repository: no model)."""
    cache = tmp_path_factory.mktemp("sentiment") / "cache"
    proc = run_cli("prepare.py", "--cache", cache, "--data", "fixture-sentiment")
    assert proc.returncode == 0, proc.stderr
    return cache


def as_from_a_terminal():
    """In the child before exec: SIGINT at its default and unblocked, as a shell started from a terminal gives it.
    The test process's own disposition is not the user's: a process started with SIGINT ignored keeps it ignored
    (Python installs its KeyboardInterrupt handler only over the default), and a blocked signal stays blocked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def interrupt_while_scoring(cmd, timeout=600):
    """Start run.py under tests/hold_in_scoring.py, which holds it right after its first forward batch is committed
    (the experiment is scoring) and says so on a pipe; send SIGINT once it has said so, wait for it to end:
    (exit code, stdout, stderr). The interrupt lands at that point on any machine, never after a guessed delay;
    stdout and stderr are run.py's own (the helper prints nothing on them)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    ready, ready_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, HOLD_IN_SCORING, str(ready_w), *map(str, cmd)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(ready_w,),
                                preexec_fn=as_from_a_terminal)
    finally:
        os.close(ready_w)       # the child holds the only write end: EOF here once it exits without holding
    got = {}
    readers = [threading.Thread(target=lambda name, f: got.__setitem__(name, f.read()), args=(name, f), daemon=True)
               for name, f in (("out", proc.stdout), ("err", proc.stderr))]    # drained: a full pipe would block it
    for r in readers:
        r.start()
    said, code = None, None
    try:
        if select.select([ready], [], [], timeout)[0]:
            said = os.read(ready, 4096)         # the helper's line, or b"" (EOF): run.py ended without holding
            if said:
                proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)        # hold_in_scoring.py: every thread's stack on stderr, then killed
        time.sleep(2)
    finally:
        os.close(ready)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for r in readers:
            r.join(timeout=30)
    stderr = got.get("err", "")
    assert said is not None, f"run.py did not reach its first forward batch within {timeout} s: {stderr[-3000:]}"
    assert said, f"run.py ended (exit {proc.returncode}) without committing a forward batch: {stderr[-3000:]}"
    assert code is not None, (f"run.py still ran 120 s after SIGINT (killed; this process's SIGINT: "
                              f"{signal.getsignal(signal.SIGINT)}, blocked here: "
                              f"{sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}): {stderr[-6000:]}")
    return code, got.get("out", ""), stderr


@pytest.mark.slow
def test_ctrl_c_while_scoring_is_one_line_and_o_keeps_nothing_half_written(tiny_dir, sentiment_cache, tmp_path):
    out = tmp_path / "o"
    cmd = ["run.py", "--cache", sentiment_cache, "--out", out, "--model", tiny_dir, "--experiment", "protocol",
           "--split", "all"]
    code, stdout, stderr = interrupt_while_scoring(cmd)
    lines = progress_free(stderr)
    assert code == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("interrupted: installed: no experiment; protocol was scoring"), lines
    assert "resume with: " in lines[0] and lines[0].endswith("--split all")      # nothing installed: no --replace
    left = sorted(p.name for p in out.iterdir())
    assert set(left) <= {".run-in-progress", "run.log", "private"}, left        # no temp dir, no evidence
    assert not (out / "private").exists() or not any((out / "private").iterdir())
    log = (out / "run.log").read_text()
    assert re.search(r"run\.py: run [0-9a-f]{32} ended: interrupted \(SIGINT\); no evidence installed\n$", log)

    promised = re.search(r"it stored (\d+) forward batch\(es\) \((\d+) candidate scores\) in the result cache, "
                         r"which a rerun of the same command is served", lines[0])
    assert promised, lines[0]

    again = run_cli(*cmd)                            # the same command: served what the line promised
    assert again.returncode == 0, again.stderr[-2000:]
    served = re.search(r"independent scores from the result cache: (\d+)/(\d+)", again.stdout)
    assert served and int(served.group(1)) >= int(promised.group(2)), (lines[0], again.stdout[-1500:])
    swept = next(l for l in again.stdout.splitlines() if l.startswith("removed from"))  # it names what it removes
    assert "run.log" in swept and "it ended (interrupted (SIGINT); no evidence installed) without a manifest" in swept


def test_the_interrupt_line_counts_the_batches_the_result_cache_keeps(tmp_path):
    """interrupted_state reads the result cache read-only: the forward batches stored under the experiment's
    identity, and how many this run stored."""
    import run
    from experiments import protocol, result_cache
    from experiments.context import Data, Inputs

    cache = tmp_path / "cache"
    inputs = Inputs(cache=cache, model_dir=cache, model_identity={"id": "m", "model_sha256": "m" * 64,
                                                                  "tokenizer_sha256": "t" * 64},
                    data={"mine": Data(id="mine", schema="sst2", parquet_path=cache / "p", content_sha256="d" * 64,
                                       split="validation")})
    cfg = {"data": "mine", "threads": 1, "result_cache_file": "results.sqlite"}
    env = {"code_sha256": "c" * 64}
    ident = result_cache.run_identity(model_sha256="m" * 64, tokenizer_sha256="t" * 64, data_content_sha256="d" * 64,
                                      prompt_template_sha256="p" * 64, config=cfg, scorer="independent-parity",
                                      code_sha256="c" * 64, versions={}, platform={})
    before = time.time()
    rc = result_cache.ResultCache(cache / "results.sqlite", ident)
    rc.put_batch([[1, 2]], [[0, [2]]], [-1.5])
    rc.put_batch([[1, 3]], [[0, [3]], [0, [4]]], [-1.0, -2.0])
    rc.close()
    done = {"installed": [], "failed": [], "running": "protocol"}
    args = run.parse_args(["--cache", str(cache), "--out", str(tmp_path / "o")])
    state = run.interrupted_state(args, done, inputs, {"protocol": protocol}, {"protocol": cfg}, env, before)
    assert state == ("installed: no experiment; protocol was scoring; it stored 2 forward batch(es) (3 candidate "
                     "scores) in the result cache, which a rerun of the same command is served")
    # batches of the same identity from an earlier run (another split, say) are not promised to this command's rerun
    later = run.interrupted_state(args, done, inputs, {"protocol": protocol}, {"protocol": cfg}, env, time.time() + 1)
    assert "it stored no forward batch before it stopped, so a rerun scores it from the start" in later, later
    assert "holds 2 batch(es) of its identity from earlier runs" in later, later


# ---- 4. console truth ---------------------------------------------------------------------------------------------

def fast_summary(from_cache, n=40):
    return {"batch_size": 16, "parity_from_cache": from_cache, "n_candidates": n,
            "vs_parity": {"max_abs_diff": 0.0, "n_argmax_changes": 0},
            "wall_s": {"fast": 3.449, "parity": 0.0327}}


def test_fast_headline_does_not_compare_with_a_parity_time_served_from_the_cache():
    from experiments import fast_check

    stats = {"enabled": True, "from_cache": 40, "candidate_scores": 40, "corrupted": 0}
    text = fast_check.headline(stats, fast_summary(40))
    assert "vs parity" not in text and "parity served from the result cache (all scores)" in text
    assert "parity served from the result cache (10 of 40 scores)" in fast_check.headline(stats, fast_summary(10))
    assert "3.449 s vs parity 0.0327 s" in fast_check.headline(stats, fast_summary(0))


def test_mismatch_table_shows_whole_values_or_says_how_many_are_left_out(tmp_path, capsys):
    import run
    from experiments.evidence import IdentityMismatch

    pair = [-0.12345678901234567, -1.2345678901234567]              # 41 characters: was cut at 40
    many = [-0.1234567890123456 * k for k in range(1, 31)]
    run.write_failure(tmp_path, "protocol", IdentityMismatch("scores differ", [(3, "scores", pair, many)]))
    err = capsys.readouterr().err
    row = next(l for l in err.splitlines() if l.lstrip().startswith("3 "))
    assert str(pair) in row
    shown = re.search(r"(\[[^\]]*, … \((\d+) more\)\])$", row)
    assert shown and len(re.findall(r"-\d\.\d+", row)) + int(shown.group(2)) == len(pair) + len(many)
    assert json.loads((tmp_path / "protocol.FAILED.json").read_text())["mismatches"][0]["independent"] == many


def test_kernel_disagreement_says_how_many_batches_it_leaves_out():
    from experiments import two_paths

    independent = {k: [{"batch": [k, 0, 2, 7]}] for k in range(13)}
    text = two_paths.score_disagreement(list(range(13)), independent, {"official_batch_size": 16, "device": "cpu",
                                                                        "dtype": "float32"})
    assert "9 (2 rows x 7 tokens), … (3 more))" in text


def swept_line(tmp_path, capsys, log_tail):
    """setup_out on an O that an earlier run left with its marker and a run.log ending in `log_tail`."""
    import run
    from experiments.evidence import write_marker

    out = tmp_path / "o"
    out.mkdir()
    write_marker(out, "a" * 32, ["protocol"])
    (out / "run.log").write_text("2026-12-02 INFO [run] run.py ...: library messages of this run follow\n" + log_tail)
    args = run.parse_args(["--cache", str(tmp_path), "--out", str(out)])
    run.setup_out(args, ["protocol"], "b" * 32)
    return capsys.readouterr().out.strip()


def test_sweep_of_a_failed_runs_log_says_it_failed(tmp_path, capsys):
    line = swept_line(tmp_path, capsys, f"2026-12-02 INFO [run] run.py: run {'a' * 32} ended: stopped by an error "
                                        "(exit 2); no evidence installed\n")
    assert "left: run.log; it ended (stopped by an error (exit 2); no evidence installed) without a manifest" in line
    assert "without finishing" not in line


def test_sweep_of_a_killed_runs_log_says_it_did_not_finish(tmp_path, capsys):
    line = swept_line(tmp_path, capsys, f"2026-12-02 INFO [run] run.py: run {'c' * 32} ended: exit 0\n")  # another run
    assert "left: run.log; it did not finish (killed, or stopped before it could log how it ended)" in line


@pytest.mark.slow
def test_a_failed_runs_log_is_named_as_such_by_the_next_run(tiny_dir, tmp_path):
    """A run that fails after O is made (here --split dev on 20 rows) ends run.log with how it ended; the next run
    into O says so when it removes it."""
    cache = tmp_path / "cache"
    proc = run_cli("prepare.py", "--cache", cache, "--data-file", small_tsv(tmp_path / "mine.tsv"), "--name", "mine")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "o"
    failed = readme_recipe(cache, out, "--model", tiny_dir, "--split", "dev")
    assert failed.returncode == 2 and "needs 64 ranked rows but the data has 20" in failed.stderr
    assert "ended: stopped by an error (exit 2); no evidence installed" in (out / "run.log").read_text()
    again = readme_recipe(cache, out, "--model", tiny_dir)
    assert again.returncode == 0, again.stderr[-2000:]
    swept = next(l for l in again.stdout.splitlines() if l.startswith("removed from"))
    assert "run.log; it ended (stopped by an error (exit 2); no evidence installed) without a manifest" in swept
