"""--data FILE: a local copy of the evaluated split, as a list of rows (row i = lm-eval's doc_id i).

parquet (pyarrow, imported here only), jsonl (one JSON object per line, read strictly) or tsv (a header line, tab
separated, every value a string: compared with a document's values as str()). The file is bounded like every
evidence file (reading.MAX_FILE_BYTES)."""
import csv
import io
from pathlib import Path

from evidence_audit.reading import Unreadable, read_bytes, read_jsonl, read_text

SUFFIXES = (".parquet", ".jsonl", ".tsv")


def load_rows(path):
    """(rows, typed): the rows in file order, and whether their values are typed (parquet, jsonl) or strings
    (tsv). Raises Unreadable with one line for an unknown suffix, a bad line or an unreadable file."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise Unreadable(f"{path}: --data must be one of {', '.join(SUFFIXES)} (found {path.suffix or 'no suffix'})")
    if path.suffix == ".jsonl":
        rows = read_jsonl(path)
        for n, row in enumerate(rows, start=1):
            if not isinstance(row, dict):
                raise Unreadable(f"{path}: line {n}: expected a JSON object (one dataset row), found "
                                 f"{type(row).__name__}")
        return rows, True
    if path.suffix == ".tsv":
        reader = csv.reader(io.StringIO(read_text(path)), delimiter="\t", quoting=csv.QUOTE_NONE)
        lines = list(reader)
        if not lines:
            raise Unreadable(f"{path}: line 1: empty, expected a header line")
        header = lines[0]
        for n, line in enumerate(lines[1:], start=2):
            if len(line) != len(header):
                raise Unreadable(f"{path}: line {n}: {len(line)} fields, the header has {len(header)}")
        return [dict(zip(header, line)) for line in lines[1:]], False
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(read_bytes(path)))
    except (pa.ArrowException, OSError) as e:
        raise Unreadable(f"{path}: unreadable parquet ({str(e)[:120]})")
    return table.to_pylist(), True


def same_row(doc, row, typed):
    """The fields of a logged doc that differ from the dataset row: [(field, logged, data)]."""
    diffs = [(k, doc.get(k), row.get(k)) for k in dict.fromkeys([*doc, *row]) if k not in doc or k not in row]
    for k in doc:
        if k in row:
            a, b = (doc[k], row[k]) if typed else (str(doc[k]), row[k])
            if a != b or (typed and type(a) is not type(b)):
                diffs.append((k, doc[k], row[k]))
    return diffs
