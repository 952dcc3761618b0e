"""audit.py's command line: parse the flags, run the audit or the mutation self-test, print and write the report.
Exit codes: 0 every claim recomputes, 1 a check failed, 2 the evidence is unreadable (no report is written)."""
import argparse
import sys
from pathlib import Path

import evidence_audit
from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY, AuditOptions, print_report, write_report
from evidence_audit.driver import audit
from evidence_audit.lmeval.command import lmeval_args, lmeval_main
from evidence_audit.mutations import mutation_selftest
from evidence_audit.reading import Unreadable
from evidence_audit.rules import extraction


def parse_args(argv):
    doc = evidence_audit.__doc__
    ap = argparse.ArgumentParser(prog="audit.py", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    ap.add_argument("out", type=Path, nargs="?", help="evidence directory written by run.py --out")
    ap.add_argument("--tokens", action="store_true", help="identity level: private texts, tokenizer, data parquet")
    ap.add_argument("--forward", action="store_true", help="forward level (implies --tokens): recompute every score")
    ap.add_argument("--cache", type=Path, help="prepared cache (default: two levels above config.json's model.dir)")
    ap.add_argument("--experiment", action="append",
                    help="audit only this experiment (repeatable); the others are reported as not selected")
    ap.add_argument("--mutations", action="store_true", help="mutation self-test on temporary copies of OUT")
    ap.add_argument("--report", type=Path,
                    help="where to write the JSON report (default: OUT/audit.json, OUT/audit.mutations.json)")
    ap.add_argument("--threads", type=int, default=AuditOptions().threads,
                    help="torch threads for --forward (default: %(default)s)")
    ap.add_argument("--strict", action="store_true", help="a requested level that had to be skipped exits 1")
    ap.add_argument("--public-only", action="store_true",
                    help="audit published evidence without O/private/ (the manifest lists it): the headline says "
                         "PASS (public evidence only; ...) instead of INCOMPLETE, exit 1")
    ap.add_argument("--review", type=Path, metavar="SHEET",
                    help="extraction: import a review sheet exported by O/private/extraction/review.html; a blank or "
                         "partly blank sheet is refused with the list of missing fields")
    lmeval_args(ap)
    args = ap.parse_args(argv)
    if (args.out is None) == (args.lm_eval is None):
        ap.error("give either OUT (run.py evidence) or --lm-eval RUN_DIR (an lm-eval output path), not both")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.lm_eval is not None:
        return lmeval_main(args)
    if args.public_only and (args.tokens or args.forward or args.mutations):
        print("error: --public-only audits without O/private/: it cannot run --tokens, --forward or --mutations",
              file=sys.stderr)
        return 2
    options = AuditOptions(threads=args.threads, review_sheet=args.review)
    try:
        if args.mutations:
            report = mutation_selftest(args.out, args.cache, options=options)
            default_report = args.out / "audit.mutations.json"
        else:
            levels = (ARITHMETIC,) + ((IDENTITY,) if args.tokens or args.forward else ()) \
                + ((FORWARD,) if args.forward else ())
            report = audit(args.out, levels, args.cache, args.experiment, public_only=args.public_only,
                           options=options)
            if args.strict and report["n_skipped_requested"] and report["exit_code"] == 0:
                report["exit_code"], report["result"] = 1, "FAIL"
            print_report(report)
            if args.review is not None:
                extraction.ext_print_review(report, args.review)
            default_report = args.out / "audit.json"
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
