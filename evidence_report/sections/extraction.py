"""extraction: generated answers scored three ways (exact, strict JSON, regex), their correctness patterns, the
failure categories, lm-eval's generate_until cross-check, the pre-registered audit sample."""
from evidence_report.cells import count, interval, rate
from evidence_report.plots import BLUE, GREEN, RED, hbar_plot, plots
from evidence_report.sections.protocol import limit_note
from evidence_report.shared import paired_table
from evidence_report.tables import idx_list, kv_table, note, ratio, table

NAME = "extraction"


EXTRACTION_SCORERS = ("exact", "strict", "regex")    # the digit order of summary["patterns"] keys, e.g. "001"


def extraction_headline(summary, layout):
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
                  "headline", layout=layout)
            + paired_table(summary, "extraction-uncertainty", "the scorers paired on the same generations", layout))


def extraction_patterns(summary, layout):
    pats = summary.get("patterns", {})
    rows = []
    for key, p in pats.items():
        marks = ["✓" if ch == "1" else "✗" for ch in key] if len(key) == len(EXTRACTION_SCORERS) else [key] * 3
        shown = "-".join(key) if len(key) == len(EXTRACTION_SCORERS) else key   # "0-0-1": a name, not a figure
        rows.append((shown, *marks, p["n"], idx_list(p.get("idx"))))
    out = ("<h3>Which items each scorer counts right</h3>"
           + table(["pattern", *EXTRACTION_SCORERS, "items", "idx"], rows, "extraction-patterns",
                   caption="pattern digits: exact, strict, regex (1 = counted right)", layout=layout))
    if pats:
        labels = [" ".join(f"{s}{'✓' if ch == '1' else '✗'}" for s, ch in zip(EXTRACTION_SCORERS, k))
                  if len(k) == 3 else k for k in pats]
        out += plots(hbar_plot(labels, [("items", [p["n"] for p in pats.values()], BLUE)],
                               "items per correctness pattern"))
    prs = [(f"{p['a']} vs {p['b']}", p["both_correct"], p["only_a"], p["only_b"], p["neither"],
            idx_list(p.get("only_a_idx")), idx_list(p.get("only_b_idx"))) for p in summary.get("paired", {}).values()]
    return out + "<h3>Paired scorers</h3>" + table(["pair (a vs b)", "both right", "only a", "only b", "neither",
                                                    "only-a idx", "only-b idx"], prs, "extraction-paired",
                                                   layout=layout)


def extraction_failures(summary, layout):
    mf = summary.get("match_failures", {})
    cats = list((mf.get("all") or {}).keys())
    crows = [(c, *[mf.get(k, {}).get(c) for k in ("all", "regex_wrong", "regex_right")]) for c in cats]
    ctab = table(["category", "all items", "among regex-wrong", "among regex-right"], crows, "extraction-failures",
                 layout=layout)
    reasons = summary["scorers"].get("strict", {}).get("reasons", {})
    rtab = table(["strict JSON failure reason", "items"], list(reasons.items()), "extraction-strict-reasons",
                 layout=layout)
    plot = ""
    if cats:
        plot = hbar_plot(cats, [("regex counts it wrong", [mf.get("regex_wrong", {}).get(c, 0) for c in cats], RED),
                                ("regex counts it right", [mf.get("regex_right", {}).get(c, 0) for c in cats], GREEN)],
                         "failure categories", 0.5)
    return "<h3>Failure categories</h3>" + f'<div class="side">{ctab}{rtab}</div>' + plots(plot)


def extraction_agreement(summary, layout):
    g, ra, fr = (summary.get(k, {}) for k in ("lm_eval_generate_until", "regex_agreement", "finish_reasons"))
    agree = "<h3>Agreement: official vs independent</h3>" + kv_table([
        ("regex: lm-eval filters vs independent re-implementation, items", count(ra.get("n_items"))),
        ("regex extraction mismatches", count(ra.get("n_mismatches"))),
        ("lm-eval generate_until cross-check ran", g.get("ran")),
        ("generations identical to lm-eval's", ratio(g.get("n_identical"), g.get("n_compared"))),
        ("input ids identical to lm-eval's", ratio(g.get("n_input_ids_identical"), g.get("n_compared"))),
        ("generation mismatch idx", idx_list(g.get("mismatch_idx"))),
        ("finish reasons: eos / length", f"{fr.get('eos')} / {fr.get('length')}")], "extraction-agreement",
        layout=layout)
    au, hr = summary.get("audit_sample", {}), summary.get("human_review", {})
    review = "<h3>Pre-registered audit sample and human review</h3>" + kv_table(
        [("audit sample size", count(au.get("n"))), ("per class", au.get("per_class")),
         ("pre-registration sha256", au.get("preregistration_sha256"))]
        + [(f"human review: {k}", v) for k, v in hr.items() if k != "note"], "extraction-review",
        layout=layout)
    if hr.get("note"):
        review += note(hr["note"])
    return agree + review


def render(exp_dir, summary, layout):
    return (limit_note(summary) + extraction_headline(summary, layout) + extraction_patterns(summary, layout)
            + extraction_failures(summary, layout)
            + extraction_agreement(summary, layout))
