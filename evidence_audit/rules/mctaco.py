"""The MC-TACO experiment's rule: documents are question-candidate pairs; acc, corpus F1 and EM over complete
questions, the --limit demonstration table."""
import json

from evidence_audit.checks import MISSING, compare_tree, expect, get, short
from evidence_audit.definitions import argmax_first, is_int, is_num, is_sha
from evidence_audit.fast_mode import fast_expected
from evidence_audit.forward import audit_candidate_scores
from evidence_audit.reading import (REQUIRED, Unreadable, load_evidence, read_jsonl, resolve_cache, sha256_file,
                                    sha256_text)
from evidence_audit.shared import (CANDIDATE_FIELDS, IDENTITY_DECLARED, IDENTITY_RECOMPUTED, check_scoring_identity,
                                   environment_check, stage_time_problems)
from evidence_audit.tokens import load_tokenizer

# ---- the MC-TACO experiment (seed study 004) ---------------------------------------------------------------------
# Documents are the rows (question-candidate pairs) of an MC-TACO-shaped split, scored by lm-eval's mc_taco task and
# by the independent path. Every rule is written out again here (experiments/mctaco.py is not imported):
#   question id   sha256 of f"{sentence}\t{question}" (UTF-8); config.json split_questions lists every question of
#                 the split with its row idx; a question is complete in a document set when all its idx are in it,
#                 cut when only some are
#   documents     all rows in order (split dev); smoke: every row of the first mctaco_smoke_questions questions;
#                 limit N: rows 0..N-1 (lm-eval's limit is itertools.islice over eval_docs in dataset order)
#   prediction    argmax over the candidates " no", " yes", the first index wins ties
#   acc           mean over documents of (prediction == label)
#   F1            F1 of class 1 ("yes") over all documents at once: 2TP / (2TP + FP + FN), 0.0 when that is 0/0
#                 (sklearn's binary f1_score with its zero_division default, which lm-eval's f1 aggregation calls)
#   EM            share of the complete questions whose every candidate is predicted right (cut questions excluded)

MCT_LABELS = ("no", "yes")
MCT_CATEGORIES = ("Event Duration", "Event Ordering", "Frequency", "Typical Time", "Stationarity")
MCT_RECORD_FIELDS = {
    "idx": is_int, "question_id": is_sha, "question_rank": is_int, "candidate_rank": is_int, "label": is_int,
    "category": lambda v: v in MCT_CATEGORIES, "sentence_sha256": is_sha, "question_sha256": is_sha,
    "answer_sha256": is_sha, "prompt_sha256": is_sha, "context_tokens": is_int,
    "candidates": lambda v: isinstance(v, list) and len(v) > 0, "official": lambda v: isinstance(v, dict),
    "independent": lambda v: isinstance(v, dict), "abs_diff": lambda v: isinstance(v, list) and all(is_num(x) for x in v),
}
MCT_SIDE_FIELDS = {
    "official": {"doc_id": is_int, "scores": None, "is_greedy": None, "pred": is_int, "acc": is_num,
                 "f1_pair": lambda v: isinstance(v, list) and len(v) == 2 and all(is_int(x) for x in v),
                 "doc_hash": is_sha, "prompt_hash": is_sha},
    "independent": {"scores": None, "pred": is_int, "correct": is_int},
}
MCT_IDENTITY_FIELDS = {
    "doc_id": "arithmetic/documents and groups (official.doc_id == idx)",
    "label": "arithmetic/correctness (f1 pair gold) and identity/data parquet",
    "target": "arithmetic/correctness (lm-eval acc and f1 pair recomputed against the label)",
    "category": "identity/private texts and identity/data parquet",
    "sentence_sha256": "identity/private texts and identity/data parquet",
    "question_sha256": "identity/private texts and identity/data parquet",
    "answer_sha256": "identity/private texts and identity/data parquet",
    "prompt_sha256": "arithmetic/prompt hashes and identity/private texts",
    "candidate texts": "arithmetic/candidates",
    "candidate token ids and start": "identity/tokenisation",
    "f1 pair": "arithmetic/correctness",
}


def mct_f1(golds, preds):
    """Binary F1 of class 1 over all documents at once (never an average of per-item or per-question F1)."""
    tp = sum(1 for g, p in zip(golds, preds) if g == 1 and p == 1)
    fp = sum(1 for g, p in zip(golds, preds) if g == 0 and p == 1)
    fn = sum(1 for g, p in zip(golds, preds) if g == 1 and p == 0)
    return (2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0), {"tp": tp, "fp": fp, "fn": fn,
                                                                          "tn": len(golds) - tp - fp - fn}


def mct_acc(golds, preds):
    return sum(int(g == p) for g, p in zip(golds, preds)) / len(golds) if golds else None


def mct_em(idx_lists, correct):
    ok = sum(all(correct[i] for i in idx) for idx in idx_lists)
    return {"em": ok / len(idx_lists) if idx_lists else None, "n_correct_questions": ok,
            "n_complete_questions": len(idx_lists)}


def mct_groups(doc_ids, split_questions):
    """(complete questions, cut questions as the experiment reports them) of a document set."""
    present = set(doc_ids)
    complete, cut = [], []
    for q in split_questions:
        kept = [i for i in q["idx"] if i in present]
        if kept and len(kept) == len(q["idx"]):
            complete.append(q)
        elif kept:
            cut.append({"question_id": q["question_id"], "question_rank": q["question_rank"],
                        "n_candidates": len(q["idx"]), "n_scored": len(kept), "scored_idx": kept})
    return complete, cut


def mct_limit_ns(config_ns, n_docs, split_questions, doc_ids):
    """The demonstration's N: config values below n_docs, plus a group boundary if none is one and a cut inside a
    group if none cuts (the derivation experiments/mctaco.py documents)."""
    docs = set(doc_ids)
    qs = [q for q in split_questions if set(q["idx"]) <= docs]
    ends = sorted({max(q["idx"]) + 1 for q in qs if max(q["idx"]) + 1 < n_docs})
    ns = {n: "config" for n in config_ns if 1 <= n < n_docs}
    if ends and not any(n in ends for n in ns):
        ns[min(ends, key=lambda e: (abs(e - n_docs / 2), e))] = "derived: a group boundary (no question cut)"
    if not any(n not in ends for n in ns):
        for e in [0] + ends:
            if e + 2 < n_docs and e + 2 not in ends:
                ns.setdefault(e + 2, "derived: inside a group")
                break
    return dict(sorted(ns.items()))


def mct_doc_hash(sentence, question, answer, label, category):
    """lm-eval's doc_hash of an mc_taco document: the cache parquet's row, columns in its order."""
    doc = {"sentence": sentence, "question": question, "answer": answer, "label": label, "category": category}
    return sha256_text(json.dumps(doc, indent=2, ensure_ascii=False))


def mct_render(template, text):
    """config.mctaco_prompt filled in one pass (a brace in a text is never read as a placeholder)."""
    import re
    return re.sub(r"\{(sentence|question|answer)\}", lambda m: text[m.group(1)], template)


def mct_record_problems(r, n_choices):
    where = f"idx {r.get('idx', '?')}" if isinstance(r, dict) else "record"
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = [f"{where} {k}: missing" for k in MCT_RECORD_FIELDS if k not in r]
    bad += [f"{where} {k}: wrong type ({short(r[k], 60)})" for k, ok in MCT_RECORD_FIELDS.items()
            if k in r and not ok(r[k])]
    bad += [f"{where} {k}: a field audit.py has no rule for" for k in r if k not in MCT_RECORD_FIELDS]
    if bad:
        return bad
    n = len(r["candidates"])
    if n != n_choices:
        bad.append(f"{where} candidates: {n} candidates, the task has {n_choices} choices")
    for j, c in enumerate(r["candidates"]):
        if not isinstance(c, dict) or set(c) != set(CANDIDATE_FIELDS):
            bad.append(f"{where} candidates[{j}]: fields {sorted(c) if isinstance(c, dict) else c!r}, expected "
                       f"{sorted(CANDIDATE_FIELDS)}")
            continue
        bad += [f"{where} candidates[{j}].{k}: wrong type ({short(c[k], 60)})"
                for k, ok in CANDIDATE_FIELDS.items() if not ok(c[k])]
    for side, fields in MCT_SIDE_FIELDS.items():
        d = r[side]
        bad += [f"{where} {side}.{k}: missing" for k in fields if k not in d]
        bad += [f"{where} {side}.{k}: wrong type ({short(d[k], 60)})" for k, ok in fields.items()
                if k in d and ok is not None and not ok(d[k])]
        bad += [f"{where} {side}.{k}: a field audit.py has no rule for" for k in d if k not in fields]
        if "scores" in d and not (isinstance(d["scores"], list) and len(d["scores"]) == n
                                  and all(is_num(s) for s in d["scores"])):
            bad.append(f"{where} {side}.scores: expected {n} numbers, found {short(d['scores'], 60)}")
    g = r["official"].get("is_greedy")
    if not (isinstance(g, list) and len(g) == n and all(isinstance(x, bool) for x in g)):
        bad.append(f"{where} official.is_greedy: expected {n} booleans, found {short(g, 60)}")
    if len(r["abs_diff"]) != n:
        bad.append(f"{where} abs_diff: expected {n} numbers, found {short(r['abs_diff'], 60)}")
    return bad


def audit_mctaco_arithmetic(C, name, ev):
    """Level 1 for the MC-TACO experiment; returns the validated records or None."""
    A = "arithmetic"
    cfg, ident, records, summ, stages = (ev.get(k) for k in ("config", "identity", "records", "summary", "stages"))
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    if ev["environment"] is None:
        missing.insert(0, "../environment.json")
    C.add(name, A, "required files", len(REQUIRED) + 1,
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    if cfg is None or records is None:
        for check in ("config", "documents", "records", "predictions", "metrics", "summary", "stages"):
            C.skip(name, A, check, "config.json or records.jsonl missing; nothing to recompute from")
        return None

    # -- config: documents, groups, official task, identity.json --
    bad = []
    conf = cfg.get("config") if isinstance(cfg.get("config"), dict) else {}
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split, mode, limit = cfg.get("split"), sel.get("mode"), sel.get("limit")
    n_rows = cfg.get("n_rows")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING), False,
           "MC-TACO has no held-back confirmation items")
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("mctaco_data", MISSING))
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), conf.get("model", MISSING))
    want_mode = {"smoke": "smoke", "dev": "limit" if limit is not None else "all"}.get(split)
    if want_mode is None:
        bad.append(f"config.json split: {short(split)} is not smoke or dev")
    expect(bad, "config.json", "selection.mode", mode, want_mode, f"split {split!r}, limit {limit!r}")
    if mode == "limit":
        expect(bad, "config.json", "selection.allow_partial_groups", sel.get("allow_partial_groups", MISSING), True,
               "run.py refuses --limit on grouped documents without --allow-partial-groups")
    expect(bad, "config.json", "selection.smoke_questions", sel.get("smoke_questions", MISSING),
           conf.get("mctaco_smoke_questions", MISSING))
    sq = cfg.get("split_questions")
    sq_ok = isinstance(sq, list) and is_int(n_rows) and all(
        isinstance(q, dict) and is_sha(q.get("question_id")) and is_int(q.get("question_rank"))
        and isinstance(q.get("idx"), list) and q["idx"] and all(is_int(i) for i in q["idx"])
        and q.get("category") in MCT_CATEGORIES for q in sq)
    if not sq_ok:
        bad.append("config.json split_questions: missing or malformed (needs question_id, question_rank, idx, "
                   "category per question)")
        sq = []
    else:
        for k, q in enumerate(sq):
            expect(bad, f"config.json split_questions[{k}]", "question_rank", q["question_rank"], k)
        all_idx = sorted(i for q in sq for i in q["idx"])
        if all_idx != list(range(n_rows)):
            bad.append(f"config.json split_questions: the questions' idx do not partition 0..{n_rows - 1}")
        if len({q["question_id"] for q in sq}) != len(sq):
            bad.append("config.json split_questions: a question_id appears twice")
    if mode == "all":
        want_docs = list(range(n_rows)) if is_int(n_rows) else MISSING
    elif mode == "smoke":
        k = sel.get("smoke_questions")
        want_docs = sorted(i for q in sq[:k] for i in q["idx"]) if is_int(k) else MISSING
    elif mode == "limit" and is_int(limit) and is_int(n_rows) and 1 <= limit <= n_rows:
        want_docs = list(range(limit))
    else:
        want_docs = MISSING
    expect(bad, "config.json", "selection.documents", sel.get("documents", MISSING), want_docs,
           f"the selection rule for mode {mode!r}")
    # the official task: the YAML as loaded, changed only in the data transport; and the protocol implemented here
    prompt_t, choices, delim = conf.get("mctaco_prompt"), conf.get("mctaco_choices"), conf.get("target_delimiter")
    if not (isinstance(prompt_t, str) and all(prompt_t.count("{" + f + "}") == 1
                                              for f in ("sentence", "question", "answer"))):
        bad.append(f"config.json config.mctaco_prompt: {short(prompt_t)} needs {{sentence}}, {{question}}, {{answer}}")
        prompt_t = None
    if choices != list(MCT_LABELS):
        bad.append(f"config.json config.mctaco_choices: {short(choices)}, expected {list(MCT_LABELS)} (label 0 no, 1 yes)")
        choices = list(MCT_LABELS)
    if not isinstance(delim, str):
        bad.append(f"config.json config.target_delimiter: {short(delim)} is not a string")
        delim = " "
    dumped, yaml_cfg = get(cfg, "official.dumped_task_config"), get(cfg, "official.yaml_config")
    if not isinstance(dumped, dict) or not isinstance(yaml_cfg, dict):
        bad.append("config.json official.dumped_task_config / official.yaml_config: missing")
        dumped, yaml_cfg = {}, {}
    for k, v in yaml_cfg.items():
        if k == "test_split":
            expect(bad, "config.json", "official.dumped_task_config.test_split", dumped.get(k), None,
                   "the one change besides custom_dataset: lm-eval would evaluate the test split")
            expect(bad, "config.json", "official.modifications.test_split.yaml",
                   get(cfg, "official.modifications.test_split.yaml"), v)
        else:
            expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), v,
                   "official.yaml_config (the installed YAML as loaded)")
    extra = sorted(set(dumped) - set(yaml_cfg) - {"custom_dataset", "description", "target_delimiter",
                                                  "fewshot_delimiter", "num_fewshot", "unsafe_code", "repeats"})
    if extra:
        bad.append(f"config.json official.dumped_task_config: keys {extra} are neither in the YAML nor lm-eval defaults")
    if not isinstance(dumped.get("custom_dataset"), str):
        bad.append("config.json official.dumped_task_config.custom_dataset: missing (the data transport)")
    for k, want in (("doc_to_text", None if prompt_t is None else prompt_t.replace("{sentence}", "{{sentence}}")
                     .replace("{question}", "{{question}}").replace("{answer}", "{{answer}}")),
                    ("doc_to_choice", choices), ("doc_to_target", "label"), ("output_type", "multiple_choice"),
                    ("target_delimiter", delim), ("num_fewshot", 0), ("validation_split", "validation"),
                    ("metric_list", [{"metric": "acc"}, {"metric": "f1"}])):
        if want is not None:
            expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), want)
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot task")
    expect(bad, "config.json", "official.documents_passed_as_samples", get(cfg, "official.documents_passed_as_samples"),
           want_docs if mode == "smoke" else None, "smoke passes its sorted documents; otherwise lm-eval selects")
    expect(bad, "config.json", "official.lm_eval_limit", get(cfg, "official.lm_eval_limit"), limit)
    # lm-eval's n-samples: effective = limit, or the whole split when no limit is given, even when `samples`
    # restricts the documents (smoke): lm_eval/evaluator.py:753-760 counts limit only
    expect(bad, "config.json", "official.n_samples", get(cfg, "official.n_samples"),
           {"original": n_rows, "effective": limit if mode == "limit" else n_rows}, "lm-eval's n-samples")
    if ident is not None:
        check_scoring_identity(bad, conf, ident)
        expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
               sha256_text(json.dumps(cfg.get("official"), sort_keys=True)), "sha256 of config.json official")
        bad += [f"identity.json {k}: a field audit.py has no rule for" for k in ident
                if k not in IDENTITY_RECOMPUTED | IDENTITY_DECLARED]
        if prompt_t is not None:
            expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
                   sha256_text(prompt_t))
        for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                         ("data_content_sha256", "data_content_sha256")):
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split)
        expect(bad, "summary.json", "confirmation_items_scored", summ.get("confirmation_items_scored", MISSING), False)
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING), conf.get("threads", MISSING))
    doc_ids = want_docs if isinstance(want_docs, list) else []
    want_ns = mct_limit_ns(conf.get("mctaco_limit_ns", []), len(doc_ids), sq, doc_ids) \
        if isinstance(conf.get("mctaco_limit_ns"), list) else {}
    expect(bad, "config.json", "limit_ns", cfg.get("limit_ns", MISSING),
           [{"limit": n, "kind": k} for n, k in want_ns.items()], "config.mctaco_limit_ns + the derivation rule")
    C.add(name, A, "config consistency (documents, split questions, official task, identity.json)", 1, bad,
          note="INCOMPLETE SET (--limit)" if mode == "limit" else "")
    environment_check(C, name, ev)

    # -- record shape --
    bad = []
    for r in records:
        bad += mct_record_problems(r, len(choices))
    C.add(name, A, "record fields and types", len(records), bad)
    if bad:
        for check in ("documents", "candidates", "predictions", "correctness", "agreement", "prompt hashes",
                      "metrics", "limit table", "summary", "stages"):
            C.skip(name, A, check, "records.jsonl has malformed records (see 'record fields and types')")
        return None

    # -- documents and groups: records are exactly the selected documents, in order, with their question identity --
    bad = []
    idx_list = [r["idx"] for r in records]
    expect(bad, "records.jsonl", "idx (in line order)", idx_list, want_docs, "config.json selection.documents")
    q_of = {i: (q, pos) for q in sq for pos, i in enumerate(q["idx"])}
    for r in records:
        w = f"idx {r['idx']}"
        expect(bad, w, "official.doc_id", r["official"]["doc_id"], r["idx"])
        if r["label"] not in (0, 1):
            bad.append(f"{w} label: {r['label']} is not 0 (no) or 1 (yes)")
        if r["idx"] not in q_of:
            bad.append(f"{w} idx: not in any question of config.json split_questions")
            continue
        q, pos = q_of[r["idx"]]
        for k, v in (("question_id", q["question_id"]), ("question_rank", q["question_rank"]),
                     ("candidate_rank", pos), ("category", q["category"])):
            expect(bad, w, k, r[k], v, "config.json split_questions")
    C.add(name, A, "documents and groups (selection rule, question identity, doc_id)", len(records), bad)

    # -- candidates, predictions, correctness, agreement, prompt hashes --
    bad = []
    lim_tok = conf.get("max_input_tokens")
    for r in records:
        w = f"idx {r['idx']}"
        for j, c in enumerate(r["candidates"]):
            expect(bad, w, f"candidates[{j}].text", c["text"], delim + choices[j] if j < len(choices) else MISSING)
            expect(bad, w, f"candidates[{j}].start", c["start"], r["context_tokens"], "must equal context_tokens")
            if is_int(lim_tok) and r["context_tokens"] + len(c["token_ids"]) > lim_tok:
                bad.append(f"{w} candidates[{j}].token_ids: input over max_input_tokens {lim_tok}")
    C.add(name, A, "candidates (texts ' no'/' yes', start == context_tokens, length limit)", len(records), bad)
    bad = []
    for r in records:
        for side in ("official", "independent"):
            expect(bad, f"idx {r['idx']}", f"{side}.pred", r[side]["pred"], argmax_first(r[side]["scores"]),
                   f"argmax of {side}.scores, first index wins ties")
    C.add(name, A, "predictions, both paths (argmax, first index wins ties)", len(records), bad)
    bad = []
    for r in records:
        w, off, ind = f"idx {r['idx']}", argmax_first(r["official"]["scores"]), argmax_first(r["independent"]["scores"])
        expect(bad, w, "independent.correct", r["independent"]["correct"], int(ind == r["label"]))
        expect(bad, w, "official.acc", r["official"]["acc"], float(off == r["label"]), "lm-eval per-document acc")
        expect(bad, w, "official.f1_pair", r["official"]["f1_pair"], [r["label"], off], "lm-eval's (gold, pred)")
    C.add(name, A, "correctness (independent.correct, lm-eval acc and f1 pair)", len(records), bad)
    bad = []
    for r in records:
        expect(bad, f"idx {r['idx']}", "abs_diff", r["abs_diff"],
               [abs(a - b) for a, b in zip(r["official"]["scores"], r["independent"]["scores"])])
        expect(bad, f"idx {r['idx']}", "official.prompt_hash", r["official"]["prompt_hash"], r["prompt_sha256"])
    C.add(name, A, "agreement per candidate and prompt hashes", len(records), bad)

    # -- metrics, group completeness, limit table: the whole summary.json rebuilt from the records --
    labels = [r["label"] for r in records]
    off_preds = [argmax_first(r["official"]["scores"]) for r in records]
    ind_preds = [argmax_first(r["independent"]["scores"]) for r in records]
    correct = {r["idx"]: int(p == r["label"]) for r, p in zip(records, ind_preds)}
    complete, cut = mct_groups(idx_list, sq)
    incomplete = bool(cut)
    scope = (f"INCOMPLETE SET: {len(cut)} question(s) cut (only some of their candidates scored); acc and F1 cover "
             f"the {len(records)} scored documents, EM only the {len(complete)} complete questions" if incomplete
             else f"complete set: every candidate of each of the {len(complete)} questions scored")
    reported = get(cfg, "official.reported")

    def side(preds):
        f1, counts = mct_f1(labels, preds)
        return {"correct": sum(int(p == l) for p, l in zip(preds, labels)), "acc": mct_acc(labels, preds),
                "f1": f1 if labels else None, "f1_counts": counts,
                "pred_counts": {"no": preds.count(0), "yes": preds.count(1)}, "computed_on": scope}

    ind = side(ind_preds)
    em = mct_em([q["idx"] for q in complete], correct)
    by_cat = {}
    for cat in MCT_CATEGORIES:
        rs = [(r, p) for r, p in zip(records, ind_preds) if r["category"] == cat]
        if rs:
            by_cat[cat] = {"n_documents": len(rs), "acc": mct_acc([r["label"] for r, _ in rs], [p for _, p in rs]),
                           **mct_em([q["idx"] for q in complete if q["category"] == cat], correct),
                           "computed_on": scope}
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]
    reference = {"documents": len(records), "acc": ind["acc"], "f1": ind["f1"], "em": em["em"],
                 "incomplete_set": incomplete}
    # the limit table: each row claims lm-eval's limit=N run scored documents 0..N-1 exactly as the main run did;
    # every figure is recomputed from the first N records, so a row that does not hold fails here
    rec_by_idx = {r["idx"]: (r, p) for r, p in zip(records, off_preds)}
    demo = get(summ, "limit_demo") if summ is not None else MISSING
    exp_rows, bad_lim = [], []
    for n, kind in want_ns.items():
        first = [rec_by_idx[i] for i in range(n) if i in rec_by_idx]
        if len(first) != n:
            bad_lim.append(f"limit {n}: documents 0..{n - 1} are not all in records.jsonl; cannot recompute the row")
            continue
        golds, preds = [r["label"] for r, _ in first], [p for _, p in first]
        f1, counts = mct_f1(golds, preds)
        lim_correct = {r["idx"]: int(p == r["label"]) for r, p in first}
        l_complete, l_cut = mct_groups(list(range(n)), sq)
        cut_full = [q for q in sq if q["question_id"] in {c["question_id"] for c in l_cut}]
        acc = mct_acc(golds, preds)
        exp_rows.append({
            "limit": n, "kind": kind,
            "lm_eval": {"acc": acc, "f1": f1, "n_samples": {"original": n_rows, "effective": n}},
            "doc_ids": list(range(n)), "doc_ids_are_first_n": True, "preds": preds, "max_abs_diff_vs_main_run": 0.0,
            "recomputed": {"acc": acc, "f1": f1, "f1_counts": counts},
            "questions_touched": len(l_complete) + len(l_cut), "n_complete_questions": len(l_complete),
            "cut_questions": l_cut,
            "em_complete_questions": mct_em([q["idx"] for q in l_complete], lim_correct),
            "em_cut_questions_on_scored_candidates": mct_em([c["scored_idx"] for c in l_cut], lim_correct),
            "em_cut_questions_on_all_candidates": mct_em([q["idx"] for q in cut_full], correct)
            if all(i in correct for q in cut_full for i in q["idx"]) else None,
            "delta_vs_reference": {"acc": acc - ind["acc"], "f1": f1 - ind["f1"]},
        })
    shuffle = demo.get("shuffle_before_cut") if isinstance(demo, dict) else None
    if not isinstance(shuffle, dict):
        bad_lim.append("summary.json limit_demo.shuffle_before_cut: missing")
        shuffle_exp = MISSING
    else:
        # the source citations are declared (audit.py does not read lm_eval); each must say it was found, and the
        # conclusion must agree with what the limit rows show
        src = shuffle.get("source")
        if not (isinstance(src, list) and src and all(isinstance(s, dict) and s.get("found") is True for s in src)):
            bad_lim.append("summary.json limit_demo.shuffle_before_cut.source: a cited line range was not found")
        files = shuffle.get("files_without_the_word_shuffle")
        if not (isinstance(files, dict) and files and all(v is True for v in files.values())):
            bad_lim.append("summary.json limit_demo.shuffle_before_cut.files_without_the_word_shuffle: not all true")
        shuffle_exp = {"documents_shuffled_before_limit": False, "conclusion": shuffle.get("conclusion", MISSING),
                       "source": src, "files_without_the_word_shuffle": files,
                       "observed": {"limit_runs": len(exp_rows), "doc_ids_first_n": len(exp_rows),
                                    "scores_identical_to_main_run": len(exp_rows)}}
    C.add(name, A, "limit table (lm-eval limit=N == first N documents; acc, F1, cut groups, EM recomputed)",
          len(want_ns), bad_lim, note=f"N = {list(want_ns)}")
    expected = {
        "experiment": name, "split": split, "confirmation_items_scored": False, "selection": mode, "limit": limit,
        "n_documents": len(records), "n_candidates": len(diffs),
        "n_questions_touched": len(complete) + len(cut), "n_complete_questions": len(complete),
        "label_counts": {"no": labels.count(0), "yes": labels.count(1)},
        "incomplete_set": incomplete, "metrics_computed_on": scope, "cut_questions": cut,
        "official": {**side(off_preds), "lm_eval_reported": {"acc": side(off_preds)["acc"], "f1": side(off_preds)["f1"]}},
        "independent": {**ind, "em": {**em, "computed_on": scope}},
        "by_category": by_cat,
        "baselines": {nm: {"acc": mct_acc(labels, [k] * len(labels)),
                           "f1": mct_f1(labels, [k] * len(labels))[0] if labels else None, "computed_on": scope}
                      for k, nm in ((0, "always_no"), (1, "always_yes"))},
        "agreement": {"max_abs_diff": max(diffs) if diffs else MISSING,
                      "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(a != b for a, b in zip(off_preds, ind_preds)),
                      "acc_official_vs_independent": [side(off_preds)["acc"], ind["acc"]],
                      "f1_official_vs_independent": [side(off_preds)["f1"], ind["f1"]]},
        "identity_checks": {"passed": True, "n_samples_joined": len(records),
                            "fields": get(summ, "identity_checks.fields") if summ is not None else MISSING},
        "limit_demo": {"reference": reference, "rows": exp_rows, "shuffle_before_cut": shuffle_exp},
    }
    if summ is not None and ("fast" in summ or any("fast" in r for r in records)):
        expected["fast"] = fast_expected(summ.get("fast"), records, C, name)
    if summ is None:
        C.skip(name, A, "summary.json values", "summary.json missing (named under 'required files')")
    else:
        bad = []
        compare_tree(bad, "summary.json", summ, expected)
        # lm-eval's own aggregates (config.json official.reported) must be the recomputed acc and corpus F1
        expect(bad, "config.json", "official.reported", reported, expected["official"]["lm_eval_reported"],
               "lm-eval's acc (mean) and f1 (corpus F1 of 'yes') recomputed from the records")
        fields = get(summ, "identity_checks.fields")
        if not isinstance(fields, list):
            bad.append("summary.json identity_checks.fields: not a list")
        else:
            bad += [f"summary.json identity_checks.fields: {f!r} is an identity field audit.py has no check for"
                    for f in fields if f not in MCT_IDENTITY_FIELDS]
        C.add(name, A, "summary.json values (acc, corpus F1, EM, groups, limit table, every value recomputed)",
              len(records), bad, note="INCOMPLETE SET" if incomplete else "")

    # -- stages.json token counts --
    if stages is None:
        C.skip(name, A, "stages.json token counts", "stages.json missing (named under 'required files')")
    else:
        bad = []
        ctx = [r["context_tokens"] for r in records]
        per_cand = [r["context_tokens"] + len(c["token_ids"]) for r in records for c in r["candidates"]]
        tokens = {"context_tokens": {"min": min(ctx), "max": max(ctx), "total": sum(ctx)} if ctx else MISSING,
                  "input_tokens_per_candidate": {"min": min(per_cand), "max": max(per_cand), "total": sum(per_cand)}
                  if per_cand else MISSING, "n_items": len(records), "n_candidates": len(per_cand),
                  "limit_run_documents": sum(want_ns)}
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), tokens, "tokens.")
        bad += stage_time_problems(stages)
        C.add(name, A, "stages.json token counts (+ sanity of timings)", len(records), bad,
              note="wall times and RSS are measurements: sanity-checked, not recomputed")
    return records


def audit_mctaco_identity(C, name, out, cfg, ident, records, model_dir, data_parquet):
    """Level 2: private texts, tokenisation, the data parquet. Returns {idx: (ctx ids, [cand ids])} or None."""
    L = "identity"
    if records is None:
        for check in ("private texts", "tokenisation", "data parquet"):
            C.skip(name, L, check, "the arithmetic level found records.jsonl or config.json unusable")
        return None
    prompt_t = cfg.get("config", {}).get("mctaco_prompt")
    texts_path = out / "private" / name / "texts.jsonl"
    texts = None
    check = "private texts (text hashes, question id, prompt from template, lm-eval doc_hash)"
    if not texts_path.exists():
        C.skip(name, L, check, f"{texts_path} absent (private evidence not shipped); text hashes NOT checked")
    else:
        bad, texts = [], {}
        for n_line, t in enumerate(read_jsonl(texts_path), start=1):
            if not (isinstance(t, dict) and is_int(t.get("idx")) and all(isinstance(t.get(k), str) for k in
                                                                          ("sentence", "question", "answer", "prompt"))):
                bad.append(f"private/{name}/texts.jsonl line {n_line}: needs idx, sentence, question, answer, prompt")
                continue
            if t["idx"] in texts:
                bad.append(f"idx {t['idx']} private texts: duplicated (line {n_line})")
            texts[t["idx"]] = t
        rec_idx = [r["idx"] for r in records]
        bad += [f"idx {i} private texts: no text for this record" for i in rec_idx if i not in texts]
        bad += [f"idx {i} private texts: text for an idx with no record" for i in texts if i not in rec_idx]
        for r in records:
            t = texts.get(r["idx"])
            if t is None:
                continue
            w = f"idx {r['idx']}"
            for k in ("sentence", "question", "answer", "prompt"):
                expect(bad, w, f"{k}_sha256", r[f"{k}_sha256"], sha256_text(t[k]), f"sha256 of the private {k}")
            expect(bad, w, "question_id", r["question_id"], sha256_text(f"{t['sentence']}\t{t['question']}"),
                   "sha256 of sentence TAB question")
            expect(bad, w, "category", r["category"], t.get("category"), "private texts")
            if isinstance(prompt_t, str):
                expect(bad, w, "prompt", t["prompt"], mct_render(prompt_t, t), "config.mctaco_prompt filled in")
            expect(bad, w, "official.doc_hash", r["official"]["doc_hash"],
                   mct_doc_hash(t["sentence"], t["question"], t["answer"], r["label"], r["category"]),
                   "lm-eval's doc hash of (sentence, question, answer, label, category)")
        C.add(name, L, check, len(records), bad)

    result = None
    check = "tokenisation (candidate ids, start, context-prefix property)"
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    if texts is None:
        C.skip(name, L, check, "needs the private texts (absent); candidate token ids and boundaries NOT checked")
    elif tok_path is None or not tok_path.exists():
        C.skip(name, L, check, f"tokenizer not found ({tok_path}); pass --cache with the prepared cache")
    else:
        try:
            tok = load_tokenizer(tok_path)
        except ImportError as e:
            tok = None
            C.skip(name, L, check, f"cannot import tokenizers ({e})")
        if tok is not None:
            bad, result = [], {}
            expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
                   if ident else MISSING, "identity.json tokenizer_sha256")
            for r in records:
                t = texts.get(r["idx"])
                if t is None:
                    bad.append(f"idx {r['idx']} prompt: no private text; cannot re-tokenise it")
                    continue
                w, prompt = f"idx {r['idx']}", t["prompt"]
                ctx_ids = tok.encode(prompt, add_special_tokens=False).ids
                expect(bad, w, "context_tokens", r["context_tokens"], len(ctx_ids), "re-tokenised prompt")
                cands = []
                for j, c in enumerate(r["candidates"]):
                    whole = tok.encode(prompt + c["text"], add_special_tokens=False).ids
                    if whole[:len(ctx_ids)] != ctx_ids:
                        bad.append(f"{w} candidates[{j}]: context tokens are not a prefix of context+candidate tokens")
                    expect(bad, w, f"candidates[{j}].token_ids", c["token_ids"], whole[len(ctx_ids):])
                    cands.append(whole[len(ctx_ids):])
                result[r["idx"]] = (ctx_ids, cands)
            C.add(name, L, check, len(records), bad, note=f"tokenizers.Tokenizer from {tok_path}")
            if bad:
                result = None

    check = "data parquet (n_rows, canonical content hash, questions, labels, categories, text hashes)"
    if data_parquet is None or not data_parquet.exists():
        C.skip(name, L, check, f"data parquet not found ({data_parquet}); labels NOT checked against the data")
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            C.skip(name, L, check, f"cannot import pyarrow ({e})")
        else:
            cols = pq.read_table(data_parquet).to_pydict()
            if not {"sentence", "question", "answer", "label", "category"} <= set(cols):
                raise Unreadable(f"{data_parquet}: columns {sorted(cols)}, expected sentence, question, answer, "
                                 "label, category")
            rows = [dict(zip(("sentence", "question", "answer", "label", "category"), v)) for v in
                    zip(cols["sentence"], cols["question"], cols["answer"], cols["label"], cols["category"])]
            bad = []
            expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows), f"rows in {data_parquet}")
            content = "".join(f"{i}\t{MCT_LABELS[r['label']] if r['label'] in (0, 1) else r['label']}\t"
                              f"{r['category']}\t{r['sentence']}\t{r['question']}\t{r['answer']}\n"
                              for i, r in enumerate(rows))
            expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING),
                   sha256_text(content), f"canonical MC-TACO content hash of {data_parquet}")
            qs = {}
            for i, r in enumerate(rows):
                qid = sha256_text(f"{r['sentence']}\t{r['question']}")
                qs.setdefault(qid, {"question_id": qid, "question_rank": len(qs), "idx": [],
                                    "category": r["category"]})["idx"].append(i)
            expect(bad, "config.json", "split_questions", cfg.get("split_questions", MISSING), list(qs.values()),
                   "questions recomputed from the data")
            for rec in records:
                w = f"idx {rec['idx']}"
                if not 0 <= rec["idx"] < len(rows):
                    bad.append(f"{w} idx: not in the data")
                    continue
                r = rows[rec["idx"]]
                expect(bad, w, "label", rec["label"], r["label"], "label in the data")
                expect(bad, w, "category", rec["category"], r["category"], "category in the data")
                for k in ("sentence", "question", "answer"):
                    expect(bad, w, f"{k}_sha256", rec[f"{k}_sha256"], sha256_text(r[k]), f"{k} in the data")
            C.add(name, L, check, len(records), bad, note=str(data_parquet))
    return result


def audit_mctaco(C, name, out, levels, cache):
    ev = load_evidence(out, name)
    records = audit_mctaco_arithmetic(C, name, ev)
    info = {}
    if ev["summary"] is not None:
        s = ev["summary"]
        info["figures"] = {"acc": get(s, "independent.acc"), "f1": get(s, "independent.f1"),
                           "em": get(s, "independent.em.em"), "incomplete_set": s.get("incomplete_set")}
    if "identity" in levels or "forward" in levels:
        model_dir, parquet = resolve_cache(ev["config"], cache) if ev["config"] else (None, None)
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        tokens = audit_mctaco_identity(C, name, out, ev["config"], ev["identity"], records, model_dir, parquet)
        if "forward" in levels:
            # the protocol's forward level reads exactly the fields these records share with it (idx, candidates,
            # official/independent scores and pred, official.is_greedy)
            info["forward"] = audit_candidate_scores(C, name, ev["identity"], records, tokens, model_dir)
    for level, flag in (("identity", "--tokens"), ("forward", "--forward")):
        if level not in levels:
            C.skip(name, level, "(whole level)", f"not requested (pass {flag})", requested=False)
    return info
