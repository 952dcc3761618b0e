"""The number cells: how a value is shown, and the <td> that keeps its exact value and its place in the evidence.

Numbers are rounded for reading, by what they are (fmt's styles): counts as integers, accuracies and other rates to
4 decimals, p-values to 3 decimals (e-notation below 0.001), differences of log-likelihoods to 2 significant digits
(0.0, 1.2e-05), seconds to the millisecond; null is "—". The exact value, as json.dumps wrote it into the evidence,
stays in every number cell's data-value attribute (and its tooltip), and the place it was read from in data-src
("<exp>/<file>#<dotted.path>", or "<exp>/records.jsonl#<line>.<path>", line from 1): audit.py checks every such
cell against the evidence. The place travels with the value (sourced: the Sourced* types, set by
evidence_report.reading); a figure the page computes has lost it and is labelled derived, with no data-value, except
a Derived figure (one value through one of DERIVATIONS), which names the value in data-of for the audit to recompute.
"""
import html
import json
import re

from evidence_report.layout import NEWEST


def _general(x):
    """A float of unknown meaning: 4 decimals at most, e-notation only when that would hide it."""
    if x == 0:
        return "0.0"
    if 1e-3 <= abs(x) < 1e15:
        return repr(round(x, 4))
    return f"{x:.3g}"


def _diff(x):
    """A difference of log-likelihoods: 0.0 exactly when it is zero, else 2 significant digits (1.2e-05)."""
    if x == 0:
        return "0.0"
    return f"{x:.1e}" if abs(x) < 1e-3 else f"{x:.2g}"


def _pvalue(x):
    if x == 0:
        return "0.0"
    return f"{x:.3f}" if x >= 1e-3 else f"{x:.1e}"


FLOAT_STYLES = {
    "general": _general,
    "rate": lambda x: f"{x:.4f}",                                   # accuracies, F1, EM, task scores
    "delta": lambda x: "0.0000" if x == 0 else f"{x:+.4f}",        # a difference of two rates
    "pvalue": _pvalue,
    "diff": _diff,
    "seconds": lambda x: f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}",
}


def fmt(x, style="general"):
    """A value as the page shows it: numbers rounded by style, bools/lists as JSON, null as —."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return f"{x:+d}" if style == "signed" and x else str(x)
    if isinstance(x, float):
        return FLOAT_STYLES.get(style, _general)(x)
    if isinstance(x, (list, dict)):
        return json.dumps(x)
    return str(x)


SIGNED_ZERO = re.compile(r"[-+](0\.?0*)")


def unsigned_zero(text):
    """A rounded number's text with the sign of a zero dropped ("-0.0000" -> "0.0000", "+0.0000" -> "0.0000"): a
    value that rounds to zero is shown like an exact zero (format 3's layout; its exact value stays in data-value)."""
    m = SIGNED_ZERO.fullmatch(text)
    return m[1] if m else text


class Num:
    """A number cell: shown rounded by style; its exact JSON text is kept in data-value (and the tooltip), the place
    in the evidence it was read from in data-src (a number the page computes is labelled derived instead)."""

    def __init__(self, value, style="general"):
        self.value, self.style = value, style


class SourcedInt(int):
    """An int read from an experiment's evidence file, with the place it was read from (data-src)."""
    src = None


class SourcedFloat(float):
    """A float read from an experiment's evidence file, with the place it was read from (data-src)."""
    src = None


class SourcedList(list):
    """A list read from an experiment's evidence file, with the place it was read from (data-src)."""
    src = None


class SourcedDict(dict):
    """A JSON object read from an experiment's evidence file, with the place it was read from (data-src): a cell
    showing it whole shows its JSON text, exact, so it needs no data-value; audit.py compares the two."""
    src = None


class Derived:
    """A figure computed from one evidence value by a named derivation (DERIVATIONS: "MiB" of a byte count): shown
    as derived, with the value's place in data-of and the derivation in data-derive, so audit.py recomputes it."""

    def __init__(self, value, how):
        self.value, self.how = value, how


DERIVATIONS = {"MiB": lambda v: f"{v / 2**20:.1f}"}     # audit.py keeps its own copy (report_page.DERIVATIONS)


def sourced(obj, src):
    """obj (parsed JSON) with every number and list marked with its data-src ("<exp>/<file>#<dotted.path>"); the
    marks survive only plain reading: any arithmetic gives a plain number again, which the page shows as derived.
    A path through a key holding "." cannot be written dotted: such values stay unmarked (derived)."""
    if isinstance(obj, dict):
        out = SourcedDict({k: sourced(v, f"{src}{'.' if not src.endswith('#') else ''}{k}"
                                      if src and "." not in str(k) else None) for k, v in obj.items()})
        out.src = src
        return out
    if isinstance(obj, list):
        out = SourcedList(sourced(v, f"{src}{'.' if not src.endswith('#') else ''}{i}" if src else None)
                          for i, v in enumerate(obj))
        out.src = src
        return out
    if isinstance(obj, bool) or not isinstance(obj, (int, float)) or src is None:
        return obj
    out = SourcedInt(obj) if isinstance(obj, int) else SourcedFloat(obj)
    out.src = src
    return out


def count(x):
    return Num(x, "count")


def rate(x):
    return Num(x, "rate")


def interval(summary, key):
    """The 95% interval summary.json's uncertainty block holds for the accuracy `key` ("official/accuracy", ...):
    a number cell "[lo, hi]" (null when there is none), shown like a rate."""
    entry = ((summary.get("uncertainty") or {}).get("accuracies") or {}).get(key) or {}
    return Num(entry.get("wilson95"), "rate")


class Raw(str):
    """A table cell that is already HTML (not escaped)."""


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def esc(x):
    return html.escape(str(x))


def cell(c, layout=NEWEST):
    """One <td>, in the page's layout (evidence_report.layout; a table drawn without one is drawn in the newest)."""
    if isinstance(c, Raw):
        return f"<td>{c}</td>"
    if isinstance(c, Derived):
        return derived_cell(c)
    if isinstance(c, SourcedDict) and c and c.src and not c.src.endswith("#"):    # shown whole, as its JSON text
        return f'<td data-src="{esc(c.src)}">{esc(json.dumps(c))}</td>'
    value, style = (c.value, c.style) if isinstance(c, Num) else (c, "general")
    shown = (lambda v: fmt(v, style)) if layout.format2 else (lambda v: unsigned_zero(fmt(v, style)))
    if isinstance(value, list) and value and all(map(is_number, value)):    # e.g. [official, independent]
        text = "[" + ", ".join(shown(v) for v in value) + "]"
    elif is_number(value):
        text = shown(value)
    else:
        return f"<td>{esc(fmt(value))}</td>"
    exact = json.dumps(value)
    src = getattr(value, "src", None)
    if src is None or src.endswith("#"):
        return f'<td class="num derived" title="derived from the evidence">{esc(text)}</td>'
    tip = f' title="{esc(exact)}"' if text != exact else ""
    return f'<td class="num" data-src="{esc(src)}" data-value="{esc(exact)}"{tip}>{esc(text)}</td>'


def derived_cell(d):
    """A Derived figure: its text, and the value and derivation audit.py recomputes it from; a value without a place
    in the evidence (or null) is shown as a plain derived number."""
    src = getattr(d.value, "src", None)
    if d.value is None or not is_number(d.value):
        return f"<td>{esc(fmt(d.value))}</td>"
    text = DERIVATIONS[d.how](d.value)
    if src is None or src.endswith("#"):
        return f'<td class="num derived" title="derived from the evidence">{esc(text)}</td>'
    return (f'<td class="num derived" data-of="{esc(src)}" data-derive="{esc(d.how)}" '
            f'title="derived from the evidence">{esc(text)}</td>')
