"""Data parallelism at the scoring level: one primitive, shard_map, that the experiments' scoring call sites use.

    per_item, meta = parallel.shard_map(ctx, "official", items, fn, group=..., combine=...)

`fn(part)` scores a list of items and returns ({key: value} for exactly those items, meta). What shard_map does
with it depends on how the process was started: the run's Plan, which run.py makes (experiments/launch.py) and
hands to every experiment as ctx.plan:

    single       fn(items): nothing changes (a plain `python run.py`, or a world of 1).
    distributed  torchrun / accelerate launch (WORLD_SIZE > 1 in the environment): every rank runs fn on its own
                 part, the parts are gathered to every rank with torch.distributed (all_gather_object; gloo on CPU,
                 nccl on GPU) and reassembled in the original item order; the experiment code then continues
                 unchanged on every rank, so its evidence is the single-process evidence by construction. Only
                 rank 0 writes (run.py).
    shard        run.py --shard K/N: fn on shard K's part only; the raw per-item results and meta are recorded (run.py
                 writes them into the shard's own directory) and scoring_done() ends the experiment there.
    replay       run.py --merge O1 .. ON: fn is never called (no model is loaded); the parts come from the shard
                 files, checked for missing, overlapping and foreign items, and the experiment continues as above.

The assignment is a fixed rule on the selected items, never on timing: the distinct group keys of the items
(`group(item)`: by default the idx; for the loglikelihood experiments whole batches of the one-process plan,
two_paths.by_whole_batches, so that every rank's lm-eval call forms exactly the batches one process forms) in
ascending order, the k-th to rank k mod N. `combine(metas, per_item)` builds the one meta a single process would have returned
from the parts' metas (e.g. lm-eval's aggregate metrics over the gathered samples); by default the first part's.

A part that raises stops every rank at the same gather: the exception is gathered too and each rank raises it
again, naming the rank, its items and the original message; ResourceError, ScoringError and IdentityMismatch keep
their class (so run.py's exit codes stay: bad input 2, a scoring error or a mismatch 1), anything else becomes a
RankFailure (exit 1). A rank that dies outright (killed, out of memory) is noticed by the launcher, which stops the
others; a rank that stops answering fails the collectives after EVAL_DIST_TIMEOUT_S (default 1800 s: a rank may
wait that long at a gather for a rank with more work).

Joining is timed apart from that: each rank first says which rank it waits for, at which address and port, and for
how long (run.py --join-timeout, default JOIN_TIMEOUT_S), and a rank that is not joined in time (a WORLD_SIZE=2 with
one process started, a wrong MASTER_ADDR) stops with one line (exit 2).
"""
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from resources import ResourceError

RULE = ("the distinct group keys of the selected items in ascending order, the k-th to rank k mod N; never by "
        "timing. A loglikelihood call's group is whole batches of its one-process plan, named by the first (so each "
        "rank's lm-eval call forms the batches one process forms); other calls group by item (idx, or task and id)")
TIMEOUT_ENV = "EVAL_DIST_TIMEOUT_S"
JOIN_TIMEOUT_S = 120.0      # every rank of a launch starts within seconds; a missing one is said within two minutes
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankFailure(Exception):
    """A part failed on some rank (raised on every rank); `kind` is the original exception's class name."""

    def __init__(self, message, kind="", rows=None):
        super().__init__(message)
        self.kind, self.rows = kind, rows or []


class ShardScored(Exception):
    """Shard mode: this experiment's shard is scored and recorded; nothing more is computed."""


@dataclass
class Plan:
    mode: str = "single"         # single | distributed | shard | replay
    rank: int = 0                # the rank, or the shard K-1
    world: int = 1               # the world size, or the number of shards N
    launcher: str = ""           # torchrun | accelerate | slurm-shards | ""
    backend: str = ""
    recorded: dict = field(default_factory=dict)   # shard: {experiment: {call: {"items": [[key, value]], "meta"}}}
    replay: dict = field(default_factory=dict)     # replay: {experiment: {call: [(shard label, part), ...]}}
    scored: dict = field(default_factory=dict)     # {experiment: {call: [keys of the items this rank scored]}}
    runs: dict = field(default_factory=dict)       # shard: {experiment: rank_facts}
    shard_runs: list = field(default_factory=list)  # replay: the shards' SHARD.json "run" (+ "shard": k)
    pending: list = field(default_factory=list)     # replay: evidence installed once every experiment replayed


def plan_of(ctx):
    """The run's plan (one process when the context carries none)."""
    return ctx.plan if ctx.plan is not None else Plan()


def launcher_from_env(environ=None):
    """'accelerate', 'torchrun' or '' from the variables the launchers set (both set RANK, WORLD_SIZE, ...)."""
    env = os.environ if environ is None else environ
    if int(env.get("WORLD_SIZE", "1") or 1) <= 1:
        return ""
    if any(k.startswith("ACCELERATE_") for k in env):
        return "accelerate"
    return "torchrun" if all(k in env for k in LAUNCH_ENV) else "unknown"


def init_distributed(device="cpu", join_timeout_s=JOIN_TIMEOUT_S):
    """Join the process group the launcher described (gloo on CPU, nccl on GPU): the distributed Plan, or a
    single one for a world of one. A launch without the variables torch.distributed needs is refused with one line;
    so is a rank whose peers do not join within join_timeout_s (said before it waits)."""
    launcher = launcher_from_env()
    if not launcher:
        return Plan()
    if launcher == "unknown":
        raise ResourceError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but not all of {', '.join(LAUNCH_ENV)} are set: "
                            "start data-parallel runs with torchrun or accelerate launch")
    import torch

    backend = "nccl" if str(device).startswith("cuda") and torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    rank, world = join(backend, join_timeout_s)
    return Plan(mode="distributed", rank=rank, world=world, launcher=launcher, backend=backend)


def join(backend, join_timeout_s):
    """(rank, world size) once every rank met at MASTER_ADDR:MASTER_PORT: the rendezvous is timed by
    join_timeout_s, the collectives after it by EVAL_DIST_TIMEOUT_S."""
    import importlib

    import torch.distributed as dist

    rendezvous = importlib.import_module("torch.distributed.rendezvous").rendezvous  # the module, not its function
    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    others = ", ".join(str(r) for r in range(1, int(world))) if rank == "0" else "0"
    whom = f"rank{'s' if others.count(',') else ''} {others}"
    # one write: the ranks share the console, and print() writes a line and its newline apart
    sys.stdout.write(f"rank {rank} of {world}: waiting up to {join_timeout_s:g} s for {whom} to join at {where} "
                     "(run.py --join-timeout)\n")
    sys.stdout.flush()
    collective = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, 1800)))
    try:
        with c10d_messages_held():
            store, rank_n, world_n = next(rendezvous("env://", timeout=timedelta(seconds=join_timeout_s)))
            store.set_timeout(collective)
            dist.init_process_group(backend=backend, store=store, rank=rank_n, world_size=world_n,
                                    timeout=collective)
    except (RuntimeError, ValueError, OSError) as e:    # torch's DistStoreError / DistNetworkError are RuntimeErrors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ResourceError(f"rank {rank} of {world}: {whom} did not join at {where} within {join_timeout_s:g} s "
                            f"({type(e).__name__}: {first}); start every rank (torchrun --nproc_per_node {world} "
                            "run.py ...), check MASTER_ADDR/MASTER_PORT, or give more time with --join-timeout SECONDS")
    return dist.get_rank(), dist.get_world_size()


@contextmanager
def c10d_messages_held():
    """File descriptor 2 sent to a temporary file while a rank joins: c10d writes its connection retries there from
    C++ (Python's sys.stderr cannot catch them), a stack per failed try. A join that fails then ends in run.py's one
    line; one that succeeds passes what was held on to stderr, so nothing is lost."""
    import tempfile

    sys.stderr.flush()
    saved, joined = os.dup(2), False
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
            joined = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if joined:
                f.seek(0)
                sys.stderr.write(f.read(1 << 20).decode("utf-8", "replace"))
                sys.stderr.flush()


HIDDEN_FROM_LM_EVAL = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
                      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE")


@contextmanager
def one_process_lm_eval():
    """While lm-eval's HFLM is built: the launcher's variables hidden, so that accelerate (which HFLM asks) sees one
    process and lm-eval does not start data parallelism of its own (lm_eval/models/huggingface.py:129-132, 303-325:
    with several GPUs and several processes it would split and gather the requests itself). Each rank then drives
    its own single-process HFLM on its own part; the caller checks lm.world_size == 1."""
    saved = {k: os.environ.pop(k) for k in HIDDEN_FROM_LM_EVAL if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def shutdown(plan, clean=True):
    """Leave the process group. After a clean run every rank first meets the others at a barrier: rank 0 still
    writes the evidence after the last collective, and a rank that tore its group down and exited meanwhile
    aborted at exit (SIGABRT, "terminate called without an active exception") in some of the test suite's torchrun
    launches. After an error no barrier (the peers may be gone), and a peer that left during the barrier (rank 0
    failed writing) does not turn this rank's finished run into a traceback: the group is torn down either way."""
    if plan is not None and plan.mode == "distributed":
        import torch.distributed as dist

        if dist.is_initialized():
            if clean:
                try:
                    dist.barrier()
                except RuntimeError:    # gloo: the peer closed its connection; its own exit code says why
                    pass
            dist.destroy_process_group()


def is_writer(plan):
    """Only rank 0 of a distributed run writes evidence (and every single, shard or replay process)."""
    return plan.rank == 0 or plan.mode != "distributed"


def all_gather(plan, obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank ([obj] outside a distributed run)."""
    if plan.mode != "distributed":
        return [obj]
    import torch.distributed as dist

    out = [None] * plan.world
    dist.all_gather_object(out, obj)
    return out


def broadcast(plan, obj):
    """Rank 0's obj on every rank."""
    return all_gather(plan, obj)[0]


# ---- the assignment rule ------------------------------------------------------------------------------------------

def owners(items, group, world):
    """[the rank of each item]: the k-th distinct group key in ascending order goes to rank k mod world."""
    keys = sorted({group(it) for it in items})
    rank_of = {k: n % world for n, k in enumerate(keys)}
    return [rank_of[group(it)] for it in items]


def part_of(items, group, rank, world):
    return [it for it, r in zip(items, owners(items, group, world)) if r == rank]


def default_key(item):
    return item["idx"]


# ---- the primitive ------------------------------------------------------------------------------------------------

def shard_map(ctx, call, items, fn, group=default_key, key=default_key, combine=None, may_be_empty=False):
    """({key: value} for every item, meta) as fn(items) would return in one process; see the module docstring.

    A rank or shard whose part is empty does not call fn (its meta is None and left out of combine); a shard
    without items of a call that needs them (may_be_empty False) is refused: its checks would have nothing to see."""
    plan = plan_of(ctx)
    if plan.mode == "single":
        return fn(items)
    if plan.mode == "replay":
        parts = replayed_parts(plan, ctx.name, call, items, group, key)
    else:
        part = part_of(items, group, plan.rank, plan.world)
        plan.scored.setdefault(ctx.name, {})[call] = [key(it) for it in part]
        if plan.mode == "shard":
            if not part and not may_be_empty:
                raise ResourceError(f"--shard {plan.rank + 1}/{plan.world}: this shard gets no item of {ctx.name} "
                                    f"{call} ({len({group(it) for it in items})} groups for {plan.world} shards); "
                                    "use fewer shards")
            per_item, meta = fn(part) if part else ({}, None)
            record(plan, ctx.name, call, per_item, meta)
            return per_item, meta
        parts = all_gather(plan, run_part(fn, part, key))
        failed = [(r, p) for r, p in enumerate(parts) if "error" in p]
        if failed:
            raise_failure(plan, ctx.name, call, failed)
        parts = [(f"rank {r}", p["per_item"], p["meta"]) for r, p in enumerate(parts)]
    return reassemble(items, key, parts, combine)


def run_part(fn, part, key):
    """fn on this rank's part, or the exception it raised as plain data (it is gathered, never lost)."""
    try:
        per_item, meta = fn(part) if part else ({}, None)
        return {"per_item": per_item, "meta": meta}
    except Exception as e:  # noqa: BLE001 -- re-raised on every rank by raise_failure
        return {"error": str(e), "kind": type(e).__name__, "rows": [list(r) for r in getattr(e, "rows", [])][:200],
                "items": [key(it) for it in part]}


def raise_failure(plan, name, call, failed):
    rank, p = failed[0]
    items = p["items"]
    shown = ", ".join(map(str, items[:8])) + (f", ... ({len(items)} items)" if len(items) > 8 else "")
    message = (f"[{name}] rank {rank} of {plan.world} failed in {call} (its items: {shown}): {p['kind']}: "
               f"{p['error']}" + (f"; {len(failed) - 1} other rank(s) failed too" if len(failed) > 1 else ""))
    if p["kind"] == "ResourceError":
        raise ResourceError(message)
    if p["kind"] == "ScoringError":
        from experiments.evidence import ScoringError

        raise ScoringError(message)
    if p["kind"] == "IdentityMismatch":
        from experiments.evidence import IdentityMismatch

        raise IdentityMismatch(message, [tuple(r) for r in p["rows"]])
    raise RankFailure(message, p["kind"], p["rows"])


def reassemble(items, key, parts, combine):
    """One {key: value} in the original item order from the parts, and the combined meta."""
    merged = {}
    for _, per_item, _ in parts:
        merged.update(per_item)
    ordered = {key(it): merged[key(it)] for it in items}
    metas = [meta for _, _, meta in parts if meta is not None]
    return ordered, (combine(metas, ordered) if combine else metas[0])


def agreed(ctx, call, value, pick):
    """A value every rank must share, fixed from the selection alone before any scoring (extraction's pre-registered
    audit sample). single: value; distributed: rank 0's, broadcast (a collective: no rank scores before rank 0 has
    made it); shard: value, recorded in the shard file; replay: pick([(shard label, the shard's value)], value),
    which checks the shards' values against this run's and returns the one to keep (never recomputed after the
    scoring it preceded)."""
    plan = plan_of(ctx)
    if plan.mode == "distributed":
        return broadcast(plan, value)
    if plan.mode == "shard":
        record(plan, ctx.name, call, {}, value)
        return plan.recorded[ctx.name][call]["meta"]
    if plan.mode == "replay":
        shards = plan.replay.get(ctx.name, {}).get(call) or []
        if len(shards) != plan.world:
            raise ResourceError(f"--merge: {len(shards)} of {plan.world} shards hold the {ctx.name} {call}; "
                                "expected every shard's, written by run.py --shard")
        return pick([(label, part["meta"]) for label, _, part in shards], value)
    return value


def scoring_done(ctx):
    """Called by an experiment after its last shard_map: in shard mode the experiment ends here."""
    if plan_of(ctx).mode == "shard":
        raise ShardScored(ctx.name)


# ---- shard files ---------------------------------------------------------------------------------------------------

def plain(obj):
    """JSON for numpy scalars and tuples (lm-eval's logged samples hold both)."""
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def record(plan, name, call, per_item, meta):
    text = json.dumps({"items": [[k, v] for k, v in per_item.items()], "meta": meta}, default=plain,
                      sort_keys=True, ensure_ascii=False)
    plan.recorded.setdefault(name, {})[call] = json.loads(text)


def as_key(k):
    return tuple(as_key(x) for x in k) if isinstance(k, list) else k


def replayed_parts(plan, name, call, items, group, key):
    """The shards' parts of one call: every selected item exactly once, from the shard the rule assigns it to."""
    shards = plan.replay.get(name, {}).get(call)
    if shards is None:
        raise ResourceError(f"--merge: the shards hold no results of {name} {call}; were they written by this "
                            "code? (expected a shard written by run.py --shard)")
    expected = dict(zip((key(it) for it in items), owners(items, group, plan.world)))
    seen, parts = {}, []
    for label, k, part in shards:
        per_item = {}
        for pair in part["items"]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ResourceError(f"--merge: {label}: {name} {call}: an item entry is not a [key, value] pair")
            item_key = as_key(pair[0])
            if item_key in seen:
                raise ResourceError(f"--merge: {name} {call} item {item_key} is in both {seen[item_key]} and "
                                    f"{label}; shards must not overlap")
            if item_key not in expected or expected[item_key] != k:
                raise ResourceError(f"--merge: {label}: {name} {call} item {item_key} does not belong to shard "
                                    f"{k + 1}/{plan.world} of this selection")
            seen[item_key] = label
            per_item[item_key] = pair[1]
        parts.append((label, per_item, part["meta"]))
    missing = [k for k in expected if k not in seen]
    if missing:
        owner = expected[missing[0]] + 1
        raise ResourceError(f"--merge: {name} {call} item {missing[0]} is missing (expected in shard "
                            f"{owner}/{plan.world}; {len(missing)} item(s) missing in all)")
    return parts


# ---- per-rank facts for stages.json and environment.json -------------------------------------------------------

def rank_facts(plan, name, stages, started):
    """This rank's stages of experiment `name`, its wall time, peak RSS and the items it scored per call (gathered
    to rank 0 after each experiment, for stages.json)."""
    from experiments.evidence import peak_rss_bytes

    return {"rank": plan.rank, "stages": list(stages), "wall_s": round(time.perf_counter() - started, 4),
            "peak_rss_bytes": peak_rss_bytes(), "items_scored": dict(plan.scored.get(name, {})),
            "host": os.uname().nodename, "pid": os.getpid()}


def describe(plan):
    """environment.json "data_parallel": how this run was distributed."""
    return {"mode": plan.mode, "world_size": plan.world, "launcher": plan.launcher or None,
            "backend": plan.backend or None, "rule": RULE}
