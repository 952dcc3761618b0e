"""The structure that keeps the code and its documentation readable: short functions, a short audit CLI, no cited
file outside the repo; a README of at most 250 lines that reaches every docs/ page, links that resolve, quoted
commands whose scripts answer --help, and no stale timing in the README (those live in docs/measurements.md).

(The import-direction rules are checked next to the code they protect: tests/test_audit.py for the audit package,
tests/test_prepare.py for the bottom layer and bench.py, tests/test_harness.py for harness/.)"""
import ast
import re
import subprocess
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


# ---- the README and docs/ -------------------------------------------------------------------------------------

README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 250
# the README's two commands, byte for byte (.ci/run runs the second)
SETUP_COMMAND = ("python3.11 -m venv .venv && .venv/bin/pip install -r requirements.lock && .venv/bin/python "
                 "prepare.py --cache ./cache && .venv/bin/python run.py --cache ./cache --out smoke --smoke")
TEST_COMMAND = ".venv/bin/python -m pytest -q tests"
# the repository's scripts a command line in the README or docs/ may invoke (each must answer --help with exit 0)
SCRIPTS = ("run.py", "prepare.py", "audit.py", "report.py", "bench.py", "synth_mctaco.py", "-m harness",
           "tools/lmeval_offline_run.py", "tools/make_task_file_table.py", "tools/stock_task_run.py",
           "tools/measure_forward_sample.py")
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")


def doc_pages():
    return [README, *sorted(DOCS.rglob("*.md"))]


def code_blocks(text):
    """The fenced code blocks of a Markdown text, each as its list of lines."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def command_lines(text):
    """Every command line of the code blocks (backslash continuations joined, comments dropped)."""
    lines = []
    for block in code_blocks(text):
        joined = "\n".join(block).replace("\\\n", " ")
        lines += [ln.split(" #")[0].strip() for ln in joined.splitlines()
                  if ln.strip() and not ln.lstrip().startswith("#")]
    return lines


def slug(heading):
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(path):
    """(line number, target) of every link of a page that is not a URL, outside code blocks."""
    found, in_code = [], False
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                found.append((lineno, target))
    return found


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"


def test_readme_keeps_the_two_commands_and_ci_runs_the_second():
    blocks = ["\n".join(b).strip() for b in code_blocks(README.read_text(encoding="utf-8"))]
    assert SETUP_COMMAND in blocks and TEST_COMMAND in blocks, "the README's two commands changed"
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if ln.strip() and not ln.startswith("#")]
    assert TEST_COMMAND in ci, ".ci/run must run the README's test command"
    # then only the kernel tier again, restricted to AVX2: the same tests, never fewer
    after = " ".join(ci[ci.index(TEST_COMMAND) + 1:]).replace("\\ ", "")
    assert after == ("MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
                     f"{TEST_COMMAND} -m kernels"), after


def test_every_relative_link_resolves():
    broken = []
    for page in doc_pages():
        for lineno, target in relative_links(page):
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(REPO)}:{lineno} -> {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_reached_from_the_readme():
    reached, todo = set(), [README.resolve()]
    while todo:
        page = todo.pop()
        if page in reached or not page.exists() or page.suffix != ".md":
            continue
        reached.add(page)
        todo += [(page.parent / t.partition("#")[0]).resolve() for _, t in relative_links(page) if t.partition("#")[0]]
    orphans = [str(p.relative_to(REPO)) for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in reached]
    assert not orphans, "docs pages no link from the README leads to: " + ", ".join(orphans)


def test_readme_quotes_no_timing():
    """Timings, benchmark figures and test counts go stale: they live in docs/measurements.md, dated."""
    stale = re.compile(r"\b\d[\d,.]*\s?(?:s|ms|min|minutes?|seconds?|hours?|h|GFLOPS|tok/s|items/s|passed|"
                       r"failed|skipped)\b")
    found = [f"README.md:{i}: {ln.strip()}" for i, ln in enumerate(README.read_text(encoding="utf-8").splitlines(), 1)
             if stale.search(re.sub(r"`[^`]*`", "", ln))]
    assert not found, "\n".join(found)


def scripts_invoked(line):
    """The repository scripts a command line runs: what follows python (or torchrun, accelerate launch) in each of
    its commands; `-m harness` is the harness, other modules (pytest, venv) are not scripts."""
    found = []
    for command in re.split(r"&&|\|\||;|\|", line):
        words = command.split()
        if not words or not re.fullmatch(r"(?:python[\d.]*|torchrun|accelerate)", words[0].rsplit("/", 1)[-1]):
            continue
        for i, word in enumerate(words[1:], 1):
            if word == "-m" and i + 1 < len(words):
                found += ["-m harness"] if words[i + 1] == "harness" else []
                break
            if word.endswith(".py"):
                found.append(word.removeprefix("./"))
                break
    return found


def test_every_script_the_docs_run_answers_help():
    import subprocess
    import sys

    used, unknown = set(), []
    for page in doc_pages():
        for line in command_lines(page.read_text(encoding="utf-8")):
            for name in scripts_invoked(line):
                (used.add(name) if name in SCRIPTS else unknown.append(f"{page.relative_to(REPO)}: {line}"))
    assert not unknown, "command lines run a script that is not one of the repository's:\n" + "\n".join(unknown)
    assert used, "no command line found"
    procs = {s: subprocess.Popen([sys.executable, *s.split(), "--help"], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for s in sorted(used)}
    failed = []
    for script, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0 or "usage" not in out.lower():
            failed.append(f"{script} --help: exit {proc.returncode}\n{out[-800:]}")
    assert not failed, "\n".join(failed)


def test_nothing_imports_a_script():
    """The scripts are the top layer: no module of the repository (tools/ included, tests aside) imports one, so a
    script can change its command line without breaking the code below it (run.py writes the page through
    evidence_report, not through report.py)."""
    scripts = {"run", "prepare", "audit", "report", "bench", "synth_mctaco"}
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                            capture_output=True, check=True, text=True).stdout.split()
    found = []
    for rel in sorted(set(listed)):
        if rel.startswith("tests/") or not (REPO / rel).is_file():
            continue
        for node in ast.walk(ast.parse((REPO / rel).read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            found += [f"{rel}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in scripts]
    assert not found, found


def test_the_readme_names_the_experiments_in_the_order_they_run():
    """The README's list and table of experiments follow registry.py's order, which run.py and the report follow."""
    import registry

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"Under `smoke/`, per experiment \(([^:]*):", readme).group(1)
    assert re.findall(r"`(\w+)`", listed) == list(registry.NAMES), listed
    table = re.findall(r"^\| `(\w+)` \|", readme, flags=re.M)
    assert table == list(registry.NAMES), table
