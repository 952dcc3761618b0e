"""The official path: lm-eval 0.4.9.2 with its own installed task YAML. The only module that imports lm_eval:
the experiments reach lm-eval's evaluator, model API (loglikelihood, generate_until), task construction, metrics
and filters through the functions here.

The task config is loaded from the installed file unmodified, except that its `custom_dataset` hook serves the
verified local parquet (and an empty `train` split, which lm-eval's constructor opens to build its few-shot
sampler; the protocol is zero-shot, so it is never read). Task name, prompt, labels, choices and scoring stay
official: only the data transport changes.
"""
import hashlib
from pathlib import Path

import lm_eval

from resources import ResourceError

# The directory as imported, not resolved: lm-eval compares its task paths to its own unresolved __file__
# (tasks/__init__.py relative_to), so a resolved form breaks a venv reached through a symlink. The bytes read
# (file_hashes) are the same by either form.
LM_EVAL_DIR = Path(lm_eval.__file__).parent

# The installed files the multiple-choice loglikelihood path goes through (hashed into config.json).
PATH_FILES = [
    "__init__.py", "evaluator.py", "evaluator_utils.py", "utils.py",
    "api/task.py", "api/model.py", "api/metrics.py", "api/instance.py", "api/registry.py", "api/samplers.py",
    "models/huggingface.py", "models/utils.py", "tasks/__init__.py", "filters/__init__.py",
    "filters/selection.py",
]


def version():
    import importlib.metadata as md

    return md.version("lm_eval")


def file_hashes(extra=()):
    return {rel: hashlib.sha256((LM_EVAL_DIR / rel).read_bytes()).hexdigest() for rel in [*PATH_FILES, *extra]}


def load_task_yaml(yaml_rel):
    """An installed task YAML as lm-eval's own loader reads it."""
    from lm_eval.utils import load_yaml_config

    return load_yaml_config(str(LM_EVAL_DIR / yaml_rel))


YAML_OF_TASK = {}     # task name -> installed YAML (relative to lm_eval/), as task_config loaded it: task_manager


def task_config(yaml_rel, parquet_path, evaluate_validation=False):
    """The installed task YAML as lm-eval loads it, with only custom_dataset added.

    evaluate_validation: for a YAML that also names a test split (lm-eval's eval_docs takes the test split whenever
    test_split is set: lm_eval/api/task.py:688-696), set test_split to None so that the served validation split is
    the one evaluated. That is a change of which split is read (data transport), recorded by the caller."""
    cfg = load_task_yaml(yaml_rel)
    YAML_OF_TASK[cfg["task"]] = yaml_rel
    parquet_path = str(parquet_path)

    def serve_verified_parquet(**_metadata):
        import datasets
        import pyarrow.parquet as pq

        validation = datasets.Dataset(datasets.table.InMemoryTable(pq.read_table(parquet_path)))
        return datasets.DatasetDict({"validation": validation, "train": validation.select([])})

    cfg["custom_dataset"] = serve_verified_parquet
    if evaluate_validation:
        cfg["test_split"] = None
    return cfg


def hflm_args(model_dir, config):
    """The HFLM arguments: the scoring settings of config.py (the same the independent path uses), at the official
    path's own batch size (official_batch_size: measured to give the parity path's scores bit for bit).

    use_safetensors=True reaches from_pretrained through HFLM's **kwargs (HFLM._create_model passes them on), so
    lm-eval never falls back to a pickled checkpoint (.bin) either; add_bos_token stays None (HFLM's default): the
    tokenizer's own special-token configuration decides, as on the independent path (scoring.special_tokens)."""
    return {"pretrained": str(model_dir), "device": config["device"], "dtype": config["dtype"],
            "batch_size": config["official_batch_size"], "max_length": config["max_input_tokens"],
            "attn_implementation": config["attn_implementation"], "logits_cache": True, "use_safetensors": True}


def make_hflm(settings):
    """An HFLM with explicit settings (make_lm builds the scoring one from config)."""
    from lm_eval.models.huggingface import HFLM

    try:
        return HFLM(**settings)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        # local_model.py refused every hostile directory it knows before this; what is left is one line, not a traceback
        raise ResourceError(f"--model {settings.get('pretrained')}: lm-eval's HFLM could not load it "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else 'no message'})")


def make_lm(model_dir, config):
    return make_hflm(hflm_args(model_dir, config))


def model_facts(model):
    """What a loaded model actually runs with (config.json, and the input of two_paths.check_same_loading)."""
    import torch

    return {"model_dtype": str(model.dtype), "attn_implementation": model.config._attn_implementation,
            "torch_threads": torch.get_num_threads(), "device": str(model.device)}


def lm_facts(lm, model_dir, config):
    """What the official model actually ran with, for config.json and the dtype/attention/threads/device check;
    "special_tokens": HFLM's own settings (add_bos_token None: the tokenizer's default decides in tok_encode;
    prefix_token_id: what an empty context would get) and what its tok_encode puts before a text."""
    probe = "special tokens probe"
    encoded, plain = lm.tok_encode(probe), lm.tokenizer(probe, add_special_tokens=False)["input_ids"]
    special = {"add_bos_token": lm.add_bos_token, "prefix_token_id": lm.prefix_token_id,
               "tok_encode_prefix_ids": encoded[:len(encoded) - len(plain)] if encoded[-len(plain):] == plain
               else encoded}
    return {**model_facts(lm.model), "hflm": hflm_args(model_dir, config), "special_tokens": special}


def task_manager(task_name):
    """lm-eval's TaskManager indexing only the installed directory of `task_name`'s YAML (the task this repository
    evaluates), with the metadata simple_evaluate would give its own ({} for a model object).

    Without one, simple_evaluate builds a TaskManager that indexes every YAML under lm_eval/tasks/ on every call
    (6.7 s here, several times per run). What the index is used for is the same either way: get_task_dict merges
    the registered config of `task_name` (this same installed YAML) under the config passed, and logs its path."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(LM_EVAL_DIR / Path(YAML_OF_TASK[task_name]).parent),
                       include_defaults=False, metadata={})


def evaluate(lm, cfg, task_name, indices, seed, limit=None):
    """simple_evaluate on exactly `indices` (passed through as given: the caller decides their order).

    indices None: no `samples` argument, so lm-eval selects the documents itself: every document (limit None), or
    its own `limit` (the first `limit` documents of eval_docs, see experiments/mctaco.py SHUFFLE_SOURCE)."""
    from lm_eval import evaluator

    return evaluator.simple_evaluate(
        model=lm, tasks=[cfg], samples=None if indices is None else {task_name: list(indices)}, limit=limit,
        log_samples=True, bootstrap_iters=0, task_manager=task_manager(task_name),
        cache_requests=False, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=seed)


def encode_pair(lm, context, continuation):
    """The official token boundary: lm-eval's own TemplateLM._encode_pair."""
    return lm._encode_pair(context, continuation)


def loglikelihood(lm, pairs):
    """lm-eval's model API on explicit (context, continuation) requests, as its tasks would send them."""
    from lm_eval.api.instance import Instance

    requests = [Instance(request_type="loglikelihood", doc={}, arguments=(ctx, cont), idx=i)
                for i, (ctx, cont) in enumerate(pairs)]
    return [(float(ll), bool(greedy)) for ll, greedy in lm.loglikelihood(requests)]


def generate_until(lm, prompts, gen_kwargs):
    """lm-eval's HFLM.generate_until on explicit contexts. Returns (texts, the input ids HFLM's tok_batch_encode
    gives each prompt)."""
    from lm_eval.api.instance import Instance

    requests = [Instance(request_type="generate_until", doc={"i": i}, arguments=(p, dict(gen_kwargs)), idx=0)
                for i, p in enumerate(prompts)]
    texts = lm.generate_until(requests)
    return texts, [lm.tok_batch_encode([p])[0][0].tolist() for p in prompts]


def apply_filters(filter_spec, texts):
    """lm-eval's FilterEnsemble built from its registry by a task-YAML filter_list entry (`filter_spec`), applied to
    instances whose resps are [text], the nested list shape a task's filters receive. One string per text."""
    from lm_eval.api.instance import Instance
    from lm_eval.filters import build_filter_ensemble

    ensemble = build_filter_ensemble(filter_spec["name"], [
        [f["function"], {k: v for k, v in f.items() if k != "function"} or None] for f in filter_spec["filter"]])
    instances = []
    for i, t in enumerate(texts):
        inst = Instance(request_type="generate_until", doc={}, arguments=("", {}), idx=0, metadata=("x", i, 1))
        inst.resps = [t]
        instances.append(inst)
    ensemble.apply(instances)
    return [inst.filtered_resps[filter_spec["name"]] for inst in instances]


_MC_TASKS = {}


def _mc_task(choices):
    """A minimal in-memory lm-eval multiple_choice task whose doc_to_choice is `choices` (built once per list).

    Config: output_type multiple_choice, doc_to_text "{{text}}", doc_to_target "gold", metrics acc and acc_norm,
    everything else lm-eval's TaskConfig defaults (target delimiter " ", no chat template). Only lm-eval's own
    request construction and metric code are used from it; the data it is built on is one empty document."""
    from lm_eval.api.task import ConfigurableTask

    key = tuple(choices)
    if key not in _MC_TASKS:
        def one_doc(**_metadata):
            import datasets

            return datasets.DatasetDict({"validation": datasets.Dataset.from_dict({"text": [""], "gold": [0]})})

        import logging

        log = logging.getLogger("lm_eval")
        level = log.level
        log.setLevel(logging.ERROR)  # its warnings (default aggregation, --metadata hint) are about this stub task
        try:
            _MC_TASKS[key] = ConfigurableTask(config={
                "task": "mc_metrics", "custom_dataset": one_doc, "validation_split": "validation",
                "output_type": "multiple_choice", "doc_to_text": "{{text}}", "doc_to_target": "gold",
                "doc_to_choice": list(choices), "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]})
        finally:
            log.setLevel(level)
    return _MC_TASKS[key]


def multiple_choice_requests(choices, context):
    """lm-eval's ConfigurableTask.construct_requests: the (context, delimiter + choice) pair of every choice."""
    task = _mc_task(choices)
    return [tuple(inst.arguments) for inst in task.construct_requests({"text": context, "gold": 0}, context)]


def multiple_choice_results(choices, gold, results):
    """lm-eval's ConfigurableTask.process_results (acc, acc_norm) for one multiple-choice document.

    `choices` are the displayed choice strings without the target delimiter (as doc_to_choice returns them),
    `gold` the index of the correct one, `results` the (loglikelihood, is_greedy) pairs in choice order."""
    out = _mc_task(choices).process_results({"text": "", "gold": int(gold)},
                                            [(float(l), bool(g)) for l, g in results])
    return {"acc": float(out["acc"]), "acc_norm": float(out["acc_norm"])}


def aggregate(metric, values):
    """lm-eval's own default aggregation of `metric` (its registry: acc -> mean, f1 -> corpus F1) over per-document
    values, as simple_evaluate reports it: for the logged samples of a data-parallel run gathered from its ranks or
    shards (experiments/parallel.py), whose lm-eval runs each saw only a part of the documents."""
    import lm_eval.api.metrics  # noqa: F401 -- registers the metrics and their aggregations
    from lm_eval.api.registry import get_metric_aggregation

    return get_metric_aggregation(metric)(list(values))
