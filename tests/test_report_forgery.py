"""A forged report.html must fail audit.py's page row although MANIFEST.json is resealed over it: a number shown
without its data-value/data-src (a), a data-src pointed at another value of the evidence (b), a script (c), CSS that
adds text (d). An untouched page passes, and report.py gives the same bytes twice; `report.py --check` catches what
the audit's whitelist cannot (a cell pointed at another field of the same file, a plot).

The fast tests forge the page report.py draws for the tiny synthetic harness evidence of tests/test_audit.py; the
slow ones forge the real smoke run's page (all five experiments)."""
import hashlib
import re
import shutil

import pytest

from conftest import run_cli
from evidence_audit import driver, report_page
from evidence_audit.mutations.tools import seal
from evidence_report import cells, page
from test_audit import HEAD, made_at, tiny_harness_evidence

ROW = report_page.CHECK
CELL = re.compile(r'<td class="num" data-src="([^"]*)" data-value="([^"]*)"(?: title="[^"]*")?>([^<]*)</td>')


@pytest.fixture(scope="module")
def tiny_built(tmp_path_factory):
    """The tiny harness evidence with the page report.py draws from it (the plots too), sealed."""
    out = tiny_harness_evidence(tmp_path_factory.mktemp("forgery") / "O")
    made_at(out, HEAD)      # this checkout's commit: its report.py is the builder that decides
    page.write(out)
    seal(out, "manifest")
    return out


@pytest.fixture
def tiny(tiny_built, tmp_path):
    out = tmp_path / "O"
    shutil.copytree(tiny_built, out)
    return out


def report_row(out):
    """The audit's page row (status, failures) after resealing MANIFEST.json over whatever the page now holds."""
    seal(out, "manifest")
    row = next(r for r in driver.audit(out)["checks"] if r["check"] == ROW)
    return row["status"], row["failures"]


def forge(out, fn):
    p = out / "report.html"
    text = p.read_text(encoding="utf-8")
    new = fn(text)
    assert new != text, "the forgery changed nothing"
    p.write_text(new, encoding="utf-8")


def first_cell(text):
    m = next((m for m in CELL.finditer(text) if "." in m[3]), None)
    assert m is not None, "no rate cell on the page"
    return m


def strip_cell(text, shown='<td>0.9062</td>'):
    """(a) the first rate cell loses data-src, data-value and title and shows 0.9062."""
    m = first_cell(text)
    return text[:m.start()] + shown + text[m.end():]


def repoint(src, value="1.0", shown="1.0000"):
    """(b) the first rate cell names `src` (another value of the evidence) and shows it."""
    def edit(text):
        m = first_cell(text)
        return text[:m.start()] + f'<td class="num" data-src="{src}" data-value="{value}">{shown}</td>' + text[m.end():]
    return edit


def in_section(text, fn):
    i = text.index("<section")
    return text[:i] + fn(text[i:])


def before(marker, insert):
    return lambda text: text.replace(marker, insert + marker, 1)


SCRIPT = '<script>document.querySelectorAll("td.num").forEach(td => td.textContent = "0.9062")</script>'
FORGERIES = {
    "a: cell stripped of data-value and data-src": (strip_cell, "no data-value and data-src"),
    "a: cell relabelled derived": (lambda t: strip_cell(t, '<td class="num derived" title="derived from the '
                                                          'evidence">0.9062</td>'), "no data-value and data-src"),
    "a: number in prose": (before("</body>", "<p>accuracy 0.9062</p>"), "shows the number 0.9062"),
    "a: number in a text cell": (lambda t: strip_cell(t, "<td>acc 0.9062</td>"), "shows the number 0.9062"),
    "b: data-src at a 1.0 of another file": (repoint("harness/records.jsonl#1.score"), "column"),
    "a: number split across inline elements": (before("</body>", "<p>accuracy 0.<b>9062</b></p>"),
                                               "shows the number 0.9062"),
    "a: words beside a checked number": (lambda t: CELL.sub(lambda m: m[0].replace("</td>", " (was 0.9)</td>"), t,
                                                            count=1), "not a rounding"),
    "a: number in a tooltip": (lambda t: in_section(t, lambda u: u.replace("<td>", '<td title="acc 0.9">', 1)),
                               "tooltip"),
    "a: environment table edited": (lambda t: t.replace("<td>cpu count</td><td>", "<td>cpu count</td><td>9", 1),
                                    "environment table row 8"),
    "c: script": (before("</body>", SCRIPT), "<script>"),
    "c: script in head": (before("</head>", SCRIPT), "<script>"),
    "c: event handler": (before("</body>", '<img alt="" src="x" onerror="alert(1)">'), "onerror"),
    "c: link off the page": (before("</body>", '<a href="javascript:alert(1)">x</a>'), "a link off the page"),
    "d: style block with ::after": (before("</head>", '<style>td.num::after{content:"0.9062"}</style>'),
                                    "a second <style>"),
    "d: style block instead of the page's": (lambda t: re.sub("<style>.*?</style>", "<style>td.num::after{content:"
                                                              '"0.9062"}</style>', t, count=1, flags=re.S),
                                             "not report.py's stylesheet"),
    "d: content added to the page's own stylesheet": (lambda t: t.replace("</style>", 'td::after{content:"9"}'
                                                                                     "</style>", 1),
                                                      "not report.py's stylesheet"),
    "d: style attribute": (lambda t: t.replace('<td class="num"', '<td style="font-size:0" class="num"', 1),
                           "style="),
    "comment": (before("</body>", "<!-- accuracy 0.9062 -->"), "a comment"),
}


def test_untouched_page_passes(tiny):
    assert report_row(tiny) == ("PASS", [])


@pytest.mark.parametrize("name", FORGERIES)
def test_forged_page_fails_the_report_row(tiny, name):
    fn, says = FORGERIES[name]
    forge(tiny, fn)
    status, failures = report_row(tiny)
    assert status == "FAIL", name
    assert says in failures[0], failures
    assert failures[0].startswith("report.html line "), failures[0]     # one line naming the file and the place


def test_deep_nesting_is_refused_on_one_line(tiny):
    forge(tiny, before("</body>", "<div>" * 100_000 + "x"))
    seal(tiny, "manifest")
    proc = run_cli("audit.py", tiny)
    assert proc.returncode == 2 and "nested deeper than" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_audit_cli_fails_the_report_row_of_a_forged_page(tiny):
    forge(tiny, before("</body>", SCRIPT))
    seal(tiny, "manifest")
    proc = run_cli("audit.py", tiny)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ROW in ln)
    assert "FAIL" in line and "<script>" in line, line
    assert "Traceback" not in proc.stderr


def test_report_py_gives_the_same_bytes_twice(tiny):
    first = (tiny / "report.html").read_bytes()
    for _ in range(2):
        proc = run_cli("report.py", tiny)
        assert proc.returncode == 0, proc.stderr
        assert (tiny / "report.html").read_bytes() == first


def test_report_check_catches_what_the_whitelist_cannot(tiny):
    """A cell pointed at another field of the same file holding an equal value passes the audit's whitelist row (its
    documented limit); report.py --check rebuilds the page and names the first difference, and so does the audit's
    level, which runs it in every audit."""
    proc = run_cli("report.py", "--check", tiny)
    assert proc.returncode == 0 and "byte for byte" in proc.stdout, proc.stdout + proc.stderr
    forge(tiny, repoint("harness/summary.json#leaderboard.tasks.arith.latency_s"))
    assert report_row(tiny)[0] == "PASS"
    proc = run_cli("report.py", "--check", tiny)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "first difference at line" in proc.stderr, proc.stderr
    assert "leaderboard.tasks.arith.latency_s" in proc.stderr, proc.stderr
    from evidence_audit import driver       # every audit runs that rebuild itself and fails the page
    rebuilt = [r for r in driver.audit(tiny)["checks"] if r["check"].startswith(
        "report.html rebuilt")]
    assert [r["status"] for r in rebuilt] == ["FAIL"] and "latency_s" in rebuilt[0]["first_failure"], rebuilt


def test_report_check_names_a_changed_plot(tiny):
    p = tiny / "report.html"
    text = p.read_text(encoding="utf-8")
    i = text.index("data:image/png;base64,") + 200
    p.write_text(text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1:], encoding="utf-8")
    proc = run_cli("report.py", "--check", tiny)
    assert proc.returncode == 1 and "inside an embedded plot" in proc.stderr, proc.stderr


def test_report_check_refuses_an_unreadable_page_on_one_line(tiny):
    (tiny / "report.html").write_bytes(b"\xff\xfe not utf-8")
    proc = run_cli("report.py", "--check", tiny)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "report.html" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_audit_knows_the_page_stylesheet_and_derivations():
    """The audit keeps its own copies (it does not import the builder): they must be the builder's."""
    assert hashlib.sha256(page.CSS.encode("utf-8")).hexdigest() == report_page.STYLE_SHA256
    assert set(cells.DERIVATIONS) == set(report_page.DERIVATIONS)
    for v in (0, 1, 608104448, 2**20 * 3 + 1):
        assert cells.DERIVATIONS["MiB"](v) == report_page.DERIVATIONS["MiB"](v)


def test_a_wrong_derived_figure_fails(tiny):
    forge(tiny, lambda t: re.sub(r'(data-derive="MiB" title="derived from the evidence">)[^<]*', r"\g<1>999.9", t,
                                 count=1))
    status, failures = report_row(tiny)
    assert status == "FAIL" and "MiB" in failures[0], failures


# ---- the real smoke run: all five experiments ------------------------------------------------------------------

@pytest.fixture
def smoke_copy(smoke_run, tmp_path):
    out = tmp_path / "O"
    shutil.copytree(smoke_run[0], out)
    return out


def other_experiment(text):
    """(b) the first rate cell (protocol's) names a number of options/summary.json and shows it."""
    src = next(m[1] for m in CELL.finditer(text) if m[1].startswith("options/summary.json#") and "." in m[3])
    value = next(m[2] for m in CELL.finditer(text) if m[1] == src)
    return repoint(src, value, f"{float(value):.4f}")(text)


SMOKE_FORGERIES = {
    **{k: v for k, v in FORGERIES.items() if not k.startswith("b:")},
    "b: data-src at a value of another experiment": (other_experiment, "another experiment"),
    # format 3 shows the sandbox limits one a row (docs/report.md): the JSON object cell left is extraction's per class
    "a: JSON object cell edited": (lambda t: re.sub(r'(<td data-src="[^"]*#audit_sample\.per_class">[^<]*?)(\d)\}',
                                                    lambda m: f"{m[1]}{(int(m[2]) + 1) % 10}}}", t, count=1),
                                   "but extraction/summary.json#audit_sample.per_class"),
}


@pytest.mark.slow
def test_smoke_page_passes_untouched_and_is_rebuilt_byte_for_byte(smoke_copy):
    assert report_row(smoke_copy) == ("PASS", [])
    proc = run_cli("report.py", "--check", smoke_copy)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", SMOKE_FORGERIES)
def test_forged_smoke_page_fails_the_report_row(smoke_copy, name):
    fn, says = SMOKE_FORGERIES[name]
    forge(smoke_copy, fn)
    status, failures = report_row(smoke_copy)
    assert status == "FAIL" and any(says in f for f in failures), failures


def test_report_py_refuses_a_directory_that_holds_no_evidence(tmp_path):
    (tmp_path / "mine.txt").write_text("a user's own file\n")
    proc = run_cli("report.py", tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no evidence here" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
