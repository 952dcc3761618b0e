"""report.html against the evidence: the page is derived (report.py builds it from O alone), so every number it
shows must be one the evidence holds. Parsed with html.parser (bounded: the file size limit of reading.py), never
rendered or executed. Row "report.html (run id, every number cell)": the page's evidence-run-id meta is the
manifest's run id; every element with data-value has a data-src "<exp>/<file>#<dotted.path>" (or
"<exp>/records.jsonl#<line>.<path>", line counted from 1) naming a value of the evidence equal to data-value; the
text shown in the cell is a rounding of that value (or "—" for null). Text outside data-value cells (headings,
labels, prose, plots) is not checked: a number a reader relies on should be read from a cell."""
import math
import re
from html.parser import HTMLParser

from evidence_audit.checks import ARITHMETIC, MISSING, same, short
from evidence_audit.reading import Unreadable, parse_strict, read_json, read_jsonl, read_text

CHECK = "report.html (run id, every number cell)"
MAX_CELLS = 200_000
MAX_PAGE_BYTES = 256 << 20      # a full run's page is a few MB (plots embedded)
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class Page(HTMLParser):
    """The run id meta and every data-value cell: (data-src, data-value, shown text, line)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.run_ids, self.cells, self.stack = [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "meta" and a.get("name") == "evidence-run-id":
            self.run_ids.append(a.get("content"))
        if "data-value" in a:
            if len(self.cells) >= MAX_CELLS:
                raise Unreadable(f"report.html: line {self.getpos()[0]}: more than {MAX_CELLS} number cells")
            self.cells.append({"src": a.get("data-src"), "value": a["data-value"], "text": "",
                               "line": self.getpos()[0], "tag": tag})
            self.stack.append(self.cells[-1])

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1]["tag"] == tag:
            self.stack.pop()

    def handle_data(self, data):
        for c in self.stack:
            c["text"] += data


def is_rounding(text, value):
    """The shown text is `value` rounded: every number in it (a list shows one per element) is within half a unit
    of its last shown digit of the matching value; null shows as "—"."""
    values = value if isinstance(value, list) else [value]
    if value is None:
        return text.strip() == "—"
    shown = NUMBER.findall(text)
    if len(shown) != len(values) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            for v in values):
        return False
    return all(close(s, v) for s, v in zip(shown, values))


def close(s, v):
    mantissa, _, exp = s.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    half_unit = 0.5 * 10.0 ** (int(exp or 0) - decimals)
    x = float(s)
    return math.isfinite(x) and abs(x - v) <= half_unit * (1 + 1e-9) + 1e-12 * abs(v)


class Evidence:
    """The parsed evidence files a page refers to, each read once (strictly)."""

    def __init__(self, out):
        self.out, self.cache = out, {}

    def value(self, src):
        """The value `src` names, or (MISSING, why)."""
        if not isinstance(src, str) or "#" not in src:
            return MISSING, f"data-src {short(src)} is not '<exp>/<file>#<path>'"
        rel, _, path = src.partition("#")
        parts = rel.split("/")
        if len(parts) != 2 or parts[0] == "private" or any(p in ("", ".", "..") or p.startswith(".") for p in parts) \
                or not parts[1].endswith((".json", ".jsonl")):
            return MISSING, f"data-src {short(src)} does not name an evidence file of an experiment"
        if rel not in self.cache:
            p = self.out / rel
            self.cache[rel] = (read_jsonl(p) if rel.endswith(".jsonl") else read_json(p)) if p.is_file() else None
        obj = self.cache[rel]
        if obj is None:
            return MISSING, f"data-src {short(src)}: {rel} does not exist"
        keys = path.split(".")
        if rel.endswith(".jsonl"):
            if not keys[0].isdigit() or not 1 <= int(keys[0]) <= len(obj):
                return MISSING, f"data-src {short(src)}: no line {short(keys[0])} in {rel}"
            obj, keys = obj[int(keys[0]) - 1], keys[1:]
        for k in keys:
            if isinstance(obj, dict) and k in obj:
                obj = obj[k]
            elif isinstance(obj, list) and k.isdigit() and int(k) < len(obj):
                obj = obj[int(k)]
            else:
                return MISSING, f"data-src {short(src)}: no such value in {rel}"
        return obj, ""


def report_html_check(C, out, run_id, manifest):
    """Row CHECK (see the module docstring). A page missing while the manifest lists it is named by the manifest
    level; a manifest that does not list report.html fails here (run.py always writes it)."""
    path = out / "report.html"
    if not path.is_file():
        C.add("-", ARITHMETIC, CHECK, 0, [] if manifest is not None and "report.html" in manifest["files"] else
              ["report.html: missing (run.py writes it from the evidence)"])
        return
    page = Page()
    try:
        page.feed(read_text(path, limit=MAX_PAGE_BYTES))
        page.close()
    except (AssertionError, ValueError) as e:       # html.parser's own complaints about malformed markup
        raise Unreadable(f"{path}: unparseable HTML ({short(str(e), 80)})")
    bad = []
    if manifest is not None and "report.html" not in manifest["files"]:
        bad.append("report.html: not listed in MANIFEST.json")
    if run_id is not None and page.run_ids != [run_id]:
        bad.append(f"report.html meta evidence-run-id: {short(page.run_ids)}, MANIFEST.json run_id is {run_id!r}")
    ev = Evidence(out)
    for c in page.cells:
        bad += cell_problems(ev, c)
    C.add("-", ARITHMETIC, CHECK, len(page.cells) + 1, bad,
          note="the page is derived: every number must be the evidence's")


def cell_problems(ev, c):
    where = f"report.html line {c['line']}"
    try:
        shown = parse_strict(c["value"], f"{where} data-value")
    except Unreadable as e:
        return [str(e)]
    recorded, why = ev.value(c["src"])
    if recorded is MISSING:
        return [f"{where}: {why}"]
    if not same(shown, recorded):
        return [f"{where} data-value: {short(shown)}, but {c['src']} holds {short(recorded)}"]
    if not is_rounding(c["text"], recorded):
        return [f"{where}: shows {short(c['text'].strip())}, which is not a rounding of {short(recorded)} "
                f"({c['src']})"]
    return []
