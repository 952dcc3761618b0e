"""A task's own code: its `!function` fields, run in the repository's code sandbox once the file that holds them is
identified as a file an lm-eval release ships.

lm-eval logs a function-valued field of a task config in the results' `configs` as its source text (0.4.9.2
lm_eval/api/task.py:169-183, serialize_function: inspect.getsource, else str() of it). The fields the identity level
needs are process_docs (each logged doc is process_docs(split)[doc_id], not the data row), doc_to_text,
doc_to_target, doc_to_choice (the prompt, target and choices of a document) and process_results (a sample's
metrics). Such code runs only when:

- the user names where it is: `--task-code [TASK=]DIR`, a task's folder or a whole lm_eval/tasks tree;
- one .py file under DIR holds the logged source of every such field (bounded search: MAX_ENTRIES entries walked,
  MAX_PY_FILES .py files of at most MAX_PY_BYTES each, MAX_PY_TOTAL bytes in all; symbolic links not followed;
  several files with different contents that hold it are narrowed to those beside a YAML naming the task, else the
  task is not run), with the line breaks Python's linecache reads (\\r\\n and \\r as \\n);
- that file's sha256 is in the table of the files the lm-eval releases ship (task_files.py): the row then names the
  release and path it is, and says so when the run's own release is not one that ships it. A file not in the table
  (edited, a git checkout, a task of one's own) is never run;
- --data gives the evaluated split (.jsonl or .parquet: typed rows; not .tsv), and --fewshot-data the few-shot split
  of a few-shot run when that is another split.

Otherwise each row that needs the code is SKIPPED naming why (INCOMPLETE when its level was asked for): never FAIL,
never PASS. The code runs in harness/sandbox.py (the repository's one code sandbox; bubblewrap, else its own jail)
with LIMITS: no network, no host file but the Python installation, this audit's site-packages and /usr/lib(64),
read-only; threads (pyarrow starts them) but no new process; CPU seconds, address space, wall time and the result's
size bounded. The child (task_code_child.py, sent as text) builds the split as a datasets.Dataset, applies
process_docs to the whole split and runs the doc_to_* functions on the documents at the logged doc_ids (and on every
document of the few-shot split); it imports no lm_eval. Its one result line is read with reading.parse_strict and
its shape checked here; a result that does not fit is a reason to skip, never a finding.

A process_results function gives a sample's metrics: it runs on (the processed document at the sample's doc_id, the
sample's filtered responses as lm-eval hands them: a loglikelihood response as the tuple (log-likelihood, is_greedy)
read back from the logged strings, a generation as its text), for multiple_choice, loglikelihood and generate_until
tasks; identity.py compares what it returns with each logged sample's metrics."""
import base64
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from evidence_audit.checks import cut, short
from evidence_audit.lmeval import fmt, task_files
from evidence_audit.lmeval.docs import doc_hash
from evidence_audit.reading import Unreadable, parse_strict, read_bytes

FIELDS = ("process_docs", "doc_to_text", "doc_to_target", "doc_to_choice", "process_results")    # what can run
DOC_FIELDS = ("doc_to_text", "doc_to_target", "doc_to_choice")
RESULT_TYPES = ("multiple_choice", "loglikelihood", "generate_until")    # whose logged responses can be handed back
CHILD = Path(__file__).with_name("task_code_child.py")

MAX_ENTRIES = 100_000           # directory entries walked under --task-code DIR (lm-eval 0.4.9.2's tasks/: 15,854)
MAX_PY_FILES = 5_000            # .py files read (0.4.9.2's tasks/: 632)
MAX_PY_BYTES = task_files.MAX_FILE_BYTES        # one .py file (the largest any release ships is under 90 KB)
MAX_PY_TOTAL = 64 << 20         # all .py files read (0.4.9.2's tasks/: 1.7 MB)
MAX_YAML_BYTES = 1 << 20        # a YAML read to see which task it names
MAX_SOURCE_CHARS = 1 << 20      # a logged function source
MAX_DATA_BYTES = 256 << 20      # one split's file handed to the sandbox
LIMITS = {"cpu_s": 300, "startup_s": 60.0, "wall_s": 600.0, "memory_bytes": 4 << 30, "fsize_bytes": 1 << 20,
          "nofile": 256, "tmpfs_bytes": 16 << 20, "result_max_bytes": 64 << 20, "threads": 32, "mode": "auto"}
UNLOGGED = re.compile(r"<(?:function|bound method|built-in function|built-in method) |functools\.partial\(")
TASK_LINE = r"^task:\s*['\"]?{}['\"]?\s*$"


class NotRun(Exception):
    """Why a task's code was not run: the rows that need it are SKIPPED with this reason."""


def is_code(value):
    """True when a config value is a function's logged source (a def, a class, a lambda assigned to a name) or what
    lm-eval logs for a function without source (str of it), not a Jinja template or a field name."""
    if not isinstance(value, str):
        return False
    head = value.lstrip()
    return bool(re.match(r"(?:@[^\n]*\n\s*)*(?:(?:async\s+)?def|class)\s+\w+\s*[(:]", head)
                or re.match(r"\w+\s*=\s*lambda\b", head) or UNLOGGED.match(head))


def code_fields(cfg):
    """{field: logged source} of the config's fields that are code (of FIELDS)."""
    return {k: cfg[k] for k in FIELDS if is_code(cfg.get(k))}


@dataclass
class PyFile:
    path: Path
    sha256: str
    text: str       # decoded, line breaks as linecache reads them


@dataclass
class Scan:
    root: Path
    files: list = field(default_factory=list)
    skipped: list = field(default_factory=list)     # (path, why)


def decoded(raw):
    """A Python file's text as linecache gives it to inspect.getsource (strict UTF-8, a BOM dropped, universal
    line breaks), or None when it is not UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def scan(root):
    """Every .py file under `root`, bounded (module docstring); Unreadable (exit 2) for a DIR that is not a directory
    or holds more than the bounds allow."""
    root = Path(root)
    if not root.is_dir() or root.is_symlink():
        raise Unreadable(f"--task-code {root}: not a directory (expected a task's folder or an lm_eval/tasks tree)")
    out, todo, entries, total = Scan(root), [root], 0, 0
    while todo:
        d = todo.pop()
        try:
            with os.scandir(d) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise Unreadable(f"--task-code {root}: cannot list {d} ({e.strerror})")
        entries += len(items)
        if entries > MAX_ENTRIES:
            raise Unreadable(f"--task-code {root}: more than {MAX_ENTRIES} entries under it; point it at the task's "
                             "folder or an lm_eval/tasks tree")
        todo += [Path(e.path) for e in reversed(items) if e.is_dir(follow_symlinks=False)]
        for e in items:
            if not (e.name.endswith(".py") and e.is_file(follow_symlinks=False)):
                continue
            if len(out.files) + len(out.skipped) >= MAX_PY_FILES:
                raise Unreadable(f"--task-code {root}: more than {MAX_PY_FILES} .py files under it")
            size = e.stat(follow_symlinks=False).st_size
            if size > MAX_PY_BYTES:
                out.skipped.append((Path(e.path), f"{size} bytes, over {MAX_PY_BYTES}"))
                continue
            total += size
            if total > MAX_PY_TOTAL:
                raise Unreadable(f"--task-code {root}: more than {MAX_PY_TOTAL} bytes of .py files under it")
            raw = read_bytes(e.path, MAX_PY_BYTES)
            text = decoded(raw)
            if text is None:
                out.skipped.append((Path(e.path), "not UTF-8"))
                continue
            out.files.append(PyFile(Path(e.path), hashlib.sha256(raw).hexdigest(), text))
    return out


def holds(f, source):
    """True when the file's text holds `source` from the start of a line (linecache ends a last line with \\n)."""
    text = f.text if f.text.endswith("\n") else f.text + "\n"
    return text.startswith(source) or "\n" + source in text


def names_task(directory, task):
    """True when a YAML file in `directory` names `task` (a `task:` line)."""
    pattern = re.compile(TASK_LINE.format(re.escape(task)), re.M)
    for p in sorted(directory.glob("*.yaml")):
        try:
            if p.is_file() and not p.is_symlink() and pattern.search(read_bytes(p, MAX_YAML_BYTES).decode("utf-8",
                                                                                                        "replace")):
                return True
        except Unreadable:
            continue
    return False


def locate(task, fld, source, found):
    """The one file of `found` (a Scan) that holds `source` (the logged `fld` of `task`); NotRun otherwise."""
    if len(source) > MAX_SOURCE_CHARS:
        raise NotRun(f"the logged {fld} is {len(source)} characters long (over {MAX_SOURCE_CHARS})")
    hits = [f for f in found.files if holds(f, source)]
    if len({f.sha256 for f in hits}) > 1:
        hits = [f for f in hits if names_task(f.path.parent, task)] or hits
    if not hits:
        skipped = f"; {len(found.skipped)} not read: " + ", ".join(f"{p.name} ({why})" for p, why in
                                                                      found.skipped[:3]) if found.skipped else ""
        raise NotRun(f"no .py file under {found.root} holds the {fld} source the run logged "
                     f"({len(found.files)} .py files searched{skipped}): {short(source, 60)}")
    if len({f.sha256 for f in hits}) > 1:
        raise NotRun(f"{len(hits)} .py files under {found.root} hold the logged {fld} with different contents ("
                     + ", ".join(str(f.path) for f in hits[:4]) + f") and no YAML beside one alone names task "
                     f"{task}: pass --task-code the task's own folder")
    return hits[0]


def releases_of_run(t):
    return tuple(t.release.versions) if t.release is not None else ("0.4.9.2",)


def releases_words(releases):
    """A list of releases, short: all of them up to three, else the count and the first and last."""
    return ", ".join(releases) if len(releases) <= 3 else f"{len(releases)} releases, {releases[0]} to {releases[-1]}"


def identified(f, t):
    """What the table says of file `f`, as a row says it: "<name> = lm-eval R's tasks/<path> (sha256 …; shipped by
    …)", and when the run's release is not among those that ship it, that it is NOT a file of that release. NotRun
    when the table has no such file, or the file changed since it was read."""
    sha, pairs = task_files.identify(f.path)
    if sha != f.sha256:
        raise NotRun(f"{f.path} changed while the audit read it (sha256 {f.sha256[:16]}… then {sha[:16]}…)")
    if not pairs:
        raise NotRun(f"{f.path} (sha256 {sha}) is not a file any lm-eval release read ships "
                     f"({task_files.TABLE.name}: an edited file, a git checkout or a task of one's own): not run")
    mine, releases = releases_of_run(t), list(dict.fromkeys(r for r, _ in pairs))
    same = [(r, p) for r, p in pairs if r in mine]
    pool = same or pairs        # oldest release first: the run's own, else the newest that ships it
    release, path = ([rp for rp in pool if f.path.as_posix().endswith("/" + rp[1])] or pool)[0 if same else -1]
    words = f"{f.path} = lm-eval {release}'s tasks/{path} (sha256 {f.sha256[:12]}…; shipped by " \
            f"{releases_words(releases)})"
    if not same:
        words += f"; NOT a file of lm-eval {' or '.join(mine)}, the release that wrote this run"
    return words


@dataclass
class Split:
    n: int              # documents in the split after process_docs
    docs: dict          # doc_id -> document (JSON, as the tracker would log it)
    values: dict        # field -> {doc_id: value}
    errors: dict        # field -> {doc_id: message}; "process_results" -> {position in the results: message}
    metrics: list = None    # process_results' dict per result sent (the logged samples, in file order)


@dataclass
class Ran:
    """What the task's code gave: its splits ("eval", and "fewshot" for a few-shot run given its split) and the
    words a row says of it."""
    splits: dict
    note: str
    fields: tuple

    def value(self, fld, doc):
        """The value the task's `fld` function gave for a document (found by its doc_hash among the documents it
        ran on); an exception naming what happened otherwise."""
        if "_by_hash" not in self.__dict__:
            self._by_hash = {doc_hash(d): (i, s) for s in self.splits.values() for i, d in s.docs.items()}
        hit = self._by_hash.get(doc_hash(doc))
        if hit is None:
            raise LookupError(f"the task's {fld} did not run on this document (not one of the task's processed "
                              "documents)")
        i, s = hit
        if i in s.errors.get(fld, {}):
            raise RuntimeError(f"the task's {fld} raised on it in the sandbox: {s.errors[fld][i]}")
        return s.values[fld][i]

    def error(self, fields):
        """The first document on which one of `fields` (of DOC_FIELDS) raised, as words, or None."""
        for s_name, s in self.splits.items():
            for fld in fields:
                for i, why in sorted(s.errors.get(fld, {}).items()):
                    return f"the task's {fld} raised on {s_name} document {i} in the sandbox ({cut(why, 160)})"
        return None


class Computed:
    """A doc_to_* field that is code, bound to what the task's own function gave (prompt.py calls it on a document,
    as lm-eval calls a callable field)."""

    def __init__(self, ran, fld):
        self.ran, self.field = ran, fld

    def __call__(self, doc):
        return self.ran.value(self.field, doc)


def bound(cfg, code):
    """The config with each doc_to_* field that is code replaced by its Computed values (when the code ran)."""
    if not isinstance(code, Ran):
        return cfg
    return {**cfg, **{k: Computed(code, k) for k in DOC_FIELDS if k in code.fields}}


def missing(cfg, code, fields):
    """Why the fields of `fields` that are code in `cfg` cannot be had (NotRun's reason, or a document on which one
    raised), or None when none of them is code or the code ran."""
    needed = [k for k in fields if is_code(cfg.get(k))]
    if not needed:
        return None
    if isinstance(code, NotRun):
        return str(code)
    return code.error(needed) if isinstance(code, Ran) else f"{needed[0]} is task code: not run"


def site_dirs():
    """This audit's own site-packages, where the sandboxed child imports datasets, pyarrow and numpy from."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(str(Path(paths[k]).resolve()) for k in ("purelib", "platlib")
                              if Path(paths[k]).is_dir()))


def split_job(path, ids):
    """One split for the child: its file (.jsonl as text, .parquet as base64) and the document ids wanted."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".parquet"):
        raise NotRun(f"{path}: the task's code runs on typed rows; pass .jsonl or .parquet (a .tsv has no types)")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise Unreadable(f"{path}: cannot read ({e.strerror})")
    if size > MAX_DATA_BYTES:
        raise NotRun(f"{path}: {size} bytes, over the {MAX_DATA_BYTES} the audit hands the code sandbox")
    raw = read_bytes(path, MAX_DATA_BYTES)
    if path.suffix == ".parquet":
        return {"format": "parquet", "data": base64.b64encode(raw).decode("ascii"), "ids": ids}
    try:
        return {"format": "jsonl", "data": raw.decode("utf-8"), "ids": ids}
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise Unreadable(f"{path}: line {line}: not UTF-8 ({e.reason} at byte {e.start})")


def child_result(res):
    """The child's result (the dict it wrote), read strictly; NotRun for anything else."""
    where = "the task code sandbox's result"
    if res.error:
        raise NotRun(f"the task's code did not finish in the sandbox: {res.error}")
    try:
        outer = parse_strict(res.raw.decode("utf-8"), where)
        out = outer["outputs"][0] if isinstance(outer, dict) and isinstance(outer.get("outputs"), list) \
            and len(outer["outputs"]) == 1 and isinstance(outer["outputs"][0], dict) else None
        if out is None or out.get("ok") is not True or not isinstance(out.get("value"), str):
            raise NotRun(f"the task's code sandbox ended without its result ({short(outer, 120)})")
        body = parse_strict(parse_strict(out["value"], where), where)
    except (Unreadable, UnicodeDecodeError) as e:
        raise NotRun(f"the task's code sandbox wrote no readable result ({cut(str(e), 160)})")
    if isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str):
        raise NotRun(f"the task's code failed in the sandbox: {cut(body['error'], 300)}")
    if not (isinstance(body, dict) and set(body) == {"versions", "splits"} and isinstance(body["splits"], dict)
            and isinstance(body["versions"], dict)):
        raise NotRun(f"the task's code sandbox wrote an unexpected result ({short(body, 120)})")
    return body


def split_of(name, got, wanted, fields, n_results=None):
    """A Split from the child's answer for one split, its shape checked against what was asked (`n_results`: the
    count of process_results' results sent, or None); NotRun if not."""
    def bad(what):
        return NotRun(f"the task's code sandbox answered split {name} with {what}")

    keys = {"n", "ids", "docs", "values", "errors", "varies"} | ({"metrics"} if n_results is not None else set())
    if not (isinstance(got, dict) and set(got) == keys):
        raise bad(f"fields {sorted(got) if isinstance(got, dict) else type(got).__name__}")
    n, ids, docs = got["n"], got["ids"], got["docs"]
    varies = got["varies"]
    if varies is not None:
        if not (type(varies) is int and varies >= 0):
            raise bad(f"varies {short(varies, 40)}")
        raise NotRun(f"process_docs gives other documents under another random seed (document {varies} of split "
                     f"{name} differs: it draws from the global random state, which in the run held lm-eval's seed and "
                     "every draw before the call): its documents are not reproduced here")
    if not (type(n) is int and n >= 0 and isinstance(docs, list) and all(isinstance(d, dict) for d in docs)):
        raise bad("no document count or documents that are not objects")
    expect_ids = [i for i in (wanted if wanted is not None else range(n)) if 0 <= i < n]
    if ids != expect_ids or len(docs) != len(ids):
        raise bad(f"{len(docs)} documents for ids {short(ids, 60)}, asked for {short(expect_ids, 60)}")
    values, errors = got["values"], got["errors"]
    counts = {**{k: len(docs) for k in fields}, **({"process_results": n_results} if n_results is not None else {})}
    if not (isinstance(values, dict) and set(values) == set(fields) and isinstance(errors, dict)
            and set(errors) == set(counts) and all(isinstance(values[k], list) and len(values[k]) == len(docs)
                                                   for k in fields)
            and all(isinstance(errors[k], dict) and all(re.fullmatch(r"0|[1-9]\d*", p) and int(p) < counts[k]
                                                        and isinstance(m, str) for p, m in errors[k].items())
                    for k in counts)):
        raise bad(f"values or errors not one per document for {', '.join(counts) or 'no field'}")
    metrics = got.get("metrics")
    if n_results is not None and not (isinstance(metrics, list) and len(metrics) == n_results and all(
            m is None or isinstance(m, dict) for m in metrics)):
        raise bad(f"process_results' metrics not one object per sample ({n_results})")
    out = Split(n, dict(zip(ids, docs)), {k: dict(zip(ids, values[k])) for k in fields},
                {k: {ids[int(p)]: m for p, m in errors[k].items()} for k in fields}, metrics)
    if n_results is not None:
        out.errors["process_results"] = {int(p): m for p, m in errors["process_results"].items()}
    return out


def results_of(t):
    """[[doc_id, [filtered response, ...]], ...] for process_results, one per logged sample in file order, as lm-eval
    hands them to it (fmt.loglikelihood reads a loglikelihood response back); None for another output type."""
    if t.output_type not in RESULT_TYPES:
        return None
    if t.output_type == "generate_until":
        return [[s.doc_id, list(s.raw["filtered_resps"])] for s in t.samples]
    return [[s.doc_id, [list(fmt.loglikelihood(t.path, s, v, f"filtered_resps[{i}]"))
                        for i, v in enumerate(s.raw["filtered_resps"])]] for s in t.samples]


def run_job(job, fields, words):
    """The job run in the repository's code sandbox (harness/sandbox.py: the audit's one import of harness/, see
    ARCHITECTURE.md); Ran, or NotRun naming what stopped it."""
    from harness import sandbox

    try:
        res = sandbox.run_code(CHILD.read_text(encoding="utf-8"), [job], {**LIMITS, "import_dirs": site_dirs()},
                               raw=True)
    except sandbox.SandboxUnavailable as e:
        raise NotRun(f"the code sandbox is not available here ({cut(str(e), 160)})")
    body = child_result(res)
    doc_fields = [k for k in DOC_FIELDS if k in fields]
    splits = {name: split_of(name, body["splits"].get(name), spec["ids"], doc_fields,
                             len(spec["results"]) if spec.get("results") is not None else None)
              for name, spec in job["splits"].items()}
    versions = ", ".join(f"{k} {v}" for k, v in body["versions"].items() if isinstance(v, str))
    backend = (res.isolation or {}).get("backend", "?")
    return Ran(splits, f"{words}; run in the code sandbox ({backend}, {res.wall_s:.1f} s; {versions})",
               tuple(fields))


def prepare(t, code_dir, data, fewshot, scans):
    """None when the task's config has no code the audit runs; else Ran, or NotRun saying why not. `code_dir`,
    `data`: this task's --task-code and --data (or None); `fewshot`: the few-shot split's file when a few-shot run
    draws from one (or None); `scans`: this audit's {DIR: Scan}."""
    fields = {k: v for k, v in code_fields(t.config).items() if k in FIELDS}
    if not fields:
        return None
    named = ", ".join(fields)
    if code_dir is None:
        first = short(next(iter(fields.values())), 50)
        return NotRun(f"{named} {'is' if len(fields) == 1 else 'are'} task code ({first}): pass --task-code "
                      "[TASK=]DIR (the task's folder or an lm_eval/tasks tree) to run it in the code sandbox")
    unlogged = [k for k, v in fields.items() if UNLOGGED.match(v.lstrip())]
    if unlogged:
        return NotRun(f"lm-eval logged no source for {unlogged[0]} ({short(fields[unlogged[0]], 60)}): the audit "
                      "cannot identify that code")
    if data is None:
        return NotRun(f"{named}: the task's code runs on the evaluated split's rows; pass --data FILE")
    try:
        if str(code_dir) not in scans:
            scans[str(code_dir)] = scan(code_dir)
        files = {k: locate(t.name, k, v, scans[str(code_dir)]) for k, v in fields.items()}
        modules = list({f.path: f for f in files.values()}.values())
        words = "; ".join(identified(f, t) for f in modules)
        ids = sorted({s.doc_id for s in t.samples})
        job = {"modules": [{"name": f.path.stem, "path": str(f.path), "text": f.text} for f in modules],
               "functions": {k: [modules.index(files[k]), fields[k]] for k in fields},
               "splits": {"eval": split_job(data, ids), **({"fewshot": split_job(fewshot, None)} if fewshot else {})}}
        if "process_results" in fields:
            job["splits"]["eval"]["results"] = results_of(t)
        try:
            return run_job(job, fields, words)
        except NotRun as e:     # a file named as under --task-code's folder: the same words on every machine
            root, said = scans[str(code_dir)].root, str(e)
            for f in modules:
                if f.path.is_relative_to(root):
                    said = said.replace(str(f.path), f"{root.name}/{f.path.relative_to(root).as_posix()}")
            return NotRun(said)
    except NotRun as e:
        return e
