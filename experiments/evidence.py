"""Writing evidence: atomic JSON/JSONL files, per-stage wall time and peak RSS, the run environment."""
import json
import os
import platform
import resource
import subprocess
import sys
import time
from contextlib import contextmanager

from resources import REPO, atomic_write_json, atomic_write_text, sha256_bytes


def jsonl(records):
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)


def write_jsonl(path, records):
    atomic_write_text(path, jsonl(records))


def peak_rss_bytes():
    # ru_maxrss is in KiB on Linux; it is the process's peak so far, so per stage it is "peak up to the end".
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class IdentityMismatch(Exception):
    """Evidence does not belong to the item it claims, or the two paths disagree.

    `rows` is a table of (idx, field, official, independent); `details` (optional) says what the run did that the
    table alone does not (e.g. the index order passed to lm-eval). run.py writes both into O/<NAME>.FAILED.json,
    prints the table and exits 1."""

    def __init__(self, message, rows, details=None):
        super().__init__(message)
        self.rows = rows
        self.details = details


class Stages:
    """Wall time and process peak RSS at the end of each named stage."""

    def __init__(self):
        self.stages = []

    @contextmanager
    def stage(self, name):
        t0 = time.perf_counter()
        yield
        self.stages.append({"name": name, "wall_s": round(time.perf_counter() - t0, 4),
                            "peak_rss_bytes_at_end": peak_rss_bytes()})


def git_identity():
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD") or None
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None
    return {"git_commit": commit, "git_dirty": dirty}


# config.py holds values, not code: each experiment's effective values are in its identity already
# (identity.json scoring_config, and every result-cache key). Hashing the file as code would make any edit of any
# section, e.g. a harness setting, miss every cached protocol score.
CODE_HASH_EXCLUDES = {"config.py"}


def code_sha256():
    """Hash of the code that can change a score (top-level scripts, experiments/, harness/), independent of git.

    config.py is excluded (CODE_HASH_EXCLUDES): the settings an experiment's scores depend on enter its identity as
    values, section by section, so a change to another experiment's section does not change this one's identity."""
    files = sorted(p for p in [*REPO.glob("*.py"), *REPO.glob("experiments/*.py"), *REPO.glob("harness/*.py")]
                   if str(p.relative_to(REPO)) not in CODE_HASH_EXCLUDES)
    return sha256_bytes(b"".join(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() for p in files))


def cpu_model():
    """The CPU model name from /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        return ""


def environment(threads):
    import importlib.metadata as md

    versions = {}
    for pkg in ("torch", "transformers", "tokenizers", "lm_eval", "datasets", "numpy", "pyarrow", "safetensors",
                "huggingface_hub", "gguf"):
        try:
            versions[pkg] = md.version(pkg.replace("_", "-"))
        except md.PackageNotFoundError:
            versions[pkg] = None
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu_model(),
            "cpu_count": os.cpu_count(), "torch_threads": threads, "versions": versions,
            "command_line": sys.argv, **git_identity(), "code_sha256": code_sha256()}


def write_json(path, obj):
    atomic_write_json(path, obj)

