"""The self-test runner: audit an untouched copy of O, then one tampered copy per kind in two forms, and print the
table (kind, experiment, named level, status, caught raw by, caught resealed by, named check, first failure).

The two forms of a kind, on one copy of O:
  raw       the edit alone: MANIFEST.json and report.html are left as the run wrote them.
  resealed  the edit covered up by a forger who rewrites what is derived: report.html rebuilt by report.py from the
            edited evidence (tools.rebuild_page, a subprocess), then MANIFEST.json rewritten to match every file,
            private digests included (tools.seal). A kind that edits report.html keeps its page (a rebuild would undo
            it); a kind that edits MANIFEST.json has no resealed form (a reseal would undo it): "n/a".

Each form is audited first up to the level the kind names when that form is the one the name speaks of (Kind.named),
else with the default audit (manifest and arithmetic); while nothing rejects it, again with the next deeper level
that can run here (runnable_levels). A raw form the name does not speak of is first checked by the manifest level
alone (the audit's first step): when that rejects it, the rest of the audit is not run (the manifest is the
shallowest level anyway). "Caught by" is the shallowest level with a failed row (manifest < arithmetic < identity
< forward), "reading" when the strict reader refused a file (exit 2), "INCOMPLETE" when no row failed but the
verdict is INCOMPLETE, NOT CAUGHT when even the deepest level that can run passed it.

The page is rebuilt only when the verdict can depend on it: the resealed copy is audited first with MANIFEST.json
resealed and the run's page; if a row that does not read report.html already rejects it (no row whose check name or
failure message names report.html; the strict reader's refusal of another file; INCOMPLETE), a rebuilt page changes
none of those rows, so that verdict stands. Otherwise the page is rebuilt, MANIFEST.json resealed again and the copy
audited again. The row records which ("page").

Statuses (of the kind as a whole): CAUGHT: the named check failed in the named form, and the other form (when there is
one) was rejected at some level; CAUGHT*: both forms rejected, but not by the named check; NOT CAUGHT: a form passed
the audit; SKIPPED: the evidence lacks what the kind tampers with, or the named level cannot run here; ERROR: the
tamper itself failed. Exit 0 only when the clean copy passes and every kind is CAUGHT. A resealed form caught only
deeper than the level the kind names is rejected, so it counts as caught in that form; its column shows the level.
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

from evidence_audit.checks import ARITHMETIC, AUDIT_FORMAT, FORWARD, IDENTITY, MANIFEST_LEVEL, Checks, cut
from evidence_audit.driver import audit
from evidence_audit.manifest import manifest_check
from evidence_audit.mutations.files import file_kinds
from evidence_audit.mutations.generations import generation_kinds
from evidence_audit.mutations.scores import score_kinds
from evidence_audit.mutations.tools import (HEADLINE, PAGE, RAW, READING, RESEALED, NotApplicable, rebuild_page,
                                            seal)
from evidence_audit.reading import Unreadable, check_formats

ALL = (ARITHMETIC, IDENTITY, FORWARD)
ORDER = (MANIFEST_LEVEL, ARITHMETIC, IDENTITY, FORWARD)
UP_TO = {MANIFEST_LEVEL: ALL[:1], ARITHMETIC: ALL[:1], IDENTITY: ALL[:2], FORWARD: ALL}
NOT_CAUGHT, NO_FORM = "NOT CAUGHT", "n/a"
REFUSED, INCOMPLETE = "reading", "INCOMPLETE"
PAGE_FILE = "report.html"
MUTATIONS = score_kinds() + generation_kinds() + file_kinds()     # every kind, in the table's order


def mutation_selftest(out, cache, stream=None, kinds=None, options=None, table_md=None):
    """Returns the report dict (exit_code 0 only when every kind is CAUGHT and the clean copy passes); raises
    Unreadable when O itself cannot be read. options (checks.AuditOptions) goes to every audit it runs; table_md, a
    path, receives the markdown table (table_markdown)."""
    out, kinds = Path(out), MUTATIONS if kinds is None else kinds
    stream = stream or sys.stdout
    p = lambda s="": print(s, file=stream)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="audit-mutations-") as tmp:
        clean_dir = Path(tmp) / "clean"
        shutil.copytree(out, clean_dir, symlinks=True)
        clean = audit(clean_dir, ALL, cache, options=options)
        runnable, why_not = runnable_levels(clean)
        if runnable != ALL:     # a level asked for but unable to run makes any audit INCOMPLETE: judge what can run
            clean = audit(clean_dir, runnable, cache, options=options)
        can_run = set(runnable)
        present = set(clean["experiments"])
        skipped = [f"{r['experiment']} {r['level']}/{r['check']}" for r in clean["checks"]
                   if r["status"] == "SKIPPED" and r.get("requested", True)]
        clean_row = {"passed": clean["exit_code"] == 0, "result": clean.get("result"),
                     "first_failure": first_message(clean, None), "skipped_checks": skipped}
        p(f"mutation self-test: {len(kinds)} tamper kinds, each raw and resealed, on copies of {out} (experiments: "
          f"{', '.join(sorted(present)) or 'none'})")
        p(f"  audit levels that can run here: {', '.join(lv for lv in ALL if lv in can_run)} (a form is audited "
          "deeper while nothing rejects it)" + (f"; not {cut(why_not, 200)}" if why_not else ""))
        p(f"  clean copy: {'PASS' if clean_row['passed'] else 'FAIL'}"
          + (f"  {cut(clean_row['first_failure'], 150)}" if clean_row["first_failure"] else "")
          + (f"  ({len(skipped)} requested checks skipped: {cut('; '.join(skipped), 200)})" if skipped else ""))
        p(f"  {'kind':<36} {'experiment':<10} {'level':<10} {'status':<10} {'raw by':<10} {'resealed by':<11} "
          f"{'named check':<44} first failure")
        rows = []
        for n, k in enumerate(kinds):
            row = run_kind(Path(tmp) / f"{n:02d}-{k.kind}", out, k, cache, can_run, present, options)
            rows.append(row)
            p(f"  {k.kind:<36} {k.experiment:<10} {k.level:<10} {row['status']:<10} {row['raw']:<10} "
              f"{row['resealed']:<11} {cut(row['caught_by'] or '-', 44):<44} {cut(row['first_failure'] or '', 150)}")
    report = summarise(out, clean_row, rows, sorted(can_run, key=ALL.index), p)
    if table_md is not None:
        Path(table_md).write_text(table_markdown(report), encoding="utf-8")
        p(f"  markdown table: {table_md}")
    return report


def runnable_levels(rep):
    """The levels that can run here, from an audit of the clean copy at every level: the arithmetic (the default
    audit always runs), then each deeper level while at least one of its rows ran and none that was asked for was
    SKIPPED (no tokenizer, data or model found; a level that runs in part makes every audit of it INCOMPLETE, which
    would pass for a catch). Returns (levels, why the next level is not among them, or None)."""
    levels = list(ALL[:1])
    for lv in ALL[1:]:
        rows = [r for r in rep["checks"] if r["level"] == lv]
        skipped = [r for r in rows if r["status"] == "SKIPPED" and r.get("requested", True)]
        if not rows or skipped or all(r["status"] == "SKIPPED" for r in rows):
            first = skipped[0] if skipped else None
            return tuple(levels), f"{lv}: " + (f"{first['experiment']} {first['check']} SKIPPED ({first['note']})"
                                               if first else "no row of it ran on the clean copy")
        levels.append(lv)
    return tuple(levels), None


def new_row(k):
    return {"kind": k.kind, "experiment": k.experiment, "what": k.what, "level": k.level, "check": k.check,
            "must_be_caught_by": f"{k.level}/{k.check}", "named_form": k.named, "cover": k.cover, "caught": False,
            "by_expected_check": False, "caught_by": None, "failed_checks": [], "lower_levels_failed": [],
            "first_failure": None, "raw": "-", "resealed": "-", "forms": {}}


def run_kind(d, out, k, cache, can_run, present, options=None):
    """Copy O to d, tamper with it as kind k says, audit the raw form, cover it up, audit the resealed form; the row
    for the table."""
    row = new_row(k)
    shutil.copytree(out, d, symlinks=True)
    try:
        if k.experiment != "-" and k.experiment not in present:
            raise NotApplicable(f"no {k.experiment} evidence in O")
        if UP_TO[k.level][-1] not in can_run:
            raise NotApplicable(f"the {UP_TO[k.level][-1]} level cannot run here (see the clean copy)")
        k.apply(d)
    except NotApplicable as e:
        return finish(row, d, status="SKIPPED", raw="SKIPPED", resealed="SKIPPED", first_failure=str(e))
    except Exception as e:      # noqa: BLE001  a kind that cannot tamper with this evidence is a row, not a crash
        return finish(row, d, status="ERROR", raw="ERROR", resealed="ERROR",
                      first_failure=f"the tamper itself failed: {type(e).__name__}: {e}")
    forms = {RAW: raw_form(d, k, can_run, cache, options)}
    if k.cover is not None:
        forms[RESEALED] = resealed_form(d, k, can_run, cache, options)
    row["forms"] = {name: public(f) for name, f in forms.items()}
    row.update(raw=forms[RAW]["caught_at"], resealed=forms[RESEALED]["caught_at"] if RESEALED in forms else NO_FORM)
    judge(row, forms[k.named], k)
    other = [f for name, f in forms.items() if name != k.named]
    both = row["caught"] and all(f["caught_at"] != NOT_CAUGHT for f in other)
    row["status"] = ("CAUGHT" if row["by_expected_check"] else "CAUGHT*") if both else NOT_CAUGHT
    return finish(row, d)


def finish(row, d, **fields):
    row.update(fields)
    shutil.rmtree(d, ignore_errors=True)
    return row


def start(k, form):
    """The first level a form is audited up to: the named level for the form the kind's name speaks of, else the
    default audit's."""
    return UP_TO[k.level] if form == k.named else ALL[:1]


def raw_form(d, k, can_run, cache, options):
    """Audit the raw edit. Unless the kind's name speaks of this form (then the whole audit, to judge its check), the
    manifest level is run alone first, after the strict format check that precedes it in every audit: when it
    rejects the copy, the manifest is the shallowest level that does, and the rest of the audit is not run."""
    if k.named != RAW:
        form = manifest_once(d, options)
        if form["caught_at"] != NOT_CAUGHT:
            return form
    return escalate(d, start(k, RAW), can_run, cache, options)


def manifest_once(d, options):
    """The audit's first two steps alone (driver.audit: check_formats, then the manifest level): the form's dict."""
    form = {"levels": [MANIFEST_LEVEL], "report": None, "refused": None, "failed": []}
    try:
        check_formats(d)
        C = Checks(options)
        manifest_check(C, d)
    except Unreadable as e:
        return dict(form, refused=f"[exit 2] {str(e).replace(str(d), 'O')}", caught_at=REFUSED)
    form["report"] = {"checks": C.rows, "result": None}
    form["failed"] = [r for r in C.rows if r["status"] == "FAIL"]
    return dict(form, caught_at=MANIFEST_LEVEL if form["failed"] else NOT_CAUGHT)


def resealed_form(d, k, can_run, cache, options):
    """Cover the raw edit up and audit it (the page rebuilt only when the verdict can depend on it: module doc)."""
    seal(d, "manifest")
    if k.cover != PAGE:
        return dict(escalate(d, start(k, RESEALED), can_run, cache, options), page="kept (the kind edits it)")
    first = audit_once(d, start(k, RESEALED), cache, options, ignore_page=True)
    if first["caught_at"] != NOT_CAUGHT:
        return dict(first, page="not rebuilt (a row that does not read report.html rejected the copy)")
    refused = rebuild_page(d)
    seal(d, "manifest")
    page = "rebuilt by report.py" if refused is None else f"kept (report.py refused the edit: {refused})"
    return dict(escalate(d, start(k, RESEALED), can_run, cache, options), page=page)


def escalate(d, levels, can_run, cache, options):
    """Audit d up to `levels`; while nothing rejects it, again with the next deeper level that can run (d unchanged:
    its page is rebuilt once, the verdict kept by the bytes it was rebuilt from)."""
    page_memo = {}
    while True:
        form = audit_once(d, levels, cache, options, page_memo=page_memo)
        deeper = ALL[len(levels)] if len(levels) < len(ALL) else None
        if form["caught_at"] != NOT_CAUGHT or deeper not in can_run:
            return form
        levels = ALL[:len(levels) + 1]


def audit_once(d, levels, cache, options, ignore_page=False, page_memo=None):
    """One audit of d: the form's dict (caught_at, levels, failed rows, the report or the refusal). ignore_page: rows
    and refusals that read report.html do not count (the page is about to be rebuilt), so the page is not rebuilt
    for this audit either."""
    form = {"levels": list(levels), "report": None, "refused": None, "failed": []}
    try:
        form["report"] = audit(d, levels, cache, options=options, rebuild_page=not ignore_page, page_memo=page_memo)
    except Unreadable as e:
        message = str(e).replace(str(d), "O")
        form["refused"] = f"[exit 2] {message}"
        counts = not (ignore_page and PAGE_FILE in message.split(":")[0])   # the file named before the first colon
        return dict(form, caught_at=REFUSED if counts else NOT_CAUGHT)
    failed = [r for r in form["report"]["checks"] if r["status"] == "FAIL"]
    form["failed"] = [r for r in failed if not (ignore_page and reads_page(r))]
    if form["failed"]:
        caught = min((r["level"] for r in form["failed"]), key=ORDER.index)
    elif str(form["report"].get("result", "")).startswith("INCOMPLETE"):
        caught = INCOMPLETE
    else:
        caught = NOT_CAUGHT
    return dict(form, caught_at=caught)


def reads_page(r):
    """Whether a check row may depend on report.html's content: its name or a failure message names the page."""
    return PAGE_FILE in r["check"] or any(PAGE_FILE in str(f) for f in r.get("failures") or [])


def public(form):
    """A form's dict as the JSON report keeps it (not the whole audit report)."""
    return {"caught_at": form["caught_at"], "levels": form["levels"], "page": form.get("page"),
            "failed_checks": [f"{r['level']}/{r['check']}" for r in form["failed"]],
            "first_failure": form["refused"] or (first_message(form["report"], form["failed"][0] if form["failed"]
                                                               else None) if form["report"] else None)}


def judge(row, form, k):
    """Fill the row from the named form: was it rejected, and by the named check?"""
    if form["refused"] is not None:
        row.update(caught=True, failed_checks=[READING], first_failure=form["refused"])
        if k.check == READING:
            row.update(by_expected_check=True, caught_by=READING)
        return
    rep, failed = form["report"], form["failed"]
    hits = [r for r in failed if r["level"] == k.level and r["check"].startswith(k.check)]
    row.update(caught=form["caught_at"] != NOT_CAUGHT, failed_checks=[f"{r['level']}/{r['check']}" for r in failed],
               first_failure=first_message(rep, hits[0] if hits else (failed[0] if failed else None)))
    below = ORDER[:ORDER.index(k.level)]
    row["lower_levels_failed"] = [f"{r['level']}/{r['check']}" for r in failed if r["level"] in below]
    if hits:
        row.update(by_expected_check=True, caught_by=f"{hits[0]['level']}/{hits[0]['check']}")
    elif k.check == HEADLINE and form["caught_at"] == INCOMPLETE:
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
    """The closing lines (counts per level and status, the resealed forms no level catches) and the report dict."""
    by_level = {}
    for r in rows:
        c = by_level.setdefault(r["level"], {"tried": 0, "caught": 0})
        c["tried"] += 1
        c["caught"] += r["status"] == "CAUGHT"
    experiments = sorted({r["experiment"] for r in rows if r["status"] not in ("SKIPPED", "ERROR")} - {"-"})
    ok = clean_row["passed"] and all(r["status"] == "CAUGHT" for r in rows)
    for status in ("CAUGHT*", NOT_CAUGHT, "SKIPPED", "ERROR"):
        names = [r["kind"] for r in rows if r["status"] == status]
        if names:
            p(f"  {status}: {', '.join(names)}")
    for form in (RAW, RESEALED):
        missed = [r["kind"] for r in rows if r[form] == NOT_CAUGHT]
        p(f"  {form} forms no level catches: {', '.join(missed) if missed else 'none'}")
    p("  per level (caught/tried): " + ", ".join(f"{lv} {c['caught']}/{c['tried']}" for lv, c in by_level.items()))
    deep = [r for r in rows if r["level"] in (IDENTITY, FORWARD) and r["status"] == "CAUGHT"]
    alone = [r for r in deep if not r.get("lower_levels_failed")]
    p(f"  identity and forward kinds caught by their level alone (no lower level failed): {len(alone)}/{len(deep)}")
    clean = "passed" if clean_row["passed"] else "FAILED"
    p(f"MUTATIONS: {sum(r['status'] == 'CAUGHT' for r in rows)}/{len(rows)} kinds caught by their named check and in "
      f"both forms (experiments tampered with: {', '.join(experiments) or 'none'}), clean copy {clean} -> exit "
      f"{0 if ok else 1}")
    return {"audit_format": AUDIT_FORMAT, "evidence": str(out), "levels": levels, "clean": clean_row,
            "mutations": rows, "per_level": by_level, "experiments": experiments, "exit_code": 0 if ok else 1}


def table_markdown(report):
    """The markdown table of a self-test report: kind, experiment, expected level (and check), caught raw by,
    caught resealed by, status; then one line on the clean copy and the exit code."""
    def cell(text):
        return str(text).replace("|", "\\|")
    lines = ["| kind | experiment | expected level (check) | caught raw by | caught resealed by | status |",
             "|---|---|---|---|---|---|"]
    for r in report["mutations"]:
        expected = f"{r['level']} ({r['check']}, {r['named_form']} form)"
        lines.append("| " + " | ".join(cell(x) for x in (r["kind"], r["experiment"], expected, r["raw"],
                                                          r["resealed"], r["status"])) + " |")
    clean = "passed" if report["clean"]["passed"] else "FAILED"
    lines += ["", f"Clean copy {clean}; {sum(r['status'] == 'CAUGHT' for r in report['mutations'])}/"
                  f"{len(report['mutations'])} kinds CAUGHT; exit {report['exit_code']}."]
    return "\n".join(lines) + "\n"


def load_report(path):
    """A self-test report written by audit.py --mutations (--report FILE, default O/audit.mutations.json)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))
