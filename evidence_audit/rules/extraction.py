"""The extraction experiment's rule: one greedy generation per item, three scorers, a pre-registered human-audit
sample, and the import of a filled review sheet (--review)."""
import json
import sys
from pathlib import Path

from evidence_audit.checks import MISSING, compare_tree, expect, get, short
from evidence_audit.definitions import SPLITS, is_int, is_sha, select_items
from evidence_audit.forward import FORWARD_TOL, forget_scores, llama_logprobs, load_llama, use_threads
from evidence_audit.reading import (REQUIRED, Unreadable, load_evidence, read_json, read_jsonl, resolve_cache,
                                    sha256_file, sha256_text)
from evidence_audit.shared import (IDENTITY_DECLARED, IDENTITY_RECOMPUTED, check_scoring_identity, environment_check,
                                   stage_time_problems)
from evidence_audit.tokens import load_tokenizer

# ---- the extraction experiment (seed study 001) ------------------------------------------------------------------
# One greedy generation per item, scored three ways; a human-audit sample chosen before generation. Every rule is
# written out again here from its definition (experiments/extraction*.py and lm_eval are not imported):
#   exact     [strip(y) == json.dumps({"sentiment": label})]
#   strict    json.loads(y) (no NaN/Infinity) is an object, no duplicate key at any level, keys exactly
#             {"sentiment"}, value "positive"|"negative"; reason = the first failing step of EXT_STRICT_REASONS
#   regex     re.findall(r"(?i)\b(positive|negative)\b", y): first match (stripped) or the fallback; prediction
#             = match lowercased; correct = prediction == label (audit.py uses Python's re here, a third
#             implementation next to lm-eval's RegexFilter and the experiment's character scan)
#   sample    per class, rank idx by sha256(f"{salt}:{idx}"), first per_class, interleave (lowest label first)
#   review    (--review SHEET) over decidable items (stance positive/negative) with an undisputed reference:
#             disagreement = [regex correct != human content_correct]; FP = regex right, human wrong; FN = the
#             reverse; class-weighted estimate (weights N_c/n_c) only when every sampled item is decidable

REVIEW_SHEET = None          # --review SHEET: a filled review sheet exported by the extraction review page
EXT_PREREG = "extraction.preregistration.json"
EXT_SHEET_FORMAT = "extraction-review-sheet/v1"
EXT_STANCES = ("positive", "negative", "uncertain", "no_conclusion")
EXT_STRICT_REASONS = ("empty", "code_fence", "not_json", "not_object", "duplicate_key", "missing_key", "extra_keys",
                      "bad_value", "wrong_label")
EXT_CATEGORIES = ("no_match", "several_matches", "conflicting_matches", "format_failure", "length_stop")
EXT_SCORERS = ("exact", "strict", "regex")
EXT_REVIEW_KEYS = ("sheet", "n_reviewed", "n_decidable_undisputed", "disagreement_rate", "false_positives",
                   "false_negatives", "weighted_disagreement_rate")
EXT_RECORD_FIELDS = {
    "idx": is_int, "rank": is_int, "label": is_int, "label_name": lambda v: isinstance(v, str),
    "sentence_sha256": is_sha, "user_message_sha256": is_sha, "prompt_sha256": is_sha, "input_tokens": is_int,
    "generated_tokens": is_int, "finish_reason": lambda v: v in ("eos", "length"), "generation_sha256": is_sha,
    "generated_ids_sha256": is_sha, "exact": lambda v: isinstance(v, dict), "strict": lambda v: isinstance(v, dict),
    "regex": lambda v: isinstance(v, dict), "categories": lambda v: isinstance(v, dict),
    "lm_eval_generate_until": lambda v: isinstance(v, dict),
    "audit_position": lambda v: v is None or is_int(v),
}
EXT_SUB_FIELDS = {
    "exact": {"correct": lambda v: v in (0, 1) and is_int(v)},
    "strict": {"reason": lambda v: v is None or v in EXT_STRICT_REASONS, "format_ok": is_int, "correct": is_int},
    "regex": {"official": lambda v: isinstance(v, str), "independent": lambda v: isinstance(v, str),
              "n_matches": is_int, "pred": lambda v: v is None or isinstance(v, str), "correct": is_int},
    "categories": {k: is_int for k in EXT_CATEGORIES},
    "lm_eval_generate_until": {"identical": lambda v: v is None or isinstance(v, bool),
                               "input_ids_identical": lambda v: v is None or isinstance(v, bool),
                               "text_sha256": lambda v: v is None or is_sha(v)},
}


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


def ext_record_problems(r):
    where = f"idx {r.get('idx', '?')}" if isinstance(r, dict) else "record"
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = [f"{where} {k}: missing" if k not in r else f"{where} {k}: wrong type ({short(r[k], 60)})"
           for k, ok in EXT_RECORD_FIELDS.items() if k not in r or not ok(r[k])]
    bad += [f"{where} {k}: a field audit.py has no rule for" for k in r if k not in EXT_RECORD_FIELDS]
    for sub, fields in EXT_SUB_FIELDS.items():
        d = r.get(sub)
        if not isinstance(d, dict):
            continue
        bad += [f"{where} {sub}.{k}: missing" if k not in d else f"{where} {sub}.{k}: wrong type ({short(d[k], 60)})"
                for k, ok in fields.items() if k not in d or not ok(d[k])]
        bad += [f"{where} {sub}.{k}: a field audit.py has no rule for" for k in d if k not in fields]
    return bad


def ext_paired(rec, a, b, idx):
    ra, rb = rec[a], rec[b]
    return {"a": a, "b": b, "both_correct": sum(bool(ra[i] and rb[i]) for i in idx),
            "neither": sum(bool(not ra[i] and not rb[i]) for i in idx),
            "only_a": sum(bool(ra[i] and not rb[i]) for i in idx), "only_b": sum(bool(rb[i] and not ra[i]) for i in idx),
            "only_a_idx": [i for i in idx if ra[i] and not rb[i]], "only_b_idx": [i for i in idx if rb[i] and not ra[i]]}


def ext_expected_summary(name, split, records, labels, lm_ran, prereg_sha, prereg_items, review_note):
    n = len(records)
    idx = [r["idx"] for r in records]
    corr = {s: {r["idx"]: r[s]["correct"] for r in records} for s in EXT_SCORERS}
    preds = [r["regex"]["pred"] for r in records]
    patterns = {}
    for r in records:
        patterns.setdefault("".join(str(r[s]["correct"]) for s in EXT_SCORERS), []).append(r["idx"])
    cats = {k: sum(r["categories"][k] for r in records) for k in EXT_CATEGORIES}
    lm = [r["lm_eval_generate_until"] for r in records]
    if lm_ran:
        gen = {"n_compared": n, "n_identical": sum(bool(x["identical"]) for x in lm),
               "n_input_ids_identical": sum(bool(x["input_ids_identical"]) for x in lm)}
        gen.update(all_identical=gen["n_identical"] == n and gen["n_input_ids_identical"] == n,
                   mismatch_idx=[r["idx"] for r in records if not r["lm_eval_generate_until"]["identical"]], ran=True)
    else:
        gen = {"ran": False, "n_compared": 0, "n_identical": None, "n_input_ids_identical": None,
               "all_identical": None, "mismatch_idx": []}
    return {
        "experiment": name, "split": split, "confirmation_items_scored": split == "confirm", "n_items": n,
        "label_counts": {str(k): sum(r["label"] == k for r in records) for k in range(len(labels))},
        "constant_answer_baselines": {f"always_{l}": sum(r["label_name"] == l for r in records) for l in labels},
        "scorers": {
            "exact": {"correct": sum(corr["exact"].values()), "accuracy": sum(corr["exact"].values()) / n},
            "strict": {"correct": sum(corr["strict"].values()), "accuracy": sum(corr["strict"].values()) / n,
                       "format_ok": sum(r["strict"]["format_ok"] for r in records),
                       "reasons": {k: sum(r["strict"]["reason"] == k for r in records) for k in EXT_STRICT_REASONS}},
            "regex": {"correct": sum(corr["regex"].values()), "accuracy": sum(corr["regex"].values()) / n,
                      "pred_counts": {**{l: preds.count(l) for l in labels}, "none": preds.count(None)}},
        },
        "paired": {f"{a}_vs_{b}": ext_paired(corr, a, b, idx)
                   for a, b in (("exact", "strict"), ("exact", "regex"), ("strict", "regex"))},
        "patterns": {k: {"n": len(v), "idx": v} for k, v in sorted(patterns.items())},
        "match_failures": {"all": cats,
                           "regex_wrong": {k: sum(r["categories"][k] for r in records if not r["regex"]["correct"])
                                           for k in EXT_CATEGORIES},
                           "regex_right": {k: sum(r["categories"][k] for r in records if r["regex"]["correct"])
                                           for k in EXT_CATEGORIES}},
        "finish_reasons": {k: sum(r["finish_reason"] == k for r in records) for k in ("eos", "length")},
        "regex_agreement": {"n_items": n, "n_mismatches": sum(r["regex"]["official"] != r["regex"]["independent"]
                                                               for r in records)},
        "lm_eval_generate_until": gen,
        "audit_sample": {"preregistration_sha256": prereg_sha, "n": len(prereg_items),
                         "idx": [s["idx"] for s in prereg_items],
                         "per_class": {str(k): sum(s["label"] == k for s in prereg_items) for k in range(len(labels))}},
        # a run never has human-review figures: they are null until a sheet is imported here (--review)
        "human_review": {**{k: None for k in EXT_REVIEW_KEYS}, "note": review_note},
    }



def ext_load(out, name):
    """The common evidence files, plus the pre-registration (as text: its sha256 is a claim) and the private
    generations."""
    ev = load_evidence(out, name)
    p = out / EXT_PREREG
    ev["prereg_text"] = p.read_text(encoding="utf-8") if p.exists() else None
    gp = out / "private" / name / "generations.jsonl"
    ev["generations"] = read_jsonl(gp) if gp.exists() else None
    return ev


def audit_extraction_arithmetic(C, name, out, ev):
    """Level 1 (+ the scorers recomputed from the private generations when present). Returns the records when the
    deeper levels and the review may use them, else None."""
    A = "arithmetic"
    cfg, ident, records, summ, stages = (ev.get(k) for k in ("config", "identity", "records", "summary", "stages"))
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    if ev["environment"] is None:
        missing.insert(0, "../environment.json")
    if ev["prereg_text"] is None:
        missing.append(f"../{EXT_PREREG}")
    C.add(name, A, "required files (+ the pre-registration written before generation)", len(REQUIRED) + 2,
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    if cfg is None or records is None:
        C.skip(name, A, "(rest of the level)", "config.json or records.jsonl missing; nothing to recompute from")
        return None

    # -- config consistency --
    bad = []
    conf = cfg.get("config") if isinstance(cfg.get("config"), dict) else {}
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split = cfg.get("split")
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
        bad.append(f"config.json: max_new_tokens {short(n_new)} / max_input_tokens {short(limit)} are not positive ints")
    if split not in SPLITS:
        bad.append(f"config.json split: {short(split)} is not one of {SPLITS}")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    expect(bad, "config.json", "selection.split", sel.get("split", MISSING), split)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING),
           split == "confirm")
    for sel_key, conf_key in (("salt", "selection_salt"), ("n_dev", "n_dev"), ("n_confirm", "n_confirm"),
                              ("n_smoke", "n_smoke"), ("rule", "selection_rule")):
        expect(bad, "config.json", f"selection.{sel_key}", sel.get(sel_key, MISSING), conf.get(conf_key, MISSING))
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("data", MISSING))
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), conf.get("model", MISSING))
    # the alternatives have distinct first letters and equal length, so their order cannot change a match
    import itertools
    rx = conf.get("extraction_regex", MISSING)
    allowed = [r"(?i)\b(" + "|".join(p) + r")\b" for p in itertools.permutations(labels)]
    if rx not in allowed:
        bad.append(f"config.json config.extraction_regex: {short(rx)} is not the first-match whole-word "
                   f"case-insensitive rule over the label names ({allowed[0]!r})")
    expect(bad, "config.json", "official.filter_list", get(cfg, "official.filter_list"),
           [{"name": "extract", "filter": [{"function": "regex", "regex_pattern": rx, "group_select": 0,
                                            "fallback": fallback}, {"function": "take_first"}]}],
           "lm-eval filters: regex (first match) then take_first")
    expect(bad, "config.json", "generation.generate_call.do_sample", get(cfg, "generation.generate_call.do_sample"),
           False, "greedy")
    expect(bad, "config.json", "generation.generate_call.max_new_tokens",
           get(cfg, "generation.generate_call.max_new_tokens"), n_new)
    lm_meta = get(cfg, "official.generate_until")
    lm_ran = isinstance(lm_meta, dict)
    expect(bad, "config.json", "official.generate_until (ran)", lm_ran, conf.get("extraction_crosscheck_lm_eval") is True,
           "config.extraction_crosscheck_lm_eval")
    if lm_ran:
        expect(bad, "config.json", "official.generate_until.gen_kwargs", lm_meta.get("gen_kwargs", MISSING),
               {"until": [], "max_gen_toks": n_new, "do_sample": False}, "stop only at eos, greedy")
        expect(bad, "config.json", "official.generate_until.hflm.max_length", get(lm_meta, "hflm.max_length"),
               limit + n_new if is_int(limit) and is_int(n_new) else MISSING, "no left truncation of admissible input")
    if ident is not None:
        check_scoring_identity(bad, conf, ident)
        expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
               sha256_text(json.dumps(cfg.get("official"), sort_keys=True)), "sha256 of config.json official")
        tmpl = conf.get("extraction_user_prompt")
        expect(bad, "config.json", "prompt.user_template", get(cfg, "prompt.user_template"), tmpl)
        if isinstance(tmpl, str):
            expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
                   sha256_text(tmpl))
        for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                         ("data_content_sha256", "data_content_sha256")):
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
        bad += [f"identity.json {k}: a field audit.py has no rule for" for k in ident
                if k not in IDENTITY_RECOMPUTED | IDENTITY_DECLARED]
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split)
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING), conf.get("threads", MISSING))
    C.add(name, A, "config consistency (split, selection, scorers, greedy settings, identity.json)", 1, bad,
          note="CONFIRMATION SPLIT SCORED" if split == "confirm" else "")
    environment_check(C, name, ev)

    bad = []
    for r in records:
        bad += ext_record_problems(r)
    C.add(name, A, "record fields and types", len(records), bad)
    if bad:
        C.skip(name, A, "(rest of the level)", "records.jsonl has malformed records (see 'record fields and types')")
        return None

    # -- selection --
    bad = []
    idx_list = [r["idx"] for r in records]
    want, why = (None, "selection settings in config.json are unusable")
    if all(is_int(x) for x in (cfg.get("n_rows"), sel.get("n_dev"), sel.get("n_confirm"), sel.get("n_smoke"))) \
            and isinstance(sel.get("salt"), str):
        want, why = select_items(split, sel["salt"], cfg["n_rows"], sel["n_dev"], sel["n_confirm"], sel["n_smoke"])
    if want is None:
        bad.append(f"config.json selection: {why}")
    else:
        expect(bad, "records.jsonl", "idx (in rank order)", idx_list, want, "the selection hash rule")
        expect(bad, "config.json", "selection.item_idx", sel.get("item_idx", MISSING), want)
    for rank, r in enumerate(records):
        expect(bad, f"idx {r['idx']}", "rank", r["rank"], rank, "line position")
        if not 0 <= r["label"] < len(labels):
            bad.append(f"idx {r['idx']} label: {r['label']} is not a label index")
        else:
            expect(bad, f"idx {r['idx']}", "label_name", r["label_name"], labels[r["label"]])
    C.add(name, A, "item selection (hash rule, rank order, labels)", len(records), bad)

    # -- the pre-registered audit sample: recomputed from idx and labels only; written before generation --
    bad = []
    prereg_cfg = get(cfg, "audit_sample")
    prereg = None
    if ev["prereg_text"] is None:
        bad.append(f"{EXT_PREREG}: missing; the sample cannot be shown to predate the generations")
    else:
        expect(bad, EXT_PREREG, "sha256", sha256_text(ev["prereg_text"]),
               get(cfg, "audit_sample.preregistration_sha256"), "config.json audit_sample.preregistration_sha256")
        try:
            prereg = json.loads(ev["prereg_text"])
        except json.JSONDecodeError as e:
            raise Unreadable(f"{out / EXT_PREREG}: line {e.lineno}: unparseable JSON ({e.msg})")
        expect(bad, "config.json", "audit_sample.preregistration", get(cfg, "audit_sample.preregistration"), prereg,
               f"must be the content of {EXT_PREREG}")
    if isinstance(prereg, dict):
        salt, per = prereg.get("salt"), prereg.get("per_class")
        expect(bad, EXT_PREREG, "salt", salt, conf.get("extraction_audit_salt", MISSING))
        expect(bad, EXT_PREREG, "per_class", per, conf.get("extraction_audit_per_class", MISSING))
        expect(bad, EXT_PREREG, "split", prereg.get("split", MISSING), split)
        expect(bad, EXT_PREREG, "population.item_idx", get(prereg, "population.item_idx"), idx_list)
        expect(bad, EXT_PREREG, "population.labels", get(prereg, "population.labels"), [r["label"] for r in records])
        expect(bad, EXT_PREREG, "population.data_content_sha256", get(prereg, "population.data_content_sha256"),
               cfg.get("data_content_sha256", MISSING))
        items = prereg.get("items") if isinstance(prereg.get("items"), list) else []
        if isinstance(salt, str) and is_int(per):
            want_s = ext_sample([(r["idx"], r["label"]) for r in records], salt, per)
            got_s = [{k: s.get(k) for k in ("position", "idx", "label", "rank_key")} if isinstance(s, dict) else s
                     for s in items]
            expect(bad, EXT_PREREG, "items (position, idx, label, rank_key)", got_s, want_s,
                   "recomputed from idx, labels, salt and per_class")
            pop, got_n = {}, {}
            for r in records:
                pop[r["label"]] = pop.get(r["label"], 0) + 1
            for s in want_s:
                got_n[s["label"]] = got_n.get(s["label"], 0) + 1
            expect(bad, EXT_PREREG, "class_weights", prereg.get("class_weights", MISSING),
                   {str(c): {"population": pop[c], "sampled": got_n.get(c, 0),
                             "weight": f"{pop[c]}/{got_n[c]}" if got_n.get(c) else None,
                             "weight_float": pop[c] / got_n[c] if got_n.get(c) else None} for c in sorted(pop)})
        by_idx = {r["idx"]: r for r in records}
        for s in items:
            if not isinstance(s, dict) or s.get("idx") not in by_idx:
                bad.append(f"{EXT_PREREG} items: {short(s, 60)} is not a scored item")
                continue
            r = by_idx[s["idx"]]
            expect(bad, f"idx {s['idx']}", "pre-registered sentence_sha256", s.get("sentence_sha256"),
                   r["sentence_sha256"])
            expect(bad, f"idx {s['idx']}", "pre-registered label_name", s.get("label_name"), r["label_name"])
        positions = {s.get("idx"): s.get("position") for s in items if isinstance(s, dict)}
        for r in records:
            expect(bad, f"idx {r['idx']}", "audit_position", r["audit_position"], positions.get(r["idx"]))
        created, started = prereg.get("created_at_utc"), get(cfg, "generation.generation_started_utc")
        try:
            from datetime import datetime
            if not datetime.fromisoformat(created) < datetime.fromisoformat(started):
                bad.append(f"{EXT_PREREG} created_at_utc: {created} is not before the generation started ({started})")
        except (TypeError, ValueError):
            bad.append(f"{EXT_PREREG} created_at_utc / config.json generation.generation_started_utc: "
                       f"{short(created)} / {short(started)} are not comparable ISO times")
        if stages is not None and isinstance(stages.get("stages"), list):
            names = [s.get("name") for s in stages["stages"] if isinstance(s, dict)]
            if not ("audit_sample_preregistration" in names and "model_load" in names
                    and names.index("audit_sample_preregistration") < names.index("model_load")):
                bad.append("stages.json: the audit sample was not written before the model was loaded "
                           f"(stages {names})")
    C.add(name, A, "audit sample (recomputed from idx/labels/salt; written before the model was loaded)",
          len(prereg.get("items", [])) if isinstance(prereg, dict) else 0, bad)

    # -- per-item consistency from the public fields alone --
    bad = []
    for r in records:
        w, rx, st, ca = f"idx {r['idx']}", r["regex"], r["strict"], r["categories"]
        expect(bad, w, "regex.independent", rx["independent"], rx["official"],
               "lm-eval's extraction and the independent one must agree")
        low = rx["official"].lower()
        pred = None if rx["official"] == fallback or low not in labels else low
        expect(bad, w, "regex.pred", rx["pred"], pred, "the official extraction lowercased")
        expect(bad, w, "regex.correct", rx["correct"], int(pred == r["label_name"]))
        expect(bad, w, "strict.format_ok", st["format_ok"], int(st["reason"] in (None, "wrong_label")))
        expect(bad, w, "strict.correct", st["correct"], int(st["reason"] is None))
        if st["reason"] is None and rx["correct"] != 1:
            bad.append(f"{w} regex.correct: a strictly correct answer has the label as its only sentiment word")
        if r["exact"]["correct"] and st["reason"] is not None:
            bad.append(f"{w} strict.reason: the canonical string is strictly valid, found {st['reason']!r}")
        expect(bad, w, "categories.no_match", ca["no_match"], int(rx["n_matches"] == 0))
        expect(bad, w, "categories.no_match vs fallback", ca["no_match"], int(rx["official"] == fallback))
        expect(bad, w, "categories.several_matches", ca["several_matches"], int(rx["n_matches"] > 1))
        if ca["conflicting_matches"] and not ca["several_matches"]:
            bad.append(f"{w} categories.conflicting_matches: conflicting matches need several matches")
        expect(bad, w, "categories.format_failure", ca["format_failure"], int(st["reason"] not in (None, "wrong_label")))
        expect(bad, w, "categories.length_stop", ca["length_stop"], int(r["finish_reason"] == "length"))
        if is_int(n_new):
            if r["finish_reason"] == "length" and r["generated_tokens"] != n_new:
                bad.append(f"{w} generated_tokens: {r['generated_tokens']} with a length stop (limit {n_new})")
            if not 1 <= r["generated_tokens"] <= n_new:
                bad.append(f"{w} generated_tokens: {r['generated_tokens']} outside 1..{n_new}")
        if is_int(limit) and not 1 <= r["input_tokens"] <= limit:
            bad.append(f"{w} input_tokens: {r['input_tokens']} outside 1..{limit} (over the limit is an error)")
        lm = r["lm_eval_generate_until"]
        if lm_ran:
            if lm["identical"] is None or lm["text_sha256"] is None:
                bad.append(f"{w} lm_eval_generate_until: the cross-check ran but this item has no result")
            else:
                expect(bad, w, "lm_eval_generate_until.identical", lm["identical"],
                       lm["text_sha256"] == r["generation_sha256"], "text sha256 equality")
        elif any(v is not None for v in lm.values()):
            bad.append(f"{w} lm_eval_generate_until: results recorded but the cross-check did not run")
    C.add(name, A, "per-item scores and categories (consistency of the public fields)", len(records), bad)

    # -- the scorers recomputed from the private generations --
    gens = ev["generations"]
    if gens is None:
        C.skip(name, A, "scores recomputed from the private generations",
               f"private/{name}/generations.jsonl absent (private evidence not shipped); exact/strict/regex scores "
               "checked for consistency only, NOT recomputed from the texts")
    else:
        bad, by = [], {}
        for n_line, g in enumerate(gens, start=1):
            if not (isinstance(g, dict) and is_int(g.get("idx")) and all(isinstance(g.get(k), str) for k in (
                    "sentence", "user_message", "prompt", "generation"))
                    and isinstance(g.get("generated_ids"), list) and all(is_int(t) for t in g["generated_ids"])):
                bad.append(f"private/{name}/generations.jsonl line {n_line}: malformed ({short(g, 60)})")
                continue
            if g["idx"] in by:
                bad.append(f"idx {g['idx']} private generations: duplicated (line {n_line})")
            by[g["idx"]] = g
        bad += [f"idx {i} private generations: no record for this idx" for i in by if i not in set(idx_list)]
        tmpl = conf.get("extraction_user_prompt")
        for r in records:
            g, w = by.get(r["idx"]), f"idx {r['idx']}"
            if g is None:
                bad.append(f"{w} private generations: missing")
                continue
            expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(g["sentence"]))
            expect(bad, w, "user_message_sha256", r["user_message_sha256"], sha256_text(g["user_message"]))
            expect(bad, w, "prompt_sha256", r["prompt_sha256"], sha256_text(g["prompt"]))
            expect(bad, w, "generation_sha256", r["generation_sha256"], sha256_text(g["generation"]))
            expect(bad, w, "generated_ids_sha256", r["generated_ids_sha256"], sha256_text(json.dumps(g["generated_ids"])))
            expect(bad, w, "generated_tokens", r["generated_tokens"], len(g["generated_ids"]))
            if isinstance(tmpl, str):
                expect(bad, w, "user_message", g["user_message"], tmpl.replace("{sentence}", g["sentence"]),
                       "config.extraction_user_prompt filled with the sentence")
            if g["user_message"] not in g["prompt"]:
                bad.append(f"{w} prompt: does not contain the user message")
            want = ext_scores_from_text(g["generation"], r["label_name"], r["finish_reason"], labels, fallback)
            for part in ("exact", "strict", "regex", "categories"):
                for k, v in want[part].items():
                    expect(bad, w, f"{part}.{k}", r[part][k], v, "recomputed from the private generation")
            if lm_ran and isinstance(g.get("lm_eval_generation"), str):
                expect(bad, w, "lm_eval_generate_until.text_sha256", r["lm_eval_generate_until"]["text_sha256"],
                       sha256_text(g["lm_eval_generation"]), "sha256 of the private lm-eval generation")
            elif lm_ran:
                bad.append(f"{w} private lm_eval_generation: missing")
        C.add(name, A, "scores recomputed from the private generations (exact, strict, regex, categories)",
              len(records), bad, note="audit.py's own scorers (Python re for the regex), no lm_eval")

    # -- summary.json and stages.json --
    prereg_items = prereg.get("items", []) if isinstance(prereg, dict) else []
    prereg_items = [s for s in prereg_items if isinstance(s, dict)]
    if summ is None:
        C.skip(name, A, "summary.json values", "summary.json missing (named under 'required files')")
    else:
        bad = []
        note = get(summ, "human_review.note")
        if not isinstance(note, str):
            bad.append("summary.json human_review.note: not a string")
        compare_tree(bad, "summary.json", summ, ext_expected_summary(
            name, split, records, labels, lm_ran, get(cfg, "audit_sample.preregistration_sha256"), prereg_items,
            note if isinstance(note, str) else MISSING))
        C.add(name, A, "summary.json values (counts, paired tables, categories; human-review figures null)",
              len(records), bad)
    if stages is None:
        C.skip(name, A, "stages.json token counts", "stages.json missing (named under 'required files')")
    else:
        bad = []
        it, gt = [r["input_tokens"] for r in records], [r["generated_tokens"] for r in records]
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), {
            "input_tokens": {"min": min(it), "max": max(it), "total": sum(it)},
            "generated_tokens": {"min": min(gt), "max": max(gt), "total": sum(gt), "includes_eos": True},
            "n_items": len(records)}, "tokens.")
        bad += stage_time_problems(stages)
        C.add(name, A, "stages.json token counts", len(records), bad,
              note="wall times and RSS are measurements: sanity-checked, not recomputed")
    return records


def audit_extraction_identity(C, name, out, cfg, ident, records, gens, model_dir, data_parquet):
    """Level 2: prompt re-rendered from the chat template and re-tokenised, generated ids decoded back to the text,
    finish reasons from the ids, and labels/sentences against the data parquet. Returns {idx: (prompt ids,
    generated ids)} for the forward level, or None."""
    L = "identity"
    if records is None:
        C.skip(name, L, "(whole level)", "the arithmetic level found the evidence unusable")
        return None
    result = None
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    if gens is None:
        C.skip(name, L, "tokenisation (prompt ids, generated ids -> text, finish reason)",
               "needs the private generations (absent)")
    elif tok_path is None or not tok_path.exists():
        C.skip(name, L, "tokenisation (prompt ids, generated ids -> text, finish reason)",
               f"tokenizer not found ({tok_path}); pass --cache with the prepared cache")
    else:
        bad = []
        tok = load_tokenizer(tok_path)
        expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
               if ident else MISSING, "identity.json tokenizer_sha256")
        eos_id, eos_tok = get(cfg, "generation.eos_token_id"), get(cfg, "generation.eos_token")
        if not is_int(eos_id) or tok.id_to_token(eos_id) != eos_tok:
            bad.append(f"config.json generation.eos_token_id: {short(eos_id)} is not {short(eos_tok)} in {tok_path}")
        n_new = get(cfg, "config.extraction_max_new_tokens")
        by = {g["idx"]: g for g in gens if isinstance(g, dict) and is_int(g.get("idx"))}
        # the chat template, rendered as transformers does (jinja2 sandbox, trim_blocks, lstrip_blocks)
        template, render = None, None
        tc = model_dir / "tokenizer_config.json"
        if tc.exists():
            template = read_json(tc).get("chat_template")
        if template is None and (model_dir / "chat_template.jinja").exists():
            template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            if isinstance(template, str):
                render = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
        except ImportError:
            render = None
        if isinstance(template, str):
            expect(bad, "config.json", "prompt.chat_template_sha256", get(cfg, "prompt.chat_template_sha256"),
                   sha256_text(template), f"the chat template in {model_dir}")
        result = {}
        for r in records:
            g, w = by.get(r["idx"]), f"idx {r['idx']}"
            if g is None:
                bad.append(f"{w}: no private generation")
                continue
            if render is not None:
                expect(bad, w, "prompt", g["prompt"], render.render(
                    messages=[{"role": "user", "content": g["user_message"]}], add_generation_prompt=True),
                    "the chat template rendered with the user message")
            ids = tok.encode(g["prompt"], add_special_tokens=False).ids
            expect(bad, w, "input_tokens", r["input_tokens"], len(ids), "re-tokenised prompt")
            gen = g["generated_ids"]
            ends_eos = bool(gen) and gen[-1] == eos_id
            expect(bad, w, "finish_reason", r["finish_reason"], "eos" if ends_eos else "length",
                   "from the generated ids")
            if eos_id in gen[:-1]:
                bad.append(f"{w} generated_ids: eos before the end")
            if not ends_eos and is_int(n_new) and len(gen) != n_new:
                bad.append(f"{w} generated_ids: {len(gen)} ids without eos, the limit is {n_new}")
            text_ids = gen[:-1] if ends_eos else gen
            expect(bad, w, "generation", g["generation"], tok.decode(text_ids, skip_special_tokens=False),
                   "the generated ids decoded (final eos removed)")
            result[r["idx"]] = (ids, gen)
        C.add(name, L, "tokenisation (prompt ids, generated ids -> text, finish reason)", len(records), bad,
              note=("chat template re-rendered with jinja2" if render is not None
                    else "jinja2 or the chat template unavailable: prompt NOT re-rendered"))
        if bad:
            result = None
    if data_parquet is None or not data_parquet.exists():
        C.skip(name, L, "data parquet (label and sentence per idx)", f"data parquet not found ({data_parquet})")
    else:
        import pyarrow.parquet as pq
        bad = []
        cols = pq.read_table(data_parquet).to_pydict()
        rows = {int(i): (int(l), s) for i, l, s in zip(cols["idx"], cols["label"], cols["sentence"])}
        expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows), f"rows in {data_parquet}")
        content = "".join(f"{i}\t{rows[i][0]}\t{rows[i][1]}\n" for i in sorted(rows))
        expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING), sha256_text(content))
        for r in records:
            if r["idx"] not in rows:
                bad.append(f"idx {r['idx']} idx: not in the data")
                continue
            expect(bad, f"idx {r['idx']}", "label", r["label"], rows[r["idx"]][0], "label in the data")
            expect(bad, f"idx {r['idx']}", "sentence_sha256", r["sentence_sha256"], sha256_text(rows[r["idx"]][1]))
        C.add(name, L, "data parquet (label and sentence per idx)", len(records), bad, note=str(data_parquet))
    return result


def audit_extraction_forward(C, name, ident, records, tokens, model_dir):
    """Level 3: audit.py's own Llama forward over prompt + generation; every generated token must be the argmax
    (greedy) at its position, up to a numerical near-tie (top-1 minus recorded token log-prob <= FORWARD_TOL)."""
    L = "forward"
    if tokens is None:
        C.skip(name, L, "greedy tokens (argmax at every generated position)",
               "needs verified prompt and generated ids from the identity level")
        return None
    model, why = load_llama(model_dir)
    if model is None:
        C.skip(name, L, "greedy tokens (argmax at every generated position)", why)
        return None
    import torch
    use_threads()
    bad, ties, min_margin = [], 0, None
    expect(bad, str(model_dir / "model.safetensors"), "sha256", sha256_file(model_dir / "model.safetensors"),
           ident.get("model_sha256", MISSING) if ident else MISSING, "identity.json model_sha256")
    n_pos = 0
    for r in records:
        ids, gen = tokens[r["idx"]]
        seq = ids + gen
        lp = llama_logprobs(model, seq[:-1])
        forget_scores(model, seq[:-1])       # one use per sequence: do not keep 20 MB per item
        for k, t in enumerate(gen):
            row = lp[len(ids) - 1 + k]
            top = int(torch.argmax(row))
            n_pos += 1
            if top != t:
                gap = float(row[top] - row[t])
                if gap <= FORWARD_TOL:
                    ties += 1
                else:
                    bad.append(f"idx {r['idx']} generated_ids[{k}]: {t} is not the greedy token ({top}, "
                               f"log-prob gap {gap:.3g})")
            else:
                second = float(torch.topk(row, 2).values[1])
                margin = float(row[t]) - second
                min_margin = margin if min_margin is None else min(min_margin, margin)
    C.add(name, L, "greedy tokens (argmax at every generated position)", len(records), bad,
          note=f"{n_pos} positions, {ties} numerical near-ties, smallest top-1 margin "
               f"{min_margin if min_margin is None else round(min_margin, 6)} (max |recomputed - greedy| tol "
               f"{FORWARD_TOL:g})")
    return {"positions": n_pos, "near_ties": ties, "min_margin": min_margin}


def ext_review(sheet_path, cfg, records):
    """Import a review sheet. Returns (figures, problems): problems lists every missing field or binding mismatch;
    figures are computed only when there are none (otherwise every figure is null)."""
    null = {**{k: None for k in EXT_REVIEW_KEYS}, "sheet": str(sheet_path)}
    sheet = read_json(sheet_path)
    problems = []
    if not isinstance(sheet, dict):
        return {**null, "refused": True}, [f"{sheet_path}: not a JSON object"]
    labels = get(cfg, "config.extraction_labels")
    prereg = get(cfg, "audit_sample.preregistration")
    sample = prereg.get("items", []) if isinstance(prereg, dict) else []
    by_idx = {r["idx"]: r for r in records}
    expect(problems, "sheet", "sheet_format", sheet.get("sheet_format", MISSING), EXT_SHEET_FORMAT)
    expect(problems, "sheet", "preregistration_sha256", sheet.get("preregistration_sha256", MISSING),
           get(cfg, "audit_sample.preregistration_sha256"), "the sheet must belong to this pre-registered sample")
    items = sheet.get("items")
    if not isinstance(items, list) or len(items) != len(sample):
        problems.append(f"sheet items: {len(items) if isinstance(items, list) else 'no'} items, the sample has "
                        f"{len(sample)}")
        items = []
    missing = []
    rv = sheet.get("reviewer") if isinstance(sheet.get("reviewer"), dict) else {}
    if not (isinstance(rv.get("name"), str) and rv["name"].strip()):
        missing.append("reviewer.name: blank")
    t = rv.get("time")
    if not (isinstance(t, str) and t.strip()):
        missing.append("reviewer.time: blank")
    else:
        try:
            from datetime import datetime
            datetime.fromisoformat(t.strip())
        except ValueError:
            missing.append(f"reviewer.time: {t!r} is not an ISO 8601 date-time")
    for s, it in zip(sample, items):
        w = f"position {s.get('position')} (idx {s.get('idx')})"
        if not isinstance(it, dict):
            problems.append(f"{w}: not a JSON object")
            continue
        expect(problems, w, "idx", it.get("idx", MISSING), s.get("idx"))
        expect(problems, w, "position", it.get("position", MISSING), s.get("position"))
        r = by_idx.get(s.get("idx"))
        if r is not None:
            expect(problems, w, "sentence_sha256", it.get("sentence_sha256", MISSING), r["sentence_sha256"])
            expect(problems, w, "answer_sha256", it.get("answer_sha256", MISSING), r["generation_sha256"],
                   "the answer the reviewer saw must be this run's generation")
        if it.get("final_stance") not in EXT_STANCES:
            missing.append(f"{w} final_stance: " + ("blank" if it.get("final_stance") in (None, "")
                                                    else f"{it.get('final_stance')!r} is not one of {EXT_STANCES}"))
        for k in ("content_correct", "format_compliant", "reference_disputed"):
            if not isinstance(it.get(k), bool):
                missing.append(f"{w} {k}: " + ("blank" if it.get(k) is None else f"{it.get(k)!r} is not true/false"))
        if not (isinstance(it.get("reason"), str) and it["reason"].strip()):
            missing.append(f"{w} reason: blank")
    if problems or missing:
        return {**null, "refused": True, "missing_fields": missing, "binding_problems": problems}, problems + missing

    # -- the figures, over decidable items with an undisputed reference --
    rows = []
    for s, it in zip(sample, items):
        r = by_idx[s["idx"]]
        decidable = it["final_stance"] in labels and not it["reference_disputed"]
        rows.append({"position": s["position"], "idx": s["idx"], "label": r["label"], "label_name": r["label_name"],
                     "R": r["regex"]["correct"], "H": int(it["content_correct"]), "stance": it["final_stance"],
                     "regex_pred": r["regex"]["pred"], "exact": r["exact"]["correct"], "strict": r["strict"]["correct"],
                     "strict_format_ok": r["strict"]["format_ok"], "format_compliant": int(it["format_compliant"]),
                     "disputed": it["reference_disputed"], "decidable": decidable})
    D = [x for x in rows if x["decidable"]]
    n_d = len(D)
    dis = [x for x in D if x["R"] != x["H"]]
    fp = [x for x in D if x["R"] == 1 and x["H"] == 0]
    fn = [x for x in D if x["R"] == 0 and x["H"] == 1]
    pop = {}
    for r in records:
        pop[r["label"]] = pop.get(r["label"], 0) + 1
    classes = sorted({x["label"] for x in rows})
    per_class = {}
    for c in classes:
        sampled = [x for x in rows if x["label"] == c]
        dc = [x for x in D if x["label"] == c]
        per_class[str(c)] = {"population": pop.get(c, 0), "sampled": len(sampled), "decidable": len(dc),
                             "disagreements": sum(x["R"] != x["H"] for x in dc),
                             "false_positives": sum(x["R"] == 1 and x["H"] == 0 for x in dc),
                             "false_negatives": sum(x["R"] == 0 and x["H"] == 1 for x in dc)}
    all_decidable = all(v["decidable"] == v["sampled"] for v in per_class.values()) and n_d > 0
    n_pop = sum(pop.values())
    if all_decidable:
        w = {c: v["population"] / v["sampled"] for c, v in per_class.items()}
        est = {"weights": {c: f"{v['population']}/{v['sampled']}" for c, v in per_class.items()},
               "disagreements": sum(w[c] * v["disagreements"] for c, v in per_class.items()),
               "false_positives": sum(w[c] * v["false_positives"] for c, v in per_class.items()),
               "false_negatives": sum(w[c] * v["false_negatives"] for c, v in per_class.items()),
               "population": n_pop}
        est["disagreement_rate"] = est["disagreements"] / n_pop
        weighted_rate, weighted_note = est["disagreement_rate"], None
    else:
        est, weighted_rate = None, None
        weighted_note = (f"null by the pre-registered rule: {len(rows) - n_d} sampled item(s) are undecidable or have "
                         "a disputed reference")
    inconsistent = [f"position {x['position']} (idx {x['idx']}): stance {x['stance']!r}, label {x['label_name']!r}, "
                    f"content_correct {bool(x['H'])}" for x in rows
                    if (x["stance"] in labels and x["H"] != int(x["stance"] == x["label_name"]))
                    or (x["stance"] not in labels and x["H"] == 1)]
    figures = {
        "sheet": str(sheet_path), "sheet_sha256": sha256_file(sheet_path), "refused": False,
        "reviewer": {"name": rv["name"], "time": rv["time"]},
        "n_reviewed": len(rows), "n_decidable_undisputed": n_d,
        "excluded": [{"position": x["position"], "idx": x["idx"],
                      "why": "reference disputed" if x["disputed"] else f"stance {x['stance']}"}
                     for x in rows if not x["decidable"]],
        "disagreement_rate": len(dis) / n_d if n_d else None, "disagreements": len(dis),
        "disagreement_idx": [x["idx"] for x in dis],
        "false_positives": len(fp), "false_positive_idx": [x["idx"] for x in fp],
        "false_negatives": len(fn), "false_negative_idx": [x["idx"] for x in fn],
        "stance_agreement": {"n": n_d, "regex_pred_equals_stance": sum(x["regex_pred"] == x["stance"] for x in D)},
        "per_class": per_class,
        "weighted_disagreement_rate": weighted_rate, "weighted_estimate": est, "weighted_note": weighted_note,
        "other_scorers_vs_human": {s: {"disagreements": sum(x[s] != x["H"] for x in D), "n": n_d}
                                   for s in ("exact", "strict")},
        "format_agreement": {"n": len(rows), "strict_format_ok_equals_human": sum(
            x["strict_format_ok"] == x["format_compliant"] for x in rows)},
        "inconsistent_content_correct": inconsistent,
        "scope": "descriptive figures on the pre-registered sample; the extractor is the regex scorer (R), the "
                 "human judgement is content_correct (H)",
    }
    return figures, []


def audit_extraction(C, name, out, levels, cache):
    ev = ext_load(out, name)
    records = audit_extraction_arithmetic(C, name, out, ev)
    info = {}
    if REVIEW_SHEET is None:
        info["human_review"] = {**{k: None for k in EXT_REVIEW_KEYS},
                                "note": "no sheet given (--review SHEET): figures are null, not estimated"}
        C.skip(name, "arithmetic", "human review sheet (--review)", "no sheet given; human-review figures are null",
               requested=False)
    elif records is None:
        info["human_review"] = {**{k: None for k in EXT_REVIEW_KEYS}, "sheet": str(REVIEW_SHEET), "refused": True}
        C.add(name, "arithmetic", "human review sheet (--review)", 0,
              [f"{REVIEW_SHEET}: the evidence it refers to did not pass the arithmetic level"])
    else:
        figures, problems = ext_review(Path(REVIEW_SHEET), ev["config"], records)
        info["human_review"] = figures
        C.add(name, "arithmetic", "human review sheet (--review): complete and bound to this sample",
              figures.get("n_reviewed") or 0,
              [f"{REVIEW_SHEET} refused: {p}" for p in problems])
    if "identity" in levels or "forward" in levels:
        model_dir, parquet = resolve_cache(ev["config"], cache) if ev["config"] else (None, None)
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        tokens = audit_extraction_identity(C, name, out, ev["config"], ev["identity"], records, ev["generations"],
                                           model_dir, parquet)
        if "forward" in levels:
            info["forward"] = audit_extraction_forward(C, name, ev["identity"], records, tokens, model_dir)
    for level, flag in (("identity", "--tokens"), ("forward", "--forward")):
        if level not in levels:
            C.skip(name, level, "(whole level)", f"not requested (pass {flag})", requested=False)
    return info


def ext_print_review(report, stream=sys.stdout):
    """After the report: the human-review figures of --review SHEET, or every reason the sheet was refused."""
    hr = get(report, "details.extraction.human_review")
    if not isinstance(hr, dict):
        print(f"review: no extraction evidence audited here, so {REVIEW_SHEET} was not read", file=stream)
        report["exit_code"] = 1
        return
    if hr.get("refused"):
        print(f"review: {REVIEW_SHEET} REFUSED; human-review figures stay null. Missing or invalid:", file=stream)
        for p in hr.get("binding_problems", []) + hr.get("missing_fields", []):
            print(f"  - {p}", file=stream)
        return
    est = hr["weighted_estimate"]
    rate = "null (no decidable item)" if hr["disagreement_rate"] is None else \
        f"{hr['disagreements']}/{hr['n_decidable_undisputed']} = {hr['disagreement_rate']:.4f}"
    print(f"review: {hr['n_reviewed']} items reviewed by {hr['reviewer']['name']!r} ({hr['reviewer']['time']}); "
          f"{hr['n_decidable_undisputed']} decidable with an undisputed reference", file=stream)
    print(f"  regex extractor vs human: disagreement {rate}; false positives {hr['false_positives']}, false "
          f"negatives {hr['false_negatives']}", file=stream)
    print("  class-weighted estimate over the scored items: " + (
        f"{est['disagreements']:.3f} disagreements of {est['population']} (rate {est['disagreement_rate']:.4f}; "
        f"weights {est['weights']})" if est else hr["weighted_note"]), file=stream)
    if hr["inconsistent_content_correct"]:
        print(f"  note: content_correct inconsistent with stance vs label on {len(hr['inconsistent_content_correct'])}"
              " item(s): " + "; ".join(hr["inconsistent_content_correct"]), file=stream)
