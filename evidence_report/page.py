"""The page: one section per experiment in the order of evidence_report.sections.SECTIONS (then any other experiment
directory, by name, in the generic view), the environment, and the atomic write of O/report.html."""
import os
import sys
import tempfile
import traceback
from pathlib import Path

from evidence_report.cells import esc, fmt
from evidence_report.layout import layout_of
from evidence_report.reading import UnknownFormat, check_formats, read_json, read_optional
from evidence_report.sections import SECTIONS
from evidence_report.shared import generic_section, identity_section, stages_section
from evidence_report.tables import note, table


def render_error(what):
    """The error box for the exception being handled: the error and the last frames by file name and line, no path
    (the page holds no path of O nor of the code, so the same evidence gives the same bytes wherever it lies)."""
    etype, err, tb = sys.exc_info()
    frames = [f"  {Path(f.filename).name}:{f.lineno} in {f.name}" for f in traceback.extract_tb(tb)[-3:]]
    text = "\n".join(["Traceback (most recent call last, file names only):", *frames,
                       "".join(traceback.format_exception_only(etype, err)).strip()])
    return (f'<div class="render-error"><b>report.py could not draw {esc(what)} from the evidence</b>'
            f"<pre>{esc(text)}</pre></div>")


def experiment_section(out, name, layout):
    """One experiment, in the page's layout (evidence_report.layout). The page is a view, not a check: evidence of an
    unexpected shape is shown as an error box (plus the generic table when summary.json is readable), never allowed
    to stop the page."""
    exp_dir = out / name
    try:
        summary = read_json(exp_dir / "summary.json")
        if not isinstance(summary, dict):
            raise ValueError(f"summary.json holds a {type(summary).__name__}, not an object")
    except Exception:
        return (f'<section id="{esc(name)}"><h2>{esc(name)}</h2>{render_error(f"{name}/summary.json")}'
                "</section>")
    split = summary.get("split", "?")
    warn = ('<p class="warn">SPLIT ALL: every row of the validation split in idx order, the held-back confirmation '
            'items included.</p>' if split == "all" else
            '<p class="warn">CONFIRMATION SPLIT: these are the held-back confirmation items.</p>'
            if summary.get("confirmation_items_scored") else "")
    try:
        body = (SECTIONS[name].render if name in SECTIONS else generic_section)(exp_dir, summary, layout)
    except Exception:
        try:
            body = render_error("this section") + generic_section(exp_dir, summary, layout)
        except Exception:
            body = render_error("this section")
    extra = ""
    for part in (stages_section, identity_section):
        try:
            extra += part(exp_dir, name, layout)
        except Exception:
            extra += render_error(part.__name__.replace("_section", ""))
    return (f'<section id="{esc(name)}"><h2>{esc(name)} <small>split: {esc(split)}</small></h2>{warn}{body}'
            f"{extra}</section>")


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h2{border-bottom:2px solid #4c72b0;padding-bottom:2px;margin-top:2em}h3{margin:1.2em 0 .3em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;
text-align:left;vertical-align:top}th{background:#f2f2f2}table.headline td{font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}td[title]{cursor:help}
tr.primary td{background:#eaf0fa;font-weight:600}
table.kv td:first-child{color:#444}td.num:nth-child(2):last-child{text-align:left}
caption{caption-side:bottom;font-size:12px;color:#555;text-align:left}
table.matrix td:nth-child(n+2){text-align:right}.side{display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start}
.plots{display:flex;flex-wrap:wrap;gap:6px}.plots img{border:1px solid #eee;max-width:100%}
.warn{color:#a00;font-weight:700}.ok{color:#2a7a2a;font-weight:700}.bad{color:#a00;font-weight:700}
.note{font-size:13px;color:#444;max-width:60em}small{color:#666;font-weight:400}code{background:#f4f4f4}
.wide{overflow-x:auto;max-width:100%}details{margin:.4em 0}
.render-error{border:2px solid #a00;padding:.5em;background:#fff3f3}
"""


def experiment_names(out):
    names = [n for n in SECTIONS if (out / n / "summary.json").exists()]
    names += sorted(p.name for p in out.iterdir()
                    if p.is_dir() and (p / "summary.json").exists() and p.name not in names and p.name != "private")
    return names


def run_id_of(out, names):
    """The run id the page is built for: environment.json's, else MANIFEST.json's, else the first identity's."""
    for path in [out / "environment.json", out / "MANIFEST.json", *(out / n / "identity.json" for n in names)]:
        rid = read_optional(path).get("run_id") if path.is_file() else None
        if isinstance(rid, str):
            return rid
    return ""


def build(out):
    """The page, deterministic: the same evidence gives the same bytes (no clock, no path of O, no audit state),
    drawn in the layout of the evidence format its files declare (evidence_report.layout: format 2 evidence keeps
    the page it was given). Raises UnknownFormat for evidence of a format the page does not read (before any part
    is drawn)."""
    out = Path(out)
    names = experiment_names(out)
    layout = layout_of(check_formats(out, names))
    env = read_optional(out / "environment.json")
    env_rows = [("run id", env.get("run_id")), ("git commit", env.get("git_commit")),
                ("git dirty", env.get("git_dirty")), ("code sha256", env.get("code_sha256")),
                ("python", env.get("python")), ("platform", env.get("platform")), ("cpu", env.get("cpu")),
                ("cpu count", env.get("cpu_count")), ("torch threads", env.get("torch_threads")),
                ("command line", " ".join(map(str, env.get("command_line") or [])) or None)]
    env_rows = [(k, fmt(v)) for k, v in env_rows]       # shown as text: environment.json is not an experiment's file
    env_rows += [(k, v) for k, v in sorted((env.get("versions") or {}).items())]
    sections = "".join(experiment_section(out, n, layout) for n in names)
    toc = " · ".join(f'<a href="#{esc(n)}">{esc(n)}</a>' for n in names) or "no experiment evidence found"
    run_id = run_id_of(out, names)
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f'<meta name="evidence-run-id" content="{esc(run_id)}">'
            f"<title>Evidence report {esc(run_id)}</title>"
            f"<style>{CSS}</style></head><body><h1>Evidence report</h1>"
            "<p>Built by report.py from the evidence files of this directory only (the same evidence always gives "
            "the same page). Numbers are rounded for reading (rates to 4 decimals, log-likelihood "
            "differences to 2 significant digits, — means null); hover over a number to see the exact value written "
            "in the evidence, whose place its data-src attribute names (numbers marked derived are computed from "
            "the evidence for this page). Agreement of two implementations shows a score was computed as declared; "
            "it does not show that the task or its labels are valid. A development subset of a fixture is not a "
            "benchmark result.</p>"
            f"<p>{toc}</p>{table(['environment', 'value'], env_rows, 'environment', layout=layout)}"
            + note("This page shows no audit result: run python audit.py O to check the evidence (the audit also "
                   "checks this page against it).")
            + f"{sections}</body></html>")


MAX_PAGE_BYTES = 256 << 20        # a full run's page is a few MB (plots embedded); a bigger file is not read


def difference(page, rebuilt, context=40):
    """None when the two pages are the same text; else one line: where they first differ (line, column) and a short
    excerpt of each side there (control characters escaped), noting when the place is inside an embedded plot."""
    if page == rebuilt:
        return None
    i = next((k for k, (x, y) in enumerate(zip(page, rebuilt)) if x != y), min(len(page), len(rebuilt)))
    line = page.count("\n", 0, i) + 1
    col = i - (page.rfind("\n", 0, i) + 1) + 1
    start = max(0, i - context)
    excerpt = lambda t: repr(t[start:i + context])[1:-1]        # noqa: E731
    plot = page.rfind("data:image/png;base64,", 0, i)
    inside = plot != -1 and '"' not in page[plot:i]
    return (f"first difference at line {line} col {col}"
            + (" (inside an embedded plot: its pixels differ, or this matplotlib draws them differently)"
               if inside else "")
            + f": the page has …{excerpt(page)}…, the rebuilt page has …{excerpt(rebuilt)}…")


def check(out):
    """Rebuild the page from the evidence under OUT and compare it with OUT/report.html (report.py --check): (exit
    code, one line): 0 the same bytes, 1 they differ (where, with an excerpt of each), 2 report.html unreadable (over
    MAX_PAGE_BYTES, not UTF-8) or evidence of a format the page does not read."""
    path = Path(out) / "report.html"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PAGE_BYTES + 1)
        if len(data) > MAX_PAGE_BYTES:
            return 2, f"{path}: over {MAX_PAGE_BYTES} bytes; report.py writes a few MB"
        diff = difference(data.decode("utf-8"), build(out))
    except UnknownFormat as e:
        return 2, str(e)
    except OSError as e:
        return 2, f"{path}: not readable ({e.strerror or e})"
    except UnicodeDecodeError as e:
        return 2, f"{path}: not UTF-8 (byte {e.start}); report.py writes UTF-8"
    if diff:
        return 1, f"{path}: not the page the evidence gives: {diff}"
    return 0, f"{path}: the page the evidence gives (rebuilt and compared byte for byte)"


def write(out):
    """Write OUT/report.html atomically (temp file in OUT, fsync, rename); on any error (a full disk) the temp file
    is removed and the error raised: the evidence and an earlier report.html are untouched. (resources.py has the
    same few lines: report.py and evidence_report/ import none of the code that wrote the evidence, so the page keeps
    its own copy.)"""
    path = Path(out) / "report.html"
    data = build(out).encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".report.html.", suffix=".tmp")
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
    return path
