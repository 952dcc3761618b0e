"""Write O/report.html: one self-contained page a person reads, built from the evidence under O alone.

    python report.py O          # run.py calls this too after its experiments

Per experiment: the headline table, the agreement figures (official vs independent), identity checks, stage times
and peak RSS, and plots where looking beats reading. Plots are PNGs embedded as data URIs (matplotlib, Agg), so
the page needs no network and no other file. Like audit.py it reads only the evidence files, never the code that
wrote them; unlike audit.py it checks nothing — it shows what the evidence says.

Numbers from summary.json are shown exactly as written there: integers as they are, floats in Python's shortest
round-trip repr (the text json.dumps wrote), null as "—". A reader can grep summary.json for any figure on the page,
and tests/test_report.py does. Derived figures (MiB, the flip matrices counted from records.jsonl) are labelled.

Every table that a test or a reader may want to find has an id: "<experiment>-<what>", e.g. "options-conditions".
A section that cannot be rendered (evidence of an unexpected shape) shows the error and the generic table of its
summary instead of breaking the page; the error box has class "render-error".
"""
import base64
import html
import io
import json
import sys
import time
import traceback
from pathlib import Path

EXPERIMENT_ORDER = ["protocol", "options", "extraction", "mctaco", "harness"]
EXTRACTION_SCORERS = ("exact", "strict", "regex")    # the digit order of summary["patterns"] keys, e.g. "001"
BLUE, ORANGE, GREY, RED, GREEN = "#4c72b0", "#dd8452", "#8c8c8c", "#c44e52", "#55a868"


# ---- small helpers -------------------------------------------------------------------------------------------

def esc(x):
    return html.escape(str(x))


def fmt(x):
    """A summary value as text, exactly: floats in shortest repr (== json.dumps), bools/lists as JSON, null as —."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, (list, dict)):
        return json.dumps(x)
    return str(x)


class Raw(str):
    """A table cell that is already HTML (not escaped)."""


def cell(c):
    return c if isinstance(c, Raw) else esc(fmt(c))


def table(header, rows, tid="", cls="", caption=""):
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>" for r in rows)
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
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_jsonl(path):
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]


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
    path = exp_dir / "stages.json"
    if not path.exists():
        return "<h3>Stages</h3><p>stages.json missing</p>"
    st = read_json(path)
    rows, peaks = [], []
    for s in st.get("stages", []):
        rss = s.get("peak_rss_bytes_at_end")
        if rss:
            peaks.append(rss)
        rows.append((s.get("name"), s.get("wall_s"), rss, f"{rss / 2**20:.1f}" if rss else None))
    out = "<h3>Stages</h3>" + table(["stage", "wall s", "process peak RSS at end (bytes)", "(MiB, derived)"], rows,
                                    f"{name}-stages")
    extra = [("total wall s", st.get("total_wall_s")), ("torch threads", st.get("threads")),
             ("peak RSS of the run (bytes, max over stages)", max(peaks) if peaks else None),
             ("peak RSS semantics", st.get("peak_rss_semantics"))]
    out += kv_table([r for r in extra if r[1] is not None], f"{name}-stage-totals")
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
    rows += [(k, v) for k, v in sorted(ident.items()) if k not in keys and not isinstance(v, (dict, list))]
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


def agreement_rows(ag):
    return [("max |official − independent| (candidate log-likelihood)", ag.get("max_abs_diff")),
            ("candidate score mismatches", ag.get("n_candidate_score_mismatches")),
            ("prediction mismatches", ag.get("n_prediction_mismatches"))]


# ---- protocol --------------------------------------------------------------------------------------------------

def protocol_section(exp_dir, summary):
    records = read_jsonl(exp_dir / "records.jsonl")
    n = summary["n_items"]
    ag = summary["agreement"]
    off, ind, cc = summary["official"], summary["independent"], summary["constant_class_baseline"]
    labels = summary["label_counts"]
    head = table(["path", "correct", "of", "accuracy", "predicted negative", "predicted positive"], [
        ("official (lm-eval 0.4.9.2)", off["correct"], n, off["accuracy"], off["pred_counts"]["0"],
         off["pred_counts"]["1"]),
        ("independent", ind["correct"], n, ind["accuracy"], ind["pred_counts"]["0"], ind["pred_counts"]["1"]),
        (f"constant class (always label {cc['label']})", labels.get(str(cc["label"])), n, cc["accuracy"], None,
         None)], "protocol-headline", "headline")
    head += kv_table([("lm-eval's own reported acc", off.get("lm_eval_reported_acc")),
                      ("label counts (0 negative / 1 positive)", f"{labels.get('0')} / {labels.get('1')}")],
                     "protocol-reported")
    ic = summary["identity_checks"]
    agree = "<h3>Agreement: official vs independent</h3>" + kv_table(
        [("candidates compared", summary["n_candidates"])] + agreement_rows(ag) +
        [("identity checks", passed(ic["passed"])), ("samples joined", ic.get("n_samples_joined")),
         ("fields joined per sample", ", ".join(ic["fields"]))], "protocol-agreement")
    plot = scatter_official_vs_independent(
        [p for r in records for p in zip(r["official"]["scores"], r["independent"]["scores"])],
        f"{summary['n_candidates']} candidate scores; max abs diff {fmt(ag['max_abs_diff'])}")
    bars = bars_with_baselines(["official", "independent"], {"accuracy": [off["accuracy"], ind["accuracy"]]},
                               [("all negative", labels["0"] / n, "--"), ("all positive", labels["1"] / n, ":")],
                               "accuracy with constant-class baselines")
    return head + agree + plots(plot, bars)


# ---- options ---------------------------------------------------------------------------------------------------

def flip_matrix(records, a, b):
    """2x2 counts of semantic predictions (0/1) of condition a (rows) vs b (columns) on the same items."""
    pa = {r["idx"]: r["semantic_pred"] for r in records if r["condition"] == a}
    pb = {r["idx"]: r["semantic_pred"] for r in records if r["condition"] == b}
    m = [[0, 0], [0, 0]]
    for i in sorted(set(pa) & set(pb)):
        m[pa[i]][pb[i]] += 1
    return m


def flip_pairs(records, conditions_cfg):
    """(space, fwd condition, rev condition) for every scoring space that has a listed fwd and rev condition."""
    info = {}
    for c in conditions_cfg or []:
        info[c["name"]] = (c.get("prompt"), c.get("space"), c.get("order"))
    for r in records:
        info.setdefault(r["condition"], ("official" if r.get("prompt_kind") == "official" else "list",
                                         r.get("space"), r.get("order")))
    out = []
    for space in ("letter", "text"):
        fwd = [n for n, (p, s, o) in info.items() if p != "official" and s == space and o == "fwd"]
        rev = [n for n, (p, s, o) in info.items() if p != "official" and s == space and o == "rev"]
        if fwd and rev:
            out.append((space, fwd[0], rev[0]))
    return out


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


def options_section(exp_dir, summary):
    records = read_jsonl(exp_dir / "records.jsonl")
    cfg = read_optional(exp_dir / "config.json")
    conds_cfg = {c["name"]: c for c in cfg.get("conditions", [])}
    label_names = (cfg.get("config") or {}).get("sst2_choices") or ["0", "1"]
    n = summary["n_items"]
    conds = summary["conditions"]
    order = [c for c in conds_cfg if c in conds] + [c for c in conds if c not in conds_cfg]
    rows = []
    for name in order:
        m, c = conds[name], conds_cfg.get(name, {})
        rows.append((name, c.get("space"), c.get("order"), m["correct"], m["n"], m["acc"], m["correct_norm"],
                     m["acc_norm"], m["correct_norm_tokens"], m["acc_norm_tokens"], m["predicted_positive"],
                     m["chose_first_position"], m["baseline_all_negative_correct"],
                     m["baseline_all_positive_correct"]))
    head = wide(table(["condition", "space", "order", "correct", "of", "acc", "correct (norm)", "acc_norm",
                       "correct (norm tokens)", "acc_norm_tokens", "predicted positive", "chose first position",
                       "all-negative baseline correct", "all-positive baseline correct"], rows,
                      "options-conditions", "headline"))
    head += note("acc: argmax of summed candidate log-probability; acc_norm: lm-eval's character-length "
                 "normalisation; acc_norm_tokens: token-length normalisation (not an lm-eval metric). "
                 "Conditions are compared on semantic predictions only (flips below); accuracies are secondary.")
    first = conds[order[0]]
    bars = bars_with_baselines(
        order, {"acc": [conds[c]["acc"] for c in order], "acc_norm": [conds[c]["acc_norm"] for c in order]},
        [("all negative", first["baseline_all_negative_acc"], "--"),
         ("all positive", first["baseline_all_positive_acc"], ":")],
        f"accuracy per condition ({n} items) with constant-class baselines")

    flips = summary["flips"]
    frows = [(name, f["flips"], f["gains"], f["losses"], f["net"], f["n_discordant"], f["mcnemar_p"],
              idx_list(f["flipped_idx"])) for name, f in flips.items()]
    ftab = ("<h3>Flips (semantic predictions, a vs b)</h3>" +
            table(["comparison (a vs b)", "flips", "gains (a wrong → b right)", "losses", "net",
                   "discordant", "exact McNemar p", "flipped idx"], frows, "options-flips"))

    mats, mtabs = [], ""
    for space, a, b in flip_pairs(records, cfg.get("conditions")):
        m = flip_matrix(records, a, b)
        title = {"letter": "letters", "text": "texts"}.get(space, space)
        mats.append((title, m, a, b))
        recorded = flips.get(f"{a} vs {b}", {}).get("flips")
        trows = [(f"fwd: {label_names[i]}", m[i][0], m[i][1], m[i][0] + m[i][1]) for i in (0, 1)]
        trows.append(("total", m[0][0] + m[1][0], m[0][1] + m[1][1], sum(map(sum, m))))
        trows.append(("flips (off-diagonal)", m[0][1] + m[1][0], "summary.json:", recorded))
        mtabs += table([f"{title}: fwd \\ rev", f"rev: {label_names[0]}", f"rev: {label_names[1]}", "total"],
                       trows, f"options-flipmatrix-{space}", "matrix", f"rows {a}, columns {b}")
    matrix_html = ""
    if mats:
        matrix_html = ("<h3>fwd/rev flip matrices (semantic predictions)</h3>"
                       + note("Rows: the semantic prediction with the options listed forward (A = negative); "
                              "columns: listed reversed (A = positive). Off-diagonal cells are flips. Counted from "
                              "records.jsonl; the last row sets the flips against summary.json.")
                       + f'<div class="side">{mtabs}</div>' + plots(heatmaps(mats, label_names)))

    ag, ic = summary["agreement"], summary["identity_checks"]
    agree = "<h3>Agreement: official vs independent</h3>" + kv_table(
        [("candidates compared", summary["n_candidates"]), ("records (item × condition)", summary["n_records"])]
        + agreement_rows(ag)
        + [("lm-eval process_results acc/acc_norm mismatches", ag.get("n_lm_eval_metric_mismatches")),
           ("identity checks", passed(ic["passed"])), ("records joined", ic.get("n_records_joined")),
           ("fields joined", ", ".join(ic["fields"]))], "options-agreement")
    groups = {}
    for r in records:
        groups.setdefault(f"{r.get('space', '?')} space", []).extend(
            zip(r["official"]["scores"], r["independent"]["scores"]))
    scatter = scatter_official_vs_independent(
        [p for ps in groups.values() for p in ps],
        f"{summary['n_candidates']} candidate scores; max abs diff {fmt(ag['max_abs_diff'])}", groups)
    return head + plots(bars) + ftab + matrix_html + agree + plots(scatter)


# ---- extraction ------------------------------------------------------------------------------------------------

def extraction_section(exp_dir, summary):
    n = summary["n_items"]
    sc = summary["scorers"]
    rows = []
    for s in EXTRACTION_SCORERS:
        if s not in sc:
            continue
        extra = ""
        if s == "strict":
            extra = f"well-formed: {sc[s].get('format_ok')}/{n}"
        elif s == "regex":
            extra = "predictions: " + ", ".join(f"{k} {v}" for k, v in sc[s].get("pred_counts", {}).items())
        rows.append((s, sc[s]["correct"], n, sc[s]["accuracy"], extra))
    for name, v in summary.get("constant_answer_baselines", {}).items():
        rows.append((f"baseline: {name}", v, n, None, "answering one label every time, scored like regex"))
    head = table(["scorer", "correct", "of", "accuracy", ""], rows, "extraction-scorers", "headline")

    pats = summary.get("patterns", {})
    prow = []
    for key, p in pats.items():
        marks = ["✓" if ch == "1" else "✗" for ch in key] if len(key) == len(EXTRACTION_SCORERS) else [key] * 3
        prow.append((key, *marks, p["n"], idx_list(p.get("idx"))))
    ptab = ("<h3>Which items each scorer counts right</h3>"
            + table(["pattern", *EXTRACTION_SCORERS, "items", "idx"], prow, "extraction-patterns",
                    caption="pattern digits: exact, strict, regex (1 = counted right)"))
    pplot = ""
    if pats:
        fig, ax = plt_fig(4.4, 0.45 * len(pats) + 1.0)
        keys = list(pats)
        ax.barh(range(len(keys)), [pats[k]["n"] for k in keys], color=BLUE)
        ax.set_yticks(range(len(keys)))
        ax.set_yticklabels([" ".join(f"{s}{'✓' if ch == '1' else '✗'}" for s, ch in zip(EXTRACTION_SCORERS, k))
                            if len(k) == 3 else k for k in keys], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("items")
        integer_axis(ax.xaxis)
        ax.set_title("items per correctness pattern", fontsize=9)
        pplot = figure(fig, "items per correctness pattern")

    prs = []
    for name, p in summary.get("paired", {}).items():
        prs.append((f"{p['a']} vs {p['b']}", p["both_correct"], p["only_a"], p["only_b"], p["neither"],
                    idx_list(p.get("only_a_idx")), idx_list(p.get("only_b_idx"))))
    pairtab = table(["pair (a vs b)", "both right", "only a", "only b", "neither", "only-a idx", "only-b idx"], prs,
                    "extraction-paired")

    mf = summary.get("match_failures", {})
    cats = list((mf.get("all") or {}).keys())
    crows = [(c, *[mf.get(k, {}).get(c) for k in ("all", "regex_wrong", "regex_right")]) for c in cats]
    ctab = (table(["category", "all items", "among regex-wrong", "among regex-right"], crows,
                    "extraction-failures"))
    reasons = sc.get("strict", {}).get("reasons", {})
    rtab = table(["strict JSON failure reason", "items"], list(reasons.items()), "extraction-strict-reasons")
    cplot = ""
    if cats:
        import numpy as np

        fig, ax = plt_fig(5.2, 0.5 * len(cats) + 1.0)
        y = np.arange(len(cats))
        ax.barh(y - 0.2, [mf.get("regex_wrong", {}).get(c, 0) for c in cats], 0.4, color=RED,
                label="regex counts it wrong")
        ax.barh(y + 0.2, [mf.get("regex_right", {}).get(c, 0) for c in cats], 0.4, color=GREEN,
                label="regex counts it right")
        ax.set_yticks(y)
        ax.set_yticklabels(cats, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("items")
        integer_axis(ax.xaxis)
        ax.legend(fontsize=7)
        ax.set_title("failure categories", fontsize=9)
        cplot = figure(fig, "failure categories")

    g, ra, fr = summary.get("lm_eval_generate_until", {}), summary.get("regex_agreement", {}), \
        summary.get("finish_reasons", {})
    agree = "<h3>Agreement: official vs independent</h3>" + kv_table([
        ("regex: lm-eval filters vs independent re-implementation, items", ra.get("n_items")),
        ("regex extraction mismatches", ra.get("n_mismatches")),
        ("lm-eval generate_until cross-check ran", g.get("ran")),
        ("generations identical to lm-eval's", ratio(g.get("n_identical"), g.get("n_compared"))),
        ("input ids identical to lm-eval's", ratio(g.get("n_input_ids_identical"), g.get("n_compared"))),
        ("generation mismatch idx", idx_list(g.get("mismatch_idx"))),
        ("finish reasons: eos / length", f"{fr.get('eos')} / {fr.get('length')}")], "extraction-agreement")

    au, hr = summary.get("audit_sample", {}), summary.get("human_review", {})
    review = "<h3>Pre-registered audit sample and human review</h3>" + kv_table(
        [("audit sample size", au.get("n")), ("per class", au.get("per_class")),
         ("pre-registration sha256", au.get("preregistration_sha256"))]
        + [(f"human review: {k}", v) for k, v in hr.items() if k != "note"], "extraction-review")
    if hr.get("note"):
        review += note(hr["note"])
    return (head + ptab + plots(pplot) + "<h3>Paired scorers</h3>" + pairtab + "<h3>Failure categories</h3>"
            + f'<div class="side">{ctab}{rtab}</div>' + plots(cplot) + agree + review)


# ---- mctaco ----------------------------------------------------------------------------------------------------

def question_segments_plot(cfg, summary):
    """Questions as horizontal segments over document indices, with lm-eval's limit cut lines."""
    questions = cfg.get("split_questions") or []
    rows = summary.get("limit_demo", {}).get("rows", [])
    limits = [r["limit"] for r in rows]
    if summary.get("limit") is not None:
        limits.append(summary["limit"])
    if not questions or not limits:
        return ""
    questions = sorted(questions, key=lambda q: min(q["idx"]))
    end = max(limits)
    shown = []
    for q in questions:
        if min(q["idx"]) < end or len([s for s in shown if min(s["idx"]) >= end]) < 2:
            shown.append(q)
        if len(shown) >= 80:
            break
    cut_ids = {c["question_id"] for r in rows for c in r.get("cut_questions", [])}
    cut_ids |= {c["question_id"] for c in summary.get("cut_questions", [])}
    fig, ax = plt_fig(7.0, 0.28 * len(shown) + 1.4)
    for q in shown:
        lo, hi = min(q["idx"]), max(q["idx"])
        colour = RED if q["question_id"] in cut_ids else BLUE
        ax.plot([lo - 0.4, hi + 0.4], [q["question_rank"]] * 2, lw=6, color=colour, solid_capstyle="butt")
        for i in q["idx"]:
            ax.plot([i, i], [q["question_rank"] - 0.25, q["question_rank"] + 0.25], lw=0.6, color="white")
    for lim in sorted(set(limits)):
        ax.axvline(lim - 0.5, color="black", ls="--", lw=1)
        ax.text(lim - 0.5, shown[0]["question_rank"] - 0.8, f" limit {lim}", fontsize=7, va="bottom")
    ax.set_ylim(max(q["question_rank"] for q in shown) + 0.8, shown[0]["question_rank"] - 1.2)
    ax.set_xlabel("document (lm-eval doc_id, dataset order; one per candidate answer)")
    ax.set_ylabel("question rank")
    ax.set_title("questions as segments of documents; red = cut by a limit (limit N keeps documents 0..N-1)",
                 fontsize=8)
    return figure(fig, "questions as segments of documents with limit cut lines")


def mctaco_section(exp_dir, summary):
    records = read_jsonl(exp_dir / "records.jsonl")
    cfg = read_optional(exp_dir / "config.json")
    off, ind, base = summary["official"], summary["independent"], summary.get("baselines", {})
    nd = summary["n_documents"]
    em = ind.get("em", {})

    def f1c(side):
        c = side.get("f1_counts") or {}
        return f"{c.get('tp')} / {c.get('fp')} / {c.get('fn')} / {c.get('tn')}" if c else None

    rows = [("official (lm-eval 0.4.9.2)", off["correct"], nd, off["acc"], off["f1"], f1c(off), None, None),
            ("independent", ind["correct"], nd, ind["acc"], ind["f1"], f1c(ind),
             ratio(em.get("n_correct_questions"), em.get("n_complete_questions")), em.get("em"))]
    for name, b in base.items():
        rows.append((f"baseline: {name}", None, nd, b.get("acc"), b.get("f1"), None, None, None))
    warn = ""
    if summary.get("incomplete_set"):
        warn = f'<p class="warn">INCOMPLETE SET: {esc(summary.get("metrics_computed_on"))}</p>'
    head = warn + table(["path", "correct documents", "of", "acc", "F1 (yes, corpus)", "tp / fp / fn / tn",
                         "EM questions", "EM"], rows, "mctaco-headline", "headline")
    lab = summary.get("label_counts", {})
    head += kv_table([("lm-eval's own reported acc", off.get("lm_eval_reported", {}).get("acc")),
                      ("lm-eval's own reported F1", off.get("lm_eval_reported", {}).get("f1")),
                      ("documents / questions touched / complete", f"{nd} / {summary.get('n_questions_touched')} / "
                                                                   f"{summary.get('n_complete_questions')}"),
                      ("labels no / yes", f"{lab.get('no')} / {lab.get('yes')}"),
                      ("selection", summary.get("selection")), ("limit", summary.get("limit")),
                      ("metrics computed on", summary.get("metrics_computed_on"))], "mctaco-scope")
    head += note("EM (a question counts only if every candidate is judged right) is the MC-TACO paper's metric; "
                 "lm-eval 0.4.9.2 does not compute it, so it has no official value.")
    cats = summary.get("by_category", {})
    ctab = table(["category", "documents", "acc", "complete questions", "EM questions right", "EM"],
                 [(c, v.get("n_documents"), v.get("acc"), v.get("n_complete_questions"),
                   v.get("n_correct_questions"), v.get("em")) for c, v in cats.items()], "mctaco-categories")

    demo = summary.get("limit_demo", {})
    ref = demo.get("reference", {})
    lrows = [("reference (this run)", "", ref.get("documents"), ref.get("acc"), ref.get("f1"), None, None)]
    grows = [("reference (this run)", f"{summary.get('n_complete_questions')} complete + "
                                      f"{len(summary.get('cut_questions', []))} cut", ref.get("em"), None, None,
              None, None, None)]
    for r in demo.get("rows", []):
        run = f"limit {r['limit']}"
        cut = ", ".join(f"q{c['question_rank']} ({c['n_scored']}/{c['n_candidates']} candidates)"
                        for c in r.get("cut_questions", [])) or "none"
        ecc, ecs, eca = (r.get(k) or {} for k in ("em_complete_questions", "em_cut_questions_on_scored_candidates",
                                                  "em_cut_questions_on_all_candidates"))
        lrows.append((run, r.get("kind"), r["lm_eval"]["n_samples"]["effective"], r["lm_eval"]["acc"],
                      r["lm_eval"]["f1"], r["delta_vs_reference"]["acc"], r["delta_vs_reference"]["f1"]))
        grows.append((run, f"{r.get('n_complete_questions')} complete + {len(r.get('cut_questions', []))} cut",
                      ecc.get("em"), cut, ecs.get("em"), eca.get("em"), r.get("doc_ids_are_first_n"),
                      r.get("max_abs_diff_vs_main_run")))
    ltab = ("<h3>What lm-eval's --limit N does</h3>"
            + table(["run", "why this N", "documents", "acc (lm-eval)", "F1 (lm-eval)", "Δacc vs reference",
                     "ΔF1 vs reference"], lrows, "mctaco-limits")
            + table(["run", "questions touched", "EM complete questions", "questions cut",
                     "EM of cut questions (scored candidates)", "EM of cut questions (all candidates)",
                     "doc_ids are 0..N-1", "max abs diff vs main run"], grows, "mctaco-limit-groups",
                    caption="groups (questions) cut by the limit; the reference is this run's own document set"))
    sh = demo.get("shuffle_before_cut", {})
    if sh:
        ltab += kv_table([("documents shuffled before the cut", sh.get("documents_shuffled_before_limit")),
                          ("observed", sh.get("observed"))], "mctaco-shuffle") + note(sh.get("conclusion", ""))
        src = sh.get("source", [])
        if src:
            ltab += ("<details><summary>lm-eval source lines behind this</summary>" + table(
                ["file", "lines", "snippet found", "says"],
                [(s["file"], s["lines"], s["found"], s["says"]) for s in src], "mctaco-source") + "</details>")
    seg = question_segments_plot(cfg, summary)
    if summary.get("cut_questions"):
        ltab += table(["cut question (this run)", "candidates", "scored", "scored idx"],
                      [(f"q{c['question_rank']}", c["n_candidates"], c["n_scored"], idx_list(c["scored_idx"]))
                       for c in summary["cut_questions"]], "mctaco-cut")

    ag, ic = summary["agreement"], summary["identity_checks"]
    agree = "<h3>Agreement: official vs independent</h3>" + kv_table(
        [("candidates compared", summary["n_candidates"])] + agreement_rows(ag)
        + [("acc: lm-eval vs independent", ag.get("acc_official_vs_independent")),
           ("F1: lm-eval vs independent", ag.get("f1_official_vs_independent")),
           ("identity checks", passed(ic["passed"])), ("documents joined", ic.get("n_samples_joined")),
           ("fields joined", ", ".join(ic["fields"]))], "mctaco-agreement")
    scatter = scatter_official_vs_independent(
        [p for r in records for p in zip(r["official"]["scores"], r["independent"]["scores"])],
        f"{summary['n_candidates']} candidate scores; max abs diff {fmt(ag['max_abs_diff'])}")
    series = {"model (independent = official)": [ind["acc"], ind["f1"], em.get("em")]}
    for name, b in base.items():
        series[name] = [b.get("acc"), b.get("f1"), None]
    bars = bars_with_baselines(["acc", "F1 (yes)", "EM"], series, [], "MC-TACO metrics vs constant answers",
                               "value") if ind.get("acc") is not None else ""
    return (head + "<h3>By category</h3>" + ctab + ltab + plots(seg) + agree + plots(scatter, bars))


# ---- harness ---------------------------------------------------------------------------------------------------

def harness_section(exp_dir, summary):
    board = summary["leaderboard"]
    tasks = board.get("tasks", {})
    shipped = summary.get("tasks_are_shipped_fixtures", {})
    rows = [(name, t.get("metric"), t.get("score"), ratio(t.get("correct"), t.get("total")), t.get("timeouts"),
             t.get("latency_s"), t.get("latency_s_mean"), t.get("n_examples_in_file"), shipped.get(name))
            for name, t in tasks.items()]
    n = sum(t.get("total", 0) for t in tasks.values())
    rows.append(("overall (mean of task scores)", "", board.get("overall"),
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
    plot = ""
    if tasks:
        fig, ax = plt_fig(5.0, 0.45 * len(tasks) + 1.2)
        names = list(tasks)
        ax.barh(range(len(names)), [tasks[t]["score"] for t in names], color=BLUE)
        if board.get("overall") is not None:
            ax.axvline(board["overall"], color="black", ls="--", lw=1, label=f"overall {board['overall']:.4g}")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([f"{t} ({tasks[t].get('metric')})" for t in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("task score")
        ax.set_title("leaderboard", fontsize=9)
        plot = figure(fig, "leaderboard")
    return head + info + plots(plot)


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
    warn = ('<p class="warn">CONFIRMATION SPLIT: these are the held-back confirmation items.</p>'
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


def audit_section(out):
    path = out / "audit.json"
    a = read_optional(path)
    if not a or not isinstance(a.get("checks"), list):
        return note("audit.py has not been run on this directory (no audit.json): run python audit.py O.")
    per = {}
    for c in a["checks"]:
        d = per.setdefault(c.get("experiment"), {})
        d[c.get("status")] = d.get(c.get("status"), 0) + 1
    statuses = sorted({s for d in per.values() for s in d})
    rows = [(e, *[d.get(s, 0) for s in statuses]) for e, d in sorted(per.items(), key=lambda x: str(x[0]))]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))
    return ("<h2>audit.json</h2>" + note(f"As last written by audit.py at {when} (levels: "
                                          f"{', '.join(a.get('levels') or [])}; exit code {a.get('exit_code')}); "
                                          "it may predate the evidence shown below if the run was repeated.")
            + table(["experiment", *statuses], rows, "audit-status"))


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h2{border-bottom:2px solid #4c72b0;padding-bottom:2px;margin-top:2em}h3{margin:1.2em 0 .3em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;
text-align:left;vertical-align:top}th{background:#f2f2f2}table.headline td{font-weight:600}
table.kv td:first-child{color:#444}caption{caption-side:bottom;font-size:12px;color:#555;text-align:left}
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


def build(out):
    out = Path(out)
    names = experiment_names(out)
    env = read_optional(out / "environment.json")
    env_rows = [("git commit", env.get("git_commit")), ("git dirty", env.get("git_dirty")),
                ("code sha256", env.get("code_sha256")), ("python", env.get("python")),
                ("platform", env.get("platform")), ("cpu", env.get("cpu")), ("cpu count", env.get("cpu_count")),
                ("torch threads", env.get("torch_threads")),
                ("command line", " ".join(map(str, env.get("command_line") or [])) or None)]
    env_rows += [(k, v) for k, v in sorted((env.get("versions") or {}).items())]
    sections = "".join(experiment_section(out, n) for n in names)
    try:
        audit = audit_section(out)
    except Exception:
        audit = render_error("audit.json")
    toc = " · ".join(f'<a href="#{esc(n)}">{esc(n)}</a>' for n in names) or "no experiment evidence found"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Evidence report: {esc(out.name)}</title>"
            f"<style>{CSS}</style></head><body><h1>Evidence report</h1>"
            f"<p>Built from <code>{esc(out)}</code> at {esc(time.strftime('%Y-%m-%d %H:%M:%S'))} by report.py, from "
            "the evidence files only. Figures are shown exactly as written in summary.json (floats in their "
            "shortest repr; — means null). Agreement of two implementations shows a score was computed as declared; "
            "it does not show that the task or its labels are valid. A development subset of a fixture is not a "
            "benchmark result.</p>"
            f"<p>{toc}</p>{table(['environment', 'value'], env_rows, 'environment')}{audit}"
            f"{sections}</body></html>")


def write(out):
    text = build(out)
    path = Path(out) / "report.html"
    tmp = path.with_name(".report.html.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python report.py OUT_DIR")
    if not Path(sys.argv[1]).is_dir():
        print(f"error: {sys.argv[1]}: no such output directory; run run.py first", file=sys.stderr)
        sys.exit(2)
    print(write(sys.argv[1]))
