"""The MC-TACO experiment's rule: documents are question-candidate pairs; acc, corpus F1 and EM over complete
questions, the --limit demonstration table.

What is particular to it: the document selection (all, the first questions, or the first N documents) and the
question groups of config.json's split_questions; the official mc_taco task (the installed YAML, only the data
transport changed); the f1 pair lm-eval logs per document; the metrics (corpus F1 of "yes", EM over complete
questions, the scope note of an incomplete set); the limit table; the MC-TACO private texts and data parquet.
Everything else (required files, config and identity consistency, environment.json, record shape, candidates,
predictions, agreement, summary comparison, stage timings, tokenisation, the forward level) is a shared group.

The rules, written out again here (experiments/mctaco.py is not imported):
  question id   sha256 of f"{sentence}\t{question}" (UTF-8); config.json split_questions lists every question of
                the split with its row idx; a question is complete in a document set when all its idx are in it,
                cut when only some are
  documents     all rows in order (split dev or all); smoke: every row of the first mctaco_smoke_questions questions;
                limit N: rows 0..N-1 (lm-eval's limit is itertools.islice over eval_docs in dataset order)
  prediction    argmax over the candidates " no", " yes", the first index wins ties
  acc           mean over documents of (prediction == label)
  F1            F1 of class 1 ("yes") over all documents at once: 2TP / (2TP + FP + FN), 0.0 when that is 0/0
                (sklearn's binary f1_score with its zero_division default, which lm-eval's f1 aggregation calls)
  EM            share of the complete questions whose every candidate is predicted right (cut questions excluded)
"""
import json
import re
from dataclasses import dataclass

from evidence_audit import forward, uncertainty
from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY, MISSING, expect, get, short
from evidence_audit.definitions import argmax_first, is_int, is_num, is_sha
from evidence_audit.fast_mode import fast_expected
from evidence_audit.forward import two_path_forward
from evidence_audit.reading import Unreadable, sha256_text
from evidence_audit.shared import (abs_diff_problems, batching_check, both_paths_pred_problems, candidate_problems,
                                   candidate_token_counts, config_block, dtype_check, environment_check,
                                   identity_problems, identity_with_whole_batches, lm_eval_batch_shapes,
                                   model_problems, rank_order_problems, record_scores, record_shape_check,
                                   required_files, restated_problems, run_levels, split_problems, stages_check,
                                   summary_check, two_path_shape)
from evidence_audit.tokens import multiple_choice_identity, private_texts_check

MCT_SPLITS = ("smoke", "dev", "all")     # no held-back confirmation items; all = dev (every document)
MCT_LABELS = ("no", "yes")
MCT_CATEGORIES = ("Event Duration", "Event Ordering", "Frequency", "Typical Time", "Stationarity")
MCT_COLUMNS = ("sentence", "question", "answer", "label", "category")     # the data parquet, in this order
MCT_TEXTS = ("sentence", "question", "answer", "prompt")                 # a private texts.jsonl line
# lm-eval keys a dumped task config may hold beyond the YAML: its defaults and the data transport
LM_EVAL_ADDED_KEYS = {"custom_dataset", "description", "target_delimiter", "fewshot_delimiter", "num_fewshot",
                      "unsafe_code", "repeats"}
SHAPE = two_path_shape(
    {"idx": is_int, "question_id": is_sha, "question_rank": is_int, "candidate_rank": is_int, "label": is_int,
     "category": lambda v: v in MCT_CATEGORIES, "sentence_sha256": is_sha, "question_sha256": is_sha,
     "answer_sha256": is_sha, "prompt_sha256": is_sha},
    official={"f1_pair": lambda v: isinstance(v, list) and len(v) == 2 and all(is_int(x) for x in v)},
    optional={"fast": None})       # run.py --fast: checked by fast_mode.fast_expected
# identity fields run.py claims to have joined on -> the audit check that re-verifies each one
IDENTITY_FIELD_RULES = {
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
CONFIG_ROW = "config consistency (documents, split questions, official task, identity.json)"
DOCUMENTS_ROW = "documents and groups (selection rule, question identity, doc_id)"
LIMIT_ROW = ("limit table (lm-eval limit=N == first N documents, == the independent path on its own batches; acc, "
             "F1, cut groups, EM recomputed)")
SUMMARY_ROW = "summary.json values (acc, corpus F1, EM, groups, limit table, every value recomputed)"
PRIVATE_TEXTS = "private texts (text hashes, question id, prompt from template, lm-eval doc_hash)"
DATA_PARQUET = "data parquet (n_rows, canonical content hash, questions, labels, categories, text hashes)"


# ---- the metrics and definitions -----------------------------------------------------------------------------------

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
        ns[min(ends, key=lambda e: (abs(e - max(ns, default=0)), e))] = "derived: a group boundary (no question cut)"
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
    return re.sub(r"\{(sentence|question|answer)\}", lambda m: text[m.group(1)], template)


def record_where(i, r):
    return f"idx {r.get('idx', '?')}"


# ---- the rule ------------------------------------------------------------------------------------------------------

def audit_mctaco(C, name, out, levels, cache):
    # the forward level reads exactly the fields these records share with the protocol's (idx, candidates,
    # official/independent scores and pred, official.is_greedy), and the limit runs' own scores
    return run_levels(C, name, out, levels, cache, audit_mctaco_arithmetic,
                      identity_with_whole_batches(audit_mctaco_identity), mctaco_forward,
                      headline=lambda s: {"acc": get(s, "independent.acc"), "f1": get(s, "independent.f1"),
                                          "em": get(s, "independent.em.em"), "incomplete_set": s.get("incomplete_set")})


# ---- level 1, arithmetic -------------------------------------------------------------------------------------------

@dataclass
class Plan:
    """What config.json says was run, after its checks (MISSING or [] where config.json is unusable)."""
    split: object
    mode: object             # all, smoke or limit
    limit: object
    n_rows: object
    documents: object        # the selected idx in order
    questions: list          # config.json split_questions
    choices: list
    delim: str
    limit_ns: dict           # N -> kind ("config" or "derived: ...")


def audit_mctaco_arithmetic(C, name, ev):
    """Level 1. Returns the validated records, or None when they cannot be trusted enough for deeper levels."""
    if not required_files(C, name, ev):
        for check in ("config", "documents", "records", "predictions", "metrics", "summary", "stages"):
            C.skip(name, ARITHMETIC, check, "config.json or records.jsonl missing; nothing to recompute from")
        return None
    plan = config_check(C, name, ev)
    environment_check(C, name, ev)
    records = ev["records"]
    if not record_shape_check(C, name, records, SHAPE, record_where, len(plan.choices)):
        for check in ("documents", "candidates", "predictions", "correctness", "agreement", "prompt hashes",
                      "metrics", "limit table", "summary", "stages"):
            C.skip(name, ARITHMETIC, check, "records.jsonl has malformed records (see 'record fields and types')")
        return None
    documents_check(C, name, plan, records)
    C.add(name, ARITHMETIC, "candidates (texts ' no'/' yes', start == context_tokens, length limit)", len(records),
          candidate_problems(records, plan.choices, plan.delim, config_block(ev["config"]).get("max_input_tokens")))
    C.add(name, ARITHMETIC, "predictions, both paths (argmax, first index wins ties)", len(records),
          both_paths_pred_problems(records))
    correctness_check(C, name, records)
    hashes = []
    for r in records:
        expect(hashes, f"idx {r['idx']}", "official.prompt_hash", r["official"]["prompt_hash"], r["prompt_sha256"],
               "lm-eval's hash of the prompt it scored must equal prompt_sha256")
    C.add(name, ARITHMETIC, "agreement per candidate and prompt hashes", len(records),
          abs_diff_problems(records) + hashes)
    figures = main_figures(plan, records)
    limit_demo = limit_table_check(C, name, plan, records, ev["summary"], figures,
                                   config_block(ev["config"]).get("official_batch_size"))
    summary_values_check(C, name, ev, plan, records, figures, limit_demo)
    tokens = {**candidate_token_counts(records), "limit_run_documents": sum(plan.limit_ns)}
    batching_check(C, name, ev["config"], records)
    dtype_check(C, name, ev["config"], record_scores(records) + [
        (f"limit {row['limit']} {side}[{i}][{j}]", x) for row in limit_demo["rows"]
        for side in ("official", "independent") for i, pair in enumerate(row["scores"][side]) for j, x in enumerate(pair)])
    stages_check(C, name, ev, tokens, len(records))
    return records


def config_check(C, name, ev):
    """Row CONFIG_ROW: the shared config and identity groups, and MC-TACO's own claims: the data, the document
    selection, the split questions, the official task and lm-eval run, the limit table's N. Returns the Plan."""
    cfg, bad = ev["config"], []
    conf = config_block(cfg)
    split = split_problems(bad, name, cfg, MCT_SPLITS)
    model_problems(bad, cfg)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING), False,
           "MC-TACO has no held-back confirmation items")
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("mctaco_data", MISSING))
    questions = split_questions_problems(bad, cfg)
    mode, limit, documents = selection_problems(bad, cfg, questions)
    prompt_t, choices, delim = prompt_settings(bad, conf)
    official_task_problems(bad, cfg, prompt_t, choices, delim)
    lm_eval_run_problems(bad, cfg, mode, limit, documents)
    if ev["identity"] is not None:
        identity_problems(bad, name, cfg, ev["identity"], None if prompt_t is None else sha256_text(prompt_t))
    restated_problems(bad, ev, split, False)
    doc_ids = documents if isinstance(documents, list) else []
    limit_ns = mct_limit_ns(conf["mctaco_limit_ns"], len(doc_ids), questions, doc_ids) \
        if isinstance(conf.get("mctaco_limit_ns"), list) else {}
    expect(bad, "config.json", "limit_ns", cfg.get("limit_ns", MISSING),
           [{"limit": n, "kind": k} for n, k in limit_ns.items()], "config.mctaco_limit_ns + the derivation rule")
    C.add(name, ARITHMETIC, CONFIG_ROW, 1, bad, note="INCOMPLETE SET (--limit)" if mode == "limit" else "")
    return Plan(split, mode, limit, cfg.get("n_rows"), documents, questions, choices, delim, limit_ns)


def split_questions_problems(bad, cfg):
    """config.json split_questions: every question of the split in rank order, their idx partitioning the rows.
    Returns them ([] when malformed)."""
    sq, n_rows = cfg.get("split_questions"), cfg.get("n_rows")
    if not (isinstance(sq, list) and is_int(n_rows) and all(
            isinstance(q, dict) and is_sha(q.get("question_id")) and is_int(q.get("question_rank"))
            and isinstance(q.get("idx"), list) and q["idx"] and all(is_int(i) for i in q["idx"])
            and q.get("category") in MCT_CATEGORIES for q in sq)):
        bad.append("config.json split_questions: missing or malformed (needs question_id, question_rank, idx, "
                   "category per question)")
        return []
    for k, q in enumerate(sq):
        expect(bad, f"config.json split_questions[{k}]", "question_rank", q["question_rank"], k)
    if sorted(i for q in sq for i in q["idx"]) != list(range(n_rows)):
        bad.append(f"config.json split_questions: the questions' idx do not partition 0..{n_rows - 1}")
    if len({q["question_id"] for q in sq}) != len(sq):
        bad.append("config.json split_questions: a question_id appears twice")
    return sq


def selection_problems(bad, cfg, questions):
    """config.json selection: the mode follows from the split and --limit, and selection.documents is what that
    mode selects. Returns (mode, limit, the selected idx or MISSING)."""
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split, mode, limit, n_rows = cfg.get("split"), sel.get("mode"), sel.get("limit"), cfg.get("n_rows")
    whole = "limit" if limit is not None else "all"
    want_mode = {"smoke": "smoke", "dev": whole, "all": whole}.get(split)
    expect(bad, "config.json", "selection.mode", mode, want_mode, f"split {split!r}, limit {limit!r}")
    if mode == "limit":
        expect(bad, "config.json", "selection.allow_partial_groups", sel.get("allow_partial_groups", MISSING), True,
               "run.py refuses --limit on grouped documents without --allow-partial-groups")
    expect(bad, "config.json", "selection.smoke_questions", sel.get("smoke_questions", MISSING),
           config_block(cfg).get("mctaco_smoke_questions", MISSING))
    documents = MISSING
    if mode == "all" and is_int(n_rows):
        documents = list(range(n_rows))
    elif mode == "smoke" and is_int(sel.get("smoke_questions")):
        documents = sorted(i for q in questions[:sel["smoke_questions"]] for i in q["idx"])
    elif mode == "limit" and is_int(limit) and is_int(n_rows) and 1 <= limit <= n_rows:
        documents = list(range(limit))
    expect(bad, "config.json", "selection.documents", sel.get("documents", MISSING), documents,
           f"the selection rule for mode {mode!r}")
    return mode, limit, documents


def prompt_settings(bad, conf):
    """The prompt template, choices and delimiter of the effective config (usable stand-ins when they are not).
    The template is None when unusable (nothing is then compared with it)."""
    prompt_t, choices, delim = conf.get("mctaco_prompt"), conf.get("mctaco_choices"), conf.get("target_delimiter")
    if not (isinstance(prompt_t, str) and all(prompt_t.count("{" + f + "}") == 1 for f in MCT_COLUMNS[:3])):
        bad.append(f"config.json config.mctaco_prompt: {short(prompt_t)} needs {{sentence}}, {{question}}, {{answer}}")
        prompt_t = None
    if choices != list(MCT_LABELS):
        bad.append(f"config.json config.mctaco_choices: {short(choices)}, expected {list(MCT_LABELS)} (label 0 no, "
                   "1 yes)")
        choices = list(MCT_LABELS)
    if not isinstance(delim, str):
        bad.append(f"config.json config.target_delimiter: {short(delim)} is not a string")
        delim = " "
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot task")
    return prompt_t, choices, delim


def official_task_problems(bad, cfg, prompt_t, choices, delim):
    """The task lm-eval ran (dumped by run.py) is the installed YAML as loaded, changed only in the data transport
    and test_split, and it is the protocol these rules recompute."""
    dumped, yaml_cfg = get(cfg, "official.dumped_task_config"), get(cfg, "official.yaml_config")
    if not isinstance(dumped, dict) or not isinstance(yaml_cfg, dict):
        bad.append("config.json official.dumped_task_config / official.yaml_config: missing")
        dumped, yaml_cfg = {}, {}
    for k, v in yaml_cfg.items():
        if k == "test_split":    # a test-split resource follows the stock choice; any other overrides it
            expect(bad, "config.json", "official.dumped_task_config.test_split", dumped.get(k),
                   v if cfg.get("data_split") == "test" else None,
                   "the one change besides custom_dataset (unless the data is the test split): lm-eval would "
                   "evaluate the test split")
            expect(bad, "config.json", "official.modifications.test_split.yaml",
                   get(cfg, "official.modifications.test_split.yaml"), v)
        else:
            expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), v,
                   "official.yaml_config (the installed YAML as loaded)")
    extra = sorted(set(dumped) - set(yaml_cfg) - LM_EVAL_ADDED_KEYS)
    if extra:
        bad.append(f"config.json official.dumped_task_config: keys {extra} are neither in the YAML nor lm-eval "
                   "defaults")
    if not isinstance(dumped.get("custom_dataset"), str):
        bad.append("config.json official.dumped_task_config.custom_dataset: missing (the data transport)")
    doc_to_text = None if prompt_t is None else re.sub(r"\{(sentence|question|answer)\}", r"{{\1}}", prompt_t)
    for k, want in (("doc_to_text", doc_to_text), ("doc_to_choice", choices), ("doc_to_target", "label"),
                    ("output_type", "multiple_choice"), ("target_delimiter", delim), ("num_fewshot", 0),
                    ("validation_split", "validation"), ("metric_list", [{"metric": "acc"}, {"metric": "f1"}])):
        if want is not None:
            expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), want)


def lm_eval_run_problems(bad, cfg, mode, limit, documents):
    """How lm-eval was asked to select documents: smoke passes its documents as samples, --limit is lm-eval's limit,
    and lm-eval's n-samples: effective = limit, or the whole split when no limit is given, even when `samples`
    restricts the documents (smoke): lm_eval/evaluator.py:753-760 counts limit only."""
    n_rows = cfg.get("n_rows")
    expect(bad, "config.json", "official.documents_passed_as_samples", get(cfg, "official.documents_passed_as_samples"),
           documents if mode == "smoke" else None, "smoke passes its sorted documents; otherwise lm-eval selects")
    expect(bad, "config.json", "official.lm_eval_limit", get(cfg, "official.lm_eval_limit"), limit)
    expect(bad, "config.json", "official.n_samples", get(cfg, "official.n_samples"),
           {"original": n_rows, "effective": limit if mode == "limit" else n_rows}, "lm-eval's n-samples")


def documents_check(C, name, plan, records):
    """Row DOCUMENTS_ROW: the records are exactly the selected documents, in order, each doc_id its idx, each
    with its question's identity (id, rank, candidate rank, category) from config.json split_questions."""
    idx_list = [r["idx"] for r in records]
    if isinstance(plan.documents, list):
        bad = rank_order_problems(idx_list, plan.documents, f"config.json selection.documents, mode {plan.mode!r}")
    else:
        bad = ["records.jsonl idx: config.json selection.documents is unusable; the selection cannot be checked"]
    q_of = {i: (q, pos) for q in plan.questions for pos, i in enumerate(q["idx"])}
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
    C.add(name, ARITHMETIC, DOCUMENTS_ROW, len(records), bad)


def correctness_check(C, name, records):
    """Row "correctness (...)": independent.correct, lm-eval's per-document acc and its (gold, pred) f1 pair, from
    the labels and the predictions recomputed from the score lists."""
    bad = []
    for r in records:
        w, label = f"idx {r['idx']}", r["label"]
        off, ind = argmax_first(r["official"]["scores"]), argmax_first(r["independent"]["scores"])
        expect(bad, w, "independent.correct", r["independent"]["correct"], int(ind == label))
        expect(bad, w, "official.acc", r["official"]["acc"], float(off == label), "lm-eval per-document acc")
        expect(bad, w, "official.f1_pair", r["official"]["f1_pair"], [label, off], "lm-eval's (gold, pred)")
    C.add(name, ARITHMETIC, "correctness (independent.correct, lm-eval acc and f1 pair)", len(records), bad)


# ---- level 1: the metrics, the limit table, summary.json ----------------------------------------------------------

@dataclass
class Figures:
    """The whole document set's figures, recomputed from the labels and score lists (never a recorded pred)."""
    labels: list
    off_preds: list
    ind_preds: list
    correct: dict            # idx -> independent prediction right (0/1)
    complete: list           # complete questions
    cut: list                # cut questions, as summary.json lists them
    scope: str               # the computed_on note
    independent: dict
    em: dict


def side_figures(labels, preds, scope):
    """acc, corpus F1 (with its counts) and prediction counts of one path."""
    f1, counts = mct_f1(labels, preds)
    return {"correct": sum(int(p == l) for p, l in zip(preds, labels)), "acc": mct_acc(labels, preds),
            "f1": f1 if labels else None, "f1_counts": counts,
            "pred_counts": {"no": preds.count(0), "yes": preds.count(1)}, "computed_on": scope}


def main_figures(plan, records):
    labels = [r["label"] for r in records]
    off_preds = [argmax_first(r["official"]["scores"]) for r in records]
    ind_preds = [argmax_first(r["independent"]["scores"]) for r in records]
    correct = {r["idx"]: int(p == r["label"]) for r, p in zip(records, ind_preds)}
    complete, cut = mct_groups([r["idx"] for r in records], plan.questions)
    scope = (f"INCOMPLETE SET: {len(cut)} question(s) cut (only some of their candidates scored); acc and F1 cover "
             f"the {len(records)} scored documents, EM only the {len(complete)} complete questions" if cut
             else f"complete set: every candidate of each of the {len(complete)} questions scored")
    return Figures(labels, off_preds, ind_preds, correct, complete, cut, scope,
                   side_figures(labels, ind_preds, scope), mct_em([q["idx"] for q in complete], correct))


def limit_table_check(C, name, plan, records, summ, fig, batch_size):
    """Row LIMIT_ROW: each row claims lm-eval's limit=N run scored documents 0..N-1 of this run and agrees bit for
    bit with the independent path scoring those documents in that run's own batches. The row's two score lists
    are its inputs (a limit run is another call with other batches, so they need not equal the main run's);
    everything else is recomputed from them, the first N records and the batch size. Returns summary.json's
    limit_demo as it must be."""
    reference = {"documents": len(records), "acc": fig.independent["acc"], "f1": fig.independent["f1"],
                 "em": fig.em["em"], "incomplete_set": bool(fig.cut)}
    by_idx = {r["idx"]: r for r in records}
    demo = get(summ, "limit_demo") if summ is not None else MISSING
    recorded = {row["limit"]: row for row in (demo.get("rows") if isinstance(demo, dict) and
                                               isinstance(demo.get("rows"), list) else [])
                if isinstance(row, dict) and is_int(row.get("limit"))}
    bad, rows = [], []
    for n, kind in plan.limit_ns.items():
        first = [by_idx[i] for i in range(n) if i in by_idx]
        scores = limit_scores(bad, n, get(recorded.get(n, {}), "scores"))
        if len(first) != n:
            bad.append(f"limit {n}: documents 0..{n - 1} are not all in records.jsonl; cannot recompute the row")
            continue
        if scores is None:
            continue
        row = limit_row(n, kind, first, scores, plan, fig, reference, batch_size)
        if row["max_abs_diff_vs_independent"] != 0.0:
            bad.append(f"limit {n}: lm-eval's limit run and the independent path on the same batches differ by "
                       f"{row['max_abs_diff_vs_independent']} (the claim is bit for bit)")
        rows.append(row)
    shuffle = shuffle_expected(bad, demo.get("shuffle_before_cut") if isinstance(demo, dict) else None, rows)
    C.add(name, ARITHMETIC, LIMIT_ROW, len(plan.limit_ns), bad, note=f"N = {list(plan.limit_ns)}")
    return {"reference": reference, "rows": rows, "shuffle_before_cut": shuffle}


LIMIT_FORWARD = "limit runs' scores vs the forward pass"


def mctaco_forward(C, name, ev, records, tokens, model_dir):
    """The forward level: every record's scores (two_path_forward), then row LIMIT_FORWARD: each limit run's two
    score lists against audit.py's own forward pass on the same documents' token ids (the arithmetic level takes
    those lists as given; here they must be the model's own numbers, within the forward tolerance)."""
    figures = two_path_forward(C, name, ev, records, tokens, model_dir)
    if figures is None:
        C.skip(name, FORWARD, LIMIT_FORWARD, "the forward pass did not run (see the rows above)")
        return None
    model, _ = forward.load_llama(model_dir)
    by_idx, bad, n_scores = {r["idx"]: r for r in records}, [], 0
    rows = get(ev["summary"], "limit_demo.rows") if ev["summary"] is not None else MISSING
    for row in rows if isinstance(rows, list) else []:
        n = row.get("limit") if isinstance(row, dict) else None
        scores = limit_scores([], n, row.get("scores")) if is_int(n) else None
        if scores is None or not all(i in by_idx for i in range(n)):
            bad.append(f"summary.json limit_demo.rows (limit {short(n)}): no usable scores or documents")
            continue
        for i in range(n):
            recomputed, _ = forward.candidate_scores(model, *tokens[i])
            for side in ("official", "independent"):
                for j, (got, want) in enumerate(zip(scores[side][i], recomputed)):
                    n_scores += 1
                    if not abs(got - want) <= forward.FORWARD_TOL:
                        bad.append(f"limit {n} idx {i} {side}[{j}]: recorded {got!r}, recomputed {want!r} "
                                   f"(tolerance {forward.FORWARD_TOL:g})")
    C.add(name, FORWARD, LIMIT_FORWARD, n_scores, bad)
    return figures


def limit_scores(bad, n, scores):
    """A limit row's {"official", "independent"} score lists: n documents x 2 finite floats each, or None."""
    ok = isinstance(scores, dict) and all(
        isinstance(scores.get(side), list) and len(scores[side]) == n and
        all(isinstance(d, list) and len(d) == 2 and all(is_num(x) for x in d) for d in scores[side])
        for side in ("official", "independent"))
    if not ok:
        bad.append(f"summary.json limit_demo.rows (limit {n}).scores: expected official and independent lists of {n} "
                   f"[no, yes] score pairs, found {short(scores, 80)}")
        return None
    return scores


def limit_row(n, kind, first, scores, plan, fig, reference, batch_size):
    """One limit table row as it must be, from the first n records and the row's own two score lists."""
    official, independent = scores["official"], scores["independent"]
    golds, preds = [r["label"] for r in first], [argmax_first(s) for s in official]
    f1, counts = mct_f1(golds, preds)
    acc = mct_acc(golds, preds)
    lim_correct = {r["idx"]: int(p == r["label"]) for r, p in zip(first, preds)}
    complete, cut = mct_groups(list(range(n)), plan.questions)
    cut_ids = {c["question_id"] for c in cut}
    cut_full = [q for q in plan.questions if q["question_id"] in cut_ids]
    return {
        "limit": n, "kind": kind,
        "lm_eval": {"acc": acc, "f1": f1, "n_samples": {"original": plan.n_rows, "effective": n}},
        "doc_ids": list(range(n)), "doc_ids_are_first_n": True, "preds": preds,
        "scores": {"official": official, "independent": independent},
        "batch_shapes": lm_eval_batch_shapes(first, batch_size)[2] if is_int(batch_size) and batch_size >= 1
        else MISSING,
        "max_abs_diff_vs_independent": max(abs(a - b) for o, i in zip(official, independent) for a, b in zip(o, i)),
        "max_abs_diff_vs_main_run": max(abs(a - b) for o, r in zip(official, first)
                                        for a, b in zip(o, r["official"]["scores"])),
        "identity_matches_main_run": True,
        "recomputed": {"acc": acc, "f1": f1, "f1_counts": counts},
        "questions_touched": len(complete) + len(cut), "n_complete_questions": len(complete), "cut_questions": cut,
        "em_complete_questions": mct_em([q["idx"] for q in complete], lim_correct),
        "em_cut_questions_on_scored_candidates": mct_em([c["scored_idx"] for c in cut], lim_correct),
        "em_cut_questions_on_all_candidates": mct_em([q["idx"] for q in cut_full], fig.correct)
        if all(i in fig.correct for q in cut_full for i in q["idx"]) else None,
        "delta_vs_reference": {"acc": acc - reference["acc"], "f1": f1 - reference["f1"]},
    }


def shuffle_expected(bad, shuffle, rows):
    """limit_demo.shuffle_before_cut as it must be. The source citations are declared (the audit does not read
    lm_eval): each must say it was found, and the conclusion must agree with what the limit rows show."""
    if not isinstance(shuffle, dict):
        bad.append("summary.json limit_demo.shuffle_before_cut: missing")
        return MISSING
    src, files = shuffle.get("source"), shuffle.get("files_without_the_word_shuffle")
    if not (isinstance(src, list) and src and all(isinstance(s, dict) and s.get("found") is True for s in src)):
        bad.append("summary.json limit_demo.shuffle_before_cut.source: a cited line range was not found")
    if not (isinstance(files, dict) and files and all(v is True for v in files.values())):
        bad.append("summary.json limit_demo.shuffle_before_cut.files_without_the_word_shuffle: not all true")
    return {"documents_shuffled_before_limit": False, "conclusion": shuffle.get("conclusion", MISSING),
            "source": src, "files_without_the_word_shuffle": files,
            "observed": {"limit_runs": len(rows), "doc_ids_first_n": len(rows),
                         "scores_identical_to_main_run": sum(r["max_abs_diff_vs_main_run"] == 0.0 for r in rows)}}


def by_category(records, fig):
    """Per category: documents, acc and EM over its complete questions (independent path)."""
    out = {}
    for cat in MCT_CATEGORIES:
        rs = [(r, p) for r, p in zip(records, fig.ind_preds) if r["category"] == cat]
        if rs:
            out[cat] = {"n_documents": len(rs), "acc": mct_acc([r["label"] for r, _ in rs], [p for _, p in rs]),
                        **mct_em([q["idx"] for q in fig.complete if q["category"] == cat], fig.correct),
                        "computed_on": fig.scope}
    return out


def mct_uncertainty(recorded, records, fig):
    """summary.json uncertainty: Wilson intervals of acc (both paths, per category, the constant answers) and of EM
    (one trial per complete question); limit_demo is declared as not covered."""
    def acc(pairs):                     # [(label, pred), ...] -> (correct, n)
        return sum(int(l == p) for l, p in pairs), len(pairs)

    def em(qs):
        return sum(all(fig.correct[i] for i in q["idx"]) for q in qs), len(qs)

    out = {"official/acc": acc(list(zip(fig.labels, fig.off_preds))),
           "independent/acc": acc(list(zip(fig.labels, fig.ind_preds))), "independent/em/em": em(fig.complete)}
    for cat in MCT_CATEGORIES:
        pairs = [(r["label"], p) for r, p in zip(records, fig.ind_preds) if r["category"] == cat]
        if pairs:
            out[f"by_category/{cat}/acc"] = acc(pairs)
            out[f"by_category/{cat}/em"] = em([q for q in fig.complete if q["category"] == cat])
    for k, nm in ((0, "always_no"), (1, "always_yes")):
        out[f"baselines/{nm}/acc"] = acc([(l, k) for l in fig.labels])
    return uncertainty.expected_block(recorded, out, {}, uncovered=("limit_demo",))


def expected_summary(name, plan, records, fig, limit_demo, identity_fields, recorded_uncertainty=None):
    """summary.json as the records say it must be (the recorded uncertainty floats taken within tolerance)."""
    labels, off = fig.labels, side_figures(fig.labels, fig.off_preds, fig.scope)
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]
    return {
        "experiment": name, "split": plan.split, "confirmation_items_scored": False, "selection": plan.mode,
        "limit": plan.limit, "n_documents": len(records), "n_candidates": len(diffs),
        "n_questions_touched": len(fig.complete) + len(fig.cut), "n_complete_questions": len(fig.complete),
        "label_counts": {"no": labels.count(0), "yes": labels.count(1)},
        "incomplete_set": bool(fig.cut), "metrics_computed_on": fig.scope, "cut_questions": fig.cut,
        "official": {**off, "lm_eval_reported": {"acc": off["acc"], "f1": off["f1"]}},
        "independent": {**fig.independent, "em": {**fig.em, "computed_on": fig.scope}},
        "by_category": by_category(records, fig),
        "baselines": {nm: {"acc": mct_acc(labels, [k] * len(labels)),
                           "f1": mct_f1(labels, [k] * len(labels))[0] if labels else None, "computed_on": fig.scope}
                      for k, nm in ((0, "always_no"), (1, "always_yes"))},
        "agreement": {"max_abs_diff": max(diffs) if diffs else MISSING,
                      "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(a != b for a, b in zip(fig.off_preds, fig.ind_preds)),
                      "acc_official_vs_independent": [off["acc"], fig.independent["acc"]],
                      "f1_official_vs_independent": [off["f1"], fig.independent["f1"]]},
        "identity_checks": {"passed": True, "n_samples_joined": len(records), "fields": identity_fields},
        "limit_demo": limit_demo,
        "uncertainty": mct_uncertainty(recorded_uncertainty, records, fig),
    }


def summary_values_check(C, name, ev, plan, records, fig, limit_demo):
    """Row SUMMARY_ROW: summary.json rebuilt from the records, and lm-eval's own aggregates (config.json
    official.reported: acc as the mean, f1 as the corpus F1 of "yes") recomputed from them."""
    summ = ev["summary"]
    expected = expected_summary(name, plan, records, fig, limit_demo,
                                get(summ, "identity_checks.fields") if summ is not None else MISSING,
                                get(summ, "uncertainty") if summ is not None else None)
    if summ is not None and ("fast" in summ or any("fast" in r for r in records)):
        expected["fast"] = fast_expected(summ.get("fast"), records, C, name)
    extra = []
    expect(extra, "config.json", "official.reported", get(ev["config"], "official.reported"),
           expected["official"]["lm_eval_reported"],
           "lm-eval's acc (mean) and f1 (corpus F1 of 'yes') recomputed from the records")
    summary_check(C, name, ev, expected, SUMMARY_ROW, len(records), extra=extra,
                  identity_fields=IDENTITY_FIELD_RULES, note="INCOMPLETE SET" if fig.cut else "")


# ---- level 2, identity ---------------------------------------------------------------------------------------------

def audit_mctaco_identity(C, name, out, ev, records, model_dir, data_parquet):
    """Level 2 (the rows of every two-path multiple-choice experiment) with MC-TACO's private texts and data
    parquet. Returns the verified token ids for the forward level, or None."""
    return multiple_choice_identity(
        C, name, records, ev["identity"], model_dir,
        texts_check=lambda: private_texts_check(
            C, name, out, records, lambda t: all(isinstance(t.get(k), str) for k in MCT_TEXTS),
            "idx, " + ", ".join(MCT_TEXTS), PRIVATE_TEXTS, "text hashes",
            text_problems(config_block(ev["config"]).get("mctaco_prompt"))),
        data_check=lambda: data_parquet_check(C, name, ev["config"], records, data_parquet))


def text_problems(prompt_t):
    """Row PRIVATE_TEXTS, per record: re-hash the private sentence, question, answer and prompt, recompute the
    question id, rebuild the prompt from the template (`prompt_t`), recompute lm-eval's doc_hash."""
    def check(bad, w, r, t):
        for k in MCT_TEXTS:
            expect(bad, w, f"{k}_sha256", r[f"{k}_sha256"], sha256_text(t[k]), f"sha256 of the private {k}")
        expect(bad, w, "question_id", r["question_id"], sha256_text(f"{t['sentence']}\t{t['question']}"),
               "sha256 of sentence TAB question")
        expect(bad, w, "category", r["category"], t.get("category"), "private texts")
        if isinstance(prompt_t, str):
            expect(bad, w, "prompt", t["prompt"], mct_render(prompt_t, t), "config.mctaco_prompt filled in")
        expect(bad, w, "official.doc_hash", r["official"]["doc_hash"],
               mct_doc_hash(t["sentence"], t["question"], t["answer"], r["label"], r["category"]),
               "lm-eval's doc hash of (sentence, question, answer, label, category)")
    return check


def mctaco_rows(C, name, parquet):
    """The data parquet's rows as dicts of MCT_COLUMNS, or None after a SKIPPED row DATA_PARQUET saying why."""
    if parquet is None or not parquet.exists():
        C.skip(name, IDENTITY, DATA_PARQUET, f"data parquet not found ({parquet}); labels NOT checked against the data")
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        C.skip(name, IDENTITY, DATA_PARQUET, f"cannot import pyarrow ({e})")
        return None
    cols = pq.read_table(parquet).to_pydict()
    if not set(MCT_COLUMNS) <= set(cols):
        raise Unreadable(f"{parquet}: columns {sorted(cols)}, expected {', '.join(MCT_COLUMNS)}")
    return [dict(zip(MCT_COLUMNS, v)) for v in zip(*(cols[c] for c in MCT_COLUMNS))]


def data_parquet_check(C, name, cfg, records, parquet):
    """Row DATA_PARQUET: config.json's n_rows, canonical content hash and split questions recomputed from the data
    parquet, and each record's label, category and text hashes found in it."""
    rows = mctaco_rows(C, name, parquet)
    if rows is None:
        return
    bad = []
    expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows), f"rows in {parquet}")
    content = "".join(f"{i}\t{r['sentence']}\t{r['question']}\t{r['answer']}\t"
                      f"{MCT_LABELS[r['label']] if r['label'] in (0, 1) else r['label']}\t{r['category']}\n"
                      for i, r in enumerate(rows))
    expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING), sha256_text(content),
           f"canonical MC-TACO content hash of {parquet}")
    questions = {}
    for i, r in enumerate(rows):
        qid = sha256_text(f"{r['sentence']}\t{r['question']}")
        questions.setdefault(qid, {"question_id": qid, "question_rank": len(questions), "idx": [],
                                   "category": r["category"]})["idx"].append(i)
    expect(bad, "config.json", "split_questions", cfg.get("split_questions", MISSING), list(questions.values()),
           "questions recomputed from the data")
    for rec in records:
        w = f"idx {rec['idx']}"
        if not 0 <= rec["idx"] < len(rows):
            bad.append(f"{w} idx: not in the data")
            continue
        row = rows[rec["idx"]]
        for k in ("label", "category"):
            expect(bad, w, k, rec[k], row[k], f"{k} in the data")
        for k in MCT_COLUMNS[:3]:
            expect(bad, w, f"{k}_sha256", rec[f"{k}_sha256"], sha256_text(row[k]), f"{k} in the data")
    C.add(name, IDENTITY, DATA_PARQUET, len(records), bad, note=str(parquet))
