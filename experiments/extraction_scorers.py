"""The three answer scorers of the extraction experiment, written from their definitions (no lm_eval import).

All three read the same generated text y (the newly generated tokens only, the terminating eos removed) and the
dataset label g, a label name ("negative" / "positive"):

  exact    E = [strip(y) == canonical(g)], canonical(g) = json.dumps({"sentiment": g}) = '{"sentiment": "positive"}'
           (one space after the colon, nothing else); strip is Python's str.strip (Unicode whitespace).
  strict   the whole of y must parse as JSON (JSON's own surrounding whitespace allowed, nothing else): an object
           with exactly one key "sentiment", no duplicate key anywhere, the value exactly "positive" or "negative"
           (lowercase); then the value must equal g. Every failure gets one reason (STRICT_REASONS, first that
           applies): empty, code_fence, not_json, not_object, duplicate_key, missing_key, extra_keys, bad_value,
           wrong_label (the format is fine, the label is not).
  regex    the first case-insensitive whole-word match of positive|negative (lm-eval's RegexFilter with
           `(?i)\\b(positive|negative)\\b`, group_select 0, fallback "[invalid]", then TakeFirstFilter); the
           prediction is the match lowercased (lm-eval's ignore_case) and correct when it equals g. A match inside
           "not positive" counts as positive: the rule is wrong there on purpose, as it is in lm-eval.

`regex_matches` is an independent re-implementation of the regex path without the `re` module: a character scan
with Python's own definitions of a word character (str.isalnum() or "_", which is what `\\w` and `\\b` mean for a
str pattern) and of case-insensitive equality for these ten letters (ASCII case, plus the Unicode simple case
equivalents Python's re applies: U+0130 and U+0131 match "i", U+017F matches "s"). The experiment checks it
against lm-eval's filters on every item, and a test on a few hundred generated strings.
"""
import json

LABEL_KEY = "sentiment"
REGEX_WORDS = ("positive", "negative")
REGEX_FALLBACK = "[invalid]"
# Characters Python's re (IGNORECASE, str pattern) accepts for each letter of the two words; verified against `re`
# over every code point in tests/test_extraction.py.
_CASE_EQUIVALENTS = {c: {c, c.upper()} for c in set("".join(REGEX_WORDS))}
_CASE_EQUIVALENTS["i"] |= {"\u0130", "\u0131"}     # LATIN CAPITAL LETTER I WITH DOT ABOVE, LATIN SMALL DOTLESS I
_CASE_EQUIVALENTS["s"] |= {"\u017f"}               # LATIN SMALL LETTER LONG S

STRICT_REASONS = ("empty", "code_fence", "not_json", "not_object", "duplicate_key", "missing_key", "extra_keys",
                  "bad_value", "wrong_label")
FORMAT_FAILURES = STRICT_REASONS[:-1]             # every reason except wrong_label is a format failure


def canonical_answer(label_name):
    """The reference string of the exact scorer: '{"sentiment": "positive"}' (json.dumps default separators)."""
    return json.dumps({LABEL_KEY: label_name})


def exact_correct(text, label_name):
    return int(text.strip() == canonical_answer(label_name))


def _reject_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


def strict_reason(text, label_name, labels=("negative", "positive")):
    """None when the output is a strictly well-formed answer with the right label, else the first failure reason."""
    if text.strip() == "":
        return "empty"
    duplicates = []

    def pairs_hook(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            duplicates.append(keys)
        return dict(pairs)

    try:
        obj = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return "code_fence" if "```" in text else "not_json"
    if not isinstance(obj, dict):
        return "not_object"
    if duplicates:
        return "duplicate_key"
    if LABEL_KEY not in obj:
        return "missing_key"
    if len(obj) != 1:
        return "extra_keys"
    value = obj[LABEL_KEY]
    if not (isinstance(value, str) and value in labels):
        return "bad_value"
    if value != label_name:
        return "wrong_label"
    return None


def strict_scores(text, label_name, labels=("negative", "positive")):
    reason = strict_reason(text, label_name, labels)
    return {"reason": reason, "format_ok": int(reason in (None, "wrong_label")), "correct": int(reason is None)}


def _is_word_char(c):
    return c.isalnum() or c == "_"


def regex_matches(text):
    """Every non-overlapping whole-word, case-insensitive occurrence of positive|negative, left to right, as the
    substrings of `text` (original case). Written without `re`."""
    found = []
    i, n = 0, len(text)
    while i < n:
        hit = None
        if i == 0 or not _is_word_char(text[i - 1]):
            for word in REGEX_WORDS:
                end = i + len(word)
                if end <= n and all(text[i + k] in _CASE_EQUIVALENTS[ch] for k, ch in enumerate(word)) \
                        and (end == n or not _is_word_char(text[end])):
                    hit = text[i:end]
                    break
        if hit is None:
            i += 1
        else:
            found.append(hit)
            i += len(hit)
    return found


def regex_extract(text, fallback=REGEX_FALLBACK):
    """The independent counterpart of RegexFilter(group_select=0) + TakeFirstFilter on one generation."""
    found = regex_matches(text)
    return found[0].strip() if found else fallback


def regex_prediction(extracted, labels=("negative", "positive"), fallback=REGEX_FALLBACK):
    """The label name an extraction stands for (lowercased, lm-eval's ignore_case), or None (no match)."""
    if extracted == fallback:
        return None
    low = extracted.lower()
    return low if low in labels else None


def categories(text, finish_reason, strict_reason_):
    """The match-failure categories of one item (not exclusive)."""
    found = regex_matches(text)
    kinds = {m.lower() for m in found}
    return {"no_match": int(not found), "several_matches": int(len(found) > 1),
            "conflicting_matches": int(len(kinds) > 1),
            "format_failure": int(strict_reason_ in FORMAT_FAILURES),
            "length_stop": int(finish_reason == "length")}
