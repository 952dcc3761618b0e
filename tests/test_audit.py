"""audit.py on real evidence: a smoke run of run.py on the prepared cache (2 items, made once per session).

The session's evidence directory is never touched: every test audits its own copy (audit.py writes audit.json into
the directory it audits, and the tamper tests edit files). The real model runs once for the smoke evidence; the
forward level re-runs it on 2 items per call (seconds).
"""
import ast
import json
import shutil
import sys
from pathlib import Path

import pytest

import conftest
from conftest import run_cli

AUDIT = conftest.REPO / "audit.py"
FORBIDDEN = {"run", "experiments", "resources", "config", "adapter", "lm_eval"}
REQUIRED_KINDS = ["flip_label", "nudge_score", "drop_record", "duplicate_record", "swap_idx", "change_prediction",
                  "change_token_count", "edit_summary_accuracy", "alter_prompt_hash", "alter_private_sentence",
                  "delete_stages", "move_record_lines", "swap_score_lists"]
EXTRA_KINDS = ["lm_eval_item_acc", "lm_eval_reported_acc", "relabel_split", "change_salt", "both_prompt_hashes",
               "candidate_token_id", "doc_hash", "both_scores_shifted"]


@pytest.fixture(scope="session")
def smoke_evidence(prepared_cache, tmp_path_factory):
    """run.py --smoke on the prepared cache, once per session. Treat as read-only: copy before use.

    Only the protocol experiment: it is the one audit.py has rules for so far. Evidence of an experiment without a
    rule makes the audit fail by design (see test_experiment_without_a_rule_is_reported_not_ignored)."""
    out = tmp_path_factory.mktemp("audit-evidence") / "smoke"
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", out, "--smoke", "--experiment", "protocol")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture
def evidence(smoke_evidence, tmp_path):
    """A private copy of the smoke evidence for one test."""
    dst = tmp_path / "O"
    shutil.copytree(smoke_evidence, dst)
    return dst


def audit(*args):
    return run_cli(AUDIT, *map(str, args), timeout=900)


def report(out):
    return json.loads((Path(out) / "audit.json").read_text())


def checks(out, level=None):
    return [c for c in report(out)["checks"] if level is None or c["level"] == level]


def edit_json(path, fn):
    obj = json.loads(Path(path).read_text())
    fn(obj)
    Path(path).write_text(json.dumps(obj, indent=1, sort_keys=True))


def edit_records(out, fn):
    p = Path(out) / "protocol" / "records.jsonl"
    recs = [json.loads(line) for line in p.read_text().splitlines()]
    fn(recs)
    p.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))


# ---- independence ------------------------------------------------------------------------------------------------

def _imported_roots(tree):
    """Top-level module names audit.py imports, and every dynamic-import call it makes (name, first argument)."""
    roots, dynamic = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots += [(a.name.split(".")[0], node) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots.append(((node.module or "").split(".")[0] if node.level == 0 else ".", node))
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if fname in ("__import__", "import_module", "find_spec", "run_module", "run_path",
                         "spec_from_file_location", "exec", "eval"):
                arg = node.args[0] if node.args else None
                dynamic.append((fname, ast.unparse(arg) if arg is not None else ""))
    return roots, dynamic


def test_audit_imports_nothing_from_the_repository_or_lm_eval():
    tree = ast.parse(AUDIT.read_text())
    roots, dynamic = _imported_roots(tree)
    bad = [(r, n.lineno) for r, n in roots if r in FORBIDDEN or r == "."]
    assert not bad, f"audit.py imports repository/lm_eval modules: {bad}"
    # no dynamic imports at all: a string naming a forbidden module could hide in any of them
    assert not dynamic, f"audit.py makes dynamic imports: {dynamic}"


def test_default_level_imports_only_the_standard_library():
    tree = ast.parse(AUDIT.read_text())
    top = [a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for a in node.names]
    top += [node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert set(top) <= set(sys.stdlib_module_names), f"module-level non-stdlib imports: {set(top) - set(sys.stdlib_module_names)}"


BLOCKER = r"""
import importlib.abc, runpy, sys
BLOCK = {"run", "experiments", "resources", "config", "adapter", "lm_eval"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            print(f"BLOCKED IMPORT {name}", file=sys.stderr, flush=True)
            raise ImportError(f"audit.py must not import {name}")
        return None
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_audit_runs_with_repository_modules_unimportable(evidence):
    # --strict: a level skipped because an import failed inside it would exit 1 instead of passing quietly
    proc = run_cli("-c", BLOCKER, AUDIT, evidence, "--tokens", "--forward", "--strict", timeout=900)
    assert "BLOCKED IMPORT" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: PASS" in proc.stdout


# ---- levels on clean evidence -----------------------------------------------------------------------------------

def test_arithmetic_level_passes_on_clean_evidence(evidence):
    proc = audit(evidence)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    arith = checks(evidence, "arithmetic")
    assert len(arith) >= 10 and all(c["status"] == "PASS" for c in arith), arith
    names = " ".join(c["check"] for c in arith)
    for what in ("required files", "item selection", "predictions", "correctness", "agreement", "prompt hashes",
                 "summary.json", "stages.json"):
        assert what in names
    # deeper levels were not requested: SKIPPED, never PASS
    deeper = checks(evidence, "identity") + checks(evidence, "forward")
    assert deeper and all(c["status"] == "SKIPPED" and "not requested" in c["note"] for c in deeper)
    assert report(evidence)["exit_code"] == 0
    assert "RESULT: PASS" in proc.stdout and "item selection" in proc.stdout


def test_tokens_level_passes_on_clean_evidence(evidence):
    proc = audit(evidence, "--tokens", "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ident = checks(evidence, "identity")
    assert {c["check"].split(" (")[0] for c in ident} == {"private texts", "tokenisation", "data parquet"}
    assert all(c["status"] == "PASS" and c["items"] == 2 for c in ident), ident


def test_forward_level_passes_and_reports_its_max_abs_diff(evidence):
    proc = audit(evidence, "--forward", "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fwd = checks(evidence, "forward")
    assert fwd and all(c["status"] == "PASS" for c in fwd), fwd
    figures = report(evidence)["details"]["protocol"]["forward"]
    assert figures["max_abs_diff_official"] <= figures["tolerance"] <= 1e-4
    assert figures["max_abs_diff_independent"] <= figures["tolerance"]
    assert "max |recomputed - official|" in proc.stdout


def test_missing_private_file_skips_identity_checks_and_names_it(evidence):
    shutil.rmtree(evidence / "private")
    proc = audit(evidence, "--tokens")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_name = {c["check"].split(" (")[0]: c for c in checks(evidence, "identity")}
    assert by_name["private texts"]["status"] == "SKIPPED"
    assert "texts.jsonl" in by_name["private texts"]["note"]
    assert by_name["tokenisation"]["status"] == "SKIPPED"
    assert "SKIPPED" in proc.stdout and "texts.jsonl" in proc.stdout
    # the data check needs no private file and still runs
    assert by_name["data parquet"]["status"] == "PASS"
    assert audit(evidence, "--tokens", "--strict").returncode == 1


# ---- mutation self-test ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mutation_run(smoke_evidence, tmp_path_factory):
    out = tmp_path_factory.mktemp("mutations") / "O"
    shutil.copytree(smoke_evidence, out)
    proc = audit(out, "--mutations")
    return proc, json.loads((out / "audit.mutations.json").read_text())


def test_mutation_selftest_passes_and_clean_copy_passes(mutation_run):
    proc, rep = mutation_run
    assert rep["clean"]["passed"], rep["clean"]
    assert rep["levels"] == ["arithmetic", "identity", "forward"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "audit levels used for every copy: arithmetic, identity, forward" in proc.stdout


@pytest.mark.parametrize("kind", REQUIRED_KINDS + EXTRA_KINDS)
def test_each_mutation_is_caught_by_its_check(mutation_run, kind):
    _, rep = mutation_run
    row = next(r for r in rep["mutations"] if r["kind"] == kind)
    assert row["caught"], row
    assert row["by_expected_check"], row      # caught for the right reason, not by an incidental failure
    msg = row["first_failure"]
    if kind in ("delete_stages", "edit_summary_accuracy", "lm_eval_reported_acc"):
        assert ".json" in msg.split("] ", 1)[1].split(":")[0], msg    # names the file (and then the field)
    else:
        assert msg.split("] ", 1)[1].startswith("idx "), msg    # names the record ...
        assert any(f in msg for f in ("idx:", "correct", "abs_diff", "pred", "start", "prompt_hash", "sha256",
                                      "scores", "acc", "token_ids", "doc_hash")), msg   # ... and the field


# ---- hand tampers beyond the mutation list -----------------------------------------------------------------------

def _flip_correct(recs):
    recs[0]["independent"]["correct"] = 1 - recs[0]["independent"]["correct"]


TAMPERS = {
    "independent.correct": lambda O: edit_records(O, _flip_correct),
    "constant_class_baseline.label": lambda O: edit_json(O / "protocol/summary.json", lambda s: s[
        "constant_class_baseline"].update(label=1 - s["constant_class_baseline"]["label"])),
    "constant_class_baseline.accuracy": lambda O: edit_json(O / "protocol/summary.json", lambda s: s[
        "constant_class_baseline"].update(accuracy=0.125)),
    "n_rows": lambda O: edit_json(O / "protocol/config.json", lambda c: c.update(n_rows=150)),
    "agreement.n_prediction_mismatches": lambda O: edit_json(O / "protocol/summary.json", lambda s: s[
        "agreement"].update(n_prediction_mismatches=1)),
    "tokens.input_tokens_per_candidate.total": lambda O: edit_json(O / "protocol/stages.json", lambda s: s[
        "tokens"]["input_tokens_per_candidate"].update(total=s["tokens"]["input_tokens_per_candidate"]["total"] + 1)),
    "scoring_config_sha256": lambda O: edit_json(O / "protocol/identity.json", lambda i: i.update(
        scoring_config_sha256="0" * 64)),
    "confirmation_items_scored": lambda O: edit_json(O / "protocol/config.json", lambda c: c.update(
        confirmation_items_scored=True)),
    "new_claim": lambda O: edit_json(O / "protocol/summary.json", lambda s: s.update(new_claim=0.99)),
}


@pytest.mark.parametrize("field", list(TAMPERS))
def test_hand_tamper_exits_1_naming_the_field(evidence, field):
    TAMPERS[field](evidence)
    proc = audit(evidence)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [c for c in checks(evidence) if c["status"] == "FAIL"]
    assert failed and any(field in f for c in failed for f in c["failures"]), failed
    assert "RESULT: FAIL" in proc.stdout


def test_n_rows_that_keeps_the_selection_is_caught_by_the_data_check(evidence):
    # one more row does not change which idx rank first here, so only the data parquet can tell
    edit_json(evidence / "protocol/config.json", lambda c: c.update(n_rows=c["n_rows"] + 1))
    assert audit(evidence).returncode == 0     # a documented limit of the arithmetic level
    proc = audit(evidence, "--tokens")
    assert proc.returncode == 1 and "config.json n_rows" in proc.stdout, proc.stdout


def test_tie_rule_and_majority_tie_recomputed(evidence):
    """Equal scores predict the first candidate; equal label counts make the lower label the constant class."""
    recs = [json.loads(line) for line in (evidence / "protocol/records.jsonl").read_text().splitlines()]
    r0 = recs[0]
    tie = r0["independent"]["scores"][1]
    for side in ("official", "independent"):
        r0[side]["scores"] = [tie, tie]
        r0[side]["pred"] = 0
    r0["abs_diff"] = [0.0, 0.0]
    r0["label"] = 0                              # labels are now [0, 1]: a tie for the constant class
    r0["independent"]["correct"], r0["official"]["acc"] = 1, 1.0
    (evidence / "protocol/records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    n_right = 1 + int(recs[1]["independent"]["pred"] == recs[1]["label"])

    def fix_summary(s):
        s["label_counts"] = {"0": 1, "1": 1}
        s["constant_class_baseline"] = {"label": 0, "accuracy": 0.5}
        for side in ("official", "independent"):
            preds = [0, recs[1][side]["pred"]]
            s[side].update(correct=n_right, accuracy=n_right / 2,
                           pred_counts={"0": preds.count(0), "1": preds.count(1)})
        s["official"]["lm_eval_reported_acc"] = n_right / 2
    edit_json(evidence / "protocol/summary.json", fix_summary)
    edit_json(evidence / "protocol/config.json", lambda c: c["official"].update(reported_acc=n_right / 2))
    proc = audit(evidence)
    assert proc.returncode == 0, proc.stdout
    # and the other way round: claiming the upper label for the tie is caught
    edit_json(evidence / "protocol/summary.json", lambda s: s["constant_class_baseline"].update(label=1))
    assert audit(evidence).returncode == 1


def test_experiment_without_a_rule_is_reported_not_ignored(evidence):
    (evidence / "newstudy").mkdir()
    (evidence / "newstudy" / "summary.json").write_text("{}")
    proc = audit(evidence)
    assert proc.returncode == 1
    assert "newstudy" in proc.stdout and "no audit rule" in proc.stdout


# ---- unreadable evidence -----------------------------------------------------------------------------------------

def test_missing_evidence_directory_exits_2(tmp_path):
    proc = audit(tmp_path / "nothing-here")
    assert proc.returncode == 2 and "nothing-here" in proc.stderr


def test_unparseable_json_exits_2_naming_file_and_line(evidence):
    (evidence / "protocol" / "summary.json").write_text('{\n "a": 1,\n')
    proc = audit(evidence)
    assert proc.returncode == 2
    assert "summary.json" in proc.stderr and "line" in proc.stderr


def test_unparseable_record_line_exits_2_naming_the_line(evidence):
    p = evidence / "protocol" / "records.jsonl"
    lines = p.read_text().splitlines()
    lines[1] = lines[1][:40]
    p.write_text("\n".join(lines) + "\n")
    proc = audit(evidence)
    assert proc.returncode == 2
    assert "records.jsonl: line 2" in proc.stderr
