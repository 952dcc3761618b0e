"""How run.py shares its work between processes: the run's Plan (experiments/parallel.py), made once from the flags
and the launcher's environment and handed to every experiment as ctx.plan, and what a data-parallel run adds to
run.py's steps -- rank 0 alone checks and writes, a shard writes SHARD.json instead of evidence, a merge checks the
shards against this run, and stages.json / environment.json name every rank.

    plan, shard_docs = plan_for(args, defaults)     # --merge / --shard K/N / torchrun / accelerate launch / one process
    on_rank0(plan, fn, *args)                       # fn on rank 0, its verdict on every rank
    identity = check_merge_identity(plan, args, configs, inputs, env, shard_docs)

Nothing here imports run.py: what it needs of run.py's parsing is passed in (the default arguments, the experiments'
effective configs).
"""
import os
import sys
import time
from pathlib import Path

import registry
from experiments import parallel, shards
from experiments.evidence import peak_rss_bytes
from resources import ResourceError

# where and how a run writes, not what it scores (as_given: the scoring arguments as given, set by run.py)
OWN_ARGS = ("cache", "out", "replace", "verbose", "shard", "merge", "as_given", "join_timeout", "sign")


def scoring_args(args):
    """The arguments that decide what a run scores: part of a shard's identity, and what --merge takes over."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in OWN_ARGS}


def plan_for(args, defaults):
    """(the run's Plan, the checked shards [(directory, SHARD.json)] of a merge or None): replay (--merge: the shards
    are checked, their scoring arguments become this run's), shard (--shard K/N), distributed (torchrun /
    accelerate launch: WORLD_SIZE > 1) or single. `defaults`: run.py's arguments when none is given. Ranks above 0
    print nothing on stdout."""
    if args.merge:
        given = [k for k, v in scoring_args(args).items() if v != defaults[k]]
        if given:
            raise ResourceError(f"--merge takes the scoring arguments from the shards; leave out "
                                f"--{given[0].replace('_', '-')}")
        docs = shards.check_shards([Path(d) for d in args.merge])
        shard_args = docs[0][1]["identity"].get("args")
        if not isinstance(shard_args, dict) or set(shard_args) != set(scoring_args(args)):
            raise ResourceError(f"--merge {docs[0][0]}: its arguments {sorted(shard_args or [])} are not this "
                                f"run.py's {sorted(scoring_args(args))}; merge with the code that wrote the shards")
        for k, v in shard_args.items():
            setattr(args, k, v)
        mixed = shards.mixed_machines(docs)
        if mixed:
            print(f"note: {mixed}; environment.json data_parallel.ranks records each shard's", file=sys.stderr)
        return parallel.Plan(mode="replay", world=docs[0][1]["shard"]["n"], launcher="shards",
                             replay=shards.replay_table(docs),
                             shard_runs=[{"shard": doc["shard"]["k"], **doc["run"]} for _, doc in docs]), docs
    if args.shard:
        if parallel.launcher_from_env():
            raise ResourceError("--shard K/N is for separate processes (e.g. a Slurm array); under torchrun or "
                                "accelerate launch leave it out: the ranks share the work themselves")
        return parallel.Plan(mode="shard", rank=args.shard[0] - 1, world=args.shard[1], launcher="shards"), None
    plan = parallel.init_distributed(args.device, args.join_timeout)
    if plan.rank > 0:
        sys.stdout = open(os.devnull, "w")
    return plan, None


def check_parallel(plan, args, modules):
    """Under data parallelism: every experiment must route its scoring through parallel.shard_map, and --fast is
    refused (fast mode batches on its own terms, which a data-parallel run would split)."""
    if plan.mode == "single":
        return
    how = {"distributed": f"{plan.launcher} with {plan.world} processes", "shard": "--shard",
           "replay": "--merge"}[plan.mode]
    bad = [n for n, m in modules.items() if not getattr(m, "DATA_PARALLEL", False)]
    if bad:
        import importlib

        ok = [e.name for e in registry.EXPERIMENTS
              if getattr(importlib.import_module(e.runner), "DATA_PARALLEL", False)]
        raise ResourceError(f"{how}: experiment(s) {', '.join(bad)} do not run data-parallel; name the ones that do "
                            f"with --experiment ({', '.join(ok)}), and run the others in one process")
    if args.fast:
        raise ResourceError(f"{how}: --fast is refused: a fast-mode score depends on its batch neighbours, which a "
                            "data-parallel run splits; run --fast in one process")


def on_rank0(plan, fn, *fn_args):
    """fn(*fn_args) on rank 0 only (every process outside a distributed run); its ResourceError, or its result, is
    broadcast, so every rank stops with the same line or goes on."""
    result, error = None, None
    if parallel.is_writer(plan):
        try:
            result = fn(*fn_args)
        except ResourceError as e:
            error = str(e)
    error = parallel.broadcast(plan, error)
    if error:
        raise ResourceError(error)
    return result


def shard_identity(plan, args, configs, inputs, env):
    """What every shard of one run shares, and a merge must find again: the scoring arguments, each experiment's
    effective config (`configs`), model and tokenizer hashes, the content hash of each data resource read, code
    hash, library versions, the number of shards."""
    return {"args": args.as_given, "n_shards": plan.world, "configs": configs,
            "model_sha256": inputs.model_identity["model_sha256"],
            "tokenizer_sha256": inputs.model_identity["tokenizer_sha256"],
            "data_content_sha256": {data_id: data.content_sha256 for data_id, data in sorted(inputs.data.items())},
            "code_sha256": env["code_sha256"], "versions": env["versions"]}


def check_merge_identity(plan, args, configs, inputs, env, shard_docs):
    """This run's shard identity (shard and replay modes); a merge refuses shards whose identity is not the one this
    code, config and cache give (one line naming the first difference)."""
    if plan.mode not in ("shard", "replay"):
        return None
    identity = shard_identity(plan, args, configs, inputs, env)
    if shard_docs:
        diff = shards.first_difference(shard_docs[0][1]["identity"], identity)
        if diff:
            raise ResourceError(f"--merge {shard_docs[0][0]}: the shards' identity is not this run's ({diff}); merge "
                                "with the code, config and cache that wrote them")
    return identity


def write_shard_file(plan, out, identity, env):
    shards.write_shard(out, plan.rank + 1, plan.world, identity, plan.recorded,
                       {"run_id": env["run_id"], "environment": env, "experiments": plan.runs})
    print(f"shard {plan.rank + 1}/{plan.world}: {out / shards.NAME} (not evidence: join every shard with "
          f"run.py --merge ... --out O)")


def shard_scored(plan, name, stages, started):
    """A shard's experiment ended after scoring (parallel.ShardScored): its facts are kept for SHARD.json."""
    plan.runs[name] = parallel.rank_facts(plan, name, stages, started)
    counts = {call: len(keys) for call, keys in plan.runs[name]["items_scored"].items()}
    print(f"[{name}] shard {plan.rank + 1}/{plan.world} scored (items per call): {counts}")


def rank_stages(plan, name, stages, started):
    """stages.json "data_parallel" of a distributed run (every rank's own stages, gathered: collective) or of a
    merge (the shards'); None in one process."""
    if plan.mode == "distributed":
        ranks = parallel.all_gather(plan, parallel.rank_facts(plan, name, stages, started))
    elif plan.mode == "replay":
        ranks = [{"shard": r["shard"], "run_id": r["run_id"], **r["experiments"].get(name, {})}
                 for r in plan.shard_runs]
    else:
        return None
    return {**parallel.describe(plan), "ranks": ranks}


def with_rank_environment(plan, env, started):
    """environment.json "data_parallel" (not in one process): the world size, the launcher, and every rank's host,
    pid, wall time and peak RSS (gathered: collective), or every shard's run id, host, CPU and peak RSS."""
    if plan.mode in ("single", "shard"):
        return env
    if plan.mode == "distributed":
        ranks = parallel.all_gather(plan, {"rank": plan.rank, "host": os.uname().nodename, "pid": os.getpid(),
                                           "wall_s": round(time.perf_counter() - started, 4),
                                           "peak_rss_bytes": peak_rss_bytes()})
    else:
        # every shard's machine and code, not only the merging one's: shards may come from other CPUs or commits
        ranks = [{"shard": r["shard"], "run_id": r["run_id"], "host": r["experiments"] and
                  next(iter(r["experiments"].values())).get("host"), "cpu": r["environment"].get("cpu"),
                  "peak_rss_bytes": max((e.get("peak_rss_bytes") or 0 for e in r["experiments"].values()),
                                        default=None), **shards.shard_machine(r["environment"])}
                 for r in plan.shard_runs]
    return {**env, "data_parallel": {**parallel.describe(plan), "ranks": ranks}}
