"""options: the choices listed in the prompt, forward and reversed; flips first (the primary measure), then the
fwd/rev flip matrices counted from records.jsonl, then the accuracies per condition."""
from evidence_report.cells import Num, count, interval, rate
from evidence_report.plots import bars_with_baselines, figure, plots, plt_fig, score_scatter
from evidence_report.reading import read_jsonl, read_optional
from evidence_report.sections.protocol import limit_note
from evidence_report.shared import agreement_table, paired_table
from evidence_report.tables import idx_list, note, table, wide

NAME = "options"


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


def options_flips(records, cfg, summary, layout):
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
                    row_classes=["primary" if r[0] == primary else "" for r in rows], layout=layout))


SCORES = (("acc", "correct"), ("acc_norm", "correct_norm"), ("acc_norm_tokens", "correct_norm_tokens"))


def conditions_format2(conds, conds_cfg, order, summary, layout):
    """Format 2's table: one row per condition, its three scores side by side (17 columns: wider than a 1300 px
    window, hence its own horizontal scroll)."""
    rows = []
    for name in order:
        m, c = conds[name], conds_cfg.get(name, {})
        rows.append((name, c.get("space"), c.get("order"), m["correct"], m["n"], rate(m["acc"]),
                     interval(summary, f"conditions/{name}/acc"), m["correct_norm"], rate(m["acc_norm"]),
                     interval(summary, f"conditions/{name}/acc_norm"), m["correct_norm_tokens"],
                     rate(m["acc_norm_tokens"]), interval(summary, f"conditions/{name}/acc_norm_tokens"),
                     m["predicted_positive"], m["chose_first_position"], m["baseline_all_negative_correct"],
                     m["baseline_all_positive_correct"]))
    return wide(table(["condition", "space", "order", "correct", "of", "acc", "acc 95% interval",
                       "correct (norm)", "acc_norm", "acc_norm 95% interval", "correct (norm tokens)",
                       "acc_norm_tokens", "acc_norm_tokens 95% interval", "predicted positive",
                       "chose first position", "all-negative baseline correct", "all-positive baseline correct"],
                      rows, "options-conditions", "headline", layout=layout))


def conditions_tables(conds, conds_cfg, order, summary, layout):
    """Format 3's tables, narrow enough for a 1300 px window: the accuracies one row per condition and score (acc,
    acc_norm, acc_norm_tokens), then what each condition predicted against the constant-class baselines."""
    rows = [(name, conds_cfg.get(name, {}).get("space"), conds_cfg.get(name, {}).get("order"), score,
             conds[name][correct], conds[name]["n"], rate(conds[name][score]),
             interval(summary, f"conditions/{name}/{score}")) for name in order for score, correct in SCORES]
    preds = [(name, conds[name]["n"], conds[name]["predicted_positive"], conds[name]["chose_first_position"],
              conds[name]["baseline_all_negative_correct"], conds[name]["baseline_all_positive_correct"])
             for name in order]
    return (table(["condition", "space", "order", "score", "correct", "of", "accuracy", "95% interval"], rows,
                  "options-conditions", "headline", layout=layout)
            + table(["condition", "items", "predicted positive", "chose first position",
                     "all-negative baseline correct", "all-positive baseline correct"], preds,
                    "options-predictions", layout=layout))


def options_conditions(cfg, summary, order, layout):
    conds_cfg = {c["name"]: c for c in cfg.get("conditions", [])}
    conds = summary["conditions"]
    head = ("<h3>Accuracy per condition (secondary)</h3>"
            + (conditions_format2 if layout.format2 else conditions_tables)(conds, conds_cfg, order, summary, layout))
    head += paired_table(summary, "options-uncertainty", "raw accuracies of the configured comparisons, paired on the "
                                                    "items (the McNemar p equals the flips table's)", layout)
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


def options_matrices(records, cfg, summary, label_names, layout):
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
                       trows, f"options-flipmatrix-{space}", "matrix", f"rows {a}, columns {b}", layout=layout)
    if not mats:
        return ""
    return ("<h3>fwd/rev flip matrices (semantic predictions)</h3>"
            + note("Rows: the semantic prediction with the options listed forward (A = negative); columns: listed "
                   "reversed (A = positive). Off-diagonal cells are flips. Counted from records.jsonl; the last row "
                   "sets the flips against summary.json.")
            + f'<div class="side">{mtabs}</div>' + plots(heatmaps(mats, label_names)))


def render(exp_dir, summary, layout):
    records = read_jsonl(exp_dir / "records.jsonl")
    cfg = read_optional(exp_dir / "config.json")
    label_names = (cfg.get("config") or {}).get("sst2_choices") or ["0", "1"]
    listed = [c["name"] for c in cfg.get("conditions", [])]
    conds = summary["conditions"]
    order = [c for c in listed if c in conds] + [c for c in conds if c not in listed]
    agree = agreement_table(
        summary, "options-agreement", "records joined", "n_records_joined", layout,
        before=[("records (item × condition)", count(summary["n_records"]))],
        after=[("lm-eval process_results acc/acc_norm mismatches",
                count(summary["agreement"].get("n_lm_eval_metric_mismatches")))])
    scatter = score_scatter(records, summary, lambda r: f"{r.get('space', '?')} space")
    return (limit_note(summary) + options_flips(records, cfg, summary, layout)
            + options_matrices(records, cfg, summary, label_names, layout)
            + options_conditions(cfg, summary, order, layout) + agree + plots(scatter))
