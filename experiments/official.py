"""The official path: lm-eval 0.4.9.2 with its own installed task YAML. The only module that imports lm_eval.

The task config is loaded from the installed file unmodified, except that its `custom_dataset` hook serves the
verified local parquet (and an empty `train` split, which lm-eval's constructor opens to build its few-shot
sampler; the protocol is zero-shot, so it is never read). Task name, prompt, labels, choices and scoring stay
official: only the data transport changes.
"""
import hashlib
from pathlib import Path

import lm_eval

LM_EVAL_DIR = Path(lm_eval.__file__).resolve().parent

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


def task_config(yaml_rel, parquet_path):
    """The installed task YAML as lm-eval loads it, with only custom_dataset added."""
    from lm_eval.utils import load_yaml_config

    cfg = load_yaml_config(str(LM_EVAL_DIR / yaml_rel))
    parquet_path = str(parquet_path)

    def serve_verified_parquet(**_metadata):
        import datasets
        import pyarrow.parquet as pq

        validation = datasets.Dataset(datasets.table.InMemoryTable(pq.read_table(parquet_path)))
        return datasets.DatasetDict({"validation": validation, "train": validation.select([])})

    cfg["custom_dataset"] = serve_verified_parquet
    return cfg


def make_lm(model_dir, config):
    """HFLM over the prepared directory with the scoring settings of config.py (the same the independent path uses)."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(model_dir), device=config["device"], dtype=config["dtype"],
                batch_size=config["batch_size"], max_length=config["max_input_tokens"],
                attn_implementation=config["attn_implementation"], logits_cache=True)


def evaluate(lm, cfg, task_name, indices, seed):
    """simple_evaluate on exactly `indices` (passed through as given: the caller decides their order)."""
    from lm_eval import evaluator

    return evaluator.simple_evaluate(
        model=lm, tasks=[cfg], samples={task_name: list(indices)}, log_samples=True, bootstrap_iters=0,
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
