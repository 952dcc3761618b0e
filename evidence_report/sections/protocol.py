"""protocol: the official SST-2 prompt scored by lm-eval and by the independent path."""
from evidence_report.cells import interval, rate
from evidence_report.plots import bars_with_baselines, plots, score_scatter
from evidence_report.reading import read_jsonl
from evidence_report.shared import agreement_table, paired_table
from evidence_report.tables import kv_table, note, table

NAME = "protocol"


def limit_note(summary, unit="items"):
    """The label of a run limited with --limit N, from summary.json's limit block ("" for a run without one): the
    figures below are of those items only. The options and extraction sections show it too."""
    lim = summary.get("limit")
    if not isinstance(lim, dict):
        return ""
    return note(f"LIMITED RUN: first {lim.get('n')} of {lim.get('of')} {unit} (--limit {lim.get('n')}), taken in "
                f"{lim.get('order')}; every figure of this section is of those {lim.get('n')} {unit} only")


def render(exp_dir, summary, layout):
    records = read_jsonl(exp_dir / "records.jsonl")
    n = summary["n_items"]
    off, ind, cc = summary["official"], summary["independent"], summary["constant_class_baseline"]
    labels = summary["label_counts"]
    head = limit_note(summary) + table(["path", "correct", "of", "accuracy", "95% interval (Wilson)",
                                        "predicted negative",
                  "predicted positive"], [
        ("official (lm-eval 0.4.9.2)", off["correct"], n, rate(off["accuracy"]),
         interval(summary, "official/accuracy"), off["pred_counts"]["0"], off["pred_counts"]["1"]),
        ("independent", ind["correct"], n, rate(ind["accuracy"]), interval(summary, "independent/accuracy"),
         ind["pred_counts"]["0"], ind["pred_counts"]["1"]),
        (f"constant class (always label {cc['label']})", labels.get(str(cc["label"])), n, rate(cc["accuracy"]),
         interval(summary, "constant_class_baseline/accuracy"), None, None)], "protocol-headline", "headline",
        layout=layout)
    head += paired_table(summary, "protocol-uncertainty", "each path against always answering the majority label, "
                                                     "on the same items", layout)
    head += kv_table([("lm-eval's own reported acc", rate(off.get("lm_eval_reported_acc"))),
                      ("label counts (0 negative / 1 positive)", f"{labels.get('0')} / {labels.get('1')}")],
                     "protocol-reported", layout=layout)
    agree = agreement_table(summary, "protocol-agreement", "samples joined", "n_samples_joined", layout)
    bars = bars_with_baselines(["official", "independent"], {"accuracy": [off["accuracy"], ind["accuracy"]]},
                               [("all negative", labels["0"] / n, "--"), ("all positive", labels["1"] / n, ":")],
                               "accuracy with constant-class baselines")
    return head + agree + plots(score_scatter(records, summary), bars)
