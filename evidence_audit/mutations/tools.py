"""What every tamper kind is made of: the Kind record, edits of JSON / JSONL / raw text in a copy of O, and the
forger's cover-ups after an edit: report.html rebuilt by report.py (rebuild_page), MANIFEST.json resealed
(seal, with evidence_audit.manifest.reseal).

A kind names the level and the check row that must catch it, and the form of the forgery that name speaks of (see
Kind). Levels are the audit's row levels: "manifest" and "arithmetic" run in every audit (`audit.py O`),
"identity" needs --tokens, "forward" needs --forward. Two catchers are not check rows: READING (the strict reader
refuses the file: exit 2, one line) and HEADLINE (the verdict is INCOMPLETE, exit 1, although no row failed).
"""
import json
import re
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

from evidence_audit.checks import MISSING, get, same
from evidence_audit.definitions import is_num
from evidence_audit.manifest import MANIFEST, reseal
from evidence_audit.reading import Unreadable, read_json, read_jsonl
from evidence_audit.report_page import NUMBER, Evidence

READING = "strict reading (exit 2)"
HEADLINE = "headline INCOMPLETE"
GLOBAL = "-"             # the experiment column of a kind that tampers with O as a whole

# Every kind is run in two forms (evidence_audit.mutations.selftest): "raw", the edit alone, and "resealed", the edit
# covered up by a forger who rebuilds what is derived (report.html by report.py, then MANIFEST.json resealed, private
# digests included). `named`: the form the named level and check speak of ("resealed" for most kinds: the row shows
# what the levels below the manifest catch on their own; "raw" for kinds that attack what the manifest seals).
# `cover`: how the resealed form is made: "page" (report.html rebuilt, then the reseal), "manifest" (the reseal only:
# the kind tampers with report.html itself, which a rebuild would undo), None (no resealed form: the kind tampers
# with MANIFEST.json itself, which a reseal would undo).
Kind = namedtuple("Kind", "kind experiment what apply level check named cover")
RAW, RESEALED = "raw", "resealed"
PAGE, MANIFEST_ONLY = "page", "manifest"
SEALS = {True: (RESEALED, PAGE), "manifest": (RESEALED, MANIFEST_ONLY), False: (RAW, PAGE), None: (RAW, None)}


def kind(name, experiment, what, apply, level, check, seal=True):
    """A Kind; seal says which form its level and check name and how its resealed form is made: True (the resealed
    form, page rebuilt), "manifest" (the resealed form, page left as the kind made it), False (the raw form; the
    resealed form rebuilds the page), None (the raw form; no resealed form)."""
    return Kind(name, experiment, what, apply, level, check, *SEALS[seal])


class NotApplicable(Exception):
    """The evidence lacks what this kind tampers with (the row is SKIPPED, which counts as not caught)."""


def seal(d, how=True):
    """A quick cover-up for tests: report.html's number cells re-derived in process from the edited evidence (unless
    how == "manifest"; rederive_report, an approximation of report.py that touches only number cells), then
    MANIFEST.json rewritten to match every file, private digests included (nothing when O has no MANIFEST.json).
    The self-test's resealed form calls seal(d, "manifest") after rebuild_page, the page report.py itself writes."""
    if how is True:
        rederive_report(Path(d))
    if (Path(d) / MANIFEST).is_file():
        reseal(d)


REPORT_PY = Path(__file__).resolve().parents[2] / "report.py"


def rebuild_page(d):
    """report.html written again by report.py from the evidence now under d, in a subprocess of this interpreter
    (the audit imports nothing of the page builder). Returns None when the page was written, else report.py's last
    line on stderr: it refused the edited evidence, the old page stays, as it would for a forger."""
    proc = subprocess.run([sys.executable, str(REPORT_PY), str(d)], capture_output=True, text=True,
                          cwd=REPORT_PY.parent)
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1].replace(str(d), "O") if lines else f"report.py exit {proc.returncode}"


REPORT_CELL = re.compile(r'<(\w+)([^>]*?\bdata-src="([^"]*)"[^>]*?\bdata-value="([^"]*)"[^>]*)>([^<]*)</\1>')


def rederive_report(d):
    """Every number cell of report.html whose data-src now holds another value shows that value (data-value,
    title and text, at the precision the cell showed): what report.py would write from the edited evidence."""
    p = d / "report.html"
    if not p.is_file():
        return
    ev = Evidence(d)

    def fix(m):
        tag, attrs, src, shown, text = m.groups()
        try:
            value, _ = ev.value(src)
        except Unreadable:                     # a lenient-JSON kind: the file it names is no longer readable
            return m[0]
        if value is MISSING or not (value is None or is_num(value)):
            return m[0]
        try:
            old = json.loads(shown)
        except ValueError:
            return m[0]
        if same(old, value):
            return m[0]
        new = json.dumps(value)
        attrs = attrs.replace(f'data-value="{shown}"', f'data-value="{new}"').replace(f'title="{shown}"',
                                                                                      f'title="{new}"')
        return f"<{tag}{attrs}>{shown_as(text, value)}</{tag}>"
    p.write_text(REPORT_CELL.sub(fix, p.read_text(encoding="utf-8")), encoding="utf-8")


def shown_as(text, value):
    """`value` written as the cell's text showed its old value: the same number of decimals."""
    if value is None:
        return "—"
    shown = NUMBER.search(text)
    decimals = len(shown[0].split(".")[1]) if shown and "." in shown[0] and "e" not in shown[0].lower() else None
    new = str(value) if decimals is None else f"{value:.{decimals}f}"
    return text.replace(shown[0], new, 1) if shown else new


def need(path):
    if not Path(path).exists():
        raise NotApplicable(f"{Path(path).name} absent from this evidence")
    return Path(path)


def dump_json(obj):
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows),
                          encoding="utf-8")


def edit_json(d, rel, fn):
    """fn edits the parsed object in place (or returns a replacement)."""
    p = need(Path(d) / rel)
    obj = read_json(p)
    new = fn(obj)
    p.write_text(dump_json(obj if new is None else new), encoding="utf-8")


def edit_jsonl(d, rel, fn, n=1):
    """fn edits the list of rows in place (or returns a new list); needs at least n rows."""
    p = need(Path(d) / rel)
    rows = read_jsonl(p)
    if len(rows) < n:
        raise NotApplicable(f"needs {n} rows in {rel}, the evidence has {len(rows)}")
    new = fn(rows)
    write_jsonl(p, rows if new is None else new)


def edit_text(d, rel, fn):
    p = need(Path(d) / rel)
    p.write_text(fn(p.read_text(encoding="utf-8")), encoding="utf-8")


def records(exp, fn, n=1):
    return lambda d: edit_jsonl(d, f"{exp}/records.jsonl", fn, n)


def private_rows(exp, fname, fn, n=1):
    return lambda d: edit_jsonl(d, f"private/{exp}/{fname}", fn, n)


def json_file(rel, fn):
    return lambda d: edit_json(d, rel, fn)


def flip_hex(h):
    return h[:-1] + ("0" if h[-1] != "0" else "1")


def other_value(x):
    return 0.5 if x != 0.5 else 0.25


def other_run_id(rid):
    return flip_hex(rid) if isinstance(rid, str) and rid else "0" * 32


def first_where(rows, pred, what):
    """The first row satisfying pred, else NotApplicable."""
    for r in rows:
        if pred(r):
            return r
    raise NotApplicable(f"no {what} in this evidence")


def float32(x):
    """x rounded to a float32 value: what a careful forger writes, since every real score is one."""
    import struct

    return struct.unpack("<f", struct.pack("<f", x))[0]


def shift_loser(paths, preds, delta=1e-3):
    """Lower, on both scoring paths, the score of a candidate that no recorded prediction chose, in the first
    record whose predictions all agree, to another float32 value: every argmax, correctness and agreement figure
    stays as recorded (equal scores stay equal), only the model's own numbers (the forward level) can tell."""
    def fn(rows):
        def agree(r):
            return len({json.dumps(get(r, p)) for p in preds}) == 1
        r = first_where(rows, agree, "record whose predictions agree")
        winner = get(r, preds[0])
        loser = next(j for j in range(len(get(r, paths[0])["scores"])) if j != winner)
        for p in paths:
            get(r, p)["scores"][loser] = float32(get(r, p)["scores"][loser] - delta)
    return fn
