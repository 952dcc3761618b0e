"""The evidence format (issue 27 point 8): run.py stamps every JSON evidence file with `evidence_format`, a JSONL
file has the format its MANIFEST.json declares (its lines are left as they were), and the audit, report.py and
run.py --merge refuse a format they do not read, or a file with none, on one line.

Fast: the three copies of the format agree, a fake run stamps every JSON file and no JSONL line, the audit and the
page refuse hand-made evidence of another format, the mutation kinds, shard files. Slow: a real smoke run of all
five experiments (the session's smoke_run) carries the current format in every JSON file, and a copy with one file changed to
format 2, or with the field removed, is refused on one line.
"""
import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from evidence_audit import driver
from evidence_audit import reading as audit_reading
from evidence_audit.mutations import MUTATIONS, NotApplicable
from evidence_audit.mutations.tools import READING
from evidence_report import page
from evidence_report import reading as report_reading
from experiments import evidence, shards
from resources import ResourceError
from test_audit import tiny_harness_evidence
from test_report import minimal_evidence
from test_run_safety import fake_experiment, fake_run  # noqa: F401  (fake_run is a fixture)

KINDS = {k.kind: k for k in MUTATIONS}


def set_format(path, value):
    """Rewrite a JSON file with its evidence_format set to `value` (None: removed)."""
    obj = json.loads(Path(path).read_text(encoding="utf-8"))
    obj.pop("evidence_format", None)
    if value is not None:
        obj["evidence_format"] = value
    Path(path).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def one_line(proc):
    """The one line a refusal prints on stderr (no traceback, nothing else)."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return lines[0]


# ---- the writer, the audit and the page agree -----------------------------------------------------------------------

def test_the_format_run_py_writes_is_one_the_audit_and_the_page_read():
    for reader in (audit_reading, report_reading):
        lo, hi = reader.READS_EVIDENCE_FORMATS
        assert reader.FORMAT_KEY == evidence.FORMAT_KEY == "evidence_format"
        assert type(lo) is int and type(hi) is int and lo <= evidence.EVIDENCE_FORMAT <= hi


def test_a_run_stamps_every_json_file_and_leaves_every_jsonl_line_as_it_was(fake_run, tmp_path, capsys):
    """Every JSON file of O (private run.json and the FAILED.json of a failed experiment too) carries the format;
    records.jsonl and the private texts hold exactly the lines they held before evidence was versioned."""
    records = [{"idx": 0, "score": 0.25}, {"idx": 1, "score": -1.5, "text": "é"}]
    modules = {"protocol": fake_experiment("protocol", records=records),
               "options": fake_experiment("options", fail=True)}
    out = tmp_path / "o"
    code, _, _ = fake_run(["--out", str(out)], modules, capsys)
    assert code == 1
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert {"MANIFEST.json", "environment.json", "options.FAILED.json", "protocol/summary.json",
            "private/protocol/run.json"} <= set(files)
    for rel in files:
        assert json.loads((out / rel).read_text())["evidence_format"] == evidence.EVIDENCE_FORMAT, rel
    expected = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    assert (out / "protocol" / "records.jsonl").read_text(encoding="utf-8") == expected
    assert (out / "private" / "protocol" / "texts.jsonl").read_text() == '{"idx": 0, "text": "t"}\n'


# ---- the audit -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, found", [
    (4, "evidence_format 4"), (1, "evidence_format 1"), (0, "evidence_format 0"), ("2", 'evidence_format "2"'),
    (True, "evidence_format true"), (2.0, "evidence_format 2.0"), (None, "no evidence_format (evidence written before its format was versioned)"),
])
def test_an_unknown_or_missing_format_is_refused_naming_file_version_and_range(value, found):
    obj = {"split": "smoke"} if value is None else {"split": "smoke", "evidence_format": value}
    assert audit_reading.format_refusal("O/protocol/summary.json", obj) == \
        f"O/protocol/summary.json: {found}; this audit reads evidence formats 2 to 3"
    assert report_reading.format_refusal("O/protocol/summary.json", obj) == \
        f"O/protocol/summary.json: {found}; this report reads evidence formats 2 to 3"
    for readable in (2, 3):         # format 3 moved local paths to O/private/<exp>/paths.json; 2 is still read
        assert audit_reading.format_refusal("x", {"evidence_format": readable}) is None
        assert report_reading.format_refusal("x", {"evidence_format": readable}) is None


def test_the_rules_see_the_evidence_without_its_format(tmp_path):
    """The strict checks (identity.json's fields, summary.json's values, MANIFEST.json's shape) pass on stamped
    evidence: the reader takes the format off once it has checked it."""
    out = tiny_harness_evidence(tmp_path / "O")
    ev = audit_reading.load_evidence(out, "harness")
    assert all("evidence_format" not in ev[k] for k in ("environment", "config", "identity", "summary", "stages"))
    rep = driver.audit(out, ("arithmetic",))
    assert rep["exit_code"] == 0, [r for r in rep["checks"] if r["status"] == "FAIL"]


@pytest.mark.parametrize("rel, value, found", [
    ("harness/summary.json", 4, "evidence_format 4"),
    ("MANIFEST.json", None, "no evidence_format"),
    ("private/harness/run.json", 4, "evidence_format 4"),
    ("private/harness/leaderboard.json", None, "no evidence_format"),
])
def test_the_audit_refuses_any_evidence_file_of_another_format(tmp_path, rel, value, found):
    out = tiny_harness_evidence(tmp_path / "O")
    set_format(out / rel, value)
    with pytest.raises(audit_reading.Unreadable) as e:
        driver.audit(out, ("arithmetic",))
    assert str(e.value).startswith(f"{out / rel}: {found}") and "\n" not in str(e.value)
    assert str(e.value).endswith("; this audit reads evidence formats 2 to 3")


@pytest.mark.parametrize("rel", ["harness/summary.json", "private/harness/run.json", "MANIFEST.json"])
def test_a_file_of_another_readable_format_than_the_manifests_is_refused(tmp_path, rel):
    """Formats 2 and 3 are both read, but one run writes one: a format 3 file in format 2 evidence (or the manifest
    alone relabelled) is refused on one line naming the file, its format and the manifest's, before any rule reads
    O by a format it is not."""
    out = tiny_harness_evidence(tmp_path / "O")       # format 2 evidence, made by hand
    set_format(out / rel, 3)
    with pytest.raises(audit_reading.Unreadable) as e:
        driver.audit(out, ("arithmetic",))
    if rel == "MANIFEST.json":
        assert str(e.value) == (f"{out / 'environment.json'}: evidence_format 2, but MANIFEST.json declares 3; one run "
                                "writes one evidence format (a file of another run, or edited)")
    else:
        assert str(e.value) == (f"{out / rel}: evidence_format 3, but MANIFEST.json declares 2; one run writes one "
                                "evidence format (a file of another run, or edited)")


def test_audit_py_prints_one_line_and_exits_2(tmp_path):
    out = tiny_harness_evidence(tmp_path / "O")
    (out / "harness.FAILED.json").write_text('{"experiment": "harness"}\n')     # a failure record of no format
    proc = run_cli("audit.py", out, timeout=300)
    assert proc.returncode == 2
    assert one_line(proc) == (f"error: unreadable evidence: {out / 'harness.FAILED.json'}: no evidence_format "
                              "(evidence written before its format was versioned); this audit reads evidence formats "
                              "2 to 3")
    assert not (out / "audit.json").exists()


def test_what_is_not_evidence_has_no_format_to_check(tmp_path):
    """A JSON file in a dot-directory, or a link, is the manifest level's to name (FAIL), not a format refusal."""
    out = tiny_harness_evidence(tmp_path / "O")
    (out / ".stash").mkdir()
    (out / ".stash" / "summary.json").write_text("{}\n")
    (out / "harness" / "other.json").symlink_to(out / ".stash" / "summary.json")
    assert out / "harness" / "summary.json" in audit_reading.evidence_json_files(out)
    assert not {out / ".stash" / "summary.json", out / "harness" / "other.json"} & \
        set(audit_reading.evidence_json_files(out))
    rep = driver.audit(out, ("arithmetic",))
    assert rep["exit_code"] == 1 and rep["result"] == "FAIL"


def test_the_lm_eval_audit_is_not_ours_to_version():
    """audit.py --lm-eval reads lm-eval's own files: nothing of the evidence format is in that package."""
    lmeval = Path(audit_reading.__file__).parent / "lmeval"
    assert not [p for p in lmeval.rglob("*.py") if "evidence_format" in p.read_text() or
                "check_formats" in p.read_text()]


# ---- the mutation kinds ----------------------------------------------------------------------------------------------

def test_format_kinds_change_one_file_and_are_caught_by_strict_reading(tmp_path):
    d = tmp_path / "O"
    (d / "protocol").mkdir(parents=True)
    (d / "protocol" / "summary.json").write_text('{"evidence_format": 2, "split": "smoke"}\n')
    (d / "environment.json").write_text('{"evidence_format": 2, "run_id": "r"}\n')
    newer, missing = KINDS["evidence_format_newer"], KINDS["evidence_format_missing"]
    assert (newer.level, newer.check, missing.level, missing.check) == ("arithmetic", READING, "arithmetic", READING)
    newer.apply(d)
    missing.apply(d)
    assert json.loads((d / "protocol" / "summary.json").read_text()) == {"evidence_format": 4, "split": "smoke"}
    assert json.loads((d / "environment.json").read_text()) == {"run_id": "r"}
    with pytest.raises(NotApplicable):
        missing.apply(d)            # nothing left to remove


# ---- the page --------------------------------------------------------------------------------------------------------

def test_the_page_does_not_show_the_format(tmp_path):
    out, _ = minimal_evidence(tmp_path)
    assert "evidence_format" not in page.build(out)


def test_a_file_the_page_cannot_parse_is_still_an_error_box_not_a_refusal(tmp_path):
    """Only an object has a format to refuse: a truncated file or a list stays the view's error box."""
    out, _ = minimal_evidence(tmp_path)
    (out / "options").mkdir()
    (out / "options" / "summary.json").write_text("[1, 2]\n")
    (out / "novel" / "identity.json").write_text('{"run_id": ')
    text = page.build(out)
    assert 'class="render-error"' in text and '<section id="novel">' in text


@pytest.mark.parametrize("rel, value, found", [
    ("novel/summary.json", 4, "evidence_format 4"),
    ("novel/stages.json", None, "no evidence_format"),
    ("environment.json", 7, "evidence_format 7"),
])
def test_report_py_refuses_evidence_of_another_format_on_one_line(tmp_path, rel, value, found):
    out, _ = minimal_evidence(tmp_path)
    set_format(out / rel, value)
    proc = run_cli("report.py", out, timeout=300)
    assert proc.returncode == 2
    assert one_line(proc).startswith(f"report.py: error: {out / rel}: {found}")
    assert one_line(proc).endswith("; this report reads evidence formats 2 to 3")
    assert not (out / "report.html").exists()


# ---- shard files -----------------------------------------------------------------------------------------------------

def test_a_shard_file_carries_the_format_and_merge_refuses_another(tmp_path):
    shards.write_shard(tmp_path, 1, 2, {"args": {}}, {}, {"run_id": "r"})
    path = tmp_path / shards.NAME
    assert json.loads(path.read_text())["evidence_format"] == evidence.EVIDENCE_FORMAT
    for value, found in ((2, "evidence_format 2"), (None, "no evidence_format")):
        set_format(path, value)
        with pytest.raises(ResourceError, match=f"^--merge {path}: {found}; this run.py merges evidence format 3 "):
            shards.read_shard(tmp_path)


# ---- a real run ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_every_json_file_of_a_fresh_run_carries_the_format_and_no_jsonl_line_does(smoke_run):
    out, _ = smoke_run
    json_files = sorted(out.rglob("*.json"))
    assert len(json_files) >= 30        # 5 experiments x 4, their run.json, leaderboards, environment, manifest, ...
    for p in json_files:
        assert json.loads(p.read_text())["evidence_format"] == evidence.EVIDENCE_FORMAT, p
    for p in out.rglob("*.jsonl"):
        assert "evidence_format" not in p.read_text(encoding="utf-8"), p
    assert {p.relative_to(out).as_posix() for p in json_files} >= {
        "MANIFEST.json", "environment.json", "extraction.preregistration.json", "harness/leaderboard.json",
        "private/harness/leaderboard.json", "private/protocol/run.json",
        *(f"{e}/{f}.json" for e in ("protocol", "options", "harness", "mctaco", "extraction")
          for f in ("config", "identity", "summary", "stages"))}


@pytest.mark.slow
@pytest.mark.parametrize("rel, value, found", [
    ("protocol/summary.json", 4, "evidence_format 4"),
    ("extraction.preregistration.json", None,
     "no evidence_format (evidence written before its format was versioned)"),
])
def test_real_evidence_of_another_format_is_refused_on_one_line(smoke_run, tmp_path, rel, value, found):
    out = tmp_path / "O"
    shutil.copytree(smoke_run[0], out)
    set_format(out / rel, value)
    proc = run_cli("audit.py", out, timeout=900)
    assert proc.returncode == 2
    assert one_line(proc) == (f"error: unreadable evidence: {out / rel}: {found}; this audit reads evidence formats "
                              "2 to 3")
    proc = run_cli("report.py", out, timeout=300)
    if rel.startswith("protocol/"):          # the page reads the experiments' files, not the pre-registration
        assert proc.returncode == 2 and f"{out / rel}: {found}; this report reads" in one_line(proc)
