"""audit.py --lm-eval on a REAL few-shot lm-eval 0.4.9.2 run (tests/lmeval_runs.py: sst2_fs, two-shot, a Jinja
description and a system instruction): every request's context is rendered again by the audit's own few-shot
renderer (evidence_audit/lmeval/prompt.py) and must equal lm-eval's; a forged example, another seed or a missing
few-shot split never PASS."""
import json
import shutil

import pytest

from evidence_audit.reading import sha256_text
from test_lmeval_audit import audit, failures, hflm, lmeval_data, levels_failed  # noqa: F401 (fixtures)

N_DOCS = 6
SYSTEM = "Answer with one word."


@pytest.fixture(scope="session")
def fewshot_run(hflm, model_dir, lmeval_data, tmp_path_factory):  # noqa: F811
    import lmeval_runs

    return lmeval_runs.lm_eval_run(hflm, model_dir, tmp_path_factory.mktemp("lmeval-fewshot"),
                                   [lmeval_runs.fewshot_task(lmeval_data["sst2"])], limit=N_DOCS,
                                   system_instruction=SYSTEM)


def split_args(lmeval_data):  # noqa: F811
    parquet = lmeval_data["sst2"]
    return ["--data", f"sst2_fs={parquet}", "--fewshot-data", f"sst2_fs={parquet}"]


def prompt_row(report):
    return next(r for r in report["checks"] if r["check"].startswith("prompt re-rendered"))


def edited(run, tmp_path, edit_rows=None, edit_results=None):
    """A copy of the run with its sample lines and/or results edited, prompt_hash and task_hashes recomputed as a
    forger would."""
    copy = tmp_path / "edited"
    shutil.copytree(run, copy)
    sub = next(p for p in copy.iterdir() if p.is_dir())
    samples, results = next(sub.glob("samples_sst2_fs_*.jsonl")), next(sub.glob("results_*.json"))
    rows = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines()]
    r = json.loads(results.read_text(encoding="utf-8"))
    if edit_rows:
        edit_rows(rows)
    if edit_results:
        edit_results(r)
    for row in rows:
        row["prompt_hash"] = sha256_text(row["arguments"]["gen_args_0"]["arg_0"])
    r["task_hashes"]["sst2_fs"] = sha256_text("".join(x["doc_hash"] + x["prompt_hash"] + x["target_hash"]
                                                      for x in rows))
    samples.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows), encoding="utf-8")
    results.write_text(json.dumps(r, indent=2, ensure_ascii=False), encoding="utf-8")
    return copy


@pytest.mark.slow
def test_every_context_of_a_real_two_shot_run_is_rendered_again(fewshot_run, model_dir, lmeval_data, tmp_path):
    rows = [json.loads(line) for line in next(fewshot_run.glob("*/samples_sst2_fs_*.jsonl")).read_text().splitlines()]
    for row in rows:        # the run is what it says: a system instruction, then two examples before the question
        ctx = row["arguments"]["gen_args_0"]["arg_0"]
        assert ctx.startswith(SYSTEM + "\n\nSentiment of a ") and ctx.count("Question:") == 3
    code, report = audit(tmp_path, fewshot_run, "--forward", "--model", model_dir, *split_args(lmeval_data))
    assert code == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    row = prompt_row(report)
    assert row["status"] == "PASS" and row["items"] == N_DOCS and row["note"] == "num_fewshot 2, fewshot_seed 1234"


@pytest.mark.slow
def test_without_the_few_shot_split_the_prompt_check_is_incomplete(fewshot_run, model_dir, lmeval_data, tmp_path):
    code, report = audit(tmp_path, fewshot_run, "--tokens", "--model", model_dir,
                         "--data", f"sst2_fs={lmeval_data['sst2']}")
    row = prompt_row(report)
    assert code == 1 and report["result"].startswith("INCOMPLETE") and row["status"] == "FAIL"
    assert row["first_failure"] == ("INCOMPLETE: num_fewshot 2 draws from split 'train': pass --fewshot-data "
                                    "sst2_fs=FILE (a local copy of that split); NOT checked")


@pytest.mark.slow
def test_a_forged_example_in_one_context_is_caught_at_the_identity_level(fewshot_run, model_dir, lmeval_data,
                                                                         tmp_path):
    def flip_first_answer(rows):
        ctx = rows[3]["arguments"]["gen_args_0"]["arg_0"]
        words = [(ctx.find(f"Answer: {w}\n\n"), w) for w in ("positive", "negative")]
        at, word = min((i, w) for i, w in words if i >= 0)
        other = "negative" if word == "positive" else "positive"
        new = ctx[:at] + f"Answer: {other}" + ctx[at + len(f"Answer: {word}"):]
        for a in rows[3]["arguments"].values():
            a["arg_0"] = new
    copy = edited(fewshot_run, tmp_path, flip_first_answer)
    code, report = audit(tmp_path, copy, "--tokens", "--model", model_dir, *split_args(lmeval_data))
    assert code == 1 and levels_failed(report) == {"identity"}
    bad = failures(report, "prompt re-rendered", "identity")
    assert len(bad) == 2 and all(f.startswith("doc_id 3 (line 4, filter none) arguments.gen_args_") for f in bad)


@pytest.mark.slow
def test_another_seed_draws_other_examples(fewshot_run, model_dir, lmeval_data, tmp_path):
    def seed(r):
        r["config"]["fewshot_seed"] = 1235
    code, report = audit(tmp_path, edited(fewshot_run, tmp_path, edit_results=seed), "--tokens", "--model",
                         model_dir, *split_args(lmeval_data))
    docs = {f.split()[1] for f in failures(report, "prompt re-rendered", "identity")}
    assert code == 1 and len(docs) >= N_DOCS - 1


# ---- fast: the renderer against lm-eval's own ConfigurableTask.fewshot_context, no model ----------------------------

DOCS = [{"text": f"review {i}", "label": i % 2, "choices": ["bad", "good"]} for i in range(12)]
BASE = {"task": "toy_fs", "output_type": "multiple_choice", "doc_to_text": "{{text}}\nAnswer:",
        "doc_to_target": "label", "doc_to_choice": ["bad", "good"], "metric_list": [{"metric": "acc"}]}


def lm_eval_contexts(cfg, splits, system_instruction=None, seed=1234):
    """Every evaluated document's context as lm-eval 0.4.9.2 builds it (its own task class, seeded as
    simple_evaluate seeds it, documents in dataset order), and the config it dumps into the results."""
    import datasets
    from lm_eval.api.task import ConfigurableTask

    served = datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()})
    task = ConfigurableTask(config={**cfg, "custom_dataset": lambda **_: served})
    task.set_fewshot_seed(seed)
    out = [task.fewshot_context(doc, cfg["num_fewshot"], system_instruction=system_instruction,
                                gen_prefix=task.doc_to_prefix(doc)) for doc in task.eval_docs]
    return out, json.loads(json.dumps(task.dump_config(), default=str))


@pytest.mark.parametrize("cfg, splits, system", [
    ({**BASE, "training_split": "train", "validation_split": "validation", "num_fewshot": 3,
      "description": "{{ text | length }} characters.\n\n"}, {"train": DOCS[:8], "validation": DOCS[8:]}, "Be brief."),
    ({**BASE, "validation_split": "validation", "num_fewshot": 2}, {"validation": DOCS}, None),
    ({**BASE, "test_split": "test", "fewshot_split": "test", "num_fewshot": 2, "gen_prefix": "So{{ '' }}",
      "doc_to_choice": "{{ choices }}", "doc_to_target": "{{ label }}", "target_delimiter": ":",
      "fewshot_delimiter": "\n---\n", "fewshot_config": {"sampler": "first_n"}}, {"test": DOCS}, None),
    ({**BASE, "validation_split": "validation", "num_fewshot": 2,
      "fewshot_config": {"samples": DOCS[:3], "doc_to_text": "Q: {{text}}"}}, {"validation": DOCS[5:]}, "Hi."),
])
def test_contexts_equal_lm_evals_own_fewshot_context(cfg, splits, system):
    from evidence_audit.lmeval import prompt

    want, dumped = lm_eval_contexts(cfg, splits, system)
    kind, source = prompt.fewshot_source(dumped)
    docs = source if kind == "samples" else splits[source]
    render = prompt.Renderer(dumped, {"system_instruction": system}, {"fewshot_seed": 1234}, docs)
    evaluated = splits[prompt.eval_split(dumped)]
    assert [render.context(d) for d in evaluated] == want
