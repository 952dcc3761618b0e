"""`lm_eval` (0.4.9.2's own CLI, same arguments) offline, on a task from --include_path outside lm-eval's package.

    .venv/bin/python tools/lmeval_offline_run.py --model hf --model_args pretrained=DIR --include_path TASK_DIR
        --tasks NAME --log_samples --output_path RUN_DIR ...

Why a script: 0.4.9.2's CLI stops on such a task before it evaluates anything. get_task_dict logs every top-level
task, and every task of a group's subgroup, with pretty_print_task, which calls
Path(yaml_path).relative_to(<lm_eval>/tasks) (lm-eval 0.4.9.2 lm_eval/tasks/__init__.py:683): a ValueError for any
YAML outside the package, whether --include_path is absolute or relative. (A task listed directly in a group YAML
of its own is logged by name only and runs; the results then hold that group too.)

What this script changes, and nothing else: it sets HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE and
HF_EVALUATE_OFFLINE to 1 before anything imports the Hugging Face libraries (no network is tried), and it has
TaskManager's index name each YAML outside the package by a path that starts with <lm_eval>/tasks/ and leads, through
"..", to the same file (relative_to is lexical, so the log line prints that relative path; the task is read from the
same bytes). Then it calls lm_eval's cli_evaluate: the same argument parsing, simple_evaluate and output files as
`lm_eval` itself."""
import os
import sys
from pathlib import Path

OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_EVALUATE_OFFLINE")


def index_inside_package(tasks_module):
    """Wrap TaskManager.initialize_tasks so that every yaml_path outside the package is written under it."""
    shown = Path(tasks_module.__file__).parent           # the path pretty_print_task compares with
    real = os.path.realpath(shown)                       # ".." is resolved from where the directory really is
    original = tasks_module.TaskManager.initialize_tasks

    def initialize_tasks(self, *args, **kwargs):
        index = original(self, *args, **kwargs)
        for entry in index.values():
            path = entry.get("yaml_path")
            if isinstance(path, str) and not os.path.abspath(path).startswith(str(shown) + os.sep):
                entry["yaml_path"] = str(shown / os.path.relpath(os.path.realpath(path), real))
        return index

    tasks_module.TaskManager.initialize_tasks = initialize_tasks


def main(argv):
    if argv and argv[0] in ("-h", "--help"):     # without importing lm-eval (seconds to minutes on a busy machine)
        what, usage = __doc__.split("\n\n")[:2]
        print(f"usage: {usage.strip()}\n\n{what}\nEvery argument is lm_eval's own: `lm_eval --help` lists them.")
        return
    for key in OFFLINE:
        os.environ[key] = "1"
    import lm_eval.tasks
    from lm_eval.__main__ import cli_evaluate

    index_inside_package(lm_eval.tasks)
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    main(sys.argv[1:])
