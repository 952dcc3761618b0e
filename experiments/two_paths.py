"""What the experiments that score every candidate twice share: loading each path's model, the check that both
loaded it the same way, the independent path in lm-eval's batches (with the result cache), the data-parallel
assignment by whole batches, the score-twice pipeline (score_twice over Calls), and the compare half: the identity
join of lm-eval's logged samples to the items, the per-item comparison of the two paths' scores, the message when
they still disagree, the --fast comparison, and the agreement and token-count figures.

protocol and mctaco use all of it, each describing its task as data (LoggedTask) for compare_logged; options all
but the join of logged samples (its official path is lm-eval's model API, so there are no logged samples to join:
it compares its records with compare_scores and raises the same message); extraction the model loading and the
loading check.
"""
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from tqdm import tqdm

from experiments import fast_check, official, parallel, result_cache, scoring
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


def score_independent(ctx, model, tokenizer, units, prompt_template_sha256, encoded=None):
    """The independent path on one part: every unit (key, where, context, candidates) scored in lm-eval's batches
    at official_batch_size over exactly these units -- the requests lm-eval gets for the same part -- each forward
    batch served from / stored into the result cache unless --no-cache. `encoded` ({unit key: its requests}) holds
    the token ids by_whole_batches encoded for a data-parallel run, so no unit is encoded twice.
    Returns ({key: scored candidates}, meta)."""
    config = ctx.config
    cache = result_cache.open_for(ctx, "independent-parity", prompt_template_sha256)
    requests = [r for u in units for r in encoded[u[0]]] if encoded is not None else None
    with tqdm(total=sum(len(u[3]) for u in units), desc="independent scoring", unit="cand") as bar:
        scored, plan, served = scoring.score_items(model, tokenizer, [u[1:] for u in units],
                                                   config["max_input_tokens"], config["official_batch_size"], cache,
                                                   bar.update, requests)
    out, k, n_items_cached = {}, 0, 0
    for unit, cands in zip(units, scored):
        out[unit[0]] = cands
        n_items_cached += all(served[k:k + len(cands)])
        k += len(cands)
    stats = result_cache.close_with_stats(cache, out, sum(served), n_items_cached)
    return out, {**model_facts(model, tokenizer), "result_cache": stats, "batching": batching_facts(plan)}


def prompt_unit(item):
    """What both paths score of an item with a prompt and candidates (protocol, MC-TACO): (idx, where, prompt,
    candidates)."""
    return item["idx"], f"idx {item['idx']}", item["prompt"], item["candidates"]


def by_idx(item):
    """The default key of an item: its row idx."""
    return item["idx"]


def by_whole_batches(ctx, units, key):
    """(parallel.shard_map's keyword arguments, {unit key: its requests}) for a scoring call whose units are (key,
    where, context, candidates), one per item, key(item) being its unit's key: each item goes with its unit's share
    of the one-process plan, so every rank or shard gets whole batches of it and its lm-eval call forms exactly the
    batches one process forms. Batches that one unit's rows span form one group; the k-th group in plan order goes
    to rank k mod N. A rank or shard may get none (fewer groups than ranks: a smoke run is one batch). Every unit is
    encoded here, once: the rank that scores it scores these ids (score_independent). ({}, None) in one process,
    where every unit is scored together (and encoded there)."""
    if parallel.plan_of(ctx).mode == "single":
        return {}, None
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

    k, first, encoded = 0, {}, {}
    for unit in units:
        batches = sorted({plan.batch_of[plan.row_of[k + j]] for j in range(len(unit[3]))})
        encoded[unit[0]] = requests[k:k + len(unit[3])]
        k += len(unit[3])
        for b in batches[1:]:
            root[find(b)] = find(batches[0])
        first[unit[0]] = batches[0]
    lowest = {}
    for b in range(len(root)):
        lowest.setdefault(find(b), b)              # a group is named by its first batch in plan order
    group = {u: lowest[find(b)] for u, b in first.items()}
    return {"group": lambda item: group[key(item)], "may_be_empty": True}, encoded


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
# parallel through parallel.shard_map, and checks that both loaded the model the same way. protocol and MC-TACO then
# hand the main call to compare_logged with their task described as data (LoggedTask); options compares its
# records itself (its official path logs no samples) with compare_scores and the same disagreement message.

@dataclass
class Call:
    """One scoring call both paths make on the same items.

    official(lm, part) -> ({key: result}, meta): lm-eval on a part of the items. unit(item) -> (key, where,
    context, candidates): what both paths score of one item, filed under its key; with it the independent side is
    score_independent on the part's units and data parallelism assigns whole batches of the one-process plan.
    independent(model, tokenizer, part) -> ({key: scored}, meta) replaces that (the items then file under their idx).
    combine_official(metas, per_key) builds the meta of a data-parallel run from its parts'; check_official(meta)
    raises when lm-eval ran something else than the experiment implements."""
    items: list
    official: Callable
    unit: Callable = None
    independent: Callable = None
    combine_official: Callable = None
    check_official: Callable = None


@dataclass
class Scored:
    """score_twice's result: {call name: ({key: value}, meta)} per path, and fast mode's runs (None without --fast)."""
    official: dict = field(default_factory=dict)
    independent: dict = field(default_factory=dict)
    fast: object = None


def score_twice(ctx, calls, template_sha256, fast=False):
    """Both paths on every call ({name: Call}; "" is the main call, a name is its stages' suffix): the official
    side of each call first (one HFLM per process, dropped before the independent model loads), then the
    independent side (one model per process), then with --fast, for an experiment that honours it (fast=True),
    fast mode on the main call's items with the independent model (one process only: run.py refuses --fast under
    data parallelism). Ends the experiment here in shard mode (parallel.scoring_done) and checks that both paths
    loaded the model alike."""
    loaded, assigned, encoded, out = {}, {}, {}, Scored()

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

    def key_of(c):
        """The key an item's results are filed under: its unit's, else its idx."""
        return (lambda item: c.unit(item)[0]) if c.unit else by_idx

    for name, c in calls.items():
        assigned[name], encoded[name] = (by_whole_batches(ctx, [c.unit(it) for it in c.items], key_of(c)) if c.unit
                                         else ({"may_be_empty": True}, None))
        out.official[name] = parallel.shard_map(
            ctx, "official" + name, c.items, key=key_of(c), combine=c.combine_official, **assigned[name],
            fn=timed("official" + name, "official", c.official))
        if c.check_official is not None and out.official[name][1] is not None:
            c.check_official(out.official[name][1])
    loaded.pop("official", None)
    for name, c in calls.items():
        score = c.independent or (lambda model, tokenizer, part, c=c, name=name: score_independent(
            ctx, model, tokenizer, [c.unit(it) for it in part], template_sha256, encoded[name]))
        out.independent[name] = parallel.shard_map(
            ctx, "independent" + name, c.items, key=key_of(c),
            combine=combine_independent if c.unit else None, **assigned[name],
            fn=timed("independent" + name, "independent", lambda model, part, score=score: score(*model, part)))
    if fast and ctx.options.fast:
        out.fast = fast_check.run_fast(ctx, calls[""].items, *model_of("independent"))
    loaded.clear()
    parallel.scoring_done(ctx)
    check_same_loading(out.official[""][1], out.independent[""][1])
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


# ---- the compare half: identity join of logged samples, per-item comparison ---------------------------------------

class LoggedTask(NamedTuple):
    """What the compare half checks and writes for an lm-eval task whose logged samples are joined to the items
    (protocol's glue/sst2, MC-TACO's mc_taco), as data for compare_logged.

    fields: the identity rows particular to the task, (row name, logged value, item field); the logged value is
    "target" (the sample's) or "doc.<field>" (its document's), and a row name ending in _sha256 compares the
    texts' hashes. pair_metric: a metric that logs its (gold, pred) pair (mc_taco's f1), checked against the label
    and the official argmax and recorded. record_fields: the item's fields every record carries besides the
    common ones (a name ending in _sha256: the hash of the field it names). text_fields: the item's fields of its
    private texts.jsonl line. failure_details: the official meta's keys a failed join carries (protocol: the order
    the idx were passed to lm-eval in, what --no-sort-samples demonstrates)."""
    noun: str = "items"
    fields: tuple = ()
    pair_metric: str = None
    record_fields: tuple = ()
    text_fields: tuple = ()
    failure_details: tuple = ()


def item_value(item, name):
    """An item's field, or with a name ending in _sha256 the hash of the text field it names."""
    return scoring.sha256_text(item[name[:-len("_sha256")]]) if name.endswith("_sha256") else item[name]


def identity_rows(task, sample, item):
    """[(row name, logged value, item value)] of the task's own identity fields for one joined sample."""
    rows = []
    for name, source, item_field in task.fields:
        hashed = name.endswith("_sha256")
        if source.startswith("doc."):
            logged = sample["doc"].get(source[len("doc."):], "" if hashed else None)
        else:
            logged = sample[source]
        mine = item[item_field]
        if hashed:
            logged, mine = scoring.sha256_text(logged), scoring.sha256_text(mine)
        rows.append((name, logged, mine))
    if task.pair_metric:
        rows.append((f"{task.pair_metric} pair gold", int(sample[task.pair_metric][0]), item["label"]))
    return rows


def official_scores(sample):
    """The per-candidate log-likelihoods lm-eval logged for one multiple-choice document."""
    return [float(r[0][0]) for r in sample["resps"]]


def official_boundaries(lm, items):
    """lm-eval's own token boundary of every (item, candidate): {(idx, candidate): (context ids, candidate ids)}."""
    return {(it["idx"], cand): official.encode_pair(lm, it["prompt"], cand)
            for it in items for cand in it["candidates"]}


def join_samples(items, samples, boundaries, independent, task, prefix_ids=None):
    """Join every logged official sample to its item by doc_id and check each identity field; {idx: sample}.

    The task's own fields (identity_rows), the prompt, the candidate texts and both paths' token boundaries are
    checked for every sample; with `prefix_ids` (the independent path's leading special tokens,
    scoring.special_tokens) also that lm-eval's context encoding of every candidate starts with exactly those ids.
    Any difference raises IdentityMismatch with one row per (doc_id, field)."""
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
        checks = identity_rows(task, s, it) + [
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
        raise IdentityMismatch(f"{len({b[0] for b in bad})} logged samples do not match their {task.noun}", bad)
    return joined


def compare_scores(official_scores, independent_scores, tolerance=0.0):
    """(|official - independent| per candidate, official argmax, independent argmax, whether the scores agree):
    bit-identical with tolerance 0 (the exact claim), else each within the tolerance (agreement_claim)."""
    diffs = [abs(a - b) for a, b in zip(official_scores, independent_scores)]
    agree = all(d <= tolerance for d in diffs) if tolerance else all(d == 0.0 for d in diffs)
    return diffs, scoring.argmax_first(official_scores), scoring.argmax_first(independent_scores), agree


def compare_item(task, item, sample, scored, tolerance=0.0):
    """(record, agrees) for one joined item: the record every logged-sample experiment writes, with the task's own
    fields, and whether both paths agree: the scores (compare_scores) and, under the exact claim, the argmax; with
    a pair metric also the pred lm-eval logged in it."""
    off_scores = official_scores(sample)
    ind_scores = [c["score"] for c in scored]
    diffs, off_pred, ind_pred, agrees = compare_scores(off_scores, ind_scores, tolerance)
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
        **{name: item_value(item, name) for name in task.record_fields},
    }
    if not tolerance:
        agrees = agrees and off_pred == ind_pred
    if task.pair_metric:
        pair = [int(sample[task.pair_metric][0]), int(sample[task.pair_metric][1])]
        record["official"][f"{task.pair_metric}_pair"] = pair
        agrees = agrees and pair[1] == off_pred      # lm-eval's (gold, pred): its pred is the official argmax
    return record, agrees


def compare_logged(ctx, task, items, scored):
    """The compare half of the main call of a logged-sample experiment (scored: score_twice's result): lm-eval's
    logged samples joined to the items on identity, every item compared, and with --fast fast mode against parity
    mode. Returns (records, the private texts, summary["fast"] or None); raises IdentityMismatch on the first
    difference: a join row, the scores (one message, score_disagreement), or fast mode."""
    (per_doc, official_meta), (independent, independent_meta) = scored.official[""], scored.independent[""]
    samples, boundaries = samples_and_boundaries(per_doc)
    try:
        joined = join_samples(items, samples, boundaries, independent, task,
                              independent_meta["special_tokens"]["prefix_ids"])
    except IdentityMismatch as e:
        if task.failure_details:
            e.details = {k: official_meta[k] for k in task.failure_details}
        raise
    tolerance = agreement_tolerance(ctx.config)
    records, texts, bad = [], [], []
    for it in items:
        record, agrees = compare_item(task, it, joined[it["idx"]], independent[it["idx"]], tolerance)
        if not agrees:
            bad.append((it["idx"], "scores", record["official"]["scores"], record["independent"]["scores"]))
        records.append(record)
        texts.append({name: it[name] for name in task.text_fields})
    if bad:
        raise IdentityMismatch(score_disagreement([b[0] for b in bad], independent, ctx.config, task.noun), bad)
    if scored.fast is None:
        return records, texts, None
    fast, bad = fast_check.compare_fast(records, scored.fast, independent_meta["result_cache"], ctx.config,
                                        ctx.stages.stages)
    if bad:
        raise IdentityMismatch("fast mode disagrees with parity mode (an argmax changed or a score moved more "
                               f"than fast_tolerance={ctx.config['fast_tolerance']})", bad)
    return records, texts, fast


# ---- figures ----------------------------------------------------------------------------------------------------

def agreement(records, official_pred=lambda r: r["official"]["pred"],
              independent_pred=lambda r: r["independent"]["pred"]):
    """summary["agreement"]: the largest |official - independent| and the counts of differing scores and argmaxes
    (by default of the records compare_item writes)."""
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
