"""The self-test runner: audit an untouched copy of O, then one tampered copy per kind, and print the table
(kind, experiment, level, status, caught by, first failure). Each copy is audited up to the level its kind names
(manifest and arithmetic: the default audit; identity: + --tokens; forward: + --forward), on the whole of O.

Statuses: CAUGHT (the named check failed, or for READING / HEADLINE the audit refused / said INCOMPLETE);
CAUGHT* (rejected, but not by the named check: the kind is not shown to be caught where it should be);
NOT CAUGHT (the audit passed the tampered copy); SKIPPED (the evidence lacks what the kind tampers with, or the
named level cannot run here); ERROR (the tamper itself failed on this evidence). Exit 0 only when the clean copy
passes and every kind is CAUGHT.
"""
import shutil
import sys
import tempfile
from pathlib import Path

from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY, MANIFEST_LEVEL, cut
from evidence_audit.driver import AUDIT_FORMAT, audit
from evidence_audit.mutations.tools import HEADLINE, READING, NotApplicable, seal
from evidence_audit.reading import Unreadable

ALL = (ARITHMETIC, IDENTITY, FORWARD)
ORDER = (MANIFEST_LEVEL, ARITHMETIC, IDENTITY, FORWARD)
UP_TO = {MANIFEST_LEVEL: ALL[:1], ARITHMETIC: ALL[:1], IDENTITY: ALL[:2], FORWARD: ALL}


def mutation_selftest(out, cache, stream=None, kinds=None, options=None):
    """Returns the report dict (exit_code 0 only when every kind is CAUGHT and the clean copy passes); raises
    Unreadable when O itself cannot be read. options (checks.AuditOptions) goes to every audit it runs."""
    from evidence_audit.mutations import MUTATIONS
    out, kinds = Path(out), MUTATIONS if kinds is None else kinds
    stream = stream or sys.stdout
    p = lambda s="": print(s, file=stream)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="audit-mutations-") as tmp:
        clean_dir = Path(tmp) / "clean"
        shutil.copytree(out, clean_dir, symlinks=True)
        clean = audit(clean_dir, ALL, cache, options=options)
        can_run = {lv for lv in ALL if any(r["level"] == lv and r["status"] != "SKIPPED" for r in clean["checks"])}
        present = set(clean["experiments"])
        skipped = [f"{r['experiment']} {r['level']}/{r['check']}" for r in clean["checks"]
                   if r["status"] == "SKIPPED" and r.get("requested", True)]
        clean_row = {"passed": clean["exit_code"] == 0, "result": clean.get("result"),
                     "first_failure": first_message(clean, None), "skipped_checks": skipped}
        p(f"mutation self-test: {len(kinds)} tamper kinds on copies of {out} (experiments: "
          f"{', '.join(sorted(present)) or 'none'})")
        p(f"  audit levels that can run here: {', '.join(lv for lv in ALL if lv in can_run)} (each copy is audited "
          "up to the level its kind names)")
        p(f"  clean copy: {'PASS' if clean_row['passed'] else 'FAIL'}"
          + (f"  {cut(clean_row['first_failure'], 150)}" if clean_row["first_failure"] else "")
          + (f"  ({len(skipped)} requested checks skipped: {cut('; '.join(skipped), 200)})" if skipped else ""))
        p(f"  {'kind':<36} {'experiment':<10} {'level':<10} {'status':<10} {'caught by':<44} first failure")
        rows = []
        for n, k in enumerate(kinds):
            row = run_kind(Path(tmp) / f"{n:02d}-{k.kind}", out, k, cache, can_run, present, options)
            rows.append(row)
            p(f"  {k.kind:<36} {k.experiment:<10} {k.level:<10} {row['status']:<10} "
              f"{cut(row['caught_by'] or '-', 44):<44} {cut(row['first_failure'] or '', 150)}")
    return summarise(out, clean_row, rows, sorted(can_run, key=ALL.index), p)


def run_kind(d, out, k, cache, can_run, present, options=None):
    """Copy O to d, tamper with it as kind k says, audit it; the row for the table."""
    row = {"kind": k.kind, "experiment": k.experiment, "what": k.what, "level": k.level, "check": k.check,
           "must_be_caught_by": f"{k.level}/{k.check}", "sealed": k.seal, "caught": False,
           "by_expected_check": False, "caught_by": None, "failed_checks": [], "lower_levels_failed": [],
           "first_failure": None}
    levels = UP_TO[k.level]
    shutil.copytree(out, d, symlinks=True)
    try:
        if k.experiment != "-" and k.experiment not in present:
            raise NotApplicable(f"no {k.experiment} evidence in O")
        if levels[-1] not in can_run:
            raise NotApplicable(f"the {levels[-1]} level cannot run here (see the clean copy)")
        k.apply(d)
        if k.seal:
            seal(d, k.seal)
    except NotApplicable as e:
        row.update(status="SKIPPED", first_failure=str(e))
        shutil.rmtree(d, ignore_errors=True)
        return row
    except Exception as e:      # noqa: BLE001  a kind that cannot tamper with this evidence is a row, not a crash
        row.update(status="ERROR", first_failure=f"the tamper itself failed: {type(e).__name__}: {e}")
        shutil.rmtree(d, ignore_errors=True)
        return row
    try:
        rep = audit(d, levels, cache, options=options)
    except Unreadable as e:
        row.update(caught=True, failed_checks=[READING], first_failure=f"[exit 2] {str(e).replace(str(d), 'O')}")
        if k.check == READING:
            row.update(by_expected_check=True, caught_by=READING)
    else:
        judge(row, rep, k)
    row["status"] = ("CAUGHT" if row["by_expected_check"] else "CAUGHT*") if row["caught"] else "NOT CAUGHT"
    shutil.rmtree(d, ignore_errors=True)
    return row


def judge(row, rep, k):
    """Fill the row from the audit report of a tampered copy."""
    failed = [r for r in rep["checks"] if r["status"] == "FAIL"]
    hits = [r for r in failed if r["level"] == k.level and r["check"].startswith(k.check)]
    row.update(caught=rep["exit_code"] != 0, failed_checks=[f"{r['level']}/{r['check']}" for r in failed],
               first_failure=first_message(rep, hits[0] if hits else None))
    below = ORDER[:ORDER.index(k.level)]
    row["lower_levels_failed"] = [f"{r['level']}/{r['check']}" for r in failed if r["level"] in below]
    if hits:
        row.update(by_expected_check=True, caught_by=f"{hits[0]['level']}/{hits[0]['check']}")
    elif k.check == HEADLINE and str(rep.get("result", "")).startswith("INCOMPLETE"):
        row.update(by_expected_check=True, caught_by=HEADLINE, first_failure=rep["result"])
    elif failed:
        row["caught_by"] = f"(not named) {failed[0]['level']}/{failed[0]['check']}"


def first_message(rep, row):
    """"[level] message" of the given failed row, else of the report's first failed row, else its headline if it
    is not a PASS, else None."""
    row = row or next((r for r in rep["checks"] if r["status"] == "FAIL"), None)
    if row is not None:
        return f"[{row['level']}] {row['first_failure']}"
    result = rep.get("result")
    return result if result and not str(result).startswith("PASS") else None


def summarise(out, clean_row, rows, levels, p):
    """The closing lines (counts per level and status) and the report dict."""
    by_level = {}
    for r in rows:
        c = by_level.setdefault(r["level"], {"tried": 0, "caught": 0})
        c["tried"] += 1
        c["caught"] += r["status"] == "CAUGHT"
    experiments = sorted({r["experiment"] for r in rows if r["status"] not in ("SKIPPED", "ERROR")} - {"-"})
    ok = clean_row["passed"] and all(r["status"] == "CAUGHT" for r in rows)
    for status in ("CAUGHT*", "NOT CAUGHT", "SKIPPED", "ERROR"):
        names = [r["kind"] for r in rows if r["status"] == status]
        if names:
            p(f"  {status}: {', '.join(names)}")
    p("  per level (caught/tried): " + ", ".join(f"{lv} {c['caught']}/{c['tried']}" for lv, c in by_level.items()))
    deep = [r for r in rows if r["level"] in (IDENTITY, FORWARD) and r["status"] == "CAUGHT"]
    alone = [r for r in deep if not r.get("lower_levels_failed")]
    p(f"  identity and forward kinds caught by their level alone (no lower level failed): {len(alone)}/{len(deep)}")
    clean = "passed" if clean_row["passed"] else "FAILED"
    p(f"MUTATIONS: {sum(r['status'] == 'CAUGHT' for r in rows)}/{len(rows)} kinds caught by their named check "
      f"(experiments tampered with: {', '.join(experiments) or 'none'}), clean copy {clean} -> exit {0 if ok else 1}")
    return {"audit_format": AUDIT_FORMAT, "evidence": str(out), "levels": levels, "clean": clean_row,
            "mutations": rows, "per_level": by_level, "experiments": experiments, "exit_code": 0 if ok else 1}
