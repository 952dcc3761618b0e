"""lm-eval 0.4.9.2's bootstrap stderr, reproduced bit for bit (read from lm_eval/api/metrics.py:464-577; never
imported).

lm-eval draws `iters // chunk` chunks of `chunk = min(1000, iters)` replicates (a remainder is dropped); chunk i
uses random.Random(i) and each replicate is f(rnd.choices(items, k=len(items))), chunks in order whether a process
pool runs them (imap keeps the order) or not (DISABLE_MULTIPROC); the stderr is sample_stddev of the replicates.
random.choices picks items[floor(random() * n)], and random() is MT19937's 53-bit double, which numpy's legacy
RandomState draws from the same state with the same formula: the audit copies each chunk's seeded state into a
RandomState and draws a whole chunk at once (without numpy it calls random.choices itself, replicate by replicate:
measured 11 times slower for f1 on 872 pairs), then computes f over every replicate with the same integer counts
and the same double operations as scikit-learn 1.9 (f1: 2 tp / (2 tp + fp + fn); matthews_corrcoef:
cov(t, p) / sqrt(cov(p, p) cov(t, t)), every covariance an exact integer below 2**53) or lm-eval (perplexity:
exp(-sum / n), the sum as builtin sum() does it, per replicate). The replicates keep lm-eval's types (f1:
numpy.float64 from np.max; mcc and perplexity: float), which decide how builtin sum() adds them on Python >= 3.12.

Not reproduced (NotReproduced, reported as a SKIPPED row): median and nanmean (the per-sample values' runtime types
are not in the samples file), bleu, chrf and ter (sacrebleu), any other aggregation, and work past the audit's
budget: more than MAX_ITERS replicates (each is kept until the stddev: memory), more than MAX_DRAWS draws for one
stderr (time), more than MAX_TASK_DRAWS for all of a task's (Budget). bootstrap_iters is the run's own figure, so
these bounds are what keeps an untrusted results file from holding the audit for hours. The results file does not
name the scikit-learn release: one that computed F1 through precision and recall could round a replicate
differently in the last bit, and that run would FAIL this row rather than pass.
"""
import math
import random
import re

from evidence_audit.lmeval.metrics import f1_binary, mcc, perplexity, sample_stddev

BLOCK = 2_000_000           # doubles drawn at once (rows of a chunk x items), to bound memory on large tasks
# The budget, from measurements (docs/lm-eval-audit.md, "Bounds"; a shared 2-vCPU EPYC, numpy): 15-20 M draws a
# second for f1, mcc and perplexity on 1000 samples; about 1.5 us and 70 bytes kept per replicate. Past a bound the
# stderr is SKIPPED naming it (INCOMPLETE, never PASS).
MAX_ITERS = 10 ** 6         # replicates: 10x lm-eval's default of 100000, which its CLI cannot change; ~70 MB kept,
                            # where 9e7 replicates (just under the draws' bound on 11 samples) ran > 600 s, 7.1 GB
MAX_DRAWS = 10 ** 9         # replicates x samples for one stderr: ~1 min here; lm-eval's default on lambada_openai's
                            # perplexity (5153 samples) draws 5.2e8
MAX_TASK_DRAWS = 2 * 10 ** 9    # for all the stderrs of one task, each summation tried counted: ~2 min here
REPRODUCED = ("f1", "matthews_corrcoef", "perplexity")


class NotReproduced(Exception):
    """This aggregation's bootstrap is not reproduced here (the message says why)."""


class Budget:
    """The draws one task's bootstrap stderrs may still take (MAX_TASK_DRAWS)."""

    def __init__(self, draws=MAX_TASK_DRAWS):
        self.left = draws

    def spend(self, agg, draws):
        if draws > self.left:
            raise NotReproduced(f"{agg}: {draws} draws over the {self.left} left of the {MAX_TASK_DRAWS:.0e} the audit "
                                "recomputes for one task (bootstrap.MAX_TASK_DRAWS)")
        self.left -= draws


def chunks(iters):
    """[(seed, replicates)] as lm-eval's bootstrap_stderr splits `iters`."""
    size = min(1000, iters)
    return [(i, size) for i in range(iters // size)]


def choice_indices(np, seed, rows, n):
    """The indices random.Random(seed).choices(range(n), k=n) picks, `rows` times in a row, as arrays of `n`."""
    state = random.Random(seed).getstate()[1]
    rs = np.random.RandomState()
    rs.set_state(("MT19937", np.array(state[:-1], dtype=np.uint32), state[-1]))
    step = max(1, BLOCK // max(n, 1))
    for start in range(0, rows, step):
        u = rs.random_sample((min(step, rows - start), n))
        yield np.floor(u * float(n)).astype(np.int64)


def f1_replicates(np, golds, preds, idx):
    g, p = golds[idx], preds[idx]
    tp = ((g == 1) & (p == 1)).sum(axis=1)
    true_sum, pred_sum = (g == 1).sum(axis=1), (p == 1).sum(axis=1)
    denom = true_sum.astype(np.float64) + pred_sum.astype(np.float64)
    out = np.zeros(len(idx))
    ok = denom != 0                                  # zero_division: 0.0
    out[ok] = (2.0 * tp[ok].astype(np.float64)) / denom[ok]
    return list(out)                                 # numpy.float64 items, as np.max(f1_score(...)) returns


def mcc_replicates(np, golds, preds, idx, labels):
    g, p = golds[idx], preds[idx]
    n = np.float64(idx.shape[1])
    t_sum = np.stack([(g == k).sum(axis=1) for k in labels], axis=1).astype(np.float64)
    p_sum = np.stack([(p == k).sum(axis=1) for k in labels], axis=1).astype(np.float64)
    correct = (g == p).sum(axis=1).astype(np.float64)
    cov_tp = correct * n - (t_sum * p_sum).sum(axis=1)
    cov_pp = n ** 2 - (p_sum * p_sum).sum(axis=1)
    cov_tt = n ** 2 - (t_sum * t_sum).sum(axis=1)
    prod = cov_pp * cov_tt
    out = np.zeros(len(idx))
    ok = prod != 0
    out[ok] = cov_tp[ok] / np.sqrt(prod[ok])
    return out.tolist()                              # float items, as matthews_corrcoef returns


def perplexity_replicates(np, values, idx, compensated):
    v = values[idx]
    if compensated:                                  # builtin sum() of exact floats on Python >= 3.12
        f, c = v[:, 0].copy(), np.zeros(len(idx))
        for j in range(1, v.shape[1]):
            x = v[:, j]
            t = f + x
            c += np.where(np.abs(f) >= np.abs(x), (f - t) + x, (x - t) + f)
            f = t
        f = np.where((c != 0) & np.isfinite(c), f + c, f)
    else:
        f = v[:, 0].copy()
        for j in range(1, v.shape[1]):
            f = f + v[:, j]
    n = v.shape[1]
    return [math.exp(-(s / n)) for s in f.tolist()]


def bootstrap_stderr(agg, items, iters, compensated=False, budget=None):
    """lm-eval's bootstrap stderr of aggregation `agg` over the per-sample `items` (pairs for f1 and
    matthews_corrcoef, floats for perplexity), `iters` as lm-eval was given it; the draws are taken from `budget`
    (a task's Budget) when given. Raises NotReproduced."""
    if agg not in REPRODUCED:
        raise NotReproduced(f"{agg}: " + ("sacrebleu's corpus score, not written again here"
                                          if agg in ("bleu", "chrf", "ter") else
                                          "the replicates' runtime types are not in the samples file"
                                          if agg in ("median", "nanmean") else "no bootstrap written here"))
    if iters > MAX_ITERS:
        raise NotReproduced(f"{agg}: bootstrap_iters {iters} over the {MAX_ITERS:.0e} replicates the audit recomputes "
                            "(bootstrap.MAX_ITERS; lm-eval's default is 100000)")
    if iters * len(items) > MAX_DRAWS:
        raise NotReproduced(f"{agg}: {iters} iterations x {len(items)} samples exceed the {MAX_DRAWS:.0e} draws the "
                            "audit recomputes (bootstrap.MAX_DRAWS)")
    if agg == "perplexity" and not all(type(x) is float for x in items):
        raise NotReproduced("perplexity: a per-sample value is not a float")
    if agg == "f1" and f1_binary(items) is None:
        raise NotReproduced("f1: labels other than 0/1 (scikit-learn's binary F1 raises)")
    if budget is not None:
        budget.spend(agg, iters // min(1000, iters) * min(1000, iters) * len(items))
    np = numpy_or_none()
    res = replicates(np, agg, items, iters, compensated) if np is not None else \
        plain_replicates(agg, items, iters, compensated)
    # f1's replicates are numpy.float64 (np.max): builtin sum() adds them left to right on every Python
    return sample_stddev(res, compensated and agg != "f1")


def numpy_or_none():
    """numpy when importable: the arithmetic level runs without it (tests/test_lmeval_audit.py), then slower."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def replicates(np, agg, items, iters, compensated):
    """Every replicate, vectorised per chunk (numpy)."""
    n, res = len(items), []
    if agg == "perplexity":
        values = np.array(items, dtype=np.float64)
    else:
        golds = np.array([g for g, _ in items], dtype=np.int64)
        preds = np.array([p for _, p in items], dtype=np.int64)
        labels = sorted(set(golds.tolist()) | set(preds.tolist()))
    for seed, rows in chunks(iters):
        for idx in choice_indices(np, seed, rows, n):
            if agg == "f1":
                res += f1_replicates(np, golds, preds, idx)
            elif agg == "matthews_corrcoef":
                res += mcc_replicates(np, golds, preds, idx, labels)
            else:
                res += perplexity_replicates(np, values, idx, compensated)
    return res


def plain_replicates(agg, items, iters, compensated):
    """Every replicate as lm-eval draws it (random.choices), the statistic from metrics.py (no numpy)."""
    f = {"f1": f1_binary, "matthews_corrcoef": mcc, "perplexity": lambda xs: perplexity(xs, compensated)}[agg]
    return [f(sample) for sample in reference_choices(items, iters)]


def reference_choices(items, iters):
    """The replicate resamples exactly as lm-eval draws them (random.Random(i).choices), for tests: slow, plain."""
    out = []
    for seed, rows in chunks(iters):
        rnd = random.Random(seed)
        out += [rnd.choices(items, k=len(items)) for _ in range(rows)]
    return out


def python_summation(results):
    """[compensated?] to try for a run: the run's Python (pretty_env_info "Python version: X.Y") decides how its
    builtin sum() added floats; both when the results file does not say."""
    env = results.get("pretty_env_info") if isinstance(results, dict) else None
    found = re.search(r"^Python version: (\d+)\.(\d+)", env[:100_000], re.M) if isinstance(env, str) else None
    if found:
        return [(int(found.group(1)), int(found.group(2))) >= (3, 12)]
    return [False, True]


