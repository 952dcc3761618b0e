"""audit.py's flags, both front-ends' (run.py evidence: cli.py; `--lm-eval RUN_DIR`: lmeval/command.py), in one
parser, so that --help lists them all and a command line naming both kinds of input is refused. It imports the
--lm-eval flags (lmeval/command.py) and no rule of run.py evidence: audit.py parses first, then imports cli.py (and
with it the rules) only for OUT."""
import argparse
from pathlib import Path

import evidence_audit
from evidence_audit.checks import AuditOptions
from evidence_audit.lmeval.command import lmeval_args


def parse_args(argv):
    doc = evidence_audit.__doc__
    ap = argparse.ArgumentParser(prog="audit.py", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    ap.add_argument("out", type=Path, nargs="?", help="evidence directory written by run.py --out")
    ap.add_argument("--tokens", action="store_true", help="identity level: private texts, tokenizer, data parquet")
    ap.add_argument("--forward", action="store_true", help="forward level (implies --tokens): recompute every score")
    ap.add_argument("--cache", type=Path,
                    help="prepared cache (default: the one O/private/<exp>/paths.json names; format 2 evidence: two "
                         "levels above config.json's model.dir); with OUT, --model DIR names a local model directory "
                         "the run read (default: the one paths.json names)")
    ap.add_argument("--experiment", action="append",
                    help="audit only this experiment (repeatable); the others are reported as not selected")
    ap.add_argument("--mutations", action="store_true", help="mutation self-test on temporary copies of OUT")
    ap.add_argument("--table-md", type=Path, metavar="FILE",
                    help="with --mutations: also write the self-test's markdown table (kind, level, caught raw by, "
                         "caught resealed by) to FILE")
    ap.add_argument("--report", type=Path,
                    help="where to write the JSON report (default: OUT/audit.json, OUT/audit.mutations.json)")
    ap.add_argument("--sample", type=int, metavar="N",
                    help="forward level: re-score N items of each experiment / task, drawn from a fresh random seed "
                         "(printed, with the detection bound); the other levels still cover every item")
    ap.add_argument("--sample-seed", metavar="S",
                    help="--sample's seed: repeat a printed draw, or challenge with a seed of your own")
    ap.add_argument("--threads", type=int, default=AuditOptions().threads,
                    help="torch threads for --forward (default: %(default)s)")
    ap.add_argument("--strict", action="store_true",
                    help="kept for old scripts: a requested check that had to be skipped now always gives INCOMPLETE, "
                         "exit 1")
    ap.add_argument("--public-only", action="store_true",
                    help="audit published evidence without O/private/ (the manifest lists it): the headline says "
                         "PASS (public evidence only; ...) instead of INCOMPLETE, exit 1")
    ap.add_argument("--review", type=Path, metavar="SHEET",
                    help="extraction: import a review sheet exported by O/private/extraction/review.html; a blank or "
                         "partly blank sheet is refused with the list of missing fields")
    ap.add_argument("--allowed-signers", type=Path, metavar="FILE",
                    help="verify the author's signature of the evidence digest (OUT/MANIFEST.json.sig; with --lm-eval "
                         "RUN/evidence-digest.json.sig) against this OpenSSH allowed-signers file and name the signer; "
                         "see docs/citing.md")
    ap.add_argument("--sign", metavar="KEY",
                    help="with --lm-eval: write the run's digest and its signature with this OpenSSH private key "
                         "into RUN (evidence-digest.json and .sig; run.py --sign KEY signs run.py evidence)")
    lmeval_args(ap)
    args = ap.parse_args(argv)
    if args.out is None and args.lm_eval is None:
        ap.error("nothing to audit: give the evidence directory run.py wrote (python audit.py OUT, e.g. "
                 "python audit.py smoke) or an lm-eval output directory (python audit.py --lm-eval RUN_DIR)")
    if args.out is not None and args.lm_eval is not None:
        ap.error("give either OUT (run.py evidence) or --lm-eval RUN_DIR (an lm-eval output path), not both")
    if args.table_md is not None and not args.mutations:
        ap.error("--table-md writes the mutation self-test's table: it needs --mutations")
    return args
