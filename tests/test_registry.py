"""registry.py: each experiment declared once, and every list the code reads derived from it.

Fast: every derived list agrees with the registry (run.py's --experiment choices, experiments.EXPERIMENTS, the audit's
RULES and CONFIG_SECTIONS, the report's SECTIONS, config.py's sections, each runner's NAME and CONFIG_SECTIONS), and
registry.py is a leaf the audit and the report may import.

Slow: ARCHITECTURE.md's "Adding an experiment" followed in a copy of the repository. A toy score-twice experiment
(the SST-2 items through lm-eval and the independent path, joined and compared by two_paths) is added by writing
three modules and one registry entry, committed there, and the guard tests run in the copy; then it goes through the
real run.py (on the tiny random model), audit.py and report.py: the audit passes and the page shows the toy's own
section; an edit of its evidence fails the audit.
"""
import ast
import importlib
import json
import re
import shutil
import subprocess
import sys

import pytest

import config
import registry
from conftest import REPO, run_cli

FIRST_FIVE = ("protocol", "options", "harness", "mctaco", "extraction")   # the order run.py --smoke runs them


# ---- fast: the derived lists agree with the registry ------------------------------------------------------------

def test_names_are_unique_and_in_run_order():
    assert len(set(registry.NAMES)) == len(registry.NAMES)
    assert registry.NAMES[:5] == FIRST_FIVE
    assert all(e.name.isidentifier() for e in registry.EXPERIMENTS)


def test_config_sections_are_config_py_sections():
    """config.py holds exactly the sections some experiment reads; each experiment reads "shared" first."""
    for e in registry.EXPERIMENTS:
        assert e.config_sections[0] == "shared", e
        assert len(set(e.config_sections)) == len(e.config_sections), e
        assert all(s in config.CONFIG for s in e.config_sections), e
    assert set(config.CONFIG) == set(registry.CONFIG_SECTIONS)
    assert registry.CONFIG_SECTIONS[0] == "shared"


def test_runner_list_and_modules_agree(capsys):
    import run
    from experiments import EXPERIMENTS

    assert EXPERIMENTS == list(registry.NAMES)
    with pytest.raises(SystemExit):
        run.parse_args(["--cache", "-", "--out", "-", "--experiment", "no-such-experiment"])
    line = next(ln for ln in capsys.readouterr().err.splitlines() if "invalid choice" in ln)
    choices = [c.strip(" '") for c in line.split("choose from", 1)[1].strip(" )").split(",")]
    assert choices == list(registry.NAMES)                          # run.py --experiment
    for e in registry.EXPERIMENTS:
        module = importlib.import_module(e.runner)
        assert e.runner.startswith("experiments.")
        assert module.NAME == e.name
        assert tuple(module.CONFIG_SECTIONS) == e.config_sections
        assert callable(module.run) and callable(module.data_label)


def test_audit_lists_agree():
    from evidence_audit import shared
    from evidence_audit.rules import RULES

    assert list(RULES) == list(registry.NAMES)
    for e in registry.EXPERIMENTS:
        module, _, function = e.rule.partition(":")
        assert module.startswith("evidence_audit.rules.")
        assert RULES[e.name] is getattr(importlib.import_module(module), function)
        assert callable(RULES[e.name])
    assert shared.CONFIG_SECTIONS == registry.CONFIG_SECTIONS


def test_report_sections_agree():
    from evidence_report.sections import SECTIONS

    assert list(SECTIONS) == list(registry.NAMES)
    for e in registry.EXPERIMENTS:
        module = SECTIONS[e.name]
        assert module.__name__ == e.section and e.section.startswith("evidence_report.sections.")
        assert module.NAME == e.name and callable(module.render)


def test_registry_is_a_leaf():
    """The audit and the report import registry.py; it imports only the standard library, statically."""
    tree = ast.parse((REPO / "registry.py").read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            assert name not in ("__import__", "import_module", "exec", "eval"), name
    assert roots <= set(sys.stdlib_module_names), roots


def test_find_and_config_sections():
    assert registry.find("protocol").config_sections == ("shared", "protocol")
    assert registry.find("no-such-experiment") is None
    with pytest.raises(KeyError):
        registry.config_sections("no-such-experiment")


def test_file_lists_and_code_files_derive_from_the_registry():
    """The audit's lists of the files each experiment writes and the hashed code files are views of registry.py, so
    declaring an experiment there is all evidence.py and the audit's driver need."""
    from evidence_audit import driver
    from experiments import evidence

    for e in registry.EXPERIMENTS:
        assert driver.PRIVATE_FILES[e.name] == e.private_files
        assert driver.PUBLIC_EXTRAS[e.name] == e.public_extras
        assert driver.TOP_OF_EXPERIMENT[e.name] == e.top_files
        assert e.code_files[0] == e.runner.replace(".", "/") + ".py", e
        assert set(e.code_files) <= set(evidence.CODE_FILES), e
        assert all((REPO / f).is_file() for f in e.code_files), e
    assert set(evidence.CODE_FILES) == set(evidence.SHARED_CODE_FILES) | set(registry.CODE_FILES)


def test_run_refuses_files_the_registry_does_not_declare():
    import run
    from experiments.context import Result

    declared = registry.find("harness")
    result = Result(config={}, records=[], summary={}, headline="", token_stats={}, prompt_template_sha256="",
                    public={"leaderboard.json": "{}"}, private={"leaderboard.json": "{}", "tasks/a.jsonl": ""})
    assert run.undeclared_files(declared, result) is None            # private files beyond the declared ones: allowed
    result.public["notes.md"] = ""
    assert "public files ['leaderboard.json', 'notes.md']" in run.undeclared_files(declared, result)
    del result.public["notes.md"]
    del result.private["leaderboard.json"]
    assert "did not write leaderboard.json" in run.undeclared_files(declared, result)


# Where an experiment's name may be written as a string literal: the registry, config.py (its section of settings),
# the experiment's own modules, and these, each for its reason.
NAME_LITERALS_ALLOWED = {
    "evidence_audit/mutations/": "the self-test's tamper kinds: each edits one named experiment's evidence (test data)",
    "bench.py": "the `options` benchmark method times that experiment's own code",
    "resources.py": "the MC-TACO data schema, named after the dataset, not after the experiment that reads it",
}


def own_modules(name):
    return (f"experiments/{name}.py", f"experiments/{name}_", f"evidence_audit/rules/{name}.py",
            f"evidence_audit/rules/{name}_", f"evidence_report/sections/{name}.py", f"{name}/")


def test_no_experiment_name_is_written_outside_its_own_modules():
    """An experiment is named in registry.py and in its own modules; the code that serves every experiment (run.py,
    experiments/evidence.py, the audit's driver, the report) reads the registry instead, so adding or renaming one
    edits none of it. Counted by AST: string constants equal to a declared name."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                            capture_output=True, check=True, text=True).stdout.split()
    found = []
    for rel in sorted(set(listed)):
        if rel.startswith(("tests/", "tools/")) or rel in ("registry.py", "config.py") \
                or rel.startswith(tuple(NAME_LITERALS_ALLOWED)) or not (REPO / rel).is_file():
            continue
        for node in ast.walk(ast.parse((REPO / rel).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in registry.NAMES \
                    and not rel.startswith(own_modules(node.value)):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, found


# ---- slow: adding an experiment, in a copy of the repository -----------------------------------------------------

TOY_RUNNER = '''"""toy: the SST-2 items scored twice (lm-eval's glue/sst2 task and the independent path), joined on identity and
compared by two_paths. A test of the registry and the pipeline, not a study."""
import hashlib

import registry
from experiments import official, two_paths
from experiments.context import Result
from experiments.evidence import jsonl
from experiments.selection import config_head, load_rows, select_items

NAME = "label_count"
CONFIG_SECTIONS = registry.config_sections(NAME)
TASK = two_paths.LoggedTask(fields=(("doc.idx", "doc.idx", "idx"), ("label", "doc.label", "label")),
                            text_fields=("idx", "prompt"))


def data_label(ctx):
    return ctx.data.id


def official_part(ctx, lm, items):
    cfg = official.task_config("tasks/glue/sst2/default.yaml", ctx.data.parquet_path)
    results = official.evaluate(lm, cfg, "sst2", sorted(it["idx"] for it in items), ctx.config["seed"])
    meta = {"lm_eval": official.version(), **official.lm_facts(lm, ctx.inputs.model_dir, ctx.config)}
    return two_paths.logged_samples(lm, items, results["samples"]["sst2"]), meta


def run(ctx):
    rows, c = load_rows(ctx.data.parquet_path), ctx.config
    idx_list = select_items(c, ctx.split, len(rows))
    items = [{"idx": i, "label": rows[i]["label"], "sentence": rows[i]["sentence"],
              "prompt": c["sst2_prompt"].format(sentence=rows[i]["sentence"]),
              "candidates": [c["target_delimiter"] + choice for choice in c["sst2_choices"]]} for i in idx_list]
    template = hashlib.sha256(c["sst2_prompt"].encode("utf-8")).hexdigest()
    call = two_paths.Call(items, lambda lm, part: official_part(ctx, lm, part), unit=two_paths.prompt_unit)
    scored = two_paths.score_twice(ctx, {"": call}, template)
    with ctx.stages.stage("compare"):
        records, texts, _ = two_paths.compare_logged(ctx, TASK, items, scored)
    n_positive = sum(r["label"] == 1 for r in records)
    summary = {"experiment": NAME, "split": ctx.split, "n_items": len(records), "n_positive": n_positive,
               "agreement": two_paths.agreement(records)}
    return Result(config=config_head(ctx, NAME, len(rows), idx_list), records=records, summary=summary,
                  headline=f"{n_positive} of {len(records)} labels positive, both paths agree",
                  token_stats=two_paths.candidate_token_stats(records), private={"texts.jsonl": jsonl(texts)},
                  prompt_template_sha256=template)
'''

TOY_RULE = '''"""toy: the selection, the label count and the largest score difference recomputed from the records."""
from evidence_audit.shared import (environment_check, hash_selection, hash_selection_problems, model_problems,
                                   rank_order_problems, required_files, run_levels, split_problems, stages_check,
                                   summary_check)

A = "arithmetic"


def audit_label_count(C, name, out, levels, cache):
    return run_levels(C, name, out, levels, cache, arithmetic, identity, no_forward="the toy has no forward rule")


def arithmetic(C, name, ev):
    if not required_files(C, name, ev):
        return None
    cfg, bad = ev["config"], []
    split = split_problems(bad, name, cfg)
    hash_selection_problems(bad, cfg)
    model_problems(bad, cfg)
    C.add(name, A, "config consistency", 1, bad)
    environment_check(C, name, ev)
    records = ev["records"]
    want, why, settings = hash_selection(cfg)
    C.add(name, A, "item selection", len(records),
          [why] if want is None else rank_order_problems([r["idx"] for r in records], want, settings))
    diffs = [d for r in records for d in r["abs_diff"]]
    expected = {"experiment": name, "split": split, "n_items": len(records),
                "n_positive": sum(r["label"] == 1 for r in records),
                "agreement": {**ev["summary"]["agreement"], "max_abs_diff": max(diffs, default=0.0)}}
    summary_check(C, name, ev, expected, "summary.json values", len(records))
    stages_check(C, name, ev, None, len(records))
    return records


def identity(C, name, out, ev, records, model_dir, parquet):
    C.skip(name, "identity", "labels", "the toy does not re-read the data")
'''

TOY_SECTION = '''"""toy: the label count."""
from evidence_report.tables import kv_table

NAME = "label_count"


def render(exp_dir, summary, layout):
    return kv_table([("items", summary["n_items"]), ("positive labels", summary["n_positive"])], "toy-counts",
                    layout=layout)
'''

TOY_LINE = '    declare("label_count", ("shared", "protocol"), private_files=("texts.jsonl",)),\n'


def repository_copy(dest):
    """The working tree's files (tracked, and new ones not ignored) copied to dest; the venv is this process's."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def add_toy(repo):
    """ARCHITECTURE.md's steps: three modules and one registry line. Returns the files touched."""
    (repo / "experiments" / "label_count.py").write_text(TOY_RUNNER)
    (repo / "evidence_audit" / "rules" / "label_count.py").write_text(TOY_RULE)
    (repo / "evidence_report" / "sections" / "label_count.py").write_text(TOY_SECTION)
    reg = repo / "registry.py"
    text = reg.read_text()
    end = text.index("\n)\n", text.index("EXPERIMENTS = (")) + 1        # the closing parenthesis of EXPERIMENTS
    reg.write_text(text[:end] + TOY_LINE + text[end:])
    return ["experiments/label_count.py", "evidence_audit/rules/label_count.py", "evidence_report/sections/label_count.py", "registry.py"]


def add_toy_docs(repo):
    """What is the toy's own beyond code: its docs page, linked from README.md's table and named in its run-order
    list (the layout tests check both). Returns the files touched."""
    (repo / "docs" / "label_count.md").write_text("# label_count\n\nA toy: the SST-2 labels counted. It means nothing.\n")
    readme = repo / "README.md"
    text = readme.read_text(encoding="utf-8")
    text = text.replace("`extraction`: the order they run in", "`extraction`, `label_count`: the order they run in", 1)
    row = re.search(r"^\| `extraction` \|.*\n", text, flags=re.M)
    text = (text[:row.end()] + "| `label_count` | how many positive labels? | [docs/label_count.md](docs/label_count.md) |\n"
            + text[row.end():])
    readme.write_text(text, encoding="utf-8")
    return ["README.md", "docs/label_count.md"]


def snapshot(repo):
    """Every file of the copy -> its bytes (the copy is small: source, fixtures, docs)."""
    return {str(p.relative_to(repo)): p.read_bytes() for p in repo.rglob("*") if p.is_file()}


def changed_files(before, after):
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def in_copy(repo, *args):
    return run_cli(*args, cwd=repo, timeout=900)


@pytest.mark.slow
def test_adding_an_experiment_touches_four_files(tiny_cache, tmp_path):
    repo = repository_copy(tmp_path / "repo")
    before = snapshot(repo)
    touched = add_toy(repo)
    assert changed_files(before, snapshot(repo)) == sorted(touched) and len(touched) <= 4
    docs = add_toy_docs(repo)
    assert changed_files(before, snapshot(repo)) == sorted(touched + docs)
    # the toy committed in the copy, and the guard tests run there: the registry's derived lists, the code files
    # hashed into every identity, the module contract and the layout hold with no other file edited
    git = ["git", "-c", "user.name=toy", "-c", "user.email=toy@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the toy experiment"]):
        subprocess.run(git + args, cwd=repo, check=True, capture_output=True)
    proc = run_cli("-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow",
                   "tests/test_registry.py", "tests/test_layout.py", "tests/test_result_cache.py::"
                   "test_code_files_exist_and_every_module_the_experiments_import_is_listed_or_excluded",
                   cwd=repo, timeout=900, unset=("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                                                 "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST"))
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]

    out = tmp_path / "O"
    proc = in_copy(repo, "run.py", "--cache", tiny_cache, "--out", out, "--smoke", "--experiment", "label_count",
                   "--model", "tiny-random-llama")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "label_count" / "summary.json").read_text())
    assert summary["n_items"] == 2 and summary["split"] == "smoke", summary

    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered)
    proc = in_copy(repo, "audit.py", out)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout + proc.stderr
    rows = [c for c in json.loads((out / "audit.json").read_text())["checks"] if c["experiment"] == "label_count"]
    names = {c["check"] for c in rows if c["status"] == "PASS"}
    assert {"config consistency", "item selection", "summary.json values"} <= names, rows

    page_dir = tmp_path / "page"
    shutil.copytree(out, page_dir)
    proc = in_copy(repo, "report.py", page_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in (out / "report.html", page_dir / "report.html"):          # run.py's own page, and report.py's
        html = page.read_text()
        assert '<section id="label_count">' in html and 'id="toy-counts"' in html, page
        assert "render-error" not in html.split('<section id="label_count">')[1], page

    # one label flipped, and the forger's reseal of MANIFEST.json: the toy's own rule must catch it
    records = tampered / "label_count" / "records.jsonl"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    lines[0]["label"] = 1 - lines[0]["label"]
    records.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in lines))
    reseal = "import sys; from evidence_audit.manifest import reseal; reseal(__import__('pathlib').Path(sys.argv[1]))"
    proc = in_copy(repo, "-c", reseal, tampered)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = in_copy(repo, "audit.py", tampered)
    assert proc.returncode == 1 and "RESULT: FAIL" in proc.stdout, proc.stdout + proc.stderr
    failed = [c for c in json.loads((tampered / "audit.json").read_text())["checks"] if c["status"] == "FAIL"]
    assert [(c["experiment"], c["check"]) for c in failed] == [("label_count", "summary.json values")], failed
