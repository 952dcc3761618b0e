"""Pinned resources: the lock, hashing, atomic writes, the data schemas, and the cache manifest.

The bottom layer (it imports nothing from this repository). prepare.py fills the cache with it; run.py and bench.py
read the cache through it (`prepared_manifest`, `verified_model`, `verified_rows`: nothing the manifest does not
vouch for is read). The audit (audit.py, evidence_audit/) deliberately re-implements the little it needs instead of importing
this module.

Limits: verification is by sha256 of bytes (files) or of a canonical text rendering (data content); it says
nothing about whether the pinned bytes are the "right" ones beyond matching the lock.
"""
import hashlib
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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


# ---- data schemas ----------------------------------------------------------------------------------------------
# A data lock entry's "schema" says what its rows look like: absent means SST-2 (sentence, label, idx), "mctaco"
# means MC-TACO (sentence, question, answer, label, category). Every data step below (read, check, hash, write the
# cache parquet, verify against the lock) is one function driven by the entry's Schema: the per-schema parts come
# first, then the table (SCHEMAS), then the steps. Rows are dicts with "idx" 0..N-1 (lm-eval's doc_id is the row
# position, so the two must coincide) and "label" 0/1, plus the schema's own fields. A new schema is one more
# entry in the table: its reader(s), field check, canonical text and cache parquet columns.

@dataclass(frozen=True)
class Schema:
    name: str
    canonical_text: Callable      # rows -> the text whose sha256 identifies the data, whatever the file format
    check_fields: Callable        # (row, where) -> None or ResourceError: the fields besides idx and label
    label_names: tuple            # label_counts keys, by label code
    label_hint: str               # what a label must be, for error messages
    parquet_columns: tuple        # the cache parquet: ((column, pyarrow type name), ...) in file order
    read_tsv: Callable            # the release's text format: path -> rows
    read_parquet: Callable        # a hub (or cache) parquet: path -> rows
    tsv_format: str               # imported_from "format" of an imported .tsv copy
    file_kinds: str               # what a data file may be, for error messages
    extra_counts: tuple = ()      # ((fact key, noun, rows -> int), ...): further counts the lock pins and checks


MAX_DATA_FILE_BYTES = 1 << 30    # a data file larger than 1 GiB is refused before it is read (GLUE SST-2: 0.1 MB)


def check_size(path):
    if not isinstance(path, (str, os.PathLike)):
        return                          # an in-memory buffer (tests, the cache's own bytes): already bounded
    size = Path(path).stat().st_size
    if size > MAX_DATA_FILE_BYTES:
        raise ResourceError(f"{path}: {size} bytes, more than the {MAX_DATA_FILE_BYTES} bytes a data file may have")


def tsv_lines(path):
    """The lines of an untrusted UTF-8 text file, split on \\n only (a sentence may hold any other character):
    size bounded first, then each line decoded on its own so that a bad byte is named by line and column."""
    check_size(path)
    with open(path, "rb") as f:
        raw = f.read().split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    lines = []
    for lineno, b in enumerate(raw, start=1):
        try:
            line = b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ResourceError(f"{path}:{lineno}: not valid UTF-8 (byte {b[e.start]:#04x} at column {e.start + 1})")
        if lineno == 1 and line.startswith("\ufeff"):
            raise ResourceError(f"{path}:1: starts with a UTF-8 byte-order mark; expected none")
        lines.append(line)
    return lines


def check_lf(path, lineno, line):
    if line.endswith("\r"):
        raise ResourceError(f"{path}:{lineno}: line ends with CR (CRLF line endings); expected LF-only line endings "
                            "as in the published files")


# ---- SST-2 (GLUE): sentence, label, idx -------------------------------------------------------------------------

def sst2_canonical_text(rows):
    """The rendering that identifies SST-2-shaped data, independent of file format.

    One UTF-8 line f"{idx}\\t{label}\\t{sentence}\\n" per row in idx order, sentence exactly as stored."""
    return "".join(f"{r['idx']}\t{r['label']}\t{r['sentence']}\n" for r in rows)


def check_sst2_fields(r, where):
    if not isinstance(r["sentence"], str) or "\t" in r["sentence"] or "\n" in r["sentence"]:
        raise ResourceError(f"{where}: sentence must be a string without tabs or newlines")


def read_glue_tsv(path):
    """GLUE SST-2 dev.tsv: header `sentence\\tlabel`, LF line endings, row order is idx order. Strict: one clear
    error per defect, naming the line and the field."""
    lines = tsv_lines(path)
    if not lines or lines[0].rstrip("\r") != "sentence\tlabel":
        found = lines[0][:60] if lines else "an empty file"
        raise ResourceError(f"{path}:1: expected header 'sentence<TAB>label', found {found!r}")
    rows = []
    for lineno, line in enumerate(lines, start=1):
        check_lf(path, lineno, line)
        if lineno == 1:
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise ResourceError(f"{path}:{lineno}: expected 2 TAB-separated fields (sentence, label), found "
                                f"{len(parts)}: {line[:80]!r}")
        if parts[1] not in ("0", "1"):
            raise ResourceError(f"{path}:{lineno}: field 2 (label): expected 0 or 1, found {parts[1][:40]!r}")
        if not parts[0].strip():
            raise ResourceError(f"{path}:{lineno}: field 1 (sentence): empty")
        rows.append({"idx": lineno - 2, "label": int(parts[1]), "sentence": parts[0]})
    return rows


def read_parquet_rows(path):
    """The hub's (or the cache's, or a user's) SST-2 parquet: columns sentence, label and (optional: row position
    otherwise) idx, in any order; rows sorted by idx. Every value is checked by type, naming the row and field."""
    import pyarrow.parquet as pq

    check_size(path)
    table = pq.read_table(path)
    missing = {"sentence", "label"} - set(table.column_names)
    if missing:
        raise ResourceError(f"{path}: expected columns sentence, label (and idx); missing {sorted(missing)}")
    cols = table.to_pydict()
    idxs = cols.get("idx", list(range(table.num_rows)))
    rows = []
    for pos, (s, lab, i) in enumerate(zip(cols["sentence"], cols["label"], idxs)):
        where = f"{path}: row {pos}"
        if not isinstance(i, int) or isinstance(i, bool):
            raise ResourceError(f"{where}: field idx: expected an integer, found {i!r}")
        if not isinstance(lab, int) or isinstance(lab, bool) or lab not in (0, 1):
            raise ResourceError(f"{where} (idx {i}): field label: expected 0 or 1, found {lab!r}")
        if not isinstance(s, str) or not s.strip():
            raise ResourceError(f"{where} (idx {i}): field sentence: expected a non-empty string, found {s!r}")
        rows.append({"idx": i, "label": lab, "sentence": s})
    return sorted(rows, key=lambda r: r["idx"])


def duplicate_problem(rows, key=lambda r: r["sentence"]):
    """None, or which two rows hold the same text (a user import refuses duplicates: most likely a copy error, and
    two items with one text make a per-item comparison ambiguous)."""
    seen = {}
    for r in rows:
        first = seen.setdefault(key(r), r["idx"])
        if first != r["idx"]:
            return f"idx {r['idx']}: field sentence duplicates idx {first}"
    return None


# ---- MC-TACO: sentence, question, answer, label, category ------------------------------------------------------
# One row per (question, candidate answer), as lm-eval's mc_taco task reads them (doc_to_target: label -> an index
# into doc_to_choice ["no", "yes"]). Rows are identified by their position; a question by sha256 of (sentence,
# question). The cache parquet has no idx column (idx = row position).

MCTACO_COLUMNS = ("sentence", "question", "answer", "label", "category")
MCTACO_LABELS = ("no", "yes")            # label 0 = "no" (implausible), 1 = "yes" (plausible): doc_to_choice order
MCTACO_CATEGORIES = ("Event Duration", "Event Ordering", "Frequency", "Typical Time", "Stationarity")
MCTACO_TEXT_FIELDS = ("sentence", "question", "answer")


def mctaco_canonical_text(rows):
    """The rendering that identifies MC-TACO-shaped data, independent of file format: the one whose sha256 is
    pinned for the authors' files (resources.lock.json's mc-taco and mc-taco-test content_sha256), so a file in any
    format is recognised by the hash of the same text.

    One UTF-8 line f"{idx}\\t{sentence}\\t{question}\\t{answer}\\t{label_name}\\t{category}\\n" per row in idx
    order, idx = 0-based row (line) number, label_name "no"/"yes", category its name, texts exactly as stored.
    Names, not codes: an authors' TSV with "yes"/"no" and a hub parquet with ClassLabel ints render to the same
    lines when they hold the same data.
    """
    return "".join(f"{r['idx']}\t{r['sentence']}\t{r['question']}\t{r['answer']}\t{MCTACO_LABELS[r['label']]}"
                   f"\t{r['category']}\n" for r in rows)


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


def check_mctaco_fields(r, where):
    for k in MCTACO_TEXT_FIELDS:
        v = r[k]
        if not isinstance(v, str) or not v or "\t" in v or "\n" in v or "\r" in v:
            raise ResourceError(f"{where}: field {k}: expected a non-empty string without tabs or newlines, found "
                                f"{str(v)[:40]!r}")
    if r["category"] not in MCTACO_CATEGORIES:
        raise ResourceError(f"{where}: field category: {str(r['category'])[:40]!r} is not one of "
                            f"{', '.join(MCTACO_CATEGORIES)}")


def _mctaco_row(idx, sentence, question, answer, label, category, where):
    if isinstance(label, str):
        if label not in MCTACO_LABELS:
            raise ResourceError(f"{where}: idx {idx}: label {label!r} is not 'yes' or 'no'")
        label = MCTACO_LABELS.index(label)
    return {"idx": idx, "sentence": sentence, "question": question, "answer": answer, "label": int(label),
            "category": category}


def read_mctaco_tsv(path):
    """The MC-TACO authors' file format (CogComp/MCTACO dataset/dev_3783.tsv, test_9442.tsv): no header, LF line
    endings, five TAB-separated fields per line, no quoting: sentence, question, answer, label ("yes"/"no"),
    category. Strict: a header line, CRLF, a missing field, a wrong label word, an empty text or an unknown
    category is refused on one line naming the line and field."""
    lines = tsv_lines(path)
    if not lines:
        raise ResourceError(f"{path}: empty file; expected MC-TACO rows (5 TAB-separated fields per line)")
    rows = []
    for lineno, line in enumerate(lines, start=1):
        check_lf(path, lineno, line)
        parts = line.split("\t")
        if len(parts) != 5:
            raise ResourceError(f"{path}:{lineno}: expected 5 TAB-separated fields (sentence, question, answer, "
                                f"label, category), found {len(parts)}: {line[:80]!r}")
        if lineno == 1 and parts[3] == "label":
            raise ResourceError(f"{path}:1: a header line ({line[:60]!r}); the authors' files have none: every "
                                "line is a row")
        if parts[3] not in MCTACO_LABELS:
            raise ResourceError(f"{path}:{lineno}: field 4 (label): expected 'yes' or 'no', found {parts[3][:40]!r}")
        row = _mctaco_row(len(rows), *parts, where=f"{path}:{lineno}")
        check_mctaco_fields(row, f"{path}:{lineno}")
        rows.append(row)
    return rows


def classlabel_names(table):
    """{column: names} for the columns the file's own `huggingface` schema metadata declares as ClassLabel."""
    meta = (table.schema.metadata or {}).get(b"huggingface")
    feats = json.loads(meta).get("info", {}).get("features", {}) if meta else {}
    return {col: f["names"] for col, f in feats.items() if isinstance(f, dict) and f.get("_type") == "ClassLabel"}


def mctaco_parquet_mapping(path):
    """How read_mctaco_parquet turns the file's label and category columns into names, one phrase each: the file's
    own ClassLabel names, or (ints without names) the known names of the hub's mc_taco features, or strings as
    stored. prepare.py prints it and records it in the manifest ("say so")."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    names = classlabel_names(pq.read_table(path, columns=[]))
    out = {}
    for col, known in (("label", MCTACO_LABELS), ("category", MCTACO_CATEGORIES)):
        kind = str(schema.field(col).type) if col in schema.names else "missing"
        if kind.startswith("int"):
            src = "the file's own ClassLabel names" if col in names else "the hub mc_taco features' known names " \
                                                                         "(the file carries none)"
            out[col] = f"{kind} codes mapped with {src}: {list(names.get(col, known))}"
        else:
            out[col] = f"{kind} values read as names"
    return out


def read_mctaco_parquet(path):
    """A parquet with the five columns; label as int (0 no, 1 yes) or "yes"/"no"; category as its name or as a
    Hugging Face ClassLabel int, mapped with the names in the file's own `huggingface` schema metadata or, where
    the file carries none, the known names of the hub's mc_taco features (MCTACO_LABELS, MCTACO_CATEGORIES: the
    order of its ClassLabel declarations). Rows in file order; every value checked, naming the row and field."""
    import pyarrow.parquet as pq

    check_size(path)
    table = pq.read_table(path)
    missing = set(MCTACO_COLUMNS) - set(table.column_names)
    if missing:
        raise ResourceError(f"{path}: expected columns {', '.join(MCTACO_COLUMNS)}; missing {sorted(missing)}")
    names = classlabel_names(table)
    if names.get("label") not in (None, list(MCTACO_LABELS)):
        raise ResourceError(f"{path}: label ClassLabel names {names['label']}, expected {list(MCTACO_LABELS)}")
    categories = names.get("category", list(MCTACO_CATEGORIES))
    cols = table.to_pydict()
    rows = []
    for i in range(table.num_rows):
        where = f"{path}: row {i}"
        cat = cols["category"][i]
        if isinstance(cat, int) and not isinstance(cat, bool):
            if not 0 <= cat < len(categories):
                raise ResourceError(f"{where}: field category: code {cat} outside 0..{len(categories) - 1}")
            cat = categories[cat]
        lab = cols["label"][i]
        if isinstance(lab, bool) or not (lab in (0, 1) or lab in MCTACO_LABELS):
            raise ResourceError(f"{where}: field label: expected 0/1 or 'no'/'yes', found {lab!r}")
        row = _mctaco_row(i, cols["sentence"][i], cols["question"][i], cols["answer"][i], lab, cat, where=where)
        check_mctaco_fields(row, where)
        rows.append(row)
    return rows


# ---- the schema table ------------------------------------------------------------------------------------------

SST2 = Schema(
    name="sst2", canonical_text=sst2_canonical_text, check_fields=check_sst2_fields,
    label_names=("0", "1"), label_hint="0 or 1",
    parquet_columns=(("sentence", "string"), ("label", "int64"), ("idx", "int32")),
    read_tsv=read_glue_tsv, read_parquet=read_parquet_rows, tsv_format="glue-dev-tsv",
    file_kinds="a .parquet (hub) or .tsv (GLUE dev.tsv)")

MCTACO = Schema(
    name="mctaco", canonical_text=mctaco_canonical_text, check_fields=check_mctaco_fields,
    label_names=MCTACO_LABELS, label_hint="0/1 ('no'/'yes')",
    parquet_columns=(("sentence", "string"), ("question", "string"), ("answer", "string"), ("label", "int64"),
                     ("category", "string")),
    read_tsv=read_mctaco_tsv, read_parquet=read_mctaco_parquet, tsv_format="mctaco-authors-tsv",
    file_kinds="a .parquet or an MC-TACO authors' .tsv",
    extra_counts=(("n_questions", "questions", lambda rows: len(mctaco_questions(rows))),))

SCHEMAS = {s.name: s for s in (SST2, MCTACO)}


# ---- the steps, one function each, driven by the schema -------------------------------------------------------
# `schema` defaults to SST2, the schema of lock entries that name none; verify_rows takes the entry's own.

def schema_of(entry):
    """The Schema of a data lock (or manifest) entry; an entry without "schema" is SST-2."""
    name = entry.get("schema", "sst2")
    if name not in SCHEMAS:
        raise ResourceError(f"data schema {name!r} is not one of {', '.join(SCHEMAS)}")
    return SCHEMAS[name]


def content_sha256(rows, schema=SST2):
    return sha256_bytes(schema.canonical_text(rows).encode("utf-8"))


def row_hash16(row, schema=SST2):
    return content_sha256([row], schema)[:16]


def check_rows_shape(rows, where, schema=SST2):
    for pos, r in enumerate(rows):
        if r["idx"] != pos:
            raise ResourceError(f"{where}: row {pos}: expected idx {pos}, found {r['idx']}")
        if r["label"] not in (0, 1):
            raise ResourceError(f"{where}: idx {pos}: expected label {schema.label_hint}, found {r['label']!r}")
        schema.check_fields(r, f"{where}: idx {pos}")


def label_counts(rows, schema=SST2):
    return {name: sum(r["label"] == k for r in rows) for k, name in enumerate(schema.label_names)}


def content_facts(rows, schema=SST2):
    """What the lock pins about a data copy: content hash, counts, per-row hash prefixes."""
    facts = {"content_sha256": content_sha256(rows, schema), "rows": len(rows),
             "label_counts": label_counts(rows, schema), "row_sha256_16": [row_hash16(r, schema) for r in rows]}
    facts.update({key: count(rows) for key, _, count in schema.extra_counts})
    return facts


def verify_rows(rows, entry, where, schema=None):
    """Check a data copy against its lock entry: shape, counts the entry pins, then the canonical content hash."""
    schema = schema or schema_of(entry)
    check_rows_shape(rows, where, schema)
    if entry.get("rows") is not None and len(rows) != entry["rows"]:
        raise ResourceError(f"{where}: expected {entry['rows']} rows, found {len(rows)}")
    counts = label_counts(rows, schema)
    if entry.get("label_counts") is not None and counts != entry["label_counts"]:
        raise ResourceError(f"{where}: expected label counts {entry['label_counts']}, found {counts}"
                            f"{first_difference_hint(rows, entry, schema)}")
    for key, noun, count in schema.extra_counts:
        if entry.get(key) is not None and count(rows) != entry[key]:
            raise ResourceError(f"{where}: expected {entry[key]} {noun}, found {count(rows)}"
                                f"{first_difference_hint(rows, entry, schema)}")
    if entry.get("content_sha256") is None:
        raise ResourceError(f"{where}: the lock has no content_sha256 for this resource; nothing to verify against "
                            f"(prepare.py --pin records it after the file hashes are checked)")
    found = content_sha256(rows, schema)
    if found != entry["content_sha256"]:
        raise ResourceError(f"{where}: canonical content sha256 mismatch: expected {entry['content_sha256']}, "
                            f"found {found}{first_difference_hint(rows, entry, schema)}")


def first_difference_hint(rows, entry, schema):
    """Name the first differing idx by comparing per-row hash prefixes, when the lock carries them."""
    row_hashes = entry.get("row_sha256_16")
    if not row_hashes:
        return " (the lock has no per-row hashes for this resource, so the differing idx cannot be named)"
    for r in rows:
        if r["idx"] >= len(row_hashes) or row_hash16(r, schema) != row_hashes[r["idx"]]:
            return f" (first differing row: idx {r['idx']})"
    return ""


def read_data_file(path, schema=SST2):
    """A local copy: a .parquet (hub layout) or the schema's release .tsv."""
    path = Path(path)
    if not path.exists():
        raise ResourceError(f"{path}: file not found")
    if path.suffix == ".parquet":
        return schema.read_parquet(path)
    if path.suffix in (".tsv", ".txt"):
        return schema.read_tsv(path)
    if path.suffix.lower() == ".csv":
        raise ResourceError(f"{path}: a CSV file; save it as a TSV with the header sentence<TAB>label, or as a "
                            "parquet, and name that file")
    raise ResourceError(f"{path}: expected {schema.file_kinds} file, found suffix {path.suffix!r}")


def sniff_schema(path):
    """The Schema a data file is written in: a parquet by its columns (question and answer: MC-TACO), a text file
    by its first line (GLUE's header 'sentence<TAB>label': SST-2; five TAB-separated fields: MC-TACO)."""
    path = Path(path)
    if not path.is_file():
        raise ResourceError(f"{path}: file not found")
    check_size(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            names = set(pq.read_schema(path).names)
        except (ValueError, OSError) as e:
            raise ResourceError(f"{path}: not a readable parquet file ({type(e).__name__}: {str(e)[:120]})")
        return MCTACO if {"question", "answer"} <= names else SST2
    if path.suffix.lower() == ".csv":
        raise ResourceError(f"{path}: a CSV file; save it as a TSV with the header sentence<TAB>label (SST-2) or in "
                            "the MC-TACO authors' TSV format, or as a parquet, and name that file")
    if path.suffix not in (".tsv", ".txt"):
        raise ResourceError(f"{path}: expected a .parquet or .tsv file, found suffix {path.suffix!r}")
    with open(path, "rb") as f:
        first = f.read(1 << 16).split(b"\n", 1)[0].rstrip(b"\r")
    if first == b"sentence\tlabel":
        return SST2
    n_fields = first.count(b"\t") + 1
    if n_fields == 5:
        return MCTACO
    raise ResourceError(f"{path}:1: neither a GLUE SST-2 dev.tsv (header 'sentence<TAB>label') nor an MC-TACO "
                        f"authors' file (5 TAB-separated fields, no header): found {n_fields} "
                        f"field(s): {first[:60].decode('utf-8', 'replace')!r}")


def rows_to_parquet_bytes(rows, schema=SST2):
    """The cache's parquet: the schema's columns in its order, zstd, no statistics, no stored (pandas) schema, so
    the same rows always give the same bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({col: pa.array([r[col] for r in rows], getattr(pa, type_name)())
                      for col, type_name in schema.parquet_columns})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False, store_schema=False)
    return buf.getvalue()


# ---- the user lock: data imported with prepare.py --data-file FILE --name NAME ----------------------------------
# A user's own data is pinned exactly like the lock's: canonical content sha256, counts, per-row hash prefixes, the
# imported file's sha256. Its record lives inside the cache (CACHE/user.lock.json), beside the data it vouches for,
# never in resources.lock.json (the pinned lock is a committed fact of this repository; a user import must not
# change it, nor mark the checkout dirty). A NAME may not be a pinned id.

USER_LOCK = "user.lock.json"
NAME_RULE = r"[a-z0-9][a-z0-9._-]{0,63}"


def user_lock_path(cache):
    return Path(cache) / USER_LOCK


def load_user_lock(cache):
    """CACHE/user.lock.json ({"data": {name: entry}}), or an empty one; a damaged file is refused on one line."""
    path = user_lock_path(cache)
    if not path.exists():
        return {"_about": "Data imported by prepare.py --data-file FILE --name NAME into this cache, pinned by "
                          "canonical content like resources.lock.json's data (which it never edits).", "data": {}}
    try:
        lock = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ResourceError(f"{path}: not valid JSON ({str(e)[:120]}); restore it or remove the entries it held "
                            "(and their manifest entries) by preparing a new cache")
    if not isinstance(lock, dict) or not isinstance(lock.get("data"), dict) or \
            not all(isinstance(e, dict) and isinstance(e.get("content_sha256"), str) for e in lock["data"].values()):
        raise ResourceError(f"{path}: wrong shape: expected {{\"data\": {{name: {{\"content_sha256\": ...}}}}}}")
    return lock


def data_lock_entry(cache, rid, lock=None):
    """(the lock entry of data `rid`, "pinned" or "user"): resources.lock.json first, then CACHE/user.lock.json;
    (None, None) if neither lists it."""
    lock = lock if lock is not None else load_lock()
    if rid in lock.get("data", {}):
        return lock["data"][rid], "pinned"
    user = load_user_lock(cache)["data"]
    return (user[rid], "user") if rid in user else (None, None)


def data_parquet(cache, rid, entry):
    """The cache parquet of data `rid`: data/<rid>/<split>.parquet (a manifest entry without "split": validation)."""
    return Path(cache) / "data" / rid / f"{entry.get('split', 'validation')}.parquet"


def verified_data(cache, data_id, manifest=None):
    """(parquet, manifest entry) of a data resource: its files re-hashed through the manifest and its content hash
    checked against the lock that pins it (resources.lock.json, or CACHE/user.lock.json for a --name import)."""
    parquet, entry, _ = verified_data_and_lock(cache, data_id, manifest)
    return parquet, entry


def verified_rows(cache, data_id, manifest=None):
    """(parquet, manifest entry, rows): verified_data, then the rows read in the resource's schema and re-hashed
    against the lock's facts (verify_rows: shape, counts, canonical content hash). run.py calls this once per data
    resource of a run; the experiments read what it verified."""
    parquet, entry, lock_entry = verified_data_and_lock(cache, data_id, manifest)
    schema = schema_of(entry)
    rows = schema.read_parquet(parquet)
    verify_rows(rows, lock_entry, str(parquet), schema)
    return parquet, entry, rows


def prepared_manifest(cache):
    """The cache's manifest, or ResourceError naming the command that prepares one."""
    cache = Path(cache)
    if not (cache / MANIFEST).exists():
        near = [p for p in similar_siblings(cache) if (p / MANIFEST).is_file()]
        if not cache.exists() and near:        # a typo of a prepared cache: not a reason to prepare another
            raise ResourceError(f"{cache}: no such directory; did you mean --cache {near[0]} (a prepared cache)?")
        raise ResourceError(f"{cache / MANIFEST}: no prepared cache here; run: python prepare.py --cache {cache}")
    return load_manifest(cache)


def similar_siblings(path, most=1000):
    """Existing directories beside `path` whose names are close to its name (a typo's likely meaning), closest
    first; at most `most` entries of the parent are looked at."""
    import difflib

    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        names = [p.name for _, p in zip(range(most), parent.iterdir()) if p.is_dir()]
    except OSError:
        return []
    return [parent / n for n in difflib.get_close_matches(path.name, names, n=3, cutoff=0.6) if n != path.name]


def verified_data_and_lock(cache, data_id, manifest=None):
    """(parquet, manifest entry, lock entry): the checks of verified_data."""
    manifest = manifest or load_manifest(cache)
    entry = verify_resource_files(cache, data_id, manifest)
    if entry["kind"] != "data":
        raise ResourceError(f"{Path(cache) / MANIFEST}: {data_id} is a {entry['kind']} entry, not data")
    lock = None
    if entry.get("lock") is not None:      # prepared with prepare.py --lock FILE: checked against that lock
        try:
            lock = load_lock(entry["lock"])
        except (OSError, ValueError) as e:
            raise ResourceError(f"{Path(cache) / MANIFEST}: data {data_id!r} was prepared with the lock "
                                f"{entry['lock']}, which cannot be read ({e}); run prepare.py again") from None
    lock_entry, which = data_lock_entry(cache, data_id, lock)
    if lock_entry is None:
        raise ResourceError(f"{Path(cache) / MANIFEST}: data {data_id!r} is prepared, but neither "
                            f"resources.lock.json nor {user_lock_path(cache)} lists it; run prepare.py again")
    if lock_entry.get("content_sha256") != entry["content_sha256"]:
        raise ResourceError(f"{data_parquet(cache, data_id, entry)}: prepared with content sha256 "
                            f"{entry['content_sha256']}, the {which} lock pins {lock_entry.get('content_sha256')}; "
                            f"run: python prepare.py --cache {cache}")
    parquet = data_parquet(cache, data_id, entry)
    if str(parquet.relative_to(cache)) not in entry["files"]:
        raise ResourceError(f"{parquet}: not listed in the manifest; run: python prepare.py --cache {cache}")
    return parquet, entry, lock_entry


# ---- manifest ----------------------------------------------------------------------------------------------

def manifest_path(cache):
    return Path(cache) / MANIFEST


def entry_shape_problem(rid, entry):
    """None if a manifest entry has the shape run.py and prepare.py read, else what is wrong (one phrase)."""
    if not isinstance(entry, dict):
        return f"resource {rid!r} is a {type(entry).__name__}, expected an object"
    if entry.get("kind") not in ("model", "data"):
        return f"resource {rid!r}: kind {entry.get('kind')!r}, expected 'model' or 'data'"
    if not isinstance(entry.get("source"), dict):
        return f"resource {rid!r}: source is missing or not an object"
    files = entry.get("files")
    if not isinstance(files, dict) or not files:
        return f"resource {rid!r}: files is missing, empty or not an object"
    for rel, meta in files.items():
        if not (isinstance(meta, dict) and isinstance(meta.get("sha256"), str) and len(meta["sha256"]) == 64
                and isinstance(meta.get("size"), int) and not isinstance(meta["size"], bool)):
            return f"resource {rid!r}: files[{rel!r}] must be {{\"sha256\": 64 hex digits, \"size\": int}}"
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            return f"resource {rid!r}: files[{rel!r}] is not a path inside the cache"
    if entry["kind"] == "data" and not isinstance(entry.get("content_sha256"), str):
        return f"resource {rid!r}: content_sha256 is missing or not a string"
    return None


def manifest_shape_problem(manifest):
    """None if a parsed manifest is {"resources": {id: entry}} with every entry well shaped, else the first problem."""
    if not isinstance(manifest, dict):
        return f"the top level is a {type(manifest).__name__}, expected an object with \"resources\""
    if not isinstance(manifest.get("resources"), dict):
        return "\"resources\" is missing or not an object"
    for rid, entry in sorted(manifest["resources"].items()):
        problem = entry_shape_problem(rid, entry)
        if problem:
            return problem
    return None


def load_manifest(cache):
    """The cache manifest, checked for shape: a file that does not parse, or parses to another shape, is refused on
    one line (prepare.py repairs it: prepare_manifest)."""
    path = manifest_path(cache)
    if not path.exists():
        return {"resources": {}}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ResourceError(f"{path}: not valid JSON ({str(e)[:120]}); run: python prepare.py --cache {cache} to "
                            "repair it")
    except OSError as e:
        raise ResourceError(f"{path}: cannot read it ({e.strerror or e})")
    problem = manifest_shape_problem(manifest)
    if problem:
        raise ResourceError(f"{path}: wrong shape: {problem}; run: python prepare.py --cache {cache} to repair it")
    return manifest


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


def verified_model(cache, model_id, manifest, local_model=None):
    """(model_dir, model_identity) of --model: a lock id re-hashed against the cache manifest, or an existing
    directory, checked and hashed file by file by `local_model(path) -> identity` (run.py passes
    local_model.local_identity: source "local", no lock entry; this module imports nothing of the repository)."""
    if local_model is not None and model_id and Path(model_id).is_dir():
        identity = local_model(model_id)
        return Path(identity["dir"]), identity
    model_entry = verify_resource_files(cache, model_id, manifest)
    model_dir = cache / "models" / model_id
    for path in (model_dir / "model.safetensors", model_dir / "tokenizer.json"):
        if str(path.relative_to(cache)) not in model_entry["files"]:
            raise ResourceError(f"{path}: not listed in the manifest; run: python prepare.py --cache {cache}")
    if model_entry["kind"] != "model":
        raise ResourceError(f"{cache / MANIFEST}: --model {model_id} is a {model_entry['kind']} entry; run: python "
                            f"prepare.py --cache {cache}")
    return model_dir, {
        "id": model_id, "dir": str(model_dir),
        "model_sha256": model_entry["files"][f"models/{model_id}/model.safetensors"]["sha256"],
        "tokenizer_sha256": model_entry["files"][f"models/{model_id}/tokenizer.json"]["sha256"],
        "source": model_entry["source"],
    }


def fail(message, code=2):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)
