"""run.py --fast evidence: each record's fast scores and the agreement figures in summary.json["fast"]."""
from evidence_audit.checks import ARITHMETIC, MISSING, expect, short
from evidence_audit.definitions import argmax_first, is_num


def score_comparison(records, a_of, b_of):
    """max abs diff, equal scores and argmax changes between two score lists per record (run.py --fast)."""
    diffs, changed = [], []
    for r in records:
        a, b = a_of(r), b_of(r)
        diffs += [abs(x - y) for x, y in zip(a, b)]
        if argmax_first(a) != argmax_first(b):
            changed.append(r["idx"])
    return {"argmax_changed_idx": changed, "max_abs_diff": max(diffs) if diffs else MISSING,
            "n_argmax_changes": len(changed), "n_scores": len(diffs), "n_scores_equal": sum(d == 0.0 for d in diffs)}


def fast_expected(recorded, records, C, name):
    """summary.fast of run.py --fast: the agreement figures recomputed from each record's fast scores; the
    settings, timings and work counters in it are declared (they describe the run, not the items)."""
    bad = []
    for r in records:
        f = r.get("fast")
        if not isinstance(f, dict) or set(f) != {"scores", "scores_batch1", "pred"}:
            bad.append(f"idx {r['idx']} fast: expected scores, scores_batch1, pred; found {short(f, 60)}")
            continue
        expect(bad, f"idx {r['idx']}", "fast.pred", f["pred"], argmax_first(f["scores"]))
    C.add(name, ARITHMETIC, "fast mode records (--fast: predictions from the fast scores)", len(records), bad)
    if bad or not isinstance(recorded, dict):
        return MISSING
    parity, fast, fast1 = (lambda r: r["independent"]["scores"]), (lambda r: r["fast"]["scores"]), \
        (lambda r: r["fast"]["scores_batch1"])
    vs = score_comparison(records, parity, fast)
    tol = recorded.get("tolerance", MISSING)
    return {**recorded, "vs_parity": vs, "n_candidates": vs["n_scores"],
            "passed": vs["n_argmax_changes"] == 0 and is_num(tol) and vs["max_abs_diff"] <= tol,
            "batch_invariance": {f"parity_vs_fast_batch{recorded.get('batch_size')}": vs,
                                 "parity_vs_fast_batch1": score_comparison(records, parity, fast1),
                                 f"fast_batch1_vs_batch{recorded.get('batch_size')}":
                                     score_comparison(records, fast1, fast)}}


