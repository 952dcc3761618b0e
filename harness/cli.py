"""python -m harness run  --adapter toy|wrong|smollm2 --out F [--tasks-dir D [--seed-fixtures]] [--cache C] [options]
   python -m harness diff A.json B.json [--allow-different-tasks]

`run` scores one adapter on every task file in --tasks-dir and writes the leaderboard to --out. Without
--tasks-dir it reads the shipped fixture tasks (fixtures/harness_tasks) in place. --tasks-dir must exist and hold
task files; with --seed-fixtures it is created if needed and the fixtures are copied into it when it has no task
files (an editable copy). `smollm2` needs --cache, a directory prepared by prepare.py: the model's files are
re-hashed against the cache manifest, then loaded by harness/hf_model.py (the loader run.py's experiments use
too, through adapter.py) with --dtype, --attn-implementation, --threads and --device, whose defaults are config.py's
values.
`diff` prints which tasks moved and by how much and which examples changed; it refuses (exit 2) to compare
runs whose task files differ unless --allow-different-tasks.

Exit codes: 0 success; 2 bad input (missing tasks directory, malformed task file, missing or changed model,
different tasks in diff).
"""
import argparse
import os
import sys
from pathlib import Path

from tqdm import tqdm

from harness import leaderboard, runner
from harness.adapters import make_adapter
from harness.hf_model import (LOAD_SETTINGS, ModelLoadError, ModelUnavailable, device_problem, load_hf_model,
                              verify_prepared_model)
from harness.sandbox import DEFAULT_LIMITS, SandboxUnavailable
from harness.tasks import FIXTURES, TaskFormatError, load_all_tasks, seed_fixture_tasks

# The CLI's own defaults: the same values as config.py's (tests/test_harness.py checks that they agree).
DEFAULTS = {"model": "smollm2-135m-instruct-q4_1", "batch_size": 4, "timeout_s": 120.0, "max_new_tokens": 128,
            "max_input_tokens": 512, "dtype": "float32", "attn_implementation": "eager",
            "threads": int(os.environ.get("EVAL_TORCH_THREADS", "2")), "device": "cpu"}


def load_tasks(args):
    tasks_dir = Path(args.tasks_dir) if args.tasks_dir else FIXTURES
    if args.seed_fixtures and seed_fixture_tasks(tasks_dir):
        print(f"seeded the fixture tasks into {tasks_dir}")
    return load_all_tasks(tasks_dir)


def adapter_of(args):
    if args.adapter != "smollm2":
        return make_adapter(args.adapter)
    if not args.cache:
        raise ModelUnavailable("--adapter smollm2 needs --cache (a directory prepared by prepare.py)")
    model_dir = verify_prepared_model(args.cache, args.model)
    problem = device_problem(args.device)
    if problem:
        raise ModelUnavailable(f"--device {args.device}: {problem}")
    settings = {key: getattr(args, key) for key in LOAD_SETTINGS}
    return make_adapter("smollm2", lambda: load_hf_model(model_dir, settings),
                        args.model, args.max_new_tokens, args.max_input_tokens)


def cmd_run(args):
    try:
        tasks = load_tasks(args)
        adapter = adapter_of(args)
    except (TaskFormatError, ModelUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    limits = dict(DEFAULT_LIMITS)
    with tqdm(total=sum(len(t.examples) for t in tasks.values()), desc=adapter.name, unit="ex",
              disable=args.adapter != "smollm2") as bar:
        try:
            per_task, examples = runner.run_leaderboard(adapter, tasks, args.batch_size, args.timeout_s, limits, bar)
        except SandboxUnavailable as e:
            print(f"error: code_exec cannot run here: {e}", file=sys.stderr)
            return 2
        except ModelLoadError as e:     # the model loads lazily, at the first prompt
            print(f"error: {e}", file=sys.stderr)
            return 2
    settings = {"batch_size": args.batch_size, "timeout_s": args.timeout_s, "max_new_tokens": args.max_new_tokens,
                "sandbox": limits}
    board = leaderboard.build(adapter.name, tasks, per_task, examples, settings, args.include_per_example)
    try:
        leaderboard.write(args.out, board)
    except (ValueError, OSError) as e:  # e.g. an unencodable prediction, a full disk: the old board is untouched
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, t in per_task.items():
        print(f"{name:<20} {t['score']:.4f}  {t['correct']}/{t['total']}  timeouts {t['timeouts']}  "
              f"latency {t['latency_s']:.2f}s")
    print(f"{'overall':<20} {board['overall']:.4f}   ({adapter.name}) -> {args.out}")
    return 0


def cmd_diff(args):
    try:
        a, b = leaderboard.load(args.a), leaderboard.load(args.b)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    code, lines = leaderboard.diff(a, b, args.allow_different_tasks)
    print("\n".join(lines), file=sys.stderr if code else sys.stdout)
    return code


def add_run_parser(sub):
    r = sub.add_parser("run", help="score one adapter on a directory of task files")
    r.add_argument("--adapter", choices=["toy", "wrong", "smollm2"], required=True)
    r.add_argument("--out", required=True, help="leaderboard.json to write")
    r.add_argument("--tasks-dir", help="an existing directory of <task>.jsonl files (default: the shipped fixture "
                                       "tasks, read in place)")
    r.add_argument("--seed-fixtures", action="store_true",
                   help="create --tasks-dir if needed and copy the fixture tasks into it when it has none")
    r.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    r.add_argument("--timeout-s", type=float, default=DEFAULTS["timeout_s"],
                   help="per-example wall-clock budget for the adapter (a batch of n gets n times this)")
    r.add_argument("--include-per-example", action="store_true", help="write every prediction into the file")
    m = r.add_argument_group("the smollm2 adapter")
    m.add_argument("--cache", help="a cache prepared by prepare.py")
    m.add_argument("--model", default=DEFAULTS["model"], help="model resource id in the cache")
    m.add_argument("--max-new-tokens", type=int, default=DEFAULTS["max_new_tokens"])
    m.add_argument("--max-input-tokens", type=int, default=DEFAULTS["max_input_tokens"],
                   help="a longer chat-rendered prompt is an error, never truncated")
    m.add_argument("--dtype", default=DEFAULTS["dtype"])
    m.add_argument("--attn-implementation", default=DEFAULTS["attn_implementation"])
    m.add_argument("--threads", type=int, default=DEFAULTS["threads"],
                   help="torch threads (default: EVAL_TORCH_THREADS, else 2)")
    m.add_argument("--device", default=DEFAULTS["device"], help="cpu, cuda or cuda:N")
    return r


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    add_run_parser(sub)
    d = sub.add_parser("diff", help="compare two leaderboard.json files")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--allow-different-tasks", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "diff":
        return cmd_diff(args)
    if args.batch_size < 1 or args.timeout_s <= 0 or args.threads < 1:
        p.error("--batch-size and --threads must be >= 1 and --timeout-s > 0")
    if args.seed_fixtures and not args.tasks_dir:
        p.error("--seed-fixtures needs --tasks-dir (the directory to copy the fixture tasks into)")
    return cmd_run(args)
