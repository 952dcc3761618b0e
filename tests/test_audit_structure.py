"""The audit's own structure, by AST scan and one subprocess: evidence_audit/'s imports form no circle (function-local
imports counted too, so none can hide one), no rule imports another rule, `audit.py --lm-eval` loads no rule of
run.py evidence, and lm-eval's HFLM, transformers' loader and the chat-template renderer are each written once."""
import ast
import json
import subprocess
import sys

import registry
from conftest import REPO

PACKAGE = REPO / "evidence_audit"
SOURCES = sorted(PACKAGE.rglob("*.py"))
TREES = {p: ast.parse(p.read_text(encoding="utf-8")) for p in SOURCES}


def module_name(path):
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path):
    """[(imported evidence_audit module, line, at module level?)] of one source file, relative imports resolved and
    `from package import module` read as the module when it is one."""
    tree, here, out = TREES[path], module_name(path), []
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if (PACKAGE.parent / f"{base}.{a.name}".replace(".", "/")).with_suffix(".py")
                     .exists() or (PACKAGE.parent / f"{base}.{a.name}".replace(".", "/") / "__init__.py").exists()
                     else base for a in node.names]
        out += [(n, node.lineno, id(node) in top) for n in names if n == "evidence_audit" or
                n.startswith("evidence_audit.")]
    return out


GRAPH = {module_name(p): {m for m, _, _ in imports_of(p)} - {module_name(p)} for p in SOURCES}
# rules/__init__.py imports each experiment's rule by the name registry.py gives (importlib): arrows too
GRAPH["evidence_audit.rules"] |= {e.rule.partition(":")[0] for e in registry.EXPERIMENTS}


def test_the_audit_import_graph_has_no_circle():
    """Every arrow (a module-level or function-local import) points one way: a circle would need a deferred import
    to break it, and shows two modules that are one."""
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(GRAPH.get(m, ())):
            if n not in GRAPH:
                continue
            assert state.get(n) != "open", "import circle: " + " -> ".join(path[path.index(n):] + [n])
            if n not in state:
                visit(n)
        path.pop()
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_no_function_local_import_of_the_audit_breaks_a_circle():
    """A function-local import of an evidence_audit module is never needed to break a circle: each is named here
    with why it is deferred, and the graph above stays acyclic with them."""
    deferred = sorted((module_name(p), m) for p in SOURCES for m, _, top in imports_of(p) if not top)
    assert deferred == [("evidence_audit.mutations.generations", "evidence_audit.tokens"),    # tokenizers, lazily
                        ("evidence_audit.mutations.scores", "evidence_audit.reading")], deferred


def test_no_rule_imports_another_rule():
    """What two experiments' rules share lives outside evidence_audit/rules/ (greedy.py, templates.py, shared.py,
    ...): no module of rules/ imports the module of another experiment's rule (registry.py names them)."""
    rules = {e.rule.partition(":")[0] for e in registry.EXPERIMENTS}
    found = [(module_name(p), m) for p in sorted((PACKAGE / "rules").glob("*.py")) for m, _, _ in imports_of(p)
             if m in rules and m != module_name(p)]
    assert len(rules) >= 5 and not found, found


def test_lm_eval_front_end_imports_no_rule(tmp_path):
    """`audit.py --lm-eval RUN_DIR` (the lm-eval front-end, lmeval/command.py) runs without importing any module of
    evidence_audit/rules/ (run.py evidence's rules) nor cli.py / driver.py, which import them."""
    run = REPO / "tests" / "fixtures" / "lmeval_versions" / "0.4.9.2" / "run"
    code = ("import json, runpy, sys\n"
            f"sys.argv = ['audit.py', '--lm-eval', {str(run)!r}, '--report', {str(tmp_path / 'r.json')!r}]\n"
            "try:\n"
            "    runpy.run_path('audit.py', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    code = e.code\n"
            "print(json.dumps([code, sorted(m for m in sys.modules if m.startswith('evidence_audit'))]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    exit_code, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert exit_code == 0
    assert "evidence_audit.lmeval.command" in loaded and "evidence_audit.lmeval.rescore" in loaded
    assert not [m for m in loaded if m == "evidence_audit.rules" or m.startswith("evidence_audit.rules.")
                or m in ("evidence_audit.cli", "evidence_audit.driver", "evidence_audit.shared")], loaded


def defined(name):
    """The modules of evidence_audit/ that define a function or class `name` (any nesting)."""
    return sorted(module_name(p) for p in SOURCES for n in ast.walk(TREES[p])
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)


def called(attr):
    """The modules of evidence_audit/ that call `<something>.attr(...)` or `attr(...)`."""
    def name(f):
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return sorted({module_name(p) for p in SOURCES for n in ast.walk(TREES[p])
                   if isinstance(n, ast.Call) and name(n.func) == attr})


def test_hflm_the_loader_and_the_chat_renderer_are_written_once():
    """One reading of HFLM's batches and scoring (hflm.py), one transformers loader (hflm.load_transformers, the
    only from_pretrained), one bounded Jinja sandbox for every template (templates.py), whichever front-end runs."""
    for name in ("lm_eval_groups", "score_requests", "score_with_margins", "load_transformers", "Scorer"):
        assert defined(name) == ["evidence_audit.hflm"], (name, defined(name))
    assert called("from_pretrained") == ["evidence_audit.hflm"]
    assert called("gather") and set(called("gather")) <= {"evidence_audit.hflm", "evidence_audit.forward"}
    assert [m for m in called("log_softmax")] == ["evidence_audit.forward", "evidence_audit.hflm"]  # own pass, HFLM
    for name in ("jinja", "template", "chat_renderer", "Unrenderable", "OverBound", "bounded"):
        assert defined(name) == ["evidence_audit.templates"], (name, defined(name))
    # a template is compiled and rendered in the bounded worker only (templates.serve), never in the audit itself
    assert called("from_string") == ["evidence_audit.templates"] and called("jinja") == ["evidence_audit.templates"]
    tree = TREES[next(p for p in SOURCES if module_name(p) == "evidence_audit.templates")]
    assert {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name != "jinja"
            for n in ast.walk(f) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "jinja"} == {"serve"}
    sandboxes = sorted(module_name(p) for p in SOURCES if "ImmutableSandboxedEnvironment" in
                       {getattr(n, "id", None) for n in ast.walk(TREES[p])})
    assert sandboxes == ["evidence_audit.templates"], sandboxes
