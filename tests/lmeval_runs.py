"""Real lm-eval 0.4.9.2 runs for the tests of `audit.py --lm-eval`: lm-eval's own simple_evaluate(log_samples=True)
and its own EvaluationTracker write RUN_DIR exactly as `lm_eval ... --log_samples --output_path RUN_DIR` does
(lm_eval/__main__.py: save_results_aggregated, then save_results_samples per task). The CLI itself cannot load a
task given as a config dict, which is how the fixture parquets are served (experiments/official.py's custom_dataset
hook), so the tests call the same two functions the CLI calls.

Tasks: sst2 (the installed GLUE YAML, metrics acc, acc_norm, mcc, f1), mc_taco (the installed YAML: acc, f1;
documents are parts of (sentence, question) groups), sst2_ll, a loglikelihood task written here (acc, perplexity),
sst2_fs, the sst2 YAML two-shot with a description (few-shot examples from a served train split), and
sst2_gen, a generate_until task written here (regex +
take_first and lowercase + remove_whitespace + take_first filters, exact_match with ignore_case and
ignore_punctuation)."""
import json
import os
import shutil
from pathlib import Path

from experiments import official

BOOTSTRAP_ITERS = 100          # lm-eval's default is 100000; the audit recomputes the bootstrap stderr (f1, mcc)
                               # with lm-eval's draws at any count (bootstrap.py), so a small one keeps the run fast


def make_lm(model_dir):
    """HFLM on the prepared model, float32 eager attention, one sequence per forward pass (config.py's parity)."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(model_dir), device="cpu", dtype="float32", batch_size=1, max_length=512,
                attn_implementation="eager")


def sst2_task(parquet):
    cfg = official.task_config("tasks/glue/sst2/default.yaml", parquet)
    cfg["metric_list"] = [{"metric": m} for m in ("acc", "acc_norm", "mcc", "f1")]
    return cfg


def mctaco_task(parquet):
    return official.task_config("tasks/mc_taco/default.yaml", parquet, evaluate_validation=True)


def generate_task(parquet):
    """A generate_until task on the SST-2-shaped data, written here: the answer word, extracted two ways.
    Passed as a task object: 0.4.9.2's TaskManager drops the `task` name of a config dict whose name is not
    registered (it pops it and never sets it back), so such a dict cannot be evaluated."""
    cfg = official.task_config("tasks/glue/sst2/default.yaml", parquet)
    cfg.pop("tag")
    cfg.update({
        "task": "sst2_gen", "output_type": "generate_until", "doc_to_choice": None,
        "doc_to_text": "Review: {{sentence}}\nIs this review positive or negative? Answer in one word.\nAnswer:",
        "doc_to_target": "{{ ['negative', 'positive'][label] }}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
        "filter_list": [
            {"name": "word", "filter": [{"function": "regex", "regex_pattern": r"(?i)\b(positive|negative)\b"},
                                        {"function": "take_first"}]},
            {"name": "plain", "filter": [{"function": "lowercase"}, {"function": "remove_whitespace"},
                                         {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                         "ignore_case": True, "ignore_punctuation": True}],
    })
    from lm_eval.api.task import ConfigurableTask

    return ConfigurableTask(config=cfg)


def loglikelihood_task(parquet):
    """A loglikelihood task written here: the log-likelihood of the gold answer word after the sst2 prompt (acc =
    is_greedy, perplexity). A task object, as generate_task."""
    from lm_eval.api.task import ConfigurableTask

    cfg = official.task_config("tasks/glue/sst2/default.yaml", parquet)
    cfg.pop("tag")
    cfg.update({"task": "sst2_ll", "output_type": "loglikelihood", "doc_to_choice": None,
                "doc_to_target": "{{ [' negative', ' positive'][label] }}",
                "metric_list": [{"metric": "acc"}, {"metric": "perplexity"}]})
    return ConfigurableTask(config=cfg)


FEWSHOT_DESCRIPTION = "Sentiment of a {{ sentence | length }}-character review.\n\n"


def fewshot_task(parquet, num_fewshot=2):
    """sst2_fs: the sst2 YAML with num_fewshot set and a Jinja description, served with the parquet as both its
    validation split (evaluated) and its train split (the few-shot split: the YAML's training_split). A task
    object, as generate_task."""
    from lm_eval.api.task import ConfigurableTask

    cfg = official.task_config("tasks/glue/sst2/default.yaml", parquet)
    cfg.pop("tag")
    path = str(parquet)

    def serve_both_splits(**_metadata):
        import datasets
        import pyarrow.parquet as pq

        rows = datasets.Dataset(datasets.table.InMemoryTable(pq.read_table(path)))
        return datasets.DatasetDict({"validation": rows, "train": rows})

    cfg.update({"task": "sst2_fs", "custom_dataset": serve_both_splits, "num_fewshot": num_fewshot,
                "description": FEWSHOT_DESCRIPTION})
    return ConfigurableTask(config=cfg)


def task_manager():
    """lm-eval's TaskManager with "sst2_gen", "sst2_ll" and "sst2_fs" entered in its index as the installed sst2
    YAML's entry, for one log line: 0.4.9.2's get_task_dict logs every top-level task with its YAML path from the
    index and raises KeyError for a name it lacks (the CLI's --include_path crashes on the same line: its path is
    outside the package). The task object passed is used as it is; the index entry is read for nothing else."""
    from lm_eval.tasks import TaskManager

    tm = TaskManager()
    for name in ("sst2_gen", "sst2_ll", "sst2_fs"):
        tm.task_index[name] = dict(tm.task_index["sst2"])
    return tm


def lm_eval_run(lm, model_dir, out, tasks, limit=None, samples=None, system_instruction=None, batch_size=None,
                model_args=None):
    """simple_evaluate + EvaluationTracker into `out`, as lm_eval/__main__.py does with --log_samples
    --output_path out (model_args name the model dir, so the files go to out/<sanitized model name>/);
    system_instruction as --system_instruction (no chat template); batch_size as --batch_size records it (the
    HFLM object is built with its own: without it the results record none, as for an lm object passed in);
    model_args as --model_args records it (default: pretrained=<model_dir> alone, so the results name no dtype or
    attention: the audit then takes transformers' defaults)."""
    from lm_eval import evaluator
    from lm_eval.loggers import EvaluationTracker

    os.environ.setdefault("DISABLE_MULTIPROC", "1")      # bootstrap stderr without a process pool
    tracker = EvaluationTracker(output_path=str(out))
    results = evaluator.simple_evaluate(
        model=lm, model_args=model_args or f"pretrained={model_dir}", tasks=tasks, limit=limit, samples=samples,
        batch_size=batch_size,
        log_samples=True, evaluation_tracker=tracker, bootstrap_iters=BOOTSTRAP_ITERS, cache_requests=False,
        task_manager=task_manager(), system_instruction=system_instruction)
    logged = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=logged)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=logged[task_name])
    return Path(out)


def tampered(run, tmp_path, task, edit_samples=None, edit_results=None):
    """A copy of lm-eval output `run` with the samples of `task` (list of dicts, in file order) and/or the results
    dict edited in place by the given functions, written back as lm-eval writes them."""
    copy = tmp_path / "tampered"
    shutil.copytree(run, copy)
    sub = next(p for p in copy.iterdir() if p.is_dir())
    if edit_samples:
        path = next(sub.glob(f"samples_{task}_2*.jsonl"))
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        edit_samples(rows)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    if edit_results:
        path = next(sub.glob("results_*.json"))
        r = json.loads(path.read_text(encoding="utf-8"))
        edit_results(r)
        path.write_text(json.dumps(r, indent=2, ensure_ascii=False), encoding="utf-8")
    return copy


def env_info(cpu):
    """pretty_env_info lines (torch's collect_env with lscpu's) describing kernels.CPU `cpu`, as lm-eval records
    them: a run "made on" that machine."""
    return (f"PyTorch version: {cpu.torch}\nIs CUDA available: False\nCPU:\nVendor ID: {cpu.vendor}\n"
            f"Model name: {cpu.name}\nCPU family: {cpu.family}\nModel: {cpu.model}\nCore(s) per socket: "
            f"{cpu.cores}\nSocket(s): 1\nFlags: {' '.join(sorted(cpu.flags))}\n")


def made_here(run_dir):
    """Whether the lm-eval run in `run_dir` (its results file, anywhere below) was made on this machine's kind of CPU
    as the audit decides it (kernels.reproduces): its kernels can be reproduced here."""
    from evidence_audit import kernels
    top = json.loads(next(Path(run_dir).rglob("results_*.json")).read_text(encoding="utf-8"))
    return kernels.reproduces(kernels.from_pretty_env_info(top.get("pretty_env_info")), kernels.this_machine())[0]

