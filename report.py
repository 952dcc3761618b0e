"""Write O/report.html: one self-contained page a person reads, built from the evidence under O alone.

    python report.py O          # run.py calls this too after its experiments

Per experiment: the headline table, the agreement figures (official vs independent), identity checks, stage times
and peak RSS, and plots where looking beats reading. Plots are PNGs embedded as data URIs (matplotlib, Agg), so
the page needs no network and no other file. Like audit.py it reads only the evidence files, never the code that
wrote them; unlike audit.py it checks nothing — it shows what the evidence says.

Numbers are rounded for reading, by what they are: counts as integers, accuracies and other rates to 4 decimals,
p-values to 3 decimals (e-notation below 0.001), differences of log-likelihoods to 2 significant digits (0.0,
1.2e-05), seconds to the millisecond; null is "—". The exact value, as json.dumps wrote it into the evidence, stays
in every number cell's data-value attribute (and its tooltip), and the place it was read from in data-src
("<exp>/<file>#<dotted.path>", or "<exp>/records.jsonl#<line>.<path>", line from 1): audit.py checks every such
cell against the evidence. A figure the page computes (MiB, the flip matrices counted from records.jsonl, sums)
has no data-value and is labelled derived. The page is deterministic (the same evidence gives the same bytes: no
clock, no path of O) and shows no audit state: it tells the reader to run audit.py O.

Every table that a test or a reader may want to find has an id: "<experiment>-<what>", e.g. "options-conditions".
A section that cannot be rendered (evidence of an unexpected shape) shows the error and the generic table of its
summary instead of breaking the page; the error box has class "render-error".
"""
import argparse
import base64
import html
import io
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

EXPERIMENT_ORDER = ["protocol", "options", "extraction", "mctaco", "harness"]
EXTRACTION_SCORERS = ("exact", "strict", "regex")    # the digit order of summary["patterns"] keys, e.g. "001"
BLUE, ORANGE, GREY, RED, GREEN = "#4c72b0", "#dd8452", "#8c8c8c", "#c44e52", "#55a868"


# ---- numbers as text -------------------------------------------------------------------------------------------

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


def sourced(obj, src):
    """obj (parsed JSON) with every number and list marked with its data-src ("<exp>/<file>#<dotted.path>"); the
    marks survive only plain reading: any arithmetic gives a plain number again, which the page shows as derived.
    A path through a key holding "." cannot be written dotted: such values stay unmarked (derived)."""
    if isinstance(obj, dict):
        return {k: sourced(v, f"{src}{'.' if not src.endswith('#') else ''}{k}" if src and "." not in str(k)
                           else None) for k, v in obj.items()}
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


def paired_table(summary, tid, caption=""):
    """The paired comparisons of summary.json's uncertainty block: the 2x2 counts, the difference of accuracies
    a - b with its 95% interval, the exact McNemar p; and the methods, as the evidence names them."""
    unc = summary.get("uncertainty") or {}
    rows = [(name, p.get("a"), p.get("b"), count(p.get("n")), count(p.get("only_a")), count(p.get("only_b")),
             Num(p.get("difference"), "delta"), Num(p.get("difference_ci95"), "delta"), Num(p.get("mcnemar_p"),
                                                                                            "pvalue"))
            for name, p in (unc.get("paired") or {}).items()]
    if not rows:
        return ""
    return ("<h3>Paired comparisons (uncertainty)</h3>"
            + wide(table(["comparison", "a", "b", "items", "only a right", "only b right", "difference a − b",
                          "95% interval", "exact McNemar p"], rows, tid, "", caption))
            + uncertainty_note(unc))


def uncertainty_note(unc):
    return note(f"Intervals: {unc.get('accuracy_interval')}. Differences: {unc.get('difference_interval')}. "
                f"Test: {unc.get('test')}.") if unc else ""


def evidence_src(path, line=None):
    """The data-src prefix of an experiment's evidence file (<exp>/<file>#), None for a file at the top of O."""
    path = Path(path)
    if path.parent.name in ("", ".") or path.parent.name == "private" or not (path.parent / "summary.json").exists():
        return None
    return f"{path.parent.name}/{path.name}#" + (f"{line}" if line is not None else "")


class Raw(str):
    """A table cell that is already HTML (not escaped)."""


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def cell(c):
    if isinstance(c, Raw):
        return f"<td>{c}</td>"
    value, style = (c.value, c.style) if isinstance(c, Num) else (c, "general")
    if isinstance(value, list) and value and all(map(is_number, value)):    # e.g. [official, independent]
        text = "[" + ", ".join(fmt(v, style) for v in value) + "]"
    elif is_number(value):
        text = fmt(value, style)
    else:
        return f"<td>{esc(fmt(value))}</td>"
    exact = json.dumps(value)
    src = getattr(value, "src", None)
    if src is None or src.endswith("#"):
        return f'<td class="num derived" title="derived from the evidence">{esc(text)}</td>'
    tip = f' title="{esc(exact)}"' if text != exact else ""
    return f'<td class="num" data-src="{esc(src)}" data-value="{esc(exact)}"{tip}>{esc(text)}</td>'


# ---- small helpers -------------------------------------------------------------------------------------------

def esc(x):
    return html.escape(str(x))


def table(header, rows, tid="", cls="", caption="", row_classes=None):
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    row_classes = row_classes or [""] * len(rows)
    body = "".join((f'<tr class="{esc(rc)}">' if rc else "<tr>") + "".join(cell(c) for c in r) + "</tr>"
                   for r, rc in zip(rows, row_classes))
    idattr = f' id="{esc(tid)}"' if tid else ""
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<table{idattr} class="{cls}">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def kv_table(rows, tid="", caption="", header=("figure", "value")):
    return table(list(header), rows, tid, "kv", caption)


def ratio(a, b):
    return "—" if a is None or b is None else f"{a}/{b}"


def idx_list(xs, limit=12):
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


def plots(*imgs):
    imgs = [i for i in imgs if i]
    return f'<div class="plots">{"".join(imgs)}</div>' if imgs else ""


def figure(fig, alt):
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def plt_fig(w=5.0, h=3.2, ncols=1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(w, h))


def read_json(path):
    """A JSON file; an experiment's file comes back with its numbers marked by their data-src (sourced)."""
    return sourced(json.loads(Path(path).read_text(encoding="utf-8")), evidence_src(path))


def read_jsonl(path):
    path = Path(path)
    if not path.exists():
        return []
    src = evidence_src(path)
    return [sourced(json.loads(line), src and f"{src}{k}") for k, line in
            enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()]


def read_optional(path):
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {}


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


# ---- shared sections -----------------------------------------------------------------------------------------

def stages_section(exp_dir, name):
    """Stage rows as recorded; works whether or not the experiment's stages include an `imports` row."""
    path = exp_dir / "stages.json"
    if not path.exists():
        return "<h3>Stages</h3><p>stages.json missing</p>"
    st = read_json(path)
    rows, peaks = [], []
    for s in st.get("stages", []):
        rss = s.get("peak_rss_bytes_at_end")
        if rss:
            peaks.append(rss)
        rows.append((s.get("name"), Num(s.get("wall_s"), "seconds"), count(rss),
                     f"{rss / 2**20:.1f}" if rss else None))
    out = "<h3>Stages</h3>" + table(["stage", "wall s", "process peak RSS at end (bytes)", "(MiB, derived)"], rows,
                                    f"{name}-stages")
    extra = [("total wall s", Num(st.get("total_wall_s"), "seconds")), ("torch threads", st.get("threads")),
             ("peak RSS of the run (bytes, max over stages)", count(max(peaks)) if peaks else None),
             ("peak RSS semantics", st.get("peak_rss_semantics"))]
    known = {"stages", "tokens", "total_wall_s", "threads", "peak_rss_semantics"}
    extra += [(k, v) for k, v in sorted(st.items()) if k not in known and not isinstance(v, (dict, list))]
    out += kv_table([r for r in extra if getattr(r[1], "value", r[1]) is not None], f"{name}-stage-totals")
    tokens = st.get("tokens")
    if isinstance(tokens, dict) and tokens:
        out += "<details><summary>token counts</summary>" + table(["token statistic", "value"], flatten(tokens),
                                                                   f"{name}-tokens") + "</details>"
    return out


def identity_section(exp_dir, name):
    ident = read_optional(exp_dir / "identity.json")
    if not ident:
        return ""
    keys = ["model_sha256", "tokenizer_sha256", "data_content_sha256", "prompt_template_sha256",
            "official_config_sha256", "code_sha256", "git_commit", "git_dirty"]
    rows = [(k, ident[k]) for k in keys if k in ident]
    rows += [(k, v) for k, v in sorted(ident.items()) if k not in keys and not isinstance(v, dict)]
    return ("<details><summary>run identity (identity.json)</summary>" + kv_table(rows, f"{name}-identity-json")
            + "</details>")


def scatter_official_vs_independent(pairs, title, groups=None):
    """Candidate scores: official (lm-eval) on x, independent on y, the diagonal in grey."""
    if not pairs:
        return ""
    fig, ax = plt_fig(4.2, 4.0)
    groups = groups or {"candidates": pairs}
    colours = [BLUE, ORANGE, GREEN, RED]
    for (label, ps), colour in zip(groups.items(), colours):
        xs, ys = zip(*ps)
        ax.scatter(xs, ys, s=12, alpha=0.7, color=colour, label=label)
    xs, ys = zip(*pairs)
    lo, hi = min(xs + ys), max(xs + ys)
    pad = (hi - lo) * 0.05 or 0.5
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], lw=0.8, color="grey")
    ax.set_xlabel("official (lm-eval) log-likelihood")
    ax.set_ylabel("independent log-likelihood")
    ax.set_title(title, fontsize=9)
    if len(groups) > 1:
        ax.legend(fontsize=7)
    return figure(fig, "official vs independent candidate scores")


def score_scatter(records, summary, group_of=None):
    """The scatter of every candidate's two scores, optionally coloured by group_of(record)."""
    groups = {}
    for r in records:
        key = group_of(r) if group_of else "candidates"
        groups.setdefault(key, []).extend(zip(r["official"]["scores"], r["independent"]["scores"]))
    title = (f"{summary['n_candidates']} candidate scores; max abs diff "
             f"{fmt(summary['agreement']['max_abs_diff'], 'diff')}")
    return scatter_official_vs_independent([p for ps in groups.values() for p in ps], title,
                                           groups if group_of else None)


def integer_axis(axis):
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def bars_with_baselines(names, series, baselines, title, ylabel="accuracy"):
    """Grouped bars (series: {label: values in names order}, None = no bar) with horizontal baseline lines; each bar
    is labelled with its value to 3 digits (the exact figures are in the tables)."""
    import numpy as np

    fig, ax = plt_fig(max(4.2, 0.6 * len(names) * len(series) + 2.5), 3.3)
    k = len(series)
    width = 0.8 / k
    x = np.arange(len(names))
    for j, ((label, values), colour) in enumerate(zip(series.items(), [BLUE, ORANGE, GREEN, GREY])):
        vals = [np.nan if v is None else v for v in values]
        bars = ax.bar(x + (j - (k - 1) / 2) * width, vals, width, color=colour, label=label)
        ax.bar_label(bars, labels=["" if v is None else f"{v:.3g}" for v in values], fontsize=6, padding=1)
    for label, value, style in baselines:
        ax.axhline(value, ls=style, lw=1.1, color="black", label=label)
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure(fig, title)


def agreement_table(summary, tid, joined_label, joined_key, before=(), after=()):
    """The official-vs-independent agreement figures and the identity join every scored experiment records."""
    ag, ic = summary["agreement"], summary["identity_checks"]
    rows = [("candidates compared", count(summary["n_candidates"])), *before,
            ("max |official − independent| (candidate log-likelihood)", Num(ag.get("max_abs_diff"), "diff")),
            ("candidate score mismatches", count(ag.get("n_candidate_score_mismatches"))),
            ("prediction mismatches", count(ag.get("n_prediction_mismatches"))), *after,
            ("identity checks", passed(ic["passed"])), (joined_label, count(ic.get(joined_key))),
            ("fields joined", ", ".join(ic["fields"]))]
    return "<h3>Agreement: official vs independent</h3>" + kv_table(rows, tid)


# ---- protocol --------------------------------------------------------------------------------------------------

def protocol_section(exp_dir, summary):
    records = read_jsonl(exp_dir / "records.jsonl")
    n = summary["n_items"]
    off, ind, cc = summary["official"], summary["independent"], summary["constant_class_baseline"]
    labels = summary["label_counts"]
    head = table(["path", "correct", "of", "accuracy", "95% interval (Wilson)", "predicted negative",
                  "predicted positive"], [
        ("official (lm-eval 0.4.9.2)", off["correct"], n, rate(off["accuracy"]),
         interval(summary, "official/accuracy"), off["pred_counts"]["0"], off["pred_counts"]["1"]),
        ("independent", ind["correct"], n, rate(ind["accuracy"]), interval(summary, "independent/accuracy"),
         ind["pred_counts"]["0"], ind["pred_counts"]["1"]),
        (f"constant class (always label {cc['label']})", labels.get(str(cc["label"])), n, rate(cc["accuracy"]),
         interval(summary, "constant_class_baseline/accuracy"), None, None)], "protocol-headline", "headline")
    head += paired_table(summary, "protocol-uncertainty", "each path against always answering the majority label, "
                                                     "on the same items")
    head += kv_table([("lm-eval's own reported acc", rate(off.get("lm_eval_reported_acc"))),
                      ("label counts (0 negative / 1 positive)", f"{labels.get('0')} / {labels.get('1')}")],
                     "protocol-reported")
    agree = agreement_table(summary, "protocol-agreement", "samples joined", "n_samples_joined")
    bars = bars_with_baselines(["official", "independent"], {"accuracy": [off["accuracy"], ind["accuracy"]]},
                               [("all negative", labels["0"] / n, "--"), ("all positive", labels["1"] / n, ":")],
                               "accuracy with constant-class baselines")
    return head + agree + plots(score_scatter(records, summary), bars)


# ---- options ---------------------------------------------------------------------------------------------------

def flip_matrix(records, a, b):
    """2x2 counts of semantic predictions (0/1) of condition a (rows) vs b (columns) on the same items."""
    pa = {r["idx"]: r["semantic_pred"] for r in records if r["condition"] == a}
    pb = {r["idx"]: r["semantic_pred"] for r in records if r["condition"] == b}
    m = [[0, 0], [0, 0]]
    for i in sorted(set(pa) & set(pb)):
        m[pa[i]][pb[i]] += 1
    return m


def condition_info(records, conditions_cfg):
    """condition name -> (prompt kind, scoring space, order), from config.json's conditions, else the records."""
    info = {}
    for c in conditions_cfg or []:
        info[c["name"]] = (c.get("prompt"), c.get("space"), c.get("order"))
    for r in records:
        info.setdefault(r["condition"], ("official" if r.get("prompt_kind") == "official" else "list",
                                         r.get("space"), r.get("order")))
    return info


def flip_pairs(records, conditions_cfg):
    """(space, fwd condition, rev condition) for every scoring space that has a listed fwd and rev condition; letters
    first (the primary measure)."""
    info = condition_info(records, conditions_cfg)
    out = []
    for space in ("letter", "text"):
        fwd = [n for n, (p, s, o) in info.items() if p != "official" and s == space and o == "fwd"]
        rev = [n for n, (p, s, o) in info.items() if p != "official" and s == space and o == "rev"]
        if fwd and rev:
            out.append((space, fwd[0], rev[0]))
    return out


def comparison_order(cfg, flips):
    """The flips' comparison names in config order (config.json "comparisons", else the effective config's
    options_comparisons), then any the config does not list, sorted."""
    listed = cfg.get("comparisons") or (cfg.get("config") or {}).get("options_comparisons") or []
    names = [f"{a} vs {b}" for a, b in listed if f"{a} vs {b}" in flips]
    return names + sorted(n for n in flips if n not in names)


def primary_comparison(records, cfg, flips):
    """The primary measure of the README: the letters listed forward vs reversed (None when the evidence does not
    name such a pair)."""
    pairs = {space: (a, b) for space, a, b in flip_pairs(records, cfg.get("conditions"))}
    if "letter" not in pairs:
        return None
    name = "{} vs {}".format(*pairs["letter"])
    return name if name in flips else None


def heatmaps(mats, label_names):
    """One small annotated heatmap per 2x2 matrix."""
    fig, axes = plt_fig(3.0 * len(mats) + 0.6, 2.9, ncols=len(mats))
    if len(mats) == 1:
        axes = [axes]
    for ax, (title, m, a, b) in zip(axes, mats):
        vmax = max(max(row) for row in m) or 1
        ax.imshow(m, cmap="Blues", vmin=0, vmax=vmax)
        for i in range(2):
            for j in range(2):
                ax.text(j, i, str(m[i][j]), ha="center", va="center", fontsize=12,
                        color="white" if m[i][j] > vmax * 0.6 else "black",
                        fontweight="bold" if i != j else "normal")
        ax.set_xticks([0, 1])
        ax.set_yticks([0, 1])
        ax.set_xticklabels(label_names, fontsize=8)
        ax.set_yticklabels(label_names, fontsize=8)
        ax.set_xlabel(f"{b} predicts", fontsize=8)
        ax.set_ylabel(f"{a} predicts", fontsize=8)
        ax.set_title(f"{title}: flips {m[0][1] + m[1][0]} (off-diagonal)", fontsize=9)
    fig.tight_layout()
    return figure(fig, "fwd vs rev flip matrices")


def options_flips(records, cfg, summary):
    """The primary table: flips per comparison, in config order, the primary comparison marked."""
    flips = summary["flips"]
    order = comparison_order(cfg, flips)
    primary = primary_comparison(records, cfg, flips)
    rows = [(name, "primary" if name == primary else "", f["flips"], f["gains"], f["losses"], Num(f["net"], "signed"),
             f["n_discordant"], Num(f["mcnemar_p"], "pvalue"), idx_list(f["flipped_idx"]))
            for name, f in ((name, flips[name]) for name in order)]
    text = ("Comparisons in the order of the run's config (options_comparisons). Flips are the primary measure; "
            "the primary comparison is letters listed forward vs reversed")
    text += f" ({primary})." if primary else ", which this evidence does not contain."
    return ("<h3>Flips (semantic predictions, a vs b)</h3>" + note(text)
            + table(["comparison (a vs b)", "measure", "flips", "gains (a wrong → b right)", "losses", "net",
                     "discordant", "exact McNemar p", "flipped idx"], rows, "options-flips",
                    row_classes=["primary" if r[0] == primary else "" for r in rows]))


def options_conditions(cfg, summary, order):
    conds_cfg = {c["name"]: c for c in cfg.get("conditions", [])}
    conds = summary["conditions"]
    rows = []
    for name in order:
        m, c = conds[name], conds_cfg.get(name, {})
        rows.append((name, c.get("space"), c.get("order"), m["correct"], m["n"], rate(m["acc"]),
                     interval(summary, f"conditions/{name}/acc"), m["correct_norm"], rate(m["acc_norm"]),
                     interval(summary, f"conditions/{name}/acc_norm"), m["correct_norm_tokens"],
                     rate(m["acc_norm_tokens"]), interval(summary, f"conditions/{name}/acc_norm_tokens"),
                     m["predicted_positive"], m["chose_first_position"], m["baseline_all_negative_correct"],
                     m["baseline_all_positive_correct"]))
    head = ("<h3>Accuracy per condition (secondary)</h3>"
            + wide(table(["condition", "space", "order", "correct", "of", "acc", "acc 95% interval",
                          "correct (norm)", "acc_norm", "acc_norm 95% interval", "correct (norm tokens)",
                          "acc_norm_tokens", "acc_norm_tokens 95% interval", "predicted positive",
                          "chose first position", "all-negative baseline correct", "all-positive baseline correct"],
                         rows, "options-conditions", "headline")))
    head += paired_table(summary, "options-uncertainty", "raw accuracies of the configured comparisons, paired on the "
                                                    "items (the McNemar p equals the flips table's)")
    head += note("acc: argmax of summed candidate log-probability; acc_norm: lm-eval's character-length "
                 "normalisation; acc_norm_tokens: token-length normalisation (not an lm-eval metric). "
                 "Conditions are compared on semantic predictions only (flips above); accuracies are secondary.")
    first = conds[order[0]]
    bars = bars_with_baselines(
        order, {"acc": [conds[c]["acc"] for c in order], "acc_norm": [conds[c]["acc_norm"] for c in order]},
        [("all negative", first["baseline_all_negative_acc"], "--"),
         ("all positive", first["baseline_all_positive_acc"], ":")],
        f"accuracy per condition ({summary['n_items']} items) with constant-class baselines")
    return head + plots(bars)


def options_matrices(records, cfg, summary, label_names):
    mats, mtabs = [], ""
    for space, a, b in flip_pairs(records, cfg.get("conditions")):
        m = flip_matrix(records, a, b)
        title = {"letter": "letters", "text": "texts"}.get(space, space)
        mats.append((title, m, a, b))
        recorded = summary["flips"].get(f"{a} vs {b}", {}).get("flips")
        trows = [(f"fwd: {label_names[i]}", m[i][0], m[i][1], m[i][0] + m[i][1]) for i in (0, 1)]
        trows.append(("total", m[0][0] + m[1][0], m[0][1] + m[1][1], sum(map(sum, m))))
        trows.append(("flips (off-diagonal)", m[0][1] + m[1][0], "summary.json:", recorded))
        mtabs += table([f"{title}: fwd \\ rev", f"rev: {label_names[0]}", f"rev: {label_names[1]}", "total"],
                       trows, f"options-flipmatrix-{space}", "matrix", f"rows {a}, columns {b}")
    if not mats:
        return ""
    return ("<h3>fwd/rev flip matrices (semantic predictions)</h3>"
            + note("Rows: the semantic prediction with the options listed forward (A = negative); columns: listed "
                   "reversed (A = positive). Off-diagonal cells are flips. Counted from records.jsonl; the last row "
                   "sets the flips against summary.json.")
            + f'<div class="side">{mtabs}</div>' + plots(heatmaps(mats, label_names)))


def options_section(exp_dir, summary):
    records = read_jsonl(exp_dir / "records.jsonl")
    cfg = read_optional(exp_dir / "config.json")
    label_names = (cfg.get("config") or {}).get("sst2_choices") or ["0", "1"]
    listed = [c["name"] for c in cfg.get("conditions", [])]
    conds = summary["conditions"]
    order = [c for c in listed if c in conds] + [c for c in conds if c not in listed]
    agree = agreement_table(
        summary, "options-agreement", "records joined", "n_records_joined",
        before=[("records (item × condition)", count(summary["n_records"]))],
        after=[("lm-eval process_results acc/acc_norm mismatches",
                count(summary["agreement"].get("n_lm_eval_metric_mismatches")))])
    scatter = score_scatter(records, summary, lambda r: f"{r.get('space', '?')} space")
    return (options_flips(records, cfg, summary) + options_matrices(records, cfg, summary, label_names)
            + options_conditions(cfg, summary, order) + agree + plots(scatter))


# ---- extraction ------------------------------------------------------------------------------------------------

def extraction_headline(summary):
    n, sc = summary["n_items"], summary["scorers"]
    rows = []
    for s in EXTRACTION_SCORERS:
        if s not in sc:
            continue
        extra = ""
        if s == "strict":
            extra = f"well-formed: {sc[s].get('format_ok')}/{n}"
        elif s == "regex":
            extra = "predictions: " + ", ".join(f"{k} {v}" for k, v in sc[s].get("pred_counts", {}).items())
        rows.append((s, sc[s]["correct"], n, rate(sc[s]["accuracy"]), interval(summary, f"scorers/{s}/accuracy"),
                     extra))
    for name, v in summary.get("constant_answer_baselines", {}).items():
        rows.append((f"baseline: {name}", v, n, None, None, "answering one label every time, scored like regex"))
    return (table(["scorer", "correct", "of", "accuracy", "95% interval (Wilson)", ""], rows, "extraction-scorers",
                  "headline")
            + paired_table(summary, "extraction-uncertainty", "the scorers paired on the same generations"))


def hbar_plot(labels, series, title, height_per_row=0.45):
    """Horizontal bars of counts, one row per label; series: [(legend label, values, colour)]."""
    import numpy as np

    fig, ax = plt_fig(5.2 if len(series) > 1 else 4.4, height_per_row * len(labels) + 1.0)
    y = np.arange(len(labels))
    h = 0.8 / len(series)
    for j, (label, values, colour) in enumerate(series):
        ax.barh(y + (j - (len(series) - 1) / 2) * h, values, h, color=colour, label=label)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("items")
    integer_axis(ax.xaxis)
    if len(series) > 1:
        ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    return figure(fig, title)


def extraction_patterns(summary):
    pats = summary.get("patterns", {})
    rows = []
    for key, p in pats.items():
        marks = ["✓" if ch == "1" else "✗" for ch in key] if len(key) == len(EXTRACTION_SCORERS) else [key] * 3
        rows.append((key, *marks, p["n"], idx_list(p.get("idx"))))
    out = ("<h3>Which items each scorer counts right</h3>"
           + table(["pattern", *EXTRACTION_SCORERS, "items", "idx"], rows, "extraction-patterns",
                   caption="pattern digits: exact, strict, regex (1 = counted right)"))
    if pats:
        labels = [" ".join(f"{s}{'✓' if ch == '1' else '✗'}" for s, ch in zip(EXTRACTION_SCORERS, k))
                  if len(k) == 3 else k for k in pats]
        out += plots(hbar_plot(labels, [("items", [p["n"] for p in pats.values()], BLUE)],
                               "items per correctness pattern"))
    prs = [(f"{p['a']} vs {p['b']}", p["both_correct"], p["only_a"], p["only_b"], p["neither"],
            idx_list(p.get("only_a_idx")), idx_list(p.get("only_b_idx"))) for p in summary.get("paired", {}).values()]
    return out + "<h3>Paired scorers</h3>" + table(["pair (a vs b)", "both right", "only a", "only b", "neither",
                                                    "only-a idx", "only-b idx"], prs, "extraction-paired")


def extraction_failures(summary):
    mf = summary.get("match_failures", {})
    cats = list((mf.get("all") or {}).keys())
    crows = [(c, *[mf.get(k, {}).get(c) for k in ("all", "regex_wrong", "regex_right")]) for c in cats]
    ctab = table(["category", "all items", "among regex-wrong", "among regex-right"], crows, "extraction-failures")
    reasons = summary["scorers"].get("strict", {}).get("reasons", {})
    rtab = table(["strict JSON failure reason", "items"], list(reasons.items()), "extraction-strict-reasons")
    plot = ""
    if cats:
        plot = hbar_plot(cats, [("regex counts it wrong", [mf.get("regex_wrong", {}).get(c, 0) for c in cats], RED),
                                ("regex counts it right", [mf.get("regex_right", {}).get(c, 0) for c in cats], GREEN)],
                         "failure categories", 0.5)
    return "<h3>Failure categories</h3>" + f'<div class="side">{ctab}{rtab}</div>' + plots(plot)


def extraction_agreement(summary):
    g, ra, fr = (summary.get(k, {}) for k in ("lm_eval_generate_until", "regex_agreement", "finish_reasons"))
    agree = "<h3>Agreement: official vs independent</h3>" + kv_table([
        ("regex: lm-eval filters vs independent re-implementation, items", count(ra.get("n_items"))),
        ("regex extraction mismatches", count(ra.get("n_mismatches"))),
        ("lm-eval generate_until cross-check ran", g.get("ran")),
        ("generations identical to lm-eval's", ratio(g.get("n_identical"), g.get("n_compared"))),
        ("input ids identical to lm-eval's", ratio(g.get("n_input_ids_identical"), g.get("n_compared"))),
        ("generation mismatch idx", idx_list(g.get("mismatch_idx"))),
        ("finish reasons: eos / length", f"{fr.get('eos')} / {fr.get('length')}")], "extraction-agreement")
    au, hr = summary.get("audit_sample", {}), summary.get("human_review", {})
    review = "<h3>Pre-registered audit sample and human review</h3>" + kv_table(
        [("audit sample size", count(au.get("n"))), ("per class", au.get("per_class")),
         ("pre-registration sha256", au.get("preregistration_sha256"))]
        + [(f"human review: {k}", v) for k, v in hr.items() if k != "note"], "extraction-review")
    if hr.get("note"):
        review += note(hr["note"])
    return agree + review


def extraction_section(exp_dir, summary):
    return (extraction_headline(summary) + extraction_patterns(summary) + extraction_failures(summary)
            + extraction_agreement(summary))


# ---- mctaco ----------------------------------------------------------------------------------------------------

def question_status(cfg, summary, scored_idx):
    """The questions the segment plot shows, in document order, each with its status in this run: "scored" (every
    candidate scored), "cut" (cut by a limit: this run's own --limit, a limit demonstration, or only some candidates
    scored) or "unscored" (no candidate scored: the run stopped before it). Also returns the limits drawn."""
    questions = cfg.get("split_questions") or []
    rows = summary.get("limit_demo", {}).get("rows", [])
    limits = sorted({r["limit"] for r in rows} | ({summary["limit"]} if summary.get("limit") is not None else set()))
    if not questions or not limits:
        return [], limits
    questions = sorted(questions, key=lambda q: min(q["idx"]))
    end = max(limits)
    shown = []
    for q in questions:    # every question the limits touch, then two more for context
        if min(q["idx"]) < end or len([s for s in shown if min(s["idx"]) >= end]) < 2:
            shown.append(q)
        if len(shown) >= 80:
            break
    cut_ids = {c["question_id"] for r in rows for c in r.get("cut_questions", [])}
    cut_ids |= {c["question_id"] for c in summary.get("cut_questions", [])}
    out = []
    for q in shown:
        n_scored = len(set(q["idx"]) & scored_idx)
        status = ("unscored" if n_scored == 0 else
                  "cut" if q["question_id"] in cut_ids or n_scored < len(q["idx"]) else "scored")
        out.append((q, status))
    return out, limits


SEGMENT_STYLE = {"scored": ("scored, every candidate", dict(color=BLUE)),
                 "cut": ("cut by a limit (some candidates dropped)", dict(color=RED)),
                 "unscored": ("not scored in this run", dict(facecolor="white", edgecolor=GREY, hatch="////"))}


def segments_figure(statuses, limits):
    """Questions as horizontal segments over document indices, with lm-eval's limit cut lines; returns (fig, ax).
    The y axis has one tick per question drawn, so no rank that does not exist (e.g. -1) is ever labelled."""
    from matplotlib.patches import Patch

    fig, ax = plt_fig(7.0, 0.28 * len(statuses) + 1.4)
    for q, status in statuses:
        lo, hi, rank = min(q["idx"]), max(q["idx"]), q["question_rank"]
        ax.barh(rank, hi - lo + 0.8, left=lo - 0.4, height=0.5, lw=0.8, **SEGMENT_STYLE[status][1])
        if status != "unscored":
            for i in q["idx"]:
                ax.plot([i, i], [rank - 0.25, rank + 0.25], lw=0.6, color="white")
    for lim in limits:
        ax.axvline(lim - 0.5, color="black", ls="--", lw=1)
        ax.text(lim - 0.5, 1.0, f" limit {lim}", fontsize=7, va="bottom", transform=ax.get_xaxis_transform())
    ranks = [q["question_rank"] for q, _ in statuses]
    ax.set_yticks(ranks)
    ax.set_yticklabels([str(r) for r in ranks], fontsize=7 if len(ranks) > 20 else 9)
    ax.set_ylim(max(ranks) + 0.7, min(ranks) - 0.7)
    present = [s for s in SEGMENT_STYLE if any(st == s for _, st in statuses)]
    ax.legend(handles=[Patch(label=SEGMENT_STYLE[s][0], **SEGMENT_STYLE[s][1]) for s in present], fontsize=7,
              loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xlabel("document (lm-eval doc_id, dataset order; one per candidate answer)")
    ax.set_ylabel("question rank")
    ax.set_title("questions as segments of documents (limit N keeps documents 0..N-1)", fontsize=8, pad=12)
    return fig, ax


def question_segments_plot(cfg, summary, scored_idx):
    statuses, limits = question_status(cfg, summary, scored_idx)
    if not statuses:
        return ""
    fig, _ = segments_figure(statuses, limits)
    return figure(fig, "questions as segments of documents with limit cut lines")


def mctaco_headline(summary):
    off, ind, base = summary["official"], summary["independent"], summary.get("baselines", {})
    nd, em = summary["n_documents"], summary["independent"].get("em", {})

    def f1c(side):
        c = side.get("f1_counts") or {}
        return f"{c.get('tp')} / {c.get('fp')} / {c.get('fn')} / {c.get('tn')}" if c else None

    rows = [("official (lm-eval 0.4.9.2)", off["correct"], nd, rate(off["acc"]), interval(summary, "official/acc"),
             rate(off["f1"]), f1c(off), None, None, None),
            ("independent", ind["correct"], nd, rate(ind["acc"]), interval(summary, "independent/acc"),
             rate(ind["f1"]), f1c(ind), ratio(em.get("n_correct_questions"), em.get("n_complete_questions")),
             rate(em.get("em")), interval(summary, "independent/em/em"))]
    rows += [(f"baseline: {name}", None, nd, rate(b.get("acc")), interval(summary, f"baselines/{name}/acc"),
              rate(b.get("f1")), None, None, None, None) for name, b in base.items()]
    warn = ""
    if summary.get("incomplete_set"):
        warn = f'<p class="warn">INCOMPLETE SET: {esc(summary.get("metrics_computed_on"))}</p>'
    head = warn + table(["path", "correct documents", "of", "acc", "acc 95% interval", "F1 (yes, corpus)",
                         "tp / fp / fn / tn", "EM questions", "EM", "EM 95% interval"], rows, "mctaco-headline",
                        "headline")
    head += uncertainty_note(summary.get("uncertainty"))
    lab, reported = summary.get("label_counts", {}), off.get("lm_eval_reported", {})
    head += kv_table([("lm-eval's own reported acc", rate(reported.get("acc"))),
                      ("lm-eval's own reported F1", rate(reported.get("f1"))),
                      ("documents / questions touched / complete", f"{nd} / {summary.get('n_questions_touched')} / "
                                                                   f"{summary.get('n_complete_questions')}"),
                      ("labels no / yes", f"{lab.get('no')} / {lab.get('yes')}"),
                      ("selection", summary.get("selection")), ("limit", summary.get("limit")),
                      ("metrics computed on", summary.get("metrics_computed_on"))], "mctaco-scope")
    head += note("EM (a question counts only if every candidate is judged right) is the MC-TACO paper's metric; "
                 "lm-eval 0.4.9.2 does not compute it, so it has no official value.")
    cats = summary.get("by_category", {})
    return head + "<h3>By category</h3>" + table(
        ["category", "documents", "acc", "acc 95% interval", "complete questions", "EM questions right", "EM",
         "EM 95% interval"],
        [(c, v.get("n_documents"), rate(v.get("acc")), interval(summary, f"by_category/{c}/acc"),
          v.get("n_complete_questions"), v.get("n_correct_questions"), rate(v.get("em")),
          interval(summary, f"by_category/{c}/em")) for c, v in cats.items()], "mctaco-categories")


def mctaco_limit_tables(summary):
    demo = summary.get("limit_demo", {})
    ref = demo.get("reference", {})
    lrows = [("reference (this run)", "", ref.get("documents"), rate(ref.get("acc")), rate(ref.get("f1")), None,
              None)]
    grows = [("reference (this run)", f"{summary.get('n_complete_questions')} complete + "
                                      f"{len(summary.get('cut_questions', []))} cut", rate(ref.get("em")), None,
              None, None, None, None)]
    for r in demo.get("rows", []):
        run = f"limit {r['limit']}"
        cut = ", ".join(f"q{c['question_rank']} ({c['n_scored']}/{c['n_candidates']} candidates)"
                        for c in r.get("cut_questions", [])) or "none"
        ecc, ecs, eca = (r.get(k) or {} for k in ("em_complete_questions", "em_cut_questions_on_scored_candidates",
                                                  "em_cut_questions_on_all_candidates"))
        lrows.append((run, r.get("kind"), r["lm_eval"]["n_samples"]["effective"], rate(r["lm_eval"]["acc"]),
                      rate(r["lm_eval"]["f1"]), Num(r["delta_vs_reference"]["acc"], "delta"),
                      Num(r["delta_vs_reference"]["f1"], "delta")))
        grows.append((run, f"{r.get('n_complete_questions')} complete + {len(r.get('cut_questions', []))} cut",
                      rate(ecc.get("em")), cut, rate(ecs.get("em")), rate(eca.get("em")),
                      r.get("doc_ids_are_first_n"), Num(r.get("max_abs_diff_vs_main_run"), "diff")))
    out = ("<h3>What lm-eval's --limit N does</h3>"
           + table(["run", "why this N", "documents", "acc (lm-eval)", "F1 (lm-eval)", "Δacc vs reference",
                    "ΔF1 vs reference"], lrows, "mctaco-limits")
           + table(["run", "questions touched", "EM complete questions", "questions cut",
                    "EM of cut questions (scored candidates)", "EM of cut questions (all candidates)",
                    "doc_ids are 0..N-1", "max abs diff vs main run"], grows, "mctaco-limit-groups",
                   caption="groups (questions) cut by the limit; the reference is this run's own document set"))
    sh = demo.get("shuffle_before_cut", {})
    if sh:
        out += kv_table([("documents shuffled before the cut", sh.get("documents_shuffled_before_limit")),
                         ("observed", sh.get("observed"))], "mctaco-shuffle") + note(sh.get("conclusion", ""))
        src = sh.get("source", [])
        if src:
            out += ("<details><summary>lm-eval source lines behind this</summary>" + table(
                ["file", "lines", "snippet found", "says"],
                [(s["file"], s["lines"], s["found"], s["says"]) for s in src], "mctaco-source") + "</details>")
    if summary.get("cut_questions"):
        out += table(["cut question (this run)", "candidates", "scored", "scored idx"],
                     [(f"q{c['question_rank']}", c["n_candidates"], c["n_scored"], idx_list(c["scored_idx"]))
                      for c in summary["cut_questions"]], "mctaco-cut")
    return out


def mctaco_section(exp_dir, summary):
    records = read_jsonl(exp_dir / "records.jsonl")
    cfg = read_optional(exp_dir / "config.json")
    ind, ag = summary["independent"], summary["agreement"]
    seg = question_segments_plot(cfg, summary, {r["idx"] for r in records})
    agree = agreement_table(summary, "mctaco-agreement", "documents joined", "n_samples_joined",
                            after=[("acc: lm-eval vs independent", rate(ag.get("acc_official_vs_independent"))),
                                   ("F1: lm-eval vs independent", rate(ag.get("f1_official_vs_independent")))])
    series = {"model (independent = official)": [ind["acc"], ind["f1"], ind.get("em", {}).get("em")]}
    for name, b in summary.get("baselines", {}).items():
        series[name] = [b.get("acc"), b.get("f1"), None]
    bars = bars_with_baselines(["acc", "F1 (yes)", "EM"], series, [], "MC-TACO metrics vs constant answers",
                               "value") if ind.get("acc") is not None else ""
    return (mctaco_headline(summary) + mctaco_limit_tables(summary) + plots(seg) + agree
            + plots(score_scatter(records, summary), bars))


# ---- harness ---------------------------------------------------------------------------------------------------

def leaderboard_plot(board):
    tasks = board.get("tasks", {})
    if not tasks:
        return ""
    fig, ax = plt_fig(5.0, 0.45 * len(tasks) + 1.2)
    names = list(tasks)
    ax.barh(range(len(names)), [tasks[t]["score"] for t in names], color=BLUE)
    if board.get("overall") is not None:
        ax.axvline(board["overall"], color="black", ls="--", lw=1, label=f"overall {board['overall']:.4f}")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{t} ({tasks[t].get('metric')})" for t in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("task score")
    ax.set_title("leaderboard", fontsize=9)
    return figure(fig, "leaderboard")


def harness_section(exp_dir, summary):
    board = summary["leaderboard"]
    tasks = board.get("tasks", {})
    shipped = summary.get("tasks_are_shipped_fixtures", {})
    rows = [(name, t.get("metric"), rate(t.get("score")), ratio(t.get("correct"), t.get("total")), t.get("timeouts"),
             Num(t.get("latency_s"), "seconds"), Num(t.get("latency_s_mean"), "seconds"), t.get("n_examples_in_file"),
             shipped.get(name)) for name, t in tasks.items()]
    n = sum(t.get("total", 0) for t in tasks.values())
    rows.append(("overall (mean of task scores)", "", rate(board.get("overall")),
                 ratio(sum(t.get("correct", 0) for t in tasks.values()), n),
                 sum(t.get("timeouts", 0) for t in tasks.values()), None, None, None, None))
    head = table(["task", "metric", "score", "correct/total", "timeouts", "latency s (task total)",
                  "latency s (mean)", "examples in file", "shipped fixture"], rows, "harness-leaderboard", "headline")
    iso = board.get("sandbox_isolation") or {}
    st = board.get("settings", {})
    info = kv_table([("adapter", board.get("adapter")), ("schema", board.get("schema")),
                     ("examples scored", summary.get("n_examples")), ("split", st.get("split")),
                     ("decoding", st.get("decoding")), ("chat template", st.get("chat_template")),
                     ("max new tokens", st.get("max_new_tokens")), ("timeout s", st.get("timeout_s")),
                     ("batch size", st.get("batch_size")),
                     ("sandbox mode / network", f"{iso.get('mode')} / {iso.get('network')}" if iso else
                      "not run (no code reply)"),
                     ("sandbox layers", ", ".join(iso.get("layers", [])) if iso else None),
                     ("sandbox limits", st.get("sandbox"))], "harness-settings")
    if summary.get("split_note"):
        info += note(summary["split_note"])
    info += note("There is no second implementation here: audit.py recomputes every task score and the overall score "
                 "from O/private/harness/leaderboard.json and the task files.")
    return head + info + plots(leaderboard_plot(board))


# ---- generic + page --------------------------------------------------------------------------------------------

def generic_section(exp_dir, summary):
    n = len(read_jsonl(exp_dir / "records.jsonl"))
    return (note(f"No dedicated view for this experiment: every summary.json field is listed. records.jsonl: "
                 f"{n} lines.") + table(["summary field", "value"], flatten(summary), f"{exp_dir.name}-summary"))


SECTIONS = {"protocol": protocol_section, "options": options_section, "extraction": extraction_section,
            "mctaco": mctaco_section, "harness": harness_section}


def render_error(what):
    return (f'<div class="render-error"><b>report.py could not draw {esc(what)} from the evidence</b>'
            f"<pre>{esc(traceback.format_exc(limit=3))}</pre></div>")


def experiment_section(out, name):
    """One experiment. The page is a view, not a check: evidence of an unexpected shape is shown as an error box
    (plus the generic table when summary.json is readable), never allowed to stop the page."""
    exp_dir = out / name
    try:
        summary = read_json(exp_dir / "summary.json")
        if not isinstance(summary, dict):
            raise ValueError(f"summary.json holds a {type(summary).__name__}, not an object")
    except Exception:
        return (f'<section id="{esc(name)}"><h2>{esc(name)}</h2>{render_error(exp_dir / "summary.json")}'
                "</section>")
    split = summary.get("split", "?")
    warn = ('<p class="warn">SPLIT ALL: every row of the validation split in idx order, the held-back confirmation '
            'items included.</p>' if split == "all" else
            '<p class="warn">CONFIRMATION SPLIT: these are the held-back confirmation items.</p>'
            if summary.get("confirmation_items_scored") else "")
    try:
        body = SECTIONS.get(name, generic_section)(exp_dir, summary)
    except Exception:
        try:
            body = render_error("this section") + generic_section(exp_dir, summary)
        except Exception:
            body = render_error("this section")
    extra = ""
    for part in (stages_section, identity_section):
        try:
            extra += part(exp_dir, name)
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
    names = [n for n in EXPERIMENT_ORDER if (out / n / "summary.json").exists()]
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
    """The page, deterministic: the same evidence gives the same bytes (no clock, no path of O, no audit state)."""
    out = Path(out)
    names = experiment_names(out)
    env = read_optional(out / "environment.json")
    env_rows = [("run id", env.get("run_id")), ("git commit", env.get("git_commit")),
                ("git dirty", env.get("git_dirty")), ("code sha256", env.get("code_sha256")),
                ("python", env.get("python")), ("platform", env.get("platform")), ("cpu", env.get("cpu")),
                ("cpu count", env.get("cpu_count")), ("torch threads", env.get("torch_threads")),
                ("command line", " ".join(map(str, env.get("command_line") or [])) or None)]
    env_rows = [(k, fmt(v)) for k, v in env_rows]       # shown as text: environment.json is not an experiment's file
    env_rows += [(k, v) for k, v in sorted((env.get("versions") or {}).items())]
    sections = "".join(experiment_section(out, n) for n in names)
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
            f"<p>{toc}</p>{table(['environment', 'value'], env_rows, 'environment')}"
            + note("This page shows no audit result: run python audit.py O to check the evidence (the audit also "
                   "checks this page against it).")
            + f"{sections}</body></html>")


def write(out):
    """Write OUT/report.html atomically (temp file in OUT, fsync, rename); on any error (a full disk) the temp file
    is removed and the error raised: the evidence and an earlier report.html are untouched. (resources.py has the
    same few lines: report.py imports none of the code that wrote the evidence, so it keeps its own copy.)"""
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


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="report.py", description="Write OUT/report.html, one self-contained page built from the evidence "
                                      "run.py wrote under OUT (run.py also writes it after its experiments).")
    ap.add_argument("out", metavar="OUT", type=Path, help="the output directory of a run (run.py --out OUT)")
    args = ap.parse_args(argv)
    if not args.out.is_dir():
        why = "not a directory" if args.out.exists() else "no such output directory"
        print(f"report.py: error: {args.out}: {why}; run run.py --out {args.out} first", file=sys.stderr)
        return 2
    try:
        print(write(args.out))
    except OSError as e:
        print(f"report.py: error: {args.out / 'report.html'}: not written ({e.strerror or e}); the evidence is "
              "untouched and no temporary file is left", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
