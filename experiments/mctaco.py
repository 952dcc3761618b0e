"""MC-TACO in lm-eval 0.4.9.2: acc and corpus F1 on question-candidate documents, the paper's
exact match per question, and what `--limit N` does to all three.

lm-eval's mc_taco task (tasks/mc_taco/default.yaml) turns every MC-TACO question into one document per candidate
answer: prompt "{sentence}\\nQuestion: {question}\\nAnswer: {answer}\\nPlausible:", choices " no" / " yes",
gold = the row's label (0 no, 1 yes), metrics acc (mean over documents) and f1 (sklearn's binary F1 of class 1 =
"yes" over all documents at once: lm_eval/api/metrics.py:61-70, fed (gold, pred) pairs by
ConfigurableTask.process_results, lm_eval/api/task.py:1648). The MC-TACO paper's exact match (EM: a question counts
only if every one of its candidates is judged right) is not an lm-eval metric in 0.4.9.2; it is computed here.

Every document is scored twice, as in the protocol experiment: by lm-eval with the installed YAML (the data
served through custom_dataset from the verified cache; test_split set to None so that the served validation split
is what lm-eval evaluates, because eval_docs prefers a test split whenever the YAML names one:
lm_eval/api/task.py:687-696), and by the independent path (experiments/scoring.py) in the batches lm-eval forms for
the same documents. The two are joined on document identity and must agree bit for bit. acc, F1 and EM are computed
independently and compared with lm-eval's.

Documents: every row of the validation split in dataset order (--smoke: every row of the first 2 questions, whole
questions only; --limit N --allow-partial-groups: lm-eval's own first N documents, cut groups listed and every
metric marked as computed on an incomplete set). The limit demonstration re-runs lm-eval with limit=N for a few N
and sets its figures next to the full ones, with the questions each N cuts; SHUFFLE_SOURCE below is what the
pinned source says about shuffling before the cut (it is re-checked against the installed files at run time).

Flags it honours (ctx.options): limit and allow_partial_groups (run.py refuses --limit here without the latter);
no_cache (the independent parity scores are otherwise served from / stored into the result cache, which keeps the
bit-exact claim: a cached score is the float computed); fast (fast mode reported beside parity mode, fast_check.py).

Read top to bottom: data -> documents -> official run (+ limit runs) -> independent run -> identity join ->
compare -> metrics -> limit table -> evidence.
"""
import hashlib
import warnings

from tqdm import tqdm

import resources
import registry
from experiments import fast_check, official, parallel, scoring, stats, two_paths
from experiments.context import Result
from experiments.evidence import IdentityMismatch, jsonl
from resources import ResourceError

NAME = "mctaco"
CONFIG_SECTIONS = registry.config_sections(NAME)   # declared in registry.py
EXACT_AGREEMENT_ONLY = True  # its two paths must agree bit for bit: run.py refuses a device without that claim
TASK_YAML = "tasks/mc_taco/default.yaml"
TASK_NAME = "mc_taco"
# The contract's --limit attributes (experiments/context.py): --limit is implemented here, and it cuts groups (a
# question's candidates), so run.py refuses it unless --allow-partial-groups is given.
SUPPORTS_LIMIT = True
DATA_PARALLEL = True   # its scoring goes through parallel.shard_map (torchrun, --shard, --merge)
DOCUMENTS_ARE_GROUP_PARTS = True
DATA_SCHEMA = "mctaco"      # run.py routes MC-TACO-shaped --data here (config mctaco_data), SST-2-shaped data not
DATA_CONFIG_KEY = "mctaco_data"   # the config key naming the data it reads (run.py verifies it: ctx.data)

# What lm-eval 0.4.9.2 does with `limit` (file, first-last line, a snippet those lines must contain, what it means).
# check_shuffle_source() re-reads the installed files and fails the run if a snippet moved.
SHUFFLE_SOURCE = [
    ("__main__.py", 368, 372, "--limit SHOULD ONLY BE USED FOR TESTING",
     "the CLI only warns that limit is for testing"),
    ("evaluator.py", 518, 527, "limit = get_sample_size(task, limit_arg)",
     "evaluate(): limit = get_sample_size(task, limit); task.build_all_requests(limit=limit, samples=...)"),
    ("evaluator_utils.py", 213, 218, "int(limit)",
     "get_sample_size: an int limit is used as is (a fraction < 1 becomes ceil(len(eval_docs) * limit)); "
     "nothing is drawn at random"),
    ("api/task.py", 446, 450, "self.doc_iterator(",
     "build_all_requests: the documents that get requests are list(self.doc_iterator(rank, limit, samples, ...))"),
    ("api/task.py", 720, 727, "enumerate(self.eval_docs)",
     "doc_iterator without samples: utils.create_iterator(enumerate(self.eval_docs), rank, limit, world_size)"),
    ("utils.py", 555, 561, "return islice(raw_iterator, rank, limit, world_size)",
     "create_iterator is itertools.islice: with one rank, documents 0..limit-1 in dataset order"),
    ("api/task.py", 687, 696, "return self.test_docs()",
     "eval_docs: the test split when the YAML names one (mc_taco does), else validation; the split as loaded"),
    ("api/task.py", 989, 1002, "self.config.custom_dataset(",
     "download: custom_dataset(...) or datasets.load_dataset(...) as stored; mc_taco has no process_docs"),
    ("evaluator.py", 619, 624, "task.doc_iterator(",
     "metrics: the post-processing loop re-iterates doc_iterator with the same limit (the same first N docs)"),
]
NO_SHUFFLE_FILES = ["evaluator.py", "evaluator_utils.py", "api/task.py", "utils.py"]


# ---- data ------------------------------------------------------------------------------------------------------

def data_label(ctx):
    return ctx.data.id


def split_choice(split):
    """Which split lm-eval evaluates, and why: the stock mc_taco YAML names test_split "test" and lm-eval then
    evaluates it (eval_docs, lm_eval/api/task.py:687-696). A test-split resource (mc-taco-test) is served as the
    test split and that choice is followed; a validation-split resource is served as validation and the choice is
    overridden by test_split None. Either way config.json records it."""
    if split == "test":
        return {"stock_task_evaluates": "test", "data_split": "test", "scored": "test", "stock_choice": "followed",
                "how": "the verified parquet is served as the test split; test_split stays 'test'"}
    return {"stock_task_evaluates": "test", "data_split": split, "scored": split,
            "stock_choice": "overridden",
            "how": "the verified parquet is served as the validation split and test_split is set to None"}


def task_config_for(parquet, split):
    """The installed YAML with the verified parquet served as `split` (see split_choice)."""
    if split != "test":
        return official.task_config(TASK_YAML, parquet, evaluate_validation=True)
    cfg = official.task_config(TASK_YAML, parquet)
    serve = cfg["custom_dataset"]

    def serve_as_test(**metadata):
        import datasets

        d = serve(**metadata)   # {"validation": the verified rows, "train": none of them}
        return datasets.DatasetDict({"test": d["validation"], "validation": d["train"], "train": d["train"]})

    cfg["custom_dataset"] = serve_as_test
    return cfg


def select_documents(ctx, rows, questions):
    """(documents as row idx list, selection record). Whole questions unless --limit cut them."""
    config, split, options = ctx.config, ctx.split, ctx.options
    limit = options.limit
    if split == "confirm":
        raise ResourceError("mctaco: there are no held-back confirmation items for MC-TACO (the confirmation split "
                            "is a rank range of the SST-2 hash rule; MC-TACO scores whole questions in dataset "
                            "order); run it without --split confirm")
    if limit is not None:
        if not options.allow_partial_groups:  # run.py refuses this before any model is loaded
            raise ResourceError("mctaco: --limit cuts questions into partial groups; add --allow-partial-groups")
        if not 1 <= limit <= len(rows):
            raise ResourceError(f"mctaco: --limit {limit} is outside 1..{len(rows)} (the split has {len(rows)} "
                                "documents)")
        return list(range(limit)), {"rule": f"lm-eval's own limit={limit}: the first {limit} documents it selects",
                                    "mode": "limit", "limit": limit}
    if split == "smoke":
        k = config["mctaco_smoke_questions"]
        idx = sorted(i for q in questions[:k] for i in q["idx"])
        return idx, {"rule": f"every document of the first {k} questions in dataset order", "mode": "smoke",
                     "limit": None}
    return [r["idx"] for r in rows], {"rule": "every document of the data's split in dataset order",
                                      "mode": "all", "limit": None}


def build_items(rows, doc_idx, questions, config):
    """Prompt and candidates per document, from the row's fields and config (not from lm-eval)."""
    qinfo = {}
    for q in questions:
        for pos, i in enumerate(q["idx"]):
            qinfo[i] = (q, pos)
    items = []
    for i in doc_idx:
        r = rows[i]
        q, pos = qinfo[i]
        prompt = config["mctaco_prompt"].format(sentence=r["sentence"], question=r["question"], answer=r["answer"])
        items.append({"idx": i, "question_id": q["question_id"], "question_rank": q["question_rank"],
                      "candidate_rank": pos, "label": r["label"], "category": r["category"],
                      "sentence": r["sentence"], "question": r["question"], "answer": r["answer"], "prompt": prompt,
                      "candidates": [config["target_delimiter"] + c for c in config["mctaco_choices"]]})
    return items


def group_status(doc_idx, questions):
    """Questions touched by a document set, split into complete and cut (some but not all candidates present)."""
    present = set(doc_idx)
    complete, cut = [], []
    for q in questions:
        kept = [i for i in q["idx"] if i in present]
        if not kept:
            continue
        if len(kept) == len(q["idx"]):
            complete.append(q)
        else:
            cut.append({"question_id": q["question_id"], "question_rank": q["question_rank"],
                        "n_candidates": len(q["idx"]), "n_scored": len(kept), "scored_idx": kept})
    return complete, cut


# ---- metrics (independent) -------------------------------------------------------------------------------------

def accuracy(golds, preds):
    return sum(int(g == p) for g, p in zip(golds, preds)) / len(golds) if golds else None


def corpus_f1(golds, preds):
    """F1 of the "yes" class (label 1) over the whole corpus at once: sklearn's binary f1_score, as lm-eval's f1
    aggregation calls it. Never an average of per-item or per-question F1. 0.0 when there is no true positive
    (sklearn's zero_division default; its UndefinedMetricWarning is silenced here, the counts say why)."""
    from sklearn.metrics import f1_score

    if not golds:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(f1_score(list(golds), list(preds)))


def f1_counts(golds, preds):
    tp = sum(1 for g, p in zip(golds, preds) if g == 1 and p == 1)
    fp = sum(1 for g, p in zip(golds, preds) if g == 0 and p == 1)
    fn = sum(1 for g, p in zip(golds, preds) if g == 1 and p == 0)
    tn = sum(1 for g, p in zip(golds, preds) if g == 0 and p == 0)
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn}


def exact_match(questions, correct_by_idx):
    """MC-TACO's EM over the given questions: a question counts if every one of its candidates is right."""
    n_ok = sum(all(correct_by_idx[i] for i in q["idx"]) for q in questions)
    return {"em": n_ok / len(questions) if questions else None, "n_correct_questions": n_ok,
            "n_complete_questions": len(questions)}


# ---- the official path -----------------------------------------------------------------------------------------

def check_shuffle_source():
    """Re-read the cited lines of the installed lm-eval; return the citations with a per-line check result."""
    out, bad = [], []
    for rel, lo, hi, snippet, what in SHUFFLE_SOURCE:
        lines = (official.LM_EVAL_DIR / rel).read_text(encoding="utf-8").splitlines()[lo - 1:hi]
        ok = any(snippet in line for line in lines)
        out.append({"file": f"lm_eval/{rel}", "lines": f"{lo}-{hi}", "snippet": snippet, "found": ok, "says": what})
        if not ok:
            bad.append((None, f"lm_eval/{rel}:{lo}-{hi}", "snippet not found", snippet))
    no_shuffle = {f"lm_eval/{rel}": "shuffle" not in (official.LM_EVAL_DIR / rel).read_text(encoding="utf-8")
                  for rel in NO_SHUFFLE_FILES}
    bad += [(None, f, "contains 'shuffle'", "expected none") for f, ok in no_shuffle.items() if not ok]
    if bad:
        raise IdentityMismatch("the installed lm-eval no longer matches the cited limit/shuffle source lines", bad)
    return out, no_shuffle


def official_part(ctx, lm, items, selection):
    """lm-eval's main run on these documents: ({doc_id: {"sample", "boundaries"}}, meta). One process: as the
    selection says (smoke: sorted samples; else lm-eval's own limit or all); a part of a data-parallel run: the
    part's documents as sorted samples (lm-eval does not shuffle, so they are the documents its limit selects)."""
    seed = ctx.config["seed"]
    cfg = task_config_for(ctx.data.parquet_path, ctx.data.split)
    if selection["mode"] == "smoke" or parallel.plan_of(ctx).mode != "single":
        passed = sorted(it["idx"] for it in items)
        results = official.evaluate(lm, cfg, TASK_NAME, passed, seed)
    else:
        passed = None
        results = official.evaluate(lm, cfg, TASK_NAME, None, seed, limit=selection["limit"])
    meta = {**official_meta(results, passed, selection, ctx.data.split),
            **official.lm_facts(lm, ctx.inputs.model_dir, ctx.config)}
    return two_paths.logged_samples(lm, items, results["samples"][TASK_NAME]), meta


def limit_runs_part(ctx, lm, limit_ns):
    """One whole lm-eval run with its own limit=N per N: ({N: results, n_samples, samples}, {})."""
    limit_runs = {}
    for n in tqdm(limit_ns, desc="lm-eval limit runs", unit="run"):
        r = official.evaluate(lm, task_config_for(ctx.data.parquet_path, ctx.data.split), TASK_NAME, None,
                              ctx.config["seed"], limit=n)
        limit_runs[n] = {"results": r["results"][TASK_NAME], "n_samples": r["n-samples"][TASK_NAME],
                         "samples": r["samples"][TASK_NAME]}
    return limit_runs, {}


def combine_official(metas, per_doc, selection):
    """The parts' meta as one: lm-eval's acc and F1 by lm-eval's own aggregation over every gathered sample, and
    n_samples as lm-eval reports it for the one-process call (lm_eval/evaluator.py: effective = min(limit or all
    documents, all documents); the parts passed samples, so each reported all documents)."""
    samples = [v["sample"] for v in per_doc.values()]
    n_all = metas[0]["n_samples"]["original"]
    n_samples = {**metas[0]["n_samples"], "effective": min(selection["limit"] or n_all, n_all)}
    return {**metas[0], "n_samples": n_samples,
            "reported": {"acc": float(official.aggregate("acc", [s["acc"] for s in samples])),
                         "f1": float(official.aggregate("f1", [s["f1"] for s in samples]))}}


def official_meta(results, passed, selection, split="validation"):
    """config.json "official": the task as loaded and as run, what was changed and why, lm-eval's own figures."""
    yaml_cfg = official.load_task_yaml(TASK_YAML)
    return {
        "lm_eval_version": official.version(),
        "task_yaml": TASK_YAML,
        "task_yaml_sha256": hashlib.sha256((official.LM_EVAL_DIR / TASK_YAML).read_bytes()).hexdigest(),
        "yaml_config": yaml_cfg,
        "dumped_task_config": results["configs"][TASK_NAME],
        "modifications": {
            "custom_dataset": f"serves the verified cache parquet as the {split} split (+ empty other splits, "
                              "unused: mc_taco names no training split); dataset_path 'mc_taco' is not loaded",
            "test_split": {"yaml": yaml_cfg.get("test_split"), "used": None,
                           "why": "lm-eval evaluates the test split whenever the YAML names one "
                                  "(lm_eval/api/task.py:687-696 eval_docs); this data is a validation split, so "
                                  "test_split is set to None and eval_docs = validation (the stock choice of the "
                                  "test split is overridden)"} if split != "test" else
                          {"yaml": yaml_cfg.get("test_split"), "used": yaml_cfg.get("test_split"),
                           "why": "this data is the test split: it is served as the test split and the stock "
                                  "task's choice (evaluate test) is followed, unchanged"},
        },
        "lm_eval_files_sha256": official.file_hashes(extra=[TASK_YAML, "__main__.py"]),
        "documents_passed_as_samples": passed,
        "lm_eval_limit": selection["limit"],
        "n_samples": results["n-samples"][TASK_NAME],
        "reported": {"acc": float(results["results"][TASK_NAME]["acc,none"]),
                     "f1": float(results["results"][TASK_NAME]["f1,none"])},
        "should_decontaminate_note": "the YAML sets should_decontaminate: true; lm-eval 0.4.9.2's evaluator.py never "
                                     "reads it (decontamination is a separate offline tool), so it changes nothing",
    }


def check_task_config(meta, config):
    """The dumped config must be the YAML as loaded, changed only in the data transport keys, and must say what
    our independent prompt spec says."""
    dumped, yaml_cfg = meta["dumped_task_config"], meta["yaml_config"]
    bad = []
    for k, v in yaml_cfg.items():
        if k == "test_split":
            used = meta["modifications"]["test_split"]["used"]
            if dumped.get(k) != used:
                bad.append((None, f"dumped_task_config.{k}", dumped.get(k), used))
        elif dumped.get(k) != v:
            bad.append((None, f"dumped_task_config.{k}", dumped.get(k), v))
    expected = {
        "doc_to_text": config["mctaco_prompt"].replace("{sentence}", "{{sentence}}").replace(
            "{question}", "{{question}}").replace("{answer}", "{{answer}}"),
        "doc_to_choice": config["mctaco_choices"], "doc_to_target": "label", "output_type": "multiple_choice",
        "target_delimiter": config["target_delimiter"], "num_fewshot": config["num_fewshot"],
        "validation_split": "validation", "metric_list": [{"metric": "acc"}, {"metric": "f1"}],
    }
    bad += [(None, k, dumped.get(k), v) for k, v in expected.items() if dumped.get(k) != v]
    if bad:
        raise IdentityMismatch("the official mc_taco task config differs from the YAML or from what this experiment "
                               "implements", bad)


# ---- the independent path --------------------------------------------------------------------------------------

def prompt_template_sha256(config):
    return hashlib.sha256(config["mctaco_prompt"].encode("utf-8")).hexdigest()


def scoring_calls(ctx, items, selection, limit_ns):
    """MC-TACO's two calls: the documents (lm-eval's task; the independent path on the same batches, through the
    result cache), and the limit demonstration (one whole lm-eval run per N, assigned by N; the independent path
    scores each again on that run's own batches)."""
    main = two_paths.Call(items, lambda lm, part: official_part(ctx, lm, part, selection), unit=two_paths.prompt_unit,
                          combine_official=lambda metas, per_doc: combine_official(metas, per_doc, selection),
                          check_official=lambda meta: check_task_config(meta, ctx.config))
    limits = two_paths.Call([{"idx": n} for n in limit_ns],
                            official=lambda lm, part: limit_runs_part(ctx, lm, [it["idx"] for it in part]),
                            independent=lambda model, tokenizer, part: limit_scores_part(
                                ctx, model, tokenizer, items, [it["idx"] for it in part]))
    return {"": main, "_limit_runs": limits}


def limit_scores_part(ctx, model, tokenizer, items, limit_ns):
    """The documents of each limit=N run (0..N-1) scored as that run's own loglikelihood call: in the batches lm-eval
    forms for exactly those documents. ({N: {"doc_ids", "scores", "shapes"}}, {}); never from the result cache."""
    out = {}
    for n in limit_ns:
        first = [it for it in items if it["idx"] < n]
        if [it["idx"] for it in first] != list(range(n)):
            raise ResourceError(f"mctaco: the limit={n} run's documents 0..{n - 1} are not all in this run's "
                                "selection")
        scored, plan, _ = scoring.score_items(model, tokenizer, [two_paths.prompt_unit(it)[1:] for it in first],
                                              ctx.config["max_input_tokens"], ctx.config["official_batch_size"])
        out[n] = {"doc_ids": [it["idx"] for it in first], "scores": [[c["score"] for c in s] for s in scored],
                  "shapes": plan.shapes()}
    return out, {}


# ---- the compare half ------------------------------------------------------------------------------------------

# What two_paths.compare_logged checks of mc_taco's logged samples and writes per document: its f1 logs a (gold,
# pred) pair per document, whose gold must be the label and pred the official argmax.
MC_TACO = two_paths.LoggedTask(
    noun="documents",
    fields=(("label", "doc.label", "label"), ("target", "target", "label"), ("category", "doc.category", "category"),
            ("sentence_sha256", "doc.sentence", "sentence"), ("question_sha256", "doc.question", "question"),
            ("answer_sha256", "doc.answer", "answer")),
    pair_metric="f1",
    record_fields=("question_id", "question_rank", "candidate_rank", "category", "question_sha256", "answer_sha256"),
    text_fields=("idx", "sentence", "question", "answer", "category", "prompt"))


def compare(ctx, items, questions, doc_idx, selection, limit_ns, scored, shuffle_source):
    """The compare half (two_paths.compare_logged), lm-eval's own acc and F1 against the independent ones, the limit
    demonstration and the summary: (records, texts, summary). Raises IdentityMismatch on any difference."""
    official_meta = scored.official[""][1]
    records, texts, fast = two_paths.compare_logged(ctx, MC_TACO, items, scored)
    check_reported_metrics(records, official_meta)
    limit_rows, shuffle = limit_demonstration(records, questions, doc_idx, limit_ns, scored.official["_limit_runs"][0],
                                              scored.independent["_limit_runs"][0], shuffle_source,
                                              two_paths.agreement_tolerance(ctx.config))
    summary = summarise(records, questions, doc_idx, selection, ctx.split, official_meta, limit_rows, shuffle)
    if fast is not None:
        summary["fast"] = fast
    return records, texts, summary


# ---- the limit demonstration -----------------------------------------------------------------------------------

def limit_ns_for(doc_idx, questions, config):
    """The N of the demonstration: config.mctaco_limit_ns below the number of documents, plus (derived from the
    data) a group boundary if none of them is one and a cut inside a group if none of them cuts."""
    n_docs = len(doc_idx)
    ends = sorted({max(q["idx"]) + 1 for q in questions if max(q["idx"]) + 1 < n_docs})
    ns = {n: "config" for n in config["mctaco_limit_ns"] if 1 <= n < n_docs}
    if ends and not any(n in ends for n in ns):
        # the boundary nearest the largest configured N: on a whole real split (3,783 or 9,442 documents) a boundary
        # near the middle would cost one more lm-eval run over half the split
        b = min(ends, key=lambda e: (abs(e - max(ns, default=0)), e))
        ns[b] = "derived: a group boundary (no question cut)"
    if not any(n not in ends for n in ns):
        for e in [0] + ends:
            if e + 2 < n_docs and e + 2 not in ends:
                ns.setdefault(e + 2, "derived: inside a group")
                break
    return dict(sorted(ns.items()))


def limit_table(ns, limit_runs, limit_scores, records, questions, reference):
    """One row per N: lm-eval's own figures on its first N documents, its scores and the independent path's scores
    of the same call (same batches), what that selection was, the questions it cuts, EM over complete vs cut
    questions; next to the reference (this run's whole document set). max_abs_diff_vs_main_run is a measured
    figure: a limit run is another call with other batches, so on some CPUs its scores differ in the last bits."""
    by_idx = {r["idx"]: r for r in records}
    correct = {r["idx"]: r["independent"]["correct"] for r in records}
    rows = []
    for n, kind in ns.items():
        run, replica = limit_runs[n], limit_scores[n]
        samples = sorted(run["samples"], key=lambda s: s["doc_id"])
        doc_ids = [s["doc_id"] for s in samples]
        official_scores = [two_paths.official_scores(s) for s in samples]
        preds = [scoring.argmax_first(o) for o in official_scores]
        in_main = all(d in by_idx for d in doc_ids)
        same_docs = replica["doc_ids"] == doc_ids
        labels = [by_idx[d]["label"] for d in doc_ids] if in_main else []
        complete, cut = group_status(doc_ids, questions)
        limit_correct = {d: int(p == by_idx[d]["label"]) for d, p in zip(doc_ids, preds)} if in_main else {}
        em_cut_all = None
        if all(i in correct for c in cut for i in next(q for q in questions if q["question_id"] == c["question_id"])["idx"]):
            cut_qs = [q for q in questions if q["question_id"] in {c["question_id"] for c in cut}]
            em_cut_all = exact_match(cut_qs, correct)
        rows.append({
            "limit": n, "kind": kind,
            "lm_eval": {"acc": float(run["results"]["acc,none"]), "f1": float(run["results"]["f1,none"]),
                        "n_samples": run["n_samples"]},
            "doc_ids": doc_ids, "doc_ids_are_first_n": doc_ids == list(range(n)), "preds": preds,
            "scores": {"official": official_scores, "independent": replica["scores"] if same_docs else None},
            "batch_shapes": replica["shapes"],
            "max_abs_diff_vs_independent": max(abs(x - y) for o, i in zip(official_scores, replica["scores"])
                                               for x, y in zip(o, i)) if same_docs else None,
            "max_abs_diff_vs_main_run": max(abs(x - y) for d, o in zip(doc_ids, official_scores)
                                            for x, y in zip(o, by_idx[d]["official"]["scores"])) if in_main else None,
            "identity_matches_main_run": in_main and all(same_document(s, by_idx[d]) for d, s in zip(doc_ids, samples)),
            "recomputed": {"acc": accuracy(labels, preds), "f1": corpus_f1(labels, preds),
                           "f1_counts": f1_counts(labels, preds)},
            "questions_touched": len(complete) + len(cut), "n_complete_questions": len(complete),
            "cut_questions": cut,
            "em_complete_questions": exact_match(complete, limit_correct),
            "em_cut_questions_on_scored_candidates": exact_match(
                [{"idx": c["scored_idx"]} for c in cut], limit_correct),
            "em_cut_questions_on_all_candidates": em_cut_all,
            "delta_vs_reference": {"acc": float(run["results"]["acc,none"]) - reference["acc"],
                                   "f1": float(run["results"]["f1,none"]) - reference["f1"]},
        })
    return rows


def same_document(sample, record):
    """A limit run's logged sample is the main run's document: the same prompt, candidates and target."""
    args = sample["arguments"]
    return ([scoring.sha256_text(a[0]) for a in args] == [record["prompt_sha256"]] * len(args)
            and [a[1] for a in args] == [c["text"] for c in record["candidates"]]
            and sample["target"] == record["label"])


def check_limit_rows(rows, tolerance=0.0):
    """Each limit run scored documents 0..N-1 of this run (same prompts, candidates and labels), agrees with the
    independent path on its own batches (bit for bit; `tolerance` off the CPU), and its acc and F1 recompute."""
    bad = []
    for row in rows:
        n = row["limit"]
        if not row["doc_ids_are_first_n"]:
            bad.append((None, f"limit {n} doc_ids", row["doc_ids"], list(range(n))))
        if not row["identity_matches_main_run"]:
            bad.append((None, f"limit {n} documents", "prompts, candidates or targets differ", "the main run's"))
        d = row["max_abs_diff_vs_independent"]
        independent_preds = [scoring.argmax_first(i) for i in row["scores"]["independent"]]
        if d is None or d > tolerance or independent_preds != row["preds"]:
            bad.append((None, f"limit {n} official vs independent", row["scores"]["official"],
                        row["scores"]["independent"]))
        for k in ("acc", "f1"):
            if row["lm_eval"][k] != row["recomputed"][k]:
                bad.append((None, f"limit {n} {k}", row["lm_eval"][k], row["recomputed"][k]))
    if bad:
        raise IdentityMismatch("lm-eval's limit runs do not hold: their documents, their agreement with the "
                               "independent path on their own batches, or their figures", bad)


# ---- summary ---------------------------------------------------------------------------------------------------

def summarise(records, questions, doc_idx, selection, split, meta, limit_rows, shuffle):
    labels = [r["label"] for r in records]
    complete, cut = group_status(doc_idx, questions)
    incomplete = bool(cut)
    scope = (f"INCOMPLETE SET: {len(cut)} question(s) cut (only some of their candidates scored); acc and F1 cover "
             f"the {len(records)} scored documents, EM only the {len(complete)} complete questions" if incomplete
             else f"complete set: every candidate of each of the {len(complete)} questions scored")
    correct = {r["idx"]: r["independent"]["correct"] for r in records}

    def side(pred_of):
        preds = [pred_of(r) for r in records]
        return {"correct": sum(int(p == l) for p, l in zip(preds, labels)), "acc": accuracy(labels, preds),
                "f1": corpus_f1(labels, preds), "f1_counts": f1_counts(labels, preds),
                "pred_counts": {"no": preds.count(0), "yes": preds.count(1)}, "computed_on": scope}

    by_cat = {}
    for cat in resources.MCTACO_CATEGORIES:
        rs = [r for r in records if r["category"] == cat]
        qs = [q for q in complete if q["category"] == cat]
        if rs:
            by_cat[cat] = {"n_documents": len(rs), "acc": accuracy([r["label"] for r in rs],
                                                                    [r["independent"]["pred"] for r in rs]),
                           **exact_match(qs, correct), "computed_on": scope}
    ind = side(lambda r: r["independent"]["pred"])
    reference = {"documents": len(records), "acc": ind["acc"], "f1": ind["f1"],
                 "em": exact_match(complete, correct)["em"], "incomplete_set": incomplete}
    return {
        "experiment": NAME, "split": split, "confirmation_items_scored": False,
        "selection": selection["mode"], "limit": selection["limit"],
        "n_documents": len(records), "n_candidates": sum(len(r["abs_diff"]) for r in records),
        "n_questions_touched": len(complete) + len(cut), "n_complete_questions": len(complete),
        "label_counts": {"no": labels.count(0), "yes": labels.count(1)},
        "incomplete_set": incomplete, "metrics_computed_on": scope, "cut_questions": cut,
        "official": {**side(lambda r: r["official"]["pred"]), "lm_eval_reported": meta["reported"]},
        "independent": {**ind, "em": {**exact_match(complete, correct), "computed_on": scope}},
        "by_category": by_cat,
        "baselines": {name: {"acc": accuracy(labels, [k] * len(labels)), "f1": corpus_f1(labels, [k] * len(labels)),
                             "computed_on": scope} for k, name in ((0, "always_no"), (1, "always_yes"))},
        "agreement": {**two_paths.agreement(records),
                      "acc_official_vs_independent": [meta["reported"]["acc"], ind["acc"]],
                      "f1_official_vs_independent": [meta["reported"]["f1"], ind["f1"]]},
        "identity_checks": {"passed": True, "n_samples_joined": len(records),
                            "fields": ["doc_id", "label", "target", "category", "sentence_sha256", "question_sha256",
                                       "answer_sha256", "prompt_sha256", "candidate texts",
                                       "candidate token ids and start", "f1 pair"]},
        "limit_demo": {"reference": reference, "rows": limit_rows, "shuffle_before_cut": shuffle},
        "uncertainty": uncertainty(records, complete, correct),
    }


def uncertainty(records, complete, correct):
    """summary["uncertainty"]: a Wilson interval for acc (both paths, per category, the constant answers) and EM
    (over the complete questions: a question is one trial), on this run's documents; none for limit_demo."""
    def acc(rs, pred_of):
        return sum(int(pred_of(r) == r["label"]) for r in rs), len(rs)

    def em(qs):
        return sum(all(correct[i] for i in q["idx"]) for q in qs), len(qs)

    out = {"official/acc": acc(records, lambda r: r["official"]["pred"]),
           "independent/acc": acc(records, lambda r: r["independent"]["pred"]),
           "independent/em/em": em(complete)}
    for cat in resources.MCTACO_CATEGORIES:
        rs = [r for r in records if r["category"] == cat]
        if rs:
            out[f"by_category/{cat}/acc"] = acc(rs, lambda r: r["independent"]["pred"])
            out[f"by_category/{cat}/em"] = em([q for q in complete if q["category"] == cat])
    for k, name in ((0, "always_no"), (1, "always_yes")):
        out[f"baselines/{name}/acc"] = acc(records, lambda r, k=k: k)
    return stats.uncertainty_block(out, {}, not_covered={
        "limit_demo": "lm-eval's figures on the first N documents, shown to demonstrate --limit; not estimates"})


def headline(s, data_id):
    ind, em = s["independent"], s["independent"]["em"]
    lim = "; ".join(f"limit {r['limit']}: acc {r['lm_eval']['acc']:.3f} F1 {r['lm_eval']['f1']:.3f}, "
                    f"{len(r['cut_questions'])} cut" for r in s["limit_demo"]["rows"])
    flag = "INCOMPLETE SET (cut: " + ", ".join(f"q{c['question_rank']} {c['n_scored']}/{c['n_candidates']}"
                                               for c in s["cut_questions"]) + "): " if s["incomplete_set"] else ""
    return (f"{flag}{s['n_documents']} documents of {s['n_questions_touched']} questions of {data_id}: "
            f"acc {ind['acc']:.4f}, "
            f"F1(yes) {ind['f1']:.4f} (lm-eval {s['official']['lm_eval_reported']['acc']:.4f} / "
            f"{s['official']['lm_eval_reported']['f1']:.4f}), EM {em['n_correct_questions']}/"
            f"{em['n_complete_questions']} complete questions; max |official - independent| = "
            f"{s['agreement']['max_abs_diff']}; lm-eval does not shuffle before the cut; {lim}")


def check_reported_metrics(records, official_meta):
    """lm-eval's own acc and F1 must equal the ones computed here from the independent predictions."""
    labels = [r["label"] for r in records]
    preds = [r["independent"]["pred"] for r in records]
    for k, mine in (("acc", accuracy(labels, preds)), ("f1", corpus_f1(labels, preds))):
        if official_meta["reported"][k] != mine:
            raise IdentityMismatch(f"lm-eval's {k} differs from the independent {k}",
                                   [(None, k, official_meta["reported"][k], mine)])


def limit_demonstration(records, questions, doc_idx, limit_ns, limit_runs, limit_scores, shuffle_source, tolerance):
    """(limit table rows, the shuffle finding): lm-eval's limit runs set against this run's documents;
    shuffle_source is check_shuffle_source()'s (citations, files without the word shuffle)."""
    labels = [r["label"] for r in records]
    preds = [r["independent"]["pred"] for r in records]
    complete, _ = group_status(doc_idx, questions)
    correct = {r["idx"]: r["independent"]["correct"] for r in records}
    reference = {"acc": accuracy(labels, preds), "f1": corpus_f1(labels, preds),
                 "em": exact_match(complete, correct)["em"]}
    rows = limit_table(limit_ns, limit_runs, limit_scores, records, questions, reference)
    check_limit_rows(rows, tolerance)
    source, no_shuffle = shuffle_source
    shuffle = {
        "documents_shuffled_before_limit": False,
        "conclusion": "lm-eval 0.4.9.2 does not shuffle: limit=N takes documents 0..N-1 of eval_docs in dataset "
                      "order (itertools.islice). MC-TACO's candidates of one question are adjacent rows, so a "
                      "limit cuts at most the one question straddling N, and the N documents are the first "
                      "questions of the split, not a sample of it. The task README's 'the harness shuffles "
                      "these documents' does not describe this version's code.",
        "source": source, "files_without_the_word_shuffle": no_shuffle,
        "observed": {"limit_runs": len(rows), "doc_ids_first_n": sum(r["doc_ids_are_first_n"] for r in rows),
                     "scores_identical_to_main_run": sum(r["max_abs_diff_vs_main_run"] == 0.0 for r in rows)},
    }
    return rows, shuffle


def config_of(ctx, rows, questions, doc_idx, selection, limit_ns, official_meta, independent_meta):
    """config.json: what was run, on which documents and questions, and the official task as loaded."""
    config = ctx.config
    return {
        "experiment": NAME, "split": ctx.split, "confirmation_items_scored": False,
        "data": ctx.data.id, "data_content_sha256": ctx.data.content_sha256, "n_rows": len(rows),
        "data_split": ctx.data.split, "split_choice": split_choice(ctx.data.split),
        "data_parquet": str(ctx.data.parquet_path.relative_to(ctx.inputs.cache)),
        "data_routing": ("run.py --data (MC-TACO-shaped, routed here by schema)" if config["mctaco_data"] ==
                         config["data"] else "config mctaco_data (run.py's --data was not given or is not "
                                             "MC-TACO-shaped)"),
        "selection": {**selection, "documents": doc_idx, "smoke_questions": config["mctaco_smoke_questions"],
                      "allow_partial_groups": ctx.options.allow_partial_groups,
                      "question_id": "sha256 of f'{sentence}\\t{question}' (UTF-8)"},
        "split_questions": [{"question_id": q["question_id"], "question_rank": q["question_rank"],
                             "idx": q["idx"], "category": q["category"]} for q in questions],
        "limit_ns": [{"limit": n, "kind": k} for n, k in limit_ns.items()],
        "config": config, "official": official_meta, "independent": independent_meta,
        "model": ctx.inputs.model_identity,
    }


def run(ctx):
    config = ctx.config
    rows = resources.read_mctaco_parquet(ctx.data.parquet_path)   # verified by run.py (ctx.data)
    questions = resources.mctaco_questions(rows)
    doc_idx, selection = select_documents(ctx, rows, questions)
    items = build_items(rows, doc_idx, questions, config)
    limit_ns = limit_ns_for(doc_idx, questions, config)
    shuffle_source = check_shuffle_source()   # before any model is loaded: a moved source line stops the run early
    scored = two_paths.score_twice(ctx, scoring_calls(ctx, items, selection, list(limit_ns)),
                                   prompt_template_sha256(config), fast=True)
    official_meta, independent_meta = scored.official[""][1], scored.independent[""][1]
    official_meta["documents_passed_as_samples"] = sorted(doc_idx) if selection["mode"] == "smoke" else None
    with ctx.stages.stage("compare"):
        records, texts, summary = compare(ctx, items, questions, doc_idx, selection, limit_ns, scored, shuffle_source)
    return Result(config=config_of(ctx, rows, questions, doc_idx, selection, limit_ns, official_meta,
                                   independent_meta),
                  records=records, summary=summary,
                  token_stats={**two_paths.candidate_token_stats(records), "limit_run_documents": sum(limit_ns)},
                  private={"texts.jsonl": jsonl(texts)},
                  headline=(headline(summary, config["mctaco_data"])
                            + fast_check.headline(independent_meta["result_cache"], summary.get("fast"),
                                                 getattr(ctx.plan, "mode", None) == "replay")),
                  prompt_template_sha256=prompt_template_sha256(config))
