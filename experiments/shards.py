"""Shard files for schedulers without a shared launcher (Slurm arrays): `run.py --shard K/N` writes one, `run.py
--merge O1 .. ON` reads them all.

O_k/SHARD.json (written atomically, last) holds the shard's number, the full identity of the run it is a part of
(the scoring arguments, each experiment's effective config, model, tokenizer and data hashes, code hash, library
versions, the number of shards), and the raw per-item results of both paths for the shard's items (what
experiments/parallel.shard_map recorded), with the shard's per-experiment stages and environment. It is not
evidence: the logged lm-eval samples in it hold dataset text, like O/private. Do not publish it.

Merge refuses, with one line each (exit 2): a file that is not a shard (size, encoding, JSON, format), shards of
different identities, a shard number given twice or missing, and (at replay, parallel.replayed_parts) an item in
two shards, an item missing, or an item in a shard the rule does not assign it to.
"""
import json
from pathlib import Path

from experiments.evidence import EVIDENCE_FORMAT, FORMAT_KEY, stamped
from resources import ResourceError, atomic_write_text

NAME = "SHARD.json"
FORMAT = "eval-shard/v1"
MAX_BYTES = 2 * 1024 ** 3


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
    k, n = doc["shard"].get("k"), doc["shard"].get("n")
    if not (isinstance(k, int) and isinstance(n, int) and 1 <= k <= n):
        raise ResourceError(f"--merge {path}: shard {k}/{n}, expected K/N with 1 <= K <= N")
    return doc


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
