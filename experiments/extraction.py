"""Answer extraction: how much of a generative score is the scorer's rather than the model's. One set of greedy
generations, three scorers, a pre-registered human audit.

Read top to bottom: select items -> choose and write the audit sample (before any model is loaded) -> render chat
prompts -> greedy generation through transformers -> cross-check with lm-eval's HFLM.generate_until -> score every
generation three ways (exact string, strict JSON, lm-eval's RegexFilter + TakeFirstFilter, and the independent
regex re-implementation that must agree on every item) -> paired tables and failure categories -> review page.

The model answers a chat prompt (SmolLM2's chat template, its default system message) asking for a JSON object
with one key "sentiment". Greedy, max_new_tokens from config, fp32, CPU, one sequence at a time; only the newly
generated tokens are scored (the terminating eos removed). An input over max_input_tokens is an error.

Public records carry hashes and scores; the prompts and generations go to O/private/extraction/. The audit sample
is written to O/extraction.preregistration.json before the model is loaded; its sha256 is in config.json. The
human-review figures are null here: they exist only once a filled sheet is imported (audit.py --review SHEET).

Flags it honours (ctx.options): out (the pre-registration file is written into O before generation) and limit
(selection.limited_selection: the first N items of the selection, in its order; the limit is applied first, so the
audit sample is drawn from those N items, and the pre-registration's population says so: population.limit).

Data parallel (torchrun / accelerate launch, --shard K/N, --merge; experiments/parallel.py): the audit sample is
chosen from the selection alone on every rank and rank 0's is taken (parallel.agreed: broadcast before any model is
loaded; a merge takes the shards' own, checked equal); both generations (transformers', call "independent", and
lm-eval's generate_until, call "official") go through parallel.shard_map by idx; everything after them runs
unchanged on the gathered items.
"""
import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm import tqdm

import resources
import registry
from experiments import extraction_scorers
from experiments import official, parallel, scoring, stats, two_paths
from experiments.context import Result
from experiments.evidence import EVIDENCE_FORMAT, FORMAT_KEY, IdentityMismatch, jsonl
from experiments.extraction_sample import AUDIT_RULE, choose_audit_sample, class_weights
from experiments.review_page import build_review_page
from experiments.scoring import sha256_text
from experiments.selection import (config_head, confirmation_items_scored, limited_selection, load_rows, select_items,
                                  with_limit)

NAME = "extraction"
DATA_PARALLEL = True   # its generations go through parallel.shard_map (torchrun, --shard, --merge)
CONFIG_SECTIONS = registry.config_sections(NAME)   # declared in registry.py
EXACT_AGREEMENT_ONLY = True  # its two paths must agree bit for bit: run.py refuses a device without that claim
NEEDS_CHAT_TEMPLATE = True     # the prompts go through the tokenizer's chat template (run.py checks a local model)
SUPPORTS_LIMIT = True  # --limit N: the first N items of the selection, before the audit sample is drawn
PREREGISTRATION_FILE = "extraction.preregistration.json"     # in O/, written before the model is loaded
SCORERS = ("exact", "strict", "regex")
PAIRS = (("exact", "strict"), ("exact", "regex"), ("strict", "regex"))     # summary["paired"], ["uncertainty"]
LM_EVAL_FILES = ["filters/__init__.py", "filters/extraction.py", "filters/selection.py", "api/filter.py",
                 "api/instance.py", "api/registry.py", "models/huggingface.py", "models/utils.py"]
HUMAN_REVIEW_NULL = {
    "sheet": None, "n_reviewed": None, "n_decidable_undisputed": None, "disagreement_rate": None,
    "false_positives": None, "false_negatives": None, "weighted_disagreement_rate": None,
    "note": "no filled review sheet imported: the human-review figures are null, never estimated "
            "(fill O/private/extraction/review.html, export the sheet, run audit.py O --review SHEET)",
}


def data_label(ctx):
    return ctx.data.id


def utc_now():
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


# ---- 1. the pre-registered audit sample (no model, no text, no output) ------------------------------------------

def preregistration(ctx, rows, idx_list, limit=None):
    """The audit sample and everything needed to recompute it, as the exact bytes written to O/. `limit`: the
    --limit block when idx_list is the first N items of the selection (the sample's population is then those N)."""
    config = ctx.config
    labels = config["extraction_labels"]
    idx_labels = [(i, rows[i]["label"]) for i in idx_list]
    sample = choose_audit_sample(idx_labels, config["extraction_audit_salt"], config["extraction_audit_per_class"])
    for s in sample:
        s["label_name"] = labels[s["label"]]
        s["sentence_sha256"] = sha256_text(rows[s["idx"]]["sentence"])
    return {
        "format": "extraction-audit-sample/v1", "experiment": NAME, "split": ctx.split,
        FORMAT_KEY: EVIDENCE_FORMAT,     # in the dict, not added on writing: config.json restates it whole
        "rule": AUDIT_RULE, "salt": config["extraction_audit_salt"],
        "per_class": config["extraction_audit_per_class"],
        "population": {"data": ctx.data.id, "data_content_sha256": ctx.data.content_sha256,
                       "item_idx": list(idx_list), "labels": [l for _, l in idx_labels],
                       **({"limit": limit} if limit is not None else {})},
        "class_weights": class_weights(idx_labels, sample),
        "weighted_estimate_rule": config["extraction_weighted_estimate_rule"],
        "items": sample,
        "created_at_utc": utc_now(),
        "created_before": "the model and tokenizer are loaded and any text is generated",
    }


def prereg_text(prereg):
    return json.dumps(prereg, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_preregistration(out, prereg):
    text = prereg_text(prereg)
    path = Path(out) / PREREGISTRATION_FILE
    resources.atomic_write_text(path, text)
    if path.read_text(encoding="utf-8") != text:
        raise IdentityMismatch("the pre-registration file does not read back as written",
                               [(None, str(path), "written", "read back differently")])
    return path, sha256_text(text)


def earliest_preregistration(shard_samples, mine):
    """parallel.agreed's pick at a merge: the shards' samples must be the one this selection gives (`mine`) but for
    the time each was written; the earliest is taken (each shard wrote its own before its own generation, so the
    earliest precedes every shard's generation)."""
    def content(p):
        return {k: v for k, v in p.items() if k != "created_at_utc"} if isinstance(p, dict) else p

    for label, sample in shard_samples:
        if content(sample) != content(mine):
            raise resources.ResourceError(f"--merge: {label}: its pre-registered extraction audit sample is not the "
                                          "one this selection gives; shards of one run only")
    return min((s for _, s in shard_samples), key=lambda s: s["created_at_utc"])


def preregister(ctx, prereg):
    """(path, sha256) of the sample written to O/ by the writing process (rank 0 of a distributed run; its error
    stops every rank with the same line)."""
    path = Path(ctx.options.out) / PREREGISTRATION_FILE
    plan = parallel.plan_of(ctx)
    if plan.mode != "distributed":
        return write_preregistration(ctx.options.out, prereg)
    error = None
    if parallel.is_writer(plan):
        try:
            write_preregistration(ctx.options.out, prereg)
        except (OSError, IdentityMismatch) as e:
            error = str(e)
    error = parallel.broadcast(plan, error)
    if error:
        raise resources.ResourceError(f"{path}: the pre-registration could not be written on rank 0 ({error})")
    return path, sha256_text(prereg_text(prereg))


# ---- 2. prompts and generation -----------------------------------------------------------------------------------

def render_prompt(tokenizer, user_message):
    """SmolLM2's chat template with its default system message, ending with the assistant turn header."""
    return tokenizer.apply_chat_template([{"role": "user", "content": user_message}], tokenize=False,
                                         add_generation_prompt=True)


def build_items(rows, idx_list, config, tokenizer):
    items = []
    for rank, idx in enumerate(idx_list):
        row = rows[idx]
        # str.replace, not str.format: a brace in a review must not be interpreted
        user = config["extraction_user_prompt"].replace("{sentence}", row["sentence"])
        prompt = render_prompt(tokenizer, user)
        ids = scoring.encode_text(tokenizer, prompt)   # the tokenizer's own leading special tokens, if any
        scoring.check_length(len(ids), config["max_input_tokens"], f"idx {idx}")
        items.append({"idx": idx, "rank": rank, "label": row["label"],
                      "label_name": config["extraction_labels"][row["label"]], "sentence": row["sentence"],
                      "user_message": user, "prompt": prompt, "input_ids": ids})
    return items


@torch.no_grad()
def greedy_generate(model, input_ids, max_new_tokens, eos_id):
    """model.generate, greedy (do_sample=False, one beam), no padding; returns the new token ids only."""
    from transformers import GenerationConfig

    gen = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, eos_token_id=eos_id,
                           pad_token_id=eos_id, bos_token_id=model.generation_config.bos_token_id)
    inp = torch.tensor([input_ids], dtype=torch.long, device=model.device)
    out = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gen)
    new = out[0, len(input_ids):].tolist()
    if out[0, :len(input_ids)].tolist() != list(input_ids):
        raise scoring.ScoringError("model.generate returned a sequence that does not start with the input")
    return new


def finish_reason(new_ids, eos_id, max_new_tokens, where):
    if eos_id in new_ids[:-1]:
        raise scoring.ScoringError(f"{where}: eos inside the generation, not at its end")
    if new_ids and new_ids[-1] == eos_id:
        return "eos"
    if len(new_ids) == max_new_tokens:
        return "length"
    raise scoring.ScoringError(f"{where}: generation of {len(new_ids)} tokens ended without eos before the limit")


def generate_all(ctx, items):
    """Greedy generation of every item, data parallel through parallel.shard_map (by idx); each item gets its
    finish_reason, generated_ids and generation. Returns the generation meta (its time window spans every part)."""
    per_item, meta = parallel.shard_map(ctx, "independent", items, lambda part: generate_part(ctx, part),
                                        combine=generation_window)
    for it in returned(ctx, items, per_item):
        it.update(per_item[it["idx"]])
    return meta


def returned(ctx, items, per_item):
    """The items shard_map gave results for: every one, except under --shard K/N (the shard's own part; the
    experiment ends at parallel.scoring_done, before anything reads the rest)."""
    return [it for it in items if it["idx"] in per_item] if parallel.plan_of(ctx).mode == "shard" else items


def generation_window(metas, per_item):
    """A shard_map combine: the first part's meta, generation started at the earliest part's start and finished at
    the latest part's end."""
    return {**metas[0], "generation_started_utc": min(m["generation_started_utc"] for m in metas),
            "generation_finished_utc": max(m["generation_finished_utc"] for m in metas)}


def generate_part(ctx, items):
    """({idx: {finish_reason, generated_ids, generation}}, meta) of these items, one model load."""
    config, stages = ctx.config, ctx.stages
    n_new = config["extraction_max_new_tokens"]
    model, tokenizer = two_paths.load_independent_model(ctx, "model_load")
    eos_id = tokenizer.eos_token_id
    started = utc_now()
    out = {}
    with stages.stage("generate"):
        for it in tqdm(items, desc="greedy generation", unit="item"):
            new = greedy_generate(model, it["input_ids"], n_new, eos_id)
            reason = finish_reason(new, eos_id, n_new, f"idx {it['idx']}")
            text_ids = new[:-1] if reason == "eos" else new
            out[it["idx"]] = {"finish_reason": reason, "generated_ids": new,
                              "generation": tokenizer.decode(text_ids, skip_special_tokens=False)}
    meta = {**two_paths.model_facts(model, tokenizer), "eos_token_id": eos_id,
            "eos_token": tokenizer.convert_ids_to_tokens(eos_id),
            "generate_call": {"do_sample": False, "num_beams": 1, "max_new_tokens": n_new, "eos_token_id": eos_id,
                              "pad_token_id": eos_id, "attention_mask": "all ones (one sequence, no padding)"},
            "decode": "tokenizer.decode(new ids without the final eos, skip_special_tokens=False)",
            "generation_started_utc": started, "generation_finished_utc": utc_now()}
    del model
    return out, meta


# ---- 3. the official path: lm-eval's generate_until and filters ---------------------------------------------------

def lm_eval_generate_until(ctx, items):
    """(texts, encodings, meta) of HFLM.generate_until on every item, data parallel through parallel.shard_map (by
    idx; each rank drives its own single-process HFLM on its part)."""
    per_item, meta = parallel.shard_map(ctx, "official", items,
                                        lambda part: lm_eval_generate_part(ctx, part))
    mine = returned(ctx, items, per_item)
    return [per_item[it["idx"]][0] for it in mine], [per_item[it["idx"]][1] for it in mine], meta


def lm_eval_generate_part(ctx, items):
    """HFLM.generate_until on the same chat-rendered contexts, `until` empty so only eos stops it:
    ({idx: [text, input ids]}, meta).

    max_length = max_input_tokens + max_new_tokens, so HFLM's left truncation (to max_length - max_gen_toks) can
    never cut an admissible input."""
    config, stages = ctx.config, ctx.stages
    n_new = config["extraction_max_new_tokens"]
    settings = {"pretrained": str(ctx.inputs.model_dir), "device": config["device"], "dtype": config["dtype"],
                "batch_size": config["batch_size"], "max_length": config["max_input_tokens"] + n_new,
                "attn_implementation": config["attn_implementation"]}
    with stages.stage("lm_eval_model_load"), parallel.one_process_lm_eval():
        lm = official.make_hflm(settings)
    if lm.world_size != 1:
        raise resources.ResourceError(f"lm-eval's HFLM runs as rank {lm.rank} of {lm.world_size} processes itself; "
                                      "this repository drives one single-process HFLM per rank")
    gen_kwargs = {"until": [], "max_gen_toks": n_new, "do_sample": False}
    with stages.stage("lm_eval_generate_until"):
        texts, encodings = official.generate_until(lm, [it["prompt"] for it in items], gen_kwargs)
    meta = {"hflm": settings, "gen_kwargs": gen_kwargs, "model_dtype": str(lm.model.dtype),
            "torch_threads": torch.get_num_threads(),
            "stop_sequences": "until=[] -> lm-eval adds the eos string, so only eos (or the length limit) stops it"}
    del lm
    return {it["idx"]: [t, e] for it, t, e in zip(items, texts, encodings)}, meta


def lm_eval_filter_config(config):
    """The task-YAML filter_list entry this experiment's official extraction is, in lm-eval's own terms."""
    return {"name": "extract", "filter": [
        {"function": "regex", "regex_pattern": config["extraction_regex"], "group_select": 0,
         "fallback": config["extraction_regex_fallback"]},
        {"function": "take_first"}]}


def lm_eval_extract(config, texts):
    """lm-eval's RegexFilter then TakeFirstFilter (official.apply_filters) on each generation."""
    return official.apply_filters(lm_eval_filter_config(config), texts)


# ---- 4. scoring, paired tables, failure categories ----------------------------------------------------------------

def score_item(it, official_extraction, labels, fallback):
    text, label = it["generation"], it["label_name"]
    strict = extraction_scorers.strict_scores(text, label, labels)
    matches = extraction_scorers.regex_matches(text)
    independent = extraction_scorers.regex_extract(text, fallback)
    pred = extraction_scorers.regex_prediction(official_extraction, labels, fallback)
    return {
        "exact": {"correct": extraction_scorers.exact_correct(text, label)},
        "strict": strict,
        "regex": {"official": official_extraction, "independent": independent, "n_matches": len(matches),
                  "pred": pred, "correct": int(pred == label)},
        "categories": extraction_scorers.categories(text, it["finish_reason"], strict["reason"]),
    }


def paired(records, a, b):
    ra = {r["idx"]: r[a]["correct"] for r in records}
    rb = {r["idx"]: r[b]["correct"] for r in records}
    idx = [r["idx"] for r in records]
    return {"a": a, "b": b,
            "both_correct": sum(ra[i] and rb[i] for i in idx), "neither": sum(not ra[i] and not rb[i] for i in idx),
            "only_a": sum(ra[i] and not rb[i] for i in idx), "only_b": sum(rb[i] and not ra[i] for i in idx),
            "only_a_idx": [i for i in idx if ra[i] and not rb[i]],
            "only_b_idx": [i for i in idx if rb[i] and not ra[i]]}


def pattern_table(records):
    """Items per (exact, strict, regex) correctness pattern, e.g. '001' = only regex counts it right."""
    table = {}
    for r in records:
        key = "".join(str(r[s]["correct"]) for s in SCORERS)
        table.setdefault(key, []).append(r["idx"])
    return {k: {"n": len(v), "idx": v} for k, v in sorted(table.items())}


def summarise(records, split, config, lm_eval_meta, prereg, prereg_sha):
    n = len(records)
    labels = config["extraction_labels"]
    counts = {str(k): sum(r["label"] == k for r in records) for k in range(len(labels))}
    reasons = {k: sum(r["strict"]["reason"] == k for r in records) for k in extraction_scorers.STRICT_REASONS}
    cats = {k: sum(r["categories"][k] for r in records) for k in
            ("no_match", "several_matches", "conflicting_matches", "format_failure", "length_stop")}
    # failure categories among the items the regex scorer counts wrong / right
    cats_wrong = {k: sum(r["categories"][k] for r in records if not r["regex"]["correct"]) for k in cats}
    cats_right = {k: sum(r["categories"][k] for r in records if r["regex"]["correct"]) for k in cats}
    preds = [r["regex"]["pred"] for r in records]
    gen = {"n_compared": n, "n_identical": sum(r["lm_eval_generate_until"]["identical"] for r in records),
           "n_input_ids_identical": sum(r["lm_eval_generate_until"]["input_ids_identical"] for r in records)}
    gen["all_identical"] = gen["n_identical"] == n and gen["n_input_ids_identical"] == n
    gen["mismatch_idx"] = [r["idx"] for r in records if not r["lm_eval_generate_until"]["identical"]]
    return {
        "experiment": NAME, "split": split, "confirmation_items_scored": confirmation_items_scored(split),
        "n_items": n,
        "label_counts": counts,
        # answering one label every time, scored like the regex scorer: what "correct" means without reading
        "constant_answer_baselines": {f"always_{l}": sum(r["label_name"] == l for r in records) for l in labels},
        "scorers": {
            "exact": {"correct": sum(r["exact"]["correct"] for r in records),
                      "accuracy": sum(r["exact"]["correct"] for r in records) / n},
            "strict": {"correct": sum(r["strict"]["correct"] for r in records),
                       "accuracy": sum(r["strict"]["correct"] for r in records) / n,
                       "format_ok": sum(r["strict"]["format_ok"] for r in records), "reasons": reasons},
            "regex": {"correct": sum(r["regex"]["correct"] for r in records),
                      "accuracy": sum(r["regex"]["correct"] for r in records) / n,
                      "pred_counts": {**{l: preds.count(l) for l in labels}, "none": preds.count(None)}},
        },
        "paired": {f"{a}_vs_{b}": paired(records, a, b) for a, b in PAIRS},
        "patterns": pattern_table(records),
        "match_failures": {"all": cats, "regex_wrong": cats_wrong, "regex_right": cats_right},
        "finish_reasons": {k: sum(r["finish_reason"] == k for r in records) for k in ("eos", "length")},
        "regex_agreement": {"n_items": n, "n_mismatches": sum(r["regex"]["official"] != r["regex"]["independent"]
                                                               for r in records)},
        "lm_eval_generate_until": {**gen, "ran": lm_eval_meta is not None} if lm_eval_meta is not None
        else {"ran": False, "n_compared": 0, "n_identical": None, "n_input_ids_identical": None,
              "all_identical": None, "mismatch_idx": []},
        "audit_sample": {"preregistration_sha256": prereg_sha, "n": len(prereg["items"]),
                         "idx": [s["idx"] for s in prereg["items"]],
                         "per_class": {str(k): sum(s["label"] == k for s in prereg["items"])
                                       for k in range(len(labels))}},
        "human_review": dict(HUMAN_REVIEW_NULL),
        "uncertainty": uncertainty(records),
    }



def uncertainty(records):
    """summary["uncertainty"]: a Wilson interval for each scorer's accuracy; each pair of scorers paired on the
    same generations (Newcombe interval of the difference, exact McNemar; the counts are paired[...]'s)."""
    n = len(records)
    right = {s: [bool(r[s]["correct"]) for r in records] for s in SCORERS}
    return stats.uncertainty_block(
        {f"scorers/{s}/accuracy": (sum(right[s]), n) for s in SCORERS},
        {f"{a}_vs_{b}": (f"scorers.{a}.accuracy", f"scorers.{b}.accuracy", list(zip(right[a], right[b])))
         for a, b in PAIRS})


def headline(s):
    sc, n = s["scorers"], s["n_items"]
    g = s["lm_eval_generate_until"]
    gen = (f"lm-eval generate_until identical on {g['n_identical']}/{n}" if g["ran"]
           else "lm-eval generate_until cross-check not run")
    return (f"{n} items: exact {sc['exact']['correct']}/{n}, strict JSON {sc['strict']['correct']}/{n}, regex "
            f"{sc['regex']['correct']}/{n} (official = independent on {n - s['regex_agreement']['n_mismatches']}/{n}); "
            f"{gen}; {s['finish_reasons']['length']} length stops; audit sample of {s['audit_sample']['n']} "
            "pre-registered; human review: no sheet (figures null)")


# ---- the experiment ------------------------------------------------------------------------------------------------

def score_all(config, items, lm_texts, lm_enc, prereg):
    """(public records, private rows) of every item; the official and the independent regex extraction must agree
    on every item (IdentityMismatch otherwise). lm_texts/lm_enc are None when the lm-eval cross-check did not run."""
    labels, fallback = config["extraction_labels"], config["extraction_regex_fallback"]
    official_extractions = lm_eval_extract(config, [it["generation"] for it in items])
    records, private_rows, bad = [], [], []
    for k, it in enumerate(items):
        sc = score_item(it, official_extractions[k], labels, fallback)
        if sc["regex"]["official"] != sc["regex"]["independent"]:
            bad.append((it["idx"], "regex extraction", sc["regex"]["official"], sc["regex"]["independent"]))
        lm = ({"identical": lm_texts[k] == it["generation"], "text_sha256": sha256_text(lm_texts[k]),
               "input_ids_identical": lm_enc[k] == it["input_ids"]} if lm_texts is not None else
              {"identical": None, "text_sha256": None, "input_ids_identical": None})
        in_sample = next((s["position"] for s in prereg["items"] if s["idx"] == it["idx"]), None)
        records.append({
            "idx": it["idx"], "rank": it["rank"], "label": it["label"], "label_name": it["label_name"],
            "sentence_sha256": sha256_text(it["sentence"]), "user_message_sha256": sha256_text(it["user_message"]),
            "prompt_sha256": sha256_text(it["prompt"]), "input_tokens": len(it["input_ids"]),
            "generated_tokens": len(it["generated_ids"]), "finish_reason": it["finish_reason"],
            "generation_sha256": sha256_text(it["generation"]),
            "generated_ids_sha256": sha256_text(json.dumps(it["generated_ids"])),
            **sc, "lm_eval_generate_until": lm, "audit_position": in_sample,
        })
        private_rows.append({"idx": it["idx"], "sentence": it["sentence"], "user_message": it["user_message"],
                             "prompt": it["prompt"], "generation": it["generation"],
                             "generated_ids": it["generated_ids"],
                             "lm_eval_generation": lm_texts[k] if lm_texts is not None else None})
    if bad:
        raise IdentityMismatch(f"{len(bad)} items: lm-eval's RegexFilter+TakeFirstFilter and the independent "
                               "regex extraction differ", bad)
    return records, private_rows


def review_page(ctx, items, prereg, prereg_sha):
    """The review page of the pre-registered sample: the review, the label, the full answer; no scores."""
    by_idx = {it["idx"]: it for it in items}
    review_items = [{"position": s["position"], "idx": s["idx"], "label_name": s["label_name"],
                     "sentence": by_idx[s["idx"]]["sentence"], "answer": by_idx[s["idx"]]["generation"],
                     "finish_reason": by_idx[s["idx"]]["finish_reason"],
                     "generated_tokens": len(by_idx[s["idx"]]["generated_ids"]),
                     "sentence_sha256": s["sentence_sha256"],
                     "answer_sha256": sha256_text(by_idx[s["idx"]]["generation"])} for s in prereg["items"]]
    return build_review_page(review_items, {"experiment": NAME, "split": ctx.split,
                                            "preregistration_sha256": prereg_sha,
                                            "max_new_tokens": ctx.config["extraction_max_new_tokens"],
                                            "labels": ctx.config["extraction_labels"]})


def config_of(ctx, rows, idx_list, prereg, prereg_sha, chat_template, gen_meta, lm_meta):
    config = ctx.config
    labels = config["extraction_labels"]
    return {
        **config_head(ctx, NAME, len(rows), idx_list),
        "audit_sample": {"preregistration_file": PREREGISTRATION_FILE, "preregistration_sha256": prereg_sha,
                         "preregistration": prereg},
        "prompt": {"user_template": config["extraction_user_prompt"],
                   "chat_template_sha256": sha256_text(chat_template),
                   "chat_template": "the tokenizer's own (SmolLM2; its default system message), "
                                    "add_generation_prompt=True",
                   "tokenisation": "scoring.encode_text: the tokenizer's own leading special tokens (none for "
                                   "SmolLM2) + tokenizer(prompt, add_special_tokens=False)"},
        "scorers": {"exact": "strip(output) == json.dumps({'sentiment': label})",
                    "exact_reference_example": extraction_scorers.canonical_answer(labels[1]),
                    "strict": "json.loads(whole output): object, exactly one key 'sentiment', no duplicate keys, "
                              "value 'positive'|'negative' (lowercase), equal to the label",
                    "strict_reasons": list(extraction_scorers.STRICT_REASONS),
                    "regex": "lm-eval RegexFilter(first match, group_select 0, fallback) + TakeFirstFilter; "
                             "prediction = match lowercased; independent re-implementation must agree"},
        "generation": gen_meta,
        "official": {"lm_eval_version": official.version(), "filter_list": [lm_eval_filter_config(config)],
                     "generate_until": lm_meta,
                     "lm_eval_files_sha256": {rel: hashlib.sha256((official.LM_EVAL_DIR / rel).read_bytes())
                                              .hexdigest() for rel in LM_EVAL_FILES}},
    }


def generate_and_crosscheck(ctx, rows, idx_list):
    """(items with their generations, chat template, generation meta, lm-eval texts, encodings and meta)."""
    from adapter import load_tokenizer

    config = ctx.config
    with ctx.stages.stage("prompts"):
        tokenizer = load_tokenizer(ctx.inputs.model_dir)
        items = build_items(rows, idx_list, config, tokenizer)
    gen_meta = generate_all(ctx, items)
    lm_texts, lm_enc, lm_meta = None, None, None
    if config["extraction_crosscheck_lm_eval"]:
        lm_texts, lm_enc, lm_meta = lm_eval_generate_until(ctx, items)
        two_paths.check_same_loading(lm_meta, gen_meta, ("model_dtype", "torch_threads"),
                                     "transformers and lm-eval generated with different settings")
    return items, tokenizer.chat_template, gen_meta, lm_texts, lm_enc, lm_meta


def run(ctx):
    config, stages = ctx.config, ctx.stages
    if parallel.plan_of(ctx).mode != "single" and not config["extraction_crosscheck_lm_eval"]:
        raise resources.ResourceError("extraction_crosscheck_lm_eval is off: a data-parallel extraction run needs "
                                      "both paths (the audit checks each one's items per rank); run it in one process")
    with stages.stage("selection"):
        rows = load_rows(ctx.data.parquet_path)
        # --limit first: the audit sample below is drawn from the items that are scored
        idx_list, limit = limited_selection(ctx, select_items(config, ctx.split, len(rows)))
    # The audit sample is chosen and written now: nothing model-related exists yet in this process's run.
    with stages.stage("audit_sample_preregistration"):
        prereg = parallel.agreed(ctx, "preregistration", preregistration(ctx, rows, idx_list, limit),
                                 earliest_preregistration)
        prereg_path, prereg_sha = preregister(ctx, prereg)

    items, chat_template, gen_meta, lm_texts, lm_enc, lm_meta = generate_and_crosscheck(ctx, rows, idx_list)
    parallel.scoring_done(ctx)
    with stages.stage("score"):
        records, private_rows = score_all(config, items, lm_texts, lm_enc, prereg)
        summary = summarise(records, ctx.split, config, lm_meta, prereg, prereg_sha)
    with stages.stage("review_page"):
        page = review_page(ctx, items, prereg, prereg_sha)

    # read back by the process that wrote it (rank 0 of a distributed run), its verdict shared by every rank
    plan = parallel.plan_of(ctx)
    if parallel.broadcast(plan, parallel.is_writer(plan)
                          and prereg_path.read_text(encoding="utf-8") != prereg_text(prereg)):
        raise IdentityMismatch("the pre-registration file changed during the run",
                               [(None, str(prereg_path), prereg_sha, "changed")])
    in_tok = [len(it["input_ids"]) for it in items]
    gen_tok = [len(it["generated_ids"]) for it in items]
    stats = {"input_tokens": two_paths.span(in_tok),
             "generated_tokens": {**two_paths.span(gen_tok), "includes_eos": True}, "n_items": len(items)}
    config_out = config_of(ctx, rows, idx_list, prereg, prereg_sha, chat_template, gen_meta, lm_meta)
    line = with_limit(limit, summary, config_out, headline(summary))
    return Result(config=config_out,
                  records=records, summary=summary, token_stats=stats,
                  private={"generations.jsonl": jsonl(private_rows), "review.html": page},
                  headline=line, prompt_template_sha256=sha256_text(config["extraction_user_prompt"]))
