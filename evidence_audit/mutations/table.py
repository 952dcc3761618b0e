"""The markdown table of a mutation self-test, from its JSON report, for docs/tampering.md:

    python -m evidence_audit.mutations.table O/audit.mutations.json                      # the table on stdout
    python -m evidence_audit.mutations.table O/audit.mutations.json --into docs/tampering.md

--into replaces what lies between the page's two marker lines (BEGIN, END) and nothing else; a page without both
markers is refused (exit 2) and left as it was.
"""
import argparse
import sys
from pathlib import Path

from evidence_audit.mutations.selftest import load_report, table_markdown

BEGIN = "<!-- mutation-table:begin -->"
END = "<!-- mutation-table:end -->"


def into(page_text, table):
    """page_text with the lines between BEGIN and END replaced by table; ValueError without both markers in order."""
    head, sep, rest = page_text.partition(BEGIN + "\n")
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"the page has no {BEGIN} line followed by {END}")
    return head + sep + table + sep2 + tail


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m evidence_audit.mutations.table",
                                 description="Write the markdown table of a mutation self-test report.")
    ap.add_argument("report", type=Path, help="the JSON report of audit.py O --mutations (O/audit.mutations.json)")
    ap.add_argument("--into", type=Path, help="a markdown page whose marked section receives the table")
    args = ap.parse_args(argv)
    table = table_markdown(load_report(args.report))
    if args.into is None:
        sys.stdout.write(table)
        return 0
    try:
        args.into.write_text(into(args.into.read_text(encoding="utf-8"), table), encoding="utf-8")
    except (OSError, ValueError) as e:
        print(f"error: {args.into}: {e}", file=sys.stderr)
        return 2
    print(args.into)
    return 0


if __name__ == "__main__":
    sys.exit(main())
