"""The official SST-2 protocol, scored twice.

Every selected item is scored by lm-eval 0.4.9.2 with its installed glue/sst2 task, and by the independent path
in experiments/scoring.py, which forms the batches lm-eval forms for the same items (official_batch_size) and so
presents the model with the same tensors. The two are joined on item identity (doc id, sentence hash, prompt hash,
candidate token boundaries) and must agree bit for bit on every candidate score; any disagreement stops the run
(exit 1).

Flags it honours (ctx.options): no_sort_samples (indices_for_lm_eval), fast (also fast mode, compared with parity
mode), no_cache (no result cache), limit (limited_selection: the first N items of the selection, in its order).

Read top to bottom: select items -> build prompts -> official run -> independent run -> identity join ->
compare -> evidence.
"""
import hashlib

import registry
from experiments import fast_check, official, stats, two_paths
from experiments.context import Result
from experiments.evidence import IdentityMismatch, jsonl
from experiments.selection import (config_head, confirmation_items_scored, limited_selection, load_rows, select_items,
                                  with_limit)

NAME = "protocol"
CONFIG_SECTIONS = registry.config_sections(NAME)   # declared in registry.py
DATA_PARALLEL = True   # its scoring goes through parallel.shard_map (torchrun, --shard, --merge)
SUPPORTS_LIMIT = True  # --limit N: the first N items of the selection (limited_selection)
TASK_YAML = "tasks/glue/sst2/default.yaml"
TASK_NAME = "sst2"


# What the compare half (two_paths.compare_logged) checks of glue/sst2's logged samples and writes per item; a failed
# join carries the order the idx were passed to lm-eval in (what --no-sort-samples demonstrates).
SST2 = two_paths.LoggedTask(
    noun="items",
    fields=(("doc.idx", "doc.idx", "idx"), ("label", "doc.label", "label"), ("target", "target", "label"),
            ("sentence_sha256", "doc.sentence", "sentence")),
    record_fields=("rank",), text_fields=("idx", "sentence", "prompt"),
    failure_details=("indices_passed_to_lm_eval", "indices_order"))


def prompt_template_sha256(config):
    return hashlib.sha256(config["sst2_prompt"].encode("utf-8")).hexdigest()


def data_label(ctx):
    return ctx.data.id


def build_items(rows, idx_list, config):
    """Prompt and candidates for each item, built from the protocol's fields (not from lm-eval)."""
    items = []
    for rank, idx in enumerate(idx_list):
        row = rows[idx]
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


def indices_for_lm_eval(indices, sort=True):
    """(the idx list as passed to lm-eval, how it is ordered).

    lm-eval 0.4.9.2 labels logged samples with the caller's order but iterates documents in dataset order, so an
    unsorted list mislabels evidence. Sorting is input normalisation (the same set of items), not re-selection.
    sort=False (--no-sort-samples) reproduces the defect on purpose: the rank order when it is unsorted, else the
    rank order reversed, so that any selection of 2 or more items demonstrates it; with fewer than 2 items no
    unsorted order exists, and the order says that nothing could be demonstrated."""
    indices = list(indices)
    if sort:
        return sorted(indices), "sorted ascending (input normalisation; the default)"
    if len(indices) < 2:
        return indices, (f"--no-sort-samples with {len(indices)} item(s): no unsorted order exists, so nothing "
                         "could be demonstrated")
    if indices != sorted(indices):
        return indices, "--no-sort-samples: the rank order, unsorted"
    return indices[::-1], "--no-sort-samples: the rank order reversed (the rank order is already ascending)"


def official_part(ctx, lm, items):
    """lm-eval with the installed task on these items (see indices_for_lm_eval for the order): ({doc_id: {"sample":
    logged sample, "boundaries": lm-eval's token boundaries}}, meta)."""
    passed, _ = indices_for_lm_eval([it["idx"] for it in items], sort=not ctx.options.no_sort_samples)
    cfg = official.task_config(TASK_YAML, ctx.data.parquet_path)
    results = official.evaluate(lm, cfg, TASK_NAME, passed, ctx.config["seed"])
    meta = {
        "lm_eval_version": official.version(),
        "task_yaml": TASK_YAML,
        "dumped_task_config": results["configs"][TASK_NAME],
        "lm_eval_files_sha256": official.file_hashes(extra=[TASK_YAML]),
        "reported_acc": results["results"][TASK_NAME]["acc,none"],
        **official.lm_facts(lm, ctx.inputs.model_dir, ctx.config),
        "custom_dataset": "serves the verified cache parquet as the validation split (+ an empty train split)",
    }
    return two_paths.logged_samples(lm, items, results["samples"][TASK_NAME]), meta


def combine_official(metas, per_doc):
    """The meta of the whole run from the parts': lm-eval's reported acc recomputed by lm-eval's own aggregation
    over all gathered samples (each part's lm-eval run reported only its own documents)."""
    return {**metas[0], "reported_acc": official.aggregate("acc", [v["sample"]["acc"] for v in per_doc.values()])}


def scoring_call(ctx, items):
    """The protocol's one call: every selected item, lm-eval's task on the official side, the items' prompts and
    candidates on the independent side (lm-eval's batches, the result cache)."""
    return two_paths.Call(items, lambda lm, part: official_part(ctx, lm, part), unit=two_paths.prompt_unit,
                          combine_official=combine_official,
                          check_official=lambda meta: check_task_config(meta["dumped_task_config"], ctx.config))


def summarise(records, split, meta, config):
    n = len(records)
    agreement = two_paths.agreement(records)
    labels = [r["label"] for r in records]
    label_counts = {str(k): labels.count(k) for k in (0, 1)}
    majority = max((0, 1), key=lambda k: (labels.count(k), -k))

    def side(pred_of):
        preds = [pred_of(r) for r in records]
        correct = sum(p == r["label"] for p, r in zip(preds, records))
        return {"correct": correct, "accuracy": correct / n, "pred_counts": {str(k): preds.count(k) for k in (0, 1)}}

    return {
        "experiment": NAME, "split": split, "confirmation_items_scored": confirmation_items_scored(split),
        "n_items": n, "n_candidates": sum(len(r["abs_diff"]) for r in records), "label_counts": label_counts,
        "official": {**side(lambda r: r["official"]["pred"]), "lm_eval_reported_acc": meta["reported_acc"]},
        "independent": side(lambda r: r["independent"]["pred"]),
        "constant_class_baseline": {"label": majority, "accuracy": labels.count(majority) / n},
        "agreement": agreement,
        "agreement_claim": two_paths.agreement_claim(config, agreement["max_abs_diff"],
                                                     agreement["n_prediction_mismatches"]),
        "identity_checks": {"passed": True, "n_samples_joined": n,
                            "fields": ["doc_id", "doc.idx", "label", "target", "sentence_sha256", "prompt_sha256",
                                       "candidate texts", "candidate token ids and start"]},
        "uncertainty": uncertainty(records, majority),
    }


def uncertainty(records, majority):
    """summary["uncertainty"]: Wilson intervals of both paths' accuracies and of the constant-class baseline's;
    each path against that baseline, paired on the items (Newcombe interval of the difference, exact McNemar)."""
    n = len(records)
    right = {side: [r[side]["pred"] == r["label"] for r in records] for side in ("official", "independent")}
    baseline = [r["label"] == majority for r in records]
    return stats.uncertainty_block(
        {"official/accuracy": (sum(right["official"]), n), "independent/accuracy": (sum(right["independent"]), n),
         "constant_class_baseline/accuracy": (sum(baseline), n)},
        {f"{side}_vs_constant_class": (f"{side}.accuracy", "constant_class_baseline.accuracy",
                                       list(zip(right[side], baseline))) for side in ("official", "independent")})


def headline(s):
    u = s["uncertainty"]
    ci = u["accuracies"]["independent/accuracy"]["wilson95"]
    vs = u["paired"]["independent_vs_constant_class"]
    return (f"{s['n_items']} items, {s['n_candidates']} candidates: official {s['official']['correct']}/{s['n_items']}, "
            f"independent {s['independent']['correct']}/{s['n_items']}"
            + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f}; vs constant class {vs['difference']:+.3f}, McNemar p = "
               f"{vs['mcnemar_p']:.3g})" if ci else "")
            + f", max |official - independent| = {s['agreement']['max_abs_diff']}, identity checks passed")


def sort_note(options, official_meta):
    """What --no-sort-samples did when the run did not stop (the usual outcome is an IdentityMismatch instead)."""
    if not options.no_sort_samples:
        return ""
    if not official_meta["indices_sorted"]:
        return (f"; {official_meta['indices_order']}, and the identity join still passed: this lm-eval does not "
                "show the 0.4.9.2 doc_id defect")
    return f"; {official_meta['indices_order']}"


def score_and_compare(ctx, items):
    """Both paths (two_paths.score_twice), the identity join and the comparison (two_paths.compare_logged):
    (records, texts, summary, official meta, independent meta). Raises IdentityMismatch on any difference.
    bench.py times this."""
    scored = two_paths.score_twice(ctx, {"": scoring_call(ctx, items)}, prompt_template_sha256(ctx.config), fast=True)
    official_meta, independent_meta = scored.official[""][1], scored.independent[""][1]
    passed, order = indices_for_lm_eval([it["idx"] for it in items], sort=not ctx.options.no_sort_samples)
    official_meta.update(indices_passed_to_lm_eval=passed, indices_sorted=passed == sorted(passed),
                         indices_order=order)
    with ctx.stages.stage("compare"):
        records, texts, fast = two_paths.compare_logged(ctx, SST2, items, scored)
        summary = summarise(records, ctx.split, official_meta, ctx.config)
        if fast is not None:
            summary["fast"] = fast
    return records, texts, summary, official_meta, independent_meta


def run(ctx):
    rows = load_rows(ctx.data.parquet_path)
    idx_list, limit = limited_selection(ctx, select_items(ctx.config, ctx.split, len(rows)))
    items = build_items(rows, idx_list, ctx.config)
    records, texts, summary, official_meta, independent_meta = score_and_compare(ctx, items)
    config_out = {**config_head(ctx, NAME, len(rows), idx_list),
                  "official": official_meta, "independent": independent_meta}
    line = with_limit(limit, summary, config_out, headline(summary))
    return Result(config=config_out, records=records, summary=summary,
                  token_stats=two_paths.candidate_token_stats(records),
                  private={"texts.jsonl": jsonl(texts)},
                  headline=(line
                            + fast_check.headline(independent_meta["result_cache"], summary.get("fast"),
                                                 getattr(ctx.plan, "mode", None) == "replay")
                            + sort_note(ctx.options, official_meta)),
                  prompt_template_sha256=prompt_template_sha256(ctx.config))
