"""lm-eval 0.4.9.2's metric, aggregation and filter definitions, written again here on purpose (read from
lm_eval/api/metrics.py, api/task.py process_results and filters/*.py; never imported).

Aggregations: mean (sum / len, in sample order), f1 (scikit-learn's binary F1 of (gold, pred) pairs, positive
label 1, 0.0 when undefined), matthews_corrcoef (scikit-learn's MCC, 0.0 when undefined), and the closed-form
stderr of mean (sample standard deviation / sqrt(n)). Filters: regex, take_first, lowercase, uppercase,
remove_whitespace (strip). Anything else is not here, and the audit reports it SKIPPED by name.
"""
import math
import re
import string

from evidence_audit.definitions import argmax_first

# metric -> its registered default aggregation (lm_eval/api/metrics.py register_metric), for a metric_list entry
# without "aggregation"
DEFAULT_AGGREGATION = {"acc": "mean", "acc_norm": "mean", "acc_bytes": "mean", "acc_mutual_info": "mean",
                       "exact_match": "mean", "f1": "f1", "mcc": "matthews_corrcoef", "perplexity": "perplexity",
                       "brier_score": "brier_score", "bleu": "bleu", "chrf": "chrf", "ter": "ter"}
BOOTSTRAPPED = ("median", "matthews_corrcoef", "f1", "perplexity", "bleu", "chrf", "ter", "nanmean")


def mean(xs):
    return sum(xs) / len(xs)


def mean_stderr(xs):
    """lm-eval's mean_stderr: sample standard deviation (n - 1) over sqrt(n)."""
    mu = mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) / math.sqrt(len(xs))


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


def perplexity(xs):
    """lm-eval's perplexity aggregation: exp(-mean of the log-likelihoods)."""
    return math.exp(-mean(xs))


AGGREGATIONS = {"mean": mean, "f1": f1_binary, "matthews_corrcoef": mcc, "perplexity": perplexity}
SCALAR_AGGREGATIONS = ("mean", "perplexity")     # over numbers; the others over (gold, pred) pairs


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
