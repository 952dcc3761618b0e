"""Item selection by a fixed hash rule, decided before any output is seen, the one loader of SST-2 rows, and
--limit N (the first N items of a selection) for the experiments on the SST-2 items.

Rows are ranked by sha256(f"{salt}:{idx}") ascending. The first n_dev are the development items, the next
n_confirm the confirmation items; --smoke takes the first n_smoke development items. --split all takes every row of
the data's validation split in idx order (0..n_rows-1, no ranking), the confirmation items among them. The rule
needs only the salt and the row count, so anyone can recompute it (audit.py does, with its own code).
"""
import hashlib

from resources import ResourceError


def rank_key(salt, idx):
    return hashlib.sha256(f"{salt}:{idx}".encode("utf-8")).hexdigest()


def ranked_indices(salt, n_rows):
    return sorted(range(n_rows), key=lambda i: rank_key(salt, i))


SPLITS = ("smoke", "dev", "confirm", "all")
ALL_RULE = "every row of the data's validation split in idx order (0..n_rows-1), the confirmation items included"


def confirmation_items_scored(split):
    """Whether a split scores the held-back confirmation items: confirm, and all (every row)."""
    return split in ("confirm", "all")


def select(split, salt, n_rows, n_dev, n_confirm, n_smoke):
    """Return the idx list of a split: rank order for smoke/dev/confirm (refused when the data is too small to
    fill it), idx order for all."""
    if split == "all":
        return list(range(n_rows))
    ranked = ranked_indices(salt, n_rows)
    bounds = {"smoke": (0, n_smoke), "dev": (0, n_dev), "confirm": (n_dev, n_dev + n_confirm)}
    if split not in bounds:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    lo, hi = bounds[split]
    if hi > n_rows:
        raise ValueError(f"split {split!r} needs {hi} ranked rows but the data has {n_rows}")
    return ranked[lo:hi]


def load_rows(parquet_path):
    """The SST-2 rows (idx, label, sentence) of a verified parquet; row i must be idx i (lm-eval's doc_id is the
    row position, and the identity join relies on the two being the same). Read as stored, never re-sorted."""
    import pyarrow.parquet as pq

    cols = pq.read_table(parquet_path, columns=["sentence", "label", "idx"]).to_pydict()
    rows = [{"idx": int(i), "label": int(l), "sentence": s} for s, l, i in zip(cols["sentence"], cols["label"],
                                                                               cols["idx"])]
    if [r["idx"] for r in rows] != list(range(len(rows))):
        raise ResourceError(f"{parquet_path}: rows are not idx 0..{len(rows) - 1} in order")
    return rows


def select_items(config, split, n_rows):
    """The idx list of `split` under the configured rule; data too small for the split is bad input."""
    try:
        return select(split, config["selection_salt"], n_rows, config["n_dev"], config["n_confirm"],
                      config["n_smoke"])
    except ValueError as e:
        raise ResourceError(f"item selection: {e}") from None


def selection_block(config, split, idx_list):
    """The selection block every experiment writes into config.json (audit.py recomputes the rule from it)."""
    block = {"salt": config["selection_salt"], "rule": config["selection_rule"], "n_dev": config["n_dev"],
             "n_confirm": config["n_confirm"], "n_smoke": config["n_smoke"], "split": split, "item_idx": idx_list}
    if split == "all":
        block["split_rule"] = ALL_RULE
    return block


def config_head(ctx, name, n_rows, idx_list):
    """The part of config.json every experiment on the SST-2 items writes: what was run, on which data and
    model, which items, with which effective config."""
    return {"experiment": name, "split": ctx.split, "confirmation_items_scored": confirmation_items_scored(ctx.split),
            "data": ctx.data.id, "data_content_sha256": ctx.data.content_sha256, "n_rows": n_rows,
            "selection": selection_block(ctx.config, ctx.split, idx_list), "config": ctx.config,
            "model": ctx.inputs.model_identity}


# ---- --limit N: the first N items of the selection ------------------------------------------------------------

def limited_selection(ctx, idx_list):
    """(the idx list to score, the limit block or None). --limit N keeps the first N items of the selection in the
    selection's own order (the hash rule's rank order; idx order for --split all), decided before anything is
    scored; protocol, options and extraction use it. N over the selection's size is refused: the label
    "first N of M" would then be false, and lm-eval would silently score fewer than N."""
    n = ctx.options.limit
    if n is None:
        return idx_list, None
    if not 1 <= n <= len(idx_list):
        raise ResourceError(f"{ctx.name}: --limit {n} is outside 1..{len(idx_list)} (the {ctx.split} selection has "
                            f"{len(idx_list)} items)")
    order = "idx order" if ctx.split == "all" else "rank order of the hash rule"
    return idx_list[:n], {"n": n, "of": len(idx_list), "order": order}


def limit_label(block, unit="items"):
    """How a limited run says so (console headline; report.py words it the same from the evidence)."""
    return f"first {block['n']} of {block['of']} {unit} (--limit {block['n']})"


def with_limit(block, summary, config_out, text, unit="items"):
    """Record the limit block in summary.json and config.json and put its label before the headline `text`."""
    if block is None:
        return text
    summary["limit"] = config_out["limit"] = block
    return f"{limit_label(block, unit)}: {text}"
