"""mctaco: MC-TACO by lm-eval and by the independent path, EM per question, and what lm-eval's --limit N does to
the questions it cuts (the segment plot)."""
from evidence_report.cells import Num, esc, interval, rate
from evidence_report.plots import BLUE, GREY, RED, bars_with_baselines, figure, plots, plt_fig, score_scatter
from evidence_report.reading import read_jsonl, read_optional
from evidence_report.shared import agreement_table, uncertainty_note
from evidence_report.tables import idx_list, kv_table, note, ratio, table

NAME = "mctaco"


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


def mctaco_headline(summary, layout):
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
                        "headline", layout=layout)
    head += uncertainty_note(summary.get("uncertainty"))
    lab, reported = summary.get("label_counts", {}), off.get("lm_eval_reported", {})
    head += kv_table([("lm-eval's own reported acc", rate(reported.get("acc"))),
                      ("lm-eval's own reported F1", rate(reported.get("f1"))),
                      ("documents / questions touched / complete", f"{nd} / {summary.get('n_questions_touched')} / "
                                                                   f"{summary.get('n_complete_questions')}"),
                      ("labels no / yes", f"{lab.get('no')} / {lab.get('yes')}"),
                      ("selection", summary.get("selection")), ("limit", summary.get("limit")),
                      ("metrics computed on", summary.get("metrics_computed_on"))], "mctaco-scope",
                     layout=layout)
    head += note("EM (a question counts only if every candidate is judged right) is the MC-TACO paper's metric; "
                 "lm-eval 0.4.9.2 does not compute it, so it has no official value.")
    cats = summary.get("by_category", {})
    return head + "<h3>By category</h3>" + table(
        ["category", "documents", "acc", "acc 95% interval", "complete questions", "EM questions right", "EM",
         "EM 95% interval"],
        [(c, v.get("n_documents"), rate(v.get("acc")), interval(summary, f"by_category/{c}/acc"),
          v.get("n_complete_questions"), v.get("n_correct_questions"), rate(v.get("em")),
          interval(summary, f"by_category/{c}/em")) for c, v in cats.items()], "mctaco-categories",
        layout=layout)


def mctaco_limit_tables(summary, layout):
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
                    "ΔF1 vs reference"], lrows, "mctaco-limits", layout=layout)
           + table(["run", "questions touched", "EM complete questions", "questions cut",
                    "EM of cut questions (scored candidates)", "EM of cut questions (all candidates)",
                    "doc_ids are 0..N-1", "max abs diff vs main run"], grows, "mctaco-limit-groups",
                   caption="groups (questions) cut by the limit; the reference is this run's own document set",
                   layout=layout))
    sh = demo.get("shuffle_before_cut", {})
    if sh:
        out += kv_table([("documents shuffled before the cut", sh.get("documents_shuffled_before_limit")),
                         ("observed", sh.get("observed"))], "mctaco-shuffle", layout=layout)
        out += note(sh.get("conclusion", ""))
        src = sh.get("source", [])
        if src:
            out += ("<details><summary>lm-eval source lines behind this</summary>" + table(
                ["file", "lines", "snippet found", "says"],
                [(s["file"], s["lines"], s["found"], s["says"]) for s in src], "mctaco-source", layout=layout)
                    + "</details>")
    if summary.get("cut_questions"):
        out += table(["cut question (this run)", "candidates", "scored", "scored idx"],
                     [(f"q{c['question_rank']}", c["n_candidates"], c["n_scored"], idx_list(c["scored_idx"]))
                      for c in summary["cut_questions"]], "mctaco-cut", layout=layout)
    return out


def render(exp_dir, summary, layout):
    records = read_jsonl(exp_dir / "records.jsonl")
    cfg = read_optional(exp_dir / "config.json")
    ind, ag = summary["independent"], summary["agreement"]
    seg = question_segments_plot(cfg, summary, {r["idx"] for r in records})
    agree = agreement_table(summary, "mctaco-agreement", "documents joined", "n_samples_joined", layout,
                            after=[("acc: lm-eval vs independent", rate(ag.get("acc_official_vs_independent"))),
                                   ("F1: lm-eval vs independent", rate(ag.get("f1_official_vs_independent")))])
    series = {"model (independent = official)": [ind["acc"], ind["f1"], ind.get("em", {}).get("em")]}
    for name, b in summary.get("baselines", {}).items():
        series[name] = [b.get("acc"), b.get("f1"), None]
    bars = bars_with_baselines(["acc", "F1 (yes)", "EM"], series, [], "MC-TACO metrics vs constant answers",
                               "value") if ind.get("acc") is not None else ""
    return (mctaco_headline(summary, layout) + mctaco_limit_tables(summary, layout) + plots(seg) + agree
            + plots(score_scatter(records, summary), bars))
