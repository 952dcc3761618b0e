"""report.html against the evidence: the page is derived (report.py builds it from O alone), so what it shows must be
what the evidence holds. Parsed with html.parser (bounded: MAX_PAGE_BYTES, MAX_CELLS), never rendered or executed.
The audit imports neither the page builder (evidence_report/) nor matplotlib: it keeps its own whitelist of what the
builder writes (a builder that misreads the evidence is caught, not agreed with), and this check costs about 0.1 s
of CPU on a smoke run's page. A builder change that writes new markup must be added here too.

Row "report.html (run id, every number cell)" fails on:
- markup the builder never writes: an element outside ALLOWED (<script>, <iframe>, <object>, <link>, <svg>, ...), an
  attribute outside ATTRIBUTES (style=, on*= handlers, http-equiv, any other data-*), a link off the page (href not
  "#..."), an image that is not an embedded PNG (src not data:image/png;base64 of PNG bytes), a comment, a processing
  instruction, or a <style> other than the one stylesheet of the builder, in <head> (by sha256: STYLE_SHA256), so no
  CSS can add text (::after{content:...}) or hide a cell;
- the run id: the evidence-run-id meta, and the <title>, name another run than MANIFEST.json;
- a number cell (data-value): its data-src names "<exp>/<file>#<dotted.path>" (or "<exp>/records.jsonl#<line>.<path>",
  line from 1) holding a value equal to data-value; it lies inside that experiment's <section> and names the same
  file as the other number cells of its table column; its text is the value rounded and nothing else ("—" for null;
  a string shown as itself); its tooltip, if any, is the exact value; a cell with data-src and no data-value shows a
  JSON object of the evidence whole, as its exact JSON text;
- a derived cell with data-of (the MiB of a peak RSS): its text, recomputed from the value data-of names;
- a bare number (a cell whose whole text is a number or a [list] of numbers) without data-value: allowed only as an
  integer count in the tables the builder counts itself (DERIVED_TABLES); the environment table is compared row for
  row with environment.json instead;
- a decimal number (0.9062, 1e-05) anywhere else outside the checked cells: prose (inline elements joined, as a
  browser shows 0.<b>9062</b>), headings, captions, header cells, text cells, tooltips.

What it cannot catch: the pixels of a plot (a PNG is only checked to be one), an integer in prose, a number cell
pointed at another field of the same file holding an equal value (the builder's choice of field is not written
again here), an integer count of DERIVED_TABLES, a number inside a JSON-list text cell (["a", 0.9]), and omissions
(a row or a section left out). `python report.py --check O` catches all of these: it rebuilds the page from the
evidence and compares bytes, naming the first difference (report.py's code: the audit stays independent of it)."""
import base64
import binascii
import hashlib
import json
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from evidence_audit.checks import ARITHMETIC, MISSING, same, short
from evidence_audit.reading import Unreadable, parse_strict, read_json, read_jsonl, read_text

CHECK = "report.html (run id, every number cell)"
MAX_CELLS = 200_000
MAX_DEPTH = 256                 # open elements at once: every lookup walks them, so unbounded nesting costs n^2
MAX_PAGE_BYTES = 256 << 20      # a full run's page is a few MB (plots embedded)
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
BARE = re.compile(rf"{NUMBER.pattern}|\[\s*{NUMBER.pattern}(?:\s*,\s*{NUMBER.pattern})*\s*\]")
# a decimal or e-notation number standing alone (not part of a version such as 0.4.9.2 or of a word)
DECIMAL = re.compile(r"(?<![\w.])[-+]?(?:(?:\d+\.\d+|\.\d+)(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.])")

# What evidence_report writes, written again here on purpose (the audit does not import the builder).
ALLOWED = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "small", "a", "b", "code", "pre",
           "span", "div", "section", "details", "summary", "table", "caption", "thead", "tbody", "tr", "th", "td",
           "img"}
VOID = {"meta", "img"}
ATTRIBUTES = {"*": {"id", "class"}, "meta": {"charset", "name", "content"}, "a": {"href"}, "img": {"alt", "src"},
              "td": {"title", "data-src", "data-value", "data-of", "data-derive"}}
STYLE_SHA256 = "a3e5aaf05704562f82eeecee42392070196ab87d762998ed9877cdf4e673c88b"   # evidence_report.page.CSS
DERIVED_TABLES = re.compile(r"[\w.-]+-flipmatrix-[\w.-]+|harness-leaderboard")
DERIVATIONS = {"MiB": lambda v: f"{v / 2**20:.1f}"}
ENV_ROWS = (("run id", "run_id"), ("git commit", "git_commit"), ("git dirty", "git_dirty"),
            ("code sha256", "code_sha256"), ("python", "python"), ("platform", "platform"), ("cpu", "cpu"),
            ("cpu count", "cpu_count"), ("torch threads", "torch_threads"), ("command line", "command_line"))
PNG = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """The page as the checks need it: markup problems, the run id metas and title, the stylesheets, every table
    (id, enclosing section, rows of cells: tag, attributes, text, line) and the text outside tables."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems, self.run_ids, self.styles, self.tables, self.prose = [], [], [], [], []
        self.title, self.open, self.n_cells, self.current = None, [], 0, []    # current: the open tables

    def where(self):
        return f"report.html line {self.getpos()[0]} col {self.getpos()[1] + 1}"

    def inside(self, tag):
        return any(t == tag for t, _ in self.open)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.check_markup(tag, attrs, a)
        if tag == "meta" and a.get("name") == "evidence-run-id":
            self.run_ids.append(a.get("content"))
        if tag == "img" and a.get("alt"):
            self.prose.append((self.where(), a["alt"]))
        if tag == "table":
            self.tables.append({"id": a.get("id"), "section": self.section(), "rows": [], "where": self.where()})
            self.current.append(self.tables[-1])
        elif tag == "tr" and self.current:
            self.current[-1]["rows"].append([])
        elif tag in ("td", "th") and self.current and self.current[-1]["rows"]:
            self.n_cells += 1
            if self.n_cells > MAX_CELLS:
                raise Unreadable(f"{self.where()}: more than {MAX_CELLS} table cells")
            self.current[-1]["rows"][-1].append({"tag": tag, "attrs": a, "text": "", "where": self.where(),
                                                 "line": self.getpos()[0]})
        if tag == "title":
            self.title = ""
        if tag == "style":
            self.styles.append({"where": self.where(), "text": "", "in_head": self.inside("head")})
        if tag not in VOID:
            self.open.append((tag, a))
            if len(self.open) > MAX_DEPTH:
                raise Unreadable(f"{self.where()}: elements nested deeper than {MAX_DEPTH}; report.py nests about 10")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if any(t == tag for t, _ in self.open):
            while True:                 # an end tag closes what is still open inside it, tables included
                closed = self.open.pop()[0]
                if closed == "table" and self.current:
                    self.current.pop()
                if closed == tag:
                    break

    def handle_data(self, data):
        if self.inside("style"):
            self.styles[-1]["text"] += data
        elif self.inside("title"):
            self.title += data
        elif self.open_cell() is not None:
            self.open_cell()["text"] += data
        elif data.strip():
            self.prose.append((self.where(), data))

    def open_cell(self):
        """The td/th being read (innermost open), or None outside cells (a caption is prose)."""
        for t, _ in reversed(self.open):
            if t in ("td", "th"):
                rows = self.current[-1]["rows"] if self.current else []
                return rows[-1][-1] if rows and rows[-1] else None
            if t in ("caption", "table"):
                return None
        return None

    def section(self):
        return next((a.get("id") for t, a in reversed(self.open) if t == "section"), None)

    def check_markup(self, tag, attrs, a):
        if tag not in ALLOWED:
            self.problems.append(f"{self.where()}: <{tag}>: an element report.py never writes")
        allowed = ATTRIBUTES["*"] | ATTRIBUTES.get(tag, set())
        for name, value in attrs:
            if name not in allowed:
                self.problems.append(f"{self.where()}: <{tag} {name}=...>: an attribute report.py never writes")
        if tag == "a" and not str(a.get("href", "#")).startswith("#"):
            self.problems.append(f"{self.where()}: <a href={short(a.get('href'), 60)}>: a link off the page")
        if tag == "img" and not is_png_uri(a.get("src")):
            self.problems.append(f"{self.where()}: <img src={short(a.get('src'), 60)}>: not an embedded PNG")
        if tag == "meta" and not (a.get("charset") == "utf-8" or a.get("name") == "evidence-run-id"):
            self.problems.append(f"{self.where()}: <meta {short(a, 60)}>: a meta report.py never writes")

    def handle_comment(self, data):
        self.problems.append(f"{self.where()}: a comment (<!--{short(data, 40)}-->): report.py writes none")

    def handle_pi(self, data):
        self.problems.append(f"{self.where()}: a processing instruction: report.py writes none")

    def handle_decl(self, decl):
        if decl.lower() != "doctype html":
            self.problems.append(f"{self.where()}: <!{short(decl, 40)}>: report.py writes only <!doctype html>")

    def unknown_decl(self, data):
        self.problems.append(f"{self.where()}: <![{short(data, 40)}]>: report.py writes none")


def is_png_uri(src):
    prefix = "data:image/png;base64,"
    if not isinstance(src, str) or not src.startswith(prefix):
        return False
    try:
        return base64.b64decode(src[len(prefix):], validate=True).startswith(PNG)
    except (binascii.Error, ValueError):
        return False


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


def shows(text, value):
    """The cell's text shows `value`: a string as itself, a JSON object as its json.dumps, a number rounded."""
    if isinstance(value, str):
        return text == value
    if isinstance(value, dict):
        return text == json.dumps(value)
    return is_rounding(text, value)


def is_figure(value):
    """A number or a list of numbers: shown as the number(s) alone."""
    values = value if isinstance(value, list) else [value]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


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
    page = parse(path)
    bad = list(page.problems)
    if manifest is not None and "report.html" not in manifest["files"]:
        bad.append("report.html: not listed in MANIFEST.json")
    bad += run_id_problems(page, run_id) + style_problems(page) + prose_problems(page)
    ev, n = Evidence(out), 0
    for table in page.tables:
        n += sum(1 for row in table["rows"] for c in row if "data-value" in c["attrs"])
        bad += table_problems(ev, table, out)
    C.add("-", ARITHMETIC, CHECK, n + 1, bad, note="the page is derived: what it shows must be the evidence's")


REBUILD_CHECK = "report.html rebuilt from the evidence (report.py --check, byte for byte)"
REPORT_PY = Path(__file__).resolve().parents[1] / "report.py"


def public_bytes_key(out):
    """sha256 over the path and bytes of every file under out but O/private/ and the audit's own audit*.json: all a
    rebuild can read (the page needs no private file), so one key, one verdict, for one builder."""
    h = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(out)
        if rel.parts[0] == "private" or (len(rel.parts) == 1 and rel.name.startswith("audit")):
            continue
        h.update(f"{rel.as_posix()}\0{path.stat().st_size}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def page_rebuild_check(C, out, timeout_s=600, memo=None):
    """Row REBUILD_CHECK, at the arithmetic level (the page is built from public evidence alone, so every audit and
    --public-only can rebuild it): what the whitelist above cannot catch — a cell pointed at another field holding
    an equal value, a label swap, look-alike digits, a closed <details>, a plot, an omission — by running this
    checkout's report.py
    --check in a child process (executed, never imported: the audit's own checks stay independent of the builder).
    Same bytes need the same evidence_report/ and matplotlib as the run's: audit with the commit the evidence cites."""
    if not (out / "report.html").is_file():
        C.skip("-", ARITHMETIC, REBUILD_CHECK, "no report.html (named by the row above)", requested=False)
        return
    key = public_bytes_key(out) if memo is not None else None
    if key in (memo or {}):
        code, said = memo[key][0], memo[key][1].replace("\0O\0", str(out))
    else:
        try:
            proc = subprocess.run([sys.executable, str(REPORT_PY), "--check", str(out)], capture_output=True,
                                  text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            C.add("-", ARITHMETIC, REBUILD_CHECK, 1, [f"report.py --check could not run ({short(str(e), 200)})"])
            return
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        code = proc.returncode
        said = lines[-1] if lines else f"report.py --check exited {code} without a word"
        if memo is not None:
            memo[key] = (code, said.replace(str(out), "\0O\0"))
    other = None if code == 0 else other_builder(out)
    if other:       # another builder may lay the same evidence out otherwise: not a difference this audit can decide
        C.skip("-", ARITHMETIC, REBUILD_CHECK, f"{short(said, 300)}; but {other}: audit with the commit the "
                                              "evidence cites to decide")
        return
    C.add("-", ARITHMETIC, REBUILD_CHECK, 1, [] if code == 0 else [short(said, 600)],
          note="the page this checkout's report.py builds from the evidence; audit with the commit the evidence cites")


BUILDER = ("report.py", "registry.py", "evidence_report")    # what builds the page (evidence_report imports only these)


def other_builder(out):
    """Why this checkout's page builder may not be the one that wrote the evidence (then a rebuilt page that differs
    proves nothing), or None when it is: this checkout is the commit environment.json names, that run was clean,
    and the builder's files are unmodified here."""
    repo = REPORT_PY.parent
    try:
        env = read_json(out / "environment.json")
    except Unreadable:
        env = None
    cited = env.get("git_commit") if isinstance(env, dict) else None
    if not isinstance(cited, str) or not re.fullmatch(r"[0-9a-f]{7,64}", cited):
        return "environment.json names no commit"
    if env.get("git_dirty") is not False:
        return f"the run's checkout (commit {cited[:12]}) had uncommitted changes"

    def git(*args):
        try:
            got = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return got.stdout.strip() if got.returncode == 0 else None
    here = git("rev-parse", "HEAD")
    if here is None:
        return "this checkout is not a git repository"
    if here != cited:
        return f"the evidence was made at commit {cited[:12]} and this checkout is {here[:12]}"
    if git("status", "--porcelain", "--", *BUILDER):
        return f"this checkout's page builder ({', '.join(BUILDER)}) has uncommitted changes"
    return None


def parse(path):
    page = Page()
    try:
        page.feed(read_text(path, limit=MAX_PAGE_BYTES))
        page.close()
    except (AssertionError, ValueError) as e:       # html.parser's own complaints about malformed markup
        raise Unreadable(f"{path}: unparseable HTML ({short(str(e), 80)})")
    return page


def run_id_problems(page, run_id):
    if run_id is None:
        return []
    bad = []
    if page.run_ids != [run_id]:
        bad.append(f"report.html meta evidence-run-id: {short(page.run_ids)}, MANIFEST.json run_id is {run_id!r}")
    if page.title is not None and page.title != f"Evidence report {run_id}":
        bad.append(f"report.html <title>: {short(page.title, 60)}, expected 'Evidence report {run_id}'")
    return bad


def style_problems(page):
    """At most one stylesheet, in <head>, and it must be the builder's own (by sha256): a rule such as
    td::after{content:"0.9"} would show text no cell holds."""
    bad = []
    for i, style in enumerate(page.styles):
        digest = hashlib.sha256(style["text"].encode("utf-8")).hexdigest()
        if i > 0:
            bad.append(f"{style['where']}: a second <style>; report.py writes one stylesheet")
        elif not style["in_head"] or digest != STYLE_SHA256:
            bad.append(f"{style['where']}: a <style> that is not report.py's stylesheet (sha256 {digest[:12]}…, "
                       f"expected {STYLE_SHA256[:12]}… in <head>)")
    return bad


def prose_problems(page):
    """Decimal numbers in the text outside tables, read as the browser joins inline elements (so 0.<b>9</b> is
    0.9); the place named is where the number starts."""
    joined, starts = "", []
    for where, text in page.prose:
        starts.append((len(joined), where))
        joined += text
    bad = []
    for m in DECIMAL.finditer(joined):
        where = next(w for k, w in reversed(starts) if k <= m.start())
        bad.append(f"{where}: the text {short(joined[max(0, m.start() - 30):m.end() + 10].strip(), 60)} shows the "
                   f"number {m[0]} outside a checked cell")
    return bad


def table_problems(ev, table, out):
    if table["id"] == "environment" and table["section"] is None:
        return environment_problems(table, out)
    bad, files = [], {}
    for row in table["rows"]:
        for col, c in enumerate(row):
            if "data-value" in c["attrs"]:
                bad += cell_problems(ev, c) + binding_problems(c, table, col, files)
            elif "data-of" in c["attrs"]:
                bad += derived_problems(ev, c)
            elif "data-src" in c["attrs"]:
                bad += text_cell_problems(ev, c) + binding_problems(c, table, col, files)
            else:
                bad += plain_problems(c, table)
    return bad


def binding_problems(c, table, col, files):
    """A number cell belongs to its section's experiment, and a table column names one file."""
    src = str(c["attrs"].get("data-src"))
    rel = src.partition("#")[0]
    bad = []
    if table["section"] is not None and not rel.startswith(f"{table['section']}/"):
        bad.append(f"{c['where']}: data-src {short(src, 80)} in section {table['section']!r} names another "
                   "experiment's evidence")
    first = files.setdefault(col, rel)
    if first != rel:
        bad.append(f"{c['where']}: data-src {short(src, 80)}: table {table['id']!r} column {col + 1} names {first}, "
                   f"this cell {rel}")
    return bad


def plain_problems(c, table):
    text = c["text"].strip()
    title = c["attrs"].get("title")
    if title is not None and title != "derived from the evidence":
        return [f"{c['where']}: tooltip {short(title, 60)} on a cell that is not a number cell"]
    if BARE.fullmatch(text):
        if "derived" in c["attrs"].get("class", "").split() and DERIVED_TABLES.fullmatch(str(table["id"])) \
                and text.isdigit():         # a count the builder makes itself; a rate is never derived
            return []
        return [f"{c['where']}: shows {short(text, 40)} with no data-value and data-src (table {table['id']!r}): a "
                "number the evidence does not vouch for"]
    m = DECIMAL.search(text)
    if m and c["tag"] == "th":
        return [f"{c['where']}: header {short(text, 60)} shows the number {m[0]}"]
    if m and not text.startswith("["):
        return [f"{c['where']}: the text {short(text, 60)} shows the number {m[0]} outside a checked cell"]
    return []


def text_cell_problems(ev, c):
    """A cell with data-src and no data-value shows a JSON object of the evidence whole, as its JSON text."""
    src = c["attrs"].get("data-src")
    value, why = ev.value(src)
    if value is MISSING:
        return [f"{c['where']}: {why}"]
    if not isinstance(value, dict) or c["text"] != json.dumps(value):
        return [f"{c['where']}: shows {short(c['text'], 60)}, but {src} holds {short(value, 60)}"]
    return []


def derived_problems(ev, c):
    src, how = c["attrs"].get("data-of"), c["attrs"].get("data-derive")
    value, why = ev.value(src)
    if value is MISSING:
        return [f"{c['where']}: {why}"]
    if how not in DERIVATIONS or not isinstance(value, (int, float)) or isinstance(value, bool):
        return [f"{c['where']}: data-derive {short(how)} of {short(value)} ({src}): not a derivation the page makes"]
    if c["text"].strip() != DERIVATIONS[how](value):
        return [f"{c['where']}: shows {short(c['text'].strip())}, but the {how} of {src} ({value}) is "
                f"{DERIVATIONS[how](value)}"]
    return []


def env_text(v):
    """An environment.json value as the page's environment table shows it."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else json.dumps(v)


def expected_environment(out):
    p = out / "environment.json"
    env = read_json(p) if p.is_file() else {}
    env = env if isinstance(env, dict) else {}
    rows = []
    for label, key in ENV_ROWS:
        v = env.get(key)
        if key == "command_line":
            v = " ".join(map(str, v)) if isinstance(v, list) and v else None
        rows.append((label, env_text(v)))
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    return rows + [(k, env_text(v)) for k, v in sorted(versions.items())]


def environment_problems(table, out):
    """The environment table is environment.json as the page lays it out, row for row."""
    marked = next((c for row in table["rows"] for c in row if c["attrs"]), None)
    if marked is not None:
        return [f"{marked['where']}: environment table cell with attributes {short(marked['attrs'], 60)}: report.py "
                "writes none there"]
    shown = [tuple(c["text"] for c in row) for row in table["rows"] if row and row[0]["tag"] == "td"]
    expected = expected_environment(out)
    for i, (got, want) in enumerate(zip(shown, expected)):
        if got != want:
            return [f"{table['where']}: environment table row {i + 1} shows {short(got, 80)}, environment.json "
                    f"gives {short(want, 80)}"]
    if len(shown) != len(expected):
        return [f"{table['where']}: environment table has {len(shown)} rows, environment.json gives {len(expected)}"]
    return []


def cell_problems(ev, c):
    where, a = c["where"], c["attrs"]
    try:
        shown = parse_strict(a["data-value"], f"report.html line {c['line']} data-value")
    except Unreadable as e:
        return [f"{e} ({where})"]
    recorded, why = ev.value(a.get("data-src"))
    if recorded is MISSING:
        return [f"{where}: {why}"]
    if not same(shown, recorded):
        return [f"{where} data-value: {short(shown)}, but {a.get('data-src')} holds {short(recorded)}"]
    if not shows(c["text"], recorded) or (is_figure(recorded) and not BARE.fullmatch(c["text"].strip())
                                          and c["text"].strip() != "—"):
        return [f"{where}: shows {short(c['text'].strip())}, which is not a rounding of {short(recorded)} "
                f"({a.get('data-src')})"]
    if "title" in a and a["title"] != a["data-value"]:
        return [f"{where}: tooltip {short(a['title'], 60)} is not the exact value {short(a['data-value'], 60)}"]
    return []
