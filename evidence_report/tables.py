"""HTML tables and the small pieces of text around them; every cell goes through evidence_report.cells.cell."""
from evidence_report.cells import Num, Raw, cell, esc, is_number
from evidence_report.layout import NEWEST


def table(header, rows, tid="", cls="", caption="", row_classes=None, layout=NEWEST):
    """A table in the page's layout (evidence_report.layout): the sections that draw format 2 evidence pass theirs;
    a table drawn without one is drawn in the newest, the one of the evidence run.py writes."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    row_classes = row_classes or [""] * len(rows)
    body = "".join((f'<tr class="{esc(rc)}">' if rc else "<tr>") + "".join(cell(c, layout) for c in r) + "</tr>"
                   for r, rc in zip(rows, row_classes))
    idattr = f' id="{esc(tid)}"' if tid else ""
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<table{idattr} class="{cls}">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def kv_table(rows, tid="", caption="", header=("figure", "value"), layout=NEWEST):
    return table(list(header), rows, tid, "kv", caption, layout=layout)


def ratio(a, b):
    return "—" if a is None or b is None else f"{a}/{b}"


def idx_list(xs, limit=12):
    """Item ids: a short list read from the evidence is a number cell ("[100, 189]", checked by audit.py); a long one
    is cut ("100, 189, … (40 in all)": text, not a figure)."""
    if getattr(xs, "src", None) and 0 < len(xs) <= limit and all(map(is_number, xs)):
        return Num(xs, "count")
    xs = list(xs or [])
    if not xs:
        return "—"
    shown = ", ".join(str(x) for x in xs[:limit])
    return shown + (f", … ({len(xs)} in all)" if len(xs) > limit else "")


def passed(flag):
    return Raw('<span class="ok">passed</span>') if flag else Raw('<span class="bad">FAILED</span>')


def note(text):
    return f'<p class="note">{esc(text)}</p>'


def wide(html_table):
    return f'<div class="wide">{html_table}</div>'


def flatten(d, prefix=""):
    """Nested summary -> (dotted key, value) rows, lists of scalars kept on one line."""
    rows = []
    for k, v in sorted(d.items()):
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            rows += flatten(v, key + ".")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            rows.append((key, f"[{len(v)} entries]"))
        else:
            rows.append((key, v))
    return rows
