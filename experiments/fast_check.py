"""run.py --fast: the fast mode (fast_scoring.py) next to parity mode on one run's items, as a measured figure.

Parity mode stays the scored path and the one that must agree with lm-eval bit for bit. With --fast an
experiment also scores its items in fast mode on the same loaded model (at the configured batch size and at batch
size 1) and reports, in summary.json["fast"], how far those scores are from parity mode's: max abs diff, equal
scores, argmax changes. The run stops (IdentityMismatch) if an argmax changes or a score moves more than
config `fast_tolerance`. Used by the protocol and MC-TACO experiments; evidence_audit/fast_mode.py recomputes the
figures from each record's "fast" field.
"""
import time

from experiments import fast_scoring, scoring


def run_fast(ctx, items, model, tokenizer):
    """Fast mode at the configured batch size and at batch size 1 (the batch-size invariance figures).
    items: [{"idx", "prompt", "candidates"}]; returns {"fast"|"fast_batch1": {"scores", "stats"}}."""
    config = ctx.config
    requests = [(it["idx"], it["prompt"], it["candidates"]) for it in items]
    runs = {}
    for name, bs in (("fast", config["fast_batch_size"]), ("fast_batch1", 1)):
        with ctx.stages.stage(f"independent_{name}"):
            t0 = time.perf_counter()
            scores, stats = fast_scoring.score_candidates_fast(model, tokenizer, requests, config["max_input_tokens"],
                                                               bs, config["fast_max_batch_tokens"],
                                                               fast_scoring.workers(config))
            runs[name] = {"scores": scores, "stats": {**stats, "wall_s": round(time.perf_counter() - t0, 4)}}
    return runs


def diff_figures(a, b):
    """{max_abs_diff, n_argmax_changes, n_scores_equal} between two {idx: [score, ...]} maps."""
    diffs = [abs(x - y) for i in a for x, y in zip(a[i], b[i])]
    return {"max_abs_diff": max(diffs), "n_scores": len(diffs), "n_scores_equal": sum(d == 0.0 for d in diffs),
            "n_argmax_changes": sum(scoring.argmax_first(a[i]) != scoring.argmax_first(b[i]) for i in a),
            "argmax_changed_idx": [i for i in a if scoring.argmax_first(a[i]) != scoring.argmax_first(b[i])]}


def compare_fast(records, fast, cache_stats, config, stages):
    """Fast mode against parity mode on this run's items, and batch size 1 against N (summary["fast"]).
    Adds each record's fast scores; returns (summary section, mismatch rows)."""
    parity = {r["idx"]: r["independent"]["scores"] for r in records}
    fast_n = {i: [c["score"] for c in v] for i, v in fast["fast"]["scores"].items()}
    fast_1 = {i: [c["score"] for c in v] for i, v in fast["fast_batch1"]["scores"].items()}
    bad = []
    for r in records:
        got = fast["fast"]["scores"][r["idx"]]
        if [c["token_ids"] for c in got] != [c["token_ids"] for c in r["candidates"]]:
            bad.append((r["idx"], "fast token ids", [c["token_ids"] for c in r["candidates"]],
                        [c["token_ids"] for c in got]))
        r["fast"] = {"scores": fast_n[r["idx"]], "scores_batch1": fast_1[r["idx"]],
                     "pred": scoring.argmax_first(fast_n[r["idx"]])}
        d = max(abs(x - y) for x, y in zip(parity[r["idx"]], fast_n[r["idx"]]))
        if r["fast"]["pred"] != r["independent"]["pred"] or d > config["fast_tolerance"]:
            bad.append((r["idx"], "fast vs parity scores", parity[r["idx"]], fast_n[r["idx"]]))
    wall = {s["name"]: s["wall_s"] for s in stages}
    n, k = cache_stats["candidate_scores"], cache_stats["from_cache"]
    source = ("computed in this run (parity mode, in lm-eval's batches)" if k == 0 else
              "the result cache (parity-mode scores of an earlier run with the same full identity)" if k == n else
              f"mixed: {k} of {n} parity scores from the result cache, the rest computed in this run")
    section = {
        "parity_source": source, "parity_from_cache": k, "n_candidates": n,
        "batch_size": config["fast_batch_size"], "max_batch_tokens": config["fast_max_batch_tokens"],
        "workers": fast_scoring.workers(config), "tolerance": config["fast_tolerance"], "passed": not bad,
        "vs_parity": diff_figures(parity, fast_n),
        "batch_invariance": {
            f"parity_vs_fast_batch{config['fast_batch_size']}": diff_figures(parity, fast_n),
            "parity_vs_fast_batch1": diff_figures(parity, fast_1),
            f"fast_batch1_vs_batch{config['fast_batch_size']}": diff_figures(fast_1, fast_n),
        },
        "wall_s": {"parity": wall.get("independent"), "fast": wall.get("independent_fast"),
                   "fast_batch1": wall.get("independent_fast_batch1"),
                   "note": "parity wall time includes cache lookups; near zero when served from the cache"},
        "work": {name: fast[name]["stats"] for name in ("fast", "fast_batch1")},
    }
    return section, bad


def headline(cache_stats, fast_summary, replayed=False):
    """The headline's tail: where the independent scores came from (the result cache, or the shards a --merge
    replays: `replayed`), and the fast-mode figures with --fast."""
    c = cache_stats
    if replayed:        # a merge scores nothing itself: a cache counter would be a 0 that means nothing
        text = "; independent scores from the shards (--merge)"
    else:
        text = (f"; independent scores from the result cache: {c['from_cache']}/{c['candidate_scores']}"
                + (f" ({c['corrupted']} corrupted rows detected and recomputed)" if c["corrupted"] else "")
                if c["enabled"] else "; result cache off (--no-cache)")
    if fast_summary:
        v = fast_summary["vs_parity"]
        text += (f"; fast mode (batch {fast_summary['batch_size']}): max |fast - parity| = {v['max_abs_diff']:.3g}, "
                 f"{v['n_argmax_changes']} argmax changes, {speed_text(fast_summary)}")
    return text


def speed_text(fast_summary):
    """Fast mode's time against parity mode's, only when parity mode computed its scores in this run: a parity
    score served from the result cache took a lookup, not a forward pass, so the two times are not comparable."""
    k, n, wall = fast_summary["parity_from_cache"], fast_summary["n_candidates"], fast_summary["wall_s"]
    if k == 0:
        return f"{wall['fast']} s vs parity {wall['parity']} s"
    served = "all" if k == n else f"{k} of {n}"
    return (f"fast {wall['fast']} s; parity served from the result cache ({served} scores), so its "
            f"{wall['parity']} s is no speed to compare")
