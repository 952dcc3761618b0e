"""The protocol experiment's rule: SST-2 zero-shot multiple choice, scored by lm-eval (official) and by the
independent path, item for item.

What is particular to it: the prompt template and choices, the official task lm-eval ran (dumped into config.json),
the lm-eval indices, the candidates (delimiter + choice, starting where the context ends), predictions with the
first-index tie rule on both paths, lm-eval's per-item acc, the per-candidate agreement, the prompt hash join,
lm-eval's doc_hash at the identity level, and the run.py --fast figures. Everything else (required files, config and
identity consistency, environment.json, record shape, selection rule, summary comparison, stage timings, the token,
data and forward levels) is a shared group. Nothing recorded is trusted as an input except the per-candidate scores,
labels and token lists, which the deeper levels check in turn.
"""
from evidence_audit.checks import ARITHMETIC, MISSING, expect, get, short
from evidence_audit import uncertainty
from evidence_audit.definitions import argmax_first, confirmation_scored, is_int, is_sha, lm_eval_doc_hash
from evidence_audit.fast_mode import fast_expected
from evidence_audit.forward import two_path_forward
from evidence_audit.model_files import expected_agreement_claim
from evidence_audit.reading import sha256_text
from evidence_audit.shared import (abs_diff_problems, batching_check, both_paths_pred_problems, candidate_problems,
                                   candidate_token_counts, config_block, dtype_check, environment_check,
                                   hash_selection_problems, identity_problems, identity_with_whole_batches,
                                   limit_note, limited_hash_selection, model_problems, rank_order_problems,
                                   record_scores,
                                   record_shape_check, required_files, restated_problems, run_levels, split_note,
                                   split_problems, stages_check, summary_check, two_path_shape)
from evidence_audit.tokens import multiple_choice_identity, private_texts_check, sst2_data_check

SHAPE = two_path_shape({"idx": is_int, "rank": is_int, "label": is_int, "sentence_sha256": is_sha,
                        "prompt_sha256": is_sha},
                       optional={"fast": None})       # run.py --fast: checked by fast_mode.fast_expected
# identity fields run.py claims to have joined on -> the audit check that re-verifies each one
IDENTITY_FIELD_RULES = {
    "doc_id": "arithmetic/selection (official.doc_id == idx)",
    "doc.idx": "identity/private texts (doc_hash recomputed from idx, label, sentence)",
    "label": "identity/private texts (doc_hash) and identity/data (parquet label)",
    "target": "arithmetic/correctness (lm-eval acc recomputed against the label)",
    "sentence_sha256": "identity/private texts and identity/data",
    "prompt_sha256": "arithmetic/prompt hashes and identity/private texts",
    "candidate texts": "arithmetic/candidates",
    "candidate token ids and start": "identity/tokenisation",
}
PRIVATE_TEXTS = "private texts (sentence/prompt hashes, prompt from template, doc_hash)"
DATA_PARQUET = "data parquet (n_rows, content hash, sentence and label per idx)"


def audit_protocol(C, name, out, levels, cache):
    return run_levels(C, name, out, levels, cache, audit_protocol_arithmetic,
                      identity_with_whole_batches(audit_protocol_identity),
                      two_path_forward)


# ---- level 1, arithmetic -------------------------------------------------------------------------------------------

def audit_protocol_arithmetic(C, name, ev):
    """Level 1. Returns the validated records, or None when they cannot be trusted enough for deeper levels."""
    if not required_files(C, name, ev):
        for check in ("config", "selection", "records", "predictions", "summary", "stages"):
            C.skip(name, ARITHMETIC, check, "config.json or records.jsonl missing; nothing to recompute from")
        return None
    choices, delim = config_check(C, name, ev)
    environment_check(C, name, ev)
    records = ev["records"]
    if not record_shape_check(C, name, records, SHAPE, lambda i, r: f"idx {r.get('idx', '?')}", len(choices)):
        for check in ("selection", "candidates", "predictions", "correctness", "agreement", "prompt hashes",
                      "summary", "stages"):
            C.skip(name, ARITHMETIC, check, "records.jsonl has malformed records (see 'record fields and types')")
        return None
    selection_check(C, name, ev, records, choices)
    candidates_check(C, name, config_block(ev["config"]), records, choices, delim)
    predictions_checks(C, name, records)
    summary_values_check(C, name, ev, records, choices)
    batching_check(C, name, ev["config"], records)
    dtype_check(C, name, ev["config"], record_scores(records))
    stages_check(C, name, ev, candidate_token_counts(records), len(records))
    return records


def config_check(C, name, ev):
    """Row "config consistency (...)": the shared config and identity groups, and what the protocol claims about
    its prompt and the official task. Returns the (usable) choices and target delimiter."""
    cfg, bad = ev["config"], []
    conf = config_block(cfg)
    split = split_problems(bad, name, cfg)
    hash_selection_problems(bad, cfg)
    model_problems(bad, cfg)
    prompt_t, choices, delim = conf.get("sst2_prompt"), conf.get("sst2_choices"), conf.get("target_delimiter")
    if not (isinstance(prompt_t, str) and prompt_t.count("{sentence}") == 1):
        bad.append(f"config.json config.sst2_prompt: {short(prompt_t)} must contain '{{sentence}}' once")
    if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) for c in choices)):
        bad.append(f"config.json config.sst2_choices: {short(choices)} is not a list of >= 2 strings")
        choices = ["negative", "positive"]
    if not isinstance(delim, str):
        bad.append(f"config.json config.target_delimiter: {short(delim)} is not a string")
        delim = " "
    official_task_problems(bad, cfg, prompt_t, choices, delim)
    if ev["identity"] is not None:
        identity_problems(bad, name, cfg, ev["identity"],
                          sha256_text(prompt_t) if isinstance(prompt_t, str) else None)
    restated_problems(bad, ev, split, confirmation_scored(split))
    C.add(name, ARITHMETIC, "config consistency (split, selection, official task, identity.json)", 1, bad,
          note=split_note(split))
    return choices, delim


def official_task_problems(bad, cfg, prompt_t, choices, delim):
    """The official task lm-eval actually ran (dumped by run.py) must be the protocol these rules recompute."""
    conf = config_block(cfg)
    dumped = get(cfg, "official.dumped_task_config")
    if not isinstance(dumped, dict):
        bad.append("config.json official.dumped_task_config: missing")
        dumped = {}
    for k, want in (("doc_to_text", prompt_t.replace("{sentence}", "{{sentence}}") if isinstance(prompt_t, str)
                     else MISSING), ("doc_to_choice", choices), ("target_delimiter", delim),
                    ("num_fewshot", conf.get("num_fewshot", MISSING)), ("output_type", "multiple_choice"),
                    ("doc_to_target", "label"), ("metric_list", [{"metric": "acc"}])):
        expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), want)
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot protocol")


def selection_check(C, name, ev, records, choices):
    """Row "item selection (...)": the hash rule recomputed from config.json, cut to the first N under --limit N
    (limited_hash_selection: the limit is the recorded command line's); records are exactly those idx in rank
    order; each doc_id is its idx; lm-eval was given exactly those idx, sorted."""
    cfg, idx_list, bad = ev["config"], [r["idx"] for r in records], []
    want, why, settings, limit = limited_hash_selection(bad, ev)
    if want is None:
        bad.append(f"config.json selection: {why} ({settings})")
    else:
        bad += rank_order_problems(idx_list, want, settings)
        expect(bad, "config.json", "selection.item_idx", get(cfg, "selection.item_idx"), want, settings)
    for rank, r in enumerate(records):
        expect(bad, f"idx {r['idx']}", "rank", r["rank"], rank, "line position in records.jsonl")
        expect(bad, f"idx {r['idx']}", "official.doc_id", r["official"]["doc_id"], r["idx"])
        if not (0 <= r["label"] < len(choices)):
            bad.append(f"idx {r['idx']} label: {r['label']} is not a choice index 0..{len(choices) - 1}")
    passed = get(cfg, "official.indices_passed_to_lm_eval")
    if not (isinstance(passed, list) and sorted(passed, key=str) == sorted(idx_list, key=str)):
        bad.append(f"config.json official.indices_passed_to_lm_eval: {short(passed)} is not the set of record idx")
    else:
        expect(bad, "config.json", "official.indices_sorted", get(cfg, "official.indices_sorted"),
               passed == sorted(passed))
        if passed != sorted(passed):
            bad.append("config.json official.indices_passed_to_lm_eval: unsorted; lm-eval 0.4.9.2 then labels "
                       "logged samples with the wrong doc_id, so these scores cannot be joined to items")
    C.add(name, ARITHMETIC, "item selection (hash rule, rank order, --limit, doc_id, lm-eval indices)", len(records),
          bad, note=limit_note(limit))


def candidates_check(C, name, conf, records, choices, delim):
    """Row "candidates (...)": texts are the protocol's choices, each starts where the context ends, no input is
    over the length limit."""
    C.add(name, ARITHMETIC, "candidates (texts, start == context_tokens, length limit)", len(records),
          candidate_problems(records, choices, delim, conf.get("max_input_tokens")))


def predictions_checks(C, name, records):
    """Rows for predictions, correctness, agreement and prompt hashes, each recomputed from the score lists and
    labels (never from a recorded prediction)."""
    correct, hashes = [], []
    for r in records:
        w, off, ind = f"idx {r['idx']}", r["official"], r["independent"]
        off_pred, ind_pred = argmax_first(off["scores"]), argmax_first(ind["scores"])
        expect(correct, w, "independent.correct", ind["correct"], int(ind_pred == r["label"]),
               f"label {r['label']}, recomputed pred {ind_pred}")
        expect(correct, w, "official.acc", off["acc"], float(off_pred == r["label"]),
               f"lm-eval acc: label {r['label']}, recomputed official pred {off_pred}")
        expect(hashes, w, "official.prompt_hash", off["prompt_hash"], r["prompt_sha256"],
               "lm-eval's hash of the prompt it scored must equal prompt_sha256")
    n = len(records)
    C.add(name, ARITHMETIC, "predictions, both paths (argmax, first index wins ties)", n,
          both_paths_pred_problems(records))
    C.add(name, ARITHMETIC, "correctness (independent.correct, lm-eval per-item acc)", n, correct)
    C.add(name, ARITHMETIC, "agreement per candidate (abs_diff from the score lists)", n, abs_diff_problems(records))
    C.add(name, ARITHMETIC, "prompt hashes (official.prompt_hash == prompt_sha256)", n, hashes)


def expected_summary(name, split, records, choices, reported, identity_fields, recorded_uncertainty=None):
    """summary.json as the records say it must be (without the --fast block); `recorded_uncertainty` is summary.json's
    uncertainty block, whose floats are taken when they match the recomputed ones within uncertainty.TOL."""
    n = len(records)
    labels = [r["label"] for r in records]
    counts = {k: labels.count(k) for k in range(len(choices))}
    majority = max(range(len(choices)), key=lambda k: (counts[k], -k))    # ties -> the lower label
    ind_preds = [argmax_first(r["independent"]["scores"]) for r in records]
    off_preds = [argmax_first(r["official"]["scores"]) for r in records]
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]

    def side(preds):
        correct = sum(int(p == l) for p, l in zip(preds, labels))
        return {"correct": correct, "accuracy": correct / n if n else MISSING,
                "pred_counts": {str(k): preds.count(k) for k in range(len(choices))}}

    return {
        "experiment": name, "split": split, "confirmation_items_scored": confirmation_scored(split),
        "n_items": n, "n_candidates": len(diffs), "label_counts": {str(k): v for k, v in counts.items()},
        "official": {**side(off_preds), "lm_eval_reported_acc": reported},
        "independent": side(ind_preds),
        "constant_class_baseline": {"label": majority, "accuracy": counts[majority] / n if n else MISSING},
        "agreement": {"max_abs_diff": max(diffs) if diffs else MISSING,
                      "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(a != b for a, b in zip(off_preds, ind_preds))},
        "identity_checks": {"passed": True, "n_samples_joined": n, "fields": identity_fields},
        "uncertainty": protocol_uncertainty(recorded_uncertainty, labels, off_preds, ind_preds, majority),
    }


def protocol_uncertainty(recorded, labels, off_preds, ind_preds, majority):
    """summary.json uncertainty: Wilson intervals of both paths and of the constant-class baseline; each path
    paired with that baseline (Newcombe difference interval, exact McNemar), from the recomputed predictions."""
    right = {"official": [int(p == l) for p, l in zip(off_preds, labels)],
             "independent": [int(p == l) for p, l in zip(ind_preds, labels)]}
    base = [int(l == majority) for l in labels]
    n = len(labels)
    accuracies = {f"{side}/accuracy": (sum(right[side]), n) for side in right}
    accuracies["constant_class_baseline/accuracy"] = (sum(base), n)
    paired = {f"{side}_vs_constant_class": (f"{side}.accuracy", "constant_class_baseline.accuracy", right[side], base)
              for side in right}
    return uncertainty.expected_block(recorded, accuracies, paired)


def summary_values_check(C, name, ev, records, choices):
    """Row "summary.json values (...)" (after the --fast records row when the run used --fast): summary.json
    rebuilt from the records, and lm-eval's own aggregate (the mean of its per-item acc)."""
    cfg, summ = ev["config"], ev["summary"]
    reported = get(cfg, "official.reported_acc")
    expected = expected_summary(name, cfg.get("split"), records, choices, reported,
                                get(summ, "identity_checks.fields") if summ is not None else MISSING,
                                get(summ, "uncertainty") if summ is not None else None)
    if summ is not None and ("fast" in summ or any("fast" in r for r in records)):
        expected["fast"] = fast_expected(summ.get("fast"), records, C, name)
    limit = limited_hash_selection([], ev)[3]      # its problems are the selection row's
    if limit is not None:
        expected["limit"] = limit
    conf = config_block(cfg)
    if (summ is not None and "agreement_claim" in summ) or (conf.get("device"), conf.get("dtype")) != ("cpu",
                                                                                                     "float32"):
        agree = expected["agreement"]           # evidence before the claim existed was cpu float32, exact
        expected["agreement_claim"] = expected_agreement_claim(conf, agree["max_abs_diff"],
                                                               agree["n_prediction_mismatches"])
    n, accs = len(records), [r["official"]["acc"] for r in records]
    extra = []
    expect(extra, "config.json", "official.reported_acc", reported, sum(accs) / n if n else MISSING,
           "mean of the records' official.acc (lm-eval's acc aggregation)")
    summary_check(C, name, ev, expected, "summary.json values (every value recomputed from the records)", n,
                  extra=extra, identity_fields=IDENTITY_FIELD_RULES,
                  note=f"intervals and McNemar p recomputed by formula, tolerance {uncertainty.TOL:g}")


# ---- level 2, identity ---------------------------------------------------------------------------------------------

def audit_protocol_identity(C, name, out, ev, records, model_dir, data_parquet):
    """Level 2: private texts, tokenisation, the data parquet. Returns {idx: (context ids, [candidate ids])} for
    the forward level, or None."""
    return multiple_choice_identity(
        C, name, records, ev["identity"], model_dir,
        texts_check=lambda: private_texts_check(
            C, name, out, records, lambda t: isinstance(t.get("sentence"), str) and isinstance(t.get("prompt"), str),
            "idx, sentence, prompt", PRIVATE_TEXTS, "sentence and prompt hashes",
            text_problems(config_block(ev["config"]).get("sst2_prompt"))),
        data_check=lambda: sst2_data_check(C, name, ev["config"], records, data_parquet, DATA_PARQUET))


def text_problems(prompt_t):
    """Row PRIVATE_TEXTS, per record: re-hash the private sentence and prompt, rebuild the prompt from the
    template, recompute lm-eval's doc_hash."""
    def check(bad, w, r, t):
        expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(t["sentence"]),
               "sha256 of the private sentence")
        expect(bad, w, "prompt_sha256", r["prompt_sha256"], sha256_text(t["prompt"]), "sha256 of the private prompt")
        if isinstance(prompt_t, str):
            # str.replace, not str.format: the template is data, and a brace in it must not be interpreted
            expect(bad, w, "prompt", t["prompt"], prompt_t.replace("{sentence}", t["sentence"]),
                   "config.sst2_prompt filled with the sentence")
        expect(bad, w, "official.doc_hash", r["official"]["doc_hash"],
               lm_eval_doc_hash(t["sentence"], r["label"], r["idx"]), "lm-eval's doc hash of (sentence, label, idx)")
    return check
