"""Arithmetic level: every aggregate in results_*.json recomputed from the per-sample values, with the aggregation
the task config names (evaluator_utils.TaskOutput.calculate_aggregate_metric), and the stderr where lm-eval's
definition is deterministic (mean: sample stddev / sqrt(n); "N/A" for one sample or bootstrap_iters 0). Bootstrap
stderrs (f1, mcc, ...) resample with lm-eval's process pool and seeds: SKIPPED by name."""
from evidence_audit.checks import ARITHMETIC, expect, short
from evidence_audit.definitions import is_num
from evidence_audit.lmeval.metrics import AGGREGATIONS, BOOTSTRAPPED, SCALAR_AGGREGATIONS, mean_stderr

AGG_TOL = 1e-9      # |recorded - recomputed| allowed for an aggregate (scikit-learn's float order differs)


def close(bad, where, field, recorded, recomputed, why):
    if is_num(recorded) and is_num(recomputed) and abs(recorded - recomputed) <= AGG_TOL:
        return
    expect(bad, where, field, recorded, recomputed, why)


def items_of(t, metric, filt):
    """The per-sample values of (metric, filter) in file order (pairs for f1/mcc as tuples of ints)."""
    return [tuple(s.raw[metric]) if isinstance(s.raw[metric], list) else s.raw[metric]
            for s in t.by_filter().get(filt, []) if metric in s.raw["metrics"]]


def aggregate_rows(C, t, where):
    """Rows "aggregates recomputed" and "stderr recomputed"; SKIPPED rows name each aggregation or stderr not
    implemented. `where` names the results file in messages. Every recorded key must be recomputed or named."""
    bad, bad_se, skipped, skipped_se, n_agg, n_se = [], [], set(), set(), 0, 0
    recorded = {k: v for k, v in t.results.items() if k != "alias"}
    boot = t.run_config.get("bootstrap_iters")
    for key in sorted(recorded):
        metric, _, filt = key.partition(",")
        if metric.endswith("_stderr"):
            continue
        items, agg = items_of(t, metric, filt), t.aggregation(metric)
        w = f"{where} results.{t.name}"
        if not items:
            bad.append(f"{w}.{key}: no sample logs metric {metric!r} under filter {filt!r}")
            continue
        pairs = all(isinstance(i, tuple) and len(i) == 2 for i in items)
        if agg not in AGGREGATIONS or (agg in SCALAR_AGGREGATIONS) == pairs:
            skipped.add(f"{metric} ({agg})")
        else:
            value = AGGREGATIONS[agg](items)
            if value is None:
                skipped.add(f"{metric} ({agg}: labels other than 0/1)")
            else:
                n_agg += 1
                close(bad, w, key, recorded[key], value, f"{agg} of {len(items)} per-sample values")
        se_key = f"{metric}_stderr,{filt}"
        if se_key not in recorded:
            bad.append(f"{w}.{se_key}: missing (lm-eval records a stderr, or \"N/A\", for every aggregate)")
        elif not isinstance(boot, int) or boot <= 0 or len(items) <= 1:
            n_se += 1
            expect(bad_se, w, se_key, recorded[se_key], "N/A", f"bootstrap_iters {boot}, {len(items)} samples")
        elif agg == "mean":
            n_se += 1
            close(bad_se, w, se_key, recorded[se_key], mean_stderr(items), "sample stddev / sqrt(n)")
        else:
            skipped_se.add(f"{metric} ({agg}: {'bootstrap' if agg in BOOTSTRAPPED else 'no closed form here'})")
    orphans = [k for k in recorded if k.partition(",")[0].endswith("_stderr")
               and f"{k.partition(',')[0][:-len('_stderr')]},{k.partition(',')[2]}" not in recorded]
    bad += [f"{where} results.{t.name}.{k}: a stderr without its aggregate ({short(recorded[k])})" for k in orphans]
    C.add(t.label, ARITHMETIC, "aggregates recomputed from the per-sample values (config's aggregation)", n_agg, bad)
    C.add(t.label, ARITHMETIC, "stderr recomputed (mean: sample stddev / sqrt(n))", n_se, bad_se)
    for name in sorted(skipped):
        C.skip(t.label, ARITHMETIC, f"aggregate {name}", "aggregation not implemented in the audit: NOT checked")
    for name in sorted(skipped_se):
        C.skip(t.label, ARITHMETIC, f"stderr {name}", "not deterministic or not implemented in the audit: NOT checked")
