"""Tamper kinds for O as a whole: the manifest and the files it seals, files the per-experiment rules do not read
(environment.json, report.html, O/private/<exp>/run.json), directories deleted, renamed or added, links and
special files, JSON a lenient reader would accept (duplicate keys, NaN, deep nesting, huge integers, lone
surrogates, bytes that are not UTF-8), evidence of a format the audit does not read (or of none), and what a
resealing forger deletes or adds where only the manifest used to look (an experiment, O/private, a public note,
private text made public, a page that shows numbers no cell vouches for, per-rank facts, a forged audit.json)."""
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
             json_file("MANIFEST.json", m_manifest_entry), MANIFEST_LEVEL, PUBLIC, seal=None),
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


# ---- what a resealing forger does that only the manifest used to see -------------------------------------------------
# Each names the check written for it (all at the arithmetic level, none reading MANIFEST.json); the raw form of each
# is caught by the manifest level.

RAN = "experiments the recorded command ran"
PRIVATE_EXPECTED = "private evidence each experiment writes"
PUBLIC_RULES = "public files run.py writes"
NO_LEAK = "no private text in the public part"
ENV_RANKS = "environment.json data_parallel"


def m_remove_experiment(exp):
    """O/<exp>/ and O/private/<exp>/ deleted, and <exp> taken off MANIFEST.json's list of experiments."""
    def apply(d):
        shutil.rmtree(need(d / exp))
        shutil.rmtree(need(d / "private" / exp))
        json_file("MANIFEST.json", lambda o: o.update(experiments=[e for e in o["experiments"] if e != exp]))(d)
    return apply


def m_private_removed_listed_empty(d):
    shutil.rmtree(need(d / "private"))
    json_file("MANIFEST.json", lambda o: o.update(private={}))(d)


def m_private_text_public(d):
    """run.log (a file every run writes) replaced by a copy of a private texts file."""
    shutil.copy(need(d / "private" / "protocol" / "texts.jsonl"), need(d / "run.log"))


def m_report_page(fn, what):
    """report.html edited by fn(text) -> new text (NotApplicable when fn finds nothing to edit)."""
    def edit(text):
        new = fn(text)
        if new == text:
            raise NotApplicable(f"report.html: {what}")
        return new
    return lambda d: edit_text(d, "report.html", edit)


def unsourced_cell(text):
    """The first number cell loses its data-src and data-value and shows another number: no longer a cell the audit
    compares, still a number a reader sees."""
    m = CELL.search(text)
    if m is None:
        return text
    tag = re.sub(r'\sdata-(src|value)="[^"]*"', "", m[0][:m[0].index(">") + 1])
    return text[:m.start()] + tag + "99.9999" + f"</{m[1]}>" + text[m.end():]


def added_script(text):
    return text.replace("</body>", "<script>document.querySelectorAll('td.num').forEach(c => c.textContent = "
                                   "'1.0000')</script></body>", 1)


def added_style_content(text):
    return text.replace("</head>", '<style>td.num::after { content: "0.9999"; }</style></head>', 1)


def m_env_world_size(env):
    """environment.json data_parallel claims one rank more (a one-process run: a torchrun run of two ranks)."""
    dp = env.get("data_parallel")
    if dp is None:
        env["data_parallel"] = {"mode": "distributed", "world_size": 2, "launcher": "torchrun", "backend": "gloo",
                                "rule": "whole batches", "ranks": [fake_rank(0), fake_rank(1)]}
    else:
        dp["ranks"].append(dict(dp["ranks"][-1], rank=len(dp["ranks"])))
        dp["world_size"] = len(dp["ranks"])


def fake_rank(k):
    return {"rank": k, "host": "node", "pid": 1000 + k, "wall_s": 10.0, "peak_rss_bytes": 1 << 30}


def m_env_negative_rss(env):
    """One rank's peak_rss_bytes in environment.json negative (one-process evidence has no ranks: the forged
    two-rank block of m_env_world_size is added first, the last rank's RSS then made negative)."""
    if env.get("data_parallel") is None:
        m_env_world_size(env)
    env["data_parallel"]["ranks"][-1]["peak_rss_bytes"] = -4096


def m_audit_json_pass(d):
    """An edit the arithmetic level catches, and O/audit.json claiming the audit passed it."""
    json_file("protocol/summary.json", lambda o: o["independent"].update(accuracy=1 - o["independent"]["accuracy"]
                                                                         if o["independent"]["accuracy"] != 0.5
                                                                         else 0.25))(d)
    (d / "audit.json").write_text('{"audit_format": 1, "result": "PASS", "exit_code": 0, "levels": ["arithmetic", '
                                  '"identity", "forward"], "checks": []}\n', encoding="utf-8")


def forger_kinds():
    return [
        kind("experiment_removed_resealed", "options", "O/options/ and O/private/options/ deleted, options taken "
             "off MANIFEST.json's experiments", m_remove_experiment("options"), ARITHMETIC, RAN),
        kind("private_removed_manifest_emptied", GLOBAL, "O/private/ deleted and MANIFEST.json \"private\": {} (the "
             "audit must not print a bare PASS)", m_private_removed_listed_empty, ARITHMETIC, HEADLINE),
        kind("public_notes_added", "protocol", "protocol/notes.md added (a public file no rule knows)",
             lambda d: (need(d / "protocol") / "notes.md").write_text("reviewed by hand: all good\n"),
             ARITHMETIC, PUBLIC_RULES),
        kind("private_texts_in_run_log", "protocol", "run.log replaced by a copy of private/protocol/texts.jsonl",
             m_private_text_public, ARITHMETIC, NO_LEAK),
        kind("report_cell_unsourced", GLOBAL, "report.html: a number cell's data-src and data-value removed, "
             "another number shown", m_report_page(unsourced_cell, "no number cell"), ARITHMETIC, REPORT,
             seal="manifest"),
        kind("report_script_added", GLOBAL, "report.html: a <script> that rewrites every number cell",
             m_report_page(added_script, "no </body>"), ARITHMETIC, REPORT, seal="manifest"),
        kind("report_style_content", GLOBAL, "report.html: a <style> whose td.num::after content shows a number",
             m_report_page(added_style_content, "no </head>"), ARITHMETIC, REPORT, seal="manifest"),
        kind("environment_world_size", GLOBAL, "environment.json: data_parallel claims one rank more than the run "
             "had", json_file("environment.json", m_env_world_size), ARITHMETIC, ENV_RANKS),
        kind("environment_rank_rss_negative", GLOBAL, "environment.json: a rank's peak_rss_bytes negative",
             json_file("environment.json", m_env_negative_rss), ARITHMETIC, ENV_RANKS),
        kind("audit_json_forged_pass", "protocol", "protocol/summary.json accuracy edited and O/audit.json "
             "claiming PASS (the verdict is recomputed, never read)", m_audit_json_pass, ARITHMETIC,
             "summary.json values"),
    ]


def file_kinds():
    return manifest_kinds() + identity_kinds() + lenient_kinds() + format_kinds() + forger_kinds()
