"""python -m harness run  --adapter toy|wrong|smollm2 --out F [--tasks-dir D] [--cache C] [options]
   python -m harness diff A.json B.json [--allow-different-tasks]

`run` scores one adapter on every task file in --tasks-dir (default: harness_tasks/ next to --out, seeded with
the shipped fixtures when it has no task files) and writes the leaderboard to --out. `smollm2` needs --cache, a
directory prepared by prepare.py; its model files are re-hashed against the cache manifest before loading.
`diff` prints which tasks moved and by how much and which examples changed; it refuses (exit 2) to compare
runs whose task files differ unless --allow-different-tasks.

Exit codes: 0 success; 2 bad input (malformed task file, missing cache, different tasks in diff).
"""
import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from harness import leaderboard, runner
from harness.adapters import make_adapter
from harness.sandbox import DEFAULT_LIMITS, SandboxUnavailable
from harness.tasks import TaskFormatError, load_all_tasks, seed_fixture_tasks


def settings_from(config, sandbox_limits):
    return {"batch_size": config["harness_batch_size"], "timeout_s": config["harness_timeout_s"],
            "max_new_tokens": config["harness_max_new_tokens"], "sandbox": sandbox_limits}


def cmd_run(args):
    from config import CONFIG

    config = dict(CONFIG, harness_batch_size=args.batch_size, harness_timeout_s=args.timeout_s,
                  harness_max_new_tokens=args.max_new_tokens)
    tasks_dir = Path(args.tasks_dir) if args.tasks_dir else Path(args.out).resolve().parent / "harness_tasks"
    if seed_fixture_tasks(tasks_dir):
        print(f"seeded the fixture tasks into {tasks_dir}")
    try:
        tasks = load_all_tasks(tasks_dir)
    except TaskFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model_dir = None
    if args.adapter == "smollm2":
        import resources

        if not args.cache:
            print("error: --adapter smollm2 needs --cache (a directory prepared by prepare.py)", file=sys.stderr)
            return 2
        try:
            resources.verify_resource_files(args.cache, args.model)
        except resources.ResourceError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        model_dir = Path(args.cache) / "models" / args.model
    adapter = make_adapter(args.adapter, model_dir, config, args.model)
    limits = {**DEFAULT_LIMITS, **config.get("harness_sandbox", {})}
    with tqdm(total=sum(len(t.examples) for t in tasks.values()), desc=adapter.name, unit="ex",
              disable=args.adapter != "smollm2") as bar:
        try:
            per_task, examples = runner.run_leaderboard(adapter, tasks, args.batch_size, args.timeout_s, limits, bar)
        except SandboxUnavailable as e:
            print(f"error: code_exec cannot run here: {e}", file=sys.stderr)
            return 2
    board = leaderboard.build(adapter.name, tasks, per_task, examples, settings_from(config, limits),
                              args.include_per_example)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(leaderboard.dumps(board), encoding="utf-8")
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


def main(argv=None):
    from config import CONFIG

    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="score one adapter on a directory of task files")
    r.add_argument("--adapter", choices=["toy", "wrong", "smollm2"], required=True)
    r.add_argument("--out", required=True, help="leaderboard.json to write")
    r.add_argument("--tasks-dir", help="directory of <task>.jsonl files (default: harness_tasks/ next to --out)")
    r.add_argument("--cache", help="prepared cache (for --adapter smollm2)")
    r.add_argument("--model", default=CONFIG["model"], help="model resource id in the cache")
    r.add_argument("--batch-size", type=int, default=CONFIG["harness_batch_size"])
    r.add_argument("--timeout-s", type=float, default=CONFIG["harness_timeout_s"],
                   help="per-example wall-clock budget for the adapter (a batch of n gets n times this)")
    r.add_argument("--max-new-tokens", type=int, default=CONFIG["harness_max_new_tokens"])
    r.add_argument("--include-per-example", action="store_true", help="write every prediction into the file")
    d = sub.add_parser("diff", help="compare two leaderboard.json files")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--allow-different-tasks", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "run" and (args.batch_size < 1 or args.timeout_s <= 0):
        p.error("--batch-size must be >= 1 and --timeout-s > 0")
    return cmd_run(args) if args.cmd == "run" else cmd_diff(args)
