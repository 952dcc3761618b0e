"""report.py and its package evidence_report/: O/report.html, one self-contained page built from the evidence alone.

Real evidence (slow: marked `slow`): the session's `run.py --smoke` of all five experiments (conftest.smoke_run).
run.py writes report.html itself at the end of the run; `python report.py O` writes the same page from a copy. Both
are loaded in headless Chromium from disk: the screenshot must not be blank, the browser must request nothing but the
file itself and data: URIs, and the tables must carry the figures of summary.json exactly: every number cell keeps
the exact value (the text json.dumps wrote) in its data-value attribute, and shows it rounded for reading. The flip
matrices of the options study are recounted here from records.jsonl.

Fast (no browser, no model): number formatting, the CLI, the generic fallback and the fallback of a view that
cannot read its evidence, the options flips order and its primary comparison, and the MC-TACO segment plot, on
hand-made directories.

Set REPORT_SCREENSHOT_DIR to keep the screenshots (they are written to the test's tmp_path otherwise).
"""
import ast
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

import conftest
import registry
from conftest import run_cli
from test_run_safety import fill, tmpfs  # noqa: F401  (tmpfs is a fixture: a small tmpfs mount, root only)

REPORT = conftest.REPO / "report.py"
PACKAGE = conftest.REPO / "evidence_report"
REPORT_SOURCES = [REPORT] + sorted(PACKAGE.rglob("*.py"))
REPO_ROOT = conftest.REPO
FORBIDDEN_IMPORTS = {"run", "experiments", "harness", "lm_eval", "resources", "config", "adapter", "audit",
                     "evidence_audit", "bench", "prepare"}
# and every other module of the repository: a top-level .py or a package (report.py's own package aside)
REPOSITORY_MODULES = ({p.stem for p in REPO_ROOT.glob("*.py")}
                      | {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")}) - {"evidence_report", "registry"}
# registry.py (each experiment's section named as a string) is plain data importing only the standard library
# (tests/test_registry.py), so the report may read it
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def shown(v):
    """How summary.json's value v must appear in a table cell's exact view (data-value, else the text): its JSON
    text; null as an em dash."""
    return "—" if v is None else json.dumps(v)


def is_rounding_of(text, exact):
    """text (what a cell shows) is a readable rounding of the number whose JSON text is exact."""
    value = json.loads(exact)
    if isinstance(value, list):
        parts = text.strip("[]").split(", ")
        return len(parts) == len(value) and all(is_rounding_of(p, json.dumps(v)) for p, v in zip(parts, value))
    if isinstance(value, int):
        return text in (str(value), f"{value:+d}")
    mantissa = text.lstrip("+").split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    if decimals > 4:
        return False                                   # not rounded for reading
    if "e" in text:
        return abs(float(text) - value) <= 0.05 * abs(value)
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-12


def load_report():
    """report.py, the command line (main, and write: what run.py calls)."""
    import importlib

    import report

    return importlib.reload(report)


def load(module):
    """A module of the package: "cells", "page", "sections.mctaco", ..."""
    import importlib

    return importlib.import_module(f"evidence_report.{module}")


# ---- static checks (no browser) ------------------------------------------------------------------------------

class Resources(HTMLParser):
    """Every URL-bearing attribute and element of a page."""

    def __init__(self):
        super().__init__()
        self.imgs, self.scripts, self.links, self.urls, self.styles = [], [], [], [], []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src") or "")
        if tag == "script":
            self.scripts.append(a.get("src"))
        if tag == "link":
            self.links.append(a.get("href"))
        for k in ("src", "href", "srcset", "data", "poster", "action", "background"):
            if a.get(k) is not None:
                self.urls.append((tag, k, a[k]))
        if a.get("style"):
            self.styles.append(a["style"])
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def assert_self_contained(text, min_images=0):
    p = Resources()
    p.feed(text)
    assert len(p.imgs) >= min_images, f"expected at least {min_images} plots, found {len(p.imgs)}"
    for src in p.imgs:
        assert src.startswith("data:image/png;base64,"), f"img src is not a data: URI: {src[:80]}"
    assert p.scripts == [], f"<script> elements: {p.scripts}"
    assert p.links == [], f"<link> elements (stylesheets/icons would be fetched): {p.links}"
    for tag, attr, url in p.urls:
        assert url.startswith(("data:", "#")), f"<{tag} {attr}={url[:80]!r}> points outside the page"
    for css in p.styles:
        assert "url(" not in css and "@import" not in css, f"CSS fetches something: {css[:120]}"


def test_report_package_is_scanned_whole():
    names = {p.relative_to(REPO_ROOT).as_posix() for p in REPORT_SOURCES}
    assert {"report.py", "evidence_report/page.py", "evidence_report/cells.py", "evidence_report/plots.py",
            "evidence_report/sections/__init__.py", "evidence_report/sections/protocol.py"} <= names
    assert len(REPORT.read_text(encoding="utf-8").splitlines()) < 60, "report.py is the CLI; the page lives in " \
                                                                       "evidence_report/"
    assert FORBIDDEN_IMPORTS - {"lm_eval"} <= REPOSITORY_MODULES, "the scan must know the repository"


@pytest.mark.parametrize("path", REPORT_SOURCES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_report_imports_none_of_the_code_that_wrote_the_evidence(path):
    """report.py and evidence_report/ import nothing of the repository but the package itself, and nothing of
    lm_eval: absolute imports only (so that every import names its root), no dynamic imports, and at module level
    only the standard library and the package (matplotlib and numpy are imported when a plot is drawn)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names, relative, dynamic = set(), [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
            if node.level:
                relative.append(node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if fname in ("__import__", "import_module", "find_spec", "run_module", "run_path",
                         "spec_from_file_location", "exec", "eval"):
                dynamic.append((fname, node.lineno))
    assert not names & FORBIDDEN_IMPORTS, names & FORBIDDEN_IMPORTS
    assert not names & REPOSITORY_MODULES, names & REPOSITORY_MODULES
    assert not relative, f"relative imports at lines {relative}"
    # the one dynamic import: the loader of the sections registry.py names, which refuses any module outside
    # evidence_report.sections (test_sections_are_loaded_from_the_report_package_only)
    loader = path == PACKAGE / "sections" / "__init__.py"
    assert [f for f, _ in dynamic] == (["import_module"] if loader else []), f"dynamic imports: {dynamic}"
    top = {a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for a in node.names}
    top |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert not top - set(sys.stdlib_module_names) - {"evidence_report", "registry"}, top


def test_sections_are_loaded_from_the_report_package_only():
    """registry.py names each section as a string; the report imports it only from evidence_report.sections."""
    sections = load("sections")
    assert sections.load_section("evidence_report.sections.protocol") is sections.SECTIONS["protocol"]
    for name in ("experiments.protocol", "run", "evidence_report.sections.x.y", "evidence_report.sections.",
                 "evidence_report.sectionsx.protocol", "evidence_report.page"):
        with pytest.raises(ValueError):
            sections.load_section(name)


def test_sections_are_one_module_per_experiment_in_page_order(tmp_path):
    """evidence_report.sections.SECTIONS: experiment name -> its section module, in the order the page shows them."""
    sections = load("sections").SECTIONS
    assert list(sections) == ["protocol", "options", "harness", "mctaco", "extraction"]     # registry.py's order
    for name, module in sections.items():
        assert module.__name__ == f"evidence_report.sections.{name}" and module.NAME == name
        assert callable(module.render)
    out, _ = minimal_evidence(tmp_path)
    for name in reversed(list(sections)):           # created in reverse: the page orders them, not the file system
        write_json(out / name / "summary.json", {"experiment": name, "split": "dev"})
    assert load("page").experiment_names(out) == [*sections, "novel"]


def test_numbers_are_rounded_by_what_they_are():
    """A page that printed unrounded floats (0.5555555555555556) would claim precision no reader needs."""
    fmt = load("cells").fmt
    assert [fmt(v, "rate") for v in (0.5555555555555556, 1.0, 0.0, 0.32222222222222224)] == \
        ["0.5556", "1.0000", "0.0000", "0.3222"]
    assert [fmt(v, "diff") for v in (0.0, 1.2e-05, 1.1920928955078125e-07, 0.0123456, 2.5)] == \
        ["0.0", "1.2e-05", "1.2e-07", "0.012", "2.5"]
    assert [fmt(v, "pvalue") for v in (1.0, 0.5, 0.03125, 3.0517578125e-05)] == ["1.000", "0.500", "0.031", "3.1e-05"]
    assert [fmt(v, "delta") for v in (-0.05555555555555558, 0.0444444444444444, 0.0)] == \
        ["-0.0556", "+0.0444", "0.0000"]
    assert [fmt(v, "signed") for v in (2, -2, 0)] == ["+2", "-2", "0"]
    assert [fmt(v, "seconds") for v in (1.6308, 0.0028, 28.7694)] == ["1.631", "0.003", "28.8"]
    assert [fmt(v) for v in (0.1 + 0.2, 0.42857142857142855, 1e-07, 0.0, 3, 0, True, False, None, [3, 1])] == \
        ["0.3", "0.4286", "1e-07", "0.0", "3", "0", "true", "false", "—", "[3, 1]"]
    for style in ("rate", "diff", "pvalue", "delta", "seconds", "general", "count"):
        assert fmt(7, style) == "7" and fmt(None, style) == "—", style


def test_number_cells_keep_the_exact_value():
    """A number read from an experiment's evidence keeps its exact JSON text (data-value) and its place (data-src);
    a number the page computes (arithmetic on read values) is labelled derived and carries no data-value."""
    cells = load("cells")
    ev = cells.sourced({"a": {"acc": 0.5555555555555556, "n": 7}, "pair": [0.5, 0.5555555555555556]},
                        "exp/summary.json#")
    assert cells.cell(cells.rate(ev["a"]["acc"])) == \
        ('<td class="num" data-src="exp/summary.json#a.acc" data-value="0.5555555555555556" '
         'title="0.5555555555555556">0.5556</td>')
    assert cells.cell(ev["a"]["n"]) == '<td class="num" data-src="exp/summary.json#a.n" data-value="7">7</td>'
    assert cells.cell(cells.rate(ev["pair"])) == \
        ('<td class="num" data-src="exp/summary.json#pair" data-value="[0.5, 0.5555555555555556]" '
         'title="[0.5, 0.5555555555555556]">[0.5000, 0.5556]</td>')
    assert cells.cell(cells.rate(ev["a"]["acc"] / 2)) == \
        '<td class="num derived" title="derived from the evidence">0.2778</td>'
    assert cells.cell(7) == '<td class="num derived" title="derived from the evidence">7</td>'
    assert cells.cell(cells.rate(None)) == "<td>—</td>" and cells.cell("a<b") == "<td>a&lt;b</td>"
    for value in (0.5555555555555556, 1.2e-05, -0.05555555555555558, 3, 0.0, 1234.56789):
        for style in ("rate", "diff", "delta", "seconds", "general"):
            assert is_rounding_of(cells.fmt(value, style), json.dumps(value)), (value, style)
    assert not is_rounding_of("0.5555555555555556", "0.5555555555555556")


def write_json(path, obj):
    """An evidence file as run.py writes it: stamped with the evidence format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**obj, "evidence_format": 2}, indent=1), encoding="utf-8")


def minimal_evidence(root):
    """A hand-made O with one experiment report.py has never heard of."""
    out = root / "O"
    write_json(out / "environment.json", {"git_commit": "abc123", "git_dirty": False, "python": "3.11.7",
                                          "versions": {"torch": "9.9"}, "command_line": ["run.py", "--smoke"]})
    summary = {"experiment": "novel", "split": "dev", "confirmation_items_scored": False, "n_items": 7,
               "accuracy": 0.42857142857142855, "nested": {"f1": 0.1 + 0.2, "flag": True, "missing": None},
               "idx": [3, 1, 4], "rows": [{"a": 1}, {"a": 2}]}
    write_json(out / "novel" / "summary.json", summary)
    write_json(out / "novel" / "stages.json", {"stages": [{"name": "score", "wall_s": 1.2345,
                                                           "peak_rss_bytes_at_end": 104857600}],
                                               "threads": 1, "total_wall_s": 2.5, "tokens": {"total": 99}})
    (out / "novel" / "records.jsonl").write_text('{"idx": 3}\n{"idx": 1}\n', encoding="utf-8")
    (out / "private" / "novel").mkdir(parents=True)
    return out, summary


class Tables(HTMLParser):
    """table id -> rows of its tbody, each cell as (data-value or None, text); for the unit tests (the browser tests
    read the DOM)."""

    def __init__(self):
        super().__init__()
        self.tables, self.classes, self.row_classes = {}, [], {}
        self._rows = self._cell = self._value = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("class"):
            self.classes.append(a["class"])
        if tag == "table":
            self._tid = a.get("id") or f"anon{len(self.tables)}"
            self._rows = self.tables.setdefault(self._tid, [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
            self.row_classes.setdefault(self._tid, []).append(a.get("class") or "")
        elif tag == "td" and self._rows is not None:
            self._cell, self._value = "", a.get("data-value")

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._rows[-1].append((self._value, self._cell.strip()))
            self._cell = None
        elif tag == "table":
            self._rows = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def parse_cells(text):
    """table id -> rows of (data-value or None, shown text) cells; header rows dropped."""
    t = Tables()
    t.feed(text)
    return {k: [r for r in v if r] for k, v in t.tables.items()}, t.classes


def parse_tables(text):
    """table id -> rows of exact cell values (data-value where a cell has one, else its text), and the classes."""
    cells, classes = parse_cells(text)
    return {k: [[v if v is not None else txt for v, txt in r] for r in rows] for k, rows in cells.items()}, classes


def assert_numbers_rounded(cells):
    """Every number cell shows a rounding of its exact value; no other cell shows an unrounded float."""
    import re

    for tid, rows in cells.items():
        for row in rows:
            for value, text in row:
                if value is not None:
                    assert is_rounding_of(text, value), (tid, row[0], text, value)
                else:
                    assert not re.search(r"\d\.\d{5,}", text), (tid, row[0], text)


def test_generic_fallback_lists_every_summary_field(tmp_path):
    out, summary = minimal_evidence(tmp_path)
    path = load("page").write(out)
    text = path.read_text(encoding="utf-8")
    tables, classes = parse_tables(text)
    assert "render-error" not in classes
    rows = dict(tuple(r) for r in tables["novel-summary"])
    assert rows["accuracy"] == "0.42857142857142855"          # the exact value stays in data-value
    assert rows["nested.f1"] == "0.30000000000000004"
    cells, _ = parse_cells(text)
    shown_text = {r[0][1]: r[1][1] for r in cells["novel-summary"]}
    assert shown_text["accuracy"] == "0.4286" and shown_text["nested.f1"] == "0.3"     # and is shown rounded
    assert_numbers_rounded(cells)
    assert rows["nested.flag"] == "true" and rows["nested.missing"] == "—"
    assert rows["n_items"] == "7" and rows["idx"] == "[3, 1, 4]" and rows["rows"] == "[2 entries]"
    stages = {r[0]: r for r in tables["novel-stages"]}      # a stages.json without an `imports` row
    assert stages["score"][1] == "1.2345" and stages["score"][2] == "104857600"
    assert {r[0][1]: r[1][1] for r in cells["novel-stages"]}["score"] == "1.234"
    assert '<section id="novel">' in text and "records.jsonl: 2 lines" in text
    env = dict(tuple(r) for r in tables["environment"])
    assert env["git commit"] == "abc123" and env["torch"] == "9.9"
    assert "private" not in [k.split("-")[0] for k in tables]
    assert_self_contained(text)
    assert not list(out.glob(".report.html.tmp"))


def test_a_view_that_cannot_read_its_evidence_falls_back_and_says_so(tmp_path):
    """An options summary of an unexpected shape: the page is still written, the section shows the error and
    every field of its summary, and the other experiments are unaffected."""
    out, _ = minimal_evidence(tmp_path)
    write_json(out / "options" / "summary.json", {"experiment": "options", "split": "dev", "surprise": 0.75})
    text = load("page").build(out)
    tables, classes = parse_tables(text)
    assert "render-error" in classes
    assert dict(tuple(r) for r in tables["options-summary"])["surprise"] == "0.75"
    assert dict(tuple(r) for r in tables["novel-summary"])["n_items"] == "7"
    assert text.index('id="options"') < text.index('id="novel"')   # known experiments first, in study order
    # unreadable evidence: a truncated summary.json, a stages.json of the wrong shape
    (out / "mctaco").mkdir()
    (out / "mctaco" / "summary.json").write_text('{"experiment": "mctaco", "acc": 0.', encoding="utf-8")
    write_json(out / "options" / "stages.json", {"stages": "not a list"})
    text = load("page").build(out)
    tables, classes = parse_tables(text)
    assert classes.count("render-error") == 3, classes
    assert '<section id="mctaco">' in text and "summary.json" in text
    assert dict(tuple(r) for r in tables["novel-summary"])["n_items"] == "7"


def test_cli(tmp_path):
    out, _ = minimal_evidence(tmp_path)
    proc = run_cli(REPORT, out, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == str(out / "report.html")
    # --help is help, not an output directory named "--help"
    helped = run_cli(REPORT, "--help", timeout=300)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: report.py") and "OUT" in helped.stdout
    assert "no such output directory" not in helped.stdout + helped.stderr
    # a missing directory: one line that names it, exit 2, no traceback
    missing = run_cli(REPORT, tmp_path / "nope", timeout=300)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [missing.stderr.strip()], missing.stderr
    assert str(tmp_path / "nope") in missing.stderr and "no such output directory" in missing.stderr
    a_file = run_cli(REPORT, REPORT, timeout=300)
    assert a_file.returncode == 2 and "not a directory" in a_file.stderr and "Traceback" not in a_file.stderr
    no_args = run_cli(REPORT, timeout=300)
    assert no_args.returncode == 2 and "usage: report.py" in no_args.stderr


OPTIONS_CONDITIONS = [("base_text", "official", "text", "fwd"), ("list_text_fwd", "list", "text", "fwd"),
                      ("list_text_rev", "list", "text", "rev"), ("list_letter_fwd", "list", "letter", "fwd"),
                      ("list_letter_rev", "list", "letter", "rev")]
# the runner's order: letters fwd/rev first, which is not alphabetical
OPTIONS_COMPARISONS = [["list_letter_fwd", "list_letter_rev"], ["list_text_fwd", "list_text_rev"],
                       ["list_text_fwd", "list_letter_fwd"], ["base_text", "list_text_fwd"]]


def options_evidence(root):
    """A hand-made O/options of the shape run.py writes (3 items), without the model."""
    out, _ = minimal_evidence(root)
    d = out / "options"
    preds = {"base_text": [1, 1, 0], "list_text_fwd": [0, 1, 0], "list_text_rev": [0, 0, 0],
             "list_letter_fwd": [0, 0, 0], "list_letter_rev": [1, 1, 1]}
    labels = [1, 1, 0]
    records, conditions = [], {}
    for name, prompt, space, order in OPTIONS_CONDITIONS:
        correct = sum(p == y for p, y in zip(preds[name], labels))
        conditions[name] = {"acc": correct / 3, "acc_norm": correct / 3, "acc_norm_tokens": correct / 3,
                            "baseline_all_negative_acc": 1 / 3, "baseline_all_negative_correct": 1,
                            "baseline_all_positive_acc": 2 / 3, "baseline_all_positive_correct": 2,
                            "chose_first_position": 1, "correct": correct, "correct_norm": correct,
                            "correct_norm_tokens": correct, "n": 3, "predicted_positive": sum(preds[name])}
        for idx, (p, y) in enumerate(zip(preds[name], labels)):
            records.append({"idx": idx, "condition": name, "space": space, "order": order, "label": y,
                            "semantic_pred": p, "official": {"scores": [-1.5 - idx, -2.25]},
                            "independent": {"scores": [-1.5 - idx, -2.25]}})
    flips = {}
    for a, b in sorted(OPTIONS_COMPARISONS):           # summary.json's keys are sorted
        flipped = [i for i in range(3) if preds[a][i] != preds[b][i]]
        gains = sum(preds[b][i] == labels[i] for i in flipped)
        flips[f"{a} vs {b}"] = {"a": a, "b": b, "flips": len(flipped), "flipped_idx": flipped, "gains": gains,
                                "losses": len(flipped) - gains, "net": 2 * gains - len(flipped),
                                "n_discordant": len(flipped), "mcnemar_p": 0.5 ** len(flipped) * 2 if flipped
                                else 1.0}
    write_json(d / "summary.json", {
        "experiment": "options", "split": "dev", "n_items": 3, "n_records": 15, "n_candidates": 30,
        "n_conditions": 5, "conditions": conditions, "flips": flips, "label_counts": {"0": 1, "1": 2},
        "agreement": {"max_abs_diff": 0.0, "n_candidate_score_mismatches": 0, "n_lm_eval_metric_mismatches": 0,
                      "n_prediction_mismatches": 0},
        "identity_checks": {"passed": True, "n_records_joined": 15, "fields": ["idx", "label"]}})
    write_json(d / "config.json", {
        "comparisons": OPTIONS_COMPARISONS, "config": {"options_comparisons": OPTIONS_COMPARISONS,
                                                       "sst2_choices": ["negative", "positive"]},
        "conditions": [{"name": n, "prompt": p, "space": sp, "order": o} for n, p, sp, o in OPTIONS_CONDITIONS]})
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return out


def test_options_flips_follow_the_config_order_and_mark_the_primary_comparison(tmp_path):
    """The flips table follows the config's order, not the alphabet: letters fwd/rev, the primary measure, first."""
    out = options_evidence(tmp_path)
    text = load("page").build(out)
    tables, classes = parse_tables(text)
    assert "render-error" not in classes
    flips = tables["options-flips"]
    assert [r[0] for r in flips] == [f"{a} vs {b}" for a, b in OPTIONS_COMPARISONS]
    assert [r[1] for r in flips] == ["primary", "", "", ""]
    t = Tables()
    t.feed(text)
    assert t.row_classes["options-flips"][1:] == ["primary", "", "", ""]     # [0] is the header row
    # the flips come before the accuracies, and the letter matrix before the text one
    assert text.index('id="options-flips"') < text.index('id="options-flipmatrix-letter"') < \
        text.index('id="options-flipmatrix-text"') < text.index('id="options-conditions"')
    summary = json.loads((out / "options" / "summary.json").read_text())
    primary = summary["flips"]["list_letter_fwd vs list_letter_rev"]
    assert flips[0][2:8] == [shown(primary[k]) for k in ("flips", "gains", "losses", "net", "n_discordant",
                                                           "mcnemar_p")]
    cells, _ = parse_cells(text)
    assert [txt for _, txt in cells["options-flips"][0][5:8]] == ["+1", "3", "0.250"]   # net signed, p readable
    assert {r[0][1]: r[5][1] for r in cells["options-conditions"]}["base_text"] == "1.0000"
    assert_numbers_rounded(cells)
    # a config that lists no comparisons: alphabetical, the primary still found from the conditions
    cfg = json.loads((out / "options" / "config.json").read_text())
    cfg.pop("comparisons")
    cfg["config"].pop("options_comparisons")
    write_json(out / "options" / "config.json", cfg)
    tables, _ = parse_tables(load("page").build(out))
    assert [r[0] for r in tables["options-flips"]] == sorted(summary["flips"])
    assert [r[0] for r in tables["options-flips"] if r[1] == "primary"] == ["list_letter_fwd vs list_letter_rev"]


def mctaco_questions():
    """Four questions over documents 0..17, as config.json's split_questions lists them."""
    spans = [(0, 5), (5, 9), (9, 13), (13, 18)]
    return [{"question_id": f"q{r}", "question_rank": r, "idx": list(range(a, b)), "category": "Frequency"}
            for r, (a, b) in enumerate(spans)]


def test_mctaco_plot_draws_unscored_questions_apart_and_no_negative_rank():
    """An unscored question is not drawn like a scored one, and no axis shows a "-1" rank."""
    mctaco = load("sections.mctaco")
    cfg = {"split_questions": mctaco_questions()}
    # the smoke shape: questions 0 and 1 scored (documents 0..8), limit demos at 2 (cuts q0) and 5
    summary = {"limit_demo": {"rows": [{"limit": 2, "cut_questions": [{"question_id": "q0"}]},
                                       {"limit": 5, "cut_questions": []}]}}
    statuses, limits = mctaco.question_status(cfg, summary, set(range(9)))
    assert [(q["question_rank"], st) for q, st in statuses] == [(0, "cut"), (1, "scored"), (2, "unscored")]
    assert limits == [2, 5]
    fig, ax = mctaco.segments_figure(statuses, limits)
    try:
        assert list(ax.get_yticks()) == [0, 1, 2]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2"]
        bars = {round(p.get_y() + p.get_height() / 2): p for p in ax.patches}
        assert bars[2].get_hatch() and bars[2].get_facecolor()[:3] == (1.0, 1.0, 1.0)   # hollow, hatched
        assert not bars[1].get_hatch() and bars[1].get_facecolor() != bars[0].get_facecolor()
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("not scored" in t for t in legend) and len(legend) == 3
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)
    # this run itself cut by --limit 10 (with --allow-partial-groups): q2 partly scored, q3 not at all
    summary = {"limit": 10, "cut_questions": [{"question_id": "q2"}], "limit_demo": {"rows": []}}
    statuses, limits = mctaco.question_status(cfg, summary, set(range(10)))
    assert [st for _, st in statuses] == ["scored", "scored", "cut", "unscored"] and limits == [10]
    assert mctaco.question_segments_plot(cfg, summary, set(range(10))).startswith('<img alt="questions')


def test_readme_says_what_the_mutation_selftest_does():
    """The README must not overstate `--mutations`: its paragraph says that it tampers with copies and that the
    untouched copy must pass."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    paragraph = next(p for p in text.split("\n\n") if "audit.py O --mutations" in p)
    assert "copies of O" in paragraph and "untouched copy must pass" in paragraph, paragraph


def test_report_has_no_function_over_80_lines():
    long = [(path.name, n.name, n.end_lineno - n.lineno + 1) for path in REPORT_SOURCES
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80]
    assert long == []


# ---- the browser -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip(f"headless Chromium not available: need {CHROMIUM} and {CHROMEDRIVER} (Debian packages "
                    "chromium and chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed in this environment (pip install selenium)")
    profile = tempfile.mkdtemp(prefix="report-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1300,1000", "--hide-scrollbars"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    except Exception as e:  # noqa: BLE001 - any start-up failure of the browser is a missing tool here
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"headless Chromium did not start: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


TABLES_JS = """
const out = {};
for (const t of document.querySelectorAll('table[id]')) {
  const rows = t.tBodies[0] ? Array.from(t.tBodies[0].rows) : [];
  out[t.id] = rows.map(r => Array.from(r.cells).map(c => [c.dataset.value ?? null, c.textContent.trim()]));
}
return out;
"""


def render(driver, page, screenshot):
    """Load page from disk; return (tables, requested URLs, image states, section ids, error boxes)."""
    driver.get("about:blank")
    driver.get_log("performance")                       # drop everything before our page
    driver.get(page.resolve().as_uri())
    driver.execute_script("return document.readyState")
    requested = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            requested.append(msg["params"]["request"]["url"])
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1300, min(height + 200, 16000))
    driver.save_screenshot(str(screenshot))
    keep = os.environ.get("REPORT_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(keep) / screenshot.name)
    cells = {tid: [[tuple(c) for c in r] for r in rows if r] for tid, rows in driver.execute_script(TABLES_JS).items()}
    return {"cells": cells, "requested": requested,
            "tables": {tid: [[v if v is not None else txt for v, txt in r] for r in rows] for tid, rows in cells.items()},
            "images": driver.execute_script("return Array.from(document.images).map(i => [i.complete, "
                                            "i.naturalWidth, i.src.slice(0, 22)])"),
            "sections": driver.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id)"),
            "errors": driver.execute_script("return document.querySelectorAll('.render-error').length")}


def assert_not_blank(screenshot):
    from PIL import Image

    im = Image.open(screenshot).convert("RGB")
    small = im.resize((im.width // 4, im.height // 4))
    colours = small.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, f"{screenshot}: {len(colours or [])} distinct colours"
    non_white = sum(n for n, c in colours if c != (255, 255, 255))
    assert non_white / (small.width * small.height) > 0.02, f"{screenshot}: almost all white"
    assert im.height > 2000, f"{screenshot}: the page is only {im.height} px tall"


def rows_by_first(tables, tid):
    assert tid in tables, f"table {tid} missing; tables: {sorted(tables)}"
    return {r[0]: r for r in tables[tid] if r}


def check_stages(tables, out, name):
    st = json.loads((out / name / "stages.json").read_text())
    rows = rows_by_first(tables, f"{name}-stages")
    for s in st["stages"]:
        assert rows[s["name"]][1] == shown(s["wall_s"]), (name, s)
        assert rows[s["name"]][2] == shown(s["peak_rss_bytes_at_end"]), (name, s)


def check_protocol(t, s, out):
    h = rows_by_first(t, "protocol-headline")
    acc = s["uncertainty"]["accuracies"]
    for key, row in (("official", "official (lm-eval 0.4.9.2)"), ("independent", "independent")):
        assert h[row][1:5] == [shown(s[key]["correct"]), shown(s["n_items"]), shown(s[key]["accuracy"]),
                               shown(acc[f"{key}/accuracy"]["wilson95"])]
    u = rows_by_first(t, "protocol-uncertainty")
    for name, x in s["uncertainty"]["paired"].items():
        assert u[name][3:9] == [shown(x[k]) for k in ("n", "only_a", "only_b", "difference", "difference_ci95",
                                                      "mcnemar_p")], name
    ag = rows_by_first(t, "protocol-agreement")
    assert ag["max |official − independent| (candidate log-likelihood)"][1] == shown(s["agreement"]["max_abs_diff"])
    assert ag["prediction mismatches"][1] == shown(s["agreement"]["n_prediction_mismatches"])
    assert ag["identity checks"][1] == "passed"


def check_options(t, s, out):
    # format 3's layout: one row per condition and score, then what each condition predicted
    h = {(r[0], r[3]): r for r in t["options-conditions"]}
    assert len(h) == len(t["options-conditions"]) == 3 * len(s["conditions"])
    for name, m in s["conditions"].items():
        for score, correct in (("acc", "correct"), ("acc_norm", "correct_norm"),
                               ("acc_norm_tokens", "correct_norm_tokens")):
            ci = shown(s["uncertainty"]["accuracies"][f"conditions/{name}/{score}"]["wilson95"])
            assert h[name, score][4:8] == [shown(m[correct]), shown(m["n"]), shown(m[score]), ci], (name, score)
        p = rows_by_first(t, "options-predictions")[name]
        assert p[1:6] == [shown(m[k]) for k in ("n", "predicted_positive", "chose_first_position",
                                                 "baseline_all_negative_correct", "baseline_all_positive_correct")]
    u = rows_by_first(t, "options-uncertainty")
    assert set(u) == set(s["flips"]) == set(s["uncertainty"]["paired"])
    for name, x in s["uncertainty"]["paired"].items():
        assert u[name][8] == shown(x["mcnemar_p"]) == shown(s["flips"][name]["mcnemar_p"]), name
    f = rows_by_first(t, "options-flips")
    assert set(f) == set(s["flips"])
    for name, x in s["flips"].items():
        assert f[name][2:8] == [shown(x[k]) for k in ("flips", "gains", "losses", "net", "n_discordant",
                                                      "mcnemar_p")], name
    # in the run's config order (letters fwd/rev first), the primary comparison marked
    cfg = json.loads((out / "options" / "config.json").read_text())
    listed = [f"{a} vs {b}" for a, b in cfg["config"]["options_comparisons"]]
    assert [r[0] for r in t["options-flips"]] == listed
    assert [r[0] for r in t["options-flips"] if r[1] == "primary"] == ["list_letter_fwd vs list_letter_rev"] == \
        listed[:1]
    # the 2x2 matrices, recounted here from records.jsonl, and their off-diagonal against summary.json
    records = [json.loads(l) for l in (out / "options" / "records.jsonl").read_text().splitlines() if l.strip()]
    for space, a, b in (("letter", "list_letter_fwd", "list_letter_rev"), ("text", "list_text_fwd", "list_text_rev")):
        pa = {r["idx"]: r["semantic_pred"] for r in records if r["condition"] == a}
        pb = {r["idx"]: r["semantic_pred"] for r in records if r["condition"] == b}
        m = [[sum(pa[i] == x and pb[i] == y for i in pa) for y in (0, 1)] for x in (0, 1)]
        rows = t[f"options-flipmatrix-{space}"]
        assert [r[1:3] for r in rows[:2]] == [[str(v) for v in row] for row in m], space
        flips = s["flips"][f"{a} vs {b}"]["flips"]
        assert m[0][1] + m[1][0] == flips
        assert rows[3][1] == str(flips) and rows[3][3] == shown(flips)
    ag = rows_by_first(t, "options-agreement")
    assert ag["max |official − independent| (candidate log-likelihood)"][1] == shown(s["agreement"]["max_abs_diff"])
    assert ag["candidates compared"][1] == shown(s["n_candidates"])
    assert ag["lm-eval process_results acc/acc_norm mismatches"][1] == shown(
        s["agreement"]["n_lm_eval_metric_mismatches"])


def check_extraction(t, s, out):
    h = rows_by_first(t, "extraction-scorers")
    for name, sc in s["scorers"].items():
        assert h[name][1:5] == [shown(sc["correct"]), shown(s["n_items"]), shown(sc["accuracy"]),
                                shown(s["uncertainty"]["accuracies"][f"scorers/{name}/accuracy"]["wilson95"])], name
    u = rows_by_first(t, "extraction-uncertainty")
    for name, x in s["uncertainty"]["paired"].items():
        assert u[name][4:9] == [shown(x[k]) for k in ("only_a", "only_b", "difference", "difference_ci95",
                                                      "mcnemar_p")], name
    for name, v in s["constant_answer_baselines"].items():
        assert h[f"baseline: {name}"][1] == shown(v)
    p = rows_by_first(t, "extraction-patterns")    # shown "0-0-1": a name on the page, never read as a number
    assert set(p) == {"-".join(key) for key in s["patterns"]}
    for key, x in s["patterns"].items():
        assert p["-".join(key)][4] == shown(x["n"])
        assert p["-".join(key)][1:4] == ["✓" if ch == "1" else "✗" for ch in key]
    pr = rows_by_first(t, "extraction-paired")
    for x in s["paired"].values():
        assert pr[f"{x['a']} vs {x['b']}"][1:5] == [shown(x[k]) for k in ("both_correct", "only_a", "only_b",
                                                                          "neither")]
    fc = rows_by_first(t, "extraction-failures")
    for cat, n in s["match_failures"]["all"].items():
        assert fc[cat][1:4] == [shown(s["match_failures"][k][cat]) for k in ("all", "regex_wrong", "regex_right")]
    reasons = rows_by_first(t, "extraction-strict-reasons")
    for k, n in s["scorers"]["strict"]["reasons"].items():
        assert reasons[k][1] == shown(n)
    ag = rows_by_first(t, "extraction-agreement")
    assert ag["regex extraction mismatches"][1] == shown(s["regex_agreement"]["n_mismatches"])
    g = s["lm_eval_generate_until"]
    assert ag["generations identical to lm-eval's"][1] == f"{g['n_identical']}/{g['n_compared']}"


def check_mctaco(t, s, out):
    h = rows_by_first(t, "mctaco-headline")
    for key, row in (("official", "official (lm-eval 0.4.9.2)"), ("independent", "independent")):
        assert h[row][1:6] == [shown(s[key]["correct"]), shown(s["n_documents"]), shown(s[key]["acc"]),
                               shown(s["uncertainty"]["accuracies"][f"{key}/acc"]["wilson95"]),
                               shown(s[key]["f1"])], key
    em = s["independent"]["em"]
    assert h["independent"][7:10] == [f"{em['n_correct_questions']}/{em['n_complete_questions']}", shown(em["em"]),
                                      shown(s["uncertainty"]["accuracies"]["independent/em/em"]["wilson95"])]
    for name, b in s["baselines"].items():
        assert h[f"baseline: {name}"][3:6] == [shown(b["acc"]),
                                               shown(s["uncertainty"]["accuracies"][f"baselines/{name}/acc"]["wilson95"]),
                                               shown(b["f1"])]
    sc = rows_by_first(t, "mctaco-scope")
    assert sc["lm-eval's own reported acc"][1] == shown(s["official"]["lm_eval_reported"]["acc"])
    assert sc["lm-eval's own reported F1"][1] == shown(s["official"]["lm_eval_reported"]["f1"])
    cats = rows_by_first(t, "mctaco-categories")
    for c, v in s["by_category"].items():
        assert cats[c][1:3] == [shown(v["n_documents"]), shown(v["acc"])] and cats[c][6] == shown(v["em"])
        assert cats[c][3] == shown(s["uncertainty"]["accuracies"][f"by_category/{c}/acc"]["wilson95"])
    lim = rows_by_first(t, "mctaco-limits")
    groups = rows_by_first(t, "mctaco-limit-groups")
    assert lim["reference (this run)"][3:5] == [shown(s["limit_demo"]["reference"]["acc"]),
                                                shown(s["limit_demo"]["reference"]["f1"])]
    assert s["limit_demo"]["rows"], "the smoke run should demonstrate at least one limit"
    for r in s["limit_demo"]["rows"]:
        row = lim[f"limit {r['limit']}"]
        assert row[2:7] == [shown(r["lm_eval"]["n_samples"]["effective"]), shown(r["lm_eval"]["acc"]),
                            shown(r["lm_eval"]["f1"]), shown(r["delta_vs_reference"]["acc"]),
                            shown(r["delta_vs_reference"]["f1"])]
        g = groups[f"limit {r['limit']}"]
        for c in r["cut_questions"]:
            assert f"q{c['question_rank']} ({c['n_scored']}/{c['n_candidates']} candidates)" in g[3]
        if not r["cut_questions"]:
            assert g[3] == "none"
        assert g[7] == shown(r["max_abs_diff_vs_main_run"])
    ag = rows_by_first(t, "mctaco-agreement")
    assert ag["max |official − independent| (candidate log-likelihood)"][1] == shown(s["agreement"]["max_abs_diff"])
    assert ag["F1: lm-eval vs independent"][1] == shown(s["agreement"]["f1_official_vs_independent"])


def check_harness(t, s, out):
    board = s["leaderboard"]
    h = rows_by_first(t, "harness-leaderboard")
    for name, x in board["tasks"].items():
        assert h[name][1:7] == [x["metric"], shown(x["score"]), f"{x['correct']}/{x['total']}", shown(x["timeouts"]),
                                shown(x["latency_s"]), shown(x["latency_s_mean"])], name
    overall = h["overall (mean of task scores)"]
    assert overall[2] == shown(board["overall"])
    assert overall[3] == f"{sum(x['correct'] for x in board['tasks'].values())}/{s['n_examples']}"
    assert overall[4] == shown(sum(x["timeouts"] for x in board["tasks"].values()))
    assert rows_by_first(t, "harness-settings")["adapter"][1] == board["adapter"]
    # format 3: the sandbox limits one a row, with units, not a JSON object
    limits, sandbox = rows_by_first(t, "harness-sandbox-limits"), board["settings"]["sandbox"]
    assert len(limits) == len(sandbox) and "sandbox limits" not in rows_by_first(t, "harness-settings")
    assert limits["CPU time"][1:3] == [shown(sandbox["cpu_s"]), "s"]
    assert limits["memory (address space)"][1:4] == [shown(sandbox["memory_bytes"]), "bytes",
                                                     f"{sandbox['memory_bytes'] / 2**20:.1f}"]


CHECKS = {"protocol": check_protocol, "options": check_options, "extraction": check_extraction,
          "mctaco": check_mctaco, "harness": check_harness}


FIT_JS = """
const wider = Array.from(document.querySelectorAll('table, .wide')).filter(e =>
  e.getBoundingClientRect().width > e.parentElement.clientWidth + 0.5 || e.scrollWidth > e.clientWidth + 0.5);
return [document.documentElement.scrollWidth, window.innerWidth, wider.map(e => e.id || e.className)];
"""


def assert_fits(browser):
    """Issue 39: at a 1300 px wide window neither the page nor any table scrolls sideways (every table is read
    whole where it stands)."""
    assert browser.execute_script("return window.innerWidth") == 1300
    width, inner, wider = browser.execute_script(FIT_JS)
    assert width <= inner and wider == [], (width, inner, wider)


def check_page(browser, page, out, tmp_path, tag):
    text = page.read_text(encoding="utf-8")
    assert "-0.0000" not in text and "+0.0000" not in text     # format 3: a zero is never signed
    # plots a person looks at: protocol 2, options 3, extraction 2, mctaco 3, harness 1
    assert_self_contained(text, min_images=11)
    shot = tmp_path / f"report-{tag}.png"
    got = render(browser, page, shot)
    assert_not_blank(shot)
    outside = [u for u in got["requested"] if u != page.resolve().as_uri() and not u.startswith("data:")]
    assert outside == [], f"the page requested {outside[:5]}"
    assert got["images"] and all(done and width > 0 for done, width, _ in got["images"]), got["images"]
    assert got["errors"] == 0, "a section fell back to the generic table on real evidence"
    assert_fits(browser)
    assert got["sections"] == list(registry.NAMES) and set(CHECKS) == set(registry.NAMES), got["sections"]
    assert_numbers_rounded(got["cells"])      # every number shown rounded, its exact value kept in data-value
    for name, check in CHECKS.items():
        summary = json.loads((out / name / "summary.json").read_text())
        check(got["tables"], summary, out)
        check_stages(got["tables"], out, name)
    return got


@pytest.mark.slow
def test_report_written_by_run_py(smoke_run, browser, tmp_path):
    out, proc = smoke_run
    page = out / "report.html"
    assert page.exists(), "run.py --smoke did not write O/report.html:\n" + proc.stdout[-2000:]
    assert f"report: {page}" in proc.stdout
    check_page(browser, page, out, tmp_path, "run-py")
    if os.environ.get("DOCS_SCREENSHOT") == "1":      # the README's picture: the protocol section down to its plots
        from PIL import Image

        top, bottom = browser.execute_script(
            "const s = document.getElementById('protocol'), y = window.scrollY;"
            "const b = Math.max(...Array.from(s.querySelectorAll('img')).map(i => i.getBoundingClientRect().bottom));"
            "return [s.getBoundingClientRect().top + y, b + y];")
        target = REPO_ROOT / "docs" / "images" / "report.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(tmp_path / "report-run-py.png") as im:
            im.crop((0, max(0, int(top) - 20), im.width, min(im.height, int(bottom) + 20))).save(target, optimize=True)


@pytest.mark.slow
def test_report_cli_on_a_copy_of_the_evidence(smoke_run, browser, tmp_path):
    src, _ = smoke_run
    out = tmp_path / "O"
    shutil.copytree(src, out)
    (out / "report.html").unlink(missing_ok=True)
    proc = run_cli(REPORT, out, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == str(out / "report.html")
    check_page(browser, out / "report.html", out, tmp_path, "cli")
    # the same evidence gives the same page, byte for byte, whoever calls report.py and wherever O lies
    assert (out / "report.html").read_bytes() == (src / "report.html").read_bytes()


@pytest.mark.slow
def test_network_check_catches_an_external_resource(browser, tmp_path):
    """The request log is what the page tests rely on; it must see a fetch when there is one."""
    page = tmp_path / "leaky.html"
    page.write_text('<!doctype html><html><body><p>x</p><img src="http://127.0.0.1:9/nothing.png"></body></html>',
                    encoding="utf-8")
    with pytest.raises(AssertionError):
        assert_self_contained(page.read_text())
    got = render(browser, page, tmp_path / "leaky.png")
    assert any(u.startswith("http://127.0.0.1:9/") for u in got["requested"]), got["requested"]


# ---- a derived, deterministic page; every number names its source; atomic on a full disk ---------------------

class SourcedCells(HTMLParser):
    """Every element with data-value: (data-src, data-value, text); the run id meta."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.cells, self.run_ids, self.derived, self._open = [], [], 0, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "meta" and a.get("name") == "evidence-run-id":
            self.run_ids.append(a.get("content"))
        if "data-value" in a:
            self._open = [a.get("data-src"), a["data-value"], ""]
        elif "derived" in (a.get("class") or "").split():
            self.derived += 1

    def handle_endtag(self, tag):
        if tag == "td" and self._open is not None:
            self.cells.append(tuple(self._open))
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data


def evidence_value(out, src):
    """The value a data-src names: <exp>/<file>.json#a.b.0 or <exp>/records.jsonl#<line from 1>.a.b."""
    rel, path = src.split("#")
    assert len(rel.split("/")) == 2, src
    keys = path.split(".") if path else []
    if rel.endswith(".jsonl"):
        lines = (out / rel).read_text().splitlines()
        obj, keys = json.loads(lines[int(keys[0]) - 1]), keys[1:]
    else:
        obj = json.loads((out / rel).read_text())
    for k in keys:
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    return obj


def sourced_evidence(tmp_path):
    out, _ = minimal_evidence(tmp_path)
    env = json.loads((out / "environment.json").read_text())
    write_json(out / "environment.json", {**env, "run_id": "ab" * 16, "cpu_count": 2})
    (out / "novel" / "records.jsonl").write_text('{"idx": 3, "score": -1.25}\n{"idx": 1}\n', encoding="utf-8")
    return out


def test_every_number_cell_names_the_evidence_value_it_shows(tmp_path):
    out = sourced_evidence(tmp_path)
    text = load("page").build(out)
    page = SourcedCells()
    page.feed(text)
    assert page.run_ids == ["ab" * 16]
    assert len(page.cells) >= 10
    for src, value, shown_text in page.cells:
        assert src, (value, shown_text)
        assert json.dumps(evidence_value(out, src)) == value, (src, value)
        assert is_rounding_of(shown_text, value), (src, shown_text, value)
    assert ("novel/summary.json#accuracy", "0.42857142857142855", "0.4286") in page.cells
    assert "environment.json#" not in text, "only an experiment's own files are sources"


def test_the_page_is_deterministic_and_shows_no_audit_state(tmp_path):
    """Same evidence -> same bytes: no clock, no path of O; an audit.json (any state) changes nothing on the page."""
    page = load("page")
    out = sourced_evidence(tmp_path)
    first = page.build(out)
    time.sleep(1.1)
    assert page.build(out) == first
    copy = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(out, copy)
    assert page.build(copy) == first
    (out / "audit.json").write_text(json.dumps({"checks": [{"experiment": "novel", "status": "FAIL-ZZZ"}],
                                                "levels": ["arithmetic"], "exit_code": 1}))
    assert page.build(out) == first and "FAIL-ZZZ" not in first
    assert "run python audit.py O" in first
    assert str(tmp_path) not in first


def test_a_full_disk_leaves_no_temp_file_and_the_evidence_intact(tmp_path, monkeypatch):
    """Fault injection (os.fsync raises ENOSPC): write() raises, no .report.html.*.tmp is left, an earlier
    report.html and the evidence are untouched; report.py's CLI says so on one line (exit 2); run.py's
    write_report turns it into one warning."""
    import errno

    import run as run_py

    report, page = load_report(), load("page")
    out = sourced_evidence(tmp_path)
    report.write(out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(page.os, "fsync", full)
    with pytest.raises(OSError):
        report.write(out)
    with pytest.raises(OSError):
        page.write(out)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and not [p for p in out.iterdir() if p.name.startswith(".")]
    assert report.main([str(out)]) == 2
    monkeypatch.setitem(sys.modules, "report", report)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        run_py.write_report(out, ["novel"])
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: report.html not written")
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_full_tmpfs_leaves_no_temp_file(tmpfs):
    """The same on a real full disk: a 64 KiB tmpfs holding the evidence, filled to the last byte (root only)."""
    mnt = tmpfs("64k")
    out = sourced_evidence(mnt / "o")
    fill(mnt)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = run_cli(REPORT, out, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "not written" in proc.stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


# ---- the layout follows the evidence format (evidence_report/layout.py) -----------------------------------------

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "cross_machine" / "run.py-smoke"     # format 2 evidence, another machine


def paired_evidence():
    """summary.json's uncertainty block by hand: two comparisons whose difference interval is zero at both ends
    (one with a and b right on the same items, as the cross-machine fixture's exact_vs_strict), one that is not."""
    cells = load("cells")
    return cells.sourced({"uncertainty": {"paired": {
        "same": {"a": "exact", "b": "strict", "n": 2, "only_a": 0, "only_b": 0, "difference": 0.0,
                 "difference_ci95": [-5.551115123125783e-17, 5.551115123125783e-17], "mcnemar_p": 1.0},
        "apart": {"a": "x", "b": "y", "n": 9, "only_a": 3, "only_b": 0, "difference": 0.3333333333333333,
                  "difference_ci95": [-0.0271, 0.6491], "mcnemar_p": 0.25},
        "near": {"a": "x", "b": "z", "n": 9, "only_a": 1, "only_b": 1, "difference": -1e-17,
                 "difference_ci95": [-2e-05, 3e-05], "mcnemar_p": 1.0}}}}, "exp/summary.json#")


def test_format3_shows_no_signed_zero_and_names_a_degenerate_interval():
    from evidence_report.layout import NEWEST, Layout

    cells, shared = load("cells"), load("shared")
    summary = paired_evidence()
    new, old = (shared.paired_table(summary, "t", "", layout) for layout in (NEWEST, Layout(2)))
    assert ">[0.0000, 0.0000]</td>" in new and ">0.0000</td>" in new
    assert "-0.0000" not in new and "+0.0000" not in new
    assert ">[-0.0000, +0.0000]</td>" in old and ">-0.0000</td>" in old and "degenerate" not in old
    assert shared.degenerate_intervals(summary["uncertainty"]["paired"]) == (
        '<p class="note">same: the 95% interval of the difference is degenerate, zero at both ends to four decimals '
        "(a and b are right on exactly the same items, so the difference is zero and the interval has no width); "
        "its exact bounds are in the cell&#x27;s tooltip. near: the 95% interval of the difference is degenerate, "
        "zero at both ends to four decimals; its exact bounds are in the cell&#x27;s tooltip.</p>")
    # the exact values stay in data-value either way, and a bound of 1e-4 is not a zero
    assert 'data-value="[-5.551115123125783e-17, 5.551115123125783e-17]"' in new
    assert [cells.unsigned_zero(t) for t in ("-0.0000", "+0.0000", "-0.000", "-0.0", "-0.0001", "+0.0444", "0.0")] \
        == ["0.0000", "0.0000", "0.000", "0.0", "-0.0001", "+0.0444", "0.0"]
    assert not shared.is_degenerate([0.0, 1e-04]) and shared.is_degenerate([0.0, 0.0])


def test_format3_shows_the_sandbox_limits_as_text_with_units():
    from evidence_report.layout import NEWEST, Layout

    harness = load("sections.harness")
    limits = {"cpu_s": 2, "wall_s": 5.0, "memory_bytes": 268435456, "mode": "auto", "nofile": 32, "pidns": False,
              "extra_s": 1.5}
    rows = [(name, value, unit, getattr(mib, "how", mib)) for name, value, unit, mib in harness.limit_rows(limits)]
    assert rows == [("isolation mode asked for", "auto", "", ""), ("CPU time", 2, "s", ""),
                    ("wall time (ready to result)", 5.0, "s", ""),
                    ("memory (address space)", 268435456, "bytes", "MiB"), ("open files", 32, "files", ""),
                    ("extra_s", 1.5, "s", ""), ("pidns", False, "", "")]
    summary = load("cells").sourced({"leaderboard": {"tasks": {}, "settings": {"sandbox": limits}}},
                                    "harness/summary.json#")
    new, old = (harness.render(None, summary, layout) for layout in (NEWEST, Layout(2)))
    t, _ = parse_cells(new)
    assert [[text for _, text in r] for r in t["harness-sandbox-limits"]][1:4] == [
        ["CPU time", "2", "s", ""], ["wall time (ready to result)", "5.0", "s", ""],
        ["memory (address space)", "268435456", "bytes", "256.0"]]
    assert [v for v, _ in t["harness-sandbox-limits"][1]] == [None, "2", None, None]     # the value is a number cell
    assert "sandbox limits" not in [r[0][1] for r in t["harness-settings"]]
    assert "&quot;cpu_s&quot;" not in new and "harness-sandbox-limits" not in old
    assert ">{&quot;cpu_s&quot;: 2, &quot;wall_s&quot;: 5.0" in old             # format 2: the JSON object whole


def relabelled(tmp_path, fmt):
    """A copy of the cross-machine fixture (real evidence of all five experiments) whose JSON files declare
    evidence format `fmt`: the page follows the format the evidence declares, nothing else."""
    out = tmp_path / f"format{fmt}"
    shutil.copytree(FIXTURE, out)
    for p in out.rglob("*.json"):
        text = p.read_text(encoding="utf-8")
        assert '"evidence_format": 2' in text, p
        p.write_text(text.replace('"evidence_format": 2', f'"evidence_format": {fmt}'), encoding="utf-8")
    return out


def test_the_layout_follows_the_evidence_format_the_evidence_declares(tmp_path):
    """Format 2 evidence is drawn byte for byte as it was given its page; the same numbers declared format 3 get the
    newer layout, and the audit's whitelist (evidence_audit/report_page.py) passes every cell of it."""
    from evidence_audit import report_page as audit_page
    from evidence_report.layout import NEWEST_FORMAT

    assert NEWEST_FORMAT == load("reading").READS_EVIDENCE_FORMATS[1]
    page = load("page")
    assert page.build(FIXTURE) == (FIXTURE / "report.html").read_text(encoding="utf-8")
    old = (FIXTURE / "report.html").read_text(encoding="utf-8")
    assert "[-0.0000, +0.0000]" in old and "&quot;cpu_s&quot;" in old      # what issue 39 found on format 2's page
    out = relabelled(tmp_path, 3)
    new = page.build(out)
    assert "-0.0000" not in new and "+0.0000" not in new and "&quot;cpu_s&quot;" not in new
    assert "exact_vs_strict: the 95% interval of the difference is degenerate" in new
    t, _ = parse_cells(new)
    assert ["CPU time", "2", "s", ""] in [[text for _, text in r] for r in t["harness-sandbox-limits"]]
    assert {len(r) for r in t["options-conditions"]} == {8} and "options-predictions" in t
    (out / "report.html").write_text(new, encoding="utf-8")
    parsed = audit_page.parse(out / "report.html")
    ev = audit_page.Evidence(out)
    bad = parsed.problems + audit_page.style_problems(parsed) + audit_page.prose_problems(parsed)
    bad += [b for table in parsed.tables for b in audit_page.table_problems(ev, table, out)]
    assert bad == []
    # a number cell of the new limits table edited: the whitelist still catches it
    edited = new.replace('data-value="268435456">268435456<', 'data-value="268435456">268435457<')
    assert edited != new
    (out / "report.html").write_text(edited, encoding="utf-8")
    parsed = audit_page.parse(out / "report.html")
    bad = [b for table in parsed.tables for b in audit_page.table_problems(ev, table, out)]
    assert len(bad) == 1 and "268435457" in bad[0] and "not a rounding" in bad[0], bad


@pytest.mark.slow
def test_format3_page_fits_a_1300px_window_and_format2_did_not(browser, tmp_path):
    """The fit check is able to fail: format 2's page of the cross-machine fixture scrolls its options table
    sideways at 1300 px (issue 39); the same evidence declared format 3 fits."""
    out = relabelled(tmp_path, 3)
    (out / "report.html").write_text(load("page").build(out), encoding="utf-8")
    for page, fits in ((FIXTURE / "report.html", False), (out / "report.html", True)):
        render(browser, page, tmp_path / f"{page.parent.name}.png")
        if fits:
            assert_fits(browser)
        else:
            with pytest.raises(AssertionError, match="options-conditions"):
                assert_fits(browser)
