"""SOURCE_MAP.md must describe the installed lm-eval exactly: each line range holds the named function and each
file hash matches. Fails when lm-eval changes under the pinned version, or when the map is edited carelessly."""
import ast
import hashlib
import re
from pathlib import Path

import lm_eval

from conftest import REPO

LM_EVAL_DIR = Path(lm_eval.__file__).resolve().parent
ROW = re.compile(r"^\| `(?P<qual>[\w.]+)` \| .* \| `lm_eval/(?P<file>[\w/.]+)` \| (?P<start>\d+)-(?P<end>\d+) \| "
                 r"`(?P<sha>[0-9a-f]{64})` \| (?P<licence>[\w-]+) \| (?P<local>.+) \|$")


def map_rows():
    rows = [m.groupdict() for m in map(ROW.match, (REPO / "SOURCE_MAP.md").read_text().splitlines()) if m]
    assert len(rows) >= 30, "SOURCE_MAP.md table not found or too short"
    return rows


def line_range(tree, qual):
    nodes = tree.body
    parts = qual.split(".")
    for i, name in enumerate(parts):
        node = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
        assert node is not None, f"{qual}: {name} not found"
        if i == len(parts) - 1:
            return min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno
        nodes = node.body


def test_lm_eval_version_is_pinned():
    import importlib.metadata as md
    assert md.version("lm_eval") == "0.4.9.2"


def test_every_row_matches_the_installed_source():
    for row in map_rows():
        path = LM_EVAL_DIR / row["file"]
        source = path.read_bytes()
        assert hashlib.sha256(source).hexdigest() == row["sha"], f"{row['file']} changed"
        assert line_range(ast.parse(source), row["qual"]) == (int(row["start"]), int(row["end"])), row["qual"]


def test_local_counterparts_exist():
    for row in map_rows():
        for ref in re.findall(r"([\w/]+\.py): (\w+)", row["local"]):
            file, name = ref
            text = (REPO / file).read_text()
            assert re.search(rf"\b{name}\b", text), f"{file} has no {name} (SOURCE_MAP row {row['qual']})"


def test_licence_is_the_installed_one():
    import importlib.metadata as md
    meta = md.metadata("lm_eval")
    licence = meta.get("License") or ""
    for row in map_rows():
        assert row["licence"] == "MIT" and "MIT" in licence


def test_cites_no_document_outside_the_repository():
    """A reader can only follow a map to documents that exist: every *.md it names is in the repository."""
    text = (REPO / "SOURCE_MAP.md").read_text()
    for name in set(re.findall(r"\b([A-Z][A-Z_]+\.md)\b", text)):
        assert (REPO / name).exists(), f"SOURCE_MAP.md cites {name}, which is not in the repository"
