"""Tamper kinds for O as a whole: the manifest and the files it seals, files the per-experiment rules do not read
(environment.json, report.html, O/private/<exp>/run.json), directories deleted, renamed or added, links and
special files, JSON a lenient reader would accept (duplicate keys, NaN, deep nesting, huge integers, lone
surrogates, bytes that are not UTF-8), and evidence of a format the audit does not read (or of none)."""
import os
import re
import shutil
from pathlib import Path

from evidence_audit.checks import ARITHMETIC, MANIFEST_LEVEL
from evidence_audit.mutations.tools import (GLOBAL, HEADLINE, READING, NotApplicable, edit_text, flip_hex,
                                            json_file, kind, need, other_run_id)
from evidence_audit.reading import FORMAT_KEY, READS_EVIDENCE_FORMATS

RUN_ID = "run id (MANIFEST.json"
PUBLIC = "public files match MANIFEST.json"
PRIVATE = "private files match MANIFEST.json"
LISTED = "experiments listed in MANIFEST.json"
ODD = "no symlinks or special files"
REPORT = "report.html"
ENV = "environment.json consistency"


# ---- the manifest and what it seals ----------------------------------------------------------------------------------

def m_manifest_entry(o):
    rel = "protocol/records.jsonl" if "protocol/records.jsonl" in o["files"] else sorted(o["files"])[0]
    o["files"][rel]["sha256"] = flip_hex(o["files"][rel]["sha256"])


def m_manifest_drop_experiment(o):
    if len(o["experiments"]) < 2:
        raise NotApplicable("MANIFEST.json lists fewer than two experiments")
    o["experiments"] = o["experiments"][:-1]


def m_rename_to_dotdir(exp):
    def apply(d):
        os.rename(need(d / exp), d / f".{exp}")
    return apply


def m_symlink_outside(rel):
    """O/rel replaced by a link to an identical copy outside O (whose bytes can then change unseen)."""
    def apply(d):
        target = Path(f"{d}.outside-{rel.replace('/', '-')}")
        shutil.copy(need(d / rel), target)
        (d / rel).unlink()
        (d / rel).symlink_to(target)
    return apply


def m_fifo(d):
    os.mkfifo(need(d / "private" / "options") / "extra.fifo")


def m_private_leftover(d):
    tmp = need(d / "private") / ".tmp-protocol-x"
    tmp.mkdir()
    shutil.copy(need(d / "private" / "protocol" / "texts.jsonl"), tmp / "texts.jsonl")


def m_private_text_unsealed(d):
    edit_text(d, "private/mctaco/texts.jsonl", lambda t: t.replace('"answer": "', '"answer": "x', 1))


def m_public_unsealed(d):
    edit_text(d, "options/records.jsonl", lambda t: re.sub(r'"correct": (\d)', lambda m: f'"correct": {1 - int(m[1])}',
                                                           t, count=1))


def manifest_kinds():
    return [
        kind("delete_manifest", GLOBAL, "delete MANIFEST.json", lambda d: need(d / "MANIFEST.json").unlink(),
             MANIFEST_LEVEL, "MANIFEST.json present", seal=False),
        kind("manifest_entry_changed", GLOBAL, "MANIFEST.json: one file's sha256 changed",
             json_file("MANIFEST.json", m_manifest_entry), MANIFEST_LEVEL, PUBLIC, seal=False),
        kind("manifest_experiment_dropped", GLOBAL, "MANIFEST.json: the last experiment removed from the list",
             json_file("MANIFEST.json", m_manifest_drop_experiment), MANIFEST_LEVEL, LISTED, seal=False),
        kind("public_file_edited_unsealed", "options", "options/records.jsonl: one correctness flipped, manifest "
             "left as it was", m_public_unsealed, MANIFEST_LEVEL, PUBLIC, seal=False),
        kind("private_text_edited_unsealed", "mctaco", "private/mctaco/texts.jsonl: an answer edited, manifest left "
             "as it was", m_private_text_unsealed, MANIFEST_LEVEL, PRIVATE, seal=False),
        kind("add_dotfile", GLOBAL, "add O/.hidden", lambda d: (d / ".hidden").write_text("x\n"), MANIFEST_LEVEL,
             PUBLIC, seal=False),
        kind("add_dotdir", GLOBAL, "add O/.extra/notes.json", lambda d: (d / ".extra").mkdir() or
             (d / ".extra" / "notes.json").write_text("{}\n"), MANIFEST_LEVEL, PUBLIC, seal=False),
        kind("experiment_dir_deleted", "mctaco", "delete O/mctaco/ (manifest rewritten to match the files)",
             lambda d: shutil.rmtree(need(d / "mctaco")), MANIFEST_LEVEL, LISTED),
        kind("experiment_renamed_dotdir", "options", "rename O/options/ to O/.options/",
             m_rename_to_dotdir("options"), MANIFEST_LEVEL, LISTED, seal=False),
        kind("records_symlink_outside", "protocol", "protocol/records.jsonl replaced by a symlink to a copy "
             "outside O", m_symlink_outside("protocol/records.jsonl"), MANIFEST_LEVEL, ODD, seal=False),
        kind("private_symlink_outside", "extraction", "private/extraction/generations.jsonl replaced by a symlink to "
             "a copy outside O", m_symlink_outside("private/extraction/generations.jsonl"), MANIFEST_LEVEL, ODD,
             seal=False),
        kind("failure_record_added", "options", "O/options.FAILED.json added (manifest rewritten to list the file)",
             lambda d: (d / "options.FAILED.json").write_text(
                 f'{{"{FORMAT_KEY}": {READS_EVIDENCE_FORMATS[1]}, "experiment": "options"}}\n'),
             MANIFEST_LEVEL, LISTED),
        kind("fifo_in_private", "options", "a named pipe in O/private/options/", m_fifo, MANIFEST_LEVEL, ODD,
             seal=False),
        kind("private_tmp_leftover", "protocol", "O/private/.tmp-protocol-x/ left with a copy of the texts",
             m_private_leftover, MANIFEST_LEVEL, PRIVATE, seal=False),
        kind("delete_private", GLOBAL, "delete O/private/ (the audit must not print a bare PASS)",
             lambda d: shutil.rmtree(need(d / "private")), ARITHMETIC, HEADLINE),
    ]


# ---- run ids, environment.json, report.html --------------------------------------------------------------------------

def m_env(field, fn):
    return json_file("environment.json", lambda o: o.update({field: fn(o[field])}) if field in o else _absent(field))


def _absent(field):
    raise NotApplicable(f"environment.json has no {field}")


def m_run_json(exp, field, fn):
    return json_file(f"private/{exp}/run.json", lambda o: o.update({field: fn(o.get(field))}))


CELL = re.compile(r'<(\w+)(?=[^>]*\bdata-src="[^"]*")[^>]*\bdata-value="(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"[^>]*>'
                  r'([^<]*)</\1>')


def m_report_cell(change_value):
    """The first numeric cell of report.html: its shown text (and, with change_value, its data-value too: the cell
    stays self-consistent) changed to another number."""
    def edit(text):
        m = CELL.search(text)
        if m is None:
            raise NotApplicable("report.html has no numeric cell with data-src and data-value")
        v = float(m[2])
        new = str(int(v) + 7) if re.fullmatch(r"-?\d+", m[2]) else f"{v + 0.25:.4f}"
        tag = m[0][:m[0].index(">") + 1]
        if change_value:
            tag = tag.replace(f'data-value="{m[2]}"', f'data-value="{new}"')
        return text[:m.start()] + tag + new + f"</{m[1]}>" + text[m.end():]
    return lambda d: edit_text(d, "report.html", edit)


def m_report_run_id(text):
    new, n = re.subn(r'(<meta name="evidence-run-id" content=")([0-9a-f]+)(")',
                     lambda m: m[1] + other_run_id(m[2]) + m[3], text, count=1)
    if not n:
        raise NotApplicable("report.html has no evidence-run-id meta")
    return new


def identity_kinds():
    return [
        kind("environment_commit", GLOBAL, "environment.json: git_commit changed (contradicts every identity.json)",
             m_env("git_commit", flip_hex), ARITHMETIC, ENV),
        kind("environment_dirty", GLOBAL, "environment.json: git_dirty flipped",
             m_env("git_dirty", lambda v: not v), ARITHMETIC, ENV),
        kind("environment_code_hash", GLOBAL, "environment.json: code_sha256 changed",
             m_env("code_sha256", flip_hex), ARITHMETIC, ENV),
        kind("environment_run_id", GLOBAL, "environment.json: run_id of another run", m_env("run_id", other_run_id),
             MANIFEST_LEVEL, RUN_ID),
        kind("identity_run_id", "extraction", "extraction/identity.json: run_id of another run",
             json_file("extraction/identity.json", lambda o: o.update(run_id=other_run_id(o.get("run_id")))),
             MANIFEST_LEVEL, RUN_ID),
        kind("stale_private_run_id", "mctaco", "private/mctaco/run.json: run_id of another run (a stale private "
             "half)", m_run_json("mctaco", "run_id", other_run_id), MANIFEST_LEVEL, RUN_ID),
        kind("private_run_json_experiment", "harness", "private/harness/run.json: names another experiment",
             m_run_json("harness", "experiment", lambda v: "protocol"), MANIFEST_LEVEL, RUN_ID),
        kind("report_number_changed", GLOBAL, "report.html: a number cell's data-value and text changed together",
             m_report_cell(True), ARITHMETIC, REPORT, seal="manifest"),
        kind("report_text_changed", GLOBAL, "report.html: a number cell's shown text changed (data-value kept)",
             m_report_cell(False), ARITHMETIC, REPORT, seal="manifest"),
        kind("report_run_id", GLOBAL, "report.html: evidence-run-id meta of another run",
             lambda d: edit_text(d, "report.html", m_report_run_id), ARITHMETIC, REPORT, seal="manifest"),
    ]


# ---- lenient JSON --------------------------------------------------------------------------------------------------

def first_line(fn):
    """Edit the text of the first line of a JSONL file."""
    def edit(text):
        head, sep, rest = text.partition("\n")
        return fn(head) + sep + rest
    return edit


def sub1(pattern, repl):
    def fn(text):
        new, n = re.subn(pattern, repl, text, count=1)
        if not n:
            raise NotApplicable(f"no match for {pattern}")
        return new
    return fn


def m_invalid_utf8(d):
    p = need(d / "options" / "records.jsonl")
    data = p.read_bytes()
    i = data.index(b'"condition": "') + len(b'"condition": "')
    p.write_bytes(data[:i] + b"\xff" + data[i:])


def text_edit(rel, fn, line1=False):
    """Edit the raw text of O/rel (only its first line with line1)."""
    return lambda d: edit_text(d, rel, first_line(fn) if line1 else fn)


def prepend_key(text):
    """A first member in the file's first object (JSON text starting with "{")."""
    return lambda t: t.replace("{", "{" + text, 1)


def lenient_kinds():
    return [
        kind("duplicate_key_summary", "protocol", "summary.json: a second \"split\" key (a lenient reader keeps the "
             "last)", text_edit("protocol/summary.json", prepend_key('\n "split": "confirm",')), ARITHMETIC, READING),
        kind("duplicate_key_record", "mctaco", "records.jsonl line 1: a second \"label\" key",
             text_edit("mctaco/records.jsonl", prepend_key('"label": 0, '), line1=True), ARITHMETIC, READING),
        kind("nan_score", "options", "records.jsonl line 1: a score written as NaN",
             text_edit("options/records.jsonl", sub1(r'"scores": \[[^,\]]+', '"scores": [NaN'), line1=True),
             ARITHMETIC, READING),
        kind("huge_integer", "protocol", "records.jsonl line 1: context_tokens of 5000 digits",
             text_edit("protocol/records.jsonl", sub1(r'"context_tokens": \d+', '"context_tokens": ' + "9" * 5000),
                       line1=True), ARITHMETIC, READING),
        kind("deep_nesting", "extraction", "summary.json: a value nested 100000 arrays deep",
             text_edit("extraction/summary.json", prepend_key('\n "deep": ' + "[" * 100000 + "]" * 100000 + ",")),
             ARITHMETIC, READING),
        kind("lone_surrogate", "harness", "records.jsonl line 1: a string with a lone surrogate \\ud800",
             text_edit("harness/records.jsonl", sub1(r'"task": "', r'"task": "\\ud800'), line1=True),
             ARITHMETIC, READING),
        kind("invalid_utf8", "options", "records.jsonl: a byte 0xff inside a string", m_invalid_utf8,
             ARITHMETIC, READING),
    ]


# ---- the evidence format ---------------------------------------------------------------------------------------------

def m_format(value):
    """The evidence_format of a JSON file set to `value` (None: removed, as in evidence written before versioning)."""
    def edit(o):
        if FORMAT_KEY not in o:
            raise NotApplicable(f"the file has no {FORMAT_KEY}")
        if value is None:
            del o[FORMAT_KEY]
        else:
            o[FORMAT_KEY] = value
    return edit


def format_kinds():
    newer = READS_EVIDENCE_FORMATS[1] + 1
    return [
        kind("evidence_format_newer", "protocol", f"summary.json: {FORMAT_KEY} {newer}, a format this audit does "
             "not read", json_file("protocol/summary.json", m_format(newer)), ARITHMETIC, READING),
        kind("evidence_format_missing", GLOBAL, f"environment.json: {FORMAT_KEY} removed (evidence written before "
             "the format was versioned)", json_file("environment.json", m_format(None)), ARITHMETIC, READING),
    ]


def file_kinds():
    return manifest_kinds() + identity_kinds() + lenient_kinds() + format_kinds()
