"""The check/result model and the report.

A check group is one row: experiment, level, check name, items checked, PASS/FAIL/SKIPPED, every failure message
(the first is printed). Failure messages start with the item ("idx 100") or the file, then the field. `expect` and
`compare_tree` are the two ways a rule compares a recorded claim with the value recomputed from the evidence.
"""
import json
import os
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from evidence_audit.sampling import Sample, report_line

MISSING = type("Missing", (), {"__repr__": lambda self: "<missing>"})()   # a claim that is absent from the evidence

# The levels a check row belongs to: the manifest and the arithmetic run in every audit, identity needs --tokens,
# forward needs --forward. (MANIFEST_LEVEL, not MANIFEST: that is the file's name, manifest.MANIFEST.)
MANIFEST_LEVEL, ARITHMETIC, IDENTITY, FORWARD = "manifest", "arithmetic", "identity", "forward"


def get(obj, dotted):
    """obj['a']['b'] for 'a.b', or MISSING: a missing claim compares unequal to any recomputed value."""
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return MISSING
        obj = obj[part]
    return obj


def same(a, b):
    """Equality that does not let JSON's true pass for 1 (Python's True == 1) and compares containers deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def cut(text, n):
    """text, or its first n - 1 characters and an ellipsis: a cut is always visible."""
    return text if len(text) <= n else text[:n - 1] + "…"


def short(v, n=120):
    """repr(v) for a message, cut to n characters (with an ellipsis when cut)."""
    return cut(repr(v), n)


# ---- check bookkeeping -------------------------------------------------------------------------------------------
# One row per check group: what was checked, on how many items, PASS/FAIL/SKIPPED, every failure message (the first
# is printed). Failure messages start with the item ("idx 100") or the file, then the field.

@dataclass(frozen=True)
class AuditOptions:
    """What the command line asks of one whole audit, beyond the levels: every rule reads it as C.options."""
    # One intra-op thread by default: on the shared 2-vCPU machines here a second thread that has to wait for a busy
    # CPU made each forward pass ~10x slower (0.16 s vs 1-4 s); numerics stay within tolerance.
    threads: int = 1                        # torch intra-op threads for the forward level (--threads)
    review_sheet: Optional[Path] = None     # extraction: --review SHEET, a filled sheet exported by the review page
    device: str = "cpu"                     # --lm-eval's forward level: --device cpu or cuda
    sample: Sample = field(default_factory=Sample)   # --sample N / --sample-seed S: the forward level's draw
    model: Optional[Path] = None            # audit.py OUT --model DIR: the model directory the deeper levels read


class Checks:
    """The rows of one audit, in the order the rules record them, and the audit's options (C.options)."""

    def __init__(self, options=None):
        self.rows = []
        self.options = options if options is not None else AuditOptions()
        self.headline_notes = []     # what a rule puts on the RESULT line, where a reader looks first

    def headline_note(self, text):
        """Say `text` on the RESULT line too (e.g. that a run scored user tasks, not the shipped fixtures)."""
        self.headline_notes.append(text)

    def add(self, experiment, level, check, items, failures, note=""):
        """A check group that ran on `items` items: PASS without failures, else FAIL with every message."""
        self.rows.append({"experiment": experiment, "level": level, "check": check, "items": items,
                          "status": "FAIL" if failures else "PASS", "n_failures": len(failures),
                          "first_failure": failures[0] if failures else None, "failures": failures[:200],
                          "note": note})

    def skip(self, experiment, level, check, reason, requested=True):
        """A check group that could not run (`reason`); `requested` says whether the user asked for it (--strict
        turns a requested skip into exit 1)."""
        self.rows.append({"experiment": experiment, "level": level, "check": check, "items": 0,
                          "status": "SKIPPED", "n_failures": 0, "first_failure": None, "failures": [],
                          "note": reason, "requested": requested})


def expect(bad, where, field, recorded, recomputed, why=""):
    """Append "<where> <field>: recorded X, recomputed Y (why)" to `bad` unless the two are the same."""
    if not same(recorded, recomputed):
        bad.append(f"{where} {field}: recorded {short(recorded)}, recomputed {short(recomputed)}"
                   + (f" ({why})" if why else ""))


def compare_tree(bad, where, recorded, expected, prefix=""):
    """Every leaf of `recorded` must equal `expected`; a recorded key audit.py cannot recompute is a failure too."""
    if isinstance(expected, dict) and isinstance(recorded, dict):
        for k in expected:
            compare_tree(bad, where, recorded.get(k, MISSING), expected[k], f"{prefix}{k}.")
        for k in recorded:
            if k not in expected:
                bad.append(f"{where} {prefix}{k}: recorded {short(recorded[k])} is a claim audit.py has no rule "
                           "to recompute")
        return
    expect(bad, where, prefix.rstrip("."), recorded, expected)


def first_failure(report):
    """The first failed check row of a report, or None."""
    return next((r for r in report["checks"] if r["status"] == "FAIL"), None)


AUDIT_FORMAT = 1     # the version of the report dict both front-ends write (audit.json)


def headline(report):
    """The verdict line's word (report["result"]) and the exit code. A PASS must not hide evidence that was not
    checked: private evidence that O/private/ lacks (every experiment present writes some; the manifest's list is
    not trusted for it) never gives a bare PASS — INCOMPLETE, exit 1, unless the reader passed --public-only, which
    gives "PASS (public evidence only; ...)"; nor does a check the user asked for that could not run here (a level
    whose tokenizer, data or model was not found) — INCOMPLETE, exit 1, naming how many."""
    absent = report["private_absent"]
    if report["exit_code"] != 0:
        report["result"] = "FAIL"
    elif absent and not report["public_only"]:
        report["exit_code"] = 1
        report["result"] = (f"INCOMPLETE: O/private/ absent (the private evidence of {', '.join(absent)}); pass "
                            "--public-only to audit published evidence without it")
    elif report["n_skipped_requested"]:
        report["exit_code"] = 1
        first = next(r for r in report["checks"] if r["status"] == "SKIPPED" and r.get("requested", True))
        report["result"] = (f"INCOMPLETE: {report['n_skipped_requested']} requested check(s) could not run here "
                            f"(SKIPPED above, each with its reason; the first: {first['experiment']} "
                            f"{first['level']}: {first['note'][:160]})")
    elif absent:
        report["result"] = "PASS (public evidence only; identity and forward levels not run)"
    else:
        report["result"] = "PASS"
    return report


LEVELS_SAY = ("levels: manifest = files added, removed or changed since the run (a forger who rewrites MANIFEST.json "
              "too passes it); arithmetic = edits that do not stay consistent; identity (--tokens) = edited texts; "
              "forward (--forward) = edited scores (the model's own numbers)")
CHECK_WIDTH = 72      # the check column of the console table; audit.json holds every name in full


def print_report(report, stream=None, levels_say=LEVELS_SAY):
    """One line per check group: experiment, level, check (wrapped at CHECK_WIDTH), items, status,
    then the first failure (FAIL) or the note (SKIPPED, a forward-level figure, an upper-case warning)."""
    stream = stream or sys.stdout       # looked up per call: a default bound at import would miss a redirection
    p = lambda s="": print(s, file=stream)  # noqa: E731
    p(f"audit of {report['evidence']} (levels requested: {', '.join(report['levels'])})")
    p(f"{'experiment':<10} {'level':<10} {'check':<{CHECK_WIDTH}} {'items':>5}  status")
    for r in report["checks"]:
        # a long check name wraps in its column (the rest on the lines below), never cut: a reader sees all of it
        name = textwrap.wrap(r["check"], CHECK_WIDTH, break_long_words=True) or [""]
        line = (f"{r['experiment']:<10} {r['level']:<10} {name[0]:<{CHECK_WIDTH}} "
                f"{r['items']:>5}  {r['status']}")
        if r["status"] == "FAIL":
            more = f" (+{r['n_failures'] - 1} more)" if r["n_failures"] > 1 else ""
            line += f"  {r['first_failure']}{more}"
        elif r["note"] and (r["status"] == "SKIPPED" or "max |" in r["note"] or "|recomputed -" in r["note"]
                           or r["note"].isupper()):
            line += f"  {r['note']}"
        p(line)
        for more in name[1:]:
            p(f"{'':<10} {'':<10} {more}")
    p(levels_say)
    verdict = report.get("result") or ("PASS" if report["exit_code"] == 0 else "FAIL")
    signed = report.get("signature") or {}
    verdict += f" (evidence digest signed by {signed['signer']}, {signed['key']})" if signed.get("signer") else ""
    if report.get("headline_note"):
        verdict += f" ({report['headline_note'].upper()})"
    if report.get("sample"):
        p(report_line(report["sample"]))
        verdict += " (SAMPLED FORWARD LEVEL)"
    undecided = report.get("n_incomplete", 0)       # FAIL rows whose every failure says the audit could not decide
    failed = f"{report['n_fail'] - undecided} failed" + (f", {undecided} undecided (INCOMPLETE rows)" if undecided
                                                         else "")
    p(f"RESULT: {verdict}: {report['n_pass']} passed, {failed}, {report['n_skipped']} skipped "
      f"({report['n_skipped_requested']} of them requested but impossible here) -> exit {report['exit_code']}")


def write_report(path, report):
    """Temp file in the same directory + os.replace: a reader never sees half an audit.json."""
    text = json.dumps(report, indent=1, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path, data):
    """Write `data` to a temp file in the same directory, fsync, then os.replace: a reader never sees half a file
    (the audit's reports, and the signed digest --lm-eval --sign writes)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

