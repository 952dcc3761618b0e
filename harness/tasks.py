"""Task files: one JSONL file per task, the file name (without .jsonl) is the task name.

Each non-blank line that does not start with `#` is one example:

    {"id": "arith-01", "prompt": "What is 17 + 25? ...", "targets": ["42"], "metric": "exact_match"}
    {"id": "code-01", ..., "metric": "code_exec", "extras": {"io_pairs": [[1, 2], [3, 6]]}}

Rules, all checked at load time: `id` a non-empty string, unique in the file; `prompt` a string; `targets` a
non-empty list of non-empty strings; `metric` one of metrics.METRICS and the same on every line of a file; `extras`
(optional) an object; code_exec needs `extras.io_pairs`, a non-empty list of [input, output] pairs. No other keys.
Lines are read strictly (harness/strict_json.py: duplicate keys, NaN/Infinity, huge integers, deep nesting, bad
UTF-8 and lone surrogates refused). A bad line raises TaskFormatError with one line: file, line number, the field
where known, what was expected, what was found. A task file must be a regular file of at most MAX_TASK_FILE_BYTES
(a FIFO, device or directory is refused before it is opened, and a symlink in a tasks directory must stay inside it).
A task's identity is the sha256 of its file bytes (recorded in the leaderboard); an example's answer key is
reference_sha256 (its metric, targets and extras, hashed).
"""
import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from harness.metrics import METRICS
from harness.strict_json import StrictJSONError, parse_jsonl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harness_tasks"
MAX_TASK_FILE_BYTES = 16 << 20     # the shipped task files are a few kB; a bigger file is a mistake, not a task set
REQUIRED = ("id", "prompt", "targets", "metric")
OPTIONAL = ("extras",)


class TaskFormatError(ValueError):
    def __init__(self, path, line, expected, found, message=None):
        where = f"{path}:{line}" if line else f"{path}"
        super().__init__(message or f"{where}: expected {expected}, found {found}")

    @classmethod
    def of(cls, e):
        """A strict-JSON refusal (harness/strict_json.py) as a task file error, its one line unchanged."""
        return cls(e.where, e.line, None, None, message=str(e))


@dataclass
class Example:
    id: str
    prompt: str
    targets: list
    metric: str
    extras: dict
    line: int


@dataclass
class Task:
    name: str
    path: Path
    sha256: str
    metric: str
    examples: list
    n_in_file: int


def _check_example(obj, path, n):
    def bad(expected, found):
        raise TaskFormatError(path, n, expected, found)

    if not isinstance(obj, dict):
        bad("a JSON object", type(obj).__name__)
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        bad(f"keys {', '.join(REQUIRED)}", f"keys {', '.join(obj) or '(none)'} (missing {', '.join(missing)})")
    extra = [k for k in obj if k not in REQUIRED + OPTIONAL]
    if extra:
        bad(f"only keys {', '.join(REQUIRED + OPTIONAL)}", f"unknown key(s) {', '.join(extra)}")
    if not isinstance(obj["id"], str) or not obj["id"]:
        bad("id to be a non-empty string", repr(obj["id"]))
    if not isinstance(obj["prompt"], str):
        bad("prompt to be a string", type(obj["prompt"]).__name__)
    t = obj["targets"]
    if not isinstance(t, list) or not t or not all(isinstance(x, str) and x for x in t):
        bad("targets to be a non-empty list of non-empty strings", json.dumps(t)[:60])
    if obj["metric"] not in METRICS:
        bad(f"metric to be one of {', '.join(sorted(METRICS))}", repr(obj["metric"]))
    extras = obj.get("extras", {})
    if not isinstance(extras, dict):
        bad("extras to be an object", type(extras).__name__)
    if obj["metric"] == "code_exec":
        pairs = extras.get("io_pairs")
        if not isinstance(pairs, list) or not pairs or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            bad("extras.io_pairs to be a non-empty list of [input, output] pairs", json.dumps(pairs)[:60])
    return Example(obj["id"], obj["prompt"], obj["targets"], obj["metric"], extras, n)


def file_kind(mode):
    """What a non-regular file is, in words."""
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return "not a regular file"


def check_inside(path, root):
    """A task file found in directory `root` must stay there: a symlink resolving outside it is refused."""
    target = Path(path).resolve()
    if not target.is_relative_to(Path(root).resolve()):
        raise TaskFormatError(path, None, f"a file inside {root}", f"a symlink to {target}")


def check_regular(path, st):
    if not stat.S_ISREG(st.st_mode):
        raise TaskFormatError(path, None, "a regular file", file_kind(st.st_mode))
    if st.st_size > MAX_TASK_FILE_BYTES:
        raise TaskFormatError(path, None, f"a task file of at most {MAX_TASK_FILE_BYTES} bytes", st.st_size)


def read_task_bytes(path, root=None):
    """The bytes of a task file that is a regular file of at most MAX_TASK_FILE_BYTES (inside `root` when given),
    or TaskFormatError naming it. Checked before opening (a FIFO would block the open or the read forever), and
    again on the opened descriptor, opened non-blocking, in case the path was swapped in between."""
    if root is not None:
        check_inside(path, root)
    check_regular(path, os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        check_regular(path, os.fstat(fd))
        raw = fh.read(MAX_TASK_FILE_BYTES + 1)
    if len(raw) > MAX_TASK_FILE_BYTES:      # grew since the fstat
        raise TaskFormatError(path, None, f"a task file of at most {MAX_TASK_FILE_BYTES} bytes", "more")
    return raw


def reference_sha256(ex):
    """What an example is scored against, hashed: sha256 of the canonical JSON of its extras, metric and targets
    (public evidence records it beside the prompt's hash, so a shipped example's answer key can be checked without
    the private task file)."""
    spec = {"extras": ex.extras, "metric": ex.metric, "targets": ex.targets}
    return hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def load_task(path, root=None):
    """One task file (a regular file; inside directory `root` when given), checked line by line."""
    path = Path(path)
    examples, first_metric, seen = [], None, {}
    try:
        raw = read_task_bytes(path, root)
        rows = parse_jsonl(raw, path, skip=lambda line: not line.strip() or line.lstrip().startswith("#"))
    except StrictJSONError as e:
        raise TaskFormatError.of(e) from None
    except OSError as e:
        raise TaskFormatError(path, None, "a readable file", e.strerror or type(e).__name__) from None
    for n, obj in rows:
        ex = _check_example(obj, path, n)
        if first_metric is None:
            first_metric = (ex.metric, n)
        elif ex.metric != first_metric[0]:
            raise TaskFormatError(path, n, f"metric {first_metric[0]!r} (as on line {first_metric[1]})",
                                  repr(ex.metric))
        if ex.id in seen:
            raise TaskFormatError(path, n, "a unique id", f"{ex.id!r} again (first on line {seen[ex.id]})")
        seen[ex.id] = n
        examples.append(ex)
    if not examples:
        raise TaskFormatError(path, None, "at least one example", "none")
    return Task(path.stem, path, hashlib.sha256(raw).hexdigest(), first_metric[0], examples, len(examples))


def load_all_tasks(task_dir):
    """Every *.jsonl in task_dir, by task name (sorted: the order of the leaderboard and of the overall mean).
    A missing directory is an error, never created here: a mistyped path must not look like an empty task set."""
    if not Path(task_dir).is_dir():
        raise TaskFormatError(task_dir, None, "a directory of *.jsonl task files",
                              "no such directory" if not Path(task_dir).exists() else
                              "a file" if Path(task_dir).is_file() else file_kind(os.stat(task_dir).st_mode))
    paths = sorted(Path(task_dir).glob("*.jsonl"))
    if not paths:
        raise TaskFormatError(task_dir, None, "at least one *.jsonl task file", "none")
    return {p.stem: load_task(p, task_dir) for p in paths}


def seed_fixture_tasks(target_dir):
    """Copy the shipped fixture tasks into target_dir (created if needed) if it has no task files yet. Returns True
    if it seeded. Only on an explicit request: `python -m harness run --seed-fixtures` (an editable copy)."""
    target_dir = Path(target_dir)
    if target_dir.exists() and any(target_dir.glob("*.jsonl")):
        return False
    target_dir.mkdir(parents=True, exist_ok=True)
    for p in sorted(FIXTURES.glob("*.jsonl")):
        shutil.copyfile(p, target_dir / p.name)
    return True


def head(tasks, n):
    """The first n examples of each task (smoke runs); hashes still name the whole file."""
    return {name: Task(t.name, t.path, t.sha256, t.metric, t.examples[:n], t.n_in_file) for name, t in tasks.items()}
