"""Pinned resources: the lock, hashing, atomic writes, and the cache manifest.

Shared by prepare.py (which fills the cache) and run.py (which refuses to read anything the manifest does not
vouch for). audit.py deliberately re-implements the little it needs instead of importing this module.

Limits: verification is by sha256 of bytes (files) or of a canonical text rendering (data content); it says
nothing about whether the pinned bytes are the "right" ones beyond matching the lock.
"""
import hashlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent
LOCK_PATH = REPO / "resources.lock.json"
MANIFEST = "manifest.json"


class ResourceError(Exception):
    """Bad input, failed verification or a missing resource: the CLI prints it on one line and exits 2."""


def load_lock(path=LOCK_PATH):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path, chunk=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return h.hexdigest()
            h.update(block)


def atomic_write_bytes(path, data):
    """Write to a temp file in the same directory, fsync, then rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text):
    atomic_write_bytes(path, text.encode("utf-8"))


def dumps(obj):
    """The one JSON style for evidence: sorted keys, 1-space indent, so two runs diff line by line."""
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def atomic_write_json(path, obj):
    atomic_write_text(path, dumps(obj))


# ---- data content -------------------------------------------------------------------------------------------

def canonical_rows_text(rows):
    """The canonical rendering that identifies SST-2-shaped data, independent of file format.

    One UTF-8 line f"{idx}\\t{label}\\t{sentence}\\n" per row in idx order, sentence exactly as stored.
    """
    return "".join(f"{r['idx']}\t{r['label']}\t{r['sentence']}\n" for r in rows)


def content_sha256(rows):
    return sha256_bytes(canonical_rows_text(rows).encode("utf-8"))


def check_rows_shape(rows, where):
    """idx must be 0..N-1 in order (lm-eval's doc_id is the row position, so the two must coincide)."""
    for pos, r in enumerate(rows):
        if r["idx"] != pos:
            raise ResourceError(f"{where}: row {pos}: expected idx {pos}, found {r['idx']}")
        if r["label"] not in (0, 1):
            raise ResourceError(f"{where}: idx {pos}: expected label 0 or 1, found {r['label']!r}")
        if not isinstance(r["sentence"], str) or "\t" in r["sentence"] or "\n" in r["sentence"]:
            raise ResourceError(f"{where}: idx {pos}: sentence must be a string without tabs or newlines")


def read_glue_tsv(path):
    """GLUE SST-2 dev.tsv: header `sentence\\tlabel`, row order is idx order. Strict: one clear error per defect."""
    rows = []
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[0].rstrip("\r") != "sentence\tlabel":
        found = lines[0][:60] if lines else "an empty file"
        raise ResourceError(f"{path}:1: expected header 'sentence<TAB>label', found {found!r}")
    for lineno, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 2 or parts[1] not in ("0", "1"):
            raise ResourceError(f"{path}:{lineno}: expected '<sentence><TAB><0|1>', found {line[:80]!r}")
        rows.append({"idx": lineno - 2, "label": int(parts[1]), "sentence": parts[0]})
    return rows


def read_parquet_rows(path):
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = {"sentence", "label", "idx"} - set(table.column_names)
    if missing:
        raise ResourceError(f"{path}: expected columns sentence, label, idx; missing {sorted(missing)}")
    cols = table.to_pydict()
    rows = [{"idx": int(i), "label": int(l), "sentence": s} for s, l, i in zip(cols["sentence"], cols["label"], cols["idx"])]
    return sorted(rows, key=lambda r: r["idx"]) if all(isinstance(r["idx"], int) for r in rows) else rows


def read_data_file(path):
    path = Path(path)
    if not path.exists():
        raise ResourceError(f"{path}: file not found")
    if path.suffix == ".parquet":
        return read_parquet_rows(path)
    if path.suffix in (".tsv", ".txt"):
        return read_glue_tsv(path)
    raise ResourceError(f"{path}: expected a .parquet (hub) or .tsv (GLUE dev.tsv) file, found suffix {path.suffix!r}")


def rows_to_parquet_bytes(rows):
    """Deterministic parquet (no pandas metadata, fixed column order, uncompressed stats off) for the cache."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "sentence": pa.array([r["sentence"] for r in rows], pa.string()),
        "label": pa.array([r["label"] for r in rows], pa.int64()),
        "idx": pa.array([r["idx"] for r in rows], pa.int32()),
    })
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False, store_schema=False)
    return buf.getvalue()


def verify_rows(rows, entry, where):
    """Check a data copy against its lock entry: shape, row and label counts, then the canonical content hash.

    On a hash mismatch with a reference copy available, the caller names the first differing idx.
    """
    check_rows_shape(rows, where)
    if len(rows) != entry["rows"]:
        raise ResourceError(f"{where}: expected {entry['rows']} rows, found {len(rows)}")
    counts = {str(k): sum(r["label"] == k for r in rows) for k in (0, 1)}
    if counts != entry["label_counts"]:
        raise ResourceError(f"{where}: expected label counts {entry['label_counts']}, found {counts}")
    found = content_sha256(rows)
    if found != entry["content_sha256"]:
        raise ResourceError(f"{where}: canonical content sha256 mismatch: expected {entry['content_sha256']}, "
                            f"found {found}{first_difference_hint(rows, entry)}")


def row_hash16(row):
    return sha256_bytes(canonical_rows_text([row]).encode("utf-8"))[:16]


def first_difference_hint(rows, entry):
    """Name the first differing idx by comparing per-row hash prefixes, when the lock carries them."""
    row_hashes = entry.get("row_sha256_16")
    if not row_hashes:
        return " (the lock has no per-row hashes for this resource, so the differing idx cannot be named)"
    for r in rows:
        if r["idx"] >= len(row_hashes) or row_hash16(r) != row_hashes[r["idx"]]:
            return f" (first differing row: idx {r['idx']})"
    return ""


# ---- MC-TACO-shaped data (lock entries with "schema": "mctaco") ---------------------------------------------
# One row per (question, candidate answer): sentence, question, answer, label, category, as lm-eval's mc_taco task
# reads them (doc_to_target: label -> an index into doc_to_choice ["no", "yes"]). Rows are identified by their
# position (idx 0..N-1, lm-eval's doc_id); a question by sha256 of (sentence, question).

MCTACO_COLUMNS = ("sentence", "question", "answer", "label", "category")
MCTACO_LABELS = ("no", "yes")            # label 0 = "no" (implausible), 1 = "yes" (plausible): doc_to_choice order
MCTACO_CATEGORIES = ("Event Duration", "Event Ordering", "Frequency", "Typical Time", "Stationarity")
MCTACO_TEXT_FIELDS = ("sentence", "question", "answer")


def mctaco_canonical_text(rows):
    """The canonical rendering that identifies MC-TACO-shaped data, independent of file format.

    One UTF-8 line f"{idx}\\t{label_name}\\t{category}\\t{sentence}\\t{question}\\t{answer}\\n" per row in idx
    order, label_name "no"/"yes", category its name, texts exactly as stored. Names, not codes: a TSV with
    "yes"/"no" and a parquet with ClassLabel ints render to the same lines when they hold the same data.
    """
    return "".join(f"{r['idx']}\t{MCTACO_LABELS[r['label']]}\t{r['category']}\t{r['sentence']}\t{r['question']}"
                   f"\t{r['answer']}\n" for r in rows)


def mctaco_content_sha256(rows):
    return sha256_bytes(mctaco_canonical_text(rows).encode("utf-8"))


def mctaco_row_hash16(row):
    return sha256_bytes(mctaco_canonical_text([row]).encode("utf-8"))[:16]


def mctaco_question_id(sentence, question):
    """Question identity: sha256 of sentence + TAB + question (neither may contain a tab)."""
    return sha256_bytes(f"{sentence}\t{question}".encode("utf-8"))


def mctaco_questions(rows):
    """Questions in order of first appearance: [{question_id, question_rank, idx: [row idx...], category}]."""
    by_id = {}
    for r in rows:
        qid = mctaco_question_id(r["sentence"], r["question"])
        if qid not in by_id:
            by_id[qid] = {"question_id": qid, "question_rank": len(by_id), "idx": [], "category": r["category"]}
        by_id[qid]["idx"].append(r["idx"])
    return list(by_id.values())


def check_mctaco_rows_shape(rows, where):
    for pos, r in enumerate(rows):
        if r["idx"] != pos:
            raise ResourceError(f"{where}: row {pos}: expected idx {pos}, found {r['idx']}")
        if r["label"] not in (0, 1):
            raise ResourceError(f"{where}: idx {pos}: expected label 0/1 ('no'/'yes'), found {r['label']!r}")
        if r["category"] not in MCTACO_CATEGORIES:
            raise ResourceError(f"{where}: idx {pos}: category {r['category']!r} is not one of {MCTACO_CATEGORIES}")
        for k in MCTACO_TEXT_FIELDS:
            v = r[k]
            if not isinstance(v, str) or not v or "\t" in v or "\n" in v or "\r" in v:
                raise ResourceError(f"{where}: idx {pos}: {k} must be a non-empty string without tabs or newlines")


def mctaco_label_counts(rows):
    return {name: sum(r["label"] == k for r in rows) for k, name in enumerate(MCTACO_LABELS)}


def verify_mctaco_rows(rows, entry, where):
    """Check an MC-TACO copy against its lock entry: shape, counts, then the canonical content hash."""
    check_mctaco_rows_shape(rows, where)
    if entry.get("rows") is not None and len(rows) != entry["rows"]:
        raise ResourceError(f"{where}: expected {entry['rows']} rows, found {len(rows)}")
    counts = mctaco_label_counts(rows)
    if entry.get("label_counts") is not None and counts != entry["label_counts"]:
        raise ResourceError(f"{where}: expected label counts {entry['label_counts']}, found {counts}")
    if entry.get("n_questions") is not None and len(mctaco_questions(rows)) != entry["n_questions"]:
        raise ResourceError(f"{where}: expected {entry['n_questions']} questions, found "
                            f"{len(mctaco_questions(rows))}")
    if entry.get("content_sha256") is None:
        raise ResourceError(f"{where}: the lock has no content_sha256 for this resource; nothing to verify against "
                            f"(prepare.py --pin records it after the file hashes are checked)")
    found = mctaco_content_sha256(rows)
    if found != entry["content_sha256"]:
        hint = ""
        for r in rows:
            hashes = entry.get("row_sha256_16") or []
            if r["idx"] >= len(hashes) or mctaco_row_hash16(r) != hashes[r["idx"]]:
                hint = f" (first differing row: idx {r['idx']})" if hashes else ""
                break
        raise ResourceError(f"{where}: canonical content sha256 mismatch: expected {entry['content_sha256']}, "
                            f"found {found}{hint}")


def _mctaco_row(idx, sentence, question, answer, label, category, where):
    if isinstance(label, str):
        if label not in MCTACO_LABELS:
            raise ResourceError(f"{where}: idx {idx}: label {label!r} is not 'yes' or 'no'")
        label = MCTACO_LABELS.index(label)
    return {"idx": idx, "sentence": sentence, "question": question, "answer": answer, "label": int(label),
            "category": category}


def read_mctaco_tsv(path):
    """MC-TACO's release format: sentence, question, answer, label ("yes"/"no"), category, TAB-separated, no
    quoting. A first line equal to the column names (as in this repository's fixture) is a header and skipped."""
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    start = 1 if lines and lines[0].rstrip("\r") == "\t".join(MCTACO_COLUMNS) else 0
    rows = []
    for lineno, line in enumerate(lines[start:], start=start + 1):
        parts = line.rstrip("\r").split("\t")
        if len(parts) != 5:
            raise ResourceError(f"{path}:{lineno}: expected 5 TAB-separated fields (sentence, question, answer, "
                                f"label, category), found {len(parts)}: {line[:80]!r}")
        rows.append(_mctaco_row(len(rows), *parts, where=f"{path}:{lineno}"))
    return rows


def read_mctaco_parquet(path):
    """A parquet with the five columns; label as int (0 no, 1 yes) or "yes"/"no"; category as its name or as a
    Hugging Face ClassLabel int (names taken from the file's own `huggingface` schema metadata)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = set(MCTACO_COLUMNS) - set(table.column_names)
    if missing:
        raise ResourceError(f"{path}: expected columns {', '.join(MCTACO_COLUMNS)}; missing {sorted(missing)}")
    names = {}
    meta = (table.schema.metadata or {}).get(b"huggingface")
    if meta:
        feats = json.loads(meta).get("info", {}).get("features", {})
        for col in ("label", "category"):
            if isinstance(feats.get(col), dict) and feats[col].get("_type") == "ClassLabel":
                names[col] = feats[col]["names"]
    if names.get("label") not in (None, list(MCTACO_LABELS)):
        raise ResourceError(f"{path}: label ClassLabel names {names['label']}, expected {list(MCTACO_LABELS)}")
    cols = table.to_pydict()
    rows = []
    for i in range(table.num_rows):
        cat = cols["category"][i]
        if isinstance(cat, int):
            if "category" not in names:
                raise ResourceError(f"{path}: category is an integer but the file names no ClassLabel names")
            cat = names["category"][cat]
        rows.append(_mctaco_row(i, cols["sentence"][i], cols["question"][i], cols["answer"][i], cols["label"][i],
                                cat, where=str(path)))
    return rows


def read_mctaco_file(path):
    path = Path(path)
    if not path.exists():
        raise ResourceError(f"{path}: file not found")
    if path.suffix == ".parquet":
        return read_mctaco_parquet(path)
    if path.suffix in (".tsv", ".txt"):
        return read_mctaco_tsv(path)
    raise ResourceError(f"{path}: expected a .parquet or an MC-TACO .tsv file, found suffix {path.suffix!r}")


def mctaco_rows_to_parquet_bytes(rows):
    """The cache's MC-TACO parquet: columns sentence, question, answer (string), label (int64, 0 no / 1 yes, the
    index into lm-eval's doc_to_choice), category (string name), in dataset order; no idx column (idx = row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "sentence": pa.array([r["sentence"] for r in rows], pa.string()),
        "question": pa.array([r["question"] for r in rows], pa.string()),
        "answer": pa.array([r["answer"] for r in rows], pa.string()),
        "label": pa.array([r["label"] for r in rows], pa.int64()),
        "category": pa.array([r["category"] for r in rows], pa.string()),
    })
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False, store_schema=False)
    return buf.getvalue()


# ---- manifest ----------------------------------------------------------------------------------------------

def manifest_path(cache):
    return Path(cache) / MANIFEST


def load_manifest(cache):
    path = manifest_path(cache)
    if not path.exists():
        return {"resources": {}}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ResourceError(f"{path}: not valid JSON ({e}); delete it and run prepare.py again")


def save_manifest(cache, manifest):
    atomic_write_json(manifest_path(cache), manifest)


def verify_resource_files(cache, rid, manifest=None):
    """Re-hash every file the manifest lists for resource `rid`; raise naming the first bad one."""
    manifest = manifest or load_manifest(cache)
    entry = manifest["resources"].get(rid)
    if entry is None:
        raise ResourceError(f"{Path(cache) / MANIFEST}: resource {rid!r} is not prepared; "
                            f"run: python prepare.py --cache {cache} (see README)")
    for rel, meta in sorted(entry["files"].items()):
        path = Path(cache) / rel
        if not path.exists():
            raise ResourceError(f"{path}: missing (resource {rid}); run: python prepare.py --cache {cache}")
        if path.stat().st_size != meta["size"] or sha256_file(path) != meta["sha256"]:
            raise ResourceError(f"{path}: bytes changed since prepare (resource {rid}, expected sha256 "
                                f"{meta['sha256']}); delete it and run: python prepare.py --cache {cache}")
    return entry


def fail(message, code=2):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)
