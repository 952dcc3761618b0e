"""Definitions written again here on purpose (the runner has its own copy; the audit must not import it).

Each is the rule the evidence claims to follow: the tie rule, the item-selection hash rule, lm-eval's doc hash,
the exact McNemar test, and the type predicates used by the record-field tables.
"""
import hashlib
import json
import math

from evidence_audit.reading import sha256_text

SPLITS = ("smoke", "dev", "confirm", "all")


def confirmation_scored(split):
    """The held-back confirmation items are scored by split confirm, and by split all (every row)."""
    return split in ("confirm", "all")


def argmax_first(scores):
    """Index of the largest score; the first one wins a tie (the runner's tie rule)."""
    best = 0
    for j, s in enumerate(scores):
        if s > scores[best]:
            best = j
    return best


def select_items(split, salt, n_rows, n_dev, n_confirm, n_smoke):
    """Rank rows by sha256(f"{salt}:{idx}") ascending; first n_dev = dev, next n_confirm = confirm, smoke = the
    first n_smoke of dev; all = every row 0..n_rows-1 in idx order, unranked. Returns (idx list in that order,
    None) or (None, reason)."""
    if split == "all":
        return [i for i in range(n_rows)], None
    bounds = {"smoke": (0, n_smoke), "dev": (0, n_dev), "confirm": (n_dev, n_dev + n_confirm)}
    if split not in bounds:
        return None, f"unknown split {split!r}"
    lo, hi = bounds[split]
    if hi > n_rows:
        return None, f"split {split!r} needs {hi} ranked rows but n_rows is {n_rows}"
    ranked = sorted(range(n_rows), key=lambda i: hashlib.sha256(f"{salt}:{i}".encode("utf-8")).hexdigest())
    return ranked[lo:hi], None


def lm_eval_doc_hash(sentence, label, idx):
    """lm-eval 0.4.9.2 logs sha256(json.dumps(doc, indent=2, ensure_ascii=False)); an SST-2 doc is the parquet row
    with columns in the order sentence, label, idx."""
    doc = {"sentence": sentence, "label": label, "idx": idx}
    return sha256_text(json.dumps(doc, indent=2, ensure_ascii=False))


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_sha(v):
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def argmax_divided(scores, dens):
    """argmax_first of score / denominator (acc_norm: characters; acc_norm_tokens: candidate tokens)."""
    return argmax_first([float(s) / float(d) for s, d in zip(scores, dens)])


def mcnemar_exact(gains, losses):
    """Exact two-sided McNemar p = min(1, 2 P(X <= min(g, l))), X ~ Bin(g + l, 1/2), in integer arithmetic; 1.0
    without discordant pairs."""
    n = gains + losses
    if n == 0:
        return 1.0
    k = min(gains, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)




def is_value_of(x, dtype):
    """Is the float x a value of `dtype`? A score summed in a tensor of that dtype is one (float32, bfloat16: a
    float32 whose low 16 bits are zero, float16); an edited score is usually not. Pure Python (no torch)."""
    import struct

    if not (isinstance(x, float) and math.isfinite(x)):
        return False
    try:
        if dtype == "float16":
            return struct.unpack("<e", struct.pack("<e", x))[0] == x
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
    except (OverflowError, struct.error):
        return False
    as_float32 = struct.unpack("<f", struct.pack("<I", bits))[0] == x
    return as_float32 if dtype == "float32" else as_float32 and bits & 0xFFFF == 0 if dtype == "bfloat16" else False
