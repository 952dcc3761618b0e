"""Strict reading of evidence files: a file that cannot be read or parsed, or that is of an evidence format the
audit does not read, raises Unreadable (exit 2), naming the file and line; nothing here guesses or repairs. Also the
sha256 helpers and where the cache keeps model and data."""
import hashlib
import json
import math
import re
import stat
from pathlib import Path

from evidence_audit.checks import cut

REQUIRED = ["config.json", "identity.json", "records.jsonl", "summary.json", "stages.json"]
EVIDENCE_KEYS = ("config", "identity", "records", "summary", "stages")   # the parsed REQUIRED files, in that order


class Unreadable(Exception):
    """The evidence cannot be read at all (exit 2); the message names the file and line."""


# ---- reading evidence --------------------------------------------------------------------------------------------
# Every byte the audit reads from an evidence directory or a review sheet is untrusted: these bounds make a hostile
# file one line of exit 2 (file, line, field) instead of a traceback, a silent "last key wins", or a stall.

MAX_FILE_BYTES = 1 << 30        # one evidence file (records and private texts of a full run are a few MB)
MAX_LINE_CHARS = 64 << 20       # one line of a JSON/JSONL file
MAX_DEPTH = 64                  # nesting of arrays and objects
MAX_INT_DIGITS = 100            # an integer literal (token ids, counts and sizes have at most 20 digits)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def read_bytes(path, limit=MAX_FILE_BYTES):
    """The bytes of an evidence file, refusing one over `limit` bytes before reading it."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{path}: not a regular file (a device, pipe or directory is never evidence)")
        size = st.st_size
        if size > limit:
            raise Unreadable(f"{path}: line 1: file of {size} bytes is over the audit's limit of {limit} bytes")
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise Unreadable(f"{path}: cannot read ({e.strerror})")


def read_text(path, limit=MAX_FILE_BYTES):
    """The strict UTF-8 text of an evidence file (no BOM, no invalid or surrogate byte sequences)."""
    data = read_bytes(path, limit)
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise Unreadable(f"{path}: line {line}: not UTF-8 ({e.reason} at byte {e.start})")
    if text.startswith("\ufeff"):
        raise Unreadable(f"{path}: line 1: starts with a byte order mark (run.py writes plain UTF-8)")
    return text


class _Bad(Exception):
    """A strict-JSON violation inside one document: (message, regex locating the offending text, which match)."""


def _no_constant(name):
    raise _Bad(f"non-finite number {name} (JSON has none)", r"(?<![\w\"])(?:NaN|-?Infinity)(?![\w\"])", 0)


def _int(s):
    digits = len(s.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Bad(f"integer of {digits} digits (over the audit's limit of {MAX_INT_DIGITS})",
                   r"\d{%d,}" % (MAX_INT_DIGITS + 1), 0)
    return int(s)


def _float(s):
    if len(s) > MAX_INT_DIGITS + 30:
        raise _Bad(f"number literal of {len(s)} characters (over the audit's limit)", re.escape(s[:50]), 0)
    v = float(s)
    if not math.isfinite(v):
        raise _Bad(f"number {s} overflows to {v}", re.escape(s), 0)
    return v


def _pairs(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise _Bad(f"duplicate key {k!r} (JSON readers disagree on which value wins)",
                       re.escape(json.dumps(k)) + r"\s*:", 1)
        obj[k] = v
    return obj


def _locate(text, pattern, nth, first_line):
    """(line, field) of the nth match of `pattern` in text: its line, and the key just before it on that line."""
    hits = list(re.finditer(pattern, text))
    if not hits:
        return first_line, None
    pos = hits[min(nth, len(hits) - 1)].start()
    line_start = text.rfind("\n", 0, pos) + 1
    keys = re.findall(r'"((?:[^"\\]|\\.)*)"\s*:', text[line_start:pos + (200 if nth else 0)])
    return first_line + text.count("\n", 0, pos), (keys[-1] if keys else None)


def _check_depth(text):
    """The deepest nesting of arrays/objects outside strings, without recursion (json would recurse)."""
    depth = deepest = 0
    for b in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if b in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            raise _Bad(f"nesting deeper than {MAX_DEPTH} levels")


def _surrogates(obj, where=""):
    """The key path of the first string (key or value) holding a lone surrogate (from a \\u escape), or None."""
    if isinstance(obj, str):
        return None if _encodable(obj) else where or "(value)"
    if isinstance(obj, dict):
        for k, v in obj.items():
            here = f"{where}.{k}" if where else str(k)
            if not _encodable(k):
                return here
            found = _surrogates(v, here)
            if found:
                return found
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            found = _surrogates(v, f"{where}.{i}" if where else str(i))
            if found:
                return found
    return None


def _encodable(s):
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def parse_strict(text, where, first_line=1):
    """One JSON document, strictly: no duplicate key, NaN/Infinity, overflowing number, integer over
    MAX_INT_DIGITS digits, nesting over MAX_DEPTH, lone surrogate, or line over MAX_LINE_CHARS. Raises Unreadable
    naming `where`, the line and the field."""
    lines = text.split("\n")
    long = next((i for i, line in enumerate(lines) if len(line) > MAX_LINE_CHARS), None)
    if long is not None:
        raise Unreadable(f"{where}: line {first_line + long}: line of {len(lines[long])} characters is over the "
                         f"audit's limit of {MAX_LINE_CHARS}")
    try:
        _check_depth(text)
        obj = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant, parse_int=_int,
                         parse_float=_float)
    except json.JSONDecodeError as e:
        # no advice to re-run anything: the same reader serves run.py's evidence, lm-eval's files, tokenizer.json
        raise Unreadable(f"{where}: line {first_line + e.lineno - 1}: unparseable JSON ({e.msg}): the file is cut "
                         "short, edited, or not JSON")
    except _Bad as e:
        line, key = _locate(text, e.args[1], e.args[2], first_line) if len(e.args) > 1 else (first_line, None)
        raise Unreadable(f"{where}: line {line}:{f' field {key[:80]!r}:' if key else ''} {e.args[0]}")
    except (RecursionError, ValueError, MemoryError) as e:     # belt and braces: never a traceback
        raise Unreadable(f"{where}: line {first_line}: unreadable JSON ({type(e).__name__})")
    bad = _surrogates(obj)
    if bad is not None:
        raise Unreadable(f"{where}: line {first_line}: field {bad[:80]!r}: string holds a lone surrogate (not UTF-8)")
    return obj


def read_json(path, limit=MAX_FILE_BYTES):
    """One JSON document, read strictly (parse_strict)."""
    return parse_strict(read_text(path, limit), path)


def read_jsonl(path, limit=MAX_FILE_BYTES):
    """One JSON document per line (a final newline is optional), each read strictly (parse_strict)."""
    text = read_text(path, limit)
    # split on "\n" only: json.dumps(ensure_ascii=False) leaves U+2028 and friends unescaped inside strings
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [parse_strict(line, path, n) for n, line in enumerate(lines, start=1)]


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_FILE_SHA = {}  # (path, size, mtime_ns) -> sha256; the mutation self-test hashes the same 500 MB file many times


def _hash_regular_file(path, st):
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable(f"{path}: not a regular file (a device, pipe or directory is never evidence)")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h


def sha256_file(path, cached=True):
    """The sha256 of a file's bytes; `cached` reuses a hash keyed by (path, size, mtime) — the model file is hashed
    once per process, but the manifest level re-hashes every evidence file (a forger can restore an mtime)."""
    try:
        st = Path(path).stat()
        key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
        if key not in _FILE_SHA or not cached:
            h = _hash_regular_file(path, st)
        if not cached:
            return h.hexdigest()
        if key not in _FILE_SHA:
            _FILE_SHA[key] = h.hexdigest()
    except OSError as e:
        raise Unreadable(f"{path}: cannot read ({e.strerror})")
    return _FILE_SHA[key]


# ---- the evidence format -----------------------------------------------------------------------------------------
# Written again on purpose (experiments/evidence.py EVIDENCE_FORMAT): run.py stamps every JSON evidence file with the
# version of the evidence it wrote, and a JSONL file has the format its MANIFEST.json declares. The rules below are
# written for the formats in READS_EVIDENCE_FORMATS; any other, or a file with none (evidence written before the
# format was versioned), would be misread, so it is refused on one line (exit 2) before any rule runs.

FORMAT_KEY = "evidence_format"
# Format 3 (over 2): the public files name local paths by placeholder ("<cache>/models/<id>", "<model:NAME>", "<out>",
# ...; resolve_path) and O/private/<exp>/paths.json maps them back (local_paths). Nothing else changed, so the rules
# read both: where a value is a placeholder or a path they resolve it by its shape, and the one check only format 3
# can pass (no local path in the public part, driver.local_paths_check) says that format 2 records them by design.
READS_EVIDENCE_FORMATS = (2, 3)      # (oldest, newest): the evidence formats this audit reads


def format_refusal(where, obj):
    """None when `obj` (a JSON evidence file's top level) declares an evidence format this audit reads; else the
    one line refusing it: the file, the version found and the range read."""
    lo, hi = READS_EVIDENCE_FORMATS
    found = obj.get(FORMAT_KEY) if isinstance(obj, dict) else None
    if type(found) is int and lo <= found <= hi:
        return None
    if not isinstance(obj, dict):
        what = f"a JSON {type(obj).__name__}, not an object with an {FORMAT_KEY}"
    elif FORMAT_KEY not in obj:
        what = f"no {FORMAT_KEY} (evidence written before its format was versioned)"
    else:
        what = f"{FORMAT_KEY} {cut(json.dumps(found), 40)}"
    return f"{where}: {what}; this audit reads evidence formats {lo} to {hi}"


def evidence_object(where, obj):
    """A JSON evidence file's top-level object without its evidence_format, once that is a format the audit reads
    (Unreadable otherwise): the rules see the evidence itself, and their "no field without a rule" checks stay
    strict."""
    refusal = format_refusal(where, obj)
    if refusal:
        raise Unreadable(refusal)
    return {k: v for k, v in obj.items() if k != FORMAT_KEY}


def evidence_json_files(out):
    """The JSON evidence files of O by the layout run.py writes, each of which carries its format: MANIFEST.json,
    environment.json, <exp>.FAILED.json and <exp>.preregistration.json at the top, and the *.json files of each
    experiment directory and of each O/private/<exp>/. Dot-entries, symlinks, special files and the audit's own
    outputs are left to the manifest level, which names them."""
    out = Path(out)

    def entries(d):
        try:
            return sorted(p for p in d.iterdir() if not p.name.startswith(".") and not p.is_symlink())
        except OSError as e:
            raise Unreadable(f"{d}: cannot list ({e.strerror})")

    def json_files(d):
        return [p for p in entries(d) if p.suffix == ".json" and p.is_file()]

    def dirs(d):
        return [p for p in entries(d) if p.is_dir()]

    top = [p for p in json_files(out) if p.name in ("MANIFEST.json", "environment.json")
           or p.name.endswith((".FAILED.json", ".preregistration.json"))]
    experiments = [p for p in dirs(out) if p.name != "private"]
    private = dirs(out / "private") if (out / "private").is_dir() and not (out / "private").is_symlink() else []
    return top + [f for d in experiments + private for f in json_files(d)]


def check_formats(out):
    """Every JSON evidence file of O read strictly and its evidence format checked: the first file the audit cannot
    read, or whose format it does not read, raises Unreadable (one line, exit 2); so does a file whose format is
    not MANIFEST.json's (one run writes one format: the rules read O by that one). Returns O's format (None: no
    JSON evidence file)."""
    found = {}
    for path in evidence_json_files(out):
        obj = read_json(path)
        refusal = format_refusal(path, obj)
        if refusal:
            raise Unreadable(refusal)
        found[path] = obj[FORMAT_KEY]
    manifest = Path(out) / "MANIFEST.json"
    declared = found.get(manifest, next(iter(found.values()), None))
    for path, fmt in found.items():
        if fmt != declared:
            said = "MANIFEST.json declares" if manifest in found else f"{next(iter(found))} has"
            raise Unreadable(f"{path}: {FORMAT_KEY} {fmt}, but {said} {declared}; one run writes one evidence "
                             "format (a file of another run, or edited)")
    return declared


def load_evidence(out, name):
    """The parsed files of experiment `name` under O and O/environment.json, by key (EVIDENCE_KEYS and
    "environment"; None where a file is absent; a .json file without its evidence_format), and "paths": the local
    paths O/private/<name>/paths.json maps its placeholders to ({} without one: local_paths). Raises Unreadable for
    a file that cannot be parsed, a .json file that is not an object, or one of an evidence format the audit does not
    read."""
    exp = out / name
    ev = {"environment": read_json(out / "environment.json") if (out / "environment.json").exists() else None}
    for key, fname in zip(EVIDENCE_KEYS, REQUIRED):
        p = exp / fname
        ev[key] = (read_jsonl(p) if fname.endswith(".jsonl") else read_json(p)) if p.exists() else None
    for key in ("config", "identity", "summary", "stages"):
        if ev[key] is not None and not isinstance(ev[key], dict):
            raise Unreadable(f"{exp / (key + '.json')}: line 1: expected a JSON object, found {type(ev[key]).__name__}")
    for key, path in (("environment", out / "environment.json"), ("config", exp / "config.json"),
                      ("identity", exp / "identity.json"), ("summary", exp / "summary.json"),
                      ("stages", exp / "stages.json")):
        if ev[key] is not None:
            ev[key] = evidence_object(path, ev[key])
    ev["paths"] = local_paths(out, name)
    return ev


# ---- local paths (evidence format 3) -------------------------------------------------------------------------------
# Written again on purpose (experiments/evidence.py LocalPaths): format 3's public files name a local path by a
# placeholder -- "<cache>", "<out>", "<model:NAME>" (a local --model directory named NAME), "<repo>", ... -- alone or
# followed by "/rest"; O/private/<exp>/paths.json maps each placeholder to the path it stood for on the machine that
# ran it. Format 2 wrote the absolute paths themselves.

PATHS_FILE = "paths.json"
PLACEHOLDER = re.compile(r"<[a-z]+(:[^/]*)?>")
PATHS_FIELDS = {"experiment", "paths", "command_line", "cwd"}


def paths_problems(rel, doc):
    """What is wrong with one O/private/<exp>/paths.json (its format already checked and taken off): the fields,
    each placeholder a placeholder and each path absolute."""
    if not isinstance(doc, dict) or set(doc) != PATHS_FIELDS:
        return [f"{rel}: expected the fields {', '.join(sorted(PATHS_FIELDS))}, found "
                f"{cut(json.dumps(sorted(doc) if isinstance(doc, dict) else doc), 80)}"]
    bad = []
    paths = doc["paths"]
    if not (isinstance(paths, dict) and all(PLACEHOLDER.fullmatch(k) and isinstance(v, str) and v.startswith("/")
                                            for k, v in paths.items())):
        bad.append(f"{rel} paths: expected {{\"<placeholder>\": \"/absolute/path\", ...}}, found "
                   f"{cut(json.dumps(paths), 80)}")
    if not (isinstance(doc["command_line"], list) and all(isinstance(a, str) for a in doc["command_line"])):
        bad.append(f"{rel} command_line: not a list of strings")
    if not (isinstance(doc["cwd"], str) and doc["cwd"].startswith("/")):
        bad.append(f"{rel} cwd: {cut(json.dumps(doc['cwd']), 60)} is not an absolute path")
    return bad


def local_paths(out, name):
    """{placeholder: path} from O/private/<name>/paths.json, or {} when it is absent, malformed (the completeness
    row names it) or of format 2 evidence (which has none)."""
    path = Path(out) / "private" / name / PATHS_FILE
    if not path.is_file() or path.is_symlink():
        return {}
    doc = evidence_object(path, read_json(path))
    return dict(doc["paths"]) if not paths_problems(path.name, doc) else {}


def resolve_path(recorded, known):
    """The local path a recorded path names: format 2's absolute path as it is; format 3's "<placeholder>[/rest]"
    under the path `known` gives for its placeholder (--cache, --model, paths.json); None when it names neither."""
    if not isinstance(recorded, str):
        return None
    head, sep, rest = recorded.partition("/")
    if PLACEHOLDER.fullmatch(head):
        base = known.get(head)
        if base is None:
            return None
        return Path(base) / rest if rest else Path(base)
    return Path(recorded) if recorded.startswith("/") else None


def resolve_cache(cfg, cache, model_dir=None, paths=None):
    """(model dir, data parquet) for an experiment. --cache is a prepared cache root (cache/models/<id>,
    cache/data/<id>) or a model dir; --model DIR (`model_dir`) is the model directory, whatever config.json records.
    Default: what config.json's model.dir records -- format 2 an absolute path, format 3 "<cache>/models/<id>" or
    "<model:NAME>", found through `paths` (O/private/<exp>/paths.json); the cache is that directory's grandparent
    (a lock model) or the one paths.json names."""
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    model_id, data_id = model.get("id"), cfg.get("data")
    known = dict(paths or {})
    if cache is not None:
        known["<cache>"] = str(cache)
    given = Path(model_dir) if model_dir is not None else None
    if model.get("source") == "local" and isinstance(model.get("dir"), str):
        # a local --model directory: --model, else the one config.json names (its files are re-hashed against
        # identity.json); the data still comes from the cache, when --cache or paths.json names one
        root = Path(known["<cache>"]) if "<cache>" in known else None
        parquet = root / "data" / data_id / "validation.parquet" if root and isinstance(data_id, str) else None
        return given or resolve_path(model["dir"], known), parquet
    if cache is not None:
        cache = Path(cache)
        if (cache / "config.json").exists() and (cache / "tokenizer.json").exists():
            model_dir, root = cache, cache.parent.parent
        else:
            model_dir, root = (cache / "models" / model_id if isinstance(model_id, str) else None), cache
    else:
        recorded = resolve_path(model.get("dir"), known)
        if recorded is None:
            return given, None
        model_dir, root = recorded, recorded.parent.parent
    model_dir = given or model_dir
    parquet = root / "data" / data_id / "validation.parquet" if isinstance(data_id, str) else None
    rel = cfg.get("data_parquet")      # an experiment may name its data file (mctaco: data/<id>/<split>.parquet)
    if isinstance(rel, str) and not Path(rel).is_absolute() and ".." not in Path(rel).parts:
        parquet = root / rel
    return model_dir, parquet

