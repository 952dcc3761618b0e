"""What the experiments that score every candidate twice share: loading each path's model, the check that both
loaded it the same way, the independent path in lm-eval's batches (with the result cache), the data-parallel
assignment by whole batches, the identity join of lm-eval's logged samples to the items, the per-item comparison of
the two paths' scores, the message when they still disagree, and the agreement and token-count figures.

protocol and mctaco use all of it; options uses all but the join of logged samples (its official path is lm-eval's
model API, so there are no logged samples to join); extraction the model loading and the loading check.
"""
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from experiments import official, parallel, result_cache, scoring
from experiments.evidence import IdentityMismatch, kernel_identity, kernel_summary
from resources import ResourceError

LOADING_KEYS = ("model_dtype", "attn_implementation", "torch_threads", "device")


# ---- the models -----------------------------------------------------------------------------------------------

def load_official_model(ctx):
    """lm-eval's HFLM over the verified model directory, with the experiment's config (timed as a stage). Under a
    launcher each rank builds a single-process HFLM (parallel.one_process_lm_eval); one that went data-parallel on
    its own is refused."""
    with ctx.stages.stage("official_model_load"), parallel.one_process_lm_eval():
        lm = official.make_lm(ctx.inputs.model_dir, ctx.config)
    if lm.world_size != 1:
        raise ResourceError(f"lm-eval's HFLM runs as rank {lm.rank} of {lm.world_size} processes itself; this "
                            "repository drives one single-process HFLM per rank (experiments/parallel.py)")
    return lm


def load_independent_model(ctx, stage="independent_model_load"):
    """(model, tokenizer) through adapter.py, with the experiment's config (timed as a stage)."""
    from adapter import load_model, load_tokenizer

    with ctx.stages.stage(stage):
        tokenizer = load_tokenizer(ctx.inputs.model_dir)
        model = load_model(ctx.inputs.model_dir, ctx.config)
    return model, tokenizer


def model_facts(model, tokenizer=None):
    """The independent path's facts, built as the official path's are (official.model_facts), plus, given the
    tokenizer, the special tokens the independent path derived from it and used (scoring.special_tokens)."""
    facts = official.model_facts(model)
    if tokenizer is not None:
        facts["special_tokens"] = scoring.special_tokens(tokenizer)
    return facts


def agreement_tolerance(config):
    """0.0 (the exact claim) on cpu, in every dtype: both paths run the same tensors through the same CPU kernels.
    On cuda, config.py's agreement_tolerance for the dtype (GPU kernels are not checked here: no GPU)."""
    if config["device"] == "cpu":
        return 0.0
    return config["agreement_tolerance"][config["dtype"]]


def agreement_claim(config, max_abs_diff, n_prediction_mismatches):
    """summary["agreement_claim"]: what the run claims about official vs independent on this device and dtype.

    cpu, any dtype: "exact" (every score bit-identical and every argmax equal; the tolerance is 0): the two paths
    present the model with the same batches (scoring.lm_eval_batches). On cuda the claim is "within tolerance":
    the measured max abs diff against config.py's agreement_tolerance for the dtype; predictions may then differ
    where two candidates are closer than the tolerance, and are counted, not claimed equal."""
    tolerance = agreement_tolerance(config)
    exact = tolerance == 0.0
    passed = max_abs_diff <= tolerance and (n_prediction_mismatches == 0 or not exact)
    return {"device": config["device"], "dtype": config["dtype"], "claim": "exact" if exact else "within tolerance",
            "tolerance": tolerance, "max_abs_diff": max_abs_diff, "passed": passed}


def check_same_loading(official_meta, independent_meta, keys=LOADING_KEYS,
                       message="the two paths loaded the model differently"):
    """Both paths must have run the model with the same dtype, attention implementation and threads: a score that
    agrees bit for bit under different settings would be luck, one that differs would not be a finding."""
    bad = [(None, k, official_meta[k], independent_meta[k]) for k in keys if official_meta[k] != independent_meta[k]]
    if bad:
        raise IdentityMismatch(message, bad)


# ---- the independent path in lm-eval's batches ----------------------------------------------------------------

def batching_facts(plan):
    """config.json's independent "batching": the rule, the batch size and the shape of every batch."""
    return {"rule": scoring.BATCH_RULE, "batch_size": plan.batch_size, "n_requests": len(plan.row_of),
            "n_rows": len(plan.rows), "n_batches": len(plan.batches), "shapes": plan.shapes()}


def combine_batching(parts):
    """The batching facts of one call scored in parts that are whole batches of its one-process plan (by_whole_batches):
    the counts summed, the shapes back in plan order (longest first; the one short batch is the plan's last)."""
    shapes = sorted((s for p in parts for s in p["shapes"]), key=lambda s: (-s[1], -s[0]))
    counts = {k: sum(p[k] for p in parts) for k in ("n_requests", "n_rows", "n_batches")}
    return {**parts[0], "shapes": shapes, **counts}


def combine_independent(metas, scored):
    """parallel.shard_map's combine for an independent path's meta: the first part's, with the result cache counts
    and the batching facts of all parts."""
    return {**metas[0], "result_cache": result_cache.combine_stats([m["result_cache"] for m in metas]),
            "batching": combine_batching([m["batching"] for m in metas])}


def score_independent(ctx, model, tokenizer, units, prompt_template_sha256, desc="independent scoring"):
    """The independent path on one part: every unit (key, where, context, candidates) scored in lm-eval's batches
    at official_batch_size over exactly these units -- the requests lm-eval gets for the same part -- each forward
    batch served from / stored into the result cache unless --no-cache. Returns ({key: scored candidates}, meta)."""
    config = ctx.config
    cache = result_cache.open_for(ctx, "independent-parity", prompt_template_sha256)
    with tqdm(total=sum(len(u[3]) for u in units), desc=desc, unit="cand") as bar:
        scored, plan, served = scoring.score_items(model, tokenizer, [u[1:] for u in units],
                                                   config["max_input_tokens"], config["official_batch_size"], cache,
                                                   bar.update)
    out, k, n_items_cached = {}, 0, 0
    for unit, cands in zip(units, scored):
        out[unit[0]] = cands
        n_items_cached += all(served[k:k + len(cands)])
        k += len(cands)
    stats = result_cache.close_with_stats(cache, out, sum(served), n_items_cached)
    return out, {**model_facts(model, tokenizer), "result_cache": stats, "batching": batching_facts(plan)}


def by_idx(item):
    """The default key of an item: its row idx."""
    return item["idx"]


def by_whole_batches(ctx, units, key=by_idx):
    """parallel.shard_map's keyword arguments for a scoring call whose units are (key, where, context, candidates):
    each item goes with its unit's share of the one-process plan, so every rank or shard gets whole batches of it
    and its lm-eval call forms exactly the batches one process forms. Batches that one unit's rows span form one
    group; the k-th group in plan order goes to rank k mod N. A rank or shard may get none (fewer groups than
    ranks: a smoke run is one batch). {} in one process, where every unit is scored together."""
    if parallel.plan_of(ctx).mode == "single":
        return {}
    from adapter import load_tokenizer

    tokenizer = load_tokenizer(ctx.inputs.model_dir)
    # no length check here: an input over the limit is refused by the rank that scores it, naming rank and item
    requests = scoring.encode_items(tokenizer, [u[1:] for u in units], None)
    plan = scoring.lm_eval_batches(requests, ctx.config["official_batch_size"])
    root = list(range(len(plan.batches)))

    def find(b):
        while root[b] != b:
            root[b] = root[root[b]]
            b = root[b]
        return b

    k, first = 0, {}
    for unit in units:
        batches = sorted({plan.batch_of[plan.row_of[k + j]] for j in range(len(unit[3]))})
        k += len(unit[3])
        for b in batches[1:]:
            root[find(b)] = find(batches[0])
        first[unit[0]] = batches[0]
    lowest = {}
    for b in range(len(root)):
        lowest.setdefault(find(b), b)              # a group is named by its first batch in plan order
    group = {u: lowest[find(b)] for u, b in first.items()}
    return {"group": lambda item: group[key(item)], "may_be_empty": True}


def score_disagreement(keys, independent, config, noun="items"):
    """The message of IdentityMismatch when the two paths' scores differ although both ran the same batches: in
    one line, what differed (the kernels, threads, dtype, and the batches of the differing units) and what to try.
    keys: the differing units' keys in `independent` ({key: scored candidates with their "batch"})."""
    batches = sorted({(c["batch"][0], c["batch"][2], c["batch"][3]) for k in keys if k in independent
                      for c in independent[k]})
    shown = (", ".join(f"{b} ({n} rows x {w} tokens)" for b, n, w in batches[:10])
             + (f", … ({len(batches) - 10} more)" if len(batches) > 10 else ""))
    tolerance = agreement_tolerance(config)
    return (f"{len(keys)} {noun} differ between the official and independent scores"
            + (f" by more than the tolerance {tolerance}" if tolerance else "")
            + f" although both paths ran the same batches (batch size {config['official_batch_size']}; the "
            f"differing ones sat in batch(es) {shown}) under "
            f"{kernel_summary(kernel_identity())}, {config['device']} {config['dtype']}: a kernel rounded the same "
            "tensor differently in the two calls. Try --threads 1, or MKL_CBWR=COMPATIBLE in the environment; if "
            "it persists, report this line with O/environment.json")


# ---- the score-twice pipeline ------------------------------------------------------------------------------------
# protocol, options and MC-TACO each describe their scoring calls (Call) and hand them to score_twice, which loads
# each path's model once per process, runs the official side of every call, then the independent side, data
# parallel through parallel.shard_map, and checks that both loaded the model the same way. What an experiment does
# with the two sides (the identity join, the comparison, the records) stays in the experiment.

@dataclass
class Call:
    """One scoring call both paths make on the same items.

    official(lm, part) -> ({key: result}, meta): lm-eval on a part of the items (stage "official" + suffix).
    units(items) -> [(key, where, context, candidates)]: what both paths score. With units, the independent side
    defaults to score_independent on the part's units and data parallelism assigns whole batches of the one-process
    plan; independent(model, tokenizer, part) -> ({key: scored}, meta) replaces the default (stage "independent" +
    suffix). check_official(meta) raises when lm-eval ran something else than the experiment implements."""
    items: list
    official: Callable
    units: Callable = None
    independent: Callable = None
    suffix: str = ""
    key: Callable = by_idx
    combine_official: Callable = None
    combine_independent: Callable = None
    check_official: Callable = None


@dataclass
class Scored:
    """score_twice's result: {suffix: ({key: value}, meta)} per path, and fast mode's runs (None without --fast)."""
    official: dict = field(default_factory=dict)
    independent: dict = field(default_factory=dict)
    fast: object = None


def score_twice(ctx, calls, template_sha256, fast=None):
    """Both paths on every call: the official side of each call first (one HFLM per process, dropped before the
    independent model loads), then the independent side (one model per process), then with --fast `fast(model,
    tokenizer)` on the independent model (one process only: run.py refuses --fast under data parallelism). Ends the
    experiment here in shard mode (parallel.scoring_done) and checks that both paths loaded the model alike."""
    loaded, assigned, out = {}, {}, Scored()

    def model_of(path):
        if path not in loaded:
            loaded[path] = load_official_model(ctx) if path == "official" else load_independent_model(ctx)
        return loaded[path]

    def timed(stage, path, work):
        """work(model) inside `stage`, the model loaded first: a load is its own stage, never nested in another
        (stages.json's stages add up to the experiment's wall time)."""
        def fn(part):
            model = model_of(path)
            with ctx.stages.stage(stage):
                return work(model, part)
        return fn

    for c in calls:
        assigned[c.suffix] = by_whole_batches(ctx, c.units(c.items), c.key) if c.units else {"may_be_empty": True}
        out.official[c.suffix] = parallel.shard_map(
            ctx, "official" + c.suffix, c.items, key=c.key, combine=c.combine_official, **assigned[c.suffix],
            fn=timed("official" + c.suffix, "official", c.official))
        if c.check_official is not None and out.official[c.suffix][1] is not None:
            c.check_official(out.official[c.suffix][1])
    loaded.pop("official", None)
    for c in calls:
        score = c.independent or (lambda model, tokenizer, part, c=c: score_independent(
            ctx, model, tokenizer, c.units(part), template_sha256))
        out.independent[c.suffix] = parallel.shard_map(
            ctx, "independent" + c.suffix, c.items, key=c.key,
            combine=c.combine_independent or (combine_independent if c.units else None), **assigned[c.suffix],
            fn=timed("independent" + c.suffix, "independent", lambda model, part, score=score: score(*model, part)))
    if fast is not None:
        out.fast = fast(*model_of("independent"))
    loaded.clear()
    parallel.scoring_done(ctx)
    check_same_loading(out.official[calls[0].suffix][1], out.independent[calls[0].suffix][1])
    return out


def logged_samples(lm, items, samples):
    """lm-eval's logged samples of these items with lm-eval's own token boundary of every candidate:
    {doc_id: {"sample", "boundaries": [[candidate, (context ids, candidate ids)]]}} (what shard_map gathers)."""
    boundaries = official_boundaries(lm, items)
    return {s["doc_id"]: {"sample": s, "boundaries": [[cand, b] for (idx, cand), b in boundaries.items()
                                                      if idx == s["doc_id"]]} for s in samples}


def samples_and_boundaries(per_doc):
    """(the logged samples, {(idx, candidate): lm-eval's boundary}) from logged_samples' gathered output."""
    return ([v["sample"] for v in per_doc.values()],
            {(idx, cand): tuple(b) for idx, v in per_doc.items() for cand, b in v["boundaries"]})


# ---- the identity join of logged samples ---------------------------------------------------------------------

def official_scores(sample):
    """The per-candidate log-likelihoods lm-eval logged for one multiple-choice document."""
    return [float(r[0][0]) for r in sample["resps"]]


def official_boundaries(lm, items):
    """lm-eval's own token boundary of every (item, candidate): {(idx, candidate): (context ids, candidate ids)}."""
    return {(it["idx"], cand): official.encode_pair(lm, it["prompt"], cand)
            for it in items for cand in it["candidates"]}


def join_samples(items, samples, boundaries, independent, task_fields, noun, prefix_ids=None):
    """Join every logged official sample to its item by doc_id and check each identity field; {idx: sample}.

    task_fields(sample, item) -> [(field, official value, item value)]: the fields particular to the task (label,
    target, text hashes). The prompt, the candidate texts and both paths' token boundaries are checked here for
    every task; with `prefix_ids` (the independent path's leading special tokens, scoring.special_tokens) also
    that lm-eval's context encoding of every candidate starts with exactly those ids. Any difference raises
    IdentityMismatch with one row per (doc_id, field)."""
    by_idx = {it["idx"]: it for it in items}
    seen = [s["doc_id"] for s in samples]
    bad = []
    if sorted(seen) != sorted(by_idx) or len(set(seen)) != len(seen):
        bad.append((None, "logged doc_ids", sorted(seen), sorted(by_idx)))
    joined = {}
    for s in samples:
        it = by_idx.get(s["doc_id"])
        if it is None:
            continue
        checks = task_fields(s, it) + [
            ("prompt_sha256", [scoring.sha256_text(a[0]) for a in s["arguments"]],
             [scoring.sha256_text(it["prompt"])] * len(it["candidates"])),
            ("candidates", [a[1] for a in s["arguments"]], it["candidates"]),
        ]
        for cand, ind in zip(it["candidates"], independent[it["idx"]]):
            ctx_ids, cand_ids = boundaries[(it["idx"], cand)]
            checks.append((f"boundary {cand!r}", [len(ctx_ids), list(cand_ids)], [ind["start"], ind["token_ids"]]))
            if prefix_ids is not None:
                checks.append((f"special-token prefix {cand!r}", list(ctx_ids[:len(prefix_ids)]), list(prefix_ids)))
        bad += [(s["doc_id"], field, o, i) for field, o, i in checks if o != i]
        joined[s["doc_id"]] = s
    if bad:
        raise IdentityMismatch(f"{len({b[0] for b in bad})} logged samples do not match their {noun}", bad)
    return joined


def compare_item(item, sample, scored, tolerance=0.0):
    """(record, agrees) for one joined item: the record fields every logged-sample experiment writes (the caller
    adds its own), and whether both paths' scores are bit-identical with the same argmax (tolerance 0, the exact
    claim), or, with a tolerance (agreement_claim), each within it."""
    off_scores = official_scores(sample)
    ind_scores = [c["score"] for c in scored]
    diffs = [abs(a - b) for a, b in zip(off_scores, ind_scores)]
    off_pred, ind_pred = scoring.argmax_first(off_scores), scoring.argmax_first(ind_scores)
    record = {
        "idx": item["idx"], "label": item["label"],
        "sentence_sha256": scoring.sha256_text(item["sentence"]),
        "prompt_sha256": scoring.sha256_text(item["prompt"]),
        "context_tokens": scored[0]["start"],
        "candidates": [{"text": c["text"], "token_ids": c["token_ids"], "start": c["start"]} for c in scored],
        "official": {"doc_id": sample["doc_id"], "scores": off_scores,
                     "is_greedy": [bool(r[0][1]) for r in sample["resps"]], "pred": off_pred,
                     "acc": float(sample["acc"]), "doc_hash": sample["doc_hash"],
                     "prompt_hash": sample["prompt_hash"]},
        "independent": {"scores": ind_scores, "pred": ind_pred, "correct": int(ind_pred == item["label"])},
        "abs_diff": diffs,
    }
    if tolerance:
        return record, all(d <= tolerance for d in diffs)
    return record, all(d == 0.0 for d in diffs) and off_pred == ind_pred


# ---- figures ----------------------------------------------------------------------------------------------------

def agreement(records, official_pred, independent_pred):
    """summary["agreement"]: the largest |official - independent| and the counts of differing scores and argmaxes."""
    diffs = [d for r in records for d in r["abs_diff"]]
    return {"max_abs_diff": max(diffs), "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
            "n_prediction_mismatches": sum(official_pred(r) != independent_pred(r) for r in records)}


def span(values):
    return {"min": min(values), "max": max(values), "total": sum(values)}


def candidate_token_stats(records):
    """stages.json "tokens": context tokens per record, input tokens (context + candidate) per candidate."""
    contexts = [r["context_tokens"] for r in records]
    inputs = [r["context_tokens"] + len(c["token_ids"]) for r in records for c in r["candidates"]]
    return {"context_tokens": span(contexts), "input_tokens_per_candidate": span(inputs), "n_items": len(records),
            "n_candidates": len(inputs)}
