"""The pre-registered human-audit sample of the extraction experiment, chosen before any output exists.

Rule (AUDIT_RULE): within each class of the scored items, rank the items by sha256(f"{salt}:{idx}") ascending and
take the first `per_class`; interleave the classes (lowest label first: neg, pos, neg, pos, ...; a class that runs
out leaves the rest to the other). The function sees only idx, labels, the salt and the count: no text, no model,
no generation, no score. The experiment calls it, writes the result to O/extraction.preregistration.json and only
then loads the model.

Weights back to the scored items: an audited item of class c stands for N_c / n_c items (N_c the class count among
the scored items, n_c the audited items of that class), e.g. 31/8 and 33/8 for 31 negative and 33 positive
development items.
"""
import hashlib
from fractions import Fraction

AUDIT_RULE = ("within each class of the scored items rank by sha256(f'{salt}:{idx}') ascending, take the first "
              "per_class, interleave the classes starting with the lowest label; chosen from idx and labels only, "
              "before the model is loaded")


def audit_rank_key(salt, idx):
    return hashlib.sha256(f"{salt}:{idx}".encode("utf-8")).hexdigest()


def choose_audit_sample(idx_labels, salt, per_class):
    """[(idx, label), ...] -> the audit sample as [{"position", "idx", "label", "rank_key"}], in review order."""
    pairs = [(int(i), int(l)) for i, l in idx_labels]
    if len({i for i, _ in pairs}) != len(pairs):
        raise ValueError("duplicate idx in the scored items")
    by_class = {}
    for idx, label in pairs:
        by_class.setdefault(label, []).append(idx)
    chosen = {c: sorted(ids, key=lambda i: audit_rank_key(salt, i))[:per_class] for c, ids in by_class.items()}
    order = []
    for k in range(per_class):
        for c in sorted(chosen):
            if k < len(chosen[c]):
                order.append((chosen[c][k], c))
    return [{"position": p + 1, "idx": i, "label": c, "rank_key": audit_rank_key(salt, i)}
            for p, (i, c) in enumerate(order)]


def class_weights(idx_labels, sample):
    """{label: {"population": N_c, "sampled": n_c, "weight": "N_c/n_c", "weight_float": N_c / n_c}}."""
    pop, got = {}, {}
    for _, label in idx_labels:
        pop[int(label)] = pop.get(int(label), 0) + 1
    for s in sample:
        got[s["label"]] = got.get(s["label"], 0) + 1
    return {str(c): {"population": pop[c], "sampled": got.get(c, 0),
                     "weight": f"{pop[c]}/{got[c]}" if got.get(c) else None,
                     "weight_float": float(Fraction(pop[c], got[c])) if got.get(c) else None}
            for c in sorted(pop)}
