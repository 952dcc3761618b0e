"""Strict reading of evidence files: a file that cannot be read or parsed raises Unreadable (exit 2), naming the
file and line; nothing here guesses or repairs. Also the sha256 helpers and where the cache keeps model and data."""
import hashlib
import json
from pathlib import Path

REQUIRED = ["config.json", "identity.json", "records.jsonl", "summary.json", "stages.json"]
EVIDENCE_KEYS = ("config", "identity", "records", "summary", "stages")   # the parsed REQUIRED files, in that order


class Unreadable(Exception):
    """The evidence cannot be read at all (exit 2); the message names the file and line."""


# ---- reading evidence --------------------------------------------------------------------------------------------

def read_text(path):
    """The UTF-8 text of an evidence file."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise Unreadable(f"{path}: not UTF-8 ({e})")
    except OSError as e:
        raise Unreadable(f"{path}: cannot read ({e.strerror})")


def read_json(path):
    """One JSON document."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Unreadable(f"{path}: line {e.lineno}: unparseable JSON ({e.msg}); re-run run.py to regenerate it")


def read_jsonl(path):
    """One JSON document per line (a final newline is optional)."""
    text = read_text(path)
    # split on "\n" only: json.dumps(ensure_ascii=False) leaves U+2028 and friends unescaped inside strings
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    rows = []
    for n, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise Unreadable(f"{path}: line {n}: unparseable JSON ({e.msg}); re-run run.py to regenerate it")
    return rows


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_FILE_SHA = {}  # (path, size, mtime_ns) -> sha256; the mutation self-test hashes the same 500 MB file many times


def sha256_file(path):
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FILE_SHA:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _FILE_SHA[key] = h.hexdigest()
    return _FILE_SHA[key]


def load_evidence(out, name):
    """The parsed files of experiment `name` under O and O/environment.json, by key (EVIDENCE_KEYS and
    "environment"; None where a file is absent). Raises Unreadable for a file that cannot be parsed or a .json file
    that is not an object."""
    exp = out / name
    ev = {"environment": read_json(out / "environment.json") if (out / "environment.json").exists() else None}
    for key, fname in zip(EVIDENCE_KEYS, REQUIRED):
        p = exp / fname
        ev[key] = (read_jsonl(p) if fname.endswith(".jsonl") else read_json(p)) if p.exists() else None
    for key in ("config", "identity", "summary", "stages"):
        if ev[key] is not None and not isinstance(ev[key], dict):
            raise Unreadable(f"{exp / (key + '.json')}: line 1: expected a JSON object, found {type(ev[key]).__name__}")
    return ev


def resolve_cache(cfg, cache):
    """(model dir, data parquet) for an experiment: --cache is a prepared cache root (cache/models/<id>,
    cache/data/<id>) or a model dir; default: the model dir config.json records, whose grandparent is the cache."""
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    model_id, data_id = model.get("id"), cfg.get("data")
    if cache is not None:
        cache = Path(cache)
        if (cache / "config.json").exists() and (cache / "tokenizer.json").exists():
            model_dir, root = cache, cache.parent.parent
        else:
            model_dir, root = (cache / "models" / model_id if isinstance(model_id, str) else None), cache
    else:
        recorded = model.get("dir")
        if not isinstance(recorded, str):
            return None, None
        model_dir, root = Path(recorded), Path(recorded).parent.parent
    parquet = root / "data" / data_id / "validation.parquet" if isinstance(data_id, str) else None
    return model_dir, parquet

