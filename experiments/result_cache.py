"""An identity-keyed result cache: SQLite in the cache directory (`<cache>/results.sqlite`, WAL mode).

A stored result (a per-candidate score, later a generation) answers only a request whose FULL identity is the
same (the identity contract in ARCHITECTURE.md):

    run part   model sha256, tokenizer sha256, data content sha256, prompt/template sha256, the scoring config
               (as run.py's identity.json scoring_config: the experiment's effective config, i.e. the config.py
               sections in its CONFIG_SECTIONS merged flat; + the scorer name), code sha256
               (evidence.code_sha256(): the files of evidence.CODE_FILES, the code that can change a score, so a
               change there misses; config.py's values enter through the scoring config, section by section),
               library versions, and the platform: the CPU model and what chooses its kernels
               (evidence.kernel_identity: MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY, the thread settings and the
               other variables in evidence.KERNEL_ENV, torch's parallel info, the MKL and oneDNN builds): the same
               code rounds differently under other kernels.
    item part  whatever identifies the request within the run; for the scores of one forward batch
               (batch_item): every row's input ids in batch order, and each candidate's row and token ids. A score
               depends on its batch neighbours, so the batch, not the candidate, is the unit that is stored.

The key is sha256 over the canonical JSON of both parts; change any one field and it misses. Each row also keeps
the item part as JSON and a checksum sha256(key, item, value): a row whose checksum does not match, whose item
part is not the requested one, or whose value does not parse is counted as corrupted, deleted and recomputed.
Values are stored as JSON text; Python writes a float as its shortest round-trip repr, so the value read back
is exactly the float that was computed (bit for bit; the bit-exact claim of the protocol survives the cache).

A damaged file (not SQLite, truncated, a malformed page, tables of another shape) is found by run.py before any
scoring (damage(): SQLite's integrity_check and the table shapes) and set aside as results.sqlite.corrupt-<time>
with one warning (set_aside_if_corrupt); the run then builds a new cache and recomputes every score.

Writes are committed per forward batch (put_batch), so a killed run keeps every batch it finished, and a rerun
resumes where it stopped. `run.py --no-cache` bypasses the cache entirely (no reads, no writes).

What is cached, and what never is:
- The independent path's parity-mode scores (lm-eval's batches, scoring.score_batches): a pure function of the
  identity and the batch.
- Never the official path: the point of the protocol is that lm-eval recomputes every score in every run.
- Never fast-mode scores (experiments/fast_scoring.py): its own batching is not keyed here.

API (the protocol and MC-TACO experiments use it; another experiment can adopt it the same way):

    ident = run_identity(model_sha256=..., tokenizer_sha256=..., data_content_sha256=...,
                         prompt_template_sha256=..., config=ctx.config, scorer="independent-parity")
    cache = ResultCache(path, ident)                 # or open_for(ctx, ...) / None with --no-cache
    value = cache.get(item)                          # None on a miss (also for a corrupted row)
    with cache.batch():                              # one transaction
        cache.put(item, value)
    cache.get_batch(rows, picks) / cache.put_batch(rows, picks, scores)
                                                     # the hook scoring.score_batches calls, one commit per batch
    cache.stats()                                    # {"hits", "misses", "corrupted", "written", ...}
"""
import hashlib
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path


def scoring_config(config):
    """The scoring config of the identity: as run.py's identity.json scoring_config, the experiment's effective
    config (its CONFIG_SECTIONS merged flat). tests/test_result_cache.py checks the two stay the same."""
    return dict(config)


DEFAULT_FILE = "results.sqlite"


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def platform_identity():
    import platform

    import torch

    from experiments.evidence import cpu_model, kernel_identity

    return {"cpu": cpu_model(), "machine": platform.machine(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "kernels": kernel_identity()}


def run_identity(*, model_sha256, tokenizer_sha256, data_content_sha256, prompt_template_sha256, config, scorer,
                 code_sha256=None, versions=None, platform=None, extra=None):
    """The run part of a key. code_sha256, versions and platform default to this process's own."""
    if code_sha256 is None or versions is None:
        from experiments.evidence import code_sha256 as code_hash, environment

        code_sha256 = code_sha256 if code_sha256 is not None else code_hash()
        versions = versions if versions is not None else environment(config["threads"])["versions"]
    return {
        "model_sha256": model_sha256, "tokenizer_sha256": tokenizer_sha256,
        "data_content_sha256": data_content_sha256, "prompt_template_sha256": prompt_template_sha256,
        "scoring_config": scoring_config(config), "scorer": scorer,
        "code_sha256": code_sha256, "versions": versions,
        "platform": platform if platform is not None else platform_identity(),
        "extra": extra,
    }


def cache_key(run, item):
    """sha256 over the canonical JSON of the run part and the item part."""
    return sha256_text(canonical({"run": run, "item": item}))


def checksum(key, item_json, value_json):
    return sha256_text(f"{key}\0{item_json}\0{value_json}")


TABLES = {"results": ["key", "run_sha", "item", "value", "checksum", "created"], "runs": ["run_sha", "identity"]}


def damage(path):
    """None if `path` is absent or a result cache SQLite can read whole, with the tables this module writes (or
    none yet); else one line saying what is wrong. Run at the start of run.py, before any scoring."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60.0)
        try:
            check = db.execute("PRAGMA integrity_check").fetchall()
            if check != [("ok",)]:
                return f"integrity check failed ({str(check[0][0])[:100]})"
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table in sorted(tables | set(TABLES)):
                columns = [row[1] for row in db.execute(f"PRAGMA table_info('{table}')")]
                if table not in TABLES or (columns and columns != TABLES[table]):
                    return f"table {table!r} has columns {columns}, expected tables {TABLES}"
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        return f"not a readable SQLite database ({e})"
    return None


def set_aside_if_corrupt(path):
    """A damaged result cache is renamed <file>.corrupt-<UTC time> (with its -wal/-shm files) so that the next open
    starts a new one; returns the one-line warning, or None when the file is fine (or absent)."""
    path = Path(path)
    problem = damage(path)
    if problem is None:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if part.exists():
            os.replace(part, aside.with_name(aside.name + suffix))
    return (f"{path}: {problem}; set aside as {aside.name}, a new result cache is built (every score of this run "
            "is recomputed)")


def wal_mode(db, timeout_s):
    """PRAGMA journal_mode=WAL, retried for up to timeout_s: while another process opens the same new file, SQLite
    can answer "database is locked" at once, without waiting in its busy handler (seen with three writers starting
    together on a loaded 2-vCPU machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class ResultCache:
    """One SQLite file shared by runs and processes; every lookup is keyed on a full run identity."""

    def __init__(self, path, run, timeout_s=60.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run = run
        self.run_json = canonical(run)
        self.run_sha = sha256_text(self.run_json)
        self.db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
        wal_mode(self.db, timeout_s)
        self.db.execute("PRAGMA synchronous=NORMAL")   # WAL + NORMAL: a committed item survives a killed process
        self.db.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        self.db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, run_sha TEXT NOT NULL, "
                        "item TEXT NOT NULL, value TEXT NOT NULL, checksum TEXT NOT NULL, created REAL NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS runs (run_sha TEXT PRIMARY KEY, identity TEXT NOT NULL)")
        self.db.execute("INSERT OR IGNORE INTO runs VALUES (?, ?)", (self.run_sha, self.run_json))
        self.counts = {"hits": 0, "misses": 0, "corrupted": 0, "written": 0}
        self.corrupted_items = []
        self._in_batch = False

    def key(self, item):
        return cache_key(self.run, item)

    def get(self, item):
        """The stored value for this item under this run identity, or None (a miss or a corrupted row)."""
        key = self.key(item)
        item_json = canonical(item)
        row = self.db.execute("SELECT item, value, checksum FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.counts["misses"] += 1
            return None
        stored_item, value_json, stored_sum = row
        try:
            ok = stored_item == item_json and stored_sum == checksum(key, stored_item, value_json)
            value = json.loads(value_json) if ok else None
        except (ValueError, TypeError):
            ok, value = False, None
        if not ok or value is None:
            self.counts["corrupted"] += 1
            self.counts["misses"] += 1
            self.corrupted_items.append(item)
            self.db.execute("DELETE FROM results WHERE key = ?", (key,))
            return None
        self.counts["hits"] += 1
        return value

    def put(self, item, value):
        if value is None:
            raise ValueError("None cannot be cached (it means a miss)")
        key = self.key(item)
        item_json = canonical(item)
        value_json = json.dumps(value, sort_keys=True)       # floats as shortest round-trip repr
        if json.loads(value_json) != value and value == value:
            raise ValueError(f"value does not round-trip through JSON: {value!r}")
        self.db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)",
                        (key, self.run_sha, item_json, value_json, checksum(key, item_json, value_json), time.time()))
        self.counts["written"] += 1

    @contextmanager
    def batch(self):
        """One transaction: everything put inside is committed together when the block ends without error."""
        if self._in_batch:
            yield
            return
        self._in_batch = True
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")
        finally:
            self._in_batch = False

    def get_batch(self, rows, picks):
        """The stored scores of one forward batch ([score per pick]), or None (scoring.score_batches' hook)."""
        return self.get(batch_item(rows, picks))

    def put_batch(self, rows, picks, scores):
        """Store one computed batch, committed at once (a killed run keeps every batch it finished)."""
        with self.batch():
            self.put(batch_item(rows, picks), list(scores))

    def stats(self):
        return {"enabled": True, "path": str(self.path), "run_identity_sha256": self.run_sha, **self.counts,
                "corrupted_items": self.corrupted_items[:20]}

    def close(self):
        self.db.close()


def disabled_stats():
    return {"enabled": False, "path": None, "run_identity_sha256": None, "hits": 0, "misses": 0, "corrupted": 0,
            "written": 0, "corrupted_items": []}


def open_for(ctx, scorer, prompt_template_sha256, extra=None):
    """The cache of a run.py experiment context (experiments.context.Context), or None with --no-cache."""
    if ctx.options.no_cache:
        return None
    mi, env = ctx.inputs.model_identity, ctx.environment
    facts = ({} if env is None else   # the run's environment, computed once by run.py (None: computed here)
             {"code_sha256": env["code_sha256"], "versions": env["versions"],
              "platform": {"cpu": env["cpu"], "platform": env["platform"], "kernels": env["kernels"]}})
    run = run_identity(model_sha256=mi["model_sha256"], tokenizer_sha256=mi["tokenizer_sha256"],
                       data_content_sha256=ctx.data.content_sha256 if ctx.data is not None else None,
                       prompt_template_sha256=prompt_template_sha256, config=ctx.config, scorer=scorer, extra=extra,
                       **facts)
    path = Path(ctx.inputs.cache) / ctx.config.get("result_cache_file", DEFAULT_FILE)
    try:
        return ResultCache(path, run)
    except sqlite3.DatabaseError:       # damaged since run.py's check at the start: set it aside once, start anew
        set_aside_if_corrupt(path)
        return ResultCache(path, run)


def batch_item(rows, picks):
    """The item part of one forward batch: the sha256 of its rows' input ids (in batch order), their count, and
    each candidate's [row, token ids] (picks, in the batch's own order)."""
    return {"rows_sha256": sha256_text(canonical([list(r) for r in rows])), "n_rows": len(rows),
            "picks": [[int(row), [int(t) for t in cand]] for row, cand in picks]}


def close_with_stats(cache, scored, n_cached, n_items_cached):
    """The result-cache counts of one scoring pass ({key: scored candidates}; None cache: --no-cache), with the
    candidate scores served from it and computed; closes the cache."""
    n_cands = sum(len(v) for v in scored.values())
    stats = disabled_stats() if cache is None else cache.stats()
    stats.update(candidate_scores=n_cands, from_cache=n_cached, computed=n_cands - n_cached,
                 items_from_cache=n_items_cached)
    if cache is not None:
        cache.close()
    return stats


COUNTS = ("hits", "misses", "corrupted", "written", "candidate_scores", "from_cache", "computed", "items_from_cache")


def combine_stats(parts):
    """The stats of one run whose items were scored in several parts (ranks or shards, experiments/parallel.py):
    the counts summed, the corrupted items joined; identity and path are the parts' (all the same)."""
    out = dict(parts[0])
    for k in COUNTS:
        if k in out:
            out[k] = sum(p[k] for p in parts)
    out["corrupted_items"] = [i for p in parts for i in p.get("corrupted_items", [])][:20]
    return out
