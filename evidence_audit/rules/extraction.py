"""The extraction experiment's rule: one greedy generation per item, scored three ways, and a
human-audit sample pre-registered before generation. The import of a filled review sheet (--review) is in
extraction_review.

What is particular to it, written out again from the definitions (experiments/extraction*.py and lm_eval are not
imported):
  exact     [strip(y) == json.dumps({"sentiment": label})]
  strict    json.loads(y) (no NaN/Infinity) is an object, no duplicate key at any level, keys exactly {"sentiment"},
            value "positive"|"negative"; reason = the first failing step of EXT_STRICT_REASONS
  regex     re.findall(r"(?i)\\b(positive|negative)\\b", y): first match (stripped) or the fallback; prediction = match
            lowercased; correct = prediction == label (Python's re here, a third implementation next to lm-eval's
            RegexFilter and the experiment's character scan)
  sample    per class, rank idx by sha256(f"{salt}:{idx}"), first per_class, interleave (lowest label first); the
            pre-registration file must predate the model load and the generation
  levels    arithmetic: the scorers' settings and the lm-eval filters in config.json, the public per-item fields, the
            sample, the scores recomputed from the private generations, the summary; identity: the prompt re-rendered
            from the chat template and re-tokenised, the generated ids decoded back to the text, finish reasons, the
            data parquet; forward (greedy.py): every generated token is the greedy (argmax) token of audit.py's own
            forward pass.
Everything else (required files, config and identity consistency, environment.json, record shape, selection rule,
summary comparison, stage timings, the tokenizer and data checks) is a shared group.
"""
import itertools
import json
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from evidence_audit.checks import ARITHMETIC, IDENTITY, MISSING, expect, get, short
from evidence_audit import uncertainty
from evidence_audit.definitions import confirmation_scored, is_int, is_sha
from evidence_audit.greedy import greedy_check
from evidence_audit.reading import load_evidence, parse_strict, read_text, sha256_text
from evidence_audit.rules.extraction_review import EXT_REVIEW_KEYS, ext_review, print_review, review_check
from evidence_audit.shared import (RecordShape, config_block, deeper_levels, environment_check,
                                   hash_selection_problems, identity_problems, limit_note, limited_hash_selection,
                                   model_problems, rank_order_problems,
                                   record_shape_check, required_files, restated_problems, split_note, split_problems,
                                   stages_check, summary_check, token_span)
from evidence_audit.templates import OverBound, chat_renderer
from evidence_audit.tokens import chat_template, private_texts, sst2_data_check, tokenizer_or_skip

__all__ = ["audit_extraction", "ext_strict_reason", "ext_scores_from_text", "ext_sample", "ext_expected_summary",
           "ext_review", "EXT_REVIEW_KEYS", "ext_print_review"]

EXT_PREREG = "extraction.preregistration.json"
EXT_STRICT_REASONS = ("empty", "code_fence", "not_json", "not_object", "duplicate_key", "missing_key", "extra_keys",
                      "bad_value", "wrong_label")
EXT_CATEGORIES = ("no_match", "several_matches", "conflicting_matches", "format_failure", "length_stop")
EXT_SCORERS = ("exact", "strict", "regex")
is_obj = lambda v: isinstance(v, dict)          # noqa: E731
is_str = lambda v: isinstance(v, str)           # noqa: E731
SHAPE = RecordShape(
    fields={"idx": is_int, "rank": is_int, "label": is_int, "label_name": is_str, "sentence_sha256": is_sha,
            "user_message_sha256": is_sha, "prompt_sha256": is_sha, "input_tokens": is_int, "generated_tokens": is_int,
            "finish_reason": lambda v: v in ("eos", "length"), "generation_sha256": is_sha,
            "generated_ids_sha256": is_sha, "exact": is_obj, "strict": is_obj, "regex": is_obj, "categories": is_obj,
            "lm_eval_generate_until": is_obj, "audit_position": lambda v: v is None or is_int(v)},
    nested={"exact": {"correct": lambda v: v in (0, 1) and is_int(v)},
            "strict": {"reason": lambda v: v is None or v in EXT_STRICT_REASONS, "format_ok": is_int,
                       "correct": is_int},
            "regex": {"official": is_str, "independent": is_str, "n_matches": is_int,
                      "pred": lambda v: v is None or is_str(v), "correct": is_int},
            "categories": {k: is_int for k in EXT_CATEGORIES},
            "lm_eval_generate_until": {"identical": lambda v: v is None or isinstance(v, bool),
                                       "input_ids_identical": lambda v: v is None or isinstance(v, bool),
                                       "text_sha256": lambda v: v is None or is_sha(v)}})
GENERATION_FIELDS = "idx, sentence, user_message, prompt, generation (strings), generated_ids (ints)"
TOKENISATION = "tokenisation (prompt ids, generated ids -> text, finish reason)"


@dataclass
class Settings:
    """The extraction settings of config.json the later checks use (replaced by defaults where unusable: the config
    row names the problem)."""
    labels: list
    fallback: str
    n_new: object          # extraction_max_new_tokens (an int when usable)
    limit: object          # max_input_tokens (an int when usable)
    user_prompt: object    # extraction_user_prompt (a str when usable)
    lm_ran: bool           # the lm-eval generate_until cross-check ran


# ---- the scorers and the sample, from their definitions -------------------------------------------------------------

def ext_strict_reason(text, label, labels):
    if text.strip() == "":
        return "empty"
    dups = []

    def hook(pairs):
        if len({k for k, _ in pairs}) != len(pairs):
            dups.append(pairs)
        return dict(pairs)

    def no_constants(name):
        raise ValueError(name)

    try:
        obj = json.loads(text, object_pairs_hook=hook, parse_constant=no_constants)
    except (ValueError, RecursionError):
        return "code_fence" if "```" in text else "not_json"
    if not isinstance(obj, dict):
        return "not_object"
    if dups:
        return "duplicate_key"
    if "sentiment" not in obj:
        return "missing_key"
    if set(obj) != {"sentiment"}:
        return "extra_keys"
    if not (isinstance(obj["sentiment"], str) and obj["sentiment"] in labels):
        return "bad_value"
    return "wrong_label" if obj["sentiment"] != label else None


def ext_regex(labels):
    import re
    return re.compile(r"(?i)\b(" + "|".join(re.escape(l) for l in labels) + r")\b")


def ext_scores_from_text(text, label, finish, labels, fallback):
    """Every per-item score and category recomputed from the generated text (what records.jsonl must say)."""
    found = ext_regex(labels).findall(text)
    extracted = found[0].strip() if found else fallback
    reason = ext_strict_reason(text, label, labels)
    pred = None if extracted == fallback or extracted.lower() not in labels else extracted.lower()
    return {
        "exact": {"correct": int(text.strip() == json.dumps({"sentiment": label}))},
        "strict": {"reason": reason, "format_ok": int(reason in (None, "wrong_label")), "correct": int(reason is None)},
        "regex": {"official": extracted, "independent": extracted, "n_matches": len(found), "pred": pred,
                  "correct": int(pred == label)},
        "categories": {"no_match": int(not found), "several_matches": int(len(found) > 1),
                       "conflicting_matches": int(len({m.lower() for m in found}) > 1),
                       "format_failure": int(reason not in (None, "wrong_label")),
                       "length_stop": int(finish == "length")},
    }


def ext_sample(idx_labels, salt, per_class):
    by = {}
    for i, l in idx_labels:
        by.setdefault(l, []).append(i)
    chosen = {c: sorted(v, key=lambda i: sha256_text(f"{salt}:{i}"))[:per_class] for c, v in by.items()}
    order = [(chosen[c][k], c) for k in range(per_class) for c in sorted(chosen) if k < len(chosen[c])]
    return [{"position": p + 1, "idx": i, "label": c, "rank_key": sha256_text(f"{salt}:{i}")}
            for p, (i, c) in enumerate(order)]


def ext_paired(rec, a, b, idx):
    """The paired table of two scorers' correctness over the items idx."""
    ra, rb = rec[a], rec[b]
    only_a, only_b = [i for i in idx if ra[i] and not rb[i]], [i for i in idx if rb[i] and not ra[i]]
    return {"a": a, "b": b, "both_correct": sum(bool(ra[i] and rb[i]) for i in idx),
            "neither": sum(bool(not ra[i] and not rb[i]) for i in idx),
            "only_a": len(only_a), "only_b": len(only_b), "only_a_idx": only_a, "only_b_idx": only_b}


def ext_generate_until_summary(records, lm_ran):
    """summary.json lm_eval_generate_until: the cross-check's counts, or its 'did not run' form."""
    if not lm_ran:
        return {"ran": False, "n_compared": 0, "n_identical": None, "n_input_ids_identical": None,
                "all_identical": None, "mismatch_idx": []}
    n, lm = len(records), [r["lm_eval_generate_until"] for r in records]
    gen = {"n_compared": n, "n_identical": sum(bool(x["identical"]) for x in lm),
           "n_input_ids_identical": sum(bool(x["input_ids_identical"]) for x in lm)}
    gen.update(all_identical=gen["n_identical"] == n and gen["n_input_ids_identical"] == n,
               mismatch_idx=[r["idx"] for r in records if not r["lm_eval_generate_until"]["identical"]], ran=True)
    return gen


EXT_PAIRS = (("exact", "strict"), ("exact", "regex"), ("strict", "regex"))


def ext_expected_summary(name, split, records, labels, lm_ran, prereg_sha, prereg_items, review_note,
                         recorded_uncertainty=None):
    """summary.json as the records (and the pre-registered sample) say it must be; the floats of the recorded
    uncertainty block are taken when they match the recomputed ones within uncertainty.TOL."""
    n = len(records)
    idx = [r["idx"] for r in records]
    corr = {s: {r["idx"]: r[s]["correct"] for r in records} for s in EXT_SCORERS}
    rate = lambda k: k / n if n else MISSING      # noqa: E731 (no records: an accuracy claim recomputes to nothing)
    preds = [r["regex"]["pred"] for r in records]
    patterns = {}
    for r in records:
        patterns.setdefault("".join(str(r[s]["correct"]) for s in EXT_SCORERS), []).append(r["idx"])
    categories = lambda keep: {k: sum(r["categories"][k] for r in records if keep(r)) for k in EXT_CATEGORIES}  # noqa
    return {
        "experiment": name, "split": split, "confirmation_items_scored": confirmation_scored(split), "n_items": n,
        "label_counts": {str(k): sum(r["label"] == k for r in records) for k in range(len(labels))},
        "constant_answer_baselines": {f"always_{l}": sum(r["label_name"] == l for r in records) for l in labels},
        "scorers": {
            "exact": {"correct": sum(corr["exact"].values()), "accuracy": rate(sum(corr["exact"].values()))},
            "strict": {"correct": sum(corr["strict"].values()), "accuracy": rate(sum(corr["strict"].values())),
                       "format_ok": sum(r["strict"]["format_ok"] for r in records),
                       "reasons": {k: sum(r["strict"]["reason"] == k for r in records) for k in EXT_STRICT_REASONS}},
            "regex": {"correct": sum(corr["regex"].values()), "accuracy": rate(sum(corr["regex"].values())),
                      "pred_counts": {**{l: preds.count(l) for l in labels}, "none": preds.count(None)}},
        },
        "paired": {f"{a}_vs_{b}": ext_paired(corr, a, b, idx) for a, b in EXT_PAIRS},
        "patterns": {k: {"n": len(v), "idx": v} for k, v in sorted(patterns.items())},
        "match_failures": {"all": categories(lambda r: True),
                           "regex_wrong": categories(lambda r: not r["regex"]["correct"]),
                           "regex_right": categories(lambda r: r["regex"]["correct"])},
        "finish_reasons": {k: sum(r["finish_reason"] == k for r in records) for k in ("eos", "length")},
        "regex_agreement": {"n_items": n, "n_mismatches": sum(r["regex"]["official"] != r["regex"]["independent"]
                                                               for r in records)},
        "lm_eval_generate_until": ext_generate_until_summary(records, lm_ran),
        "audit_sample": {"preregistration_sha256": prereg_sha, "n": len(prereg_items),
                         "idx": [s["idx"] for s in prereg_items],
                         "per_class": {str(k): sum(s["label"] == k for s in prereg_items) for k in range(len(labels))}},
        # a run never has human-review figures: they are null until a sheet is imported here (--review)
        "human_review": {**{k: None for k in EXT_REVIEW_KEYS}, "note": review_note},
        "uncertainty": uncertainty.expected_block(
            recorded_uncertainty, {f"scorers/{s}/accuracy": (sum(corr[s].values()), n) for s in EXT_SCORERS},
            {f"{a}_vs_{b}": (f"scorers.{a}.accuracy", f"scorers.{b}.accuracy", [corr[a][i] for i in idx],
                             [corr[b][i] for i in idx]) for a, b in EXT_PAIRS}),
    }


# ---- the rule ------------------------------------------------------------------------------------------------------

def audit_extraction(C, name, out, levels, cache):
    ev = load_evidence(out, name)
    prereg = out / EXT_PREREG      # as text: its sha256 is a claim
    ev["prereg_text"] = read_text(prereg) if prereg.exists() else None
    ev["generations"] = None       # {idx: private generation}, read by the arithmetic level
    records = audit_extraction_arithmetic(C, name, out, ev)
    sheet = C.options.review_sheet
    info = {"human_review": review_check(C, name, None if sheet is None else Path(sheet), ev["config"], records)}
    info.update(deeper_levels(
        C, name, ev, levels, cache,
        identity=lambda model_dir, parquet: audit_extraction_identity(C, name, ev, records, model_dir, parquet),
        forward=lambda tokens, model_dir: greedy_check(C, name, ev["identity"], records, tokens, model_dir)))
    return info


def ext_print_review(report, sheet, stream=sys.stdout):
    """After the report (cli.py, --review SHEET): the human-review figures, or every reason the sheet was refused."""
    print_review(report, sheet, stream)


# ---- level 1, arithmetic -------------------------------------------------------------------------------------------

def audit_extraction_arithmetic(C, name, out, ev):
    """Level 1 (+ the scorers recomputed from the private generations when present). Returns the records when the
    deeper levels and the review may use them, else None."""
    if not required_files(C, name, ev, extra=[(f"../{EXT_PREREG}", ev["prereg_text"] is not None)],
                          check="required files (+ the pre-registration written before generation)"):
        C.skip(name, ARITHMETIC, "(rest of the level)",
               "config.json or records.jsonl missing; nothing to recompute from")
        return None
    s = config_check(C, name, ev)
    environment_check(C, name, ev)
    records = ev["records"]
    if not record_shape_check(C, name, records, SHAPE, lambda i, r: f"idx {r.get('idx', '?')}"):
        C.skip(name, ARITHMETIC, "(rest of the level)",
               "records.jsonl has malformed records (see 'record fields and types')")
        return None
    selection_check(C, name, ev, records, s.labels)
    prereg = audit_sample_check(C, name, out, ev, records)
    C.add(name, ARITHMETIC, "per-item scores and categories (consistency of the public fields)", len(records),
          [p for r in records for p in public_fields_problems(r, s)])
    generations_check(C, name, out, ev, records, s)
    summary_values_check(C, name, ev, records, s, prereg)
    stages_check(C, name, ev, token_counts(records), len(records), check="stages.json token counts")
    return records


def config_check(C, name, ev):
    """Row "config consistency (...)": the shared config and identity groups, the scorers' settings, the lm-eval
    filters and generation call, and the greedy settings. Returns the usable Settings."""
    cfg, bad = ev["config"], []
    split = split_problems(bad, name, cfg)
    hash_selection_problems(bad, cfg)
    model_problems(bad, cfg)
    s = settings_problems(bad, cfg)
    filter_problems(bad, cfg, s)
    generate_call_problems(bad, cfg, s)
    expect(bad, "config.json", "prompt.user_template", get(cfg, "prompt.user_template"), s.user_prompt)
    if ev["identity"] is not None:
        identity_problems(bad, name, cfg, ev["identity"],
                          sha256_text(s.user_prompt) if isinstance(s.user_prompt, str) else None)
    restated_problems(bad, ev, split)
    C.add(name, ARITHMETIC, "config consistency (split, selection, scorers, greedy settings, identity.json)", 1, bad,
          note=split_note(split))
    return s


def settings_problems(bad, cfg):
    """The extraction section's labels, regex fallback and token limits are usable. Returns Settings."""
    conf = config_block(cfg)
    labels = conf.get("extraction_labels")
    if not (isinstance(labels, list) and len(labels) >= 2 and all(isinstance(l, str) for l in labels)):
        bad.append(f"config.json config.extraction_labels: {short(labels)} is not a list of label names")
        labels = ["negative", "positive"]
    fallback = conf.get("extraction_regex_fallback")
    if not isinstance(fallback, str):
        bad.append(f"config.json config.extraction_regex_fallback: {short(fallback)} is not a string")
        fallback = "[invalid]"
    n_new, limit = conf.get("extraction_max_new_tokens"), conf.get("max_input_tokens")
    if not (is_int(n_new) and n_new > 0 and is_int(limit) and limit > 0):
        bad.append(f"config.json: max_new_tokens {short(n_new)} / max_input_tokens {short(limit)} are not positive "
                   "ints")
    return Settings(labels, fallback, n_new, limit, conf.get("extraction_user_prompt"),
                    isinstance(get(cfg, "official.generate_until"), dict))


def filter_problems(bad, cfg, s):
    """The regex is the first-match whole-word case-insensitive rule over the labels, and lm-eval's filters apply it
    (regex, then take_first) with the configured fallback."""
    # the alternatives have distinct first letters and equal length, so their order cannot change a match
    rx = config_block(cfg).get("extraction_regex", MISSING)
    allowed = [r"(?i)\b(" + "|".join(p) + r")\b" for p in itertools.permutations(s.labels)]
    if rx not in allowed:
        bad.append(f"config.json config.extraction_regex: {short(rx)} is not the first-match whole-word "
                   f"case-insensitive rule over the label names ({allowed[0]!r})")
    expect(bad, "config.json", "official.filter_list", get(cfg, "official.filter_list"),
           [{"name": "extract", "filter": [{"function": "regex", "regex_pattern": rx, "group_select": 0,
                                            "fallback": s.fallback}, {"function": "take_first"}]}],
           "lm-eval filters: regex (first match) then take_first")


def generate_call_problems(bad, cfg, s):
    """Greedy generation up to max_new_tokens; lm-eval's generate_until cross-check ran exactly when configured,
    with the same settings and no left truncation."""
    expect(bad, "config.json", "generation.generate_call.do_sample", get(cfg, "generation.generate_call.do_sample"),
           False, "greedy")
    expect(bad, "config.json", "generation.generate_call.max_new_tokens",
           get(cfg, "generation.generate_call.max_new_tokens"), s.n_new)
    expect(bad, "config.json", "official.generate_until (ran)", s.lm_ran,
           config_block(cfg).get("extraction_crosscheck_lm_eval") is True, "config.extraction_crosscheck_lm_eval")
    if s.lm_ran:
        lm_meta = get(cfg, "official.generate_until")
        expect(bad, "config.json", "official.generate_until.gen_kwargs", lm_meta.get("gen_kwargs", MISSING),
               {"until": [], "max_gen_toks": s.n_new, "do_sample": False}, "stop only at eos, greedy")
        expect(bad, "config.json", "official.generate_until.hflm.max_length", get(lm_meta, "hflm.max_length"),
               s.limit + s.n_new if is_int(s.limit) and is_int(s.n_new) else MISSING,
               "no left truncation of admissible input")


def selection_check(C, name, ev, records, labels):
    """Row "item selection (...)": the records are the hash rule's items in rank order (cut to the first N under
    --limit N: limited_hash_selection), each label a label index with its name."""
    cfg, bad = ev["config"], []
    want, why, settings, limit = limited_hash_selection(bad, ev)
    if want is None:
        bad.append(f"config.json selection: {why} ({settings})")
    else:
        bad += rank_order_problems([r["idx"] for r in records], want, settings)
        expect(bad, "config.json", "selection.item_idx", get(cfg, "selection.item_idx"), want, settings)
    for rank, r in enumerate(records):
        w = f"idx {r['idx']}"
        expect(bad, w, "rank", r["rank"], rank, "line position")
        if not 0 <= r["label"] < len(labels):
            bad.append(f"{w} label: {r['label']} is not a label index")
        else:
            expect(bad, w, "label_name", r["label_name"], labels[r["label"]])
    C.add(name, ARITHMETIC, "item selection (hash rule, rank order, --limit, labels)", len(records), bad,
          note=limit_note(limit))


# ---- the pre-registered audit sample -------------------------------------------------------------------------------

def audit_sample_check(C, name, out, ev, records):
    """Row "audit sample (...)": the pre-registration file is the one config.json hashes and restates, its sample
    is recomputed from idx and labels only, and it was written before the model was loaded and the generation
    started. Returns the pre-registration (a dict), or None."""
    cfg, bad, prereg = ev["config"], [], None
    if ev["prereg_text"] is None:
        bad.append(f"{EXT_PREREG}: missing; the sample cannot be shown to predate the generations")
    else:
        expect(bad, EXT_PREREG, "sha256", sha256_text(ev["prereg_text"]),
               get(cfg, "audit_sample.preregistration_sha256"), "config.json audit_sample.preregistration_sha256")
        prereg = parse_strict(ev["prereg_text"], out / EXT_PREREG)
        expect(bad, "config.json", "audit_sample.preregistration", get(cfg, "audit_sample.preregistration"), prereg,
               f"must be the content of {EXT_PREREG}")
    if isinstance(prereg, dict):
        bad += sample_problems(prereg, cfg, records)
        bad += sample_item_problems(prereg, records)
        bad += sample_timing_problems(prereg, cfg, ev["stages"])
    C.add(name, ARITHMETIC, "audit sample (recomputed from idx/labels/salt; written before the model was loaded)",
          len(prereg.get("items", [])) if isinstance(prereg, dict) else 0, bad)
    return prereg if isinstance(prereg, dict) else None


def prereg_items(prereg):
    return prereg.get("items") if isinstance(prereg.get("items"), list) else []


def sample_problems(prereg, cfg, records):
    """The sample's settings are the config's, its population is the scored items, and its items and class
    weights are recomputed from idx, labels, salt and per_class."""
    bad, conf = [], config_block(cfg)
    salt, per = prereg.get("salt"), prereg.get("per_class")
    expect(bad, EXT_PREREG, "salt", salt, conf.get("extraction_audit_salt", MISSING))
    expect(bad, EXT_PREREG, "per_class", per, conf.get("extraction_audit_per_class", MISSING))
    expect(bad, EXT_PREREG, "split", prereg.get("split", MISSING), cfg.get("split"))
    expect(bad, EXT_PREREG, "population.item_idx", get(prereg, "population.item_idx"), [r["idx"] for r in records])
    expect(bad, EXT_PREREG, "population.labels", get(prereg, "population.labels"), [r["label"] for r in records])
    # under --limit the sample is drawn from the first N items, and the pre-registration says so
    expect(bad, EXT_PREREG, "population.limit", get(prereg, "population.limit"), cfg.get("limit", MISSING),
           "config.json limit")
    expect(bad, EXT_PREREG, "population.data_content_sha256", get(prereg, "population.data_content_sha256"),
           cfg.get("data_content_sha256", MISSING))
    if not (isinstance(salt, str) and is_int(per)):
        return bad
    want = ext_sample([(r["idx"], r["label"]) for r in records], salt, per)
    got = [{k: s.get(k) for k in ("position", "idx", "label", "rank_key")} if isinstance(s, dict) else s
           for s in prereg_items(prereg)]
    expect(bad, EXT_PREREG, "items (position, idx, label, rank_key)", got, want,
           "recomputed from idx, labels, salt and per_class")
    pop, n_sampled = {}, {}
    for r in records:
        pop[r["label"]] = pop.get(r["label"], 0) + 1
    for s in want:
        n_sampled[s["label"]] = n_sampled.get(s["label"], 0) + 1
    expect(bad, EXT_PREREG, "class_weights", prereg.get("class_weights", MISSING),
           {str(c): {"population": pop[c], "sampled": n_sampled.get(c, 0),
                     "weight": f"{pop[c]}/{n_sampled[c]}" if n_sampled.get(c) else None,
                     "weight_float": pop[c] / n_sampled[c] if n_sampled.get(c) else None} for c in sorted(pop)})
    return bad


def sample_item_problems(prereg, records):
    """Each sampled item is a scored item with the same sentence and label, and each record's audit_position is its
    position in the sample (null outside it)."""
    bad, by_idx = [], {r["idx"]: r for r in records}
    for s in prereg_items(prereg):
        if not isinstance(s, dict) or s.get("idx") not in by_idx:
            bad.append(f"{EXT_PREREG} items: {short(s, 60)} is not a scored item")
            continue
        r = by_idx[s["idx"]]
        expect(bad, f"idx {s['idx']}", "pre-registered sentence_sha256", s.get("sentence_sha256"), r["sentence_sha256"])
        expect(bad, f"idx {s['idx']}", "pre-registered label_name", s.get("label_name"), r["label_name"])
    positions = {s.get("idx"): s.get("position") for s in prereg_items(prereg) if isinstance(s, dict)}
    for r in records:
        expect(bad, f"idx {r['idx']}", "audit_position", r["audit_position"], positions.get(r["idx"]))
    return bad


def sample_timing_problems(prereg, cfg, stages):
    """The sample was written before the generation started and, by stages.json, before the model was loaded."""
    bad = []
    created, started = prereg.get("created_at_utc"), get(cfg, "generation.generation_started_utc")
    try:
        if not datetime.fromisoformat(created) < datetime.fromisoformat(started):
            bad.append(f"{EXT_PREREG} created_at_utc: {created} is not before the generation started ({started})")
    except (TypeError, ValueError):
        bad.append(f"{EXT_PREREG} created_at_utc / config.json generation.generation_started_utc: "
                   f"{short(created)} / {short(started)} are not comparable ISO times")
    if stages is not None and isinstance(stages.get("stages"), list):
        names = [st.get("name") for st in stages["stages"] if isinstance(st, dict)]
        if "data_parallel" in stages:
            return bad + rank_sample_order_problems(stages["data_parallel"])
        if not ("audit_sample_preregistration" in names and "model_load" in names
                and names.index("audit_sample_preregistration") < names.index("model_load")):
            bad.append(f"stages.json: the audit sample was not written before the model was loaded (stages {names})")
    return bad


def rank_sample_order_problems(dp):
    """A data-parallel run (or a merge of shards): every rank or shard fixed the audit sample before it loaded the
    model (a rank with no item loads none), and some rank loaded it."""
    ranks = dp.get("ranks") if isinstance(dp, dict) else None
    if not isinstance(ranks, list) or not ranks:
        return ["stages.json data_parallel.ranks: missing or empty"]
    bad, loaded = [], False
    for n, r in enumerate(ranks):
        names = [st.get("name") for st in (r.get("stages") if isinstance(r, dict) else None) or []
                 if isinstance(st, dict)]
        loaded = loaded or "model_load" in names
        if "audit_sample_preregistration" not in names or ("model_load" in names and names.index(
                "audit_sample_preregistration") > names.index("model_load")):
            bad.append(f"stages.json data_parallel.ranks[{n}]: the audit sample was not written before the model "
                       f"was loaded (stages {names})")
    return bad if loaded else bad + ["stages.json data_parallel.ranks: no rank loaded the model"]


# ---- the scores ----------------------------------------------------------------------------------------------------

def public_fields_problems(r, s):
    """One record's scores and categories are consistent with each other, its token counts with the limits, and
    its lm-eval cross-check result with the generation hash (the public fields alone)."""
    bad, w, rx, st, ca = [], f"idx {r['idx']}", r["regex"], r["strict"], r["categories"]
    expect(bad, w, "regex.independent", rx["independent"], rx["official"],
           "lm-eval's extraction and the independent one must agree")
    low = rx["official"].lower()
    pred = None if rx["official"] == s.fallback or low not in s.labels else low
    expect(bad, w, "regex.pred", rx["pred"], pred, "the official extraction lowercased")
    expect(bad, w, "regex.correct", rx["correct"], int(pred == r["label_name"]))
    expect(bad, w, "strict.format_ok", st["format_ok"], int(st["reason"] in (None, "wrong_label")))
    expect(bad, w, "strict.correct", st["correct"], int(st["reason"] is None))
    if st["reason"] is None and rx["correct"] != 1:
        bad.append(f"{w} regex.correct: a strictly correct answer has the label as its only sentiment word")
    if r["exact"]["correct"] and st["reason"] is not None:
        bad.append(f"{w} strict.reason: the canonical string is strictly valid, found {st['reason']!r}")
    expect(bad, w, "categories.no_match", ca["no_match"], int(rx["n_matches"] == 0))
    expect(bad, w, "categories.no_match vs fallback", ca["no_match"], int(rx["official"] == s.fallback))
    expect(bad, w, "categories.several_matches", ca["several_matches"], int(rx["n_matches"] > 1))
    if ca["conflicting_matches"] and not ca["several_matches"]:
        bad.append(f"{w} categories.conflicting_matches: conflicting matches need several matches")
    expect(bad, w, "categories.format_failure", ca["format_failure"], int(st["reason"] not in (None, "wrong_label")))
    expect(bad, w, "categories.length_stop", ca["length_stop"], int(r["finish_reason"] == "length"))
    return bad + length_problems(r, w, s) + crosscheck_problems(r, w, s.lm_ran)


def length_problems(r, w, s):
    bad = []
    if is_int(s.n_new):
        if r["finish_reason"] == "length" and r["generated_tokens"] != s.n_new:
            bad.append(f"{w} generated_tokens: {r['generated_tokens']} with a length stop (limit {s.n_new})")
        if not 1 <= r["generated_tokens"] <= s.n_new:
            bad.append(f"{w} generated_tokens: {r['generated_tokens']} outside 1..{s.n_new}")
    if is_int(s.limit) and not 1 <= r["input_tokens"] <= s.limit:
        bad.append(f"{w} input_tokens: {r['input_tokens']} outside 1..{s.limit} (over the limit is an error)")
    return bad


def crosscheck_problems(r, w, lm_ran):
    lm, bad = r["lm_eval_generate_until"], []
    if lm_ran:
        if lm["identical"] is None or lm["text_sha256"] is None:
            bad.append(f"{w} lm_eval_generate_until: the cross-check ran but this item has no result")
        else:
            expect(bad, w, "lm_eval_generate_until.identical", lm["identical"],
                   lm["text_sha256"] == r["generation_sha256"], "text sha256 equality")
    elif any(v is not None for v in lm.values()):
        bad.append(f"{w} lm_eval_generate_until: results recorded but the cross-check did not run")
    return bad


def valid_generation(g):
    return all(isinstance(g.get(k), str) for k in ("sentence", "user_message", "prompt", "generation")) \
        and isinstance(g.get("generated_ids"), list) and all(is_int(t) for t in g["generated_ids"])


def generations_check(C, name, out, ev, records, s):
    """Row "scores recomputed from the private generations (...)": the hashes of the private texts, the user
    message from the template, and every score and category recomputed from the generated text. Keeps the
    generations by idx in ev["generations"] for the identity level."""
    check = "scores recomputed from the private generations (exact, strict, regex, categories)"
    gens, bad = private_texts(out, name, records, valid_generation, GENERATION_FIELDS, file="generations.jsonl")
    if gens is None:
        C.skip(name, ARITHMETIC, check.split(" (")[0],
               f"private/{name}/generations.jsonl absent (private evidence not shipped); exact/strict/regex scores "
               "checked for consistency only, NOT recomputed from the texts")
        return
    ev["generations"] = gens
    for r in records:
        if r["idx"] in gens:
            bad += private_generation_problems(r, gens[r["idx"]], s)
    C.add(name, ARITHMETIC, check, len(records), bad,
          note="audit.py's own scorers (Python re for the regex), no lm_eval")


def private_generation_problems(r, g, s):
    """One record against its private generation: hashes, the user message, the scores recomputed from the text."""
    bad, w = [], f"idx {r['idx']}"
    for field, text in (("sentence_sha256", g["sentence"]), ("user_message_sha256", g["user_message"]),
                        ("prompt_sha256", g["prompt"]), ("generation_sha256", g["generation"]),
                        ("generated_ids_sha256", json.dumps(g["generated_ids"]))):
        expect(bad, w, field, r[field], sha256_text(text))
    expect(bad, w, "generated_tokens", r["generated_tokens"], len(g["generated_ids"]))
    if isinstance(s.user_prompt, str):
        expect(bad, w, "user_message", g["user_message"], s.user_prompt.replace("{sentence}", g["sentence"]),
               "config.extraction_user_prompt filled with the sentence")
    if g["user_message"] not in g["prompt"]:
        bad.append(f"{w} prompt: does not contain the user message")
    want = ext_scores_from_text(g["generation"], r["label_name"], r["finish_reason"], s.labels, s.fallback)
    for part in ("exact", "strict", "regex", "categories"):
        for k, v in want[part].items():
            expect(bad, w, f"{part}.{k}", r[part][k], v, "recomputed from the private generation")
    if s.lm_ran and isinstance(g.get("lm_eval_generation"), str):
        expect(bad, w, "lm_eval_generate_until.text_sha256", r["lm_eval_generate_until"]["text_sha256"],
               sha256_text(g["lm_eval_generation"]), "sha256 of the private lm-eval generation")
    elif s.lm_ran:
        bad.append(f"{w} private lm_eval_generation: missing")
    return bad


def summary_values_check(C, name, ev, records, s, prereg):
    """Row "summary.json values (...)": summary.json rebuilt from the records and the pre-registered sample; the
    human-review figures are null (the note is the run's own text)."""
    cfg, summ = ev["config"], ev["summary"]
    note = get(summ, "human_review.note") if summ is not None else MISSING
    extra = [] if isinstance(note, str) else ["summary.json human_review.note: not a string"]
    items = [x for x in prereg_items(prereg) if isinstance(x, dict)] if prereg else []
    expected = ext_expected_summary(name, cfg.get("split"), records, s.labels, s.lm_ran,
                                    get(cfg, "audit_sample.preregistration_sha256"), items,
                                    note if isinstance(note, str) else MISSING,
                                    get(summ, "uncertainty") if summ is not None else None)
    limit = limited_hash_selection([], ev)[3]      # its problems are the selection row's
    if limit is not None:
        expected["limit"] = limit
    summary_check(C, name, ev, expected,
                  "summary.json values (counts, paired tables, categories; human-review figures null)", len(records),
                  extra=extra, note=f"intervals and McNemar p recomputed by formula, tolerance {uncertainty.TOL:g}")


def token_counts(records):
    """stages.json["tokens"] recomputed from the records (generated tokens include the final eos)."""
    generated = token_span([r["generated_tokens"] for r in records])
    return {"input_tokens": token_span([r["input_tokens"] for r in records]),
            "generated_tokens": MISSING if generated is MISSING else {**generated, "includes_eos": True},
            "n_items": len(records)}


# ---- level 2, identity ---------------------------------------------------------------------------------------------

def audit_extraction_identity(C, name, ev, records, model_dir, data_parquet):
    """Level 2: prompt re-rendered from the chat template and re-tokenised, generated ids decoded back to the text,
    finish reasons from the ids, and labels/sentences against the data parquet. Returns {idx: (prompt ids,
    generated ids)} for the forward level, or None."""
    if records is None:
        C.skip(name, IDENTITY, "(whole level)", "the arithmetic level found the evidence unusable")
        return None
    tokens = tokenisation_check(C, name, ev, records, model_dir)
    sst2_data_check(C, name, ev["config"], records, data_parquet, "data parquet (label and sentence per idx)")
    return tokens


def tokenisation_check(C, name, ev, records, model_dir):
    """Row TOKENISATION: the eos token, the chat template's hash, and per record the prompt, its token count, the
    finish reason and the text decoded from the generated ids. Returns {idx: (prompt ids, generated ids)} when
    everything passed, else None."""
    cfg, gens, bad = ev["config"], ev["generations"], []
    if gens is None:
        C.skip(name, IDENTITY, TOKENISATION, "needs the private generations (absent)")
        return None
    tok = tokenizer_or_skip(C, name, TOKENISATION, model_dir, ev["identity"], bad)
    if tok is None:
        return None
    eos_id, eos_tok = get(cfg, "generation.eos_token_id"), get(cfg, "generation.eos_token")
    if not is_int(eos_id) or tok.id_to_token(eos_id) != eos_tok:
        bad.append(f"config.json generation.eos_token_id: {short(eos_id)} is not {short(eos_tok)} in "
                   f"{model_dir / 'tokenizer.json'}")
    template = chat_template(model_dir)
    try:
        render, over = chat_renderer(template), None
    except OverBound as e:
        render, over = None, str(e)
    if template is not None:
        expect(bad, "config.json", "prompt.chat_template_sha256", get(cfg, "prompt.chat_template_sha256"),
               sha256_text(template), f"the chat template in {model_dir}")
    result, n_new = {}, get(cfg, "config.extraction_max_new_tokens")
    for r in records:
        g = gens.get(r["idx"])
        if g is None:
            bad.append(f"idx {r['idx']}: no private generation")
            continue
        try:
            result[r["idx"]] = retokenise_generation(tok, render, r, g, eos_id, n_new, bad)
        except OverBound as e:      # past the template worker's bounds: undecided, named below; then without it
            render, over = None, str(e)
            result[r["idx"]] = retokenise_generation(tok, render, r, g, eos_id, n_new, bad)
    C.add(name, IDENTITY, TOKENISATION, len(records), bad,
          note=("chat template re-rendered with jinja2" if render is not None else "prompt NOT re-rendered" if over
                else "jinja2 or the chat template unavailable: prompt NOT re-rendered"))
    if over:
        C.skip(name, IDENTITY, "prompt re-rendered from the chat template", f"{over}; NOT checked")
    return None if bad else result


def retokenise_generation(tok, render, r, g, eos_id, n_new, bad):
    """One record: the prompt from the chat template, its token count, the finish reason from the generated ids,
    and the generation decoded from them. Returns (prompt ids, generated ids)."""
    w = f"idx {r['idx']}"
    if render is not None:
        expect(bad, w, "prompt", g["prompt"], render.render(
            messages=[{"role": "user", "content": g["user_message"]}], add_generation_prompt=True),
            "the chat template rendered with the user message")
    ids = tok.encode(g["prompt"], add_special_tokens=False).ids
    expect(bad, w, "input_tokens", r["input_tokens"], len(ids), "re-tokenised prompt")
    gen = g["generated_ids"]
    ends_eos = bool(gen) and gen[-1] == eos_id
    expect(bad, w, "finish_reason", r["finish_reason"], "eos" if ends_eos else "length", "from the generated ids")
    if eos_id in gen[:-1]:
        bad.append(f"{w} generated_ids: eos before the end")
    if not ends_eos and is_int(n_new) and len(gen) != n_new:
        bad.append(f"{w} generated_ids: {len(gen)} ids without eos, the limit is {n_new}")
    expect(bad, w, "generation", g["generation"], tok.decode(gen[:-1] if ends_eos else gen, skip_special_tokens=False),
           "the generated ids decoded (final eos removed)")
    return ids, gen
