"""Make real lm-eval 0.4.9.2 output with groups, a loglikelihood_rolling task and bootstrapped metrics, for
tests/fixtures/lmeval_groups/ (tests/test_lmeval_groups.py and the forward re-scoring of rolling requests).

It builds, in a fresh temporary directory, a tiny randomly initialised Llama (seed 0, float32, safetensors) with a
word-level tokenizer over WORDS, writes the task and group YAMLs and their JSONL documents below (text invented
here), and runs the lm-eval 0.4.9.2 installed in this repository's .venv on them, in a child process:

  fx_outer      group: fx_mc_c + fx_inner (a nested group); aggregate acc (weight_by_size true) and
                acc_norm (weight_by_size false). The task comes first: 0.4.9.2's task listing
                (lm_eval/tasks/__init__.py:703-705) crashes on a group whose first member is a group and
                whose next is a task
  fx_inner      group: fx_mc_a + fx_mc_b; same aggregate_metric_list
  fx_mc_a/b/c   multiple_choice, 5/3/4 documents (different sizes: the two weightings differ); fx_mc_a also
                logs mcc over its three choices (a bootstrap stderr the groups do not aggregate)
  fx_roll       loglikelihood_rolling: word_perplexity, byte_perplexity, bits_per_byte (max_length 16, so the
                longest document spans several rolling windows)
  fx_bin        binary multiple_choice: acc, f1, mcc (bootstrap stderrs)
  fx_ll         loglikelihood: perplexity (bootstrap stderr) and acc

Two things differ from a bare `lm_eval` command line, both forced by lm-eval 0.4.9.2 itself:
- its CLI has no --bootstrap_iters flag (the default, 100000, costs about ten minutes of both CPUs here for the f1
  and mcc replicates through scikit-learn), so the child calls what the CLI calls (evaluator.simple_evaluate, then
  EvaluationTracker.save_results_aggregated and save_results_samples per task, lm_eval/__main__.py:464-533) with
  bootstrap_iters=BOOTSTRAP_ITERS: 2500 gives two seeded chunks of 1000 and drops the remainder of 500, as
  lm-eval does (api/metrics.py bootstrap_stderr), through its multiprocessing pool (DISABLE_MULTIPROC unset);
- get_task_dict logs each task's YAML path relative to lm_eval/tasks/ and raises for a YAML outside it
  (lm_eval/tasks/__init__.py:679-684), so an --include_path task cannot run. Instead of writing into .venv, the
  child imports lm_eval from an overlay directory put first on PYTHONPATH: `lm_eval/` holds a symlink to every
  entry of the installed package but `tasks/`, which holds a symlink to every entry of the installed tasks/ plus
  the real directory `fx_groups/` with the YAMLs. The code that runs is the installed code, unchanged; os.walk
  does not follow the symlinked task folders, so the task index holds only fx_groups.

    .venv/bin/python tools/make_lmeval_group_fixtures.py          # rewrites tests/fixtures/lmeval_groups/
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "lmeval_groups"
MODEL = "tiny-llama"              # relative to the work directory: model_args name no host path
BOOTSTRAP_ITERS = 2500
MAX_LENGTH = 16
TASKS = ["fx_outer", "fx_roll", "fx_bin", "fx_ll"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "Q:", "A:", "Claim:", "True?", "which", "tool", "cuts", "wood", "holds",
         "water", "bread", "a", "saw", "cup", "knife", "rope", "spoon", "lamp", "brick", "the", "is", "made", "of",
         "clay", "glass", "stone", "iron", "warm", "cold", "light", "heavy", "yes", "no", "river", "hill", "over",
         "slowly", "quickly", "walked", "owl", "fox", "and", "under", "moon", "?", ".", ","]


def mc(question, choices, label):
    return {"question": question, "choices": choices, "label": label}


DOCS = {
    "mc_a": [mc("which tool cuts wood ?", ["saw", "cup", "rope"], 0),
             mc("which tool holds water ?", ["knife", "cup", "brick"], 1),
             mc("which tool cuts bread ?", ["spoon", "lamp", "knife"], 2),
             mc("which is heavy ?", ["a brick", "light", "a cup of glass"], 0),
             mc("which is made of clay ?", ["rope", "a brick", "the moon"], 1)],
    "mc_b": [mc("which is warm ?", ["the lamp", "cold stone"], 0),
             mc("which is cold ?", ["warm bread", "iron", "the lamp"], 1),
             mc("which is light ?", ["a heavy brick", "stone", "rope"], 2)],
    "mc_c": [mc("which is made of glass ?", ["a cup", "the hill", "the river"], 0),
             mc("which holds water ?", ["the owl", "the river", "the fox"], 1),
             mc("which walked over the hill ?", ["a spoon", "the moon", "the fox"], 2),
             mc("which is made of iron ?", ["a knife", "bread"], 0)],
    "bin": [{"claim": c, "label": y} for c, y in [
        ("a saw cuts wood", 1), ("a cup cuts stone", 0), ("the river is made of glass", 0),
        ("a brick is heavy", 1), ("the lamp is cold", 0), ("the fox walked slowly", 1),
        ("iron is light", 0), ("a knife cuts bread", 1), ("the owl is made of clay", 0),
        ("a rope holds water", 0), ("the moon is over the hill", 1)]],
    "ll": [{"prefix": c.rsplit(" ", 1)[0], "word": c.rsplit(" ", 1)[1]} for c in [
        "a saw cuts wood", "a cup holds water", "the fox walked over the hill", "a knife cuts bread",
        "the owl is made of clay", "the moon is over the river", "iron is heavy"]],
    # count_words splits on \s+ (leading/trailing space gives an empty word), count_bytes counts UTF-8 bytes:
    # the texts include a double space, a trailing space and non-ASCII letters on purpose
    "roll": [{"text": t} for t in [
        "the owl walked slowly over the hill .",
        "a fox and an owl walked  under the moon , quickly .",
        "the river is cold ; the stone is warm . ",
        "café crème is warm , the brick is heavy .",
        "the fox walked over the hill and under the moon , and the owl walked slowly over the river ; the lamp "
        "is light and the brick is heavy and the cup holds water .",
        "naïve"]],
}

MC_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/{name}.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm{extra}
metadata:
  version: 1.0
"""
GROUP = """group: {name}
task:
{tasks}
aggregate_metric_list:
  - metric: acc
    aggregation: mean
    weight_by_size: true
  - metric: acc_norm
    aggregation: mean
    weight_by_size: false
metadata:
  version: 2.0
"""
BIN_TASK = """task: fx_bin
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/fx_bin.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{claim}}"
doc_to_choice: ["no", "yes"]
doc_to_target: label
metric_list:
  - metric: acc
  - metric: f1
  - metric: mcc
metadata:
  version: 1.0
"""
LL_TASK = """task: fx_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/fx_ll.jsonl
test_split: test
output_type: loglikelihood
doc_to_text: "{{prefix}}"
doc_to_target: " {{word}}"
metric_list:
  - metric: perplexity
  - metric: acc
metadata:
  version: 1.0
"""
ROLL_TASK = """task: fx_roll
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/fx_roll.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


def write_tasks(work, tasks_dir):
    (work / "data").mkdir()
    for key, docs in DOCS.items():
        (work / "data" / f"fx_{key}.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n"
                                                               for d in docs))
    tasks_dir.mkdir()
    for key in ("mc_a", "mc_b", "mc_c"):       # fx_mc_a adds a three-class MCC (bootstrapped, not aggregated)
        extra = "\n  - metric: mcc" if key == "mc_a" else ""
        (tasks_dir / f"fx_{key}.yaml").write_text(MC_TASK.format(name=f"fx_{key}", extra=extra))
    (tasks_dir / "fx_inner.yaml").write_text(GROUP.format(name="fx_inner", tasks="  - fx_mc_a\n  - fx_mc_b"))
    (tasks_dir / "fx_outer.yaml").write_text(GROUP.format(name="fx_outer", tasks="  - fx_mc_c\n  - fx_inner"))
    (tasks_dir / "fx_bin.yaml").write_text(BIN_TASK)
    (tasks_dir / "fx_roll.yaml").write_text(ROLL_TASK)
    (tasks_dir / "fx_ll.yaml").write_text(LL_TASK)


def build_model(out):
    """A word-level tokenizer over WORDS and a tiny random Llama (seed 0, float32), saved as safetensors: the
    versions fixtures' builder, with these words."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_lmeval_fixtures

    make_lmeval_fixtures.build_model(out, WORDS)


def overlay(root):
    """root/lm_eval: symlinks to the installed package's entries, tasks/ a real directory of symlinks (above)."""
    import lm_eval

    real = Path(lm_eval.__file__).resolve().parent
    pkg = root / "lm_eval"
    pkg.mkdir(parents=True)
    for item in real.iterdir():
        if item.name not in ("tasks", "__pycache__"):
            (pkg / item.name).symlink_to(item)
    (pkg / "tasks").mkdir()
    for item in (real / "tasks").iterdir():
        if item.name != "__pycache__":
            (pkg / "tasks" / item.name).symlink_to(item)
    return pkg / "tasks" / "fx_groups"


def child(out):
    """Inside the overlay: what lm_eval/__main__.py does with --log_samples --output_path out, but with
    bootstrap_iters set."""
    from lm_eval import evaluator
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tracker = EvaluationTracker(output_path=out)
    results = evaluator.simple_evaluate(
        model="hf", model_args=f"pretrained={MODEL},dtype=float32,max_length={MAX_LENGTH}", tasks=TASKS,
        batch_size=1, device="cpu", log_samples=True, evaluation_tracker=tracker, task_manager=TaskManager(),
        bootstrap_iters=BOOTSTRAP_ITERS)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=samples[task_name])


def write_readme(freeze):
    lines = [
        "# Real lm-eval 0.4.9.2 output: groups, loglikelihood_rolling, bootstrap stderrs", "",
        "`run/` is what lm-eval 0.4.9.2 (this repository's .venv) wrote under its `--output_path`, unchanged: the",
        "model-named subdirectory, `results_<date>.json` and one `samples_<task>_<date>.jsonl` per task. Made by:", "",
        "```", ".venv/bin/python tools/make_lmeval_group_fixtures.py", "```", "",
        "which evaluates, on a tiny random Llama (seed 0, float32, a word-level tokenizer over "
        f"{len(WORDS)} words), the tasks `{', '.join(TASKS)}` with",
        f"`model_args=pretrained={MODEL},dtype=float32,max_length={MAX_LENGTH}`, batch size 1, cpu, log_samples and",
        f"`bootstrap_iters={BOOTSTRAP_ITERS}` (lm-eval's CLI has no flag for it; the script calls what the CLI calls:",
        "its docstring says why, and why lm_eval is imported through an overlay of symlinks).", "",
        "- `fx_outer` (group): `fx_mc_c` and `fx_inner` (a nested group of `fx_mc_a`, `fx_mc_b`); both groups",
        "  aggregate `acc` with `weight_by_size: true` and `acc_norm` with `weight_by_size: false`;",
        "- `fx_mc_a`, `fx_mc_b`, `fx_mc_c`: multiple_choice, 5, 3 and 4 documents (acc, acc_norm; `fx_mc_a` also",
        "  mcc over its three choices, with a bootstrap stderr, which the groups do not aggregate);",
        "- `fx_roll`: loglikelihood_rolling (word_perplexity, byte_perplexity, bits_per_byte), 6 documents, the",
        f"  longest spanning several rolling windows of max_length {MAX_LENGTH};",
        "- `fx_bin`: binary multiple_choice, 11 documents (acc, f1, mcc; f1 and mcc have bootstrap stderrs);",
        "- `fx_ll`: loglikelihood, 7 documents (perplexity, with a bootstrap stderr, and acc).", "",
        "The documents and YAMLs are in the script (text invented there). The group YAMLs are not in the output",
        "(lm-eval 0.4.9.2 records no group config): `weight_by_size` is known to the tests from the script only.", "",
        "Packages (`pip freeze`): " + ", ".join(f"`{f}`" for f in freeze), ""]
    (FIXTURES / "README.md").write_text("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    with tempfile.TemporaryDirectory(prefix="lmeval-groups-") as work:
        work = Path(work)
        build_model(work / MODEL)
        write_tasks(work, overlay(work / "overlay"))
        env = dict(os.environ, HF_HOME=str(work / "hf"), PYTHONPATH=str(work / "overlay"), **OFFLINE)
        env.pop("DISABLE_MULTIPROC", None)
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "run"], cwd=work, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
            raise SystemExit(f"lm-eval exited {proc.returncode}")
        if FIXTURES.exists():
            shutil.rmtree(FIXTURES)
        FIXTURES.mkdir(parents=True)
        shutil.copytree(work / "run", FIXTURES / "run")
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    names = ("lm-eval", "lm_eval", "transformers", "torch", "datasets", "scikit-learn", "numpy", "tokenizers")
    write_readme([ln for ln in freeze.splitlines() if ln.split("==")[0].lower() in names])
    print(f"wrote {FIXTURES}")


if __name__ == "__main__":
    main()
