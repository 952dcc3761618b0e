"""audit.py OUT, run.py evidence's front-end: run the audit or the mutation self-test, print and write the report
(the flags: arguments.py; `--lm-eval RUN_DIR` is lmeval/command.py's front-end).
Exit codes: 0 every claim recomputes, 1 a check failed or a requested check could not run (INCOMPLETE), 2 the
evidence is unreadable or the command line is wrong (no report is written).

Where the JSON report goes (unless --report PATH): O/audit.json holds the audit of every experiment; an audit of
some (--experiment) goes to O/audit.<name>[+<name>...].json and never replaces it. An audit of every experiment at
lower levels than the O/audit.json already there (its "levels", read only to choose the file name) goes to
O/audit.<deepest level>.json and keeps it, unless it FAILs: every deeper audit runs the lower levels' checks too,
so a lower-level FAIL shows the deeper report stale and replaces it. audit.json is an output, never evidence: the
audit never reads it for a verdict, report.py never reads it, and any audit.*.json is outside the manifest's files.
"""
import difflib
import json
import sys
from pathlib import Path

import registry
from evidence_audit.arguments import parse_args
from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY, AuditOptions, print_report, write_report
from evidence_audit import sampling
from evidence_audit.driver import audit
from evidence_audit.lmeval.command import lmeval_main
from evidence_audit.mutations import mutation_selftest
from evidence_audit.reading import Unreadable
from evidence_audit.rules import extraction
from evidence_audit.signature import SignatureError, check_allowed_signers


def main(argv=None):
    """audit.py in one call, either front-end (what the tests run; audit.py itself imports this module only for
    OUT, so that --lm-eval never loads run.py evidence's rules)."""
    args = parse_args(argv)
    return lmeval_main(args) if args.lm_eval is not None else audit_evidence(args)


def audit_evidence(args):
    """audit.py OUT: run.py evidence's front-end over the parsed command line; the exit code."""
    if args.device not in (None, "cpu"):     # O's forward level re-scores where the evidence says it was scored
        print(f"error: --device {args.device}: only for --lm-eval runs; audit.py OUT re-scores on the cpu",
              file=sys.stderr)
        return 2
    if args.public_only and (args.tokens or args.forward or args.mutations):
        print("error: --public-only audits without O/private/: it cannot run --tokens, --forward or --mutations",
              file=sys.stderr)
        return 2
    signing = signing_problem(args)
    if signing:
        print(f"error: {signing}", file=sys.stderr)
        return 2
    unknown = [n for n in args.experiment or [] if n not in registry.NAMES]
    if unknown:
        print(f"error: --experiment {unknown[0]}: no such experiment; known experiments: "
              f"{', '.join(closest_first(unknown[0], registry.NAMES))}", file=sys.stderr)
        return 2
    sample = sampling.from_args(args.sample, args.sample_seed, args.forward)
    if isinstance(sample, str):
        print(f"error: {sample}", file=sys.stderr)
        return 2
    for flag, given in (("--cache", args.cache), ("--model", args.model)):
        if given is not None and not given.is_dir():
            print(f"error: {flag} {given}: not a directory (--cache: the prepared cache; --model: the local model "
                  "directory the run read)", file=sys.stderr)
            return 2
    options = AuditOptions(threads=args.threads, review_sheet=args.review, sample=sample, model=args.model)
    try:
        if args.mutations:
            report = mutation_selftest(args.out, args.cache, options=options, table_md=args.table_md)
            default_report = args.out / "audit.mutations.json"
        else:
            levels = (ARITHMETIC,) + ((IDENTITY,) if args.tokens or args.forward else ()) \
                + ((FORWARD,) if args.forward else ())
            report = audit(args.out, levels, args.cache, args.experiment, public_only=args.public_only,
                           options=options, allowed_signers=args.allowed_signers)
            if args.strict and report["n_skipped_requested"] and report["exit_code"] == 0:
                report["exit_code"], report["result"] = 1, "FAIL"
            print_report(report)
            if args.review is not None:
                extraction.ext_print_review(report, args.review)
            default_report = report_path(args.out, levels, args.experiment, report["result"])
            say_earlier_reports(args.out, args.report or default_report)
    except Unreadable as e:
        print(f"error: unreadable evidence: {e}", file=sys.stderr)
        return 2
    path = args.report or default_report
    try:
        write_report(path, report)
    except OSError as e:        # e.g. published evidence on a read-only medium: the verdict above still stands
        print(f"warning: could not write the JSON report {path} ({e.strerror}); pass --report PATH elsewhere",
              file=sys.stderr)
        return report["exit_code"]
    print(f"report: {path}")
    return report["exit_code"]


def signing_problem(args):
    """The one line for --sign or --allowed-signers as audit.py OUT cannot take them, or None."""
    if args.sign is not None:
        return ("--sign: audit.py signs lm-eval runs (--lm-eval RUN_DIR --sign KEY); run.py --sign KEY signs the "
                "evidence it writes")
    if args.allowed_signers is not None and args.mutations:
        return "--allowed-signers verifies a signature; the mutation self-test (--mutations) does not: give one"
    if args.allowed_signers is not None:
        try:
            check_allowed_signers(args.allowed_signers)
        except SignatureError as e:
            return str(e)
    return None


def closest_first(name, known):
    """The known names, the closest to `name` first (difflib's ratio), then the rest in their declared order."""
    return sorted(known, key=lambda k: -difflib.SequenceMatcher(None, name, k).ratio())


LEVEL_ORDER = (ARITHMETIC, IDENTITY, FORWARD)


def earlier_levels(path):
    """The levels an earlier audit report at `path` records, or () when it is absent or not such a report (it is
    read only to choose where this report goes, never as evidence)."""
    try:
        if not path.is_file() or path.stat().st_size > (64 << 20):
            return ()
        levels = json.loads(path.read_text(encoding="utf-8")).get("levels")
    except (OSError, ValueError, AttributeError, RecursionError):
        return ()
    return tuple(lv for lv in levels if lv in LEVEL_ORDER) if isinstance(levels, list) else ()


def report_path(out, levels, only, result):
    """Where this audit's JSON report goes (the module docstring says why)."""
    if only:
        return out / f"audit.{'+'.join(sorted(set(only)))}.json"
    deepest = lambda lv: max((LEVEL_ORDER.index(x) for x in lv), default=-1)     # noqa: E731
    if result != "FAIL" and deepest(earlier_levels(out / "audit.json")) > deepest(levels):
        return out / f"audit.{LEVEL_ORDER[deepest(levels)]}.json"
    return out / "audit.json"


def say_earlier_reports(out, path):
    """One line for an audit report already in O: an output of audit.py, not evidence, ignored by this audit."""
    earlier = out / "audit.json"
    if earlier.is_file():
        fate = "replaced by this report" if Path(path) == earlier else f"kept (this report: {Path(path).name})"
        print(f"note: {earlier}: an earlier audit's output, not evidence: ignored by this audit; {fate}")
