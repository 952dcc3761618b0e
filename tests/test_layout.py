"""The structure that keeps the code readable: short functions, a short audit CLI, no cited file outside the repo.

(The import-direction rules are checked next to the code they protect: tests/test_audit.py for the audit package,
tests/test_prepare.py for the bottom layer and bench.py, tests/test_harness.py for harness/.)"""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80


def code_files():
    top = [REPO / n for n in ("audit.py", "run.py", "prepare.py", "resources.py", "bench.py", "report.py",
                              "config.py", "adapter.py")]
    return [*top, *sorted((REPO / "evidence_audit").rglob("*.py")), *sorted((REPO / "evidence_report").rglob("*.py")),
            *sorted((REPO / "experiments").glob("*.py")), *sorted((REPO / "harness").glob("*.py"))]


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in code_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


def test_audit_cli_is_short():
    n = len((REPO / "audit.py").read_text(encoding="utf-8").splitlines())
    assert n < 100, f"audit.py has {n} lines; the audit lives in evidence_audit/"


def test_no_reference_to_a_design_document_outside_the_repository():
    tracked = [p for p in REPO.rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".json", ".ini", ".jsonl"}
               and not any(part in {".venv", ".git", "__pycache__", "cache"} for part in p.relative_to(REPO).parts)]
    cited = []
    for path in tracked:
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for name in re.findall(r"\b([A-Z][A-Z_]+\.md)\b", line):
                if not (REPO / name).exists():
                    cited.append(f"{path.relative_to(REPO)}:{lineno} cites {name}")
    assert not cited, "\n".join(cited)


def test_every_experiment_follows_the_contract():
    import importlib

    import config
    import registry

    for name in registry.NAMES:
        module = importlib.import_module(registry.find(name).runner)
        assert module.NAME == name
        assert callable(module.run) and callable(module.data_label)
        sections = module.CONFIG_SECTIONS
        assert sections[0] == "shared" and all(s in config.CONFIG for s in sections), (name, sections)
        source = Path(module.__file__).read_text(encoding="utf-8")
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in {"exit", "fail"}:
                raise AssertionError(f"experiments/{name}.py calls .{node.attr}: experiments raise, run.py exits")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "argparse" not in names, f"experiments/{name}.py imports argparse"
