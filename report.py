"""Write O/report.html: one self-contained page a person reads, built from the evidence under O alone.

    python report.py O          # run.py calls this too (report.write) after its experiments
    python report.py --check O  # rebuild the page from the evidence and compare it with O/report.html, byte for byte

The page is built by the package evidence_report/ (its docstring says what the page shows, how numbers are rounded
and where each part lives; one section per experiment in evidence_report/sections/). Neither this file nor the
package imports run, experiments, harness, resources, config, adapter, bench, prepare, audit, evidence_audit or
lm_eval: the page reads only the evidence, never the code that wrote it.

--check writes nothing: the whole-page check (audit.py's identity level runs it in a child process; its arithmetic
level keeps its own whitelist). Same bytes need the same evidence_report/ and matplotlib.

Exit codes: 0 the page was written (its path on stdout), or with --check it is the page the evidence gives; 1 with
--check, it is not (one line on stderr: where the pages first differ, an excerpt of each); 2 OUT holds no evidence, holds evidence of a format the page does not read (evidence_format; evidence_report/reading.py), the page
could not be written (one line on stderr; the evidence and an earlier report.html are untouched, no temporary file
is left), or with --check report.html could not be read.
"""
import argparse
import sys
from pathlib import Path

from evidence_report.page import check, write
from evidence_report.reading import UnknownFormat


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="report.py", description="Write OUT/report.html, one self-contained page built from the evidence "
                                      "run.py wrote under OUT (run.py also writes it after its experiments).")
    ap.add_argument("out", metavar="OUT", type=Path, help="the output directory of a run (run.py --out OUT)")
    ap.add_argument("--check", action="store_true", help="write nothing: rebuild the page and compare it with "
                                                         "OUT/report.html byte for byte (exit 1 if they differ)")
    args = ap.parse_args(argv)
    why = ("no such output directory" if not args.out.exists() else "not a directory" if not args.out.is_dir() else
           None if (args.out / "environment.json").is_file() or any(args.out.glob("*/summary.json")) else
           "no evidence here (no environment.json, no <experiment>/summary.json)")
    if why:
        print(f"report.py: error: {args.out}: {why}; run run.py --out {args.out} first", file=sys.stderr)
        return 2
    if args.check:
        code, line = check(args.out)
        print(line if code == 0 else f"report.py: {'error: ' if code == 2 else ''}{line}",
              file=sys.stdout if code == 0 else sys.stderr)
        return code
    try:
        print(write(args.out))
    except UnknownFormat as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"report.py: error: {args.out / 'report.html'}: not written ({e.strerror or e}); the evidence is "
              "untouched and no temporary file is left", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
