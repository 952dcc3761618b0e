"""Reading the evidence: an experiment's JSON and JSONL files come back with every number and list marked by the
place it was read from (evidence_report.cells.sourced), so that a cell can name it in data-src. Files at the top of
O (environment.json, MANIFEST.json) are read unmarked: they are not an experiment's evidence."""
import json
from pathlib import Path

from evidence_report.cells import sourced


def evidence_src(path, line=None):
    """The data-src prefix of an experiment's evidence file (<exp>/<file>#), None for a file at the top of O."""
    path = Path(path)
    if path.parent.name in ("", ".") or path.parent.name == "private" or not (path.parent / "summary.json").exists():
        return None
    return f"{path.parent.name}/{path.name}#" + (f"{line}" if line is not None else "")


def read_json(path):
    """A JSON file; an experiment's file comes back with its numbers marked by their data-src (sourced)."""
    return sourced(json.loads(Path(path).read_text(encoding="utf-8")), evidence_src(path))


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
