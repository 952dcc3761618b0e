"""What several experiments' sections share: the agreement table, the paired comparisons of summary.json's
uncertainty block, and the parts every experiment gets (stages, run identity, and the generic view of a summary that
no section draws, or that its section could not draw)."""
from evidence_report.cells import Derived, Num, count, fmt, is_number, unsigned_zero
from evidence_report.reading import read_json, read_jsonl, read_optional
from evidence_report.tables import flatten, kv_table, note, passed, table, wide


def paired_table(summary, tid, caption, layout):
    """The paired comparisons of summary.json's uncertainty block: the 2x2 counts, the difference of accuracies
    a - b with its 95% interval, the exact McNemar p; and the methods, as the evidence names them. Format 3's layout
    also names each comparison whose interval is zero at both ends (degenerate_intervals)."""
    unc = summary.get("uncertainty") or {}
    rows = [(name, p.get("a"), p.get("b"), count(p.get("n")), count(p.get("only_a")), count(p.get("only_b")),
             Num(p.get("difference"), "delta"), Num(p.get("difference_ci95"), "delta"), Num(p.get("mcnemar_p"),
                                                                                            "pvalue"))
            for name, p in (unc.get("paired") or {}).items()]
    if not rows:
        return ""
    return ("<h3>Paired comparisons (uncertainty)</h3>"
            + wide(table(["comparison", "a", "b", "items", "only a right", "only b right", "difference a − b",
                          "95% interval", "exact McNemar p"], rows, tid, "", caption, layout=layout))
            + ("" if layout.format2 else degenerate_intervals(unc.get("paired") or {}))
            + uncertainty_note(unc))


def is_degenerate(ci):
    """A 95% interval [lo, hi] that the page shows as zero at both ends (rounded as its cell rounds it)."""
    return (isinstance(ci, list) and len(ci) == 2 and all(is_number(x) for x in ci)
            and all(unsigned_zero(fmt(x, "delta")) == "0.0000" for x in ci))


def degenerate_intervals(paired):
    """Format 3's note on the paired comparisons whose difference interval is zero at both ends: a single point, not
    a spread; said with why when the evidence shows it (a and b right on exactly the same items). No decimal in the
    text: the audit allows decimals in number cells only."""
    said = []
    for name, p in paired.items():
        if not is_degenerate(p.get("difference_ci95")):
            continue
        same = p.get("only_a") == 0 and p.get("only_b") == 0
        said.append(f"{name}: the 95% interval of the difference is degenerate, zero at both ends to four decimals"
                    + (" (a and b are right on exactly the same items, so the difference is zero and the interval "
                       "has no width)" if same else "")
                    + "; its exact bounds are in the cell's tooltip")
    return note(" ".join(f"{s}." for s in said)) if said else ""


def uncertainty_note(unc):
    return note(f"Intervals: {unc.get('accuracy_interval')}. Differences: {unc.get('difference_interval')}. "
                f"Test: {unc.get('test')}.") if unc else ""


def agreement_table(summary, tid, joined_label, joined_key, layout, before=(), after=()):
    """The official-vs-independent agreement figures and the identity join every scored experiment records."""
    ag, ic = summary["agreement"], summary["identity_checks"]
    rows = [("candidates compared", count(summary["n_candidates"])), *before,
            ("max |official − independent| (candidate log-likelihood)", Num(ag.get("max_abs_diff"), "diff")),
            ("candidate score mismatches", count(ag.get("n_candidate_score_mismatches"))),
            ("prediction mismatches", count(ag.get("n_prediction_mismatches"))), *after,
            ("identity checks", passed(ic["passed"])), (joined_label, count(ic.get(joined_key))),
            ("fields joined", ", ".join(ic["fields"]))]
    return "<h3>Agreement: official vs independent</h3>" + kv_table(rows, tid, layout=layout)


def stages_section(exp_dir, name, layout):
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
        rows.append((s.get("name"), Num(s.get("wall_s"), "seconds"), count(rss), Derived(rss or None, "MiB")))
    out = "<h3>Stages</h3>" + table(["stage", "wall s", "process peak RSS at end (bytes)", "(MiB, derived)"], rows,
                                    f"{name}-stages", layout=layout)
    extra = [("total wall s", Num(st.get("total_wall_s"), "seconds")), ("torch threads", st.get("threads")),
             ("peak RSS of the run (bytes, max over stages)", count(max(peaks)) if peaks else None),
             ("peak RSS semantics", st.get("peak_rss_semantics"))]
    known = {"stages", "tokens", "total_wall_s", "threads", "peak_rss_semantics"}
    extra += [(k, v) for k, v in sorted(st.items()) if k not in known and not isinstance(v, (dict, list))]
    out += kv_table([r for r in extra if getattr(r[1], "value", r[1]) is not None], f"{name}-stage-totals",
                    layout=layout)
    tokens = st.get("tokens")
    if isinstance(tokens, dict) and tokens:
        out += "<details><summary>token counts</summary>" + table(["token statistic", "value"], flatten(tokens),
                                                                   f"{name}-tokens", layout=layout) + "</details>"
    return out


def identity_section(exp_dir, name, layout):
    ident = read_optional(exp_dir / "identity.json")
    if not ident:
        return ""
    keys = ["model_sha256", "tokenizer_sha256", "data_content_sha256", "prompt_template_sha256",
            "official_config_sha256", "code_sha256", "git_commit", "git_dirty"]
    rows = [(k, ident[k]) for k in keys if k in ident]
    rows += [(k, v) for k, v in sorted(ident.items()) if k not in keys and not isinstance(v, dict)]
    return ("<details><summary>run identity (identity.json)</summary>"
            + kv_table(rows, f"{name}-identity-json", layout=layout) + "</details>")


def generic_section(exp_dir, summary, layout):
    n = len(read_jsonl(exp_dir / "records.jsonl"))
    return (note(f"No dedicated view for this experiment: every summary.json field is listed. records.jsonl: "
                 f"{n} lines.") + table(["summary field", "value"], flatten(summary), f"{exp_dir.name}-summary",
                                                                  layout=layout))
