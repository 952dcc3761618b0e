"""audit.py and its package evidence_audit/: independence (fast), unit tests of the shared definitions (fast), and
the audit on real evidence (slow: a smoke run of run.py on the prepared cache, 2 items, made once per session).

The session's evidence directory is never touched: every slow test audits its own copy (audit.py writes audit.json
into the directory it audits, and the tamper tests edit files). The real model runs once for the smoke evidence; the
forward level re-runs it on 2 items per call (seconds).
"""
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
from conftest import run_cli
from evidence_audit import sampling

AUDIT = conftest.REPO / "audit.py"
PACKAGE = conftest.REPO / "evidence_audit"
AUDIT_SOURCES = [AUDIT] + sorted(PACKAGE.rglob("*.py"))
# the runner, the harness, the report, the benchmark and every module they stand on, and lm_eval
FORBIDDEN = {"run", "experiments", "harness", "report", "evidence_report", "bench", "prepare", "resources", "config",
             "adapter", "lm_eval"}
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


def forge(out):
    """What a careful forger does after editing evidence: rebuild report.html from it (report.py) and rewrite
    MANIFEST.json to match, so that only the arithmetic and deeper levels can catch the edit."""
    proc = run_cli("report.py", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest_level.reseal(out)


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


def test_audit_package_is_scanned_whole():
    names = {p.relative_to(conftest.REPO).as_posix() for p in AUDIT_SOURCES}
    assert {"audit.py", "evidence_audit/cli.py", "evidence_audit/rules/protocol.py"} <= names
    assert len(AUDIT.read_text().splitlines()) < 100


# The one import of the repository the audit makes beside registry.py: the code sandbox, to run a task's own code
# (lmeval/task_code.py), function-locally. It is confinement, not a definition the audit checks (the audit's harness
# rule reads the recorded sandbox outputs and runs no code), and a second copy of its namespaces, Landlock, seccomp
# and rlimits would be a second thing to get right; test_the_sandbox_the_audit_imports_is_a_leaf keeps it a leaf.
SANDBOX_IMPORT = (PACKAGE / "lmeval" / "task_code.py", "harness.sandbox")
# The child side of the task code sandbox is never imported (task_code.py sends its text); it executes the task's
# file, which is what it is for (test_the_task_code_child_is_never_imported).
CHILD = PACKAGE / "lmeval" / "task_code_child.py"


def _forbidden_imports(path, roots):
    """The imports of FORBIDDEN roots (and relative ones) of one file, but SANDBOX_IMPORT's in its file."""
    out = []
    for r, n in roots:
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else [f"{n.module}.{a.name}" for a in n.names]
        if (path, tuple(names)) == (SANDBOX_IMPORT[0], (SANDBOX_IMPORT[1],)):
            continue
        if r in FORBIDDEN or r == ".":
            out.append((r, n.lineno))
    return out


@pytest.mark.parametrize("path", AUDIT_SOURCES, ids=lambda p: p.relative_to(conftest.REPO).as_posix())
def test_audit_imports_nothing_from_the_repository_or_lm_eval(path):
    roots, dynamic = _imported_roots(ast.parse(path.read_text()))
    # absolute imports only, so that every import names its root: "." could hide anything
    bad = _forbidden_imports(path, roots)
    assert not bad, f"{path.name} imports repository/lm_eval modules: {bad}"
    # no dynamic imports but two: a string naming a forbidden module could hide in any of them. The exceptions are
    # the loader of the rules registry.py names, which refuses any module outside evidence_audit.rules
    # (test_rules_are_loaded_from_the_audit_package_only), and the task code child's exec of a task's file
    allowed = [("import_module", "module")] if path == PACKAGE / "rules" / "__init__.py" else \
        [("exec", "compile(spec['text'], spec['path'], 'exec')")] if path == CHILD else []
    assert dynamic == allowed, f"{path.name} makes dynamic imports: {dynamic}"


def test_the_sandbox_import_is_the_one_exception_and_function_local():
    """harness.sandbox is imported once, in task_code.py, inside a function: loading the audit (any level, either
    front-end) loads no module of harness/."""
    found = []
    for p in AUDIT_SOURCES:
        tree = ast.parse(p.read_text())
        top = {id(n) for n in tree.body}
        for n in ast.walk(tree):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                [n.module or ""] if isinstance(n, ast.ImportFrom) else []
            if any(m.split(".")[0] == "harness" for m in names):
                found.append((p.relative_to(conftest.REPO).as_posix(), ast.unparse(n), id(n) in top))
    assert found == [("evidence_audit/lmeval/task_code.py", "from harness import sandbox", False)], found


def test_the_sandbox_the_audit_imports_is_a_leaf():
    """harness/sandbox.py and what it imports (proctree.py, strict_json.py; jail.py runs as a script) import nothing
    but the standard library and each other, and harness/__init__.py imports nothing: importing the sandbox loads
    none of the runner, the harness's scoring or lm_eval."""
    leaf = {"sandbox", "proctree", "strict_json"}
    for name in (*leaf, "jail"):
        tree = ast.parse((conftest.REPO / "harness" / f"{name}.py").read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                mods = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                mods = [f"{n.module}.{a.name}" if n.module == "harness" else n.module for a in n.names]
            else:
                continue
            for m in mods:
                assert m.split(".")[0] in sys.stdlib_module_names or (m.startswith("harness.") and
                                                                      m.split(".")[1] in leaf), (name, m)
    init = ast.parse((conftest.REPO / "harness" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_the_task_code_child_is_never_imported():
    """task_code_child.py runs only inside the sandbox (task_code.py reads its text): no module of the audit imports
    it, and it imports nothing of the repository."""
    names = [ast.unparse(n) for p in AUDIT_SOURCES for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in names if "task_code_child" in n], names
    roots, _ = _imported_roots(ast.parse(CHILD.read_text()))
    assert not [r for r, _ in roots if r in FORBIDDEN | {"evidence_audit", "registry", "."}]


def test_rules_are_loaded_from_the_audit_package_only():
    """registry.py names each rule as a string; the audit imports it only from evidence_audit.rules."""
    from evidence_audit.rules import RULES, load_rule
    import registry

    assert list(RULES) == list(registry.NAMES)
    assert load_rule("evidence_audit.rules.protocol:audit_protocol") is RULES["protocol"]
    for name in ("experiments.protocol:run", "run:main", "evidence_audit.rules.x.y:f", "evidence_audit.rules.:f",
                 "evidence_audit.rules.protocol", "evidence_audit.rulesx.protocol:audit_protocol"):
        with pytest.raises(ValueError):
            load_rule(name)


def test_run_wide_options_travel_on_the_checks_not_in_module_globals():
    """--threads and --review reach the rules as C.options (checks.AuditOptions): no module of the audit rebinds a
    global, and none sets another module's attribute, so two audits in one process cannot leak into each other."""
    for path in AUDIT_SOURCES:
        tree = ast.parse(path.read_text())
        rebinds = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Global)]
        module_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                        for a in n.names}
        sets = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in module_names]
        assert not rebinds and not sets, f"{path.name}: global {rebinds}, another module's attribute set {sets}"
    default = audit_checks.Checks().options
    assert (default.threads, default.review_sheet) == (1, None)


@pytest.mark.parametrize("path", AUDIT_SOURCES, ids=lambda p: p.relative_to(conftest.REPO).as_posix())
def test_default_level_imports_only_the_standard_library(path):
    """Module-level imports are the standard library or the package itself; torch, tokenizers, safetensors,
    pyarrow and jinja2 are imported inside the deeper levels only."""
    tree = ast.parse(path.read_text())
    top = [a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for a in node.names]
    top += [node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)]
    # registry.py: plain data importing only the standard library (tests/test_registry.py)
    extra = set(top) - set(sys.stdlib_module_names) - {"evidence_audit", "registry"}
    assert not extra, f"{path.name}: module-level non-stdlib imports: {extra}"


BLOCKER = r"""
import importlib.abc, runpy, sys
BLOCK = {"run", "experiments", "harness", "report", "evidence_report", "bench", "prepare", "resources", "config",
         "adapter", "lm_eval"}
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


@pytest.mark.slow
def test_audit_runs_with_repository_modules_unimportable(evidence):
    # --strict: a level skipped because an import failed inside it would exit 1 instead of passing quietly
    proc = run_cli("-c", BLOCKER, AUDIT, evidence, "--tokens", "--forward", "--strict", timeout=900)
    assert "BLOCKED IMPORT" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: PASS" in proc.stdout


# ---- levels on clean evidence -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_evidence_is_sealed_and_public_only_passes_without_private(evidence):
    """run.py's MANIFEST.json, run ids and report.html pass the manifest level and the page check as written; the
    same evidence without O/private/ is INCOMPLETE, or PASS (public evidence only) with --public-only."""
    proc = audit(evidence)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [c for c in checks(evidence) if c["experiment"] == "-"]
    assert [c["level"] for c in rows[:6]] == ["manifest"] * 6 and all(c["status"] == "PASS" for c in rows), rows
    page = next(c for c in rows if c["check"].startswith("report.html"))
    assert page["items"] > 10, page                  # the page's number cells are all checked
    shutil.rmtree(evidence / "private")
    assert audit(evidence).returncode == 1
    proc = audit(evidence, "--public-only")
    assert proc.returncode == 0 and "PASS (public evidence only" in proc.stdout, proc.stdout

@pytest.mark.slow
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


@pytest.mark.slow
def test_tokens_level_passes_on_clean_evidence(evidence):
    proc = audit(evidence, "--tokens", "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ident = [c for c in checks(evidence, "identity") if c["experiment"] != "-"]     # "-": the page rebuilt
    assert {c["check"].split(" (")[0] for c in ident} == {"private texts", "tokenisation", "data parquet"}
    assert all(c["status"] == "PASS" and c["items"] == 2 for c in ident), ident


@pytest.mark.slow
def test_forward_level_passes_and_reports_its_max_abs_diff(evidence):
    proc = audit(evidence, "--forward", "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fwd = checks(evidence, "forward")
    assert fwd and all(c["status"] == "PASS" for c in fwd), fwd
    figures = report(evidence)["details"]["protocol"]["forward"]
    assert figures["max_abs_diff_official"] <= figures["tolerance"] <= 1e-4
    assert figures["max_abs_diff_independent"] <= figures["tolerance"]
    assert "|recomputed - official| max" in proc.stdout


@pytest.mark.slow
def test_missing_private_file_skips_identity_checks_and_names_it(evidence, prepared_cache):
    shutil.rmtree(evidence / "private")
    # without O/private/ nothing names the cache (O/private/<exp>/paths.json did): the reader passes it
    proc = audit(evidence, "--tokens", "--cache", prepared_cache)
    # the manifest lists private evidence: never a bare PASS without it (--public-only cannot run --tokens)
    assert proc.returncode == 1 and "RESULT: INCOMPLETE: O/private/ absent" in proc.stdout, proc.stdout
    by_name = {c["check"].split(" (")[0]: c for c in checks(evidence, "identity")}
    assert by_name["private texts"]["status"] == "SKIPPED"
    assert "texts.jsonl" in by_name["private texts"]["note"]
    assert by_name["tokenisation"]["status"] == "SKIPPED"
    assert "SKIPPED" in proc.stdout and "texts.jsonl" in proc.stdout
    # the data check needs no private file and still runs
    assert by_name["data parquet"]["status"] == "PASS"
    assert audit(evidence, "--tokens", "--strict", "--cache", prepared_cache).returncode == 1


# ---- mutation self-test ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mutation_run(smoke_evidence, tmp_path_factory):
    out = tmp_path_factory.mktemp("mutations") / "O"
    shutil.copytree(smoke_evidence, out)
    proc = audit(out, "--mutations")
    return proc, json.loads((out / "audit.mutations.json").read_text())


@pytest.mark.slow
def test_mutation_selftest_passes_and_clean_copy_passes(mutation_run):
    proc, rep = mutation_run
    assert rep["clean"]["passed"], rep["clean"]
    assert rep["levels"] == ["arithmetic", "identity", "forward"]
    # protocol-only evidence: the other experiments' kinds are SKIPPED (tests/test_mutations.py runs them all);
    # every kind that applies must be caught by its named check
    tried = [m for m in rep["mutations"] if m["status"] != "SKIPPED"]
    assert len(tried) >= 30 and all(m["status"] == "CAUGHT" for m in tried), \
        [(m["kind"], m["status"], m["first_failure"]) for m in tried if m["status"] != "CAUGHT"]
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "audit levels that can run here: arithmetic, identity, forward" in proc.stdout


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("field", list(TAMPERS))
def test_hand_tamper_exits_1_naming_the_field(evidence, field):
    TAMPERS[field](evidence)
    proc = audit(evidence)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [c for c in checks(evidence) if c["status"] == "FAIL"]
    assert failed and any(field in f for c in failed for f in c["failures"]), failed
    assert "RESULT: FAIL" in proc.stdout


@pytest.mark.slow
def test_n_rows_that_keeps_the_selection_is_caught_by_the_data_check(evidence):
    # one more row does not change which idx rank first here, so only the data parquet can tell
    edit_json(evidence / "protocol/config.json", lambda c: c.update(n_rows=c["n_rows"] + 1))
    forge(evidence)                            # the forger rebuilds the page and rewrites the manifest too
    assert audit(evidence).returncode == 0     # a documented limit of the arithmetic level
    proc = audit(evidence, "--tokens")
    assert proc.returncode == 1 and "config.json n_rows" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_tie_rule_and_majority_tie_recomputed(evidence):
    """Equal scores predict the first candidate; equal label counts make the lower label the constant class."""
    from experiments.protocol import uncertainty as protocol_uncertainty

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
        s["uncertainty"] = protocol_uncertainty(recs, 0)    # the intervals of the forged counts (experiments.stats)
    edit_json(evidence / "protocol/summary.json", fix_summary)
    edit_json(evidence / "protocol/config.json", lambda c: c["official"].update(reported_acc=n_right / 2))
    forge(evidence)
    proc = audit(evidence)
    assert proc.returncode == 0, proc.stdout
    # and the other way round: claiming the upper label for the tie is caught
    edit_json(evidence / "protocol/summary.json", lambda s: s["constant_class_baseline"].update(label=1))
    forge(evidence)
    assert audit(evidence).returncode == 1


@pytest.mark.slow
def test_experiment_without_a_rule_is_reported_not_ignored(evidence):
    (evidence / "newstudy").mkdir()
    fmt = json.loads((evidence / "MANIFEST.json").read_text())["evidence_format"]     # the run's own format
    (evidence / "newstudy" / "summary.json").write_text(json.dumps({"evidence_format": fmt}))
    manifest_level.reseal(evidence)
    proc = audit(evidence)
    assert proc.returncode == 1
    assert "newstudy" in proc.stdout and "no audit rule" in proc.stdout


# ---- unreadable evidence -----------------------------------------------------------------------------------------

def test_missing_evidence_directory_exits_2(tmp_path):
    proc = audit(tmp_path / "nothing-here")
    assert proc.returncode == 2 and "nothing-here" in proc.stderr


@pytest.mark.slow
def test_unparseable_json_exits_2_naming_file_and_line(evidence):
    (evidence / "protocol" / "summary.json").write_text('{\n "a": 1,\n')
    proc = audit(evidence)
    assert proc.returncode == 2
    assert "summary.json" in proc.stderr and "line" in proc.stderr


@pytest.mark.slow
def test_unparseable_record_line_exits_2_naming_the_line(evidence):
    p = evidence / "protocol" / "records.jsonl"
    lines = p.read_text().splitlines()
    lines[1] = lines[1][:40]
    p.write_text("\n".join(lines) + "\n")
    proc = audit(evidence)
    assert proc.returncode == 2
    assert "records.jsonl: line 2" in proc.stderr


# ---- unit tests of the package (fast: no model, no run.py) --------------------------------------------------------

import io  # noqa: E402

from evidence_audit import checks as audit_checks  # noqa: E402
from evidence_audit import definitions, driver, reading, shared  # noqa: E402
from evidence_audit.rules import harness as harness_rule  # noqa: E402


@pytest.mark.parametrize("prediction, reference", [
    ("The cat sat on the mat.", "the cat sat on the mat"),
    ("the cat was found under the bed", "the cat was under the bed"),
    ("Hello, world! It's 2024-01-02.", "hello world its 2024 01 02"),
    ("café au lait", "cafe au lait"),
    ("x", "y z"),
    ("...", "something"),
    ("", "anything"),
    ("police killed the gunman", "the gunman killed police"),
])
def test_rouge_l_is_rouge_scores_definition(prediction, reference):
    from rouge_score import rouge_scorer
    want = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False).score(reference, prediction)["rougeL"].fmeasure
    assert harness_rule.h_rouge_l(prediction, reference) == pytest.approx(want, abs=1e-12)


def test_rouge_l_ignores_case_and_punctuation():
    assert harness_rule.h_rouge_l("The cat sat on the mat.", "the cat sat on the mat") == 1.0


def _report(names, status="PASS"):
    rows = [{"experiment": "protocol", "level": "arithmetic", "check": n, "items": 2, "status": status,
             "n_failures": 0, "first_failure": None, "failures": [], "note": ""} for n in names]
    return {"evidence": "O", "levels": ["arithmetic"], "checks": rows, "n_pass": len(rows), "n_fail": 0,
            "n_skipped": 0, "n_skipped_requested": 0, "exit_code": 0}


def test_report_table_wraps_long_check_names_in_their_column():
    long_name = "config consistency (conditions, pi, comparisons, tie rule, selection, official task, identity)"
    out = io.StringIO()
    audit_checks.print_report(_report(["required files", long_name, "x"]), out)
    lines = out.getvalue().splitlines()
    short_line, long_line, rest, after = lines[2], lines[3], lines[4], lines[5]
    assert "…" not in out.getvalue() and "required files" in short_line
    assert short_line.index("PASS") == long_line.index("PASS")      # the columns stay aligned
    column = short_line.index("required files")
    assert rest[:column].strip() == "" and " ".join([long_line[column:long_line.index(" 2  PASS")].strip(),
                                                     rest[column:].strip()]) == long_name
    assert after[column:].startswith("x ")


def test_short_marks_every_cut_with_an_ellipsis():
    assert audit_checks.short("abc") == "'abc'"
    s = audit_checks.short("x" * 200, 20)
    assert len(s) == 20 and s.endswith("…")


def test_read_jsonl_is_strict_and_keeps_unicode_line_separators(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": "x\u2028y"}\n{"b": 2}\n', encoding="utf-8")
    assert reading.read_jsonl(p) == [{"a": "x\u2028y"}, {"b": 2}]
    p.write_text('{"a": 1}\n{"b": \n', encoding="utf-8")
    with pytest.raises(reading.Unreadable, match="r.jsonl: line 2"):
        reading.read_jsonl(p)
    p.write_bytes(b'{"a": "\xff"}\n')
    with pytest.raises(reading.Unreadable, match="not UTF-8"):
        reading.read_jsonl(p)


def test_selection_rule_and_rank_order():
    want, why = definitions.select_items("smoke", "salt", 50, 10, 20, 3)
    dev, _ = definitions.select_items("dev", "salt", 50, 10, 20, 3)
    confirm, _ = definitions.select_items("confirm", "salt", 50, 10, 20, 3)
    assert why is None and want == dev[:3] and not set(dev) & set(confirm) and len(confirm) == 20
    assert definitions.select_items("confirm", "salt", 25, 10, 20, 3)[0] is None
    assert shared.rank_order_problems(want, want, "s") == []
    swapped = [want[1], want[0], want[2]]
    assert any("at rank 0" in p for p in shared.rank_order_problems(swapped, want, "s"))
    assert any("appears 2 times" in p for p in shared.rank_order_problems(want + want[:1], want, "s"))


def test_mcnemar_exact():
    assert definitions.mcnemar_exact(0, 0) == 1.0
    assert definitions.mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert definitions.mcnemar_exact(3, 3) == 1.0
    assert definitions.mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)


def _stages(*rows, total=10.0):
    return {"stages": [{"name": n, "wall_s": w, "peak_rss_bytes_at_end": rss} for n, w, rss in rows],
            "threads": 1, "total_wall_s": total}


def test_stage_times_accept_old_and_new_evidence():
    old = _stages(("imports", 4.0, None), ("load", 2.0, 100), ("score", 3.0, 200), total=9.5)   # process time so far
    new_first = _stages(("imports", 4.0, None), ("load", 2.0, 100), ("score", 3.0, 200), total=5.0)
    new_later = _stages(("load", 2.0, 100), ("score", 3.0, 200), total=5.005)    # rounding slack
    for st in (old, new_first, new_later):
        assert shared.stage_time_problems(st) == [], st


@pytest.mark.parametrize("stages, needle", [
    (_stages(("load", 2.0, 100), ("score", 3.0, 200), total=4.9), "add up to 5.0000 s"),
    (_stages(("load", 2.0, 100), ("imports", 1.0, None), total=9.0), "'imports' row can only come first"),
    (_stages(("load", -1.0, 100), total=9.0), "malformed stage"),
    (_stages(("load", 1.0, 200), ("score", 1.0, 100), total=9.0), "non-decreasing"),
    (_stages(("load", 1.0, 100), total=None), "total_wall_s"),
    ({"stages": [], "total_wall_s": 1.0}, "missing or empty"),
])
def test_stage_times_name_what_is_wrong(stages, needle):
    problems = shared.stage_time_problems(stages)
    assert problems and any(needle in p for p in problems), problems


def _identity(conf, **extra):
    sha = reading.sha256_text(json.dumps(conf, sort_keys=True))
    return {"scoring_config": conf, "scoring_config_sha256": sha, "model_sha256": "m", "tokenizer_sha256": "t",
            "data_content_sha256": "d", "official_config_sha256": reading.sha256_text(json.dumps(None)),
            "prompt_template_sha256": "p", "git_commit": "c", "git_dirty": False, "code_sha256": "h",
            "versions": {"torch": "1"}, **extra}


CFG = {"experiment": "harness", "config": {"model": "m1", "threads": 1},
       "model": {"id": "m1", "model_sha256": "m", "tokenizer_sha256": "t"}, "data_content_sha256": "d"}


@pytest.mark.parametrize("sections, ok", [(None, True), (["shared", "harness"], True),
                                          (["harness"], False), (["shared", "protocol"], False),
                                          (["shared", "harness", "harness"], False), ("shared", False)])
def test_identity_accepts_config_sections_of_this_experiment(sections, ok):
    ident = _identity(CFG["config"]) if sections is None else _identity(CFG["config"], config_sections=sections)
    bad = []
    shared.identity_problems(bad, "harness", CFG, ident, prompt_template_sha256="p")
    assert (bad == []) == ok, bad


def test_identity_fails_a_field_with_no_rule_and_a_changed_config():
    bad = []
    shared.identity_problems(bad, "harness", CFG, _identity({"model": "m1", "threads": 2}, extra_claim=1))
    assert any("extra_claim: a field audit.py has no rule for" in p for p in bad), bad
    assert any("scoring_config:" in p for p in bad), bad


def kernels(threads):
    """environment.json's "kernels" block as run.py writes it (experiments/evidence.py kernel_identity)."""
    return {"env": {k: None for k in shared.KERNEL_ENV}, "torch_cpu_capability": "AVX512", "torch_threads": threads,
            "parallel_info": f"ATen/Parallel:\n\tat::get_num_threads() : {threads}\n",
            "float32_matmul_precision": "highest", "mkl": "MKL 2024.2", "onednn": "oneDNN v3.12.0"}


def test_environment_check_compares_the_code_facts_with_identity():
    env = {"git_commit": "c", "git_dirty": False, "code_sha256": "h", "versions": {"torch": "1"}, "torch_threads": 2,
           "kernels": kernels(2)}
    C = audit_checks.Checks()
    shared.environment_check(C, "x", {"environment": env, "identity": _identity({})})
    shared.environment_check(C, "x", {"environment": dict(env, code_sha256="other"), "identity": _identity({})})
    shared.environment_check(C, "x", {"environment": None, "identity": _identity({})})
    for edit in (lambda k: k.update(torch_threads=3), lambda k: k["env"].pop("MKL_CBWR"),
                 lambda k: k["env"].update(MKL_ENABLE_INSTRUCTIONS=7), lambda k: k.update(parallel_info="x")):
        bad = kernels(2)
        edit(bad)
        shared.environment_check(C, "x", {"environment": dict(env, kernels=bad), "identity": _identity({})})
    assert [r["status"] for r in C.rows] == ["PASS", "FAIL", "SKIPPED"] + ["FAIL"] * 4
    assert "identity.json code_sha256" in C.rows[1]["first_failure"]
    assert all("environment.json kernels" in r["first_failure"] for r in C.rows[3:])


def test_record_shape_names_record_and_field():
    shape = shared.RecordShape(fields={"idx": definitions.is_int, "candidates": lambda v: isinstance(v, list),
                                       "official": lambda v: isinstance(v, dict)},
                               nested={"official": {"scores": None, "pred": definitions.is_int}},
                               candidates=shared.CANDIDATE_FIELDS, per_candidate_numbers=("official.scores",))
    good = {"idx": 1, "candidates": [{"text": " a", "start": 3, "token_ids": [5]}],
            "official": {"scores": [-1.0], "pred": 0}}
    assert shared.record_problems(good, "idx 1", shape, 1) == []
    bad = dict(good, extra=1, official={"scores": [-1.0, 2.0], "pred": "0"})
    problems = shared.record_problems(bad, "idx 1", shape, 1)
    assert "idx 1 extra: a field audit.py has no rule for" in problems
    assert any(p.startswith("idx 1 official.pred: wrong type") for p in problems), problems
    problems = shared.record_problems(dict(good, official={"scores": [-1.0, 2.0], "pred": 0}), "idx 1", shape, 1)
    assert any(p.startswith("idx 1 official.scores: expected 1 numbers") for p in problems), problems


# -- the harness rule on a tiny synthetic evidence directory: every shared group runs for it too --

def _write(path, obj):
    """A JSON object is written as run.py writes an evidence file: stamped with the evidence format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(obj, dict):
        obj = {**obj, "evidence_format": 2}
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) if not isinstance(obj, str) else obj)


def tiny_harness_evidence(out):
    """One exact_match task with two examples, scored right and wrong, as run.py --experiment harness writes it."""
    task_text = "".join(json.dumps({"id": i, "prompt": f"Q{i}", "targets": [t], "metric": "exact_match"}) + "\n"
                        for i, t in (("a", "4"), ("b", "5")))
    task_sha = reading.sha256_text(task_text)
    conf = {"model": "m1", "threads": 1, "harness_smoke_examples": 2}
    cfg = {"experiment": "harness", "split": "smoke", "config": conf, "settings": {"max_new_tokens": 8},
           "model": {"id": "m1", "model_sha256": "m", "tokenizer_sha256": "t"}, "prompt_rule": "chat",
           "chat_template_sha256": "0" * 64,
           "tasks": {"arith": {"sha256": task_sha, "metric": "exact_match", "n_in_file": 2, "n_scored": 2,
                               "ids": ["a", "b"]}}}
    preds = {"a": "4", "b": "6"}
    records = [{"task": "arith", "id": i, "prompt_sha256": reading.sha256_text(f"Q{i}"),
                "prediction_sha256": reading.sha256_text(preds[i]), "score": float(i == "a"), "timed_out": False,
                "latency_s": 0.5} for i in ("a", "b")]
    task = {"score": 0.5, "correct": 1, "total": 2, "timeouts": 0, "latency_s": 1.0, "latency_s_mean": 0.5,
            "metric": "exact_match", "sha256": task_sha, "n_examples_in_file": 2}
    board = {"schema": harness_rule.H_SCHEMA, "tasks": {"arith": task}, "overall": 0.5, "settings": cfg["settings"]}
    summary = {"split": "smoke", "n_examples": 2, "leaderboard": board, "tasks_are_shipped_fixtures": {"arith": False}}
    env = {"git_commit": "c", "git_dirty": False, "code_sha256": "h", "versions": {"torch": "1"}, "run_id": RUN_ID,
           "torch_threads": 1, "kernels": kernels(1),
           "command_line": ["run.py", "--cache", "c", "--out", "O", "--experiment", "harness"]}
    ident = dict(_identity(conf), config_sections=["shared", "harness"], run_id=RUN_ID)
    stages = _stages(("load_model", 1.0, 100), ("generate_and_score", 2.0, 200), total=3.5)
    stages["threads"], stages["tokens"] = 1, {"calls": 2, "prompt": 10, "generated": 2}
    for rel, obj in (("environment.json", env), ("harness/config.json", cfg), ("harness/identity.json", ident),
                     ("harness/summary.json", summary), ("harness/stages.json", stages)):
        _write(out / rel, obj)
    _write(out / "harness/records.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    private_board = dict(board, per_example=[{"task": "arith", "id": i, "prediction": preds[i],
                                              "score": float(i == "a")} for i in ("a", "b")])
    _write(out / "private/harness/leaderboard.json", private_board)
    _write(out / "private/harness/tasks/arith.jsonl", task_text)
    _write(out / "private/harness/run.json", {"experiment": "harness", "run_id": RUN_ID})
    _write(out / "run.log", "library chatter\n")
    from evidence_report import page        # every audit rebuilds the page from the evidence: report.py's own
    page.write(out)
    return seal(out)


RUN_ID = "0123456789abcdef0123456789abcdef"
TINY_REPORT = (f'<!doctype html><html><head><meta name="evidence-run-id" content="{RUN_ID}"></head><body><table>'
               '<tr><td class="num" data-src="harness/summary.json#leaderboard.overall" data-value="0.5">0.5000</td>'
               '<td class="num" data-src="harness/records.jsonl#2.score" data-value="0.0">0.0</td>'
               '<td class="num" data-src="harness/summary.json#n_examples" data-value="2">2</td></tr></table>'
               '</body></html>\n')


def seal(out, experiments=("harness",)):
    """Write O/MANIFEST.json as run.py does (every public file with size and sha256, the private digests), written
    here independently of the audit's reader so that the two can disagree."""
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()      # noqa: E731
    files = {p.relative_to(out).as_posix(): {"size": p.stat().st_size, "sha256": sha(p)}
             for p in sorted(out.rglob("*")) if p.is_file() and p.name not in ("MANIFEST.json", "audit.json")
             and p.relative_to(out).parts[0] != "private"}
    private = {}
    for d in sorted((out / "private").iterdir()) if (out / "private").is_dir() else []:
        lines = sorted(f"{p.relative_to(d).as_posix()}\t{sha(p)}\n" for p in d.rglob("*") if p.is_file())
        private[d.name] = {"n_files": len(lines), "sha256": hashlib.sha256("".join(lines).encode()).hexdigest()}
    man = {"format": "evidence-manifest/v1", "run_id": RUN_ID, "experiments": list(experiments), "failed": [],
           "files": files, "private": private, "evidence_format": 2}
    (out / "MANIFEST.json").write_text(json.dumps(man, indent=1, sort_keys=True))
    return out


def test_harness_rule_runs_every_shared_group(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    rep = driver.audit(out, ("arithmetic", "identity"))
    rows = {r["check"]: r for r in rep["checks"] if r["experiment"] == "harness"}
    # no model here, so the identity rows that need one cannot run: INCOMPLETE (exit 1), never FAIL
    assert not [r for r in rep["checks"] if r["status"] == "FAIL"]
    for prefix in ("required files", "config consistency", "environment.json consistency", "record schema",
                   "stages.json", "example selection", "task and overall scores", "private task files",
                   "example scores from predictions"):
        assert any(n.startswith(prefix) and r["status"] == "PASS" for n, r in rows.items()), (prefix, rows)
    assert rows["required files"]["items"] == 6      # O/environment.json is required for the harness too


@pytest.mark.parametrize("tamper, needle", [
    (lambda o: _edit(o / "harness/identity.json", lambda i: i.update(model_sha256="x")), "identity.json model_sha256"),
    (lambda o: _edit(o / "environment.json", lambda e: e.update(git_commit="d")), "identity.json git_commit"),
    (lambda o: _edit(o / "harness/stages.json", lambda s: s.update(total_wall_s=1.0)), "stages.json total_wall_s"),
    (lambda o: _edit(o / "harness/stages.json", lambda s: s.update(threads=4)), "stages.json threads"),
    (lambda o: (o / "environment.json").unlink(), "harness/../environment.json: missing"),
])
def test_harness_rule_catches_identity_environment_and_stages_tampers(tmp_path, tamper, needle):
    out = tiny_harness_evidence(tmp_path / "O")
    tamper(out)
    rep = driver.audit(out)
    failures = [f for r in rep["checks"] if r["status"] == "FAIL" for f in r["failures"]]
    assert rep["exit_code"] == 1 and any(needle in f for f in failures), failures


def _edit(path, fn):
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


@pytest.mark.slow
def test_every_experiment_of_a_smoke_run_passes_every_shared_group(smoke_run, tmp_path):
    """The README's main job (run.py --smoke, all experiments), audited at the identity level: every experiment,
    the harness included, has the shared rows, and every claim recomputes."""
    out = tmp_path / "O"
    shutil.copytree(smoke_run[0], out)
    proc = audit(out, "--tokens")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = checks(out)
    for exp in ("protocol", "options", "extraction", "mctaco", "harness"):
        names = [c["check"] for c in rows if c["experiment"] == exp and c["status"] == "PASS"]
        for prefix in ("required files", "config consistency", "environment.json consistency", "stages.json"):
            assert any(n.startswith(prefix) for n in names), (exp, prefix, names)


@pytest.mark.slow
def test_a_sampled_forward_level_names_its_seed_and_bound_and_repeats_from_the_seed(dev_run, smoke_run, tmp_path):
    """audit.py O --forward --sample N on real run.py evidence: the forward rows re-score N items drawn from the
    seed and say so with the detection bound, the RESULT line says SAMPLED, the printed seed repeats the draw; the
    harness draws each task on its own (every task is in the sample)."""
    out = tmp_path / "dev"
    shutil.copytree(dev_run[0], out)
    args = ("--forward", "--sample", "5", "--experiment", "protocol", "--report", out / "audit.json")
    proc = audit(out, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    first = report(out)
    seed = first["sample"]["seed"]
    assert first["sample"]["seed_source"] == "fresh at audit time" and len(seed) == 32
    assert f"SAMPLE: the forward level re-scored 5 item(s) of each experiment/task, drawn from seed {seed}" in \
        proc.stdout and "(SAMPLED FORWARD LEVEL)" in proc.stdout
    scores = next(c for c in first["checks"] if c["check"] == "candidate scores vs both paths")
    k = sampling.detection_k(64, 5)
    assert scores["status"] == "PASS" and scores["items"] == 10, scores       # 5 items x 2 candidates
    assert f"a sample: 5 of 64 items (seed {seed}, fresh at audit time" in scores["note"] and \
        f"if at least {k} of the 64 were altered" in scores["note"], scores["note"]
    drawn = first["details"]["protocol"]["forward"]["sample"]
    proc = audit(out, *args, "--sample-seed", seed)
    again = report(out)
    assert proc.returncode == 0 and again["sample"]["seed_source"] == "given with --sample-seed"
    assert again["details"]["protocol"]["forward"]["sample"] == {
        k: {**v, "seed_source": "given with --sample-seed"} for k, v in drawn.items()}
    smoke = tmp_path / "smoke"
    shutil.copytree(smoke_run[0], smoke)
    proc = audit(smoke, "--forward", "--sample", "1", "--experiment", "harness", "--report", smoke / "a.json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = json.loads((smoke / "a.json").read_text())["details"]["harness"]["forward"]["sample"]
    recorded = {r["task"] for r in map(json.loads, (smoke / "harness" / "records.jsonl").read_text().splitlines())}
    assert {k.split("/", 1)[1] for k in tasks} == recorded, (tasks, recorded)


# ---- the manifest level, strict reading, environment.json, report.html, the headline -----------------------------
# All on the tiny synthetic harness evidence (fast, sealed by `seal` above as run.py seals real evidence); the slow
# tests above audit real sealed evidence from run.py.

from evidence_audit import manifest as manifest_level  # noqa: E402


def failures_of(rep, check=None):
    return [f for r in rep["checks"] if r["status"] == "FAIL" and (check is None or r["check"].startswith(check))
            for f in r["failures"]]


def test_sealed_tiny_evidence_passes_every_manifest_row_and_the_report_page(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    rep = driver.audit(out)
    assert rep["exit_code"] == 0 and rep["result"] == "PASS", failures_of(rep)
    rows = {r["check"]: r for r in rep["checks"] if r["experiment"] == "-"}
    assert [r["level"] for r in rep["checks"][:6]] == ["manifest"] * 6         # the manifest is checked first
    for name in ("no symlinks or special files under O", "MANIFEST.json present and well formed",
                 "public files match MANIFEST.json (size, sha256)", "experiments listed in MANIFEST.json",
                 "run id (MANIFEST.json, environment.json, identity.json, private run.json)",
                 "private files match MANIFEST.json (count, sha256)", "report.html (run id, every number cell)"):
        assert rows[name]["status"] == "PASS", (name, rows)
    cells = len(re.findall(r"<td[^>]* data-src=", (out / "report.html").read_text()))
    assert rows["report.html (run id, every number cell)"]["items"] == cells + 1 > 4      # the run id, every cell
    assert rows["report.html rebuilt from the evidence (report.py --check, byte for byte)"]["level"] == "arithmetic"
    assert rep["run_id"] == RUN_ID


def _rename_dot(o):
    (o / "harness").rename(o / ".harness")


def _link_records_outside(o):
    target = o.parent / "elsewhere.jsonl"
    (o / "harness/records.jsonl").rename(target)
    (o / "harness/records.jsonl").symlink_to(target)


def _link_private_outside(o):
    (o / "private").rename(o.parent / "p")
    (o / "private").symlink_to(o.parent / "p")


def _same_size_edit(p):
    b = bytearray(p.read_bytes())
    b[0:1] = b"#" if b[0:1] != b"#" else b"$"
    p.write_bytes(bytes(b))


def _edit_manifest(o, fn):
    _edit(o / "MANIFEST.json", fn)


# (tamper, check row that must fail, text its failure must contain: the file named)
MANIFEST_TAMPERS = {
    "manifest deleted": (lambda o: (o / "MANIFEST.json").unlink(), "MANIFEST.json present",
                         "MANIFEST.json: missing"),
    "manifest unknown key": (lambda o: _edit_manifest(o, lambda m: m.update(note="x")), "MANIFEST.json present",
                             "MANIFEST.json note"),
    "manifest bad run id": (lambda o: _edit_manifest(o, lambda m: m.update(run_id="X" * 32)),
                            "MANIFEST.json present", "MANIFEST.json run_id"),
    "dot-file added": (lambda o: _write(o / ".hidden", "x"), "public files", ".hidden: not listed"),
    "dot-dir added": (lambda o: _write(o / ".stash/summary.json", "{}"), "public files", ".stash/summary.json"),
    "empty dir added": (lambda o: (o / "extra").mkdir(), "experiments listed", "extra/: a directory"),
    "file added to an experiment": (lambda o: _write(o / "harness/notes.txt", "x"), "public files",
                                    "harness/notes.txt: not listed"),
    "file changed, same size": (lambda o: _same_size_edit(o / "run.log"), "public files", "run.log: sha256"),
    "file changed, new size": (lambda o: _write(o / "run.log", "other\n"), "public files", "run.log: 6 bytes"),
    "file deleted": (lambda o: (o / "harness/stages.json").unlink(), "public files",
                     "harness/stages.json: listed in MANIFEST.json but missing"),
    "report deleted": (lambda o: (o / "report.html").unlink(), "public files", "report.html: listed"),
    "experiment deleted": (lambda o: shutil.rmtree(o / "harness"), "experiments listed", "harness/: experiment"),
    "experiment renamed to a dot-dir": (_rename_dot, "experiments listed", "harness/: experiment listed"),
    "failure record added": (lambda o: _write(o / "protocol.FAILED.json", {}), "experiments listed",
                             "protocol.FAILED.json: a failure record"),
    "records.jsonl a symlink outside O": (_link_records_outside, "no symlinks", "harness/records.jsonl: a symlink"),
    "symlink in private": (lambda o: (o / "private/harness/x").symlink_to("/etc/hostname"), "no symlinks",
                           "private/harness/x: a symlink"),
    "fifo": (lambda o: os.mkfifo(o / "harness/pipe"), "no symlinks", "harness/pipe: not a regular file"),
    "private leftover dir": (lambda o: _write(o / "private/.tmp-harness-1/t.jsonl", "x"), "private files",
                             "private/.tmp-harness-1"),
    "private file changed": (lambda o: _same_size_edit(o / "private/harness/tasks/arith.jsonl"), "private files",
                             "private/harness/: contents differ"),
    "private file added": (lambda o: _write(o / "private/harness/tasks/more.jsonl", "x"), "private files",
                           "private/harness/: 4 files"),
    "private experiment dir deleted": (lambda o: shutil.rmtree(o / "private/harness") or
                                       (o / "private/other").mkdir(), "private files",
                                       "private/harness/: listed in MANIFEST.json but missing"),
    "identity run id": (lambda o: _edit(o / "harness/identity.json", lambda i: i.update(run_id="f" * 32)),
                        "run id", "harness/identity.json run_id"),
    "private replaced by a file": (lambda o: shutil.rmtree(o / "private") or _write(o / "private", "x"),
                                   "private files", "private: not a directory"),
    "private replaced by a link": (_link_private_outside, "no symlinks", "private: a symlink"),
    "environment run id": (lambda o: _edit(o / "environment.json", lambda e: e.update(run_id="f" * 32)),
                           "run id", "environment.json run_id"),
    "private run.json run id": (lambda o: _write(o / "private/harness/run.json",
                                                 {"experiment": "harness", "run_id": "f" * 32}),
                                "run id", "private/harness/run.json run_id"),
    "private run.json experiment": (lambda o: _write(o / "private/harness/run.json",
                                                     {"experiment": "protocol", "run_id": RUN_ID}),
                                    "run id", "private/harness/run.json experiment"),
}


@pytest.mark.parametrize("kind", list(MANIFEST_TAMPERS))
def test_manifest_level_catches_each_tamper_naming_the_file(tmp_path, kind):
    tamper, check, needle = MANIFEST_TAMPERS[kind]
    out = tiny_harness_evidence(tmp_path / "O")
    tamper(out)
    rep = driver.audit(out)
    assert rep["exit_code"] == 1 and rep["result"] == "FAIL"
    assert any(needle in f for f in failures_of(rep, check)), failures_of(rep)


# a forger who rewrites MANIFEST.json too (reseal) passes the manifest level; these are caught deeper
RESEALED_TAMPERS = {
    "environment commit": (lambda o: _edit(o / "environment.json", lambda e: e.update(git_commit="d")),
                           "environment.json consistency", "identity.json git_commit"),
    "environment dirty flag": (lambda o: _edit(o / "environment.json", lambda e: e.update(git_dirty=True)),
                               "environment.json consistency", "identity.json git_dirty"),
    "environment code hash": (lambda o: _edit(o / "environment.json", lambda e: e.update(code_sha256="x")),
                              "environment.json consistency", "identity.json code_sha256"),
    "identity run id": (lambda o: _edit(o / "harness/identity.json", lambda i: i.update(run_id="f" * 32)),
                        "run id", "harness/identity.json run_id"),
    "report value": (lambda o: _write(o / "report.html", TINY_REPORT.replace('data-value="0.5">0.5000',
                                                                             'data-value="0.75">0.7500')),
                     "report.html", "harness/summary.json#leaderboard.overall holds 0.5"),
    "report shown text": (lambda o: _write(o / "report.html", TINY_REPORT.replace(">0.5000<", ">0.7500<")),
                          "report.html", "not a rounding of 0.5"),
    "report run id": (lambda o: _write(o / "report.html", TINY_REPORT.replace(RUN_ID, "e" * 32)),
                      "report.html", "meta evidence-run-id"),
    "report cell without source": (lambda o: _write(o / "report.html", TINY_REPORT.replace(
        ' data-src="harness/summary.json#n_examples"', "")), "report.html", "is not '<exp>/<file>#<path>'"),
    "report cell sourced outside an experiment": (lambda o: _write(o / "report.html", TINY_REPORT.replace(
        "harness/summary.json#n_examples", "../x.json#a")), "report.html", "does not name an evidence file"),
    "report cell with a missing source": (lambda o: _write(o / "report.html", TINY_REPORT.replace(
        "#2.score", "#9.score")), "report.html", "no line '9'"),
}


@pytest.mark.parametrize("kind", list(RESEALED_TAMPERS))
def test_deeper_checks_catch_tampers_behind_a_rewritten_manifest(tmp_path, kind):
    tamper, check, needle = RESEALED_TAMPERS[kind]
    out = tiny_harness_evidence(tmp_path / "O")
    tamper(out)
    manifest_level.reseal(out)
    rep = driver.audit(out)
    assert all(r["status"] != "FAIL" for r in rep["checks"] if r["check"].startswith("public files")), kind
    assert rep["exit_code"] == 1 and any(needle in f for f in failures_of(rep, check)), failures_of(rep)


def test_reseal_restores_a_clean_manifest(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    before = json.loads((out / "MANIFEST.json").read_text())
    assert manifest_level.reseal(out) == before


PAGE_LOOKALIKES = {
    # what the cell whitelist cannot see; the page is rebuilt from public evidence at the arithmetic level
    "cell pointed at another field of equal value": (
        'data-src="harness/summary.json#leaderboard.tasks.arith.score"', 'data-src="harness/summary.json#leaderboard.overall"'),
    "label swap": ("<th>latency s (task total)</th><th>latency s (mean)</th>",
                   "<th>latency s (mean)</th><th>latency s (task total)</th>"),
    "full-width decimal point": (">0.5000<", ">0\uff0e5000<"),
    "zero-width space in a number": (">0.5000<", ">0.\u200b5000<"),
    "letter O for zero": (">0.5000<", ">O.5OOO<"),
    "a table hidden in a closed <details>": ("<table", "<details><table"),
    "an integer in prose": ("to 4 decimals", "to 6 decimals"),
}


HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=conftest.REPO, capture_output=True, text=True).stdout.strip()


def made_at(out, commit):
    """The tiny evidence as if run.py had written it at `commit` (environment.json and identity.json agree), resealed."""
    _edit(out / "environment.json", lambda e: e.update(git_commit=commit, git_dirty=False))
    _edit(out / "harness/identity.json", lambda i: i.update(git_commit=commit, git_dirty=False))
    from evidence_report import page        # the page shows the commit: report.py's own page again
    page.write(out)
    seal(out)


def test_a_page_from_another_builder_is_undecided_never_failed_nor_passed(tmp_path):
    """A page that differs from this checkout's build, in evidence made at another commit: another report.py may lay
    the same evidence out otherwise, so the row says it cannot decide (INCOMPLETE, exit 1) and names both commits."""
    out = tiny_harness_evidence(tmp_path / "O")
    made_at(out, "f" * 40)
    page = (out / "report.html").read_text(encoding="utf-8")
    (out / "report.html").write_text(page.replace("to 4 decimals", "to 6 decimals"), encoding="utf-8")
    seal(out)
    proc = audit(out, "--report", tmp_path / "a.json")
    rep = json.loads((tmp_path / "a.json").read_text())
    row = next(r for r in rep["checks"] if r["check"].startswith("report.html rebuilt"))
    assert proc.returncode == 1 and row["status"] == "SKIPPED" and rep["result"].startswith("INCOMPLETE"), row
    assert f"made at commit {'f' * 12} and this checkout is {HEAD[:12]}" in row["note"], row["note"]


@pytest.mark.parametrize("kind", [pytest.param(k, marks=() if k == "full-width decimal point" else pytest.mark.slow)
                                  for k in sorted(PAGE_LOOKALIKES)])        # one fast, each ~7 s: audit.py twice
def test_page_look_alikes_fail_every_audit_and_public_only(tmp_path, kind):
    """The hostile tester's page edits (resealed: MANIFEST.json lists the edited page's hash) passed the default audit
    and --public-only: only the identity level rebuilt the page. Now every audit rebuilds it."""
    out = tiny_harness_evidence(tmp_path / "O")
    made_at(out, HEAD)              # the evidence cites this checkout's commit: its builder decides
    old, new = PAGE_LOOKALIKES[kind]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert old in page, kind
    (out / "report.html").write_text(page.replace(old, new, 1), encoding="utf-8")
    seal(out)
    rebuilt = "report.html rebuilt from the evidence (report.py --check, byte for byte)"
    for args in ((), ("--public-only",)):
        if args:
            shutil.rmtree(out / "private", ignore_errors=True)
            seal(out)
        proc = audit(out, *args, "--report", tmp_path / "a.json")
        rows = {r["check"]: r for r in json.loads((tmp_path / "a.json").read_text())["checks"]}
        assert proc.returncode == 1 and rows[rebuilt]["status"] == "FAIL", (kind, args, rows[rebuilt])
        assert rows[rebuilt]["level"] == "arithmetic"


def test_missing_private_is_incomplete_unless_public_only(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    shutil.rmtree(out / "private")
    proc = audit(out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RESULT: INCOMPLETE: O/private/ absent" in proc.stdout and "RESULT: PASS" not in proc.stdout
    proc = audit(out, "--public-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: PASS (public evidence only; identity and forward levels not run)" in proc.stdout
    assert audit(out, "--public-only", "--strict").returncode == 0     # what needs O/private/ was not asked for
    proc = audit(out, "--public-only", "--tokens")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_public_only_still_fails_a_tamper(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    shutil.rmtree(out / "private")
    _write(out / ".hidden", "x")
    proc = audit(out, "--public-only")
    assert proc.returncode == 1 and "RESULT: FAIL" in proc.stdout and ".hidden" in proc.stdout


def test_printed_report_says_which_level_catches_what(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    rep = driver.audit(out)
    notes = " ".join(r["note"] for r in rep["checks"])
    assert "rewrites MANIFEST.json" in notes and "--tokens" in notes and "--forward" in notes
    proc = audit(out)
    assert "a forger who rewrites MANIFEST.json too passes it" in proc.stdout and "(--forward)" in proc.stdout
    proc = audit("--help")
    assert "MANIFEST.json" in proc.stdout and "public-only" in proc.stdout


# ---- strict reading: every bad input is one line naming file and line, exit 2, never a traceback ---------------

def _records_line2(text):
    return lambda o: _write(o / "harness/records.jsonl",
                            (o / "harness/records.jsonl").read_text().splitlines()[0] + "\n" + text + "\n")


BAD_INPUTS = {
    "duplicate key (nested)": (lambda o: _write(o / "harness/summary.json",
                                                '{\n "split": "smoke",\n "leaderboard": {"overall": 0.5,\n'
                                                '  "overall": 1.0}\n}'), "summary.json: line 4: field 'overall'"),
    "duplicate key in a record": (_records_line2('{"task": "arith", "task": "x"}'),
                                  "records.jsonl: line 2: field 'task': duplicate key"),
    "NaN": (lambda o: _write(o / "harness/summary.json", '{"split": "smoke",\n "n": NaN}'),
            "summary.json: line 2: field 'n': non-finite number NaN"),
    "Infinity": (_records_line2('{"score": Infinity}'), "records.jsonl: line 2: field 'score': non-finite"),
    "-Infinity": (lambda o: _write(o / "environment.json", '{"x": -Infinity}'), "environment.json: line 1"),
    "1e999 overflow": (lambda o: _write(o / "harness/stages.json", '{"total_wall_s": 1e999}'),
                       "stages.json: line 1: field 'total_wall_s': number 1e999 overflows"),
    "integer of 5000 digits": (lambda o: _write(o / "harness/stages.json", '{"threads": ' + "9" * 5000 + "}"),
                               "stages.json: line 1: field 'threads': integer of 5000 digits"),
    "nesting 100000 deep": (lambda o: _write(o / "harness/summary.json", "[" * 100000 + "]" * 100000),
                            "summary.json: line 1: nesting deeper than 64"),
    "unclosed nesting 100000 deep": (lambda o: _write(o / "harness/config.json", "[" * 100000),
                                     "config.json: line 1: nesting deeper than 64"),
    "nesting 65 deep in a record": (_records_line2('{"a": ' + "[" * 65 + "]" * 65 + "}"),
                                    "records.jsonl: line 2: nesting deeper than 64"),
    "lone surrogate in a value": (lambda o: _write(o / "harness/identity.json", '{"run_id": "\\udc80"}'),
                                  "identity.json: line 1: field 'run_id': string holds a lone surrogate"),
    "lone surrogate in a key": (_records_line2('{"\\ud800": 1}'), "records.jsonl: line 2: field"),
    "invalid UTF-8": (lambda o: (o / "harness/records.jsonl").write_bytes(b'{"a": 1}\n{"a": "\xff"}\n'),
                      "records.jsonl: line 2: not UTF-8"),
    "UTF-8 encoded surrogate": (lambda o: (o / "harness/summary.json").write_bytes(b'{"a": "\xed\xa0\x80"}'),
                                "summary.json: line 1: not UTF-8"),
    "byte order mark": (lambda o: (o / "harness/summary.json").write_bytes(b"\xef\xbb\xbf{}"),
                        "summary.json: line 1: starts with a byte order mark"),
    "records.jsonl a FIFO": (lambda o: (o / "harness/records.jsonl").unlink() or
                             os.mkfifo(o / "harness/records.jsonl"), "records.jsonl: not a regular file"),
    "records.jsonl a link to /dev/zero": (lambda o: (o / "harness/records.jsonl").unlink() or
                                          (o / "harness/records.jsonl").symlink_to("/dev/zero"),
                                          "records.jsonl: not a regular file"),
    "manifest duplicate key": (lambda o: _write(o / "MANIFEST.json", '{"run_id": "a", "run_id": "b"}'),
                               "MANIFEST.json: line 1: field 'run_id': duplicate key"),
    "private run.json NaN": (lambda o: _write(o / "private/harness/run.json", '{"run_id": NaN}'),
                             "run.json: line 1: field 'run_id': non-finite"),
    "report.html data-value NaN": (lambda o: _write(o / "report.html", TINY_REPORT.replace(
        'data-value="2"', 'data-value="NaN"')), "report.html line 1 data-value: line 1: non-finite"),
}


@pytest.mark.parametrize("kind", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_naming_file_and_line(tmp_path, kind):
    tamper, needle = BAD_INPUTS[kind]
    out = tiny_harness_evidence(tmp_path / "O")
    tamper(out)
    if kind.startswith("report.html"):
        manifest_level.reseal(out)
    proc = audit(out)
    if kind.startswith("report.html"):      # a cell that cannot be read is a failed cell, the page still audited
        assert proc.returncode == 1 and needle in proc.stdout, proc.stdout + proc.stderr
        return
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert needle in proc.stderr, proc.stderr
    assert not (out / "audit.json").exists()        # no report for unreadable evidence


@pytest.mark.parametrize("limit, text, needle", [
    ("MAX_LINE_CHARS", '{"a": "' + "x" * 200 + '"}', "line 1: line of 209 characters is over"),
    ("MAX_FILE_BYTES", '{"a": "' + "x" * 200 + '"}', "file of 209 bytes is over"),
])
def test_line_and_file_size_are_bounded(tmp_path, monkeypatch, limit, text, needle):
    p = tmp_path / "x.json"
    p.write_text(text)
    monkeypatch.setattr(reading, limit, 100)
    read = reading.read_json if limit == "MAX_LINE_CHARS" else lambda q: reading.read_json(q, limit=100)
    with pytest.raises(reading.Unreadable, match=needle):
        read(p)


def test_strict_reader_accepts_what_run_py_writes(tmp_path):
    obj = {"a": [1, -2, 3.5, 1e-300, 10 ** 30, None, True], "s": 'q"[{\\u2028 ✓', "n": {"m": {}}}
    p = tmp_path / "x.json"
    p.write_text(json.dumps(obj, indent=1, ensure_ascii=False))
    assert reading.read_json(p) == obj
    p.write_text(json.dumps(obj) + "\n" + json.dumps(obj, ensure_ascii=False) + "\n")
    assert reading.read_jsonl(p) == [obj, obj]


def test_review_sheet_is_read_strictly(tmp_path):
    """--review SHEET: the sheet is untrusted bytes too (read_json, the same strict reader)."""
    from evidence_audit.rules import extraction_review
    assert "read_json(sheet_path)" in (PACKAGE / "rules/extraction_review.py").read_text()
    sheet = tmp_path / "sheet.json"
    sheet.write_text('{"reviews": [' * 80 + "]" * 80 + "}")
    with pytest.raises(reading.Unreadable, match="sheet.json: line 1: nesting deeper than 64"):
        reading.read_json(sheet)
    assert extraction_review.read_json is reading.read_json


def test_report_rounding_rule():
    from evidence_audit.report_page import is_rounding
    for text, value in (("0.5000", 0.5), ("0.8125", 0.8125), ("0.812", 0.8125), ("1.2e-05", 1.23e-05), ("2", 2),
                        ("+3", 3), ("[0.1235, -1.0]", [0.12345, -1.0]), ("—", None), ("0.0", 0.0), ("12.3", 12.34)):
        assert is_rounding(text, value), (text, value)
    for text, value in (("0.5001", 0.5), ("0.80", 0.8125), ("3", 2), ("1.3e-05", 1.23e-05), ("[0.1]", [0.1, 0.2]),
                        ("—", 0.0), ("true", True), ("0.5", None)):
        assert not is_rounding(text, value), (text, value)


def test_environment_check_compares_the_run_id_with_every_identity():
    ev = {"environment": {"git_commit": "c", "git_dirty": False, "code_sha256": "h", "versions": {}, "run_id": "a"},
          "identity": {"git_commit": "c", "git_dirty": False, "code_sha256": "h", "versions": {}, "run_id": "b"}}
    C = audit_checks.Checks()
    shared.environment_check(C, "protocol", ev)
    assert C.rows[0]["status"] == "FAIL" and "identity.json run_id" in C.rows[0]["first_failure"]


def test_a_thousand_nested_dot_directories_fail_without_a_recursion_error(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    p = out / ".d"
    p.mkdir()
    for _ in range(1100):                       # deeper than Python's recursion limit (os.walk would crash)
        p = p / "d"
        p.mkdir()
    rep = driver.audit(out)
    assert rep["exit_code"] == 1 and any(".d/: directory not in MANIFEST.json" in f for f in failures_of(rep))
    while p != out:                             # remove it without a recursive rmtree
        p.rmdir()
        p = p.parent


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m["files"].update({"run.log": {"size": -1, "sha256": "0" * 64}}), "MANIFEST.json files.run.log"),
    (lambda m: m["files"].update({"run.log": {"size": 1}}), "MANIFEST.json files.run.log"),
    (lambda m: m["private"].update(harness={"n_files": True, "sha256": "0" * 64}), "MANIFEST.json private.harness"),
    (lambda m: m.update(format="evidence-manifest/v0"), "MANIFEST.json format"),
    (lambda m: m.update(experiments=["harness", "harness"]), "MANIFEST.json experiments"),
    (lambda m: m.update(failed=["../x"]), "MANIFEST.json failed"),
    (lambda m: m.pop("private"), "MANIFEST.json private: missing"),
])
def test_manifest_of_the_wrong_shape_fails_naming_the_field(tmp_path, edit, needle):
    out = tiny_harness_evidence(tmp_path / "O")
    _edit_manifest(out, edit)
    rep = driver.audit(out)
    assert any(f.startswith(needle) for f in failures_of(rep, "MANIFEST.json present")), failures_of(rep)


def test_evidence_directory_that_is_a_symlink_exits_2(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    (tmp_path / "link").symlink_to(out)
    proc = audit(tmp_path / "link")
    assert proc.returncode == 2 and "a symlink" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_report_that_cannot_be_written_is_one_warning_and_keeps_the_verdict(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    proc = audit(out, "--report", tmp_path / "no-such-dir" / "a.json")
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "could not write the JSON report" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sheet, needle", [
    ('{"sheet_format": "x", "sheet_format": "y"}', "field 'sheet_format': duplicate key"),
    ('{"items": ' + "[" * 5000 + "]" * 5000 + "}", "nesting deeper than 64"),
    ('{"items": NaN}', "field 'items': non-finite number NaN"),
])
def test_review_sheet_of_bad_json_is_one_line_exit_2(smoke_run, tmp_path, sheet, needle):
    path = tmp_path / "sheet.json"
    path.write_text(sheet)
    proc = audit(smoke_run[0], "--experiment", "extraction", "--review", path, "--report", tmp_path / "a.json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and f"sheet.json: line 1: {needle}" in proc.stderr


# ---- agreement by construction: the batches, the dtype grid, whole batches per rank -------------------------------

def test_a_score_is_a_value_of_its_dtype():
    import struct

    f32 = struct.unpack("<f", struct.pack("<f", -4.9424729347229))[0]
    assert definitions.is_value_of(f32, "float32") and not definitions.is_value_of(f32 + 1e-9, "float32")
    assert definitions.is_value_of(-4.1875, "bfloat16") and not definitions.is_value_of(f32, "bfloat16")
    assert definitions.is_value_of(-0.0625, "float16") and not definitions.is_value_of(-0.1, "float16")
    for junk in (float("nan"), float("inf"), 1e300, "-1.0", None, 3):
        assert not definitions.is_value_of(junk, "float32"), junk


def mc_records(lengths):
    """Records with one-token candidates whose contexts have these lengths (one distinct prompt each)."""
    return [{"idx": i, "prompt_sha256": f"{i:064x}", "context_tokens": n,
             "candidates": [{"text": " a", "start": n, "token_ids": [5]}, {"text": " b", "start": n, "token_ids": [6]}]}
            for i, n in enumerate(lengths)]


def batching_cfg(size=2, **facts):
    base = {"rule": shared.BATCH_RULE, "batch_size": size, "n_requests": 10, "n_rows": 5, "n_batches": 3,
            "shapes": [[2, 30], [2, 20], [1, 10]]}
    return {"config": {"official_batch_size": size}, "official": {"hflm": {"batch_size": size}},
            "independent": {"batching": {**base, **facts}}}


@pytest.mark.parametrize("cfg,problem", [
    (batching_cfg(), None),
    (batching_cfg(shapes=[[2, 30], [2, 20], [1, 11]]), "independent.batching.shapes"),
    (batching_cfg(n_rows=5.0), "counts must be integers"),
    (batching_cfg(rule="one unpadded sequence per forward pass"), "independent.batching.rule"),
    (batching_cfg(per_rank=[1]), "per_rank: a claim audit.py has no rule"),
    (batching_cfg(size=0), "official_batch_size: 0 is not a positive integer"),
    (dict(batching_cfg(), official={"hflm": {"batch_size": 1}}), "official.hflm.batch_size"),
    (dict(batching_cfg(), independent={"batching": "all of them"}), "is not the batching facts"),
])
def test_the_batching_facts_are_recomputed_from_the_records(cfg, problem):
    C = audit_checks.Checks()
    shared.batching_check(C, "x", cfg, mc_records([20, 10, 30, 29, 19]))   # rows 29+30, 19+20, 10: one per item
    row = C.rows[0]
    assert (row["status"], problem is None or problem in row["first_failure"]) == (
        "PASS" if problem is None else "FAIL", True), row


def test_whole_batches_per_rank_are_rebuilt_from_the_token_ids():
    """5 items of lengths 30, 29, 20, 19, 10 at batch size 2: batches {30, 29}, {20, 19}, {10}; rank 0 takes the first
    and third, rank 1 the second. A list that is still a partition but splits a batch fails."""
    records = mc_records([20, 10, 30, 29, 19])
    tokens = {r["idx"]: (list(range(100 * r["idx"], 100 * r["idx"] + r["context_tokens"])), [[5], [6]])
              for r in records}

    def ev(lists):
        ranks = [{"items_scored": {"official": l, "independent": l}} for l in lists]
        return {"config": {"config": {"official_batch_size": 2}},
                "stages": {"data_parallel": {"world_size": 2, "ranks": ranks}}}

    C = audit_checks.Checks()
    shared.whole_batches_check(C, "x", ev([[2, 3, 1], [0, 4]]), records, tokens)
    shared.whole_batches_check(C, "x", ev([[2, 0, 1], [3, 4]]), records, tokens)
    shared.whole_batches_check(C, "x", {"config": {}, "stages": {}}, records, tokens)      # one process: no row
    assert [r["status"] for r in C.rows] == ["PASS", "FAIL"]
    assert "ranks[0].items_scored.official" in C.rows[1]["first_failure"]


def test_a_typo_of_an_evidence_directory_or_cache_gets_a_did_you_mean(tmp_path, monkeypatch):
    """`audit.py smok` beside smoke/ (a run's MANIFEST.json in it), `--cache ./cahce` beside a prepared cache: the
    line names the directory meant, rather than advising to make a new run or prepare a new cache."""
    import resources
    from evidence_audit.driver import audit
    from evidence_audit.reading import Unreadable

    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "MANIFEST.json").write_text("{}")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Unreadable, match="did you mean smoke "):
        audit("smok")
    with pytest.raises(resources.ResourceError, match="did you mean --cache cache "):
        resources.prepared_manifest("cahce")
    with pytest.raises(Unreadable, match="run: python run.py"):         # nothing near: the advice to make one
        audit("zzz")
