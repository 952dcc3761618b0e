"""The mini harness on the prepared SmolLM2 (seed study 002): the fixture tasks, greedy chat replies, five metrics.

Tasks come from config["harness_tasks_dir"], or O/.harness_tasks/ seeded from fixtures/harness_tasks when it
has no task files. --smoke takes the first `harness_smoke_examples` example(s) of each task; dev takes all of
them; the fixtures have no held-back part, so --split confirm scores the same examples as dev (and says so).

Evidence: records.jsonl has one line per example without any text (task, id, prompt sha256, prediction sha256,
score, timeout, latency, sandbox outputs for code_exec); summary.json is the leaderboard without predictions;
O/private/harness/ holds leaderboard.json with every prediction and a copy of each task file scored, which is
what audit.py recomputes task and overall scores from. Task files are hashed before and after the run; a file
that changed underneath the run is an IdentityMismatch.
"""
import hashlib
import json
from pathlib import Path

from tqdm import tqdm

from experiments.evidence import IdentityMismatch
from harness import leaderboard, runner
from harness.adapters import SmolLM2Adapter
from harness.sandbox import DEFAULT_LIMITS, SandboxUnavailable
from harness.tasks import TaskFormatError, head, load_all_tasks, seed_fixture_tasks
from resources import fail, sha256_file

NAME = "harness"


def tasks_dir_of(ctx):
    configured = ctx["config"].get("harness_tasks_dir")
    # a dot directory: audit.py treats every other directory in O as an experiment's evidence
    return Path(configured) if configured else Path(ctx["args"].out) / ".harness_tasks"


def record_of(e):
    """Public per-example evidence: hashes and numbers, no prompt or reply text."""
    sandbox = e["details"].get("sandbox")
    rec = {"task": e["task"], "id": e["id"], "prompt_sha256": e["prompt_sha256"], "score": e["score"],
           "prediction_sha256": None if e["prediction"] is None else runner.sha256_text(e["prediction"]),
           "timed_out": e["timed_out"], "latency_s": e["latency_s"]}
    if sandbox is not None:
        rec["code_sha256"] = e["details"]["code_sha256"]
        rec["sandbox"] = {k: sandbox[k] for k in ("matched", "total", "outputs", "error", "timed_out")}
    return rec


def headline(board, split):
    tasks = ", ".join(f"{n} {t['score']:.3f}" for n, t in board["tasks"].items())
    n = sum(t["total"] for t in board["tasks"].values())
    timeouts = sum(t["timeouts"] for t in board["tasks"].values())
    iso = board.get("sandbox_isolation")
    sandbox = f"sandbox {iso['mode']}, network {iso['network']}" if iso else "sandbox not run (no code reply)"
    return (f"{board['adapter']} on {len(board['tasks'])} tasks / {n} examples ({split}): overall "
            f"{board['overall']:.4f} ({tasks}); {timeouts} timeouts; {sandbox}")


def run(ctx):
    config, split, stages = ctx["config"], ctx["split"], ctx["stages"]
    tasks_dir = tasks_dir_of(ctx)
    seeded = seed_fixture_tasks(tasks_dir)
    try:
        tasks = load_all_tasks(tasks_dir)
    except TaskFormatError as e:
        fail(str(e))
    if split == "smoke":
        tasks = head(tasks, config["harness_smoke_examples"])
    limits = {**DEFAULT_LIMITS, **config["harness_sandbox"]}

    with stages.stage("load_model"):
        adapter = SmolLM2Adapter(ctx["model_dir"], config, ctx["model_identity"]["id"])
    n_examples = sum(len(t.examples) for t in tasks.values())
    with stages.stage("generate_and_score"), tqdm(total=n_examples, desc="harness", unit="ex") as bar:
        try:
            per_task, examples = runner.run_leaderboard(adapter, tasks, config["harness_batch_size"],
                                                        config["harness_timeout_s"], limits, bar)
        except SandboxUnavailable as e:
            fail(f"code_exec cannot run here: {e} (see harness/sandbox.py for what the sandbox needs)")

    with stages.stage("check"):
        task_bytes = {name: t.path.read_bytes() for name, t in tasks.items()}
        bad = [(name, "task file sha256", t.sha256, hashlib.sha256(task_bytes[name]).hexdigest())
               for name, t in tasks.items() if hashlib.sha256(task_bytes[name]).hexdigest() != t.sha256]
        expected = [(t.name, ex.id, runner.sha256_text(ex.prompt))
                    for _, t in sorted(tasks.items()) for ex in t.examples]
        got = [(e["task"], e["id"], e["prompt_sha256"]) for e in examples]
        bad += [(f"{x[0]}/{x[1]}", "task/id/prompt_sha256", x, y) for x, y in zip(expected, got) if x != y]
        if len(expected) != len(got):
            bad.append((None, "n_examples", len(expected), len(got)))
        if bad:
            raise IdentityMismatch("harness evidence does not match the task files it claims", bad)

    settings = {"batch_size": config["harness_batch_size"], "timeout_s": config["harness_timeout_s"],
                "max_new_tokens": config["harness_max_new_tokens"], "sandbox": limits,
                "decoding": "greedy", "chat_template": True, "split": split}
    board = leaderboard.build(adapter.name, tasks, per_task, examples, settings, include_per_example=True)
    public_board = {k: v for k, v in board.items() if k != "per_example"}
    fixture_hashes = {p.stem: sha256_file(p) for p in sorted(Path(__file__).resolve().parents[1]
                                                             .joinpath("fixtures", "harness_tasks").glob("*.jsonl"))}
    summary = {"experiment": NAME, "split": split, "confirmation_items_scored": False,
               "split_note": "the fixture tasks have no held-back part: confirm scores the same examples as dev"
               if split == "confirm" else None,
               "n_examples": n_examples, "leaderboard": public_board,
               "tasks_are_shipped_fixtures": {n: fixture_hashes.get(n) == t.sha256 for n, t in tasks.items()}}
    template = adapter.tokenizer.chat_template or ""
    config_out = {"experiment": NAME, "split": split, "tasks_dir": str(tasks_dir), "tasks_seeded_this_run": seeded,
                  "tasks": {n: {"sha256": t.sha256, "metric": t.metric, "n_in_file": t.n_in_file,
                                "n_scored": len(t.examples), "ids": [ex.id for ex in t.examples]}
                            for n, t in tasks.items()},
                  "settings": settings, "config": config, "model": ctx["model_identity"],
                  "prompt_rule": "tokenizer.apply_chat_template([{'role': 'user', 'content': prompt}], "
                                 "add_generation_prompt=True); no other text added",
                  "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest()}
    private = {"leaderboard.json": leaderboard.dumps(board)}
    for name, t in tasks.items():
        private[f"tasks/{t.path.name}"] = task_bytes[name].decode("utf-8")
    return {"config": config_out, "records": [record_of(e) for e in examples], "summary": summary,
            "token_stats": dict(adapter.tokens), "private": private,
            "public": {"leaderboard.json": leaderboard.dumps(public_board)},
            "headline": headline(board, split),
            "prompt_template_sha256": hashlib.sha256(json.dumps(
                {"chat_template": template, "prompt_rule": config_out["prompt_rule"]}, sort_keys=True)
                .encode("utf-8")).hexdigest()}
