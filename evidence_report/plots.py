"""Plots, where looking beats reading: PNGs (matplotlib, Agg) embedded as data URIs, so the page needs no network and
no other file. matplotlib and numpy are imported inside the functions that draw, never when the package loads.
The plots every scored experiment shares live here; a plot particular to one experiment lives in its section."""
import base64
import io

from evidence_report.cells import esc, fmt

BLUE, ORANGE, GREY, RED, GREEN = "#4c72b0", "#dd8452", "#8c8c8c", "#c44e52", "#55a868"


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


def integer_axis(axis):
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


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
