"""The mini harness: metrics, task loading, runner, leaderboard, diff, CLI, its layering, the experiment's task
directory, and (slow) the real SmolLM2 adapter, run.py --experiment harness and the audit of its evidence."""
import ast
import hashlib
import json
import random
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, run_cli
from harness import leaderboard, metrics, runner
from harness.adapters import ToyAdapter, WrongAdapter
from harness.hf_model import ModelUnavailable, verify_prepared_model
from harness.tasks import FIXTURES, TaskFormatError, head, load_all_tasks, load_task, seed_fixture_tasks

FAST_SANDBOX = {"cpu_s": 1, "wall_s": 4.0}


# ---- metrics --------------------------------------------------------------------------------------------------
def test_exact_match():
    assert metrics.exact_match("  42 ", ["42"], {}) == 1.0
    assert metrics.exact_match("Paris\n\tFrance", ["paris france"], {}) == 1.0
    assert metrics.exact_match("42.", ["42"], {}) == 0.0
    assert metrics.exact_match("x", ["y", "X"], {}) == 1.0  # best of several targets
    assert metrics.exact_match("", ["a"], {}) == 0.0


def test_substring_contains():
    assert metrics.substring_contains("The answer is  Tuesday.", ["tuesday"], {}) == 1.0
    assert metrics.substring_contains("the  reversed word is enots", ["is enots"], {}) == 1.0  # whitespace collapsed
    assert metrics.substring_contains("Monday", ["tuesday"], {}) == 0.0
    assert metrics.substring_contains("it is sunday", ["saturday", "sunday"], {}) == 1.0


def test_multiple_choice():
    assert metrics.multiple_choice(" b) whale", ["B"], {}) == 1.0
    assert metrics.multiple_choice("B", ["B"], {}) == 1.0
    assert metrics.multiple_choice("The answer is B", ["B"], {}) == 0.0  # first character only
    assert metrics.multiple_choice("", ["B"], {}) == 0.0
    assert metrics.multiple_choice("c", ["C", "D"], {}) == 1.0


def test_rouge_l_hand_cases():
    assert metrics.rouge_l("the cat sat", ["the cat sat"], {}) == 1.0
    assert metrics.rouge_l("", ["the cat"], {}) == 0.0
    assert metrics.rouge_l("dog", ["the cat"], {}) == 0.0
    # LCS("the cat sat on the mat", "the cat is on a mat") = the cat on mat = 4; P = 4/6, R = 4/6
    assert metrics.rouge_l("the cat sat on the mat", ["the cat is on a mat"], {}) == pytest.approx(4 / 6)
    # P = 2/2, R = 2/4 -> F1 = 2/3
    assert metrics.rouge_l("The CAT", ["the cat sat down"], {}) == pytest.approx(2 / 3)
    assert metrics.rouge_l("mat.", ["mat"], {}) == 1.0  # punctuation is a separator, as in rouge-score
    assert metrics.rouge_l("The cat sat on the mat.", ["the cat sat on the mat"], {}) == 1.0  # was 0.8333
    assert metrics.rouge_l("...", ["mat"], {}) == 0.0  # no token at all
    assert metrics.rouge_tokens("Don't stop-believing, café 42%!") == ["don", "t", "stop", "believing", "caf", "42"]
    assert metrics.lcs_length(list("ABCBDAB"), list("BDCABA")) == 4


def rouge_score_l(prediction, reference):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False).score(reference, prediction)["rougeL"].fmeasure


@pytest.mark.parametrize("prediction, reference", [
    ("The cat sat on the mat.", "the cat sat on the mat"),
    ("The town library will remain open until nine on weekdays.",
     "The library stays open until 9 p.m. on weekdays, from next month."),
    ("Don't stop-believing!", "dont stop believing"),
    ("Café — naïve façade, déjà vu", "cafe naive facade deja vu"),
    ("İstanbul is BIG; ıt is", "istanbul is big it is"),
    ("tab\tand\nnewline  ", "tab and newline"),
    ("42% of 1,000", "42 of 1000"),
    ("ÄÖÜ only", "only"),
    ("", "anything"),
    ("!!! ???", "a b"),
    ("x-y_z", "x y z"),
])
def test_rouge_l_equals_rouge_score(prediction, reference):
    assert metrics.rouge_l(prediction, [reference], {}) == rouge_score_l(prediction, reference)


def test_rouge_l_agrees_with_rouge_score_on_random_strings():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    rng = random.Random(7)
    vocab = ["a", "b", "c", "d", "e", "x1", "y2", "zz", "the", "cat", "9", "Cat.", "THE", "don't", "x-y", "café",
             "!!", "\u0130", "a,b", "\u2014"]
    for _ in range(300):
        pred = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 12)))
        ref = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 12)))
        ours = metrics.rouge_l(pred, [ref], {})
        theirs = scorer.score(ref, pred)["rougeL"].fmeasure  # score(target, prediction)
        assert ours == theirs, (pred, ref)


def test_extract_code():
    assert metrics.extract_code("```python\ndef f(x):\n    return x\n```\nbye") == "def f(x):\n    return x\n"
    assert metrics.extract_code("```\nA\n```\n```\nB\n```") == "A\n"
    assert metrics.extract_code("```py\ndef f(x):\n    return 1") == "def f(x):\n    return 1"  # unclosed
    assert metrics.extract_code("def f(x): return 1") == "def f(x): return 1"


def test_fixture_reference_solutions_pass_in_the_sandbox():
    task = load_task(FIXTURES / "code.jsonl")
    for ex in task.examples:
        assert metrics.code_exec(ex.targets[0], ex.targets, ex.extras, FAST_SANDBOX) == 1.0, ex.id


# ---- task files -----------------------------------------------------------------------------------------------
def write(tmp_path, name, lines):
    p = tmp_path / f"{name}.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


GOOD = '{"id": "a", "prompt": "p", "targets": ["t"], "metric": "exact_match"}'


def test_fixtures_load_five_tasks():
    tasks = load_all_tasks(FIXTURES)
    assert sorted(tasks) == ["arithmetic", "code", "multiple_choice", "substring", "summaries"]
    for t in tasks.values():
        assert 6 <= len(t.examples) <= 10 and len({ex.metric for ex in t.examples}) == 1
    assert {t.metric for t in tasks.values()} == set(metrics.METRICS)


def test_comments_and_blank_lines_are_skipped(tmp_path):
    p = write(tmp_path, "t", ["# a comment", "", GOOD, "   ", "  # indented comment",
                              GOOD.replace('"a"', '"b"')])
    task = load_task(p)
    assert [ex.id for ex in task.examples] == ["a", "b"] and [ex.line for ex in task.examples] == [3, 6]


@pytest.mark.parametrize("bad_line, expected, found", [
    ('{"id": "b", "prompt": "p", "targets": ["t"], "metric": "exact_match"', "one JSON object per line",
     "invalid JSON"),
    ('{"id": "b", "prompt": "p", "metric": "exact_match"}', "keys id, prompt, targets, metric",
     "(missing targets)"),
    ('{"id": "b", "prompt": "p", "targets": ["t"], "metric": "rouge_l"}', "metric 'exact_match' (as on line 2)",
     "'rouge_l'"),
    ('{"id": "b", "prompt": "p", "targets": ["t"], "metric": "bleu"}', "metric to be one of", "'bleu'"),
    ('{"id": "b", "prompt": "p", "targets": [], "metric": "exact_match"}', "non-empty list", "[]"),
    ('{"id": "a", "prompt": "p", "targets": ["t"], "metric": "exact_match"}', "a unique id",
     "'a' again (first on line 2)"),
    ('{"id": "b", "prompt": "p", "targets": ["t"], "metric": "exact_match", "extra": 1}', "only keys",
     "unknown key(s) extra"),
    ('["a list"]', "a JSON object", "list"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, expected, found):
    p = write(tmp_path, "broken", ["# header", GOOD, bad_line, GOOD.replace('"a"', '"c"')])
    with pytest.raises(TaskFormatError) as e:
        load_task(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: expected ") and "\n" not in msg, msg
    assert expected in msg.split(", found ")[0] and found in msg.split(", found ", 1)[1], msg


def test_code_exec_needs_io_pairs(tmp_path):
    p = write(tmp_path, "c", ['{"id": "a", "prompt": "p", "targets": ["t"], "metric": "code_exec", "extras": {}}'])
    with pytest.raises(TaskFormatError, match=r"c.jsonl:1: expected extras.io_pairs"):
        load_task(p)


IO = '{"id": "a", "prompt": "p", "targets": ["t"], "metric": "code_exec", "extras": {"io_pairs": [[1, %s]]}}'


@pytest.mark.parametrize("line, field, expected, found", [
    (IO % "NaN", "extras.io_pairs[0][1]", "a finite number", "NaN"),
    (IO % "-Infinity", "extras.io_pairs[0][1]", "a finite number", "-Infinity"),
    (IO % "1e999", "extras.io_pairs[0][1]", "a finite number", "1e999"),
    (IO % ("9" * 5000), "extras.io_pairs[0][1]", "an integer of at most 100 digits", "one of 5000 digits"),
    ('{"id": "a", "prompt": "p", "targets": ["t"], "targets": ["u"], "metric": "exact_match"}', "targets",
     "each key once", "a duplicate key"),
    (IO % ("[" * 100000 + "]" * 100000), None, "nesting at most 64 deep", "levels"),
    ('{"id": "a", "prompt": "\\udc00", "targets": ["t"], "metric": "exact_match"}', "prompt",
     "valid Unicode text", "a lone surrogate"),
])
def test_strict_task_reading_one_line_naming_file_line_and_field(tmp_path, line, field, expected, found):
    """NaN, a huge integer, duplicate keys, deep nesting, lone surrogates: one TaskFormatError line naming the file,
    the line and the field (they crashed scoring or loading, or were silently accepted)."""
    p = write(tmp_path, "strict", ["# header", line])
    with pytest.raises(TaskFormatError) as e:
        load_task(p)
    msg = str(e.value)
    head = f"{p}:2: field {field}: expected {expected}" if field else f"{p}:2: expected {expected}"
    assert msg.startswith(head) and found in msg and "\n" not in msg, msg


def test_strict_task_reading_bad_utf8_names_the_line(tmp_path):
    p = tmp_path / "bytes.jsonl"
    p.write_bytes(b"# header\n" + GOOD.encode() + b"\n" + b'{"id": "b\xff"}\n')
    with pytest.raises(TaskFormatError, match=f"^{p}:3: expected UTF-8 text, found byte 0xff$"):
        load_task(p)


@pytest.mark.parametrize("line", [IO % "NaN", IO % ("9" * 5000), IO % ("[" * 100000)])
def test_cli_strict_task_file_exits_2_with_one_line(tmp_path, line):
    write(tmp_path, "bad", [line])
    p = run_cli("-m", "harness", "run", "--adapter", "toy", "--tasks-dir", tmp_path, "--out", tmp_path / "o.json")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith(f"error: {tmp_path / 'bad.jsonl'}:1: ") and "Traceback" not in p.stderr
    assert not (tmp_path / "o.json").exists()


def test_empty_task_file_and_empty_dir(tmp_path):
    with pytest.raises(TaskFormatError, match="expected at least one example, found none"):
        load_task(write(tmp_path, "empty", ["# nothing here"]))
    (tmp_path / "empty.jsonl").unlink()
    with pytest.raises(TaskFormatError, match="at least one \\*.jsonl task file"):
        load_all_tasks(tmp_path)


def test_missing_tasks_dir_is_an_error_and_is_not_created(tmp_path):
    with pytest.raises(TaskFormatError) as e:
        load_all_tasks(tmp_path / "typo")
    assert str(e.value) == f"{tmp_path / 'typo'}: expected a directory of *.jsonl task files, found no such directory"
    assert not (tmp_path / "typo").exists()


def test_seeding_only_when_absent(tmp_path):
    d = tmp_path / "tasks"
    assert seed_fixture_tasks(d) is True
    assert sorted(p.name for p in d.iterdir()) == sorted(p.name for p in FIXTURES.glob("*.jsonl"))
    (d / "arithmetic.jsonl").write_text(GOOD + "\n")
    assert seed_fixture_tasks(d) is False
    assert (d / "arithmetic.jsonl").read_text() == GOOD + "\n"


# ---- runner and leaderboard ------------------------------------------------------------------------------------
def board_of(adapter, tasks, include=True, batch_size=4, timeout_s=30.0):
    per_task, examples = runner.run_leaderboard(adapter, tasks, batch_size, timeout_s, FAST_SANDBOX)
    return leaderboard.build(adapter.name, tasks, per_task, examples, {"batch_size": batch_size}, include)


@pytest.fixture(scope="module")
def fixture_tasks():
    return load_all_tasks(FIXTURES)


def test_toy_scores_one_and_wrong_scores_zero(fixture_tasks):
    toy = board_of(ToyAdapter(), fixture_tasks)
    assert toy["overall"] == 1.0 and all(t["score"] == 1.0 and t["correct"] == t["total"]
                                         for t in toy["tasks"].values())
    wrong = board_of(WrongAdapter(), fixture_tasks)
    assert wrong["overall"] == 0.0 and all(t["score"] == 0.0 and t["correct"] == 0 for t in wrong["tasks"].values())
    assert toy["schema"] == leaderboard.SCHEMA == "harness-leaderboard/v1"
    assert toy["sandbox_isolation"]["network"] in ("netns", "landlock-tcp")
    for name, t in toy["tasks"].items():
        assert t["sha256"] == fixture_tasks[name].sha256 and t["total"] == len(fixture_tasks[name].examples)


def test_scores_are_means_and_per_example_is_optional(fixture_tasks):
    class Half:
        name = "half"

        def generate(self, prompts):  # right on even positions of each batch, wrong on odd ones
            toy = ToyAdapter().generate(prompts)
            return [r if i % 2 == 0 else "\u2205" for i, r in enumerate(toy)]

    tasks = head(fixture_tasks, 4)
    board = board_of(Half(), tasks, include=False, batch_size=2)
    assert "per_example" not in board
    assert all(t["score"] == 0.5 and t["correct"] == 2 and t["total"] == 4 for t in board["tasks"].values())
    assert board["overall"] == 0.5
    full = board_of(Half(), tasks, include=True, batch_size=2)
    assert len(full["per_example"]) == 20 and {"prediction", "score", "prompt_sha256"} <= set(full["per_example"][0])


def test_batches_and_timeouts(fixture_tasks):
    class Slow:
        name = "slow"

        def __init__(self):
            self.batches = []

        def generate(self, prompts):
            self.batches.append(len(prompts))
            if any("9 * 8" in p for p in prompts):
                time.sleep(3)
            return ToyAdapter().generate(prompts)

    slow = Slow()
    tasks = {"arithmetic": fixture_tasks["arithmetic"]}
    per_task, examples = runner.run_leaderboard(slow, tasks, batch_size=3, timeout_s=0.5)
    assert slow.batches == [3, 3, 2]
    t = per_task["arithmetic"]
    assert t["timeouts"] == 3 and t["total"] == 8 and t["correct"] == 5 and t["score"] == 5 / 8
    assert [e["timed_out"] for e in examples] == [True] * 3 + [False] * 5
    assert examples[0]["prediction"] is None and examples[0]["score"] == 0.0


def test_timeout_cancels_a_cancellable_adapter(fixture_tasks):
    class Cancellable:
        name = "cancellable"

        def __init__(self):
            self.event, self.returned = threading.Event(), 0

        def cancel(self):
            self.event.set()

        def generate(self, prompts):
            self.event.wait(30)
            self.event.clear()
            self.returned += 1
            return [""] * len(prompts)

    ad, t0 = Cancellable(), time.monotonic()
    per_task, _ = runner.run_leaderboard(ad, head({"arithmetic": fixture_tasks["arithmetic"]}, 4), batch_size=2,
                                         timeout_s=0.2)
    assert per_task["arithmetic"]["timeouts"] == 4 and ad.returned == 2  # each call stopped before the next began
    assert time.monotonic() - t0 < 10


def test_adapter_returning_wrong_count_is_an_error(fixture_tasks):
    class Short:
        name = "short"

        def generate(self, prompts):
            return prompts[:-1]

    with pytest.raises(TypeError, match="replies for"):
        runner.run_leaderboard(Short(), head(fixture_tasks, 2), batch_size=2)


# ---- diff and CLI ------------------------------------------------------------------------------------------------
def test_cli_run_and_diff(tmp_path):
    out_toy, out_wrong, tasks_dir = tmp_path / "toy.json", tmp_path / "wrong.json", tmp_path / "harness_tasks"
    p = run_cli("-m", "harness", "run", "--adapter", "toy", "--out", out_toy, "--include-per-example",
                "--tasks-dir", tasks_dir, "--seed-fixtures")
    assert p.returncode == 0, p.stderr
    assert "seeded the fixture tasks" in p.stdout and (tasks_dir / "code.jsonl").exists()
    p = run_cli("-m", "harness", "run", "--adapter", "wrong", "--out", out_wrong, "--include-per-example",
                "--batch-size", "3", "--tasks-dir", tasks_dir)
    assert p.returncode == 0, p.stderr
    toy, wrong = json.loads(out_toy.read_text()), json.loads(out_wrong.read_text())
    assert toy["overall"] == 1.0 and wrong["overall"] == 0.0 and wrong["settings"]["batch_size"] == 3

    d = run_cli("-m", "harness", "diff", out_toy, out_wrong)
    assert d.returncode == 0, d.stderr
    assert "arithmetic" in d.stdout and "-1.0000" in d.stdout and "5 task(s) moved" in d.stdout
    assert "39 example(s) changed" in d.stdout and "arithmetic/arith-01: score 1 -> 0" in d.stdout
    same = run_cli("-m", "harness", "diff", out_toy, out_toy)
    assert "0 task(s) moved" in same.stdout and "0 example(s) changed" in same.stdout

    # a changed task file: refused (exit 2) unless allowed
    (tasks_dir / "substring.jsonl").write_text(
        (tasks_dir / "substring.jsonl").read_text().replace("'stone'", "'stones'").replace('"enots"', '"senots"'))
    out_changed = tmp_path / "changed.json"
    assert run_cli("-m", "harness", "run", "--adapter", "toy", "--out", out_changed, "--tasks-dir",
                   tasks_dir).returncode == 0
    refused = run_cli("-m", "harness", "diff", out_toy, out_changed)
    assert refused.returncode == 2 and "refusing to compare: task files differ: substring (A " in refused.stderr
    allowed = run_cli("-m", "harness", "diff", out_toy, out_changed, "--allow-different-tasks")
    assert allowed.returncode == 0 and "WARNING: task files differ: substring" in allowed.stdout
    assert "examples: not compared" in allowed.stdout  # the changed run has no per-example dump


def test_cli_malformed_task_exits_2(tmp_path):
    d = tmp_path / "tasks"
    d.mkdir()
    write(d, "bad", [GOOD, "{oops"])
    p = run_cli("-m", "harness", "run", "--adapter", "toy", "--tasks-dir", d, "--out", tmp_path / "x.json")
    assert p.returncode == 2 and f"{d / 'bad.jsonl'}:2: expected one JSON object per line" in p.stderr, p.stderr


def test_cli_refuses_a_missing_tasks_dir_and_creates_nothing(tmp_path):
    typo = tmp_path / "harness_taks"
    p = run_cli("-m", "harness", "run", "--adapter", "toy", "--tasks-dir", typo, "--out", tmp_path / "x.json")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"error: {typo}: expected a directory of *.jsonl task files, found no such directory\n"
    assert list(tmp_path.iterdir()) == []  # no tasks directory, no seeded fixtures, no leaderboard


def test_cli_without_tasks_dir_reads_the_fixtures_in_place(tmp_path):
    out = tmp_path / "sub" / "toy.json"
    p = run_cli("-m", "harness", "run", "--adapter", "toy", "--out", out)
    assert p.returncode == 0, p.stderr
    assert "seeded" not in p.stdout and list(tmp_path.rglob("*")) == [out.parent, out]
    board = json.loads(out.read_text())
    assert board["overall"] == 1.0
    assert {n: t["sha256"] for n, t in board["tasks"].items()} == \
        {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in FIXTURES.glob("*.jsonl")}


def test_cli_seed_fixtures_needs_a_tasks_dir(tmp_path):
    p = run_cli("-m", "harness", "run", "--adapter", "toy", "--seed-fixtures", "--out", tmp_path / "x.json")
    assert p.returncode == 2 and "--seed-fixtures needs --tasks-dir" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_diff_refuses_unknown_schema(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"schema": "something-else"}))
    p = run_cli("-m", "harness", "diff", a, a)
    assert p.returncode == 2 and "expected schema 'harness-leaderboard/v1'" in p.stderr


# ---- layering: harness/ imports nothing from the repository around it --------------------------------------------
REPOSITORY_MODULES = {"config", "resources", "adapter", "experiments", "run", "report", "bench", "audit",
                      "evidence_audit", "prepare"}


def imported_top_modules(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value).split(".")[0])
    return names


def test_harness_imports_nothing_from_the_repository():
    files = sorted((REPO / "harness").glob("*.py"))
    assert len(files) >= 10
    offending = {f.name: sorted(imported_top_modules(f) & REPOSITORY_MODULES) for f in files}
    assert {k: v for k, v in offending.items() if v} == {}
    assert "harness" in imported_top_modules(REPO / "harness" / "cli.py")  # the scan does see imports


def test_cli_defaults_agree_with_config():
    import config
    from harness.cli import DEFAULTS
    from harness.sandbox import DEFAULT_LIMITS

    from experiments.harness import CONFIG_SECTIONS

    flat = config.effective(CONFIG_SECTIONS)
    assert DEFAULTS == {"model": flat["model"], "batch_size": flat["harness_batch_size"],
                        "timeout_s": flat["harness_timeout_s"], "max_new_tokens": flat["harness_max_new_tokens"],
                        "max_input_tokens": flat["max_input_tokens"], "dtype": flat["dtype"],
                        "attn_implementation": flat["attn_implementation"], "threads": flat["threads"],
                        "device": flat["device"]}
    assert DEFAULT_LIMITS == flat["harness_sandbox"]


def test_the_one_model_loader_is_a_leaf():
    """adapter.py (the bottom layer) loads through harness/hf_model.py, the loader `python -m harness` uses: no
    import runs upwards only while hf_model.py imports nothing of the repository, not even the rest of harness/,
    and harness/__init__.py (which `import harness.hf_model` runs) imports nothing at all."""
    leaf = REPO / "harness" / "hf_model.py"
    assert imported_top_modules(leaf) & (REPOSITORY_MODULES | {"harness", "local_model"}) == set()
    assert not [n for n in ast.walk(ast.parse(leaf.read_text())) if isinstance(n, ast.ImportFrom) and n.level]
    init = ast.parse((REPO / "harness" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert "harness" in imported_top_modules(REPO / "adapter.py")  # the scan sees adapter.py's import of it


# ---- the CLI's model: a prepared cache, re-hashed ------------------------------------------------------------------
def fake_cache(tmp_path, model_id="m"):
    cache = tmp_path / "cache"
    (cache / "models" / model_id).mkdir(parents=True)
    weights = cache / "models" / model_id / "model.safetensors"
    weights.write_bytes(b"weights")
    (cache / "manifest.json").write_text(json.dumps({"resources": {model_id: {"kind": "model", "files": {
        f"models/{model_id}/model.safetensors": {"sha256": hashlib.sha256(b"weights").hexdigest(), "size": 7}}}}}))
    return cache, weights


def test_verify_prepared_model(tmp_path):
    cache, weights = fake_cache(tmp_path)
    assert verify_prepared_model(cache, "m") == cache / "models" / "m"
    with pytest.raises(ModelUnavailable, match="no prepared model 'other' listed"):
        verify_prepared_model(cache, "other")
    weights.write_bytes(b"weighty")
    with pytest.raises(ModelUnavailable, match=f"^{weights}: missing or changed since prepare"):
        verify_prepared_model(cache, "m")
    weights.unlink()
    with pytest.raises(ModelUnavailable, match=f"^{weights}: missing"):
        verify_prepared_model(cache, "m")
    with pytest.raises(ModelUnavailable, match="manifest.json: missing"):
        verify_prepared_model(tmp_path, "m")


def test_cli_smollm2_needs_a_cache(tmp_path):
    p = run_cli("-m", "harness", "run", "--adapter", "smollm2", "--out", tmp_path / "x.json")
    assert p.returncode == 2 and "--cache" in p.stderr


def test_cli_smollm2_refuses_a_changed_model_file(tmp_path):
    cache, weights = fake_cache(tmp_path)
    weights.write_bytes(b"tampered")
    p = run_cli("-m", "harness", "run", "--adapter", "smollm2", "--cache", cache, "--model", "m",
                "--out", tmp_path / "x.json")
    assert p.returncode == 2 and p.stderr.startswith(f"error: {weights}: missing or changed since prepare")
    assert len(p.stderr.splitlines()) == 1 and not (tmp_path / "x.json").exists()


# ---- one loader: the CLI's model is the experiments' model ---------------------------------------------------------
def loaded_facts(model):
    """What a loaded model runs with (the threads setting is process-wide: read right after the load)."""
    import torch

    return {"dtype": str(model.dtype), "attn_implementation": model.config._attn_implementation,
            "device": str(model.device), "threads": torch.get_num_threads(), "training": model.training}


def cli_load(cache, model_id, out):
    """The model and tokenizer `python -m harness run --adapter smollm2 --cache C --model ID` loads, with the CLI's
    default settings, in process."""
    import argparse

    from harness import cli

    parser = argparse.ArgumentParser()
    cli.add_run_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["run", "--adapter", "smollm2", "--cache", str(cache), "--model", model_id,
                              "--out", str(out)])
    loaded = cli.adapter_of(args)
    return loaded.model, loaded.tokenizer


@pytest.mark.slow     # tiny_cache copies the tokenizer of the prepared real model: the unit tier prepares none
def test_cli_and_experiments_load_the_same_model(tiny_cache, tmp_path):
    """The harness CLI's loader and adapter.load_model (every experiment's, run.py --experiment harness's) give
    the tiny random model the same dtype, attention implementation, thread setting, device and eval mode, and the
    same logits for one input, bit for bit."""
    import torch

    import adapter
    import config
    from experiments.harness import CONFIG_SECTIONS

    flat = config.effective(CONFIG_SECTIONS)
    before = torch.get_num_threads()
    other = 1 if flat["threads"] != 1 else 2
    try:
        torch.set_num_threads(other)  # each loader must set the configured thread count itself
        cli_model, cli_tok = cli_load(tiny_cache, "tiny-random-llama", tmp_path / "board.json")
        cli_facts = loaded_facts(cli_model)
        torch.set_num_threads(other)
        model_dir = tiny_cache / "models" / "tiny-random-llama"
        exp_model, exp_tok = adapter.load_model(model_dir, flat), adapter.load_tokenizer(model_dir)
        exp_facts = loaded_facts(exp_model)
        assert cli_facts == exp_facts == {"dtype": f"torch.{flat['dtype']}", "training": False,
                                          "attn_implementation": flat["attn_implementation"],
                                          "device": flat["device"], "threads": flat["threads"]}
        ids = cli_tok("a short review, quite good", return_tensors="pt")["input_ids"]
        assert torch.equal(ids, exp_tok("a short review, quite good", return_tensors="pt")["input_ids"])
        with torch.no_grad():
            assert torch.equal(cli_model(ids).logits, exp_model(ids).logits)
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow     # tiny_cache copies the tokenizer of the prepared real model: the unit tier prepares none
def test_the_loader_reads_safetensors_only(tiny_cache, tmp_path):
    """A pickled checkpoint is never loaded: beside the safetensors it is ignored, alone it is refused (loading a
    pickle runs code). Both paths call this loader."""
    import torch
    from safetensors.torch import load_file

    from harness.hf_model import load_hf_model

    settings = {"dtype": "float32", "attn_implementation": "eager", "threads": torch.get_num_threads(),
                "device": "cpu"}
    both = tmp_path / "both"
    shutil.copytree(tiny_cache / "models" / "tiny-random-llama", both)
    weights = load_file(both / "model.safetensors")
    torch.save({name: torch.zeros_like(t) for name, t in weights.items()}, both / "pytorch_model.bin")
    model, _ = load_hf_model(both, settings)
    assert torch.equal(model.state_dict()["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    (both / "model.safetensors").unlink()
    with pytest.raises(OSError, match="safetensors"):
        load_hf_model(both, settings)


@pytest.mark.slow     # tiny_cache copies the tokenizer of the prepared real model: the unit tier prepares none
def test_cli_refuses_a_device_it_cannot_use(tiny_cache, tmp_path):
    p = run_cli("-m", "harness", "run", "--adapter", "smollm2", "--cache", tiny_cache, "--model",
                "tiny-random-llama", "--device", "tpu", "--out", tmp_path / "x.json")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: --device tpu: expected cpu, cuda or cuda:N"]


# ---- the experiment's tasks directory (experiments/harness.py) -----------------------------------------------------
def experiment_ctx(out, tasks_dir=None, split="dev"):
    return SimpleNamespace(config={"harness_tasks_dir": tasks_dir, "harness_smoke_examples": 1}, split=split,
                           options=SimpleNamespace(out=Path(out)))


def test_experiment_follows_the_context_contract():
    import inspect

    from experiments import harness as experiment
    from experiments.context import Context, Result

    assert experiment.NAME == "harness" and experiment.CONFIG_SECTIONS == ("shared", "harness")
    signature = inspect.signature(experiment.run)
    assert list(signature.parameters) == ["ctx"] and signature.parameters["ctx"].annotation is Context
    assert signature.return_annotation is Result
    source = (REPO / "experiments" / "harness.py").read_text()
    assert "sys.exit" not in source and "fail(" not in source and 'ctx["' not in source


def test_experiment_refuses_a_missing_configured_tasks_dir(tmp_path):
    from experiments.harness import load_tasks
    from resources import ResourceError

    typo = tmp_path / "typo"
    with pytest.raises(ResourceError, match=f"^{typo}: expected a directory of \\*.jsonl task files"):
        load_tasks(experiment_ctx(tmp_path / "O", str(typo)))
    assert list(tmp_path.iterdir()) == []


def test_experiment_reads_the_fixtures_in_place_and_makes_no_working_dir(tmp_path):
    """No O/.harness_tasks/ (prompts and targets in a public folder): the default task source is the shipped
    fixtures, read in place; nothing is created in O."""
    from experiments.harness import load_tasks

    tasks_dir, configured, tasks = load_tasks(experiment_ctx(tmp_path / "O", split="smoke"))
    assert tasks_dir == FIXTURES and configured is False
    assert sorted(tasks) == sorted(p.stem for p in FIXTURES.glob("*.jsonl"))
    assert all(len(t.examples) == 1 for t in tasks.values())
    assert list(tmp_path.iterdir()) == []


def test_experiment_data_label_names_the_tasks_and_creates_nothing(tmp_path):
    from experiments.harness import data_label

    fixtures = ", ".join(sorted(p.stem for p in FIXTURES.glob("*.jsonl")))
    out = tmp_path / "O"
    assert data_label(experiment_ctx(out)) == f"tasks {fixtures} (the shipped fixtures, read in place)"
    assert data_label(experiment_ctx(out, str(tmp_path / "typo"))) == f"tasks (none) ({tmp_path / 'typo'})"
    assert list(tmp_path.iterdir()) == []
    write(tmp_path, "mine", [GOOD])
    assert data_label(experiment_ctx(out, str(tmp_path))) == f"tasks mine ({tmp_path})"


# ---- the real model ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(model_dir):
    """The prepared SmolLM2 loaded through the repository's adapter.py, as run.py --experiment harness does."""
    import adapter
    import config
    from experiments.harness import CONFIG_SECTIONS

    return adapter.load_model(model_dir, config.effective(CONFIG_SECTIONS)), adapter.load_tokenizer(model_dir)


@pytest.mark.slow
def test_smollm2_adapter_generates_deterministically(smollm2):
    from harness.adapters import SmolLM2Adapter

    ad = SmolLM2Adapter(*smollm2, name="smollm2:test", max_new_tokens=8, max_input_tokens=512)
    prompts = ["What is 3 + 4? Reply with the number only.", "Which month comes right after March?"]
    a, b = ad.generate(prompts), ad.generate(prompts[::-1])
    assert a == b[::-1] and all(isinstance(r, str) and r for r in a)  # greedy, no cross-prompt effects
    assert ad.render("hi").endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert ad.tokens["calls"] == 4 and 0 < ad.tokens["generated"] <= 32
    with pytest.raises(ValueError, match="exceeds max_input_tokens=8"):
        SmolLM2Adapter(*smollm2, name="smollm2:test", max_new_tokens=8, max_input_tokens=8).generate(prompts)


@pytest.mark.slow
def test_cli_smollm2_loads_the_model_like_adapter_py(smollm2, prepared_cache, tmp_path):
    """python -m harness loads the model through harness/hf_model.py directly, run.py's experiments through
    adapter.py (which calls it); the CLI's greedy reply is the one the adapter.py-loaded model gives."""
    from harness.adapters import SmolLM2Adapter

    prompt = "What is 3 + 4? Reply with the number only."
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "one.jsonl").write_text(json.dumps(
        {"id": "a", "prompt": prompt, "targets": ["7"], "metric": "exact_match"}) + "\n")
    out = tmp_path / "board.json"
    p = run_cli("-m", "harness", "run", "--adapter", "smollm2", "--cache", prepared_cache, "--tasks-dir",
                tmp_path / "tasks", "--out", out, "--max-new-tokens", "8", "--include-per-example")
    assert p.returncode == 0, p.stderr
    board = json.loads(out.read_text())
    assert board["adapter"] == "smollm2-135m-instruct-q4_1"       # named by the model, not the adapter
    expected = SmolLM2Adapter(*smollm2, name="x", max_new_tokens=8, max_input_tokens=512).generate([prompt])
    assert [e["prediction"] for e in board["per_example"]] == expected


@pytest.fixture(scope="session")
def harness_smoke(smoke_run):
    """conftest's `run.py --smoke` (every experiment, harness among them): no extra run. Audits here name
    `--experiment harness` and write their report outside O; tampering happens on copies."""
    return smoke_run


@pytest.mark.slow
def test_run_py_harness_smoke(harness_smoke):
    out, proc = harness_smoke
    summary = json.loads((out / "harness" / "summary.json").read_text())
    records = [json.loads(l) for l in (out / "harness" / "records.jsonl").read_text().splitlines()]
    board = summary["leaderboard"]
    assert board["schema"] == "harness-leaderboard/v1" and board["adapter"] == "smollm2-135m-instruct-q4_1"
    assert len(records) == 5 and sorted(board["tasks"]) == sorted({r["task"] for r in records})
    assert all(t["total"] == 1 and 0.0 <= t["score"] <= 1.0 for t in board["tasks"].values())
    assert board["overall"] == pytest.approx(sum(t["score"] for t in board["tasks"].values()) / 5)
    assert all(summary["tasks_are_shipped_fixtures"].values())
    code = next(r for r in records if r["task"] == "code")
    if code["timed_out"]:  # wall-clock timeouts depend on the machine's load; then the sandbox never ran
        assert code["prediction_sha256"] is None and code["score"] == 0.0 and "sandbox_isolation" not in board
    else:
        assert code["sandbox"]["total"] == 4 and board["sandbox_isolation"]["network"] in ("netns", "landlock-tcp")
    assert sum(t["timeouts"] for t in board["tasks"].values()) == sum(r["timed_out"] for r in records)
    # no task or reply text in public evidence; predictions in the private leaderboard
    public = (out / "harness" / "records.jsonl").read_text() + (out / "harness" / "summary.json").read_text()
    assert "What is" not in public and "prediction\"" not in public
    private = json.loads((out / "private" / "harness" / "leaderboard.json").read_text())
    assert len(private["per_example"]) == 5 and all("prediction" in e for e in private["per_example"])
    for name in board["tasks"]:
        assert (out / "private" / "harness" / "tasks" / f"{name}.jsonl").read_bytes() == \
            (FIXTURES / f"{name}.jsonl").read_bytes()
    assert "[harness] smollm2-135m-instruct-q4_1 on the shipped fixtures (5 tasks)" in proc.stdout
    assert "overall" in proc.stdout
    assert all(r["reference_sha256"] for r in records)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no O/.harness_tasks/ or other dot-dir
    gens = [json.loads(l) for l in (out / "private" / "harness" / "generations.jsonl").read_text().splitlines()]
    assert [(g["task"], g["id"]) for g in gens] == [(r["task"], r["id"]) for r in records if not r["timed_out"]]
    assert all(g["finish_reason"] in ("eos", "length") and g["generated_ids"] for g in gens)


# ---- audit.py's harness rule ------------------------------------------------------------------------------------
def audit(out):
    return run_cli("audit.py", out, "--tokens", "--experiment", "harness", "--report", report_path(out))


def report_path(out):
    """audit.py's --report outside O: a file left in O would be an extra file for the manifest check."""
    return out.parent / f"{out.name}.audit-test.json"


def tampered(src, tmp_path, edit):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    edit(dst)
    return dst


def edit_jsonl(path, fn):
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    fn(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def edit_json(path, fn):
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


@pytest.mark.slow
def test_audit_recomputes_the_harness_evidence(harness_smoke):
    out, _ = harness_smoke
    p = audit(out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "harness    identity   example scores from predictions" in p.stdout


def _set_score(rows):
    rows[0]["score"] = 1.0 - rows[0]["score"]


def _private_prediction(d):
    edit_json(d / "private" / "harness" / "leaderboard.json",
              lambda b: b["per_example"][0].update(prediction=(b["per_example"][0]["prediction"] or "") + " x"))


def _task_target(d):
    p = d / "private" / "harness" / "tasks" / "arithmetic.jsonl"
    p.write_text(p.read_text().replace('"targets": ["42"]', '"targets": ["43"]', 1))


def _overall(d):
    edit_json(d / "harness" / "summary.json", lambda s: s["leaderboard"].update(overall=0.123))


def _sandbox_outputs(d):
    def edit(rows):
        for r in rows:
            if r["task"] == "code" and "sandbox" in r:
                r["sandbox"]["outputs"] = ["1"] * len(r["sandbox"]["outputs"])
    edit_jsonl(d / "harness" / "records.jsonl", edit)


def _generation(field, fn):
    def edit(d):
        edit_jsonl(d / "private" / "harness" / "generations.jsonl", lambda rows: rows[0].update({field: fn(rows[0])}))
    return edit


@pytest.mark.slow
@pytest.mark.parametrize("edit, caught_by", [
    (_generation("generated_ids", lambda g: [g["generated_ids"][0] + 1] + g["generated_ids"][1:]),
     "identity   private generations"),
    (_generation("generated_ids", lambda g: [10 ** 30] + g["generated_ids"][1:]), "identity   private generations"),
    (_generation("prompt_ids", lambda g: g["prompt_ids"][1:]), "identity   private generations"),
    (_generation("finish_reason", lambda g: "length" if g["finish_reason"] == "eos" else "eos"),
     "identity   private generations"),
    (_generation("prompt", lambda g: g["prompt"].replace("user", "usr", 1)), "identity   private generations"),
    (lambda d: edit_jsonl(d / "harness" / "records.jsonl", _set_score), "arithmetic"),
    (_overall, "arithmetic task and overall scores"),
    (lambda d: edit_jsonl(d / "harness" / "records.jsonl", lambda rows: rows.pop()), "example selection"),
    (_private_prediction, "identity   example scores from predictions"),
    (_task_target, "identity   private task files"),
    (_sandbox_outputs, "identity   example scores from predictions"),
])
def test_audit_catches_tampering(harness_smoke, tmp_path, edit, caught_by):
    out, _ = harness_smoke
    records = [json.loads(l) for l in (out / "harness" / "records.jsonl").read_text().splitlines()]
    if edit is _sandbox_outputs and not any("sandbox" in r for r in records):
        pytest.skip("the code example timed out in this run: no sandbox outputs to tamper with")
    p = audit(tampered(out, tmp_path, edit))
    assert p.returncode == 1, p.stdout
    assert any(caught_by in line and "FAIL" in line for line in p.stdout.splitlines()), p.stdout


# ---- audit.py's harness forward level and fixture check, without a model (fast) -----------------------------------
def fixture_examples():
    """{(task, id): example dict} of the shipped fixtures, as the audit reads a private task file."""
    from evidence_audit.rules.harness import h_task_examples
    return {(p.stem, ex["id"]): ex for p in sorted(FIXTURES.glob("*.jsonl"))
            for _, ex in h_task_examples(p.read_text(encoding="utf-8"))}


def test_audit_rewrites_the_toy_adapters_and_they_agree():
    """The audit's toy and wrong adapters are its own (no import of harness/) and answer every fixture prompt, and
    prompts they do not know, exactly as harness/adapters.py's do."""
    from evidence_audit.rules.harness import H_TOY_ADAPTERS

    assert "harness" not in imported_top_modules(REPO / "evidence_audit" / "rules" / "harness.py")
    prompts = [ex["prompt"] for ex in fixture_examples().values()] + ["hello", "What is 2 ^ 3?"]
    assert [H_TOY_ADAPTERS["toy"](p) for p in prompts] == ToyAdapter().generate(prompts)
    assert [H_TOY_ADAPTERS["wrong"](p) for p in prompts] == WrongAdapter().generate(prompts)


def test_audit_forward_reruns_the_toy_adapter_and_names_a_replaced_prediction():
    from evidence_audit.checks import Checks
    from evidence_audit.rules.harness import TOY_FORWARD, audit_harness_forward

    answered = [(t, i, ex["prompt"], ToyAdapter().answer(ex["prompt"])) for (t, i), ex in fixture_examples().items()]
    C = Checks()
    audit_harness_forward(C, "harness", {}, {"adapter": "toy", "answered": answered, "tokens": None}, None)
    assert [(r["check"], r["status"], r["items"]) for r in C.rows] == [(TOY_FORWARD, "PASS", len(answered))]
    task, ex_id, prompt, _ = answered[3]
    answered[3] = (task, ex_id, prompt, "a consistent forgery")
    C = Checks()
    audit_harness_forward(C, "harness", {}, {"adapter": "toy", "answered": answered, "tokens": None}, None)
    assert C.rows[0]["status"] == "FAIL" and C.rows[0]["n_failures"] == 1
    assert C.rows[0]["first_failure"].startswith(f"{task}/{ex_id} prediction: ")
    C = Checks()
    audit_harness_forward(C, "harness", {}, {"adapter": "wrong", "answered": answered, "tokens": None}, None)
    assert C.rows[0]["status"] == "FAIL" and C.rows[0]["n_failures"] == len(answered)


def test_audit_catches_a_fixture_target_changed_to_the_wrong_answer():
    """The repository's fixtures, not the evidence, say what a shipped example's target is: a target changed to
    equal the model's wrong answer (and every hash and score recomputed) fails, naming the example and field."""
    from evidence_audit.checks import Checks
    from evidence_audit.rules.harness import shipped_fixtures_check

    examples = fixture_examples()
    C = Checks()
    shipped_fixtures_check(C, "harness", examples)
    assert C.rows[0]["status"] == "PASS" and C.rows[0]["items"] == len(examples)
    first = next(iter(examples))
    examples[first] = dict(examples[first], targets=["the model's wrong answer"])
    C = Checks()
    shipped_fixtures_check(C, "harness", examples)
    assert C.rows[0]["status"] == "FAIL"
    assert C.rows[0]["first_failure"].startswith(f"{first[0]}/{first[1]} targets: ")
    # renamed, it is still the shipped question: compared by its prompt, whatever its task and id
    renamed = {("mine", "mine-01"): dict(examples[first], id="mine-01")}
    C = Checks()
    shipped_fixtures_check(C, "harness", renamed)
    assert C.rows[0]["status"] == "FAIL" and C.rows[0]["first_failure"].startswith("mine/mine-01 targets: ")
    # an example of the user's own (its own prompt) is not compared
    own = {("arithmetic", "mine-01"): dict(examples[first], id="mine-01", prompt="What is 1 + 1?")}
    C = Checks()
    shipped_fixtures_check(C, "harness", own)
    assert C.rows[0]["status"] == "PASS" and C.rows[0]["items"] == 0


# ---- consistent forgeries of the harness evidence (slow: the real smoke run) ---------------------------------------
def audit_levels(out, cache, *levels):
    return run_cli("audit.py", out, "--strict", *levels, "--experiment", "harness", "--cache", cache,
                   "--report", report_path(out))


def harness_aggregates(board, records):
    """Task and overall figures of a leaderboard recomputed from example scores (the forger's arithmetic)."""
    for name, t in board["tasks"].items():
        scores = [r["score"] for r in records if r["task"] == name]
        t.update(score=sum(scores) / len(scores), correct=sum(s == 1.0 for s in scores))
    board["overall"] = sum(t["score"] for t in board["tasks"].values()) / len(board["tasks"])


def reseal(d):
    """What a careful forger does after an edit: every derived figure, report.html and MANIFEST.json rebuilt."""
    import report
    from experiments.evidence import write_manifest

    private = json.loads((d / "private" / "harness" / "leaderboard.json").read_text())
    rows = [json.loads(l) for l in (d / "harness" / "records.jsonl").read_text().splitlines()]
    by_key = {(e["task"], e["id"]): e for e in private["per_example"]}
    for r in rows:
        e = by_key[(r["task"], r["id"])]
        r["score"] = e["score"]
        r["prediction_sha256"] = None if e["prediction"] is None else runner.sha256_text(e["prediction"])
    (d / "harness" / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    harness_aggregates(private, rows)
    (d / "private" / "harness" / "leaderboard.json").write_text(json.dumps(private, indent=1))
    summary = json.loads((d / "harness" / "summary.json").read_text())
    harness_aggregates(summary["leaderboard"], rows)
    (d / "harness" / "summary.json").write_text(json.dumps(summary, indent=1))
    fmt = json.loads((d / "MANIFEST.json").read_text())["evidence_format"]     # the run's own evidence format
    (d / "harness" / "leaderboard.json").write_text(json.dumps({**summary["leaderboard"], "evidence_format": fmt},
                                                               indent=1))
    report.write(d)
    manifest = json.loads((d / "MANIFEST.json").read_text())
    write_manifest(d, manifest["run_id"], manifest["experiments"], manifest["failed"])


def forge_prediction(d, tokenizer):
    """Replace the first wrongly answered text prediction by a target, with generated ids that decode to it."""
    private = json.loads((d / "private" / "harness" / "leaderboard.json").read_text())
    tasks = {p.stem: {ex.id: ex for ex in load_task(p).examples} for p in (d / "private" / "harness" / "tasks").iterdir()}
    e = next(e for e in private["per_example"] if e["score"] == 0.0 and e["prediction"] is not None
             and tasks[e["task"]][e["id"]].metric in ("exact_match", "multiple_choice"))
    e["prediction"], e["score"] = tasks[e["task"]][e["id"]].targets[0], 1.0
    (d / "private" / "harness" / "leaderboard.json").write_text(json.dumps(private, indent=1))
    gens_path = d / "private" / "harness" / "generations.jsonl"
    gens = [json.loads(l) for l in gens_path.read_text().splitlines()]
    g = next(g for g in gens if (g["task"], g["id"]) == (e["task"], e["id"]))
    g["generated_ids"] = tokenizer.encode(e["prediction"], add_special_tokens=False) + [tokenizer.eos_token_id]
    gens_path.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in gens))
    reseal(d)
    return f"{e['task']}/{e['id']}"


def forge_target(d):
    """Change a shipped fixture example's target to the model's wrong answer, and every hash that names the file or
    the example's answer key."""
    private = json.loads((d / "private" / "harness" / "leaderboard.json").read_text())
    e = next(e for e in private["per_example"] if e["task"] == "arithmetic")
    path = d / "private" / "harness" / "tasks" / "arithmetic.jsonl"
    lines = path.read_text().split("\n")
    n = next(i for i, l in enumerate(lines) if f'"id": "{e["id"]}"' in l)
    ex = json.loads(lines[n])
    ex["targets"] = [e["prediction"]]
    lines[n] = json.dumps(ex)
    path.write_text("\n".join(lines))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    e["score"] = 1.0
    spec = {"extras": ex.get("extras", {}), "metric": ex["metric"], "targets": ex["targets"]}
    rows = [json.loads(l) for l in (d / "harness" / "records.jsonl").read_text().splitlines()]
    next(r for r in rows if (r["task"], r["id"]) == ("arithmetic", e["id"]))["reference_sha256"] = \
        hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    (d / "harness" / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    private["tasks"]["arithmetic"]["sha256"] = sha
    (d / "private" / "harness" / "leaderboard.json").write_text(json.dumps(private, indent=1))
    cfg = json.loads((d / "harness" / "config.json").read_text())
    cfg["tasks"]["arithmetic"]["sha256"] = sha
    (d / "harness" / "config.json").write_text(json.dumps(cfg, indent=1))
    summary = json.loads((d / "harness" / "summary.json").read_text())
    summary["leaderboard"]["tasks"]["arithmetic"]["sha256"] = sha
    summary["tasks_are_shipped_fixtures"]["arithmetic"] = False
    (d / "harness" / "summary.json").write_text(json.dumps(summary, indent=1))
    reseal(d)
    return f"arithmetic/{e['id']}"


def rows_of(p):
    return [l for l in p.stdout.splitlines() if l.startswith("harness ")]


def caught_once(p, dst, row, first_failure):
    """The audit failed (exit 1) on exactly one harness row, `row`, whose first failure starts `first_failure`."""
    assert p.returncode == 1, p.stdout
    failed = [l for l in rows_of(p) if "FAIL" in l]
    assert len(failed) == 1 and row in failed[0], p.stdout
    report = json.loads(report_path(dst).read_text())
    first = next(r for r in report["checks"] if r["status"] == "FAIL")["first_failure"]
    assert first.startswith(first_failure), first


@pytest.mark.slow
def test_audit_strict_tokens_forward_passes_on_clean_smoke_evidence(harness_smoke, prepared_cache):
    out, _ = harness_smoke
    p = audit_levels(out, prepared_cache, "--tokens", "--forward")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "harness    forward    greedy tokens (argmax at every generated position)" in p.stdout
    assert "SKIPPED" not in "\n".join(rows_of(p))


@pytest.mark.slow
def test_audit_forward_catches_a_consistently_replaced_prediction(harness_smoke, prepared_cache, smollm2, tmp_path):
    """A wrong prediction replaced by the target, its generated ids re-tokenised, every hash, score, aggregate,
    report.html and MANIFEST.json recomputed: the arithmetic and identity levels pass; the forward level names the
    example and the generated token that is not the model's greedy choice."""
    out, _ = harness_smoke
    if not any(not json.loads(l)["timed_out"] for l in (out / "harness" / "records.jsonl").read_text().splitlines()):
        pytest.skip("every example timed out in this run: nothing to forge")
    dst = tmp_path / "forged"
    shutil.copytree(out, dst)
    where = forge_prediction(dst, smollm2[1])
    p = audit_levels(dst, prepared_cache, "--tokens")
    assert p.returncode == 0, p.stdout      # consistent: the two levels without the model's numbers cannot tell
    caught_once(audit_levels(dst, prepared_cache, "--tokens", "--forward"), dst, "forward    greedy tokens",
                f"idx {where} generated_ids[")


@pytest.mark.slow
def test_audit_catches_a_fixture_target_changed_to_the_models_answer(harness_smoke, prepared_cache, tmp_path):
    out, _ = harness_smoke
    private = json.loads((out / "private" / "harness" / "leaderboard.json").read_text())
    if next(e for e in private["per_example"] if e["task"] == "arithmetic")["score"] == 1.0:
        pytest.skip("the model answered the arithmetic example correctly in this run: no wrong answer to adopt")
    dst = tmp_path / "forged"
    shutil.copytree(out, dst)
    where = forge_target(dst)
    p = audit_levels(dst, prepared_cache, "--tokens")
    assert p.returncode == 1, p.stdout
    failed = [l for l in rows_of(p) if "FAIL" in l]
    assert len(failed) == 2, p.stdout      # the public answer-key hash (arithmetic), the private target (identity)
    assert "arithmetic task ids and hashes vs the repository" in failed[0] and \
        f"{where} reference_sha256: " in failed[0], p.stdout
    assert "identity   task files vs the repository's fixtures" in failed[1] and f"{where} targets: " in failed[1]


def toy_evidence(out, adapter="toy"):
    """test_audit.py's tiny harness evidence turned into a run of the toy (or wrong) adapter: prompts the toy
    adapter answers "4" (right) and "6" (wrong), as the tiny evidence's predictions are."""
    from test_audit import _identity, seal, tiny_harness_evidence

    tiny_harness_evidence(out)
    prompts = {"a": "What is 2 + 2?", "b": "What is 3 + 3?"}
    text = "".join(json.dumps({"id": i, "prompt": prompts[i], "targets": [t], "metric": "exact_match"}) + "\n"
                   for i, t in (("a", "4"), ("b", "5")))
    (out / "private/harness/tasks/arith.jsonl").write_text(text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    edit_json(out / "harness/config.json", lambda c: (c["tasks"]["arith"].update(sha256=sha),
                                                     c["config"].update(harness_adapter=adapter)))
    conf = json.loads((out / "harness/config.json").read_text())["config"]
    edit_json(out / "harness/identity.json", lambda i: i.update(
        {k: v for k, v in _identity(conf).items() if k.startswith("scoring_config")}))
    edit_jsonl(out / "harness/records.jsonl",
               lambda rows: [r.update(prompt_sha256=runner.sha256_text(prompts[r["id"]])) for r in rows])
    edit_json(out / "harness/summary.json", lambda s: (s["leaderboard"]["tasks"]["arith"].update(sha256=sha),
                                                      s["leaderboard"].update(adapter=adapter)))
    edit_json(out / "private/harness/leaderboard.json", lambda b: (b["tasks"]["arith"].update(sha256=sha),
                                                                  b.update(adapter=adapter)))
    return seal(out)


def test_audit_forward_reruns_the_toy_adapter_on_its_evidence(tmp_path):
    """End to end on evidence of the toy adapter: the forward level runs (no model needed) and passes; a replaced
    private prediction fails it naming the example and the field; evidence claiming the wrong adapter fails it."""
    from evidence_audit import driver
    from evidence_audit.rules.harness import TOY_FORWARD

    def forward_row(out):
        rep = driver.audit(out, ("arithmetic", "identity", "forward"))
        return next(r for r in rep["checks"] if r["experiment"] == "harness" and r["level"] == "forward")

    row = forward_row(toy_evidence(tmp_path / "O"))
    assert (row["check"], row["status"], row["items"]) == (TOY_FORWARD, "PASS", 2), row
    out = toy_evidence(tmp_path / "O2")
    edit_json(out / "private/harness/leaderboard.json", lambda b: b["per_example"][1].update(prediction="5"))
    row = forward_row(out)
    assert row["status"] == "FAIL" and row["first_failure"].startswith("arith/b prediction: "), row
    row = forward_row(toy_evidence(tmp_path / "O3", adapter="wrong"))
    assert row["status"] == "FAIL" and row["n_failures"] == 2 and row["first_failure"].startswith("arith/a "), row
