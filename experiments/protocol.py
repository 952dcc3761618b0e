"""The official SST-2 protocol, scored twice (seed study 000).

Every selected item is scored by lm-eval 0.4.9.2 with its installed glue/sst2 task, and by the independent path
in experiments/scoring.py. The two are joined on item identity (doc id, sentence hash, prompt hash, candidate
token boundaries) and must agree bit for bit on every candidate score; any disagreement stops the run (exit 1).

Read top to bottom: select items -> build prompts -> official run -> independent run -> identity join ->
compare -> evidence.
"""
import hashlib
import time

import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from experiments import fast_scoring, official, result_cache, scoring
from experiments.evidence import IdentityMismatch, jsonl
from experiments.selection import select, selection_block

NAME = "protocol"
TASK_YAML = "tasks/glue/sst2/default.yaml"
TASK_NAME = "sst2"


def prompt_template_sha256(config):
    return hashlib.sha256(config["sst2_prompt"].encode("utf-8")).hexdigest()


def load_rows(parquet_path):
    cols = pq.read_table(parquet_path).to_pydict()
    return [{"idx": int(i), "label": int(l), "sentence": s}
            for s, l, i in zip(cols["sentence"], cols["label"], cols["idx"])]


def build_items(rows, idx_list, config):
    """Prompt and candidates for each item, built from the protocol's fields (not from lm-eval)."""
    items = []
    for rank, idx in enumerate(idx_list):
        row = rows[idx]
        assert row["idx"] == idx, f"row at position {idx} has idx {row['idx']}"
        prompt = config["sst2_prompt"].format(sentence=row["sentence"])
        items.append({"idx": idx, "rank": rank, "label": row["label"], "sentence": row["sentence"],
                      "prompt": prompt, "candidates": [config["target_delimiter"] + c for c in config["sst2_choices"]]})
    return items


def check_task_config(dumped, config):
    """Our independent prompt spec must say what the official task says; otherwise we are not testing it."""
    expected = {
        "doc_to_text": config["sst2_prompt"].replace("{sentence}", "{{sentence}}"),
        "doc_to_choice": config["sst2_choices"],
        "target_delimiter": config["target_delimiter"],
        "num_fewshot": config["num_fewshot"],
        "output_type": "multiple_choice",
        "doc_to_target": "label",
    }
    bad = [(None, k, dumped.get(k), v) for k, v in expected.items() if dumped.get(k) != v]
    if bad:
        raise IdentityMismatch("the official task config differs from the protocol this repository implements", bad)


def run_official(ctx, items, parquet_path):
    """lm-eval on the selected idx list. Indices are sorted first: 0.4.9.2 labels logged samples with the caller's
    order but iterates documents in dataset order, so an unsorted list mislabels evidence. Sorting is input
    normalisation (the same set of items), not re-selection; --no-sort-samples reproduces the defect."""
    config = ctx["config"]
    with ctx["stages"].stage("official_model_load"):
        lm = official.make_lm(ctx["model_dir"], config)
    indices = [it["idx"] for it in items]
    passed = indices if ctx["args"].no_sort_samples else sorted(indices)
    cfg = official.task_config(TASK_YAML, parquet_path)
    with ctx["stages"].stage("official"):
        results = official.evaluate(lm, cfg, TASK_NAME, passed, config["seed"])
    samples = results["samples"][TASK_NAME]
    boundaries = {}
    for it in items:
        for cand in it["candidates"]:
            boundaries[(it["idx"], cand)] = official.encode_pair(lm, it["prompt"], cand)
    meta = {
        "lm_eval_version": official.version(),
        "task_yaml": TASK_YAML,
        "dumped_task_config": results["configs"][TASK_NAME],
        "lm_eval_files_sha256": official.file_hashes(extra=[TASK_YAML]),
        "indices_passed_to_lm_eval": passed,
        "indices_sorted": passed == sorted(indices),
        "reported_acc": results["results"][TASK_NAME]["acc,none"],
        **official.lm_facts(lm, ctx["model_dir"], config),
        "custom_dataset": "serves the verified cache parquet as the validation split (+ an empty train split)",
    }
    del lm
    return samples, boundaries, meta


def run_independent(ctx, items):
    """Parity mode (scoring.py), each candidate score served from / stored into the result cache unless
    --no-cache; with --fast, also fast mode (fast_scoring.py) on the same loaded model. Returns
    (scores by idx, meta, fast results or None)."""
    from adapter import load_model, load_tokenizer

    config = ctx["config"]
    args = ctx["args"]
    with ctx["stages"].stage("independent_model_load"):
        tokenizer = load_tokenizer(ctx["model_dir"])
        model = load_model(ctx["model_dir"], config)
    cache = result_cache.open_for(ctx, "independent-parity", prompt_template_sha256(config))
    out, n_cached, n_items_cached = {}, 0, 0
    with ctx["stages"].stage("independent"):
        for n, it in enumerate(tqdm(items, desc="independent scoring", unit="item"), start=1):
            where = f"idx {it['idx']}"
            if cache is None:
                out[it["idx"]] = scoring.score_candidates(model, tokenizer, it["prompt"], it["candidates"],
                                                          config["max_input_tokens"], where)
            else:
                out[it["idx"]], k = result_cache.score_candidates_cached(
                    cache, model, tokenizer, it["prompt"], it["candidates"], config["max_input_tokens"], where,
                    {"idx": it["idx"], "sentence_sha256": scoring.sha256_text(it["sentence"])})
                n_cached += k
                n_items_cached += k == len(it["candidates"])
            result_cache.kill_hook(n)                 # test hook (EVAL_TEST_KILL_AFTER_ITEMS); no-op otherwise
    n_cands = sum(len(v) for v in out.values())
    cache_stats = result_cache.disabled_stats() if cache is None else cache.stats()
    cache_stats.update(candidate_scores=n_cands, from_cache=n_cached, computed=n_cands - n_cached,
                       items_from_cache=n_items_cached)
    if cache is not None:
        cache.close()
    meta = {"model_dtype": str(model.dtype), "attn_implementation": model.config._attn_implementation,
            "torch_threads": torch.get_num_threads(), "result_cache": cache_stats}
    fast = run_fast(ctx, items, model, tokenizer) if getattr(args, "fast", False) else None
    return out, meta, fast


def run_fast(ctx, items, model, tokenizer):
    """Fast mode at the configured batch size and at batch size 1 (the batch-size invariance figures)."""
    config = ctx["config"]
    requests = [(it["idx"], it["prompt"], it["candidates"]) for it in items]
    runs = {}
    for name, bs in (("fast", config["fast_batch_size"]), ("fast_batch1", 1)):
        with ctx["stages"].stage(f"independent_{name}"):
            t0 = time.perf_counter()
            scores, stats = fast_scoring.score_candidates_fast(model, tokenizer, requests, config["max_input_tokens"],
                                                               bs, config["fast_max_batch_tokens"],
                                                               fast_scoring.workers(config))
            runs[name] = {"scores": scores, "stats": {**stats, "wall_s": round(time.perf_counter() - t0, 4)}}
    return runs


def join_and_check(items, samples, boundaries, independent):
    """Join every logged official sample to its item by doc_id and check each identity field."""
    by_idx = {it["idx"]: it for it in items}
    bad = []
    seen = [s["doc_id"] for s in samples]
    if sorted(seen) != sorted(by_idx) or len(set(seen)) != len(seen):
        bad.append((None, "logged doc_ids", sorted(seen), sorted(by_idx)))
    official_by_idx = {}
    for s in samples:
        it = by_idx.get(s["doc_id"])
        if it is None:
            continue
        doc = s["doc"]
        checks = [
            ("doc.idx", doc.get("idx"), it["idx"]),
            ("label", doc.get("label"), it["label"]),
            ("target", s["target"], it["label"]),
            ("sentence_sha256", scoring.sha256_text(doc.get("sentence", "")), scoring.sha256_text(it["sentence"])),
            ("prompt_sha256", [scoring.sha256_text(a[0]) for a in s["arguments"]],
             [scoring.sha256_text(it["prompt"])] * len(it["candidates"])),
            ("candidates", [a[1] for a in s["arguments"]], it["candidates"]),
        ]
        for cand, ind in zip(it["candidates"], independent[it["idx"]]):
            ctx_ids, cand_ids = boundaries[(it["idx"], cand)]
            checks.append((f"boundary {cand!r}", [len(ctx_ids), list(cand_ids)], [ind["start"], ind["token_ids"]]))
        bad += [(s["doc_id"], field, o, i) for field, o, i in checks if o != i]
        official_by_idx[s["doc_id"]] = s
    if bad:
        raise IdentityMismatch(f"{len({b[0] for b in bad})} logged samples do not match their items", bad)
    return official_by_idx


def compare(items, official_by_idx, independent):
    records, texts, bad = [], [], []
    for it in items:
        s = official_by_idx[it["idx"]]
        off_scores = [float(r[0][0]) for r in s["resps"]]
        ind = independent[it["idx"]]
        ind_scores = [c["score"] for c in ind]
        diffs = [abs(a - b) for a, b in zip(off_scores, ind_scores)]
        off_pred = scoring.argmax_first(off_scores)
        ind_pred = scoring.argmax_first(ind_scores)
        if any(d != 0.0 for d in diffs) or off_pred != ind_pred:
            bad.append((it["idx"], "scores", off_scores, ind_scores))
        records.append({
            "idx": it["idx"], "rank": it["rank"], "label": it["label"],
            "sentence_sha256": scoring.sha256_text(it["sentence"]),
            "prompt_sha256": scoring.sha256_text(it["prompt"]),
            "context_tokens": ind[0]["start"],
            "candidates": [{"text": c["text"], "token_ids": c["token_ids"], "start": c["start"]} for c in ind],
            "official": {"doc_id": s["doc_id"], "scores": off_scores, "is_greedy": [bool(r[0][1]) for r in s["resps"]],
                         "pred": off_pred, "acc": float(s["acc"]), "doc_hash": s["doc_hash"],
                         "prompt_hash": s["prompt_hash"]},
            "independent": {"scores": ind_scores, "pred": ind_pred, "correct": int(ind_pred == it["label"])},
            "abs_diff": diffs,
        })
        texts.append({"idx": it["idx"], "sentence": it["sentence"], "prompt": it["prompt"]})
    return records, texts, bad


def summarise(records, split, meta):
    n = len(records)
    labels = [r["label"] for r in records]
    label_counts = {str(k): labels.count(k) for k in (0, 1)}
    majority = max((0, 1), key=lambda k: (labels.count(k), -k))

    def side(key, pred_of):
        preds = [pred_of(r) for r in records]
        correct = sum(p == r["label"] for p, r in zip(preds, records))
        return {"correct": correct, "accuracy": correct / n, "pred_counts": {str(k): preds.count(k) for k in (0, 1)}}

    diffs = [d for r in records for d in r["abs_diff"]]
    return {
        "experiment": NAME, "split": split, "confirmation_items_scored": split == "confirm",
        "n_items": n, "n_candidates": len(diffs), "label_counts": label_counts,
        "official": {**side("official", lambda r: r["official"]["pred"]), "lm_eval_reported_acc": meta["reported_acc"]},
        "independent": side("independent", lambda r: r["independent"]["pred"]),
        "constant_class_baseline": {"label": majority, "accuracy": labels.count(majority) / n},
        "agreement": {"max_abs_diff": max(diffs), "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(r["official"]["pred"] != r["independent"]["pred"] for r in records)},
        "identity_checks": {"passed": True, "n_samples_joined": n,
                            "fields": ["doc_id", "doc.idx", "label", "target", "sentence_sha256", "prompt_sha256",
                                       "candidate texts", "candidate token ids and start"]},
    }


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
    source = ("computed in this run (parity mode, one sequence per forward pass)" if k == 0 else
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


def cache_headline(cache_stats, fast_summary):
    c = cache_stats
    text = (f"; independent scores from the result cache: {c['from_cache']}/{c['candidate_scores']}"
            + (f" ({c['corrupted']} corrupted rows detected and recomputed)" if c["corrupted"] else "")
            if c["enabled"] else "; result cache off (--no-cache)")
    if fast_summary:
        v = fast_summary["vs_parity"]
        text += (f"; fast mode (batch {fast_summary['batch_size']}): max |fast - parity| = {v['max_abs_diff']:.3g}, "
                 f"{v['n_argmax_changes']} argmax changes, {fast_summary['wall_s']['fast']} s vs parity "
                 f"{fast_summary['wall_s']['parity']} s")
    return text


def headline(s):
    return (f"{s['n_items']} items, {s['n_candidates']} candidates: official {s['official']['correct']}/{s['n_items']}, "
            f"independent {s['independent']['correct']}/{s['n_items']}, max |official - independent| = "
            f"{s['agreement']['max_abs_diff']}, identity checks passed")


def run(ctx):
    config, split, stages = ctx["config"], ctx["split"], ctx["stages"]
    rows = load_rows(ctx["parquet_path"])
    idx_list = select(split, config["selection_salt"], len(rows), config["n_dev"], config["n_confirm"],
                      config["n_smoke"])
    items = build_items(rows, idx_list, config)

    samples, boundaries, official_meta = run_official(ctx, items, ctx["parquet_path"])
    check_task_config(official_meta["dumped_task_config"], config)
    independent, independent_meta, fast = run_independent(ctx, items)
    for key in ("model_dtype", "attn_implementation", "torch_threads"):
        if official_meta[key] != independent_meta[key]:
            raise IdentityMismatch("the two paths loaded the model differently",
                                   [(None, key, official_meta[key], independent_meta[key])])

    with stages.stage("compare"):
        official_by_idx = join_and_check(items, samples, boundaries, independent)
        records, texts, bad = compare(items, official_by_idx, independent)
        if bad:
            raise IdentityMismatch(f"{len(bad)} items differ between the official and independent scores", bad)
        summary = summarise(records, split, official_meta)
        if fast is not None:
            summary["fast"], bad = compare_fast(records, fast, independent_meta["result_cache"], config,
                                                stages.stages)
            if bad:
                raise IdentityMismatch("fast mode disagrees with parity mode (an argmax changed or a score moved "
                                       f"more than fast_tolerance={config['fast_tolerance']})", bad)

    token_counts = [r["context_tokens"] + len(c["token_ids"]) for r in records for c in r["candidates"]]
    ctx_counts = [r["context_tokens"] for r in records]
    config_out = {
        "experiment": NAME, "split": split, "confirmation_items_scored": split == "confirm",
        "data": ctx["data_id"], "data_content_sha256": ctx["data_content_sha256"], "n_rows": len(rows),
        "selection": selection_block(config, split, idx_list),
        "config": config, "official": official_meta, "independent": independent_meta,
        "model": ctx["model_identity"],
    }
    stats = {"context_tokens": {"min": min(ctx_counts), "max": max(ctx_counts), "total": sum(ctx_counts)},
             "input_tokens_per_candidate": {"min": min(token_counts), "max": max(token_counts),
                                            "total": sum(token_counts)},
             "n_items": len(records), "n_candidates": len(token_counts)}
    return {"config": config_out, "records": records, "summary": summary, "token_stats": stats,
            "private": {"texts.jsonl": jsonl(texts)},
            "headline": headline(summary) + cache_headline(independent_meta["result_cache"], summary.get("fast")),
            "prompt_template_sha256": prompt_template_sha256(config)}
