"""Writing evidence: atomic JSON/JSONL files, per-stage wall time and peak RSS, the run environment, and the output
directory (one run per O, one run at a time by <O>.lock, O/.run-in-progress and the sweep of what it claims, the
--out probe) with its MANIFEST.json and evidence digest."""
import errno
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import registry
from resources import REPO, atomic_write_bytes, atomic_write_json, atomic_write_text, dumps, sha256_bytes, sha256_file

# The version of the evidence this code writes: the layout of O and the fields of every file in it. Every JSON
# evidence file carries it as one top-level field; a JSONL file (records, texts, generations) carries nothing, so
# its lines stay as they were: its format is the one MANIFEST.json declares. Any change to what an evidence file
# holds (a field added, renamed, removed or given another meaning; a JSONL line of another shape) bumps it, and the
# audit and report.py, which refuse a format they do not read on one line, learn the new one in the same change
# (ARCHITECTURE.md, "Evidence format"). Format 3: the public files name local paths by placeholder (LocalPaths
# below), O/private/<experiment>/paths.json holds the paths.
EVIDENCE_FORMAT = 3
FORMAT_KEY = "evidence_format"


def stamped(obj):
    """A JSON evidence file's top-level object with the evidence format added (a copy; obj is left as it is)."""
    return {**obj, FORMAT_KEY: EVIDENCE_FORMAT}


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


class ScoringError(Exception):
    """An assertion of the independent path failed: the message names the item and what differed (raised by
    experiments/scoring.py; defined here, with IdentityMismatch, so that run.py catches it without importing torch)."""


class Stages:
    """Wall time and process peak RSS at the end of each named stage. Stages never nest (a nested one raises): the
    audit checks that an experiment's stages add up to its wall time, which a nested stage would count twice."""

    def __init__(self):
        self.stages = []
        self.open = None

    @contextmanager
    def stage(self, name):
        if self.open is not None:
            raise RuntimeError(f"stage {name!r} opened inside stage {self.open!r}; stages are timed one after another")
        self.open, t0 = name, time.perf_counter()
        try:
            yield
        finally:
            self.open = None
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


# The code that can change what an experiment computes from the same verified inputs and the same effective config:
# a score, a prediction, a generation, a figure of its summary. code_sha256() hashes these files and no others, so
# an edit of the report, the audit, bench.py or prepare.py keeps every cached score and every identity. Each
# experiment's own files are declared with it in registry.py; these are the ones they share.
SHARED_CODE_FILES = (
    "resources.py",                   # the data schemas: MC-TACO's rows, categories and question groups
    "adapter.py",                     # the model and tokenizer as both paths load them
    "harness/hf_model.py",            # the one model loader (dtype, attention, threads, safetensors, eval mode)
    "experiments/selection.py",       # which rows are scored, in which order
    "experiments/official.py",        # the official path (lm-eval's calls, its task, its filters and metrics)
    "experiments/scoring.py",         # the independent path's batches and scores
    "experiments/fast_scoring.py", "experiments/fast_check.py",    # --fast's scores and their comparison
    "experiments/two_paths.py",       # both paths' scores, the join, the agreement figures
    "experiments/parallel.py", "experiments/shards.py",            # the parts of a data-parallel run, gathered
    "experiments/result_cache.py",    # a served score is the float read back from the cache
    "experiments/stats.py",           # the uncertainty figures of every summary
)
CODE_FILES = SHARED_CODE_FILES + tuple(f for f in registry.CODE_FILES if f not in SHARED_CODE_FILES)

# The repository modules the experiments import that are left out of CODE_FILES, each with the reason. A test walks
# the experiments' imports and requires every module it reaches to be in one of the two.
CODE_HASH_EXCLUDES = {
    # Hashing config.py as code would make an edit of any section, e.g. a harness setting, miss every cached
    # protocol score.
    "config.py": "values, not code: the effective config enters the identity and the cache key section by section",
    "run.py": "hands each experiment its Context and writes its Result; what it decides that reaches a score (the "
              "config with --device/--threads/--dtype applied, the data, the split, the thread count) enters the "
              "identity and the cache key as values",
    "local_model.py": "checks and hashes a local model directory: its hashes are the model identity in the key",
    "registry.py": "plain data: the experiments and the config sections each depends on; the sections' values "
                   "enter the identity and the cache key",
    "experiments/__init__.py": "the list of experiments: which ones run, not what they compute",
    "experiments/context.py": "the Context and Result types: they carry values and compute none",
    "experiments/evidence.py": "writes the evidence files and describes the environment (the kernel identity "
                               "enters the cache key as a value)",
    "experiments/launch.py": "starts and coordinates the ranks; which items a rank scores is parallel.py's rule",
    "experiments/runlog.py": "sends library chatter to run.log",
    "experiments/signing.py": "signs the evidence digest once the evidence is written (run.py --sign)",
    "experiments/review_page.py": "renders extraction's private review pages from its records: a presentation",
    "harness/__init__.py": "imports nothing and defines nothing",
    "harness/cli.py": "python -m harness's command line; run.py's harness experiment calls the modules directly",
    "harness/__main__.py": "python -m harness's entry point",
}


def code_sha256():
    """Hash of the code that can change a score (CODE_FILES, by path and bytes), independent of git."""
    return sha256_bytes(b"".join(rel.encode() + b"\0" + (REPO / rel).read_bytes() for rel in sorted(CODE_FILES)))


def cpu_model():
    """The CPU model name from /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        return ""


# The environment variables that choose which CPU kernels torch, MKL, oneDNN and OpenMP run (read when torch loads),
# so they decide how a float rounds: part of the result cache's key and of environment.json.
KERNEL_ENV = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_NUM_THREADS", "MKL_DYNAMIC", "MKL_DEBUG_CPU_TYPE",
              "MKL_THREADING_LAYER", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
              "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE", "OMP_NUM_THREADS", "OMP_DYNAMIC",
              "OMP_SCHEDULE", "OMP_PROC_BIND", "KMP_AFFINITY", "KMP_BLOCKTIME", "GOMP_CPU_AFFINITY",
              "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "TORCH_MKLDNN_MATMUL_MIN_DIM")


def kernel_identity():
    """What chooses the CPU kernels in this process: the variables above, torch's capability and parallel info
    (threads, backend), the float32 matmul precision, and the MKL and oneDNN builds torch carries."""
    import torch

    built = torch.__config__.show().splitlines()
    return {"env": {k: os.environ.get(k) for k in KERNEL_ENV},
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "parallel_info": torch.__config__.parallel_info(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "mkl": next((l.strip(" -") for l in built if "Math Kernel Library" in l), None),
            "onednn": next((l.strip(" -") for l in built if "MKL-DNN" in l or "oneDNN" in l), None)}


def kernel_summary(kernels):
    """One line of kernel_identity(): what a person compares between two machines."""
    env = ", ".join(f"{k}={v}" for k, v in kernels["env"].items() if v is not None) or "no kernel variables set"
    return f"torch {kernels['torch_cpu_capability']}, {kernels['torch_threads']} thread(s), {env}"


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
            "cpu_count": os.cpu_count(), "torch_threads": threads, "kernels": kernel_identity(), "versions": versions,
            "command_line": sys.argv, **git_identity(), "code_sha256": code_sha256()}


def write_json(path, obj):
    """A JSON evidence file (config, identity, summary, stages, environment, run.json, paths.json, FAILED.json),
    stamped with the evidence format."""
    atomic_write_json(path, stamped(obj))


# ---- local paths: kept out of the public files -------------------------------------------------------------------
# A run names directories of the machine it ran on: the cache, O itself, a local --model directory, --merge's shard
# directories, the checkout (the shipped harness tasks), the Python installation, the home and the temp directory.
# The public part of O (everything but O/private/) is what a user publishes, so it names each of them by a
# placeholder instead (LocalPaths.public / text / path), and O/private/<experiment>/paths.json maps every placeholder
# back to the path it stands for (nothing is lost: the private half keeps the paths, the command line as typed and
# the working directory). Since evidence format 3.

PATHS_FILE = "paths.json"       # in O/private/<experiment>/, beside run.json
_PATH_CHARS = "A-Za-z0-9._~+-"  # characters that continue a file name: "/tmp" is not a root of "/tmpfiles"


class LocalPaths:
    """The run's local paths and the placeholder each is published as. `paths`: {placeholder: absolute path}, in
    the order given (when two roots are the same directory, the first one names it)."""

    def __init__(self, roots):
        self.paths = {}
        for placeholder, path in roots:
            self.add(placeholder, path)

    @classmethod
    def for_run(cls, out, cache, model_dir=None, shards=(), key=None):
        """The roots of one run.py run: <out>, <cache>, <model:NAME> (a local --model directory, NAME its name),
        <shard:NAME> (each --merge directory), <key:NAME> (the --sign key file), then the machine's <repo> (this
        checkout), <python> (sys.prefix: the venv), <home> and <tmp>. A path is published under the longest root
        that holds it."""
        roots = [("<out>", out), ("<cache>", cache)]
        if model_dir is not None:
            roots.append((f"<model:{Path(model_dir).name}>", model_dir))
        roots += [(f"<shard:{Path(os.path.abspath(d)).name}>", d) for d in shards]
        if key is not None:
            roots.append((f"<key:{Path(key).name}>", os.path.realpath(key)))
        home = os.path.expanduser("~")
        roots += [("<repo>", REPO), ("<python>", sys.prefix), ("<home>", home if os.path.isabs(home) else None),
                  ("<tmp>", tempfile.gettempdir())]
        return cls(roots)

    def add(self, placeholder, path):
        """Name `path` (made absolute) by `placeholder`; the filesystem root itself and a taken placeholder name
        stay out (a second shard of one name gets "<shard:NAME-2>")."""
        if path is None:
            return
        spelled = os.path.abspath(path)
        if spelled == os.sep or spelled in self.paths.values():
            return
        base, k = placeholder, 2
        while placeholder in self.paths:
            placeholder, k = f"{base[:-1]}-{k}>", k + 1
        self.paths[placeholder] = spelled

    def spellings(self):
        """[(spelling, placeholder)], longest first: each path as recorded and as resolved (a symlinked directory
        has two spellings)."""
        found = {}
        for placeholder, path in self.paths.items():
            for spelled in (path, os.path.realpath(path)):
                found.setdefault(spelled, placeholder)
        return sorted(found.items(), key=lambda kv: -len(kv[0]))

    def path(self, text):
        """An absolute path as the public files name it: "<root>" or "<root>/rest" under the longest root holding
        it; an absolute path under none that exists here gets a "<path:NAME>" of its own; anything else as it is."""
        for spelled, placeholder in self.spellings():
            if text == spelled or text.startswith(spelled.rstrip(os.sep) + os.sep):
                return placeholder + text[len(spelled):]
        if os.path.isabs(text) and len(text) > 1 and os.path.lexists(text):
            self.add(f"<path:{Path(text).name}>", text)
            return self.path(text)
        return text

    def public(self, value):
        """A JSON value with every string that is an absolute path written as path() says, and any root a string
        still holds (a text that mentions a path) as text() says."""
        if isinstance(value, dict):
            return {k: self.public(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.public(v) for v in value]
        if isinstance(value, str):
            return self.text(self.path(value) if value.startswith(os.sep) else value)
        return value

    def text(self, text):
        """Free text (a log line, an error message) with every root in it written as its placeholder: wherever
        its spelling is not followed by a character that continues a file name ("/tmp" is no root of "/tmpx"), which
        is what the audit's search for a local path in the public files looks for."""
        for spelled, placeholder in self.spellings():
            if spelled in text:
                text = re.sub(rf"{re.escape(spelled)}(?![{_PATH_CHARS}])", lambda m, p=placeholder: p, text)
        return text

    def public_text(self, value):
        """A JSON value with text() applied to every string in it (FAILED.json: messages that name files)."""
        if isinstance(value, dict):
            return {k: self.public_text(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.public_text(v) for v in value]
        return self.text(value) if isinstance(value, str) else value

    def record(self, experiment):
        """O/private/<experiment>/paths.json: the placeholders and the paths they stand for, the command line as
        typed and the directory it was typed in (its relative paths are relative to it)."""
        return {"experiment": experiment, "paths": dict(self.paths), "command_line": list(sys.argv),
                "cwd": os.getcwd()}



# ---- the output directory: one run per O, leftovers, a usable disk, the manifest -------------------------------
# (a run id everywhere; one run per O, --replace sets the old one aside; temp dirs inside the areas they become, so
# a rename installs them; MANIFEST.json last, so its presence says the run finished)

MANIFEST_FORMAT = "evidence-manifest/v1"
MANIFEST_NAME = "MANIFEST.json"
SIGNATURE_NAME = "MANIFEST.json.sig"   # run.py --sign: the signature of the evidence digest (experiments/signing.py)
NOT_IN_MANIFEST = {MANIFEST_NAME, SIGNATURE_NAME, "audit.json", "audit.mutations.json"}
PROBE_BYTES = 1 << 20      # an --out must take this much (write + fsync + delete) before any model is loaded


def new_run_id():
    """32 lowercase hex digits, one per run.py invocation."""
    return uuid.uuid4().hex


def evidence_entries(out, experiment_names):
    """The names in O that make it hold evidence of an earlier run (sorted)."""
    out = Path(out)
    found = [n for n in (MANIFEST_NAME, "environment.json") if (out / n).exists()]
    if (out / "private").is_dir() and any(not is_leftover(p.name) for p in (out / "private").iterdir()):
        found.append("private")
    found += [n for n in experiment_names if (out / n).exists()]
    found += [p.name for p in out.glob("*.FAILED.json")]
    return sorted(set(found))


def is_leftover(name):
    """A temp entry a killed run can leave: .tmp-* (this layout), .<exp>.tmp-*, .private-<exp>.tmp-*, .<file>.*.tmp
    (atomic writes), .report.html.tmp and the old public .harness_tasks."""
    return name.startswith(".") and (name.startswith(".tmp-") or ".tmp-" in name or name.endswith(".tmp")
                                     or name == ".harness_tasks")


# ---- one run per O at a time: the lock -------------------------------------------------------------------------
# An exclusive flock on the sibling <O>.lock, held for the whole run. The kernel drops it when the process ends, however
# it ends, so a killed run never blocks the next one (its lock file is reused); the file names the holder's pid and
# host for the refusal.

class OutLock:
    """A held <O>.lock: its path and open file descriptor (release() unlinks and closes it)."""

    def __init__(self, path, fd):
        self.path, self.fd = path, fd

    def release(self):
        if self.fd is None:
            return
        try:
            if same_file(self.path, self.fd):
                os.unlink(self.path)
        except OSError:
            pass                        # a lock file that cannot be removed is only reused by the next run
        os.close(self.fd)               # closing drops the flock
        self.fd = None


def lock_path(out):
    """<O>.lock beside the real directory: two spellings of one O (a symlinked parent, "a/../O") share one lock."""
    p = Path(os.path.realpath(out))
    return p.with_name(p.name + ".lock")


def same_file(path, fd):
    """True while `path` is still the file open as fd (a run that released the lock unlinked it)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


LOCK_FORMAT = "run-out-lock/v1"
LOCK_MAX_BYTES = 4096


def lock_info(fd):
    """The holder's {"format", "pid", "host", "since"} read from a lock file (bounded), {} for an empty file, None
    for a file that is not one run.py writes."""
    try:
        data = os.pread(fd, LOCK_MAX_BYTES + 1, 0)
        if not data:
            return {}
        info = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    ok = (len(data) <= LOCK_MAX_BYTES and isinstance(info, dict) and info.get("format") == LOCK_FORMAT
          and type(info.get("pid")) is int and isinstance(info.get("host"), str) and isinstance(info.get("since"), str))
    return info if ok else None


def lock_holder(fd):
    """'another run.py (pid N on HOST since T)' as the holder wrote it into its lock file, or what is known when it
    wrote nothing run.py writes (it may be run.py that has not written it yet, or another program)."""
    info = lock_info(fd)
    if not info:
        return ("a process that wrote no run.py lock record into it (pid unknown: a run.py that has not written it "
                "yet, or another program)")
    return f"another run.py (pid {info['pid']} on {info['host'][:100]} since {info['since'][:40]})"


def refuse_if_locked(out):
    """Refuse on one line when another process holds <O>.lock; creates nothing."""
    import fcntl

    path = lock_path(out)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return                                      # no lock file (or none we can open): nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise_locked(out, path, lock_holder(fd))
    finally:
        os.close(fd)


def raise_locked(out, path, holder):
    from resources import ResourceError

    raise ResourceError(f"--out {out}: {holder} holds {path}; one run per output directory at a time: wait for it "
                        "to finish, or name another --out")


def raise_not_a_lock(out, path):
    from resources import ResourceError

    raise ResourceError(f"--out {out}: {path} exists and is not a lock file run.py writes; it was left as it is: "
                        "move it, or name another --out")


def take_out_lock(out):
    """Hold <O>.lock for this process (its parent directory is created); refuse on one line naming the pid that
    holds it. A lock file left by a killed run holds no flock and is taken over."""
    import fcntl

    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tries = 0
    while True:
        try:                            # whether this process made the file: an empty one it did not make is not ours
            fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), True
        except FileExistsError:
            fd, created = os.open(path, os.O_RDWR | os.O_NOFOLLOW), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(fd)
            os.close(fd)
            tries += 1
            if tries < 20:              # another run's refuse_if_locked holds it shared for an instant: wait a little
                time.sleep(0.05)
                continue
            raise_locked(out, path, holder)
        if not same_file(path, fd):     # the holder released (unlinked) it between our open and flock: again
            os.close(fd)
            continue
        if created or lock_info(fd) != {}:
            break
        os.close(fd)                    # empty, not ours, nobody holds it: a run that is about to write it, or a
        tries += 1                      # user's own empty file, which is left alone
        if tries >= 20:
            raise_not_a_lock(out, path)
        time.sleep(0.05)
    if lock_info(fd) is None:           # somebody's own file of that name: neither overwritten nor removed
        os.close(fd)
        raise_not_a_lock(out, path)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"format": LOCK_FORMAT, "pid": os.getpid(), "host": platform.node(),
                              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
    return OutLock(path, fd)


# ---- what a run may leave in O: its claim ----------------------------------------------------------------------
# A run writes O/.run-in-progress when it starts in an O that holds nothing else (or only what an earlier run
# claimed, swept first): its run id, pid, host, start time and the names it may create in O. It removes the marker
# just before MANIFEST.json (or after a shard's SHARD.json). A marker found by a later run (which holds the lock, so
# the marker's run is gone) therefore proves which entries that run made: only those are removed, and only when
# every entry of O is one of them; anything else makes the run refuse O with nothing deleted.

MARKER = ".run-in-progress"


def still_running(marker):
    """True when the marker's run.py process is alive on this host (its pid runs a command line naming run.py): a
    second check beside the lock before anything of that run is removed."""
    if marker.get("host") != platform.node() or marker.get("pid") == os.getpid():
        return False
    try:
        with open(f"/proc/{int(marker['pid'])}/cmdline", "rb") as f:
            return b"run.py" in f.read(1 << 16)
    except (OSError, ValueError, TypeError):
        return False
MARKER_FORMAT = "run-in-progress/v1"
MARKER_MAX_BYTES = 1 << 20
FIXED_CLAIMS = ("run.log", "private", "report.html", "environment.json", MANIFEST_NAME, "SHARD.json")
CLAIM_RE = re.compile(r"[a-z][a-z0-9_]{0,63}(\.FAILED\.json|\.preregistration\.json)?"
                      r"|\.tmp-(old-)?[a-z][a-z0-9_]{0,63}-[0-9a-f]{32}")


def temp_dir_name(experiment, run_id, old=False):
    """The temporary directory of one experiment's evidence in its area (O/, O/private/): named with the run id, so
    a later run can tell it apart from anybody else's file."""
    return f".tmp-{'old-' if old else ''}{experiment}-{run_id}"


def claims_of(experiment_names, run_id):
    """Every top-level name of O a run of these experiments may create (its temp dirs by run id)."""
    names = list(FIXED_CLAIMS)
    for n in experiment_names:
        names += [n, f"{n}.FAILED.json", f"{n}.preregistration.json", temp_dir_name(n, run_id),
                  temp_dir_name(n, run_id, old=True)]
    return names


def is_claimed(name, claims):
    """A claimed name, or the temp file an atomic write of a claimed file makes beside it (.<name>.XXXXXXXX.tmp)."""
    if name in claims:
        return True
    m = re.fullmatch(r"\.(.+)\.[A-Za-z0-9_]{8}\.tmp", name)
    return m is not None and m.group(1) in claims and "/" not in name


def write_marker(out, run_id, experiment_names):
    atomic_write_json(Path(out) / MARKER, {"format": MARKER_FORMAT, "run_id": run_id, "pid": os.getpid(),
                                           "host": platform.node(), "claims": claims_of(experiment_names, run_id),
                                           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def remove_marker(out):
    try:
        os.unlink(Path(out) / MARKER)
    except FileNotFoundError:
        pass


def read_marker(out):
    """The marker an earlier run left in O (checked: size, strict JSON, fields, every claim a name a run makes), or
    None; ResourceError (one line) for a file of that name that is not one."""
    from resources import ResourceError

    path = Path(out) / MARKER
    if not os.path.lexists(path):
        return None
    def bad(why):
        return ResourceError(f"--out {out}: {path} is not a marker run.py writes ({why}); nothing was deleted: name a "
                             "new --out, or empty this one yourself")
    if path.is_symlink() or not path.is_file() or path.stat().st_size > MARKER_MAX_BYTES:
        raise bad(f"expected a regular file of at most {MARKER_MAX_BYTES} bytes")
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise bad(f"not JSON: {str(e)[:80]}")
    fields = {"format", "run_id", "pid", "host", "claims", "started_utc"}
    if not isinstance(doc, dict) or set(doc) != fields or doc["format"] != MARKER_FORMAT:
        raise bad(f"expected an object with the fields {', '.join(sorted(fields))} and format {MARKER_FORMAT}")
    if not (isinstance(doc["run_id"], str) and re.fullmatch(r"[0-9a-f]{32}", doc["run_id"])):
        raise bad("field run_id: expected 32 lowercase hex digits")
    claims = doc["claims"]
    if not (isinstance(claims, list) and all(isinstance(c, str) and (c in FIXED_CLAIMS or CLAIM_RE.fullmatch(c))
                                             for c in claims)):
        raise bad("field claims: expected names a run writes in O")
    return doc


def unclaimed_entries(out, marker):
    """The names in O (sorted) that no marker claims: all of them without a marker."""
    claims = set(marker["claims"]) if marker else set()
    return sorted(p.name for p in Path(out).iterdir() if p.name != MARKER and not is_claimed(p.name, claims))


def sweep_claimed(out, marker):
    """Remove what the marker's run left in O (every entry but the marker is one it claimed: unclaimed_entries was
    empty), then the marker; the removed names, relative to O."""
    out, removed = Path(out), []
    for p in sorted(out.iterdir()):
        if p.name == MARKER or not is_claimed(p.name, set(marker["claims"])):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        removed.append(p.name)
    remove_marker(out)
    return removed


def old_run_label(out):
    """The run id of the evidence in O (MANIFEST.json, else environment.json), else a UTC timestamp."""
    for name in (MANIFEST_NAME, "environment.json"):
        try:
            rid = json.loads((Path(out) / name).read_text(encoding="utf-8")).get("run_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(rid, str) and re.fullmatch(r"[0-9a-f]{32}", rid):
            return rid
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def set_aside(out):
    """--replace: rename O to the sibling <O>.replaced-<old run id or timestamp>; returns the new path."""
    out = Path(out)
    base = out.with_name(f"{out.name}.replaced-{old_run_label(out)}")
    dest, k = base, 1
    while dest.exists():
        dest, k = base.with_name(f"{base.name}-{k}"), k + 1
    os.rename(out, dest)
    return dest


def probe_writable(directory, nbytes=PROBE_BYTES):
    """None if `directory` takes a file of nbytes (write + fsync + delete), else why not (one line)."""
    path = None
    try:
        fd, path = tempfile.mkstemp(dir=directory, prefix=".tmp-probe-")
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * nbytes)
            f.flush()
            os.fsync(f.fileno())
        return None
    except OSError as e:
        what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
                errno.EROFS: "the file system is read-only", errno.EACCES: "not writable",
                errno.EPERM: "not writable"}.get(e.errno, e.strerror or type(e).__name__)
        return f"{what} (could not write and fsync a {nbytes}-byte probe file: {e.strerror or e})"
    finally:
        if path is not None and os.path.exists(path):
            os.unlink(path)


def existing_ancestor(path):
    """The nearest existing ancestor of `path` (path itself if it exists)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def file_sha256_size(path):
    return sha256_file(path), os.path.getsize(path)


def walk_files(root):
    """Every regular file (and symlink) under root, as POSIX paths relative to root, sorted; dirs not followed."""
    root, out = Path(root), []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            out.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(out)


def private_digest(exp_dir):
    """{"n_files", "sha256"}: sha256 of the sorted "relpath\\tsha256\\n" lines of one experiment's private files,
    relpath relative to O/private/<exp>/."""
    lines = [f"{rel}\t{sha256_file(exp_dir / rel)}\n" for rel in walk_files(exp_dir)]
    return {"n_files": len(lines), "sha256": sha256_bytes("".join(lines).encode("utf-8"))}


def build_manifest(out, run_id, installed, failed):
    """MANIFEST.json's content: every public file with size and sha256, the private digests."""
    out = Path(out)
    files = {}
    for rel in walk_files(out):
        if rel in NOT_IN_MANIFEST or rel.split("/", 1)[0] == "private":
            continue
        sha, size = file_sha256_size(out / rel)
        files[rel] = {"sha256": sha, "size": size}
    area = out / "private"
    private = ({p.name: private_digest(p) for p in sorted(area.iterdir()) if p.is_dir() and not p.name.startswith(".")}
               if area.is_dir() else {})
    # its evidence_format is also the format of every JSONL file it lists or digests (those carry none of their own)
    return stamped({"format": MANIFEST_FORMAT, "run_id": run_id, "experiments": list(installed),
                    "failed": list(failed), "files": files, "private": private})


def write_manifest(out, run_id, installed, failed):
    """Write O/MANIFEST.json atomically (the last file of a run); return the evidence digest (sha256 of its bytes)."""
    text = dumps(build_manifest(out, run_id, installed, failed)).encode("utf-8")
    atomic_write_bytes(Path(out) / MANIFEST_NAME, text)
    return sha256_bytes(text)
