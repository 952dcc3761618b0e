"""The harness's provenance: a run on the shipped fixture tasks is provable as such, a run on other tasks says so in
its headline, task files are regular files of bounded size, and the model is named by what it is.

Fast tests build harness evidence by hand on the shipped arithmetic fixture (test_audit.py's tiny evidence, made a
run of the shipped tasks); the slow test forges the real smoke run's evidence."""
import hashlib
import json
import os
import shutil

import pytest

from conftest import REPO, run_cli
from harness.tasks import FIXTURES, TaskFormatError, load_all_tasks, load_task

GOOD = {"id": "a", "prompt": "What is 2 + 2?", "targets": ["4"], "metric": "exact_match"}


def reference_of(ex):
    """What an example is scored against, hashed as the evidence records it (written here, not imported)."""
    spec = {"extras": ex.get("extras", {}), "metric": ex["metric"], "targets": ex["targets"]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fixture_lines(task):
    """(lines of the shipped task file, {id: line index}, {id: example})."""
    lines = (FIXTURES / f"{task}.jsonl").read_text(encoding="utf-8").split("\n")
    at = {json.loads(l)["id"]: n for n, l in enumerate(lines) if l.startswith("{")}
    return lines, at, {i: json.loads(lines[n]) for i, n in at.items()}


def write_json(path, obj):
    path.write_text(json.dumps(obj, indent=1, sort_keys=True))


def aggregates(records):
    scores = [r["score"] for r in records]
    return {"score": sum(scores) / len(scores), "correct": sum(s == 1.0 for s in scores), "total": len(scores),
            "timeouts": 0, "latency_s": round(sum(r["latency_s"] for r in records), 4),
            "latency_s_mean": round(sum(r["latency_s"] for r in records) / len(records), 4)}


def write_task_evidence(out, task_text, examples, preds, shipped_claim):
    """Rewrite test_audit.py's tiny harness evidence at `out` as a run of one task, `arithmetic`, whose file is
    `task_text`, scoring `examples` (the first ones of the file) with predictions `preds` ({id: text})."""
    norm = lambda s: " ".join(s.lower().split())      # noqa: E731
    records = [{"task": "arithmetic", "id": ex["id"], "prompt_sha256": sha(ex["prompt"]),
                "reference_sha256": reference_of(ex), "prediction_sha256": sha(preds[ex["id"]]),
                "score": float(norm(preds[ex["id"]]) in [norm(t) for t in ex["targets"]]), "timed_out": False,
                "latency_s": 0.5} for ex in examples]
    task_sha, n_in_file = sha(task_text), sum(1 for l in task_text.split("\n") if l.startswith("{"))
    cfg = json.loads((out / "harness/config.json").read_text())
    cfg["tasks"] = {"arithmetic": {"sha256": task_sha, "metric": "exact_match", "n_in_file": n_in_file,
                                   "n_scored": len(examples), "ids": [ex["id"] for ex in examples]}}
    write_json(out / "harness/config.json", cfg)
    (out / "harness/records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    task = dict(aggregates(records), metric="exact_match", sha256=task_sha, n_examples_in_file=n_in_file)
    summary = json.loads((out / "harness/summary.json").read_text())
    summary["leaderboard"].update(tasks={"arithmetic": task}, overall=task["score"])
    summary["tasks_are_shipped_fixtures"] = {"arithmetic": shipped_claim}
    write_json(out / "harness/summary.json", summary)
    private = json.loads((out / "private/harness/leaderboard.json").read_text())
    private.update(tasks={"arithmetic": task}, overall=task["score"],
                   per_example=[{"task": "arithmetic", "id": r["id"], "prediction": preds[r["id"]],
                                 "score": r["score"]} for r in records])
    write_json(out / "private/harness/leaderboard.json", private)
    for p in (out / "private/harness/tasks").iterdir():
        p.unlink()
    (out / "private/harness/tasks/arithmetic.jsonl").write_text(task_text, encoding="utf-8")


def shipped_evidence(out):
    """Evidence of a smoke run (2 examples) on the shipped arithmetic task: arith-01 answered right, arith-02
    wrong ("71" for 9 * 8), sealed."""
    from evidence_audit.mutations.tools import seal
    from test_audit import tiny_harness_evidence

    tiny_harness_evidence(out)
    lines, _, examples = fixture_lines("arithmetic")
    write_task_evidence(out, "\n".join(lines), [examples["arith-01"], examples["arith-02"]],
                        {"arith-01": "42", "arith-02": "71"}, True)
    from evidence_report import page        # report.py's own page: the identity level rebuilds and compares it
    page.write(out)
    seal(out)
    return out


def forge_renamed_example(out):
    """The forgery: arith-02 renamed arith-91 with its target set to the model's wrong answer, every hash, score
    and leaderboard recomputed, the task no longer claimed to be the shipped fixture, report cells re-derived and
    MANIFEST.json resealed."""
    from evidence_audit.mutations.tools import seal

    lines, at, examples = fixture_lines("arithmetic")
    forged = dict(examples["arith-02"], id="arith-91", targets=["71"])
    lines[at["arith-02"]] = json.dumps(forged)
    write_task_evidence(out, "\n".join(lines), [examples["arith-01"], forged],
                        {"arith-01": "42", "arith-91": "71"}, False)
    seal(out)
    return out


def harness_rows(out, levels=("arithmetic",)):
    """(the audit's report, its harness rows). The hand-made evidence has no model: checks that need one are
    SKIPPED, so a clean audit is one without a FAIL row (not exit 0)."""
    from evidence_audit import driver

    rep = driver.audit(out, levels)
    return rep, [r for r in rep["checks"] if r["experiment"] == "harness"]


PROVENANCE = "task ids and hashes vs the repository's fixtures"


# ---- point 5: a run on the shipped tasks is provable as such ------------------------------------------------------
def test_clean_shipped_evidence_passes_and_says_shipped(tmp_path):
    rep, rows = harness_rows(shipped_evidence(tmp_path / "O"), ("arithmetic", "identity"))
    assert not [r for r in rep["checks"] if r["status"] == "FAIL"], [r for r in rows if r["status"] == "FAIL"]
    row = next(r for r in rows if r["check"] == PROVENANCE)
    assert row["status"] == "PASS" and row["items"] == 2
    assert rep["details"]["harness"]["task_set"] == "the shipped fixtures (1 task)"


def test_renamed_example_with_the_models_answer_as_target_fails_at_the_arithmetic_level(tmp_path):
    out = forge_renamed_example(shipped_evidence(tmp_path / "O"))
    rep, rows = harness_rows(out)
    failed = [r for r in rows if r["status"] == "FAIL"]
    assert rep["exit_code"] == 1 and [r["check"] for r in failed] == [PROVENANCE], failed
    assert failed[0]["first_failure"].startswith("arithmetic/arith-91 reference_sha256: "), failed[0]
    assert "arithmetic/arith-02" in failed[0]["first_failure"]


def test_public_reference_hash_left_alone_is_caught_against_the_private_task_file(tmp_path):
    """The forger who keeps the shipped reference hash in the record: the private task file's target disagrees
    (identity level), and the identity level's own comparison with the fixtures names the renamed example too."""
    from evidence_audit.mutations.tools import seal

    out = forge_renamed_example(shipped_evidence(tmp_path / "O"))
    _, _, examples = fixture_lines("arithmetic")
    rows = [json.loads(l) for l in (out / "harness/records.jsonl").read_text().splitlines()]
    rows[1]["reference_sha256"] = reference_of(examples["arith-02"])
    (out / "harness/records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seal(out)
    rep, rows = harness_rows(out, ("arithmetic", "identity"))
    failed = {r["check"]: r["first_failure"] for r in rows if r["status"] == "FAIL"}
    assert "private task files" in failed and failed["private task files"].startswith(
        "arithmetic/arith-91 reference_sha256: "), failed
    assert failed["task files vs the repository's fixtures"].startswith("arithmetic/arith-91 targets: "), failed


def test_shipped_id_with_other_content_fails(tmp_path):
    """arith-02 keeps its id but is asked another question: an id of the shipped fixtures names other content."""
    from evidence_audit.mutations.tools import seal

    out = shipped_evidence(tmp_path / "O")
    lines, at, examples = fixture_lines("arithmetic")
    edited = dict(examples["arith-02"], prompt="What is 9 * 9? Reply with the number only.", targets=["81"])
    lines[at["arith-02"]] = json.dumps(edited)
    write_task_evidence(out, "\n".join(lines), [examples["arith-01"], edited], {"arith-01": "42", "arith-02": "81"},
                        False)
    seal(out)
    _, rows = harness_rows(out)
    row = next(r for r in rows if r["check"] == PROVENANCE)
    assert row["status"] == "FAIL" and row["first_failure"].startswith("arithmetic/arith-02 prompt_sha256: "), row


def test_claiming_the_shipped_fixtures_for_other_tasks_fails(tmp_path):
    from evidence_audit.mutations.tools import seal

    out = forge_renamed_example(shipped_evidence(tmp_path / "O"))
    summary = json.loads((out / "harness/summary.json").read_text())
    summary["tasks_are_shipped_fixtures"]["arithmetic"] = True
    write_json(out / "harness/summary.json", summary)
    seal(out)
    _, rows = harness_rows(out)
    row = next(r for r in rows if r["check"] == "task files vs shipped fixtures")
    assert row["status"] == "FAIL", row


def test_user_tasks_are_labelled_in_the_audit_headline(tmp_path):
    """A run on the user's own tasks passes, and the printed audit says so on its row, not only in a flag."""
    from evidence_audit.checks import print_report
    from evidence_audit.mutations.tools import seal
    from test_audit import tiny_harness_evidence

    out = tiny_harness_evidence(tmp_path / "O")
    text = "".join(json.dumps(dict(GOOD, id=i, prompt=f"Q{i}", targets=[t])) + "\n" for i, t in (("a", "4"),
                                                                                                  ("b", "5")))
    write_task_evidence(out, text, [json.loads(l) for l in text.splitlines()], {"a": "4", "b": "6"}, False)
    from evidence_report import page
    page.write(out)
    seal(out)
    rep, rows = harness_rows(out, ("arithmetic", "identity"))
    assert not [r for r in rep["checks"] if r["status"] == "FAIL"], [r for r in rows if r["status"] == "FAIL"]
    assert rep["details"]["harness"]["task_set"] == "1 user task (arithmetic), not the shipped fixtures"
    import io
    buf = io.StringIO()
    print_report(rep, buf)
    line = next(l for l in buf.getvalue().splitlines() if PROVENANCE[:30] in l)
    assert "PASS" in line and "1 USER TASK (ARITHMETIC), NOT THE SHIPPED FIXTURES" in line, line
    assert rep["headline_note"] == "harness on 1 user task (arithmetic), not the shipped fixtures", rep
    verdict = next(l for l in buf.getvalue().splitlines() if l.startswith("RESULT:"))
    assert "(HARNESS ON 1 USER TASK (ARITHMETIC), NOT THE SHIPPED FIXTURES): " in verdict, verdict


def test_experiment_headline_and_report_say_user_tasks():
    from evidence_report.layout import NEWEST
    from evidence_report.sections import harness as section
    from experiments.harness import task_set

    assert task_set({"arithmetic": True, "code": True}) == "the shipped fixtures (2 tasks)"
    assert task_set({"a": False, "b": False, "c": False}) == "3 user tasks (a, b, c), not the shipped fixtures"
    assert task_set({"arithmetic": False, "code": True}) == \
        "1 user task (arithmetic) and 1 shipped fixture task, not the shipped fixtures"
    board = {"tasks": {"mine": {"score": 0.5, "metric": "exact_match", "total": 2}}, "overall": 0.5}
    html = section.render(None, {"leaderboard": board, "tasks_are_shipped_fixtures": {"mine": False}}, NEWEST)
    assert "harness on 1 user task (mine), not the shipped fixtures" in html
    html = section.render(None, {"leaderboard": board, "tasks_are_shipped_fixtures": {"mine": True}}, NEWEST)
    assert "harness on the shipped fixtures (1 task)" in html
    html = section.render(None, {"leaderboard": board}, NEWEST)
    assert "not the shipped fixtures" in html       # no claim is no claim to be the fixtures


def test_the_record_reference_hash_is_the_audits():
    """The runner's reference_sha256 of every shipped example is the one the audit recomputes."""
    from evidence_audit.rules.harness import h_reference_sha256
    from harness.tasks import reference_sha256

    for p in sorted(FIXTURES.glob("*.jsonl")):
        for ex in load_task(p).examples:
            obj = {"id": ex.id, "prompt": ex.prompt, "targets": ex.targets, "metric": ex.metric}
            if ex.extras:
                obj["extras"] = ex.extras
            assert reference_sha256(ex) == h_reference_sha256(obj) == reference_of(obj)


# ---- point 12: task files are regular files of bounded size ----------------------------------------------------
def test_fifo_task_file_exits_2_on_one_line_without_hanging(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "ok.jsonl").write_text(json.dumps(GOOD) + "\n")
    os.mkfifo(tasks / "pipe.jsonl")
    p = run_cli("-m", "harness", "run", "--adapter", "toy", "--tasks-dir", tasks, "--out", tmp_path / "o.json",
                timeout=30)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().count("\n") == 0 and str(tasks / "pipe.jsonl") in p.stderr, p.stderr
    assert "a regular file" in p.stderr and "a FIFO" in p.stderr and "Traceback" not in p.stderr


def test_fifo_task_file_in_the_experiment_is_a_resource_error(tmp_path):
    """run.py's harness experiment reads the configured tasks directory the same way (in a child process with a
    timeout: a reader blocked on the FIFO would hang the suite)."""
    os.mkfifo(tmp_path / "pipe.jsonl")
    code = ("import sys; from types import SimpleNamespace; from experiments.harness import load_tasks\n"
            "from resources import ResourceError\n"
            f"ctx = SimpleNamespace(config={{'harness_tasks_dir': {str(tmp_path)!r}, 'harness_smoke_examples': 1}}, "
            "split='dev')\n"
            "try:\n    load_tasks(ctx)\nexcept ResourceError as e:\n    sys.exit(f'refused: {e}')")
    p = run_cli("-c", code, timeout=30)
    assert p.returncode == 1 and p.stderr.strip() == \
        f"refused: {tmp_path / 'pipe.jsonl'}: expected a regular file, found a FIFO", p.stderr


def test_symlink_leaving_the_tasks_dir_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps(GOOD) + "\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "t.jsonl").symlink_to(outside)
    with pytest.raises(TaskFormatError, match=r"t\.jsonl: expected a file inside .*tasks, found a symlink to "):
        load_all_tasks(tasks)
    (tasks / "t.jsonl").unlink()
    (tasks / "inner.txt").write_text(json.dumps(GOOD) + "\n")
    (tasks / "t.jsonl").symlink_to(tasks / "inner.txt")
    assert list(load_all_tasks(tasks)) == ["t"]     # a link that stays inside is read


def test_directory_named_like_a_task_file_and_an_oversized_file_are_refused(tmp_path):
    from harness import tasks as tasks_module

    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(TaskFormatError, match=r"d\.jsonl: expected a regular file, found a directory"):
        load_all_tasks(tmp_path)
    (tmp_path / "d.jsonl").rmdir()
    big = tmp_path / "big.jsonl"
    line = json.dumps(GOOD) + "\n"
    big.write_text(line * (tasks_module.MAX_TASK_FILE_BYTES // len(line) + 1))
    with pytest.raises(TaskFormatError, match=r"big\.jsonl: expected a task file of at most \d+ bytes, found \d+"):
        load_task(big)


# ---- the model is named by what it is -----------------------------------------------------------------------------
def test_the_model_is_named_by_its_directory_or_lock_id():
    from evidence_audit.rules.harness import h_model_name
    from experiments.harness import model_name

    local = {"id": "/tmp/mymodels/tiny-llama", "dir": "/tmp/mymodels/tiny-llama", "source": "local"}
    locked = {"id": "smollm2-135m-instruct-q4_1", "dir": "cache/models/smollm2-135m-instruct-q4_1",
              "source": {"kind": "pypi-wheel"}}
    assert model_name(local) == h_model_name(local) == "tiny-llama"
    assert model_name(locked) == h_model_name(locked) == "smollm2-135m-instruct-q4_1"
    # evidence format 3: config.json names a local directory by placeholder (its path is in O/private/)
    assert h_model_name({"id": "<model:tiny-llama>", "dir": "<model:tiny-llama>", "source": "local"}) == "tiny-llama"
    assert h_model_name({"id": "smollm2-135m-instruct-q4_1", "dir": "<cache>/models/smollm2-135m-instruct-q4_1",
                         "source": {"kind": "pypi-wheel"}}) == "smollm2-135m-instruct-q4_1"
    source = (REPO / "harness" / "adapters.py").read_text() + (REPO / "experiments" / "harness.py").read_text()
    assert 'f"smollm2:' not in source


# ---- the real smoke run, forged (slow) ----------------------------------------------------------------------------
@pytest.mark.slow
def test_real_smoke_forgery_renamed_example_fails_at_the_arithmetic_level(smoke_run, tmp_path):
    """The forgery on the real run's evidence: arith-01 renamed arith-91, its private target set to the model's
    wrong answer, every hash, score and leaderboard recomputed, the fixture claim dropped, report.html rebuilt by
    report.py and MANIFEST.json resealed: the arithmetic level fails, naming the example."""
    import report
    from evidence_audit.mutations.tools import seal
    from test_harness import harness_aggregates

    out, _ = smoke_run
    d = tmp_path / "forged"
    shutil.copytree(out, d)
    private = json.loads((d / "private/harness/leaderboard.json").read_text())
    e = next(e for e in private["per_example"] if e["task"] == "arithmetic")
    if e["score"] == 1.0 or e["prediction"] is None:
        pytest.skip("the model answered the arithmetic example right (or timed out): no wrong answer to adopt")
    path = d / "private/harness/tasks/arithmetic.jsonl"
    lines = path.read_text().split("\n")
    n = next(i for i, l in enumerate(lines) if f'"id": "{e["id"]}"' in l)
    ex = dict(json.loads(lines[n]), id="arith-91", targets=[e["prediction"].strip()])
    lines[n] = json.dumps(ex)
    path.write_text("\n".join(lines))
    task_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    old_id, e["id"], e["score"] = e["id"], "arith-91", 1.0
    rows = [json.loads(l) for l in (d / "harness/records.jsonl").read_text().splitlines()]
    r = next(r for r in rows if r["task"] == "arithmetic")
    r.update(id="arith-91", score=1.0, reference_sha256=reference_of(ex))
    (d / "harness/records.jsonl").write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in rows))
    gens = d / "private/harness/generations.jsonl"
    gens.write_text(gens.read_text().replace(f'"id": "{old_id}"', '"id": "arith-91"'))
    cfg = json.loads((d / "harness/config.json").read_text())
    cfg["tasks"]["arithmetic"].update(sha256=task_sha, ids=["arith-91" if i == old_id else i
                                                            for i in cfg["tasks"]["arithmetic"]["ids"]])
    write_json(d / "harness/config.json", cfg)
    summary = json.loads((d / "harness/summary.json").read_text())
    for board in (summary["leaderboard"], private):
        board["tasks"]["arithmetic"]["sha256"] = task_sha
        harness_aggregates(board, rows)
    summary["tasks_are_shipped_fixtures"]["arithmetic"] = False
    write_json(d / "harness/summary.json", summary)
    write_json(d / "harness/leaderboard.json", {**summary["leaderboard"],
                                                "evidence_format": json.loads((d / "MANIFEST.json").read_text())[
                                                    "evidence_format"]})
    write_json(d / "private/harness/leaderboard.json", private)
    report.write(d)
    seal(d, "manifest")
    p = run_cli("audit.py", d, "--experiment", "harness", "--report", tmp_path / "audit.json")
    assert p.returncode == 1, p.stdout
    failed = [l for l in p.stdout.splitlines() if l.startswith("harness ") and "FAIL" in l]
    assert len(failed) == 1 and f"arithmetic {PROVENANCE[:40]}" in failed[0], p.stdout
    assert "FAIL  arithmetic/arith-91 reference_sha256: " in failed[0], p.stdout
