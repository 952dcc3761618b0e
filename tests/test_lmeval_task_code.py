"""audit.py --lm-eval --task-code: a task's own code (process_docs, doc_to_text / doc_to_target / doc_to_choice
functions) identified by the table of lm-eval's task files and run in the code sandbox (evidence_audit/lmeval/
task_code.py). Fast: what counts as code, the bounded search, the identification, the strict reading of the child's
result and the sandbox's bounds on the task's code. Slow: REAL lm-eval 0.4.9.2 runs of the STOCK hellaswag and
logiqa tasks (their installed YAML and Python file; only the data location changed to tests/fixtures/
lmeval_task_code/) on the tiny model, audited honest and forged."""
import hashlib
import importlib.util
import inspect
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, once_per_session, run_cli
from evidence_audit.lmeval import task_code
from evidence_audit.lmeval.docs import doc_hash
from evidence_audit.reading import Unreadable, sha256_text
from test_lmeval_audit import audit, failures, levels_failed

FIX = REPO / "tests" / "fixtures" / "lmeval_task_code"
MODEL = REPO / "tests" / "fixtures" / "lmeval_chat" / "model"
PROCESSED = "each logged doc == the task's process_docs(data rows) at its doc_id (and its doc_hash)"


def installed_tasks():
    """lm_eval/tasks/ of the lm-eval installed in this venv, located without importing lm_eval."""
    return Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks"


HELLASWAG = installed_tasks() / "hellaswag"


def hellaswag_source():
    text = (HELLASWAG / "utils.py").read_text(encoding="utf-8")
    return text, text[text.index("def process_docs"):]


# ---- fast: what is code, where it is, what it is ------------------------------------------------------------

@pytest.mark.parametrize("value, code", [
    ("def process_docs(dataset):\n    return dataset\n", True),
    ("@functools.cache\ndef f(doc):\n    return doc\n", True),
    ("doc_to_text = lambda doc: doc['q']\n", True),
    ("class Docs:\n    pass\n", True),
    ("<function process_docs at 0x7f3a2c1e0d30>", True),
    ("functools.partial(<function f at 0x7f>, n=2)", True),
    ("{{query}}", False), ("choices", False), ("Question: {{q}}\nAnswer:", False), ("def {{name}}():", False),
    (["a", "b"], False), (0, False), (None, False),
])
def test_what_counts_as_a_functions_logged_source(value, code):
    assert task_code.is_code(value) is code


def write(path, text, mode="w"):
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_text(text, encoding="utf-8") if mode == "w" else path.write_bytes(text))
    return path


def test_the_search_finds_the_file_holding_the_source_with_its_line_breaks(tmp_path):
    src = "def f(doc):\n    return doc\n"
    write(tmp_path / "a" / "other.py", "x = 1\n")
    crlf = write(tmp_path / "b" / "utils.py", ("import re\n\n" + src).replace("\n", "\r\n"))
    found = task_code.scan(tmp_path)
    assert task_code.locate("t", "process_docs", src, found).path == crlf       # linecache reads \r\n as \n
    indented = "    def f(doc):\n        return doc\n"
    with pytest.raises(task_code.NotRun, match=r"no \.py file under .* holds the process_docs source .*2 \.py files"):
        task_code.locate("t", "process_docs", indented, found)


def test_the_search_is_bounded_and_reads_no_symlink(tmp_path, monkeypatch):
    src = "def f(doc):\n    return doc\n"
    outside = write(tmp_path / "outside" / "utils.py", src)
    root = tmp_path / "root"
    (root / "linked").mkdir(parents=True)
    (root / "linked" / "utils.py").symlink_to(outside)
    (root / "dir").symlink_to(outside.parent, target_is_directory=True)
    write(root / "latin.py", b"# caf\xe9\n" + src.encode(), mode="b")
    write(root / "big.py", src + "#" * 200 + "\n")
    monkeypatch.setattr(task_code, "MAX_PY_BYTES", 100)
    found = task_code.scan(root)
    assert found.files == [] and sorted((p.name, why) for p, why in found.skipped) == [
        ("big.py", "228 bytes, over 100"), ("latin.py", "not UTF-8")]
    with pytest.raises(task_code.NotRun, match=r"0 \.py files searched; 2 not read: big\.py \(228 bytes"):
        task_code.locate("t", "process_docs", src, found)
    monkeypatch.setattr(task_code, "MAX_ENTRIES", 3)
    with pytest.raises(Unreadable, match=r"--task-code .*: more than 3 entries under it"):
        task_code.scan(root)
    with pytest.raises(Unreadable, match="not a directory"):
        task_code.scan(outside)


def test_files_with_the_same_function_and_other_contents_are_narrowed_by_the_task_yaml(tmp_path):
    """hellaswag's process_docs is in four files of lm-eval 0.4.9.2's tasks/ with three contents: the one beside a
    YAML naming the task is the task's; without one the search refuses to guess."""
    src = "def process_docs(ds):\n    return ds.map(prep)\n"
    write(tmp_path / "a" / "utils.py", "def prep(d):\n    return d\n\n\n" + src)
    write(tmp_path / "b" / "utils.py", "def prep(d):\n    return {}\n\n\n" + src)
    with pytest.raises(task_code.NotRun, match="2 .py files under .* hold the logged process_docs with different"):
        task_code.locate("mine", "process_docs", src, task_code.scan(tmp_path))
    write(tmp_path / "b" / "mine.yaml", "task: mine\nprocess_docs: !function utils.process_docs\n")
    assert task_code.locate("mine", "process_docs", src, task_code.scan(tmp_path)).path == tmp_path / "b" / "utils.py"
    found = task_code.scan(installed_tasks())
    assert task_code.locate("hellaswag", "process_docs", hellaswag_source()[1], found).path == HELLASWAG / "utils.py"


def run_as(*versions):
    return SimpleNamespace(release=SimpleNamespace(versions=versions))


def test_a_file_is_run_only_when_the_table_ships_its_bytes(tmp_path):
    text, _ = hellaswag_source()
    stock = task_code.PyFile(HELLASWAG / "utils.py", hashlib.sha256(text.encode()).hexdigest(), text)
    words = task_code.identified(stock, run_as("0.4.9.2"))
    assert words.startswith(f"{stock.path} = lm-eval 0.4.9.2's tasks/hellaswag/utils.py (sha256 {stock.sha256[:12]}")
    assert "NOT" not in words
    assert "; NOT a file of lm-eval 0.4.99, the release that wrote this run" in task_code.identified(stock,
                                                                                                     run_as("0.4.99"))
    edited = write(tmp_path / "hellaswag" / "utils.py", text.replace("  ", "   "))
    sha = hashlib.sha256(edited.read_bytes()).hexdigest()
    with pytest.raises(task_code.NotRun, match=f"{edited} \\(sha256 {sha}\\) is not a file any lm-eval release"):
        task_code.identified(task_code.PyFile(edited, sha, edited.read_text()), run_as("0.4.9.2"))
    with pytest.raises(task_code.NotRun, match="changed while the audit read it"):
        task_code.identified(task_code.PyFile(HELLASWAG / "utils.py", sha, text), run_as("0.4.9.2"))


def raw_of(body):
    """The result line the jail writes for f returning `body` (itself JSON text)."""
    return json.dumps({"outputs": [{"ok": True, "value": json.dumps(body, sort_keys=True)}]}).encode()


@pytest.mark.parametrize("raw, says", [
    (b"", "no readable result"),
    (b"\xff\xfe", "no readable result"),
    (b'{"outputs": [{"ok": true, "ok": true, "value": "{}"}]}', "no readable result"),
    (b'{"outputs": [{"ok": false, "error": "MemoryError"}]}', "ended without its result"),
    (b'{"error": "exec: SyntaxError"}', "ended without its result"),
    (raw_of('{"versions": {}, "splits": NaN}'), "no readable result"),
    (raw_of('{"error": "process_docs: KeyError: \'ctx_a\'"}'), "failed in the sandbox: process_docs: KeyError"),
    (raw_of('{"versions": {}, "splits": {}, "extra": 1}'), "an unexpected result"),
    (raw_of("[" * 100 + "]" * 100), "no readable result"),
])
def test_the_childs_result_is_read_strictly_and_never_trusted(raw, says):
    with pytest.raises(task_code.NotRun, match=says):
        task_code.child_result(SimpleNamespace(error=None, raw=raw))


@pytest.mark.parametrize("got, says", [
    ({"n": 2, "ids": [0], "docs": [{"a": 1}], "values": {}, "errors": {}}, "for ids \\[0\\], asked for \\[0, 1\\]"),
    ({"n": 2, "ids": [0, 1], "docs": [{"a": 1}, 3], "values": {}, "errors": {}}, "not objects"),
    ({"n": 2, "ids": [0, 1], "docs": [{}, {}], "values": {"doc_to_text": ["x"]}, "errors": {"doc_to_text": {}}},
     "not one per document"),
    ({"n": 2, "ids": [0, 1], "docs": [{}, {}], "values": {"doc_to_text": ["x", "y"]},
      "errors": {"doc_to_text": {"7": "boom"}}}, "not one per document"),
    ({"n": 2, "ids": [0, 1], "docs": [{}, {}], "values": {}, "errors": {}, "varies": 1}, "another random seed"),
])
def test_a_split_answered_in_another_shape_is_refused(got, says):
    got = {"varies": None, **got}           # the child always says whether process_docs varied with the seed
    fields = list(got["values"])
    with pytest.raises(task_code.NotRun, match=says):
        task_code.split_of("eval", got, [0, 1], fields)


def toy_job(text, source=None, rows=3):
    data = "".join(json.dumps({"q": i, "label": i % 2}) + "\n" for i in range(rows))
    return {"modules": [{"name": "utils", "path": "/task/utils.py", "text": text}],
            "functions": {"process_docs": [0, source or text[text.index("def process_docs"):]]},
            "splits": {"eval": {"format": "jsonl", "data": data, "ids": list(range(rows))}}}


def test_the_task_code_runs_in_the_sandbox_and_gives_processed_documents():
    text = ("import datasets\n\n\ndef process_docs(dataset: datasets.Dataset) -> datasets.Dataset:\n"
            "    return dataset.filter(lambda d: d['q'] != 1).map(lambda d: {'question': f\"Q{d['q']}\"})\n")
    ran = task_code.run_job(toy_job(text), {"process_docs": "x"}, "toy")
    split = ran.splits["eval"]
    assert split.n == 2 and split.docs == {0: {"q": 0, "label": 0, "question": "Q0"},
                                           1: {"q": 2, "label": 0, "question": "Q2"}}
    assert "run in the code sandbox (" in ran.note and "datasets" in ran.note


HOSTILE = {
    "loops forever": ("def process_docs(dataset):\n    while True:\n        pass\n", "did not finish"),
    "imports lm_eval": ("import lm_eval.api.task\n\ndef process_docs(dataset):\n    return dataset\n",
                        "executing /task/utils.py: ImportError: the task's code imports lm_eval"),
    "starts a process": ("import subprocess\n\ndef process_docs(dataset):\n"
                         "    subprocess.run(['/bin/true'])\n    return dataset\n", "process_docs: PermissionError"),
    "reads a host file": ("def process_docs(dataset):\n    open('/etc/passwd').read()\n    return dataset\n",
                          "process_docs: FileNotFoundError"),
    "allocates without end": ("def process_docs(dataset):\n    x = [bytearray(1 << 26) for _ in range(1000)]\n"
                              "    return dataset\n", "process_docs: MemoryError"),
    "answers too much": ("def process_docs(dataset):\n    return [{'x': 'y' * (1 << 21)}] * 8\n", "larger than"),
    "is not the logged function": ("def process_docs(dataset):\n    return dataset\n",
                                   "no function of /task/utils.py has the source lm-eval logged"),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "loops forever" else n
                                  for n in HOSTILE])       # that one waits for the wall-clock limit
def test_the_sandbox_bounds_the_task_code(name, monkeypatch):
    """Code that never ends, reaches for lm_eval, a process, a host file, unbounded memory or an oversized answer is
    stopped in the sandbox and becomes a reason the task was not run (never a traceback, never a finding)."""
    tight = {"wall_s": 5.0, "cpu_s": 4} if name == "loops forever" else {"wall_s": 120.0}    # a busy machine
    monkeypatch.setattr(task_code, "LIMITS", {**task_code.LIMITS, **tight, "memory_bytes": 2 << 30,
                                              "result_max_bytes": 4 << 20})
    text, says = HOSTILE[name]
    source = "def process_docs(dataset):\n    return dataset.shuffle()\n" if name.startswith("is not") else None
    with pytest.raises(task_code.NotRun, match=says):
        task_code.run_job(toy_job(text, source), {"process_docs": "x"}, "toy")


def test_process_results_code_skips_the_per_sample_row(tmp_path):
    """The per-sample metrics of a task with a process_results function are what it returns: not recomputed with
    the built-in definitions (which could FAIL an honest run or PASS what was not checked)."""
    from test_lmeval_audit import declare, toy_samples, write_run

    write_run(tmp_path / "run", toy_samples())
    declare(tmp_path / "run", process_results="def process_results(doc, results):\n    return {'acc': 1.0}\n")
    code, report = audit(tmp_path, tmp_path / "run")
    row = next(r for r in report["checks"] if r["check"].startswith("per-sample metrics"))
    assert row["status"] == "SKIPPED" and "process_results is task code" in row["note"] and code == 1


# ---- slow: real runs of stock tasks ---------------------------------------------------------------------------

def stock_task(where, task, data_files, folder=None, yamls=None):
    """The installed task folder copied to `where`: its YAML(s) with `dataset_path` (and `dataset_name`) replaced by
    the json loader and `data_files`, its Python files byte for byte."""
    src = installed_tasks() / (folder or task)
    where.mkdir(parents=True)
    for p in src.glob("*.py"):
        shutil.copyfile(p, where / p.name)
    files = "".join(f"    {split}: {path}\n" for split, path in data_files.items())
    for name in yamls or [f"{task}.yaml"]:
        text = (src / name).read_text(encoding="utf-8")
        lines = [ln for ln in text.splitlines() if not ln.startswith(("dataset_path:", "dataset_name:"))]
        head = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n{files}" if "dataset_path:" in text else ""
        (where / name).write_text(head + "\n".join(lines) + "\n", encoding="utf-8")
    return where


def offline_run(where, task, data_files, *more, folder=None, yamls=None):
    """tools/lmeval_offline_run.py (lm-eval 0.4.9.2's own CLI) on the stock task, the tiny model, batch size 4."""
    folder = stock_task(where / "task", task, data_files, folder, yamls)
    proc = run_cli("tools/lmeval_offline_run.py", "--model", "hf", "--model_args", f"pretrained={MODEL},dtype=float32",
                   "--include_path", folder, "--tasks", task, "--device", "cpu", "--batch_size", "4",
                   "--log_samples", "--output_path", where / "run", *more, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(where / "run")


HS_DATA = {"train": FIX / "hellaswag_train.jsonl", "validation": FIX / "hellaswag_validation.jsonl"}


@pytest.fixture(scope="session")
def hellaswag_run(tmp_path_factory):
    return Path(once_per_session(tmp_path_factory, "hellaswag_run",
                                 lambda where: offline_run(where, "hellaswag", HS_DATA))[1])


@pytest.fixture(scope="session")
def hellaswag_fewshot_run(tmp_path_factory):
    return Path(once_per_session(tmp_path_factory, "hellaswag_fewshot_run",
                                 lambda where: offline_run(where, "hellaswag", HS_DATA, "--num_fewshot", "2"))[1])


@pytest.fixture(scope="session")
def logiqa_run(tmp_path_factory):
    files = {s: FIX / "logiqa.jsonl" for s in ("train", "validation", "test")}
    return Path(once_per_session(tmp_path_factory, "logiqa_run",
                                 lambda where: offline_run(where, "logiqa", files, "--num_fewshot", "1"))[1])


@pytest.fixture(scope="session")
def truthfulqa_run(tmp_path_factory):
    """truthfulqa_mc2: its YAML includes truthfulqa_mc1.yaml (which names the dataset); process_results is
    utils.process_results_mc2 (numpy), and utils.py imports datasets, numpy, sacrebleu and rouge_score."""
    files = {"validation": FIX / "truthfulqa_mc.jsonl"}
    return Path(once_per_session(tmp_path_factory, "truthfulqa_run", lambda where: offline_run(
        where, "truthfulqa_mc2", files, folder="truthfulqa", yamls=["truthfulqa_mc1.yaml", "truthfulqa_mc2.yaml"]))[1])


def hellaswag_audit(tmp_path, run, *more):
    return audit(tmp_path, run, "--tokens", "--data", HS_DATA["validation"], "--model", MODEL, *more)


def rows_of(report, level="identity"):
    return {r["check"]: r for r in report["checks"] if r["level"] == level}


@pytest.mark.slow
def test_the_run_logs_process_docs_as_the_functions_source(hellaswag_run):
    """lm-eval dumps a `!function` field of the config as inspect.getsource of the function: the installed
    hellaswag YAML's `process_docs: !function utils.process_docs` is logged as that function's source text."""
    assert "process_docs: !function utils.process_docs" in (HELLASWAG / "hellaswag.yaml").read_text()
    spec = importlib.util.spec_from_file_location("utils", HELLASWAG / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = json.loads(next(hellaswag_run.rglob("results_*.json")).read_text(encoding="utf-8"))
    logged = results["configs"]["hellaswag"]["process_docs"]
    assert logged == inspect.getsource(module.process_docs) == hellaswag_source()[1]


@pytest.mark.slow
@pytest.mark.parametrize("where", [HELLASWAG, installed_tasks()], ids=["task folder", "tasks tree"])
def test_an_honest_stock_hellaswag_run_passes_with_its_task_code(hellaswag_run, tmp_path, where):
    code, report = hellaswag_audit(tmp_path, hellaswag_run, "--task-code", where)
    assert code == 0 and report["n_fail"] == 0 and report["result"].startswith("PASS"), report["result"]
    rows = rows_of(report)
    for check in (PROCESSED, "target re-rendered from doc_to_target"):
        assert rows[check]["status"] == "PASS" and rows[check]["items"] == 6, rows[check]
    assert next(r for c, r in rows.items() if c.startswith("prompt re-rendered"))["status"] == "PASS"
    assert next(r for c, r in rows.items() if c.startswith("continuation token boundaries"))["status"] == "PASS"
    note = rows[PROCESSED]["note"]
    assert f"{HELLASWAG / 'utils.py'} = lm-eval 0.4.9.2's tasks/hellaswag/utils.py" in note and "NOT" not in note
    assert "run in the code sandbox (" in note


@pytest.mark.slow
def test_without_task_code_the_docs_row_is_skipped_naming_the_flag(hellaswag_run, tmp_path, capsys):
    code, report = hellaswag_audit(tmp_path, hellaswag_run)
    row = rows_of(report)[PROCESSED]
    assert code == 1 and report["n_fail"] == 0 and report["result"].startswith("INCOMPLETE"), report["result"]
    assert row["status"] == "SKIPPED" and row["requested"] and "pass --task-code" in row["note"], row
    assert "RESULT: PASS" not in capsys.readouterr().out


def forge(run, tmp_path, edit):
    """A copy of `run` with edit(samples) applied to the hellaswag samples, written back with each doc_hash and the
    results' task_hashes recomputed as lm-eval computes them (everything the run alone can check agrees)."""
    copy = shutil.copytree(run, tmp_path / "forged")
    samples_path = next(copy.rglob("samples_hellaswag_*.jsonl"))
    results_path = next(copy.rglob("results_*.json"))
    rows = [json.loads(line) for line in samples_path.read_text(encoding="utf-8").splitlines()]
    edit(rows)
    for r in rows:
        r["doc_hash"] = doc_hash(r["doc"])
    samples_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    results = json.loads(results_path.read_text(encoding="utf-8"))
    results["task_hashes"]["hellaswag"] = sha256_text("".join(r["doc_hash"] + r["prompt_hash"] + r["target_hash"]
                                                              for r in rows))
    results_path.write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")
    return copy


@pytest.mark.slow
def test_a_logged_doc_that_is_not_process_docs_of_its_row_fails_at_the_identity_level(hellaswag_run, tmp_path):
    def edit(rows):
        rows[2]["doc"]["gold"] = 3              # process_docs makes it int(label) = 0; nothing else reads it
    copy = forge(hellaswag_run, tmp_path, edit)
    code, report = audit(tmp_path, copy)
    assert code == 0, report["result"]          # the run alone agrees with itself
    code, report = hellaswag_audit(tmp_path, copy, "--task-code", HELLASWAG)
    assert code == 1 and levels_failed(report) == {"identity"}, report["result"]
    found = failures(report, "process_docs(data rows)")
    assert len(found) == 2 and found[0] == \
        "doc_id 2 (line 3, filter none) doc.gold: logged 3, process_docs(data) document 2 has 0", found
    assert found[1].startswith("doc_id 2 (line 3, filter none) doc_hash: recorded ") and \
        found[1].endswith("(recomputed from process_docs(data) document 2)")


@pytest.mark.slow
def test_a_forged_query_and_prompt_fail_both_rows(hellaswag_run, tmp_path):
    """The query edited together with every request's context and prompt_hash: the prompt, rendered on the
    processed document, names the same doc."""
    def edit(rows):
        old = rows[4]["doc"]["query"]
        rows[4]["doc"]["query"] = old.replace("plates", "cups")
        for a in rows[4]["arguments"].values():
            a["arg_0"] = a["arg_0"].replace(old, rows[4]["doc"]["query"])
        rows[4]["prompt_hash"] = sha256_text(rows[4]["arguments"]["gen_args_0"]["arg_0"])
    code, report = hellaswag_audit(tmp_path, forge(hellaswag_run, tmp_path, edit), "--task-code", HELLASWAG)
    assert code == 1 and levels_failed(report) == {"identity"}
    assert failures(report, "process_docs(data rows)")[0].startswith("doc_id 4 (line 5, filter none) doc.query: ")
    assert {f.split(" (")[0] for f in failures(report, "prompt re-rendered")} == {"doc_id 4"}


@pytest.mark.slow
def test_a_task_file_edited_after_the_run_is_not_run(hellaswag_run, tmp_path, capsys):
    """The task's folder with utils.py changed (process_docs itself untouched, so the search still finds it): its
    sha256 is no release's, so it never runs: the rows that need it are SKIPPED naming the file and its hash, the
    verdict INCOMPLETE: not PASS, and not FAIL either, although the edited code would give other documents."""
    folder = shutil.copytree(HELLASWAG, tmp_path / "hellaswag")
    utils = folder / "utils.py"
    utils.write_text(utils.read_text().replace('text.replace("  ", " ")', 'text.upper()'), encoding="utf-8")
    sha = hashlib.sha256(utils.read_bytes()).hexdigest()
    code, report = hellaswag_audit(tmp_path, hellaswag_run, "--task-code", folder)
    row = rows_of(report)[PROCESSED]
    assert code == 1 and report["n_fail"] == 0 and report["result"].startswith("INCOMPLETE"), report["result"]
    assert row["status"] == "SKIPPED" and row["requested"], row
    assert f"{utils} (sha256 {sha}) is not a file any lm-eval release read ships" in row["note"], row["note"]
    assert "RESULT: PASS" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_few_shot_run_draws_its_examples_from_the_processed_few_shot_split(hellaswag_fewshot_run, tmp_path):
    code, report = hellaswag_audit(tmp_path, hellaswag_fewshot_run, "--task-code", HELLASWAG, "--fewshot-data",
                                   HS_DATA["train"])
    assert code == 0 and report["n_fail"] == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    prompt = next(r for c, r in rows_of(report).items() if c.startswith("prompt re-rendered"))
    assert prompt["status"] == "PASS" and prompt["note"].startswith("num_fewshot 2, fewshot_seed 1234")
    contexts = [json.loads(line)["arguments"]["gen_args_0"]["arg_0"]
                for line in next(hellaswag_fewshot_run.rglob("samples_*.jsonl")).read_text().splitlines()]
    # a processed training document among the examples (process_docs capitalised its ctx_b "he")
    assert any("Riding a bike: A boy pushes a red bicycle onto the road. He climbs" in c for c in contexts)


@pytest.mark.slow
def test_doc_to_text_and_doc_to_target_functions_render_the_prompts(logiqa_run, tmp_path):
    """logiqa's doc_to_text and doc_to_target are functions of utils_logiqa.py: run in the sandbox, they give every
    logged context (one-shot) and target; without --task-code both rows are SKIPPED naming it."""
    data = FIX / "logiqa.jsonl"
    args = ("--tokens", "--data", data, "--fewshot-data", data, "--model", MODEL)
    code, report = audit(tmp_path, logiqa_run, *args, "--task-code", installed_tasks())
    assert code == 0 and report["n_fail"] == 0, [r["first_failure"] for r in report["checks"] if r["status"] != "PASS"]
    rows = rows_of(report)
    target = rows["target re-rendered from doc_to_target"]
    assert target["status"] == "PASS" and "tasks/logiqa/utils_logiqa.py" in target["note"]
    assert next(r for c, r in rows.items() if c.startswith("prompt re-rendered"))["status"] == "PASS"
    code, report = audit(tmp_path, logiqa_run, *args)
    skipped = [r for r in report["checks"] if r["status"] == "SKIPPED" and "--task-code" in r["note"]]
    assert code == 1 and report["n_fail"] == 0 and {r["check"].split(" ")[0] for r in skipped} == {"target", "prompt"}


@pytest.mark.parametrize("make, says", [
    (lambda tmp: tmp / "nowhere", "not a directory (expected a task's folder or an lm_eval/tasks tree)"),
    (lambda tmp: write(tmp / "file.py", "x = 1\n"), "not a directory"),
])
def test_a_bad_task_code_dir_is_one_line_exit_2(tmp_path, make, says):
    from test_lmeval_audit import declare, toy_samples, write_run

    write_run(tmp_path / "run", toy_samples())
    declare(tmp_path / "run", process_docs="def process_docs(ds):\n    return ds\n")
    data = write(tmp_path / "data.jsonl", "".join(json.dumps({"q": i, "label": i % 2}) + "\n" for i in range(3)))
    proc = run_cli("audit.py", "--lm-eval", tmp_path / "run", "--tokens", "--data", data, "--task-code",
                   make(tmp_path), "--report", tmp_path / "r.json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr


RESULTS = "per-sample metrics from the task's process_results (its code, on the processed doc and filtered_resps)"


@pytest.mark.slow
def test_a_process_results_function_gives_the_per_sample_metrics(truthfulqa_run, tmp_path):
    """truthfulqa_mc2's acc is process_results_mc2's normalised probability mass of the true answers: run in the
    sandbox on each logged sample's responses it gives every logged acc; one acc forged, with the aggregate and its
    stderr recomputed from the samples (the arithmetic level then agrees), FAILs at the identity level only."""
    import math
    import statistics

    args = ("--tokens", "--data", FIX / "truthfulqa_mc.jsonl", "--model", MODEL, "--task-code", installed_tasks())
    code, report = audit(tmp_path, truthfulqa_run, *args)
    assert code == 0 and report["n_fail"] == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    row = rows_of(report)[RESULTS]
    assert row["status"] == "PASS" and row["items"] == 4
    arithmetic = next(r for r in report["checks"] if r["check"] == "per-sample metrics recomputed")
    assert arithmetic["status"] == "SKIPPED" and not arithmetic["requested"]

    copy = shutil.copytree(truthfulqa_run, tmp_path / "forged")
    samples_path, results_path = next(copy.rglob("samples_*.jsonl")), next(copy.rglob("results_*.json"))
    rows = [json.loads(line) for line in samples_path.read_text(encoding="utf-8").splitlines()]
    rows[1]["acc"] = 0.875
    samples_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    results = json.loads(results_path.read_text(encoding="utf-8"))
    accs = [r["acc"] for r in rows]
    results["results"]["truthfulqa_mc2"]["acc,none"] = sum(accs) / len(accs)
    results["results"]["truthfulqa_mc2"]["acc_stderr,none"] = statistics.stdev(accs) / math.sqrt(len(accs))
    results_path.write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")
    code, report = audit(tmp_path, copy, *args)
    assert code == 1 and levels_failed(report) == {"identity"}, report["result"]
    found = failures(report, "process_results")
    assert len(found) == 1 and found[0].startswith("doc_id 1 (line 2, filter none) acc: recorded 0.875, recomputed ")
    code, report = audit(tmp_path, truthfulqa_run, "--tokens", "--data", FIX / "truthfulqa_mc.jsonl")
    row = rows_of(report)[RESULTS]
    assert code == 1 and row["status"] == "SKIPPED" and "--task-code" in row["note"] and report["n_fail"] == 0
