"""The audit knows what evidence a run must have written, without trusting MANIFEST.json: a resealing forger
(evidence_audit.mutations.tools.seal: report.html re-derived, MANIFEST.json rewritten to match) who deletes an
experiment, O/private, or adds a public file no rule knows, or forges the per-rank facts, still gets FAIL or
INCOMPLETE and a non-zero exit. Also the command line's own failure modes: a requested level that cannot run, an
--experiment typo, a partial audit next to a full O/audit.json.

The fast cases use the tiny synthetic harness evidence of test_audit.py (no model), given the command line run.py
records; the slow case uses the session's real smoke run of all five experiments."""
import json
import shutil

import pytest

from conftest import REPO, run_cli
from evidence_audit import driver, run_command
from evidence_audit.mutations.tools import seal
from evidence_audit.shared import data_parallel_problems
from test_audit import _edit, _write, tiny_harness_evidence

AUDIT = REPO / "audit.py"


def tiny(tmp_path, command=("run.py", "--cache", "c", "--out", "O", "--experiment", "harness")):
    """The tiny harness evidence, its environment.json holding the command line run.py records, resealed."""
    out = tiny_harness_evidence(tmp_path / "O")
    _edit(out / "environment.json", lambda e: e.update(command_line=list(command)))
    from evidence_report import page        # report.py's own page: the identity level rebuilds and compares it
    page.write(out)
    seal(out)
    return out


def failures(rep, check=None):
    return [f for r in rep["checks"] if r["status"] == "FAIL" and (check is None or r["check"].startswith(check))
            for f in r["failures"]]


def audit(*args, cwd=None):
    return run_cli(AUDIT, *map(str, args), **({"cwd": cwd} if cwd else {}))


def test_clean_tiny_evidence_with_its_command_line_passes(tmp_path):
    rep = driver.audit(tiny(tmp_path))
    assert rep["exit_code"] == 0 and rep["result"] == "PASS", failures(rep)
    assert any(r["check"].startswith("experiments the recorded command ran") and r["status"] == "PASS"
               for r in rep["checks"])


# ---- point 2: selective reporting ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command, needle", [
    (("run.py", "--cache", "c", "--out", "O"), "protocol/: the recorded command ran protocol"),
    (("run.py", "--cache", "c", "--out", "O", "--experiment", "harness", "--experiment=options"),
     "options/: the recorded command ran options"),
    (("run.py", "--cache=c", "--out", "O", "--experiment", "protocol"), "harness/: the recorded command did not run"),
])
def test_an_experiment_the_command_ran_but_o_lacks_fails(tmp_path, command, needle):
    out = tiny(tmp_path, command)
    rep = driver.audit(out)
    assert rep["exit_code"] == 1 and rep["result"] == "FAIL"
    assert any(needle in f for f in failures(rep, "experiments the recorded command ran")), failures(rep)


def test_a_missing_command_line_is_said_not_passed(tmp_path):
    """Deleting the command line gives a forger no more than rewriting it (only the cited digest ties O to its
    run): the row is SKIPPED with the reason, never PASS."""
    out = tiny(tmp_path)
    _edit(out / "environment.json", lambda e: e.pop("command_line"))
    seal(out)
    rep = driver.audit(out)
    row = next(r for r in rep["checks"] if r["check"].startswith("experiments the recorded command ran"))
    assert row["status"] == "SKIPPED" and "NOT checked" in row["note"], row


def test_parse_command_line_reads_runs_flags():
    ran = run_command.experiments_of_command
    assert ran(["run.py", "--cache", "c", "--out", "O", "--smoke"]) == (list(driver.registry.NAMES), None)
    assert ran(["/x/run.py", "--experiment", "mctaco", "--experiment=protocol", "--out", "O", "--cache", "c"]) \
        == (["mctaco", "protocol"], None)
    assert ran(["run.py", "--cache", "c", "--out", "O", "--merge", "a", "b"])[1] is not None     # not on the line
    assert ran(["run.py", "--experiment"])[1] is not None and ran(["bench.py"])[1] is not None
    assert ran(["run.py", "--experiment", "nosuch", "--cache", "c", "--out", "O"])[1] is not None


# ---- point 4: INCOMPLETE cannot be bypassed by emptying the manifest's private list ----------------------------------

def test_private_removed_and_manifest_private_emptied_is_incomplete(tmp_path):
    out = tiny(tmp_path)
    shutil.rmtree(out / "private")
    _edit(out / "MANIFEST.json", lambda m: m.update(private={}))
    seal(out)
    assert json.loads((out / "MANIFEST.json").read_text())["private"] == {}
    proc = audit(out, "--report", tmp_path / "a.json")
    assert proc.returncode == 1 and "RESULT: INCOMPLETE" in proc.stdout and "RESULT: PASS" not in proc.stdout, \
        proc.stdout
    assert "harness" in proc.stdout.split("RESULT:")[1]


def test_one_experiments_private_dir_removed_fails(tmp_path):
    out = tiny(tmp_path)
    shutil.rmtree(out / "private/harness")
    (out / "private/.keep").mkdir()         # O/private stays, the experiment's part of it is gone
    shutil.rmtree(out / "private/.keep")
    seal(out)
    rep = driver.audit(out)
    assert rep["exit_code"] == 1 and rep["result"] == "FAIL"
    assert any("private/harness/run.json" in f for f in failures(rep, "private evidence")), failures(rep)


# ---- point 7: every public file has a rule, and no private text is public --------------------------------------------

@pytest.mark.parametrize("rel", ["harness/notes.md", "harness/texts.jsonl", "notes.md", "protocol.preregistration.json",
                                 "extraction.preregistration.json"])
def test_a_public_file_no_rule_knows_fails(tmp_path, rel):
    out = tiny(tmp_path)
    _write(out / rel, {"note": "x"} if rel.endswith(".json") else "a note\n")
    seal(out)
    rep = driver.audit(out)
    assert rep["exit_code"] == 1
    assert any(rel in f for f in failures(rep, "public files run.py writes")), failures(rep)


def test_a_copy_of_a_private_file_in_the_public_part_fails(tmp_path):
    out = tiny(tmp_path)
    shutil.copy(out / "private/harness/leaderboard.json", out / "run.log")      # a name the run writes
    seal(out)
    rep = driver.audit(out)
    assert rep["exit_code"] == 1
    assert any("run.log" in f and "private/harness/leaderboard.json" in f
               for f in failures(rep, "no private text in the public part")), failures(rep)


def test_a_private_string_in_a_public_file_fails(tmp_path):
    out = tiny(tmp_path)
    secret = "the private sentence that only O/private holds, never the public part"
    _write(out / "private/harness/notes.jsonl", json.dumps({"sentence": secret}) + "\n")
    _write(out / "run.log", f"library chatter\nprompt: {secret}\n")
    seal(out)
    rep = driver.audit(out)
    assert rep["exit_code"] == 1
    assert any("run.log" in f and "private/harness/notes.jsonl" in f
               for f in failures(rep, "no private text in the public part")), failures(rep)


def test_a_forged_audit_json_is_ignored_and_replaced(tmp_path):
    out = tiny(tmp_path)
    _write(out / "harness/stages.json", {})       # a tamper the audit fails
    seal(out)
    forged = {"result": "PASS", "exit_code": 0, "levels": ["arithmetic", "identity", "forward"], "checks": []}
    (out / "audit.json").write_text(json.dumps(forged))
    proc = audit(out)
    assert proc.returncode == 1 and "RESULT: FAIL" in proc.stdout
    assert "audit.json" in proc.stdout and "not evidence" in proc.stdout, proc.stdout
    assert json.loads((out / "audit.json").read_text())["result"] == "FAIL"


def forge_ranks(env):
    env["data_parallel"] = {"mode": "distributed", "world_size": 3, "launcher": "torchrun", "backend": "gloo",
                            "rule": "whole batches", "ranks": [
                                {"rank": 0, "host": "h", "pid": 1, "wall_s": 2.0, "peak_rss_bytes": 100},
                                {"rank": 1, "host": "h", "pid": 2, "wall_s": -1.0, "peak_rss_bytes": -5},
                                {}]}


def test_forged_ranks_in_environment_json_fail(tmp_path):
    out = tiny(tmp_path)
    _edit(out / "environment.json", forge_ranks)
    seal(out)
    rep = driver.audit(out)
    bad = failures(rep, "environment.json data_parallel")
    assert rep["exit_code"] == 1
    for needle in ("ranks[1] wall_s", "ranks[1] peak_rss_bytes", "ranks[2]"):
        assert any(needle in f for f in bad), (needle, bad)


def test_forged_ranks_in_stages_json_fail():
    stages = {"data_parallel": {"world_size": 3, "ranks": [
        {"rank": 0, "wall_s": 1.0, "peak_rss_bytes": 10, "items_scored": {"official": [1], "independent": [1]}},
        {"rank": 1, "wall_s": -1.0, "peak_rss_bytes": -10, "items_scored": {"official": [2], "independent": [2]}},
        {"rank": 2, "wall_s": 1.0, "peak_rss_bytes": 10, "items_scored": {"official": [], "independent": []}}]}}
    bad = data_parallel_problems(stages, [{"idx": 1}, {"idx": 2}])
    assert any("ranks[1] wall_s" in f for f in bad) and any("ranks[1] peak_rss_bytes" in f for f in bad), bad


# ---- new users: a level that could not run, a typo, a partial audit -------------------------------------------------

def test_a_requested_level_that_cannot_run_is_incomplete_not_pass(tmp_path):
    out = tiny(tmp_path)
    proc = audit(out, "--tokens", "--report", tmp_path / "a.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RESULT: INCOMPLETE" in proc.stdout and "RESULT: PASS" not in proc.stdout, proc.stdout


def test_an_experiment_typo_is_a_usage_error(tmp_path):
    out = tiny(tmp_path)
    proc = audit(out, "--experiment", "harnes")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "harnes" in lines[0] and "Traceback" not in proc.stderr
    assert lines[0].split("known experiments: ")[1].startswith("harness"), lines
    assert not (out / "audit.json").exists()


def test_audit_with_no_arguments_says_what_to_give():
    proc = run_cli("audit.py")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "nothing to audit" in last and "python audit.py OUT" in last and "--lm-eval RUN_DIR" in last, last
    assert "not both" not in last, last


def test_table_md_needs_mutations(tmp_path):
    proc = run_cli("audit.py", tiny(tmp_path), "--table-md", tmp_path / "t.md")
    assert proc.returncode == 2 and "needs --mutations" in proc.stderr and not (tmp_path / "t.md").exists()


def test_a_partial_audit_never_overwrites_the_full_audit_json(tmp_path):
    out = tiny(tmp_path)
    assert audit(out).returncode == 0
    full = (out / "audit.json").read_bytes()
    proc = audit(out, "--experiment", "harness")
    assert proc.returncode == 0, proc.stdout
    assert (out / "audit.json").read_bytes() == full
    assert json.loads((out / "audit.harness.json").read_text())["levels"] == ["arithmetic"]
    proc = audit(out)       # a partial report is an audit output, not a file the run should have listed
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout


def test_a_lower_level_audit_keeps_a_deeper_audit_json_unless_it_fails(tmp_path):
    out = tiny(tmp_path)
    deeper = {"levels": ["arithmetic", "identity", "forward"], "result": "PASS", "checks": []}
    (out / "audit.json").write_text(json.dumps(deeper))
    proc = audit(out)
    assert proc.returncode == 0 and "kept" in proc.stdout, proc.stdout
    assert json.loads((out / "audit.json").read_text()) == deeper
    assert json.loads((out / "audit.arithmetic.json").read_text())["result"] == "PASS"
    _write(out / "run.log", "edited\n")        # not resealed: the manifest level fails
    proc = audit(out)
    assert proc.returncode == 1 and "replaced" in proc.stdout, proc.stdout
    assert json.loads((out / "audit.json").read_text())["result"] == "FAIL"


# ---- the real thing: the smoke run of all five experiments ---------------------------------------------------------

@pytest.mark.slow
def test_real_smoke_with_protocol_deleted_and_resealed_fails(smoke_run, tmp_path):
    out = tmp_path / "O"
    shutil.copytree(smoke_run[0], out)
    shutil.rmtree(out / "protocol")
    shutil.rmtree(out / "private/protocol")
    _edit(out / "MANIFEST.json", lambda m: m.update(experiments=[e for e in m["experiments"] if e != "protocol"]))
    (out / "report.html").unlink()
    assert run_cli("report.py", out).returncode == 0
    seal(out, "manifest")
    proc = audit(out, "--report", tmp_path / "a.json")
    assert proc.returncode == 1 and "RESULT: FAIL" in proc.stdout, proc.stdout
    assert "protocol/: the recorded command ran protocol" in proc.stdout


@pytest.mark.slow
def test_real_smoke_private_text_in_a_public_file_fails(smoke_run, tmp_path):
    out = tmp_path / "O"
    shutil.copytree(smoke_run[0], out)
    text = json.loads((out / "private/protocol/texts.jsonl").read_text().splitlines()[0])["sentence"]
    (out / "run.log").write_text((out / "run.log").read_text() + text + "\n")
    seal(out, "manifest")
    proc = audit(out, "--report", tmp_path / "a.json")
    assert proc.returncode == 1 and "run.log: holds a text of private/" in proc.stdout, \
        proc.stdout


def test_the_audits_copy_of_run_py_flags_is_run_py_s():
    """run_command.RUN_* is written again from run.py's parser (the audit never imports run.py): an added or changed
    flag there must be added here too, or a recorded command line using it would not parse."""
    import ast

    switches, valued = set(), set()
    for node in ast.walk(ast.parse((REPO / "run.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flag = node.args[0].value
            action = next((k.value.value for k in node.keywords if k.arg == "action"), None)
            nargs = next((k.value.value for k in node.keywords if k.arg == "nargs"), None)
            (switches if action == "store_true" else valued if nargs is None else set()).add(flag)
    assert switches == set(run_command.RUN_SWITCHES) - {"--help"}
    assert valued == set(run_command.RUN_VALUE_FLAGS)
