"""lm-eval 0.4.9.2's metric, aggregation and filter definitions, written again here on purpose (read from
lm_eval/api/metrics.py, api/task.py process_results and filters/*.py; never imported).

Aggregations: mean (sum / len, in sample order), f1 (scikit-learn's binary F1 of (gold, pred) pairs, positive
label 1, 0.0 when undefined), matthews_corrcoef (scikit-learn's MCC, 0.0 when undefined), perplexity
(exp(-mean)), weighted_perplexity (exp(-sum(ll) / sum(count)), word_perplexity and byte_perplexity) and
bits_per_byte (-sum(ll) / sum(bytes) / ln 2) over the (ll, count) pairs a loglikelihood_rolling sample logs, and
the closed-form stderr of mean (sample standard deviation / sqrt(n)). Filters: regex, take_first, lowercase,
uppercase, remove_whitespace (strip). Anything else is not here, and the audit reports it SKIPPED by name.

Exactness: lm-eval sums with Python's builtin sum(), which adds left to right up to Python 3.11 and, from 3.12,
compensates (Neumaier) while the items are exact floats; `builtin_sum` does either, and the audit picks the one of
the run's Python (its results file's pretty_env_info). The other operations are IEEE double operations done in the
same order (division, math.sqrt, math.exp, ** 2 through the C library's pow), so a recomputation on the machine
that ran lm-eval is bit for bit; another C library could round exp/pow differently in the last bit.
"""
import math
import re
import string

from evidence_audit.definitions import argmax_first

# metric -> its registered default aggregation (lm_eval/api/metrics.py register_metric), for a metric_list entry
# without "aggregation"
DEFAULT_AGGREGATION = {"acc": "mean", "acc_norm": "mean", "acc_bytes": "mean", "acc_mutual_info": "mean",
                       "exact_match": "mean", "f1": "f1", "mcc": "matthews_corrcoef", "perplexity": "perplexity",
                       "brier_score": "brier_score", "bleu": "bleu", "chrf": "chrf", "ter": "ter",
                       "word_perplexity": "weighted_perplexity", "byte_perplexity": "weighted_perplexity",
                       "bits_per_byte": "bits_per_byte"}
BOOTSTRAPPED = ("median", "matthews_corrcoef", "f1", "perplexity", "bleu", "chrf", "ter", "nanmean")


def builtin_sum(xs, compensated=False):
    """sum(xs) (start 0) as CPython computes it over ints and floats: left to right (<= 3.11), or (3.12 on) an int
    fast path, then a float path that adds exact floats with Neumaier's compensation and ints as doubles, the
    compensation added when the sum ends or meets another type (then plain additions). Items of other types (e.g.
    numpy scalars) leave the fast paths, as in CPython."""
    if not compensated:
        total = 0
        for x in xs:
            total = total + x
        return total
    it, total = iter(xs), 0
    for x in it:                                    # int fast path
        if type(x) is int or type(x) is bool:
            total += x
            continue
        total = total + x
        break
    else:
        return total
    if type(total) is not float:
        for x in it:
            total = total + x
        return total
    f, c = total, 0.0
    for x in it:                                    # float fast path
        if type(x) is float:
            t = f + x
            c += (f - t) + x if abs(f) >= abs(x) else (x - t) + f
            f = t
        elif isinstance(x, int) and -2 ** 63 <= x < 2 ** 63:       # PyLong_Check: bool too
            f += float(x)
        else:
            if c and math.isfinite(c):
                f += c
            total = f + x
            for y in it:
                total = total + y
            return total
    if c and math.isfinite(c):
        f += c
    return f


def mean(xs, compensated=False):
    return builtin_sum(xs, compensated) / len(xs)


def sample_stddev(xs, compensated=False):
    """metrics.py sample_stddev: sqrt(sum((x - mean) ** 2) / (n - 1)), the sums as builtin sum() does them."""
    mu = mean(xs, compensated)
    return math.sqrt(builtin_sum([(x - mu) ** 2 for x in xs], compensated) / (len(xs) - 1))


def mean_stderr(xs, compensated=False):
    """lm-eval's mean_stderr: sample standard deviation (n - 1) over sqrt(n)."""
    return sample_stddev(xs, compensated) / math.sqrt(len(xs))


def f1_binary(pairs):
    """scikit-learn f1_score(golds, preds) (average="binary", pos_label=1): 2 tp / (2 tp + fp + fn), 0.0 when
    there is no positive gold or prediction. None when a label is not 0/1 (scikit-learn would raise)."""
    if any(g not in (0, 1) or p not in (0, 1) for g, p in pairs):
        return None
    tp = sum(1 for g, p in pairs if g == 1 and p == 1)
    fp = sum(1 for g, p in pairs if g == 0 and p == 1)
    fn = sum(1 for g, p in pairs if g == 1 and p == 0)
    return 0.0 if 2 * tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def mcc(pairs):
    """scikit-learn matthews_corrcoef(golds, preds), any number of classes; 0.0 when a marginal is constant."""
    labels = sorted({g for g, _ in pairs} | {p for _, p in pairs})
    n = len(pairs)
    t_sum = [sum(1 for g, _ in pairs if g == k) for k in labels]
    p_sum = [sum(1 for _, p in pairs if p == k) for k in labels]
    correct = sum(1 for g, p in pairs if g == p)
    cov_tp = correct * n - sum(t * p for t, p in zip(t_sum, p_sum))
    cov_pp = n * n - sum(p * p for p in p_sum)
    cov_tt = n * n - sum(t * t for t in t_sum)
    if cov_pp * cov_tt == 0:
        return 0.0
    return cov_tp / math.sqrt(cov_tt * cov_pp)


def perplexity(xs, compensated=False):
    """lm-eval's perplexity aggregation: exp(-mean of the log-likelihoods)."""
    return math.exp(-mean(xs, compensated))


def weighted_mean(pairs, compensated=False):
    """metrics.py weighted_mean: sum of the first members / sum of the second members."""
    return builtin_sum([a for a, _ in pairs], compensated) / builtin_sum([b for _, b in pairs], compensated)


def weighted_perplexity(pairs, compensated=False):
    """word_perplexity and byte_perplexity: exp(-weighted_mean((ll, words or bytes)))."""
    return math.exp(-weighted_mean(pairs, compensated))


def bits_per_byte(pairs, compensated=False):
    """bits_per_byte: -weighted_mean((ll, bytes)) / ln 2."""
    return -weighted_mean(pairs, compensated) / math.log(2)


def count_words(text):
    """api/task.py count_words: the pieces of re.split(r"\\s+", text) (an edge space gives an empty piece)."""
    return len(re.split(r"\s+", text))


def count_bytes(text):
    """api/task.py count_bytes: UTF-8 bytes."""
    return len(text.encode("utf-8"))


# aggregation name -> its function (f1 and matthews_corrcoef sum integers only: no summation flag)
AGGREGATIONS = {"mean": mean, "f1": f1_binary, "matthews_corrcoef": mcc, "perplexity": perplexity,
                "weighted_perplexity": weighted_perplexity, "bits_per_byte": bits_per_byte}
SCALAR_AGGREGATIONS = ("mean", "perplexity")     # over numbers; the others over pairs
SUMMED = ("mean", "perplexity", "weighted_perplexity", "bits_per_byte")     # results depend on builtin sum()
# stderr_for_metric (api/metrics.py:545-577): bootstrapped (with bootstrap_iters > 0), closed form (mean,
# acc_all), or none ("N/A"); bleu/chrf/ter bootstrap at most 100 iterations (evaluator_utils.py:117-121).
CLOSED_FORM_STDERR = ("mean", "acc_all")


def multiple_choice(lls, greedy, choices, gold):
    """process_results of a multiple_choice document with one gold index: acc (argmax, first index wins), acc_norm
    (argmax of ll / character length of the choice), acc_bytes (UTF-8 bytes), exact_match (is_greedy of gold),
    f1 and mcc as the (gold, pred) pair."""
    pred = argmax_first(lls)
    pred_norm = argmax_first([ll / float(len(c)) for ll, c in zip(lls, choices)])
    pred_bytes = argmax_first([ll / float(len(c.encode("utf-8"))) for ll, c in zip(lls, choices)])
    return {"acc": 1.0 if pred == gold else 0.0, "acc_norm": 1.0 if pred_norm == gold else 0.0,
            "acc_bytes": 1.0 if pred_bytes == gold else 0.0, "exact_match": int(greedy[gold]),
            "f1": [gold, pred], "mcc": [gold, pred]}


def regex_filter(texts, regex_pattern=r"#### (\-?[0-9\.\,]+)", group_select=0, fallback="[invalid]"):
    """filters/extraction.py RegexFilter on one document's responses."""
    rx, out = re.compile(regex_pattern), []
    for resp in texts:
        match = rx.findall(resp if isinstance(resp, str) else "")
        if match:
            match = match[group_select]
            if isinstance(match, tuple):
                match = [m for m in match if m]
                match = match[0] if match else fallback
            out.append(match.strip())
        else:
            out.append(fallback)
    return out


FILTERS = {"regex": regex_filter, "take_first": lambda texts: texts[0],
           "lowercase": lambda texts: [t.lower() for t in texts], "uppercase": lambda texts: [t.upper() for t in texts],
           "remove_whitespace": lambda texts: [t.strip() for t in texts]}
FILTER_ARGS = {"regex": {"regex_pattern", "group_select", "fallback"}}


def unsupported_filters(steps):
    """The names of the steps of a filter_list entry this module does not implement (or with unknown arguments)."""
    bad = []
    for step in steps:
        name = step.get("function") if isinstance(step, dict) else None
        args = set(step) - {"function"} if isinstance(step, dict) else set()
        if name not in FILTERS or not args <= FILTER_ARGS.get(name, set()):
            bad.append(str(name) + (f"({', '.join(sorted(args))})" if args else ""))
    return bad


def apply_filters(steps, texts):
    """A filter_list entry's steps applied to one document's responses (the repeats of one request)."""
    value = texts
    for step in steps:
        value = FILTERS[step["function"]](value, **{k: v for k, v in step.items() if k != "function"})
    return value


EXACT_MATCH_ARGS = {"regexes_to_ignore", "ignore_case", "ignore_punctuation", "ignore_numbers"}


def exact_match(prediction, reference, regexes_to_ignore=None, ignore_case=False, ignore_punctuation=False,
                ignore_numbers=False):
    """metrics.py exact_match_hf_evaluate on one (prediction, reference): 1.0 or 0.0."""
    for rx in regexes_to_ignore or []:
        prediction, reference = re.sub(rx, "", prediction), re.sub(rx, "", reference)
    if ignore_case:
        prediction, reference = prediction.lower(), reference.lower()
    if ignore_punctuation:
        table = str.maketrans("", "", string.punctuation)
        prediction, reference = prediction.translate(table), reference.translate(table)
    if ignore_numbers:
        table = str.maketrans("", "", string.digits)
        prediction, reference = prediction.translate(table), reference.translate(table)
    return 1.0 if prediction == reference else 0.0
