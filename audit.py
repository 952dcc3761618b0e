"""Recompute every claim in an evidence directory written by run.py, from the evidence alone.

    python audit.py O                              # arithmetic level (stdlib only, no model, no private files)
    python audit.py O --tokens                     # + identity level: private texts, tokenizer, data parquet
    python audit.py O --tokens --forward           # + forward level: the audit's own Llama forward pass
    python audit.py O --mutations                  # self-test: tamper with copies of O, each must be caught
    python audit.py O --review SHEET               # + import a filled extraction review sheet (human audit)
    python audit.py --lm-eval RUN_DIR [--tokens --data FILE] [--forward --model DIR] [--sample N]
                                                   # lm-eval 0.4.5, 0.4.7-0.4.13 --log_samples --output_path directory

Exit codes: 0 every claim recomputes, 1 a check failed (FAIL) or something asked for could not be checked
(INCOMPLETE: O/private/ absent, or a requested level's tokenizer, data or model not found), 2 the evidence is
unreadable or the command line is wrong (e.g. an --experiment no registry.py entry declares). The JSON report goes
to O/audit.json for an audit of every experiment, to O/audit.<name>[+<name>].json for --experiment (see
evidence_audit/cli.py: a partial or lower-level audit never replaces a deeper O/audit.json unless it FAILs); an
audit report in O is an output, never evidence: no audit reads it. `python audit.py --help`
lists every flag, the levels and the limits (the docstring of the package evidence_audit/, where the rules live).
Neither this file nor the package imports run, experiments, harness, report, bench, prepare, resources, config,
adapter or lm_eval: every rule is written again there, on purpose.
"""
import sys

from evidence_audit.arguments import parse_args
from evidence_audit.lmeval.command import lmeval_main


def main(argv=None):
    args = parse_args(argv)
    if args.lm_eval is not None:
        return lmeval_main(args)
    # run.py evidence's front-end imports every rule of evidence_audit/rules/: loaded only when OUT is audited
    from evidence_audit.cli import audit_evidence
    return audit_evidence(args)


if __name__ == "__main__":
    sys.exit(main())
