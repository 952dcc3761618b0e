"""Uncertainty of the accuracies and of the paired comparisons written into summary.json (pure Python, math only).

Three closed-form, deterministic rules, at the 95% level (z = Z95, the 0.975 quantile of the standard normal):

  Wilson score interval for a proportion k/n (Wilson 1927, JASA 22:209-212): the two roots of
      |p - pi| = z sqrt(pi (1 - pi) / n),
  i.e. centre (k + z^2/2) / (n + z^2), half-width z / (n + z^2) * sqrt(k (n - k) / n + z^2 / 4);
  the bound is exactly 0 when k = 0 and exactly 1 when k = n. n = 0 has no interval (None, with a reason).

  Exact McNemar test on paired correctness: with b = items only a gets right and c = items only b gets right,
  p = min(1, 2 P(X <= min(b, c))), X ~ Binomial(b + c, 1/2) (the two-sided exact binomial test of the discordant
  pairs at 1/2), computed in integer arithmetic, so the float is the correctly rounded rational; 1.0 when b + c = 0.

  Newcombe's hybrid score interval for the difference of two paired proportions, method 10 of Newcombe (1998),
  "Improved confidence intervals for the difference between binomial proportions based on paired data", Statistics
  in Medicine 17:2635-2650. With the 2x2 table n11 (both right), n10 (only a), n01 (only b), n00 (neither), n the
  total: p1 = (n11 + n10)/n, p2 = (n11 + n01)/n, theta = p1 - p2 = (n10 - n01)/n, (l1, u1) and (l2, u2) the
  Wilson intervals of p1 and p2, and phi = (n11 n00 - n10 n01) / sqrt((n11+n10)(n01+n00)(n11+n01)(n10+n00)),
  taken as 0 when that denominator is 0 (Newcombe's convention). Then
      lower = theta - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
      upper = theta + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)
  (no continuity correction: that is his method 11). The quantity under each root is evaluated as
  (a - b)^2 + 2 (1 - phi) a b (the same value, without cancellation).

audit.py recomputes every figure with its own code (evidence_audit/uncertainty.py), never importing this module.
"""
import math

Z95 = 1.9599639845400536      # statistics.NormalDist().inv_cdf(0.975); a unit test checks it
CONFIDENCE = 0.95
ACCURACY_METHOD = "Wilson score interval (Wilson 1927), 95%, no continuity correction"
DIFFERENCE_METHOD = ("Newcombe (1998) hybrid score interval for a difference of paired proportions, method 10 "
                     "(from the Wilson intervals of the two accuracies, with the phi correlation correction), 95%")
TEST_METHOD = ("exact McNemar: two-sided exact binomial test of the discordant pairs at 1/2, "
               "p = min(1, 2 P(X <= min(only_a, only_b))), X ~ Bin(only_a + only_b, 1/2); 1 without discordant pairs")
NO_ITEMS = "n = 0: no items, no interval"


def wilson(k, n, z=Z95):
    """(lower, upper) of the Wilson score interval of k successes in n trials, or None when n = 0."""
    if not (0 <= k <= n):
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return None
    z2 = z * z
    centre = (k + z2 / 2) / (n + z2)
    half = z / (n + z2) * math.sqrt(k * (n - k) / n + z2 / 4)
    lower = 0.0 if k == 0 else max(0.0, centre - half)
    upper = 1.0 if k == n else min(1.0, centre + half)
    return lower, upper


def mcnemar_exact(b, c):
    """Exact two-sided McNemar p of b and c discordant pairs (see the module docstring); 1.0 when b + c = 0."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def phi(n11, n10, n01, n00):
    """The phi coefficient of the paired 2x2 table; 0.0 when a margin is empty."""
    den = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    return 0.0 if den == 0 else (n11 * n00 - n10 * n01) / math.sqrt(den)


def newcombe_paired(n11, n10, n01, n00, z=Z95):
    """(lower, upper) of the 95% interval for p1 - p2 (Newcombe 1998, method 10), or None when n = 0."""
    n = n11 + n10 + n01 + n00
    if n == 0:
        return None
    p1, p2 = (n11 + n10) / n, (n11 + n01) / n
    (l1, u1), (l2, u2) = wilson(n11 + n10, n, z), wilson(n11 + n01, n, z)
    r = min(1.0, max(-1.0, phi(n11, n10, n01, n00)))
    theta = (n10 - n01) / n
    return max(-1.0, theta - _root(p1 - l1, u2 - p2, r)), min(1.0, theta + _root(u1 - p1, p2 - l2, r))


def _root(x, y, r):
    """sqrt(x^2 - 2 r x y + y^2) for x, y >= 0 and |r| <= 1, evaluated as sqrt((x - y)^2 + 2 (1 - r) x y): a sum of
    two non-negative terms, so no cancellation (the textbook form loses every digit when r = 1 and x = y, where the
    square root then turns a 1e-18 rounding residue into a 1e-9 bound)."""
    return math.sqrt((x - y) ** 2 + 2 * (1 - r) * x * y)


# ---- the summary.json block ----------------------------------------------------------------------------------

def accuracy_entry(k, n):
    """{"correct", "n", "wilson95": [lo, hi]} (+ "reason" and a null interval when n = 0)."""
    ci = wilson(k, n)
    entry = {"correct": k, "n": n, "wilson95": None if ci is None else list(ci)}
    if ci is None:
        entry["reason"] = NO_ITEMS
    return entry


def paired_entry(a, b, pairs):
    """The paired comparison of two correctness vectors on the same items: pairs = [(a right, b right), ...]."""
    n11 = sum(1 for x, y in pairs if x and y)
    n10 = sum(1 for x, y in pairs if x and not y)
    n01 = sum(1 for x, y in pairs if y and not x)
    n00 = len(pairs) - n11 - n10 - n01
    n = len(pairs)
    ci = newcombe_paired(n11, n10, n01, n00)
    entry = {"a": a, "b": b, "n": n, "both_correct": n11, "only_a": n10, "only_b": n01, "neither": n00,
             "difference": None if n == 0 else (n10 - n01) / n, "difference_ci95": None if ci is None else list(ci),
             "mcnemar_p": mcnemar_exact(n10, n01)}
    if ci is None:
        entry["reason"] = NO_ITEMS
    return entry


def uncertainty_block(accuracies, paired, not_covered=None):
    """summary.json "uncertainty": accuracies = {"path/of/accuracy": (correct, n)} (the key names the accuracy in
    summary.json, "/" between its keys), paired = {name: (a, b, [(a right, b right), ...])}; not_covered names
    figures left without an interval, and why."""
    block = {"confidence": CONFIDENCE, "z": Z95, "accuracy_interval": ACCURACY_METHOD,
             "difference_interval": DIFFERENCE_METHOD, "test": TEST_METHOD,
             "accuracies": {key: accuracy_entry(k, n) for key, (k, n) in accuracies.items()},
             "paired": {key: paired_entry(a, b, pairs) for key, (a, b, pairs) in paired.items()}}
    if not_covered:
        block["not_covered"] = not_covered
    return block
