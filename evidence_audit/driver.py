"""Audit one evidence directory: find its experiments, run each one's rule, collect the report dict."""
from pathlib import Path

from evidence_audit.checks import ARITHMETIC, Checks
from evidence_audit.manifest import manifest_check
from evidence_audit.reading import Unreadable, check_formats
from evidence_audit.report_page import report_html_check
from evidence_audit.rules import RULES

AUDIT_FORMAT = 1


def audit(out, levels=(ARITHMETIC,), cache=None, only=None, public_only=False, options=None):
    """Audit every experiment directory under `out` (or those named in `only`; the rest are reported as SKIPPED):
    the manifest level first (MANIFEST.json against the files), then each experiment's rule, then report.html.
    `public_only`: the reader holds published evidence without O/private/ and says so (see headline).
    `options`: checks.AuditOptions (--threads, --review), handed to the rules as C.options.
    Returns the report dict; raises Unreadable (exit 2)."""
    out = Path(out)
    if out.is_symlink():
        raise Unreadable(f"{out}: a symlink; audit the evidence directory itself, not a link to it")
    if not out.is_dir():
        raise Unreadable(f"{out}: no such evidence directory; run: python run.py --cache CACHE --out {out}")
    check_formats(out)      # evidence of a format the rules were not written for is refused before any row
    C = Checks(options)
    sealed = manifest_check(C, out, public_only)
    experiments = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")
                         and p.name != "private")
    if not experiments:
        C.add("-", ARITHMETIC, "experiment directories", 0, [f"{out}: no experiment directory to audit"])
    if not (out / "environment.json").exists():
        C.add("-", ARITHMETIC, "required files", 1, [f"{out}/environment.json: missing"])
    info = {}
    for name in experiments:
        if only and name not in only:
            C.skip(name, "-", "(whole experiment)", "not selected (--experiment)", requested=False)
        elif name not in RULES:
            C.add(name, ARITHMETIC, "audit rule", 0, [f"{name}/: no audit rule for this experiment; its claims are NOT "
                                                      "verified (write one in evidence_audit/rules/ and declare "
                                                      "the experiment in registry.py)"])
        else:
            info[name] = RULES[name](C, name, out, levels, cache)
    report_html_check(C, out, sealed["run_id"], sealed["manifest"])
    stray_evidence(C, out, experiments, only)
    if public_only and sealed["private_absent"]:      # the reader said so: a check needing O/private/ was not asked
        for r in C.rows:
            if r["status"] == "SKIPPED" and "private" in r["note"]:
                r["requested"] = False
    status = [r["status"] for r in C.rows]
    skipped_requested = [r for r in C.rows if r["status"] == "SKIPPED" and r.get("requested", True)]
    report = {"audit_format": AUDIT_FORMAT, "evidence": str(out), "levels": list(levels),
              "cache": str(cache) if cache else None, "experiments": experiments, "checks": C.rows,
              "n_pass": status.count("PASS"), "n_fail": status.count("FAIL"), "n_skipped": status.count("SKIPPED"),
              "n_skipped_requested": len(skipped_requested), "details": info, "run_id": sealed["run_id"],
              "public_only": public_only, "private_absent": sealed["private_absent"],
              "exit_code": 1 if "FAIL" in status else 0}
    return headline(report)


def headline(report):
    """The verdict line's word (report["result"]) and the exit code. A PASS must not hide evidence that was not
    checked, so private evidence that the manifest lists but O/private/ lacks never gives a bare PASS — INCOMPLETE,
    exit 1, unless the reader passed --public-only, which gives "PASS (public evidence only; ...)"."""
    absent = report["private_absent"]
    if report["exit_code"] != 0:
        report["result"] = "FAIL"
    elif absent and not report["public_only"]:
        report["exit_code"] = 1
        report["result"] = (f"INCOMPLETE: O/private/ absent (MANIFEST.json lists private evidence of "
                            f"{', '.join(absent)}); pass --public-only to audit published evidence without it")
    elif absent:
        report["result"] = "PASS (public evidence only; identity and forward levels not run)"
    else:
        report["result"] = "PASS"
    return report


def stray_evidence(C, out, experiments, only):
    """Failed rows for what no rule covers: an --experiment with no directory, private files with no public
    evidence, and a run.py FAILED.json (a failed run installs no evidence, but says so)."""
    selected = lambda name: not only or name in only      # noqa: E731
    for name in only or []:
        if name not in experiments:
            C.add(name, ARITHMETIC, "experiment directory", 0, [f"{out}/{name}: no such experiment directory"])
    private = sorted(p.name for p in (out / "private").iterdir() if p.is_dir()) if (out / "private").is_dir() else []
    for name in private:
        if name not in experiments and selected(name):
            C.add(name, ARITHMETIC, "private evidence", 0,
                  [f"private/{name}/: private files for an experiment with no public evidence"])
    for failed in sorted(out.glob("*.FAILED.json")):
        name = failed.name[:-len(".FAILED.json")]
        if selected(name):
            C.add(name, ARITHMETIC, "run outcome", 0,
                  [f"{failed.name}: run.py recorded a failed run of this experiment (see that file)"])
