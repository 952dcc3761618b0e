"""Shard files for schedulers without a shared launcher (Slurm arrays): `run.py --shard K/N` writes one, `run.py
--merge O1 .. ON` reads them all.

O_k/SHARD.json (written atomically, last) holds the shard's number, the full identity of the run it is a part of
(the scoring arguments, each experiment's effective config, model, tokenizer and data hashes, code hash, library
versions, the number of shards), and the raw per-item results of both paths for the shard's items (what
experiments/parallel.shard_map recorded), with the shard's per-experiment stages and environment. It is not
evidence: the logged lm-eval samples in it hold dataset text, like O/private. Do not publish it.

Merge refuses, with one line each (exit 2): a file that is not a shard (size, encoding, JSON, format), a shard
fact out of bounds or of the wrong type (the shard count above MAX_SHARDS, a shard count the identity does not
repeat, a shard that scored no experiment, a rank number that is not the shard's, a negative or non-finite wall time
or peak RSS, items_scored that are not the items the shard holds, a field no shard writes: each named by the file
and the field), shards of different identities, a shard number given twice or missing, and (at replay,
parallel.replayed_parts) an item in two shards, an item missing, or an item in a shard the rule does not assign it
to. The run facts a merge copies into stages.json and environment.json are the ones checked here, so a forged
shard cannot carry numbers of another shape into evidence.
"""
import json
import math
import re
from pathlib import Path

from experiments.evidence import EVIDENCE_FORMAT, FORMAT_KEY, KERNEL_ENV, kernel_summary, stamped
from resources import ResourceError, atomic_write_text

NAME = "SHARD.json"
FORMAT = "eval-shard/v1"
MAX_BYTES = 2 * 1024 ** 3
MAX_SHARDS = 1024           # a Slurm array of more is not what this merge is for; a forged 10**9 is refused at once
MAX_RSS_BYTES = 1 << 50     # 1 PiB: any larger peak RSS is not a measurement
MAX_WALL_S = 1e7            # 115 days
MAX_TEXT = 512              # a host or CPU name
RANK_FACTS = {"rank", "stages", "wall_s", "peak_rss_bytes", "items_scored", "host", "pid"}   # parallel.rank_facts
STAGE_FACTS = {"name", "wall_s", "peak_rss_bytes_at_end"}                                   # evidence.Stages


def write_shard(out, k, n, identity, results, run):
    """O/SHARD.json: shard k of n (1-based), its identity, its recorded results and its run facts."""
    doc = stamped({"format": FORMAT, "shard": {"k": k, "n": n}, "identity": identity, "results": results, "run": run})
    atomic_write_text(Path(out) / NAME, json.dumps(doc, sort_keys=True, ensure_ascii=False))


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"non-finite number {name}")


def read_shard(directory):
    """The parsed SHARD.json of a shard directory; ResourceError (one line) for anything that is not one."""
    path = Path(directory) / NAME
    if not path.is_file():
        raise ResourceError(f"--merge {directory}: no {NAME} (expected the --out of a finished run.py --shard K/N)")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ResourceError(f"--merge {path}: {size} bytes, expected at most {MAX_BYTES}")
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ResourceError(f"--merge {path}: not a shard file ({str(e)[:120]})")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ResourceError(f"--merge {path}: format {found!r}, expected {FORMAT!r}")
    found = doc.get(FORMAT_KEY)
    if type(found) is not int or found != EVIDENCE_FORMAT:      # a shard replays into evidence of this format only
        what = f"{FORMAT_KEY} {json.dumps(found)[:40]}" if FORMAT_KEY in doc else f"no {FORMAT_KEY}"
        raise ResourceError(f"--merge {path}: {what}; this run.py merges evidence format {EVIDENCE_FORMAT} only (a "
                            "shard written by another version of run.py: re-run the shards with this one)")
    for key in ("shard", "identity", "results", "run"):
        if not isinstance(doc.get(key), dict):
            raise ResourceError(f"--merge {path}: field {key!r} missing or not an object")
    problem = shard_number_problem(doc) or run_facts_problem(doc)
    if problem:
        field, found, expected = problem
        raise ResourceError(f"--merge {path}: field {field}: found {found}, expected {expected}")
    return doc


class Bad(Exception):
    """One shard fact out of bounds: (field, what was found, what was expected)."""


def shown(value):
    """A found value for a one-line message: its JSON, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value):
    return type(value) is int          # bool is an int subclass: a forged true is not a shard number


def need(ok, field, value, expected):
    if not ok:
        raise Bad(field, shown(value), expected)


def shard_number_problem(doc):
    """(field, found, expected) for a shard number out of bounds, else None: 1 <= k <= n <= MAX_SHARDS, integers,
    and the identity's n_shards equal to n (a merge builds a list of n shard numbers)."""
    try:
        shard = doc["shard"]
        need(set(shard) == {"k", "n"}, "shard", sorted(shard), "exactly the keys k and n")
        n, k = shard["n"], shard["k"]
        need(is_int(n) and 1 <= n <= MAX_SHARDS, "shard.n", n, f"an integer from 1 to {MAX_SHARDS}")
        need(is_int(k) and 1 <= k <= n, "shard.k", k, f"an integer from 1 to shard.n ({n})")
        found = doc["identity"].get("n_shards")
        need(is_int(found) and found == n, "identity.n_shards", found, f"the shard count shard.n ({n})")
    except Bad as e:
        return e.args
    return None


def run_facts_problem(doc):
    """(field, found, expected) for the first run fact a merge would copy into evidence that is not as
    run.py --shard writes it, else None (checked: run.run_id, run.environment.cpu, every experiment's rank facts)."""
    run, results = doc["run"], doc["results"]
    try:
        need(isinstance(run.get("run_id"), str) and re.fullmatch(r"[0-9a-f]{32}", run["run_id"]) is not None,
             "run.run_id", run.get("run_id"), "a run id of 32 lowercase hex digits")
        env = run.get("environment")
        need(isinstance(env, dict), "run.environment", env, "an object")
        need(isinstance(env.get("cpu"), str) and len(env["cpu"]) <= MAX_TEXT, "run.environment.cpu", env.get("cpu"),
             f"a string of at most {MAX_TEXT} characters")
        commit = env.get("git_commit")
        need(commit is None or (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,64}", commit) is not None),
             "run.environment.git_commit", commit, "a git commit (hex) or null")
        need(env.get("git_dirty") in (True, False, None), "run.environment.git_dirty", env.get("git_dirty"),
             "true, false or null")
        kernels_problem(env.get("kernels"))
        runs = run.get("experiments")
        need(isinstance(runs, dict) and runs and set(runs) == set(results), "run.experiments",
             sorted(runs) if isinstance(runs, dict) else runs,
             f"the facts of every experiment the shard holds results of ({', '.join(sorted(results)) or 'none'})")
        for name, facts in runs.items():
            check_rank_facts(f"run.experiments.{name}", facts, doc["shard"]["k"] - 1, results[name])
    except Bad as e:
        return e.args
    return None


def kernels_problem(kernels):
    """Bad for a shard's environment.kernels that is not as evidence.kernel_identity writes the parts a merge
    copies (the capability torch chose, its thread count, the kernel variables set)."""
    need(isinstance(kernels, dict), "run.environment.kernels", kernels, "an object")
    cap, threads, env = kernels.get("torch_cpu_capability"), kernels.get("torch_threads"), kernels.get("env")
    need(isinstance(cap, str) and len(cap) <= MAX_TEXT, "run.environment.kernels.torch_cpu_capability", cap,
         f"a string of at most {MAX_TEXT} characters")
    need(is_int(threads) and 0 < threads <= 1 << 16, "run.environment.kernels.torch_threads", threads,
         "a positive thread count")
    need(isinstance(env, dict) and set(env) <= set(KERNEL_ENV)
         and all(v is None or (isinstance(v, str) and len(v) <= MAX_TEXT) for v in env.values()),
         "run.environment.kernels.env", env, "the kernel variables evidence.KERNEL_ENV names, each a short string or null")


def shard_machine(env):
    """What a merged environment.json records of one shard's machine and code: the commit, whether it was dirty, and
    the kernels its scores came from (one line: evidence.kernel_summary)."""
    return {"git_commit": env.get("git_commit"), "git_dirty": env.get("git_dirty"),
            "kernels": kernel_summary(env["kernels"])}


def mixed_machines(docs):
    """A sentence when the shards' scores came from different commits or kernels (allowed: the identity holds the
    code hash; said, and recorded per shard), else None."""
    said = []
    for what, key in (("commits", "git_commit"), ("kernels", "kernels")):
        seen = {}
        for d, doc in docs:
            env = doc["run"]["environment"]
            value = kernel_summary(env["kernels"]) if key == "kernels" else env.get(key)
            seen.setdefault(value, d)
        if len(seen) > 1:
            said.append(f"the shards were made at {len(seen)} different {what} "
                        f"({'; '.join(f'{v} ({d})' for v, d in list(seen.items())[:3])})")
    return "; ".join(said) or None


def check_rank_facts(field, facts, rank, calls):
    """One experiment's facts of this shard (parallel.rank_facts): exactly its keys, the shard's own rank,
    non-negative finite wall times and peak RSS, and items_scored naming the very items the results hold."""
    need(isinstance(facts, dict) and set(facts) == RANK_FACTS, field,
         sorted(facts) if isinstance(facts, dict) else facts,
         f"an object with the keys {', '.join(sorted(RANK_FACTS))}")
    need(is_int(facts["rank"]) and facts["rank"] == rank, f"{field}.rank", facts["rank"], f"this shard's rank {rank}")
    check_seconds(f"{field}.wall_s", facts["wall_s"])
    check_bytes(f"{field}.peak_rss_bytes", facts["peak_rss_bytes"])
    need(is_int(facts["pid"]) and 1 <= facts["pid"] < 1 << 32, f"{field}.pid", facts["pid"], "a process id")
    need(isinstance(facts["host"], str) and len(facts["host"]) <= MAX_TEXT, f"{field}.host", facts["host"],
         f"a string of at most {MAX_TEXT} characters")
    stages = facts["stages"]
    need(isinstance(stages, list), f"{field}.stages", stages, "a list of stages")
    for n, stage in enumerate(stages):
        where = f"{field}.stages[{n}]"
        need(isinstance(stage, dict) and set(stage) == STAGE_FACTS, where, stage,
             f"an object with the keys {', '.join(sorted(STAGE_FACTS))}")
        need(isinstance(stage["name"], str) and len(stage["name"]) <= MAX_TEXT, f"{where}.name", stage["name"],
             "a stage name")
        check_seconds(f"{where}.wall_s", stage["wall_s"])
        if stage["peak_rss_bytes_at_end"] is not None:
            check_bytes(f"{where}.peak_rss_bytes_at_end", stage["peak_rss_bytes_at_end"])
    scored = facts["items_scored"]
    need(isinstance(scored, dict), f"{field}.items_scored", scored, "an object of item lists per call")
    for call, keys in scored.items():
        part = calls.get(call) if isinstance(calls, dict) else None
        held = [p[0] for p in part["items"] if isinstance(p, list) and p] \
            if isinstance(part, dict) and isinstance(part.get("items"), list) else None
        need(isinstance(keys, list) and held is not None and as_set(keys) == as_set(held),
             f"{field}.items_scored.{call}", keys,
             f"the keys of the items the shard's results hold for {call} ({shown(held)})")


def as_set(keys):
    """Item keys (JSON values) as a sorted list of their JSON texts: the order a part's results come in is free."""
    return sorted(json.dumps(k, sort_keys=True) for k in keys)


def check_seconds(field, value):
    need(type(value) in (int, float) and math.isfinite(value) and 0 <= value <= MAX_WALL_S, field, value,
         f"a finite number of seconds from 0 to {MAX_WALL_S:g}")


def check_bytes(field, value):
    need(is_int(value) and 0 <= value <= MAX_RSS_BYTES, field, value, "an integer number of bytes from 0 to 2**50")


def first_difference(a, b, where=""):
    """The first path at which two JSON values differ, e.g. 'configs.protocol.seed: 1 vs 2'."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{where}{key}: present in only one"
            d = first_difference(a[key], b[key], f"{where}{key}.")
            if d:
                return d
        return None
    return None if a == b else f"{where.rstrip('.')}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"


def check_shards(directories):
    """[(directory, doc)] in shard order; refuses mixed identities, a shard number twice, a missing shard."""
    docs = [(d, read_shard(d)) for d in directories]
    first_dir, first = docs[0]
    n = first["shard"]["n"]
    seen = {}
    for d, doc in docs:
        if doc["shard"]["n"] != n:
            raise ResourceError(f"--merge {d}: shard of {doc['shard']['n']}, but {first_dir} is a shard of {n}")
        diff = first_difference(first["identity"], doc["identity"])
        if diff:
            raise ResourceError(f"--merge {d}: a different run identity than {first_dir} ({diff}); shards of one "
                                "run only")
        k = doc["shard"]["k"]
        if k in seen:
            raise ResourceError(f"--merge {d}: shard {k}/{n} given twice (also {seen[k]}); shards must not overlap")
        seen[k] = d
    missing = [k for k in range(1, n + 1) if k not in seen]
    if missing:
        raise ResourceError(f"--merge: shard {missing[0]}/{n} missing ({len(missing)} of {n} missing); name every "
                            "shard's --out")
    return sorted(docs, key=lambda x: x[1]["shard"]["k"])


def replay_table(docs):
    """A merge's Plan.replay: {experiment: {call: [(label, k - 1, part), ...]}} from the checked shards. An item in
    two shards is refused here, before anything runs (missing and foreign items need the selection: at replay)."""
    table, seen = {}, {}
    for d, doc in docs:
        k = doc["shard"]["k"]
        for name, calls in doc["results"].items():
            for call, part in calls.items():
                if not (isinstance(part, dict) and isinstance(part.get("items"), list)
                        and all(isinstance(p, list) and len(p) == 2 for p in part["items"])):
                    raise ResourceError(f"--merge {d}: results of {name} {call} malformed (expected items as "
                                        "[key, value] pairs)")
                label = f"{d} (shard {k})"
                for key, _ in part["items"]:
                    where = seen.setdefault((name, call, json.dumps(key)), label)
                    if where != label:
                        raise ResourceError(f"--merge: {name} {call} item {key} is in both {where} and {label}; "
                                            "shards must not overlap")
                table.setdefault(name, {}).setdefault(call, []).append((label, k - 1, part))
    return table
