"""The five metrics, written from scratch. Each is `(prediction, targets, extras) -> float in [0, 1]`; where an
example lists several targets, the example scores the best of them (code_exec ignores targets: the io pairs in
extras are its reference).

- exact_match:        lowercase, collapse runs of whitespace (and strip), compare equal. "42." != "42".
- substring_contains: same normalisation; a target occurring anywhere in the prediction. Echoing the prompt
                      scores if the prompt contains the target, so write prompts that do not.
- multiple_choice:    first non-space character of the prediction, uppercased, equals the target (a letter).
                      "The answer is B" scores as "T".
- rouge_l:            rouge-score's ROUGE-L F-measure without stemming (`RougeScorer(["rougeL"])`): lowercase,
                      every character outside [a-z0-9] becomes a space, split on whitespace; F1 of LCS precision
                      (LCS / prediction tokens) and recall (LCS / reference tokens); 0 when either side has no
                      token. "Mat." and "mat" are the same token; text without ASCII letters or digits has no
                      token at all ("café" is "caf"). Tested against the rouge_score package.
- code_exec:          the code (the first ``` fenced block if there is one, else the whole prediction) runs in the
                      sandbox; score = fraction of io pairs [x, y] with f(x) == y.
"""
import hashlib
import re


def normalise(text):
    return " ".join(text.lower().split())


def exact_match(prediction, targets, extras=None):
    return max(float(normalise(prediction) == normalise(t)) for t in targets)


def substring_contains(prediction, targets, extras=None):
    return max(float(normalise(t) in normalise(prediction)) for t in targets)


def multiple_choice(prediction, targets, extras=None):
    p = prediction.strip()
    return max(float(bool(p) and p[0].upper() == t.strip().upper()) for t in targets)


def lcs_length(a, b):
    """Length of the longest common subsequence of two token lists (dynamic programming, one row at a time)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


NON_ALPHANUMERIC = re.compile(r"[^a-z0-9]+")


def rouge_tokens(text):
    """rouge-score's default tokenizer with no stemmer (rouge_score/tokenize.py)."""
    return NON_ALPHANUMERIC.sub(" ", text.lower()).split()


def rouge_l_f1(prediction, reference):
    p, r = rouge_tokens(prediction), rouge_tokens(reference)
    lcs = lcs_length(p, r) if p and r else 0
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def rouge_l(prediction, targets, extras=None):
    return max(rouge_l_f1(prediction, t) for t in targets)


FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(prediction):
    """The first fenced block (an unclosed fence runs to the end: generation may stop mid-block), else all."""
    m = FENCE.search(prediction)
    return m.group(1) if m else prediction


def code_exec_detailed(prediction, extras, sandbox_limits=None):
    from harness.sandbox import score_io_pairs

    code = extract_code(prediction)
    score, details = score_io_pairs(code, extras["io_pairs"], sandbox_limits)
    return score, {"code_sha256": hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest(), "sandbox": details}


def code_exec(prediction, targets, extras, sandbox_limits=None):
    return code_exec_detailed(prediction, extras, sandbox_limits)[0]


METRICS = {"exact_match": exact_match, "substring_contains": substring_contains,
           "multiple_choice": multiple_choice, "rouge_l": rouge_l, "code_exec": code_exec}


def score(metric, prediction, targets, extras, sandbox_limits=None):
    """(score, details) for one example; details carry the sandbox evidence for code_exec, else {}."""
    if metric == "code_exec":
        return code_exec_detailed(prediction, extras, sandbox_limits)
    return METRICS[metric](prediction, targets, extras), {}
