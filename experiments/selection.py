"""Item selection by a fixed hash rule, decided before any output is seen (DESIGN.md, "Item selection").

Rows are ranked by sha256(f"{salt}:{idx}") ascending. The first n_dev are the development items, the next
n_confirm the confirmation items; --smoke takes the first n_smoke development items. The rule needs only the
salt and the row count, so anyone can recompute it (audit.py does, with its own code).
"""
import hashlib


def rank_key(salt, idx):
    return hashlib.sha256(f"{salt}:{idx}".encode("utf-8")).hexdigest()


def ranked_indices(salt, n_rows):
    return sorted(range(n_rows), key=lambda i: rank_key(salt, i))


def select(split, salt, n_rows, n_dev, n_confirm, n_smoke):
    """Return the idx list of a split, in rank order. Refuses a split the data is too small to fill."""
    ranked = ranked_indices(salt, n_rows)
    bounds = {"smoke": (0, n_smoke), "dev": (0, n_dev), "confirm": (n_dev, n_dev + n_confirm)}
    if split not in bounds:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(bounds)}")
    lo, hi = bounds[split]
    if hi > n_rows:
        raise ValueError(f"split {split!r} needs {hi} ranked rows but the data has {n_rows}")
    return ranked[lo:hi]


def selection_block(config, split, idx_list):
    """The selection block every experiment writes into config.json (audit.py recomputes the rule from it)."""
    return {"salt": config["selection_salt"], "rule": config["selection_rule"], "n_dev": config["n_dev"],
            "n_confirm": config["n_confirm"], "n_smoke": config["n_smoke"], "split": split, "item_idx": idx_list}
