"""summary.json "uncertainty", recomputed by formula from the counts the rule itself recomputed from the records
(written again here on purpose: the runner's experiments/stats.py is not imported).

  Wilson 95%     the roots pi of (p - pi)^2 = z^2 pi (1 - pi) / n, solved as a quadratic:
                 pi = (2k + z^2 -/+ z sqrt(z^2 + 4k(n - k)/n)) / (2(n + z^2)); exactly 0 at k = 0, 1 at k = n;
                 no interval (null, with a reason) at n = 0. z = the 0.975 normal quantile (statistics.NormalDist).
  McNemar        definitions.mcnemar_exact: min(1, 2 P(X <= min(b, c))), X ~ Bin(b + c, 1/2), integer arithmetic
  Newcombe       method 10 of Newcombe (1998, Statistics in Medicine 17:2635-2650) for the paired difference
                 acc_a - acc_b: the Wilson limits of both accuracies, combined with the phi coefficient of the
                 paired 2x2 table (phi = 0 when a margin is empty):
                 lower = d - sqrt(e1^2 - 2 phi e1 f2 + f2^2), e1 = acc_a - lo_a, f2 = hi_b - acc_b
                 upper = d + sqrt(f1^2 - 2 phi f1 e2 + e2^2), f1 = hi_a - acc_a, e2 = acc_b - lo_b
                 (each radicand evaluated as (e - f)^2 + 2 (1 - phi) e f, which has no cancellation)

Floats are compared with a tolerance, because the runner evaluates the same formulas in another algebraic form:
interval limits and differences (all in [-1, 1]) to TOL absolute, p-values and z to TOL relative; counts exactly.
A recorded float within tolerance is taken as the recomputed value (tolerated()), anything else is a failure
named by the summary.json comparison.
"""
import math
from statistics import NormalDist

from evidence_audit.checks import MISSING
from evidence_audit.definitions import mcnemar_exact

TOL = 1e-12
Z = NormalDist().inv_cdf(0.975)
RELATIVE = ("mcnemar_p", "z")        # compared relative to their size; every other float absolute (|x| <= 1)
# the method each declared description must name (the audit recomputes exactly these)
METHOD_WORDS = {"accuracy_interval": ("Wilson",), "difference_interval": ("Newcombe", "method 10"),
                "test": ("McNemar", "exact")}
NO_N = "n = 0: no items, no interval"


def wilson95(k, n):
    """[lo, hi] of the Wilson score interval, or None for n = 0."""
    if n == 0:
        return None
    z2 = Z * Z
    root = Z * math.sqrt(z2 + 4 * k * (n - k) / n)
    den = 2 * (n + z2)
    lo = 0.0 if k == 0 else max(0.0, (2 * k + z2 - root) / den)
    hi = 1.0 if k == n else min(1.0, (2 * k + z2 + root) / den)
    return [lo, hi]


def paired_difference_ci(table):
    """Newcombe's method 10 for table = {"11": both right, "10": only a, "01": only b, "00": neither}."""
    n = sum(table.values())
    if n == 0:
        return None
    ka, kb = table["11"] + table["10"], table["11"] + table["01"]
    (lo_a, hi_a), (lo_b, hi_b) = wilson95(ka, n), wilson95(kb, n)
    pa, pb = ka / n, kb / n
    margins = ka * (n - ka) * kb * (n - kb)
    phi = (table["11"] * table["00"] - table["10"] * table["01"]) / math.sqrt(margins) if margins else 0.0
    phi = max(-1.0, min(1.0, phi))
    d = (table["10"] - table["01"]) / n
    e1, f2, f1, e2 = pa - lo_a, hi_b - pb, hi_a - pa, pb - lo_b
    # e^2 - 2 phi e f + f^2 written as (e - f)^2 + 2 (1 - phi) e f: non-negative terms, no cancellation near phi = 1
    lower = d - math.sqrt((e1 - f2) * (e1 - f2) + 2 * (1 - phi) * e1 * f2)
    upper = d + math.sqrt((f1 - e2) * (f1 - e2) + 2 * (1 - phi) * f1 * e2)
    return [max(-1.0, lower), min(1.0, upper)]


def paired_figures(a, b, right_a, right_b):
    """One paired comparison from two correctness lists over the same items."""
    t = {"11": 0, "10": 0, "01": 0, "00": 0}
    for x, y in zip(right_a, right_b):
        t[f"{int(bool(x))}{int(bool(y))}"] += 1
    n = len(right_a)
    ci = paired_difference_ci(t)
    out = {"a": a, "b": b, "n": n, "both_correct": t["11"], "only_a": t["10"], "only_b": t["01"],
           "neither": t["00"], "difference": (t["10"] - t["01"]) / n if n else None, "difference_ci95": ci,
           "mcnemar_p": mcnemar_exact(t["10"], t["01"])}
    if ci is None:
        out["reason"] = NO_N
    return out


def accuracy_figures(k, n):
    ci = wilson95(k, n)
    return {"correct": k, "n": n, "wilson95": ci, **({"reason": NO_N} if ci is None else {})}


def declared_methods(recorded):
    """The method descriptions: the recorded text when it names the method recomputed here, else what it must say
    (so the comparison fails and names it)."""
    rec = recorded if isinstance(recorded, dict) else {}
    out = {}
    for key, words in METHOD_WORDS.items():
        text = rec.get(key, MISSING)
        ok = isinstance(text, str) and all(w in text for w in words)
        out[key] = text if ok else f"a description naming {' and '.join(words)}"
    return out


def expected_block(recorded, accuracies, paired, uncovered=()):
    """summary.json "uncertainty" as the counts say it must be. accuracies = {key: (correct, n)}; paired = {key:
    (a, b, correctness list of a, of b)}; uncovered = keys of not_covered this experiment may declare (their text
    is declared, not recomputed)."""
    rec = recorded if isinstance(recorded, dict) else {}
    block = {"confidence": 0.95, "z": Z, **declared_methods(rec),
             "accuracies": {key: accuracy_figures(k, n) for key, (k, n) in accuracies.items()},
             "paired": {key: paired_figures(*args) for key, args in paired.items()}}
    nc = rec.get("not_covered")
    if uncovered and isinstance(nc, dict) and set(nc) == set(uncovered) and all(isinstance(v, str)
                                                                                 for v in nc.values()):
        block["not_covered"] = nc
    elif uncovered:
        block["not_covered"] = {k: "a reason (text)" for k in uncovered}
    return tolerated(block, rec)


def close(key, recorded, recomputed):
    scale = max(abs(recorded), abs(recomputed)) if key in RELATIVE else max(1.0, abs(recomputed))
    return abs(recorded - recomputed) <= TOL * scale


def tolerated(expected, recorded, key=""):
    """`expected` with every float that the recorded value matches within tolerance replaced by the recorded one
    (so that the exact comparison afterwards names only real differences)."""
    if isinstance(expected, dict):
        rec = recorded if isinstance(recorded, dict) else {}
        return {k: tolerated(v, rec.get(k, MISSING), k) for k, v in expected.items()}
    if isinstance(expected, list):
        rec = recorded if isinstance(recorded, list) and len(recorded) == len(expected) else [MISSING] * len(expected)
        return [tolerated(e, r, key) for e, r in zip(expected, rec)]
    if isinstance(expected, float) and isinstance(recorded, float) and close(key, recorded, expected):
        return recorded
    return expected
