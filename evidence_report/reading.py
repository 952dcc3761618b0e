"""Reading the evidence: an experiment's JSON and JSONL files come back with every number and list marked by the
place it was read from (evidence_report.cells.sourced), so that a cell can name it in data-src. Files at the top of
O (environment.json, MANIFEST.json) are read unmarked: they are not an experiment's evidence."""
import json
from pathlib import Path

from evidence_report.cells import sourced

# Written again on purpose (run.py's experiments/evidence.py EVIDENCE_FORMAT; the audit keeps its own copy too): every
# JSON evidence file carries the version of the evidence it belongs to, and a JSONL file has its MANIFEST.json's.
# The page is drawn for the formats in this range; evidence of any other, or of none (written before the format was
# versioned), is refused on one line (report.py exits 2) rather than drawn from fields it may misread.
FORMAT_KEY = "evidence_format"
# Format 3 names local paths by placeholder (<cache>, <out>, <model:NAME>, ...) where format 2 wrote them out; the
# page shows what the files hold either way (the command line is the only path it draws).
READS_EVIDENCE_FORMATS = (2, 3)      # (oldest, newest): the evidence formats this page reads


class UnknownFormat(Exception):
    """A JSON evidence file of an evidence format the page does not read, or of none: the message is one line."""


def format_refusal(path, obj):
    """None when `obj` (a JSON file's top level) declares an evidence format the page reads; else the line refusing
    it: the file, the version found and the range read."""
    lo, hi = READS_EVIDENCE_FORMATS
    found = obj.get(FORMAT_KEY) if isinstance(obj, dict) else None
    if type(found) is int and lo <= found <= hi:
        return None
    text = json.dumps(found)
    shown = text if len(text) <= 40 else text[:39] + "…"
    what = (f"{FORMAT_KEY} {shown}" if isinstance(obj, dict) and FORMAT_KEY in obj
            else f"no {FORMAT_KEY} (evidence written before its format was versioned)")
    return f"{path}: {what}; this report reads evidence formats {lo} to {hi}"


def check_formats(out, names):
    """The evidence formats the JSON files the page reads declare (environment.json, MANIFEST.json, each named
    experiment's *.json), as a set: the page's layout follows them (evidence_report.layout). Raise UnknownFormat for
    the first whose evidence format it does not read. A file that does not parse, or holds no object, is left to the
    view that reads it, which shows an error box as before: only an object has a format to refuse."""
    out = Path(out)
    paths = [out / "environment.json", out / "MANIFEST.json"]
    paths += [p for n in names for p in sorted((out / n).glob("*.json"))]
    found = set()
    for path in paths:
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        refusal = format_refusal(path, obj) if isinstance(obj, dict) else None
        if refusal:
            raise UnknownFormat(refusal)
        if isinstance(obj, dict):
            found.add(obj[FORMAT_KEY])
    return found


def without_format(obj):
    """A file's top level without its evidence_format: a fact about the file, not evidence a view shows."""
    return {k: v for k, v in obj.items() if k != FORMAT_KEY} if isinstance(obj, dict) else obj


def evidence_src(path, line=None):
    """The data-src prefix of an experiment's evidence file (<exp>/<file>#), None for a file at the top of O."""
    path = Path(path)
    if path.parent.name in ("", ".") or path.parent.name == "private" or not (path.parent / "summary.json").exists():
        return None
    return f"{path.parent.name}/{path.name}#" + (f"{line}" if line is not None else "")


def read_json(path):
    """A JSON file; an experiment's file comes back with its numbers marked by their data-src (sourced)."""
    return sourced(without_format(json.loads(Path(path).read_text(encoding="utf-8"))), evidence_src(path))


def read_jsonl(path):
    path = Path(path)
    if not path.exists():
        return []
    src = evidence_src(path)
    return [sourced(json.loads(line), src and f"{src}{k}") for k, line in
            enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()]


def read_optional(path):
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {}
