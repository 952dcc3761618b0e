"""Arithmetic level: every aggregate in results_*.json recomputed from the per-sample values, with the aggregation
the task config names (evaluator_utils.TaskOutput.calculate_aggregate_metric), and every stderr as lm-eval's
stderr_for_metric gives it (api/metrics.py:545-577): mean's closed form (sample stddev / sqrt(n)); the bootstrap of
median, matthews_corrcoef, f1, perplexity, bleu, chrf, ter and nanmean (bootstrap.py: f1, mcc and perplexity
reproduced bit for bit, the others SKIPPED by name); "N/A" for every other aggregation (weighted_perplexity,
bits_per_byte, ...), for one sample, and for bootstrap_iters 0.

Comparisons are exact (==). lm-eval's sums are builtin sum(), whose rounding changed in Python 3.12: each value is
recomputed the way the run's Python adds (bootstrap.python_summation; both ways when the results file does not
name its Python, and the row's note says which matched)."""
from evidence_audit.checks import ARITHMETIC, expect, short
from evidence_audit.definitions import is_num
from evidence_audit.lmeval.bootstrap import Budget, NotReproduced, bootstrap_stderr, python_summation
from evidence_audit.lmeval.metrics import AGGREGATIONS, BOOTSTRAPPED, CLOSED_FORM_STDERR, SCALAR_AGGREGATIONS, \
    SUMMED, mean_stderr

FEW_ITERS = ("bleu", "chrf", "ter")      # evaluator_utils.py:117-121: bootstrap_iters capped at 100 for these


def items_of(t, metric, filt):
    """The per-sample values of (metric, filter) in file order (pairs for f1/mcc and rolling metrics as tuples)."""
    return [tuple(s.raw[metric]) if isinstance(s.raw[metric], list) else s.raw[metric]
            for s in t.by_filter().get(filt, []) if metric in s.raw["metrics"]]


def matches(recorded, compute, sums):
    """The first summation (False: left to right, True: Python >= 3.12) under which compute(sums) == recorded, or
    None; and the value under the first summation tried (for the message)."""
    first = None
    for comp in sums:
        value = compute(comp)
        first = value if first is None else first
        if is_num(recorded) and not isinstance(recorded, bool) and value == recorded:
            return comp, value
    return None, first


def aggregate_value(agg, items, comp):
    fn = AGGREGATIONS[agg]
    return fn(items, comp) if agg in SUMMED else fn(items)


def stderr_plan(agg, boot, n):
    """What lm-eval records as this aggregate's stderr: ("N/A", why), ("mean", why) or ("bootstrap", iters)."""
    if not isinstance(boot, int) or isinstance(boot, bool) or boot <= 0:
        return "N/A", f"bootstrap_iters {boot!r}: no stderr"
    if n <= 1:
        return "N/A", f"{n} sample(s)"
    if agg in BOOTSTRAPPED:
        return "bootstrap", min(boot, 100) if agg in FEW_ITERS else boot
    if agg == "mean":
        return "mean", "sample stddev / sqrt(n)"
    if agg in CLOSED_FORM_STDERR:
        return "unsupported", f"{agg}: closed-form stderr not written here"
    return "N/A", f"lm-eval has no stderr for aggregation {agg!r}"


def aggregate_rows(C, t, where, top=None):
    """Rows "aggregates recomputed", "stderr recomputed" and "bootstrap stderr recomputed"; SKIPPED rows name each
    aggregation or stderr not reproduced. `where` names the results file in messages, `top` is its parsed content
    (its Python version decides the summation). Every recorded key must be recomputed or named."""
    bad, skipped, skipped_se, n_agg = [], set(), set(), 0
    sums, seen_sums = python_summation(top or {}), set()
    se = StderrRows(sums, seen_sums)
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
        if agg == "mean" and all(isinstance(i, bool) for i in items):
            items = [int(i) for i in items]     # a process_results returning bools (ifeval's prompt_level_*):
            # lm-eval's mean and mean_stderr add them as 0 and 1, and so does the audit
        pairs = all(isinstance(i, tuple) and len(i) == 2 for i in items)
        scalars = all(is_num(i) and not isinstance(i, bool) for i in items)
        if agg not in AGGREGATIONS or not (scalars if agg in SCALAR_AGGREGATIONS else pairs):
            skipped.add(f"{metric} ({agg})")
        elif agg == "f1" and aggregate_value(agg, items, False) is None:
            skipped.add(f"{metric} ({agg}: labels other than 0/1)")
        else:
            n_agg += 1
            comp, value = matches(recorded[key], lambda c: aggregate_value(agg, items, c),
                                  sums if agg in SUMMED else [False])
            if comp is None:
                expect(bad, w, key, recorded[key], value, f"{agg} of {len(items)} per-sample values")
            elif agg in SUMMED:
                seen_sums.add(comp)
        se_key = f"{metric}_stderr,{filt}"
        if se_key not in recorded:
            bad.append(f"{w}.{se_key}: missing (lm-eval records a stderr, or \"N/A\", for every aggregate)")
            continue
        kind = stderr_row(se, w, se_key, recorded[se_key], agg, items, scalars, stderr_plan(agg, boot, len(items)))
        if kind:
            skipped_se.add(f"{metric} ({kind})")
    orphans = [k for k in recorded if k.partition(",")[0].endswith("_stderr")
               and f"{k.partition(',')[0][:-len('_stderr')]},{k.partition(',')[2]}" not in recorded]
    bad += [f"{where} results.{t.name}.{k}: a stderr without its aggregate ({short(recorded[k])})" for k in orphans]
    note = summation_note(sums, seen_sums)
    C.add(t.label, ARITHMETIC, "aggregates recomputed from the per-sample values (config's aggregation)", n_agg, bad,
          note=note)
    C.add(t.label, ARITHMETIC, "stderr recomputed (mean: sample stddev / sqrt(n); \"N/A\" where lm-eval has none)",
          se.n_se, se.bad_se, note=note)
    if se.n_boot or se.bad_boot:
        C.add(t.label, ARITHMETIC, "bootstrap stderr recomputed (lm-eval's seeded chunks, same replicates)", se.n_boot,
              se.bad_boot, note=f"bootstrap_iters {', '.join(map(str, sorted(se.iters)))}")
    for name in sorted(skipped):
        C.skip(t.label, ARITHMETIC, f"aggregate {name}", "aggregation not implemented in the audit: NOT checked")
    for name in sorted(skipped_se):
        C.skip(t.label, ARITHMETIC, f"stderr {name}", "not reproduced in the audit: NOT checked")


class StderrRows:
    """The stderr checks of one task: failures and counts of the closed-form / "N/A" row and the bootstrap row."""

    def __init__(self, sums, seen_sums):
        self.sums, self.seen = sums, seen_sums
        self.bad_se, self.bad_boot, self.n_se, self.n_boot, self.iters = [], [], 0, 0, set()
        self.budget = Budget()      # the draws all of the task's bootstrap stderrs may take


def stderr_row(rows, w, se_key, recorded, agg, items, scalars, plan):
    """Check one recorded stderr against lm-eval's plan for it; returns why it is not reproduced, or None."""
    kind, why = plan
    if kind == "N/A":
        rows.n_se += 1
        expect(rows.bad_se, w, se_key, recorded, "N/A", why)
    elif kind == "mean":
        rows.n_se += 1
        if not scalars:
            rows.bad_se.append(f"{w}.{se_key}: per-sample values of a mean are not all numbers")
            return None
        comp, value = matches(recorded, lambda c: mean_stderr(items, c), rows.sums)
        if comp is None:
            expect(rows.bad_se, w, se_key, recorded, value, why)
        else:
            rows.seen.add(comp)
    elif kind == "bootstrap":
        try:
            comp, value = matches(recorded, lambda c: bootstrap_stderr(agg, items, why, c, rows.budget), rows.sums)
        except NotReproduced as e:
            return f"bootstrap of {e}"
        rows.n_boot += 1
        rows.iters.add(why)
        if comp is None:
            expect(rows.bad_boot, w, se_key, recorded, value, f"bootstrap_stderr({agg}, {len(items)} samples, "
                   f"{why} iterations, seeds 0..{why // min(1000, why) - 1})")
        else:
            rows.seen.add(comp)
    else:
        return why
    return None


def summation_note(sums, seen):
    if len(sums) == 1:
        return ""
    if seen:
        return ("the results file names no Python version: values matched builtin sum() of Python "
                + " and ".join("3.12+" if c else "<= 3.11" for c in sorted(seen)))
    return "the results file names no Python version: both summations tried"
