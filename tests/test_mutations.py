"""The mutation self-test (`audit.py O --mutations`, evidence_audit/mutations/).

Fast: the list of kinds (at least 40, all five experiments, every class of tampering the audit must catch, each
naming a level, a check and the form its name speaks of), each mutation function on small synthetic evidence (it
tampers as it says; the lenient-JSON kinds write what a lenient reader accepts and the strict reader refuses; the
consistent forgeries stay consistent), the runner's verdicts on a fake audit (a kind caught by another check, or not
at all, or not applicable, makes it exit 1), and both forms (raw, resealed) of a few kinds on tiny real evidence
with the real audit and report.py: a kind only the manifest sees is NOT CAUGHT once resealed; the markdown table.
Slow: the self-test on a real smoke run of all five experiments.
"""
import json
import shutil

import pytest

from conftest import run_cli
from evidence_audit.mutations import MUTATIONS, scores, selftest, tools
from evidence_audit.reading import Unreadable, parse_strict, read_json, read_jsonl
from evidence_audit.rules.harness import h_aggregate

EXPERIMENTS = {"protocol", "options", "mctaco", "extraction", "harness"}
BY_NAME = {k.kind: k for k in MUTATIONS}
# the classes of tampering the audit must catch, each with the kinds that stand for it
TAMPER_CLASSES = {
    "environment.json contradicts the identities": ["environment_commit", "environment_dirty"],
    "report.html numbers changed": ["report_number_changed", "report_text_changed", "report_run_id"],
    "an experiment directory deleted or renamed to a dot-directory": ["experiment_dir_deleted",
                                                                      "experiment_renamed_dotdir"],
    "a duplicate key in summary.json or a record": ["duplicate_key_summary", "duplicate_key_record"],
    "records.jsonl a symlink to a file outside O": ["records_symlink_outside"],
    "deep nesting, a huge integer, NaN": ["deep_nesting", "huge_integer", "nan_score"],
    "a replaced model prediction recomputed consistently": ["harness_prediction_replaced"],
    "a task target changed to the model's wrong answer": ["harness_target_to_wrong_answer"],
    "O/private/ deleted": ["delete_private"],
    "a stale run id in O/private/<exp>/run.json": ["stale_private_run_id"],
    "a manifest entry changed": ["manifest_entry_changed"],
    "one experiment removed entirely, manifest rewritten": ["experiment_removed_resealed"],
    "O/private removed and the manifest's private list emptied": ["private_removed_manifest_emptied"],
    "a public file no rule knows": ["public_notes_added"],
    "a private texts file copied into the public part": ["private_texts_in_run_log"],
    "report.html: an unsourced number, a script, a CSS content number": ["report_cell_unsourced",
                                                                         "report_script_added",
                                                                         "report_style_content"],
    "environment.json per-rank facts forged": ["environment_world_size", "environment_rank_rss_negative"],
    "O/audit.json forged to claim PASS": ["audit_json_forged_pass"],
}


# ---- the list of kinds ---------------------------------------------------------------------------------------------

def test_at_least_40_kinds_over_all_five_experiments_with_unique_names():
    assert len(MUTATIONS) >= 40
    assert len(BY_NAME) == len(MUTATIONS)
    assert EXPERIMENTS <= {k.experiment for k in MUTATIONS}
    for e in EXPERIMENTS:
        assert sum(k.experiment == e for k in MUTATIONS) >= 4, e


def test_every_kind_names_a_level_a_check_and_a_form():
    for k in MUTATIONS:
        assert k.level in selftest.UP_TO, k
        assert isinstance(k.check, str) and k.check, k
        assert callable(k.apply) and k.what, k
        assert k.named in (tools.RAW, tools.RESEALED) and k.cover in (tools.PAGE, tools.MANIFEST_ONLY, None), k
        if k.cover is None:
            assert k.named == tools.RAW, k          # no resealed form: the name can only speak of the raw one
        if k.check in (tools.READING, tools.HEADLINE):
            assert k.level == "arithmetic", k        # refused by the default audit, no deeper level needed


def test_only_kinds_that_edit_the_manifest_or_the_page_change_how_they_are_resealed():
    """A reseal would undo an edit of MANIFEST.json, a rebuilt page an edit of report.html: those kinds, and only
    those, lack a resealed form or keep their page."""
    no_form = {k.kind for k in MUTATIONS if k.cover is None}
    keeps_page = {k.kind for k in MUTATIONS if k.cover == tools.MANIFEST_ONLY}
    assert no_form == {"manifest_entry_changed"}
    assert keeps_page == {k.kind for k in MUTATIONS if k.kind.startswith("report_")}


@pytest.mark.parametrize("cls", sorted(TAMPER_CLASSES))
def test_every_class_of_tampering_has_a_kind(cls):
    for name in TAMPER_CLASSES[cls]:
        assert name in BY_NAME, (cls, name)


def test_every_level_is_represented():
    assert {k.level for k in MUTATIONS} == {"manifest", "arithmetic", "identity", "forward"}


# ---- mutation functions on synthetic evidence ----------------------------------------------------------------------

def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        tools.write_jsonl(path, obj)
    else:
        path.write_text(tools.dump_json(obj), encoding="utf-8")


def _rec(idx, scores_, pred):
    return {"idx": idx, "label": pred, "context_tokens": 5, "prompt_sha256": "a" * 64,
            "candidates": [{"token_ids": [10], "start": 5}, {"token_ids": [11], "start": 5}],
            "official": {"scores": list(scores_), "pred": pred, "acc": 1.0, "doc_hash": "b" * 64,
                         "prompt_hash": "a" * 64},
            "independent": {"scores": list(scores_), "pred": pred, "correct": 1}, "abs_diff": [0.0, 0.0]}


@pytest.fixture()
def O(tmp_path):
    d = tmp_path / "O"
    _write(d / "protocol" / "records.jsonl", [_rec(7, [-1.0, -2.0], 0), _rec(3, [-3.0, -0.5], 1)])
    _write(d / "protocol" / "summary.json", {"split": "smoke", "independent": {"accuracy": 1.0}})
    _write(d / "private" / "protocol" / "texts.jsonl", [{"idx": 7, "sentence": "Good.", "prompt": "Good.\n"}])
    return d


@pytest.mark.parametrize("name, field, check", [
    ("flip_label", "label", lambda a, b: b == 1 - a),
    ("change_token_count", "context_tokens", lambda a, b: b == a + 1),
    ("alter_prompt_hash", "prompt_sha256", lambda a, b: a != b and len(a) == len(b)),
])
def test_record_mutations_change_record_0_only(O, name, field, check):
    before = read_jsonl(O / "protocol" / "records.jsonl")
    BY_NAME[name].apply(O)
    after = read_jsonl(O / "protocol" / "records.jsonl")
    assert check(before[0][field], after[0][field])
    assert after[1] == before[1]
    assert {k: v for k, v in after[0].items() if k != field} == {k: v for k, v in before[0].items() if k != field}


def test_record_mutation_needing_two_records_is_not_applicable_on_one(O):
    tools.write_jsonl(O / "protocol" / "records.jsonl", [_rec(7, [-1.0, -2.0], 0)])
    with pytest.raises(tools.NotApplicable):
        BY_NAME["swap_idx"].apply(O)


def test_private_mutation_on_absent_file_is_not_applicable(O):
    shutil.rmtree(O / "private")
    with pytest.raises(tools.NotApplicable):
        BY_NAME["alter_private_sentence"].apply(O)


def test_shift_loser_keeps_every_prediction_and_the_agreement():
    recs = [_rec(7, [-1.0, -2.0], 0), _rec(3, [-3.0, -0.5], 1)]
    recs[0]["independent"]["pred"] = 1                       # predictions disagree: record 0 is not usable
    scores.shift_loser(("official", "independent"), ("official.pred", "independent.pred"))(recs)
    r = recs[1]
    shifted = scores.float32(-3.0 - 1e-3)                    # the careful forger stays on the float32 grid
    assert r["official"]["scores"] == r["independent"]["scores"] == [shifted, -0.5] and shifted != -3.0 - 1e-3
    assert recs[0]["official"]["scores"] == [-1.0, -2.0]
    from evidence_audit.definitions import argmax_first
    assert argmax_first(r["official"]["scores"]) == r["official"]["pred"] == 1


def test_shift_loser_without_agreeing_record_is_not_applicable():
    recs = [_rec(7, [-1.0, -2.0], 0)]
    recs[0]["independent"]["pred"] = 1
    with pytest.raises(tools.NotApplicable):
        scores.shift_loser(("official", "independent"), ("official.pred", "independent.pred"))(recs)


def _harness_O(d):
    _write(d / "harness" / "config.json", {"tasks": {"arithmetic": {"sha256": "c" * 64}, "code": {"sha256": "d" * 64}}})
    recs = [{"task": "arithmetic", "id": "a1", "score": 0.0, "timed_out": False, "latency_s": 1.0,
             "prediction_sha256": "e" * 64},
            {"task": "code", "id": "c1", "score": 1.0, "timed_out": False, "latency_s": 2.0,
             "sandbox": {"matched": 4, "total": 4}}]
    _write(d / "harness" / "records.jsonl", recs)
    tasks, overall = h_aggregate(recs, ["arithmetic", "code"])
    _write(d / "harness" / "summary.json", {"leaderboard": {"tasks": {t: dict(v) for t, v in tasks.items()},
                                                            "overall": overall},
                                            "tasks_are_shipped_fixtures": {"arithmetic": True, "code": True}})
    _write(d / "private" / "harness" / "leaderboard.json", {
        "tasks": {t: {"score": v["score"], "correct": v["correct"], "sha256": "c" * 64} for t, v in tasks.items()},
        "overall": overall,
        "per_example": [{"task": "arithmetic", "id": "a1", "score": 0.0, "prediction": "17 + 25 = 32."},
                        {"task": "code", "id": "c1", "score": 1.0, "prediction": "def f(x): ..."}]})
    (d / "private" / "harness" / "tasks").mkdir(parents=True)
    (d / "private" / "harness" / "tasks" / "arithmetic.jsonl").write_text(
        '# arithmetic\n{"id": "a1", "prompt": "What is 17 + 25?", "targets": ["42"], "metric": "exact_match"}\n',
        encoding="utf-8")


def _consistent(d):
    """Every aggregate the arithmetic level recomputes agrees with the records; the private board with both."""
    recs = read_jsonl(d / "harness" / "records.jsonl")
    tasks, overall = h_aggregate(recs, ["arithmetic", "code"])
    board = read_json(d / "harness" / "summary.json")["leaderboard"]
    private = read_json(d / "private" / "harness" / "leaderboard.json")
    assert board["overall"] == private["overall"] == overall
    for t, v in tasks.items():
        assert {k: board["tasks"][t][k] for k in v} == v
        assert private["tasks"][t]["score"] == v["score"] and private["tasks"][t]["correct"] == v["correct"]
    for e in private["per_example"]:
        assert e["score"] == next(r["score"] for r in recs if r["id"] == e["id"])
    return recs, private


def test_harness_prediction_replaced_is_consistent(tmp_path):
    _harness_O(tmp_path)
    BY_NAME["harness_prediction_replaced"].apply(tmp_path)
    recs, private = _consistent(tmp_path)
    assert recs[0]["score"] == 1.0
    assert private["per_example"][0]["prediction"] == "42"
    from evidence_audit.reading import sha256_text
    assert recs[0]["prediction_sha256"] == sha256_text("42")


def test_harness_target_to_wrong_answer_is_consistent(tmp_path):
    _harness_O(tmp_path)
    BY_NAME["harness_target_to_wrong_answer"].apply(tmp_path)
    recs, _ = _consistent(tmp_path)
    assert recs[0]["score"] == 1.0
    task_file = tmp_path / "private" / "harness" / "tasks" / "arithmetic.jsonl"
    ex = json.loads(task_file.read_text(encoding="utf-8").split("\n")[1])
    assert ex["targets"] == ["17 + 25 = 32."]
    from evidence_audit.reading import sha256_file
    sha = sha256_file(task_file, cached=False)
    assert read_json(tmp_path / "harness" / "config.json")["tasks"]["arithmetic"]["sha256"] == sha
    summary = read_json(tmp_path / "harness" / "summary.json")
    assert summary["leaderboard"]["tasks"]["arithmetic"]["sha256"] == sha
    assert summary["tasks_are_shipped_fixtures"]["arithmetic"] is False


LENIENT = {"duplicate_key_summary": "protocol/summary.json", "duplicate_key_record": "mctaco/records.jsonl",
           "nan_score": "options/records.jsonl", "huge_integer": "protocol/records.jsonl",
           "deep_nesting": "extraction/summary.json", "lone_surrogate": "harness/records.jsonl"}


@pytest.mark.parametrize("name", sorted(LENIENT))
def test_lenient_json_kinds_pass_a_lenient_reader_and_fail_the_strict_one(tmp_path, name):
    rel = LENIENT[name]
    rec = {"context_tokens": 22, "label": 1, "scores": [-1.5, -2.5], "task": "code", "condition": "base"}
    _write(tmp_path / rel, [rec, rec] if rel.endswith(".jsonl") else {"split": "smoke", "n_items": 2})
    BY_NAME[name].apply(tmp_path)
    text = (tmp_path / rel).read_text(encoding="utf-8")
    doc = text.split("\n")[0] if rel.endswith(".jsonl") else text
    if name in ("deep_nesting", "huge_integer"):
        with pytest.raises((RecursionError, ValueError)):     # what a lenient reader does: crash or refuse
            json.loads(doc)
    else:
        json.loads(doc)                                       # a lenient reader takes it silently
    with pytest.raises(Unreadable) as e:
        parse_strict(doc, rel)
    assert str(e.value).startswith(f"{rel}: line ") and "\n" not in str(e.value)


def test_invalid_utf8_kind_writes_a_byte_that_is_not_utf8(tmp_path):
    _write(tmp_path / "options" / "records.jsonl", [{"condition": "base", "idx": 1}])
    BY_NAME["invalid_utf8"].apply(tmp_path)
    assert b'"condition": "\xffbase"' in (tmp_path / "options" / "records.jsonl").read_bytes()


REPORT = ('<html><head><meta name="evidence-run-id" content="' + "ab" * 16 + '"></head><body><table><tr>'
          '<td class="num" data-src="protocol/summary.json#n_items" data-value="2">2</td>'
          '<td class="num" data-src="protocol/summary.json#independent.accuracy" data-value="0.5">0.500</td>'
          '</tr></table></body></html>\n')


@pytest.mark.parametrize("name, expect", [
    ("report_number_changed", 'data-value="9">9</td>'),
    ("report_text_changed", 'data-value="2">9</td>'),
    ("report_run_id", 'content="' + "ab" * 15 + 'a0"'),
])
def test_report_kinds(tmp_path, name, expect):
    (tmp_path / "report.html").write_text(REPORT, encoding="utf-8")
    BY_NAME[name].apply(tmp_path)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert expect in text and text != REPORT
    assert 'data-value="0.5">0.500</td>' in text               # only the first cell is touched


def test_report_kinds_not_applicable_without_cells(tmp_path):
    (tmp_path / "report.html").write_text("<html><td data-value='1'>1</td></html>", encoding="utf-8")
    for name in ("report_number_changed", "report_text_changed", "report_run_id"):
        with pytest.raises(tools.NotApplicable):
            BY_NAME[name].apply(tmp_path)


def test_seal_rederives_report_cells_from_the_edited_evidence(tmp_path):
    """The forger's cover-up: report.html's cells follow the edited summary (precision kept), other cells and the
    page around them are untouched; without MANIFEST.json nothing else is written."""
    _write(tmp_path / "protocol" / "summary.json", {"n_items": 3, "independent": {"accuracy": 0.75}})
    (tmp_path / "report.html").write_text(REPORT, encoding="utf-8")
    tools.seal(tmp_path)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'data-value="3">3</td>' in text and 'data-value="0.75">0.750</td>' in text
    assert text.replace('"3">3', '"2">2').replace('"0.75">0.750', '"0.5">0.500') == REPORT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["protocol", "report.html"]


def test_seal_manifest_only_leaves_the_report_alone(tmp_path):
    _write(tmp_path / "protocol" / "summary.json", {"n_items": 3, "independent": {"accuracy": 0.75}})
    (tmp_path / "report.html").write_text(REPORT, encoding="utf-8")
    tools.seal(tmp_path, "manifest")
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == REPORT


def test_shown_as_keeps_the_precision_of_the_cell():
    assert tools.shown_as("0.500", 0.75) == "0.750"
    assert tools.shown_as("2", 3) == "3"
    assert tools.shown_as("1.0000", None) == "\u2014"


def test_records_symlink_kind_points_outside_O(O):
    BY_NAME["records_symlink_outside"].apply(O)
    p = O / "protocol" / "records.jsonl"
    assert p.is_symlink() and O not in p.resolve().parents
    assert len(read_jsonl(p)) == 2


def test_directory_kinds(O):
    _write(O / "mctaco" / "summary.json", {})
    _write(O / "options" / "summary.json", {})
    BY_NAME["experiment_dir_deleted"].apply(O)
    BY_NAME["experiment_renamed_dotdir"].apply(O)
    assert not (O / "mctaco").exists() and not (O / "options").exists() and (O / ".options" / "summary.json").exists()
    BY_NAME["delete_private"].apply(O)
    assert not (O / "private").exists()


def test_manifest_kinds_change_the_manifest_only(O):
    man = {"format": "evidence-manifest/v1", "run_id": "ab" * 16, "experiments": ["protocol", "options"],
           "failed": [], "files": {"protocol/records.jsonl": {"size": 1, "sha256": "f" * 64}}, "private": {}}
    _write(O / "MANIFEST.json", man)
    BY_NAME["manifest_entry_changed"].apply(O)
    BY_NAME["manifest_experiment_dropped"].apply(O)
    got = read_json(O / "MANIFEST.json")
    assert got["files"]["protocol/records.jsonl"]["sha256"] != "f" * 64 and got["experiments"] == ["protocol"]
    assert all(k.named == tools.RAW for k in MUTATIONS if k.level == "manifest" and k.kind.startswith("manifest_"))


def test_stale_private_run_id(O):
    _write(O / "private" / "mctaco" / "run.json", {"experiment": "mctaco", "run_id": "ab" * 16})
    BY_NAME["stale_private_run_id"].apply(O)
    got = read_json(O / "private" / "mctaco" / "run.json")
    assert got["experiment"] == "mctaco" and got["run_id"] != "ab" * 16 and len(got["run_id"]) == 32


# ---- the runner's verdicts, on a fake audit --------------------------------------------------------------------------

def _row(level, check, status="PASS", msg=None):
    return {"experiment": "protocol", "level": level, "check": check, "status": status, "first_failure": msg}


def _fake_audit():
    """An audit whose result depends on a marker file the fake kinds write: the runner is tested, not the audit."""
    def audit(d, levels, cache, only=None, public_only=False, options=None, rebuild_page=True, page_memo=None):
        marker = d / "MARK"
        how = marker.read_text() if marker.exists() else "clean"
        checks = [_row("arithmetic", "summary.json values"), _row("identity", "private texts"),
                  _row("forward", "candidate scores")]
        result, code = "PASS", 0
        if how in ("named", "other"):
            name = "summary.json values" if how == "named" else "item selection"
            checks.append(_row("arithmetic", name, "FAIL", f"summary.json x: {how}"))
            result, code = "FAIL", 1
        elif how == "unreadable":
            raise Unreadable(f"{d}/protocol/summary.json: line 3: duplicate key 'x'")
        elif how == "incomplete":
            result, code = "INCOMPLETE: O/private/ absent", 1
        return {"checks": checks, "experiments": ["protocol"], "exit_code": code, "result": result}
    return audit


def _mark(how):
    return lambda d: (d / "MARK").write_text(how)


def _kinds(*specs, seal=None):
    """Fake kinds, raw only by default (seal=None): these tests are about the verdicts, not the cover-up."""
    return [tools.kind(f"k_{how}", "protocol", how, _mark(how), level, check, seal=seal)
            for how, level, check in specs]


def test_runner_exit_0_only_when_every_kind_is_caught_by_its_named_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(selftest, "audit", _fake_audit())
    (tmp_path / "O").mkdir()
    good = _kinds(("named", "arithmetic", "summary.json"), ("unreadable", "arithmetic", tools.READING),
                  ("incomplete", "arithmetic", tools.HEADLINE))
    rep = selftest.mutation_selftest(tmp_path / "O", None, kinds=good)
    assert [r["status"] for r in rep["mutations"]] == ["CAUGHT"] * 3, rep["mutations"]
    assert rep["exit_code"] == 0 and rep["clean"]["passed"]
    out = capsys.readouterr().out
    assert "k_named" in out and "arithmetic/summary.json values" in out and "exit 0" in out


@pytest.mark.parametrize("how, level, check, status", [
    ("other", "arithmetic", "summary.json", "CAUGHT*"),           # rejected, but by a check it does not name
    ("clean", "arithmetic", "summary.json", "NOT CAUGHT"),        # the audit passes the tampered copy
    ("named", "arithmetic", tools.READING, "CAUGHT*"),            # a row failed but the file was not refused
])
def test_runner_reports_each_failure_to_catch_and_exits_1(tmp_path, monkeypatch, capsys, how, level, check, status):
    monkeypatch.setattr(selftest, "audit", _fake_audit())
    (tmp_path / "O").mkdir()
    rep = selftest.mutation_selftest(tmp_path / "O", None,
                                     kinds=_kinds(("named", "arithmetic", "summary.json"), (how, level, check)))
    assert [r["status"] for r in rep["mutations"]] == ["CAUGHT", status]
    assert rep["exit_code"] == 1
    out = capsys.readouterr().out
    assert f"{status}: k_{how}" in out and "exit 1" in out


def test_runner_skips_a_kind_whose_experiment_or_level_is_absent_and_exits_1(tmp_path, monkeypatch):
    monkeypatch.setattr(selftest, "audit", _fake_audit())
    (tmp_path / "O").mkdir()
    kinds = [tools.kind("other_exp", "mctaco", "x", _mark("named"), "arithmetic", "summary.json", seal=None),
             tools.kind("no_model", "protocol", "x", lambda d: (_ for _ in ()).throw(tools.NotApplicable("absent")),
                        "arithmetic", "summary.json", seal=None)]
    rep = selftest.mutation_selftest(tmp_path / "O", None, kinds=kinds)
    assert [r["status"] for r in rep["mutations"]] == ["SKIPPED", "SKIPPED"]
    assert "no mctaco evidence" in rep["mutations"][0]["first_failure"]
    assert rep["exit_code"] == 1


def test_runner_reports_a_tamper_that_crashes_as_error(tmp_path, monkeypatch):
    monkeypatch.setattr(selftest, "audit", _fake_audit())
    (tmp_path / "O").mkdir()
    kinds = [tools.kind("crash", "protocol", "x", lambda d: 1 / 0, "arithmetic", "summary.json", seal=None)]
    rep = selftest.mutation_selftest(tmp_path / "O", None, kinds=kinds)
    assert rep["mutations"][0]["status"] == "ERROR" and "ZeroDivisionError" in rep["mutations"][0]["first_failure"]
    assert rep["exit_code"] == 1


def test_runner_fails_when_the_clean_copy_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(selftest, "audit", _fake_audit())
    (tmp_path / "O").mkdir()
    (tmp_path / "O" / "MARK").write_text("other")          # the untouched evidence itself fails
    rep = selftest.mutation_selftest(tmp_path / "O", None, kinds=_kinds(("named", "arithmetic", "summary.json")))
    assert not rep["clean"]["passed"] and rep["exit_code"] == 1


def test_runner_audits_each_copy_up_to_the_named_level(tmp_path, monkeypatch):
    seen = []
    fake = _fake_audit()

    def audit(d, levels, cache, only=None, public_only=False, options=None, rebuild_page=True, page_memo=None):
        seen.append((d.name, tuple(levels)))
        return fake(d, levels, cache, only, public_only, options)
    monkeypatch.setattr(selftest, "audit", audit)
    (tmp_path / "O").mkdir()
    selftest.mutation_selftest(tmp_path / "O", None, kinds=_kinds(("named", "identity", "private texts")))
    assert seen[0] == ("clean", ("arithmetic", "identity", "forward"))
    assert seen[1][1] == ("arithmetic", "identity")


def _deep_audit():
    """A fake audit in which MARK "deep" fails a row only when the identity level is requested."""
    fake = _fake_audit()

    def audit(d, levels, cache, only=None, public_only=False, options=None, rebuild_page=True, page_memo=None):
        if (d / "MARK").exists() and (d / "MARK").read_text() == "deep":
            rep = fake(d.parent / "clean", levels, cache)
            if "identity" in levels:
                rep["checks"].append(_row("identity", "private texts", "FAIL", "idx 1 sentence_sha256: differs"))
                rep.update(result="FAIL", exit_code=1)
            return rep
        return fake(d, levels, cache, only, public_only, options)
    return audit


def test_runner_audits_both_forms_and_escalates_until_a_level_rejects(tmp_path, monkeypatch):
    """Raw and resealed forms are audited separately; a form nothing rejects at its first levels is audited again
    with the next deeper one, and the row names the level that caught it."""
    monkeypatch.setattr(selftest, "audit", _deep_audit())
    monkeypatch.setattr(selftest, "manifest_check", lambda C, d: None)    # the fake O has no manifest to check
    (tmp_path / "O").mkdir()
    kinds = _kinds(("deep", "identity", "private texts"), ("named", "arithmetic", "summary.json"), seal=True)
    rep = selftest.mutation_selftest(tmp_path / "O", None, kinds=kinds)
    deep, named = rep["mutations"]
    assert (deep["raw"], deep["resealed"], deep["status"]) == ("identity", "identity", "CAUGHT"), deep
    assert deep["forms"]["raw"]["levels"] == ["arithmetic", "identity"]        # started at the default audit
    assert deep["forms"]["resealed"]["levels"] == ["arithmetic", "identity"]   # started at the named level
    assert (named["raw"], named["resealed"], named["status"]) == ("arithmetic", "arithmetic", "CAUGHT")
    assert named["forms"]["resealed"]["page"].startswith("not rebuilt")        # a row not reading the page caught it
    assert rep["exit_code"] == 0


def test_runner_a_form_no_level_rejects_is_not_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(selftest, "audit", _fake_audit())
    (tmp_path / "O").mkdir()
    rep = selftest.mutation_selftest(tmp_path / "O", None, kinds=_kinds(("clean", "arithmetic", "summary.json")))
    row = rep["mutations"][0]
    assert (row["raw"], row["resealed"], row["status"]) == ("NOT CAUGHT", "n/a", "NOT CAUGHT")
    assert rep["exit_code"] == 1


def test_a_level_that_runs_only_in_part_on_the_clean_copy_is_not_used():
    """Every audit of a level one of whose requested checks cannot run is INCOMPLETE, which would pass for a catch:
    such a level, and those below it, are left out, and the line says why."""
    full = {"checks": [_row("arithmetic", "a"), _row("identity", "b"), _row("forward", "c")]}
    assert selftest.runnable_levels(full) == (("arithmetic", "identity", "forward"), None)
    part = {"checks": full["checks"] + [dict(_row("identity", "tokenizer", "SKIPPED"), note="no tokenizer")]}
    levels, why = selftest.runnable_levels(part)
    assert levels == ("arithmetic",) and why == "identity: protocol tokenizer SKIPPED (no tokenizer)"
    unasked = {"checks": full["checks"] + [dict(_row("identity", "x", "SKIPPED"), note="n", requested=False)]}
    assert selftest.runnable_levels(unasked)[0] == ("arithmetic", "identity", "forward")
    none = {"checks": [_row("arithmetic", "a"), dict(_row("identity", "b", "SKIPPED"), note="no cache")]}
    assert selftest.runnable_levels(none)[0] == ("arithmetic",)


# ---- both forms on tiny real evidence: the real audit, report.py, the reseal ---------------------------------------

def _tiny_O(tmp_path):
    """The tiny harness evidence of test_audit.py with the command line run.py records, sealed: the real audit
    passes it (no model, no cache)."""
    from test_audit import _edit, tiny_harness_evidence

    out = tiny_harness_evidence(tmp_path / "O")
    _edit(out / "environment.json", lambda e: e.update(
        command_line=["run.py", "--cache", "c", "--out", "O", "--experiment", "harness"]))
    tools.seal(out, "manifest")
    return out


def _append_run_log(d):
    """More library chatter in run.log: a file listed in the manifest that no rule reads, so only the manifest can
    see this edit."""
    with open(tools.need(d / "run.log"), "a", encoding="utf-8") as f:
        f.write("more library chatter\n")


RUN_LOG_KIND = tools.kind("run_log_appended", "-", "run.log: a line appended", _append_run_log, "arithmetic",
                          "public files match MANIFEST.json", seal=True)


def test_resealed_forms_on_tiny_evidence_and_the_markdown_table(tmp_path):
    """A kind only the manifest sees is caught raw by the manifest and NOT CAUGHT resealed (the reseal and the page
    rebuild really happened); a summary edit is caught resealed by the arithmetic level without a page rebuild; a
    kind that edits MANIFEST.json has no resealed form; a page edit keeps its page. The markdown table lists them."""
    O = _tiny_O(tmp_path)
    kinds = [RUN_LOG_KIND, BY_NAME["harness_overall"], BY_NAME["manifest_entry_changed"],
             BY_NAME["report_number_changed"]]
    table = tmp_path / "table.md"
    rep = selftest.mutation_selftest(O, None, kinds=kinds, table_md=table, stream=open(tmp_path / "log", "w"))
    assert rep["clean"]["passed"], rep["clean"]
    got = {r["kind"]: (r["raw"], r["resealed"], r["status"]) for r in rep["mutations"]}
    assert got == {"run_log_appended": ("manifest", "NOT CAUGHT", "NOT CAUGHT"),
                   "harness_overall": ("manifest", "arithmetic", "CAUGHT"),
                   "manifest_entry_changed": ("manifest", "n/a", "CAUGHT"),
                   "report_number_changed": ("manifest", "arithmetic", "CAUGHT")}, got
    pages = {r["kind"]: r["forms"].get("resealed", {}).get("page") for r in rep["mutations"]}
    assert pages["run_log_appended"] == "rebuilt by report.py"
    assert pages["harness_overall"].startswith("not rebuilt")
    assert pages["report_number_changed"].startswith("kept")
    assert rep["exit_code"] == 1
    lines = table.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "| kind | experiment | expected level (check) | caught raw by | caught resealed by | status |"
    assert "| run_log_appended | - | arithmetic (public files match MANIFEST.json, resealed form) | manifest | " \
           "NOT CAUGHT | NOT CAUGHT |" in lines
    assert "| manifest_entry_changed | - | manifest (public files match MANIFEST.json, raw form) | " \
           "manifest | n/a | CAUGHT |" in lines
    assert lines[-1] == "Clean copy passed; 3/4 kinds CAUGHT; exit 1."


def test_table_goes_between_the_markers_of_a_page(tmp_path):
    from evidence_audit.mutations import table

    rep = {"mutations": [dict(selftest.new_row(RUN_LOG_KIND), raw="manifest", resealed="NOT CAUGHT",
                              status="NOT CAUGHT")], "clean": {"passed": True}, "exit_code": 1}
    (tmp_path / "m.json").write_text(json.dumps(rep), encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(f"# T\n\n{table.BEGIN}\nold table\n{table.END}\n\nafter\n", encoding="utf-8")
    assert table.main([str(tmp_path / "m.json"), "--into", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "old table" not in text and text.startswith(f"# T\n\n{table.BEGIN}\n| kind |")
    assert text.endswith(f"exit 1.\n{table.END}\n\nafter\n")
    page.write_text("no markers\n", encoding="utf-8")
    assert table.main([str(tmp_path / "m.json"), "--into", str(page)]) == 2
    assert page.read_text(encoding="utf-8") == "no markers\n"


# ---- the real thing ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_mutation_selftest_on_a_real_smoke_run(smoke_run, prepared_cache, tmp_path):
    out, _ = smoke_run
    O = tmp_path / "O"
    shutil.copytree(out, O, symlinks=True)
    proc = run_cli("audit.py", O, "--mutations", "--cache", prepared_cache, env={"EVAL_TORCH_THREADS": "1"},
                   timeout=3600)
    rep = json.loads((O / "audit.mutations.json").read_text(encoding="utf-8"))
    rows = rep["mutations"]
    assert len(rows) >= 40
    assert EXPERIMENTS <= set(rep["experiments"])
    assert rep["levels"] == ["arithmetic", "identity", "forward"]
    assert rep["clean"]["passed"], rep["clean"]
    missed = [(r["kind"], r["status"], r["raw"], r["resealed"], r["first_failure"]) for r in rows
              if r["status"] != "CAUGHT"]
    assert missed == [], missed
    assert {r["level"] for r in rows} == {"manifest", "arithmetic", "identity", "forward"}
    caught_at = {"manifest", "arithmetic", "identity", "forward", "reading", "INCOMPLETE"}
    assert all(r["raw"] in caught_at and r["resealed"] in caught_at | {"n/a"} for r in rows), rows
    by = {r["kind"]: r for r in rows}
    # the resealed form really is resealed: an edit the manifest rejects raw passes it once covered up
    assert (by["edit_summary_accuracy"]["raw"], by["edit_summary_accuracy"]["resealed"]) == ("manifest", "arithmetic")
    assert (by["private_text_edited_unsealed"]["raw"], by["private_text_edited_unsealed"]["resealed"]) == \
        ("manifest", "identity")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "MUTATIONS: " in proc.stdout and "-> exit 0" in proc.stdout
