"""The mini harness on the prepared SmolLM2: the fixture tasks, greedy chat replies, five metrics.

Tasks come from config["harness_tasks_dir"], which must exist, or by default from the shipped fixture tasks
(fixtures/harness_tasks), read in place: no working directory is made (nothing public holds prompts or targets).
--smoke takes the first `harness_smoke_examples` example(s) of each task; dev takes all of them; the fixtures have
no held-back part, so --split confirm and --split all score the same examples as dev (and say so). Reads
ctx.options.out and ctx.options.limit: --limit N scores the first N examples of each task in file order, as
lm-eval's limit does per task (a task with N or fewer examples is scored whole; config.json's n_scored says so).

The model is loaded here, through the repository's adapter.py, and handed to harness/ as an object: harness/ imports
nothing from the repository.

The adapter is config["harness_adapter"] (default smollm2; toy and wrong, harness/adapters.py, need no model weights
but the tokenizer still names the chat template). The smollm2 adapter serves any chat model; the leaderboard names
it by the model (model_name: a local directory's name, else the lock id), not by the adapter.

Evidence: records.jsonl has one line per example without any text (task, id, prompt sha256, reference sha256 (the
example's metric, targets and extras hashed), prediction sha256, score, timeout, latency, sandbox outputs for
code_exec); summary.json is the leaderboard without predictions and, per task, whether its file is the shipped
fixture of that name byte for byte; the headline names the task set (task_set: "the shipped fixtures (5 tasks)" or
"N user tasks (...), not the shipped fixtures");
O/private/harness/ holds leaderboard.json with every prediction and a copy of each task file scored, which is what
audit.py recomputes task and overall scores from, and (smollm2) generations.jsonl: per answered example the
chat-rendered prompt, its token ids, the generated token ids and the finish reason, which audit.py --forward
re-checks with its own forward pass (every generated token the greedy argmax, the stop rule). Task files are hashed
before and after the run; a file that changed underneath the run is an IdentityMismatch. A missing or malformed task
file, or a sandbox that cannot be set up, is a ResourceError (exit 2).

Data parallel (torchrun / accelerate launch, --shard K/N, --merge; experiments/parallel.py): the examples go through
parallel.shard_map (call "harness") keyed by (task, id), grouped by adapter batch (task, position // batch_size), so
each batch is answered whole on one rank as in one process (same batch-level timeouts and latency split); each rank
loads its own model and runs its own sandbox; the per-task summaries are recomputed from the gathered examples.
"""
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from tqdm import tqdm

import adapter as model_adapter
import registry
from experiments import parallel
from experiments.context import Context, Result
from experiments.evidence import IdentityMismatch, stamped
from harness import leaderboard, runner
from harness.adapters import make_adapter
from harness.sandbox import DEFAULT_LIMITS, SandboxUnavailable
from harness.tasks import FIXTURES, TaskFormatError, head, load_all_tasks, read_task_bytes, reference_sha256
from resources import ResourceError, sha256_file

NAME = "harness"
DATA_PARALLEL = True   # its examples go through parallel.shard_map (torchrun, --shard, --merge)
CONFIG_SECTIONS = registry.config_sections(NAME)   # declared in registry.py
NEEDS_CHAT_TEMPLATE = True     # the model adapter renders every prompt with the chat template (run.py checks it)
SUPPORTS_LIMIT = True  # --limit N: the first N examples of each task (limit_tasks)
LIMIT_ORDER = "the first N examples of each task in file order (lm-eval's limit is per task)"
PROMPT_RULE = ("tokenizer.apply_chat_template([{'role': 'user', 'content': prompt}], add_generation_prompt=True); "
               "no other text added")


def tasks_dir_of(ctx):
    """(directory, configured): config["harness_tasks_dir"] (which must exist), else the shipped fixtures."""
    configured = ctx.config.get("harness_tasks_dir")
    return (Path(configured), True) if configured else (FIXTURES, False)


DATA_SCHEMA = None   # reads no --data (its own task files): run.py routes no data here


def data_label(ctx):
    """The task files the run will score, for run.py's console header (creates nothing)."""
    tasks_dir, configured = tasks_dir_of(ctx)
    names = sorted(p.stem for p in tasks_dir.glob("*.jsonl"))
    where = str(tasks_dir) if configured else "the shipped fixtures, read in place"
    return f"tasks {', '.join(names) or '(none)'} ({where})"


def load_tasks(ctx):
    tasks_dir, configured = tasks_dir_of(ctx)
    try:
        tasks = load_all_tasks(tasks_dir)
    except TaskFormatError as e:
        raise ResourceError(str(e)) from None
    if ctx.split == "smoke":
        tasks = head(tasks, ctx.config["harness_smoke_examples"])
    return tasks_dir, configured, tasks


def limit_tasks(tasks, n):
    """(tasks, the limit block or None): --limit N keeps the first N examples of each task in file order, decided
    from the task files alone before anything is answered. `of`: the examples before the limit."""
    if n is None:
        return tasks, None
    largest = max((len(t.examples) for t in tasks.values()), default=0)
    if not 1 <= n <= largest:
        raise ResourceError(f"harness: --limit {n} is outside 1..{largest} (the largest task has {largest} "
                            "examples; a larger N would limit nothing)")
    of = sum(len(t.examples) for t in tasks.values())
    return head(tasks, n), {"n": n, "of": of, "order": LIMIT_ORDER}


def limit_label(block, n_scored):
    """How a limited run says so (console headline; report.py words it the same from the evidence)."""
    return (f"first {block['n']} of each task's examples: {n_scored} of {block['of']} examples "
            f"(--limit {block['n']})")


def record_of(e, references):
    """Public per-example evidence: hashes and numbers, no prompt or reply text. `references`: {(task, id):
    reference_sha256}, the hash of what the example is scored against (the audit compares a shipped example's with
    the repository's fixture without the private task file)."""
    sandbox = e["details"].get("sandbox")
    rec = {"task": e["task"], "id": e["id"], "prompt_sha256": e["prompt_sha256"],
           "reference_sha256": references[(e["task"], e["id"])], "score": e["score"],
           "prediction_sha256": None if e["prediction"] is None else runner.sha256_text(e["prediction"]),
           "timed_out": e["timed_out"], "latency_s": e["latency_s"]}
    if sandbox is not None:
        rec["code_sha256"] = e["details"]["code_sha256"]
        rec["sandbox"] = {k: sandbox[k] for k in ("matched", "total", "outputs", "error", "timed_out")}
    return rec


def plural(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"


def task_set(shipped):
    """The tasks scored, in words, from {task: is it the shipped fixture file}: "the shipped fixtures (5 tasks)",
    or, when any task is not, "2 user tasks (a, b) [and 3 shipped fixture tasks], not the shipped fixtures" (the
    audit words it the same way from the repository's fixtures, and the report from summary.json)."""
    user = sorted(n for n, is_fixture in shipped.items() if not is_fixture)
    if not shipped:
        return "no tasks"
    if not user:
        return f"the shipped fixtures ({plural(len(shipped), 'task')})"
    rest = len(shipped) - len(user)
    also = f" and {plural(rest, 'shipped fixture task')}" if rest else ""
    return f"{plural(len(user), 'user task')} ({', '.join(user)}){also}, not the shipped fixtures"


def shipped_fixture_claims(tasks):
    """{task: True when its file is byte for byte the shipped fixture of that name}."""
    shipped = {p.stem: sha256_file(p) for p in sorted(FIXTURES.glob("*.jsonl"))}
    return {n: shipped.get(n) == t.sha256 for n, t in tasks.items()}


def model_name(identity):
    """The model as the leaderboard names it: a local directory by its name, a prepared model by its lock id."""
    if identity.get("source") == "local":
        return Path(identity["dir"]).name
    return identity["id"]


def headline(board, split, shipped):
    tasks = ", ".join(f"{n} {t['score']:.3f}" for n, t in board["tasks"].items())
    n = sum(t["total"] for t in board["tasks"].values())
    timeouts = sum(t["timeouts"] for t in board["tasks"].values())
    iso = board.get("sandbox_isolation")
    sandbox = f"sandbox {iso['mode']}, network {iso['network']}" if iso else "sandbox not run (no code reply)"
    return (f"{board['adapter']} on {task_set(shipped)} / {n} examples ({split}): overall "
            f"{board['overall']:.4f} ({tasks}); {timeouts} timeouts; {sandbox}")


def generate_and_score(ctx, tasks, limits):
    """(adapter facts, per-task summaries, per-example results, tokenizer), data parallel through
    parallel.shard_map: every example keyed (task, id), whole adapter batches on one rank."""
    tokenizer = model_adapter.load_tokenizer(ctx.inputs.model_dir)
    size = ctx.config["harness_batch_size"]
    items = [{"idx": (name, ex.id), "batch": (name, k // size)} for name in sorted(tasks)
             for k, ex in enumerate(tasks[name].examples)]
    per_item, meta = parallel.shard_map(ctx, "harness", items, lambda part: answer_part(ctx, tasks, part, limits),
                                        group=lambda it: it["batch"], combine=combined_adapter)
    parallel.scoring_done(ctx)
    examples = [per_item[it["idx"]] for it in items]
    generations = {g.pop("prompt_text"): g.pop("generation") for g in examples if "generation" in g}
    per_task = {name: runner.summarise_task(tasks[name], [SimpleNamespace(**e) for e in examples
                                                          if e["task"] == name]) for name in sorted(tasks)}
    adapter = SimpleNamespace(name=meta["name"], tokens=meta["tokens"])
    if meta["has_generations"]:
        adapter.generations = generations
    return adapter, tokenizer, per_task, examples


def combined_adapter(metas, per_item):
    """A shard_map combine: the adapter's name, and its token counters summed over the parts."""
    tokens = {k: sum(m["tokens"].get(k, 0) for m in metas) for k in metas[0]["tokens"]}
    return {**metas[0], "tokens": tokens}


def answer_part(ctx, tasks, part, limits):
    """({(task, id): example result (+ its generation trace)}, adapter facts) of the part's examples, in file order,
    on a model loaded here."""
    config = ctx.config
    keys = {it["idx"] for it in part}
    mine = {n: replace(t, examples=[ex for ex in t.examples if (n, ex.id) in keys]) for n, t in tasks.items()}
    mine = {n: t for n, t in mine.items() if t.examples}
    with ctx.stages.stage("load_model"):
        tokenizer = model_adapter.load_tokenizer(ctx.inputs.model_dir)
        adapter = make_adapter(config.get("harness_adapter", "smollm2"),
                               lambda: (model_adapter.load_model(ctx.inputs.model_dir, config), tokenizer),
                               model_name(ctx.inputs.model_identity), config["harness_max_new_tokens"],
                               config["max_input_tokens"])
    with ctx.stages.stage("generate_and_score"), tqdm(total=len(part), desc="harness", unit="ex") as bar:
        try:
            _, examples = runner.run_leaderboard(adapter, mine, config["harness_batch_size"],
                                                 config["harness_timeout_s"], limits, bar)
        except SandboxUnavailable as e:
            raise ResourceError(f"code_exec cannot run here: {e} (see harness/sandbox.py for what the sandbox "
                                "needs)") from None
    traces = getattr(adapter, "generations", None)
    prompts = {(n, ex.id): ex.prompt for n, t in mine.items() for ex in t.examples}
    for e in examples:
        if traces is not None and prompts[(e["task"], e["id"])] in traces:
            e["prompt_text"], e["generation"] = prompts[(e["task"], e["id"])], traces[prompts[(e["task"], e["id"])]]
    return ({(e["task"], e["id"]): e for e in examples},
            {"name": adapter.name, "tokens": dict(getattr(adapter, "tokens", {})),
             "has_generations": traces is not None})


def check_task_files(tasks, examples):
    """The task files' bytes now (copied into the private evidence); raises IdentityMismatch when a file changed
    during the run or the results do not follow the task files example by example."""
    task_bytes = {name: read_bytes_again(t.path) for name, t in tasks.items()}
    now = {name: hashlib.sha256(data).hexdigest() for name, data in task_bytes.items()}
    bad = [(name, "task file sha256", t.sha256, now[name]) for name, t in tasks.items() if now[name] != t.sha256]
    expected = [(t.name, ex.id, runner.sha256_text(ex.prompt)) for _, t in sorted(tasks.items()) for ex in t.examples]
    got = [(e["task"], e["id"], e["prompt_sha256"]) for e in examples]
    bad += [(f"{x[0]}/{x[1]}", "task/id/prompt_sha256", x, y) for x, y in zip(expected, got) if x != y]
    if len(expected) != len(got):
        bad.append((None, "n_examples", len(expected), len(got)))
    if bad:
        raise IdentityMismatch("harness evidence does not match the task files it claims", bad)
    return task_bytes


def read_bytes_again(path):
    """A task file's bytes after the run, read as safely as before it (a file swapped for a FIFO must not hang)."""
    try:
        return read_task_bytes(path)
    except TaskFormatError as e:
        raise ResourceError(str(e)) from None
    except OSError as e:
        raise ResourceError(f"{path}: expected the task file read before the run, found "
                            f"{e.strerror or type(e).__name__}") from None


def generations_jsonl(tasks, examples, generations):
    """One line per answered example (timed-out ones have no prediction): task, id and the adapter's trace of the
    generation (chat-rendered prompt, prompt ids, generated ids, finish reason)."""
    prompts = {(t.name, ex.id): ex.prompt for t in tasks.values() for ex in t.examples}
    lines = [{"task": e["task"], "id": e["id"], **generations[prompts[(e["task"], e["id"])]]}
             for e in examples if e["prediction"] is not None]
    return "".join(json.dumps(x, ensure_ascii=False, sort_keys=True) + "\n" for x in lines)


def config_of(ctx, tasks_dir, configured, tasks, settings, chat_template):
    """config.json: what was run."""
    return {"experiment": NAME, "split": ctx.split, "tasks_dir": str(tasks_dir),
            "tasks_source": "harness_tasks_dir" if configured else "shipped fixtures",
            "tasks": {n: {"sha256": t.sha256, "metric": t.metric, "n_in_file": t.n_in_file,
                          "n_scored": len(t.examples), "ids": [ex.id for ex in t.examples]}
                      for n, t in tasks.items()},
            "settings": settings, "config": ctx.config, "model": ctx.inputs.model_identity,
            "prompt_rule": PROMPT_RULE,
            "chat_template_sha256": hashlib.sha256(chat_template.encode("utf-8")).hexdigest()}


SPLIT_NOTES = {"confirm": "the fixture tasks have no held-back part: confirm scores the same examples as dev",
               "all": "the harness tasks have no rows to select: all scores every example of every task, as dev does"}


def summary_of(split, tasks, public_board, shipped):
    return {"experiment": NAME, "split": split, "confirmation_items_scored": False,
            "split_note": SPLIT_NOTES.get(split),
            "n_examples": sum(len(t.examples) for t in tasks.values()), "leaderboard": public_board,
            "tasks_are_shipped_fixtures": shipped}


def run(ctx: Context) -> Result:
    config, split = ctx.config, ctx.split
    tasks_dir, configured, tasks = load_tasks(ctx)
    tasks, limit = limit_tasks(tasks, ctx.options.limit)
    limits = {**DEFAULT_LIMITS, **config["harness_sandbox"]}
    adapter, tokenizer, per_task, examples = generate_and_score(ctx, tasks, limits)
    with ctx.stages.stage("check"):
        task_bytes = check_task_files(tasks, examples)

    settings = {"batch_size": config["harness_batch_size"], "timeout_s": config["harness_timeout_s"],
                "max_new_tokens": config["harness_max_new_tokens"], "sandbox": limits,
                "decoding": "greedy", "chat_template": True, "split": split}
    board = leaderboard.build(adapter.name, tasks, per_task, examples, settings,
                              config["harness_include_per_example"])
    public_board = {k: v for k, v in board.items() if k != "per_example"}
    template = tokenizer.chat_template or ""
    # both leaderboard files are evidence in O: stamped with the evidence format (summary.json keeps the board)
    private = {"leaderboard.json": leaderboard.dumps(stamped(board))}
    if hasattr(adapter, "generations"):
        private["generations.jsonl"] = generations_jsonl(tasks, examples, adapter.generations)
    for name, t in tasks.items():
        private[f"tasks/{t.path.name}"] = task_bytes[name].decode("utf-8")
    shipped = shipped_fixture_claims(tasks)
    references = {(n, ex.id): reference_sha256(ex) for n, t in tasks.items() for ex in t.examples}
    prompt_identity = json.dumps({"chat_template": template, "prompt_rule": PROMPT_RULE}, sort_keys=True)
    config_out, summary = config_of(ctx, tasks_dir, configured, tasks, settings, template), summary_of(
        split, tasks, public_board, shipped)
    line = headline(board, split, shipped)
    if limit is not None:
        config_out["limit"] = summary["limit"] = limit
        line = f"{limit_label(limit, summary['n_examples'])}: {line}"
    return Result(config=config_out,
                  records=[record_of(e, references) for e in examples],
                  summary=summary, headline=line,
                  token_stats=dict(getattr(adapter, "tokens", {})),
                  prompt_template_sha256=hashlib.sha256(prompt_identity.encode("utf-8")).hexdigest(),
                  public={"leaderboard.json": leaderboard.dumps(stamped(public_board))}, private=private)
