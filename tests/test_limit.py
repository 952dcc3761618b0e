"""run.py --limit N for protocol, options, extraction and harness: the first N items of each experiment's own
selection (SST-2: the hash rule's rank order, idx order for --split all; harness: the first N examples of each task,
as lm-eval's limit is per task), recorded in config.json and summary.json (`limit`), said in the console headline and
the report, and audited: the records are exactly the first N of the recomputed selection and N is the --limit of the
command line environment.json records. Extraction applies the limit before its audit sample is drawn.

Fast tests: the pieces (no model). Slow tests: one run.py --limit 3 on the tiny random model, audited clean and then
forged; one protocol run on the real model through audit.py --tokens."""
import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import run_cli

LIMITED = ("protocol", "options", "extraction", "harness")
SELECTION_ROW = {"protocol": "item selection", "options": "item selection", "extraction": "item selection",
                 "harness": "example selection"}
PROVENANCE = "task ids and hashes vs the repository's fixtures"


# ---- the pieces ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, want", [
    (["run.py", "--cache", "c", "--out", "o"], (None, None)),
    (["run.py", "--limit", "3"], (3, None)),
    (["run.py", "--limit=3"], (3, None)),
    (["run.py", "--lim", "5", "--experiment", "protocol"], (5, None)),        # argparse's unique prefix
    (["run.py", "--limit", "2", "--limit", "4"], (4, None)),                  # argparse: the last one wins
    (["run.py", "--out", "--limit"], (None, None)),                           # a value, not the flag
])
def test_command_line_limit_reads_the_recorded_flag(argv, want):
    from evidence_audit.run_command import command_line_limit
    assert command_line_limit({"command_line": argv}) == want


def test_command_line_limit_says_when_it_cannot_tell():
    from evidence_audit.run_command import command_line_limit
    assert command_line_limit({})[1].startswith("environment.json records no command line")
    assert "--merge" in command_line_limit({"command_line": ["run.py", "--merge", "a", "b", "--out", "o"]})[1]
    assert "not an integer" in command_line_limit({"command_line": ["run.py", "--limit", "x"]})[1]


def fake_ctx(limit, split="dev"):
    return SimpleNamespace(name="protocol", split=split, options=SimpleNamespace(limit=limit))


def test_limited_selection_keeps_the_first_n_in_selection_order():
    from experiments.selection import limited_selection
    ranked = [41, 7, 19, 3, 55]                  # a rank order, not sorted: the limit must not re-sort it
    assert limited_selection(fake_ctx(None), ranked) == (ranked, None)
    assert limited_selection(fake_ctx(3), ranked) == ([41, 7, 19], {"n": 3, "of": 5,
                                                                   "order": "rank order of the hash rule"})
    assert limited_selection(fake_ctx(2, "all"), [0, 1, 2])[1]["order"] == "idx order"


@pytest.mark.parametrize("n", [0, 6])
def test_limited_selection_refuses_a_limit_outside_the_selection(n):
    from experiments.selection import limited_selection
    from resources import ResourceError
    with pytest.raises(ResourceError, match=rf"--limit {n} is outside 1\.\.5"):
        limited_selection(fake_ctx(n), [41, 7, 19, 3, 55])


def test_harness_limit_is_per_task_in_file_order():
    from experiments.harness import limit_tasks
    from harness.tasks import FIXTURES, load_all_tasks
    from resources import ResourceError
    tasks = load_all_tasks(FIXTURES)
    limited, block = limit_tasks(tasks, 2)
    assert {n: [e.id for e in t.examples] for n, t in limited.items()} == \
        {n: [e.id for e in t.examples[:2]] for n, t in tasks.items()}
    assert block["of"] == sum(len(t.examples) for t in tasks.values()) and block["n"] == 2
    largest = max(len(t.examples) for t in tasks.values())
    with pytest.raises(ResourceError, match="would limit nothing"):
        limit_tasks(tasks, largest + 1)


def test_check_limit_accepts_every_experiment_but_grouped_ones():
    import run
    from resources import ResourceError
    mods = {n: SimpleNamespace(SUPPORTS_LIMIT=True) for n in LIMITED}
    run.check_limit(SimpleNamespace(limit=3, allow_partial_groups=False), mods)
    grouped = {**mods, "mctaco": SimpleNamespace(SUPPORTS_LIMIT=True, DOCUMENTS_ARE_GROUP_PARTS=True)}
    with pytest.raises(ResourceError, match="parts of a group") as refused:      # the default run: every experiment
        run.check_limit(SimpleNamespace(limit=3, allow_partial_groups=False), grouped)
    assert "--allow-partial-groups" in str(refused.value) and "--experiment NAME" in str(refused.value)
    with pytest.raises(ResourceError, match="not implemented for experiment.s. toy"):
        run.check_limit(SimpleNamespace(limit=3, allow_partial_groups=False), {**mods, "toy": SimpleNamespace()})


def test_every_experiment_supports_limit():
    import importlib
    for name in LIMITED + ("mctaco",):
        assert importlib.import_module(f"experiments.{name}").SUPPORTS_LIMIT is True, name


# ---- one limited run on the tiny model, audited and forged ------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_limit_run(tiny_cache, tmp_path_factory):
    """run.py --limit 3 on the tiny random model, the four experiments in one process (--no-cache: nothing served)."""
    out = tmp_path_factory.mktemp("tiny_limit") / "O"
    args = [a for n in LIMITED for a in ("--experiment", n)]
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", out, "--model", "tiny-random-llama", "--no-cache",
                   "--limit", "3", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


def audit(out, *extra):
    report = out.parent / f"{out.name}-audit.json"
    proc = run_cli("audit.py", out, "--report", report, *extra)
    return proc, json.loads(report.read_text())


def rows(report, experiment, prefix):
    return [r for r in report["checks"] if r["experiment"] == experiment and r["check"].startswith(prefix)]


@pytest.mark.slow
def test_limited_run_records_says_and_audits_the_limit(tiny_limit_run):
    out, proc = tiny_limit_run
    for name in ("protocol", "options", "extraction"):
        cfg = json.loads((out / name / "config.json").read_text())
        summ = json.loads((out / name / "summary.json").read_text())
        assert cfg["limit"] == summ["limit"] == {"n": 3, "of": 64, "order": "rank order of the hash rule"}
        assert f"[{name}] first 3 of 64 items (--limit 3): " in proc.stdout
    prereg = json.loads((out / "extraction.preregistration.json").read_text())
    assert prereg["population"]["limit"]["n"] == 3 and len(prereg["population"]["item_idx"]) == 3
    assert {s["idx"] for s in prereg["items"]} <= set(prereg["population"]["item_idx"])
    harness = json.loads((out / "harness" / "config.json").read_text())
    assert harness["limit"]["n"] == 3 and all(t["n_scored"] == min(3, t["n_in_file"])
                                              for t in harness["tasks"].values())
    assert "[harness] first 3 of each task's examples: " in proc.stdout
    page = (out / "report.html").read_text()
    assert page.count("LIMITED RUN: first 3 of 64 items (--limit 3)") == 3
    assert "LIMITED RUN: first 3 examples of each task (--limit 3)" in page
    aproc, report = audit(out)
    assert aproc.returncode == 0, aproc.stdout + aproc.stderr
    for name in LIMITED:
        (row,) = rows(report, name, SELECTION_ROW[name])
        assert row["status"] == "PASS" and row["note"].startswith("LIMITED RUN: FIRST 3 "), row
    result = next(line for line in aproc.stdout.splitlines() if line.startswith("RESULT: "))
    assert result.startswith(f"RESULT: PASS (LIMITED RUN (--LIMIT): {', '.join(sorted(LIMITED)).upper()})"), result


def forged_copy(out, tmp_path):
    d = tmp_path / "O"
    shutil.copytree(out, d)
    (d / "audit.json").unlink(missing_ok=True)
    return d


def edit_json(path, fn):
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def set_limit_n(d, name, n):
    """config.json and summary.json both claim --limit n (the records stay those of --limit 3)."""
    for f in ("config.json", "summary.json"):
        edit_json(d / name / f, lambda o: o["limit"].update(n=n))


def set_command_limit(d, n):
    def fix(env):
        argv = env["command_line"]
        argv[argv.index("--limit") + 1] = str(n)
    edit_json(d / "environment.json", fix)


def drop_limit(d, name):
    for f in ("config.json", "summary.json"):
        edit_json(d / name / f, lambda o: o.pop("limit"))


def drop_command_limit(d):
    def fix(env):
        k = env["command_line"].index("--limit")
        del env["command_line"][k:k + 2]
    edit_json(d / "environment.json", fix)


def not_the_first_n(d, name):
    """The third record's item replaced by the fourth of the selection (and config.json's item list with it)."""
    cfg_path = d / name / "config.json"
    cfg = json.loads(cfg_path.read_text())
    salt, n_rows = cfg["selection"]["salt"], cfg["n_rows"]
    ranked = sorted(range(n_rows), key=lambda i: hashlib.sha256(f"{salt}:{i}".encode()).hexdigest())
    old, new = ranked[2], ranked[3]
    lines = (d / name / "records.jsonl").read_text().splitlines()
    recs = [json.loads(l) for l in lines]
    for r in recs:
        if r["idx"] == old:
            r["idx"] = new
    (d / name / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
    edit_json(cfg_path, lambda o: o["selection"].update(item_idx=[new if i == old else i
                                                                  for i in o["selection"]["item_idx"]]))


def harness_not_the_first_n(d, name):
    """A task's scored ids claimed to be its examples 2..4 rather than 1..3 (records relabelled to match)."""
    cfg_path = d / name / "config.json"
    cfg = json.loads(cfg_path.read_text())
    tname = "arithmetic"
    lines = (Path(__file__).resolve().parents[1] / "fixtures" / "harness_tasks" / f"{tname}.jsonl").read_text()
    ids = [json.loads(l)["id"] for l in lines.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    swap = dict(zip(ids[:3], ids[1:4]))
    edit_json(cfg_path, lambda o: o["tasks"][tname].update(ids=ids[1:4]))
    recs = [json.loads(l) for l in (d / name / "records.jsonl").read_text().splitlines()]
    for r in recs:
        if r["task"] == tname:
            r["id"] = swap[r["id"]]
    (d / name / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))


FORGERIES = {
    # records of items 1..3, but config.json and summary.json say --limit 2
    "config_says_limit_2": lambda d, name: set_limit_n(d, name, 2),
    # the same, with the recorded command line rewritten to --limit 2 too: the records still are 3
    "command_and_config_say_limit_2": lambda d, name: (set_limit_n(d, name, 2), set_command_limit(d, 2)),
    # the limit hidden: config.json and summary.json claim a whole selection
    "limit_dropped": drop_limit,
    # the limit recorded, but the command line's --limit removed
    "command_line_without_limit": lambda d, name: drop_command_limit(d),
    # the items are not the first N of the selection
    "not_the_first_n": lambda d, name: (harness_not_the_first_n if name == "harness" else not_the_first_n)(d, name),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", LIMITED)
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forged_limit_fails_the_selection_row(tiny_limit_run, tmp_path, name, forgery):
    from evidence_audit.mutations.tools import seal
    out, _ = tiny_limit_run
    d = forged_copy(out, tmp_path)
    FORGERIES[forgery](d, name)
    seal(d)       # a forger who reseals MANIFEST.json: only the recomputation can catch it
    proc, report = audit(d)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # the harness's ids are checked against the shipped fixture files by the provenance row
    check = PROVENANCE if (name, forgery) == ("harness", "not_the_first_n") else SELECTION_ROW[name]
    (row,) = rows(report, name, check)
    assert row["status"] == "FAIL", (forgery, row)


@pytest.mark.slow
def test_summary_limit_alone_forged_fails_the_summary_row(tiny_limit_run, tmp_path):
    from evidence_audit.mutations.tools import seal
    out, _ = tiny_limit_run
    d = forged_copy(out, tmp_path)
    edit_json(d / "protocol" / "summary.json", lambda o: o["limit"].update(of=872))
    seal(d)
    proc, report = audit(d)
    assert proc.returncode == 1
    (row,) = rows(report, "protocol", "summary.json values")
    assert row["status"] == "FAIL" and "limit.of" in row["first_failure"], row


@pytest.mark.slow
def test_limit_over_the_selection_is_refused_on_one_line(tiny_cache, tmp_path):
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", tmp_path / "O", "--model", "tiny-random-llama",
                   "--experiment", "protocol", "--limit", "65")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: protocol: --limit 65 is outside 1..64 (the dev selection has "
                                                "64 items)"]


# ---- the real model ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_limited_protocol_on_the_real_model_passes_the_token_level(prepared_cache, tmp_path):
    out = tmp_path / "O"
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", out, "--experiment", "protocol", "--no-cache",
                   "--limit", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[protocol] first 5 of 64 items (--limit 5): 5 items" in proc.stdout
    aproc, report = audit(out, "--tokens", "--strict")
    assert aproc.returncode == 0, aproc.stdout + aproc.stderr
    assert all(r["status"] != "FAIL" for r in report["checks"])
    assert any(r["level"] == "identity" and r["status"] == "PASS" for r in report["checks"])
