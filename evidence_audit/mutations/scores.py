"""Tamper kinds for the three log-likelihood experiments: protocol, options, mctaco (records, summaries, private
texts, and consistent score edits only the forward level can see)."""
import copy
import json

from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY
from evidence_audit.mutations.tools import (NotApplicable, edit_json, flip_hex, float32, json_file, kind,
                                            other_value, private_rows, records, shift_loser)
from evidence_audit.reading import read_json, sha256_text


# ---- protocol ------------------------------------------------------------------------------------------------------

def m_flip_label(recs):
    recs[0]["label"] = 1 - recs[0]["label"]


def m_nudge_score(recs):
    recs[0]["official"]["scores"][0] += 1e-6


def m_swap_idx(recs):
    recs[0]["idx"], recs[1]["idx"] = recs[1]["idx"], recs[0]["idx"]


def m_change_prediction(recs):
    recs[0]["independent"]["pred"] = 1 - recs[0]["independent"]["pred"]


def m_token_count(recs):
    recs[0]["context_tokens"] += 1


def m_prompt_hash(recs):
    recs[0]["prompt_sha256"] = flip_hex(recs[0]["prompt_sha256"])


def m_both_prompt_hashes(recs):
    recs[0]["prompt_sha256"] = recs[0]["official"]["prompt_hash"] = flip_hex(recs[0]["prompt_sha256"])


def m_swap_score_lists(recs):
    a, b = recs[0], recs[1]
    for k in ("official", "independent"):
        a[k]["scores"], b[k]["scores"] = b[k]["scores"], a[k]["scores"]
    a["abs_diff"], b["abs_diff"] = b["abs_diff"], a["abs_diff"]


def m_item_acc(recs):
    recs[0]["official"]["acc"] = 1.0 - recs[0]["official"]["acc"]


def m_token_id(recs):
    recs[0]["candidates"][0]["token_ids"][0] += 1


def m_doc_hash(recs):
    recs[0]["official"]["doc_hash"] = flip_hex(recs[0]["official"]["doc_hash"])


def m_private_sentence(rows):
    rows[0]["sentence"] += " Not."


def m_relabel_split(d):
    """Relabel the split everywhere it is written, consistently: how one would hide which items were scored."""
    new = {"smoke": "dev", "dev": "smoke", "confirm": "dev", "all": "dev"}[
        read_json(d / "protocol" / "config.json")["split"]]

    def relabel(o):
        o["split"], o["confirmation_items_scored"] = new, new == "confirm"
        if "selection" in o:
            o["selection"]["split"] = new
            o["selection"].pop("split_rule", None)       # only split all states one
    edit_json(d, "protocol/config.json", relabel)
    edit_json(d, "protocol/summary.json", relabel)


def m_salt(d):
    """A careful tamperer: the salt changes in config.json and in identity.json's scoring config (and its hash),
    so only the selection rule itself can notice that the records were not chosen with this salt."""
    def cfg(o):
        o["selection"]["salt"] = o["config"]["selection_salt"] = o["selection"]["salt"] + "-x"

    def ident(o):
        o["scoring_config"]["selection_salt"] += "-x"
        o["scoring_config_sha256"] = sha256_text(json.dumps(o["scoring_config"], sort_keys=True))
    edit_json(d, "protocol/config.json", cfg)
    edit_json(d, "protocol/identity.json", ident)


def m_reported_acc(d):
    edit_json(d, "protocol/config.json", lambda o: o["official"].update(reported_acc=other_value(
        o["official"]["reported_acc"])))
    edit_json(d, "protocol/summary.json", lambda o: o["official"].update(lm_eval_reported_acc=other_value(
        o["official"]["lm_eval_reported_acc"])))


def m_interval(o):
    """Widen one Wilson bound by 1e-6: a plausible-looking interval that no longer follows from the counts."""
    ci = o["uncertainty"]["accuracies"]["independent/accuracy"]["wilson95"]
    ci[0] = ci[0] - 1e-6 if ci[0] >= 1e-6 else ci[0] + 1e-6


def m_pvalue(o):
    p = o["uncertainty"]["paired"]["independent_vs_constant_class"]
    p["mcnemar_p"] = p["mcnemar_p"] / 2 if p["mcnemar_p"] > 0.5 else p["mcnemar_p"] * 1.5


def m_difference_ci(o):
    ci = next(iter(o["uncertainty"]["paired"].values()))["difference_ci95"]
    ci[1] = ci[1] - 1e-4


def m_off_grid(recs):
    """Both paths' losing score moved by 1e-7 (no float32 value is there): predictions and agreement unchanged."""
    r = recs[0]
    loser = 1 - r["independent"]["pred"]
    for side in ("official", "independent"):
        r[side]["scores"][loser] -= 1e-7


def m_batch_shape(o):
    o["independent"]["batching"]["shapes"][0][1] += 1


def protocol_kinds():
    P, rec = "protocol", lambda fn, n=1: records("protocol", fn, n)   # noqa: E731
    return [
        kind("flip_label", P, "record 0: label -> 1 - label", rec(m_flip_label), ARITHMETIC, "correctness"),
        kind("nudge_score", P, "record 0: official.scores[0] += 1e-6", rec(m_nudge_score), ARITHMETIC, "agreement"),
        kind("drop_record", P, "remove the last record line", rec(lambda r: r[:-1]), ARITHMETIC, "item selection"),
        kind("duplicate_record", P, "append a copy of record 0", rec(lambda r: r + [copy.deepcopy(r[0])]),
             ARITHMETIC, "item selection"),
        kind("swap_idx", P, "records 0 and 1 exchange their idx", rec(m_swap_idx, 2), ARITHMETIC, "item selection"),
        kind("change_prediction", P, "record 0: independent.pred -> 1 - pred", rec(m_change_prediction),
             ARITHMETIC, "predictions"),
        kind("change_token_count", P, "record 0: context_tokens += 1", rec(m_token_count), ARITHMETIC, "candidates"),
        kind("edit_summary_accuracy", P, "summary.json: independent.accuracy -> another value",
             json_file("protocol/summary.json", lambda o: o["independent"].update(
                 accuracy=other_value(o["independent"]["accuracy"]))), ARITHMETIC, "summary.json"),
        kind("alter_prompt_hash", P, "record 0: prompt_sha256 changed", rec(m_prompt_hash),
             ARITHMETIC, "prompt hashes"),
        kind("alter_private_sentence", P, "private texts, line 1: sentence + ' Not.'",
             private_rows(P, "texts.jsonl", m_private_sentence), IDENTITY, "private texts"),
        kind("delete_stages", P, "delete protocol/stages.json", lambda d: (d / P / "stages.json").unlink(),
             ARITHMETIC, "required files"),
        kind("move_record_lines", P, "reverse the order of the record lines", rec(lambda r: r[::-1], 2),
             ARITHMETIC, "item selection"),
        kind("swap_score_lists", P, "records 0 and 1 exchange both score lists and abs_diff (ids no longer pair "
             "with scores)", rec(m_swap_score_lists, 2), FORWARD, "candidate scores"),
        kind("lm_eval_item_acc", P, "record 0: official.acc -> 1 - acc", rec(m_item_acc), ARITHMETIC, "correctness"),
        kind("lm_eval_reported_acc", P, "config.json official.reported_acc and summary.json lm_eval_reported_acc, "
             "consistently", m_reported_acc, ARITHMETIC, "summary.json"),
        kind("relabel_split", P, "split relabelled consistently in config.json and summary.json (hides what was "
             "scored)", m_relabel_split, ARITHMETIC, "item selection"),
        kind("change_salt", P, "selection salt changed consistently in config.json and identity.json", m_salt,
             ARITHMETIC, "item selection"),
        kind("both_prompt_hashes", P, "record 0: prompt_sha256 and official.prompt_hash changed together",
             rec(m_both_prompt_hashes), IDENTITY, "private texts"),
        kind("candidate_token_id", P, "record 0: candidates[0].token_ids[0] += 1", rec(m_token_id),
             IDENTITY, "tokenisation"),
        kind("doc_hash", P, "record 0: official.doc_hash changed", rec(m_doc_hash), IDENTITY, "private texts"),
        kind("both_scores_shifted", P, "a losing candidate's score -= 1e-3 on both paths (every derived figure "
             "stays consistent)", rec(shift_loser(("official", "independent"), ("official.pred", "independent.pred"))),
             FORWARD, "candidate scores"),
        kind("uncertainty_interval", P, "summary.json: the independent accuracy's Wilson lower bound moved by 1e-6",
             json_file("protocol/summary.json", m_interval), ARITHMETIC, "summary.json"),
        kind("uncertainty_pvalue", P, "summary.json: the McNemar p of independent vs the constant class changed",
             json_file("protocol/summary.json", m_pvalue), ARITHMETIC, "summary.json"),
        kind("score_off_dtype_grid", P, "record 0: the losing score moved by 1e-7 on both paths (not a float32 value)",
             rec(m_off_grid), ARITHMETIC, "scores are values of the scored dtype"),
        kind("batch_shape", P, "config.json: independent.batching.shapes[0] one token longer",
             json_file("protocol/config.json", m_batch_shape), ARITHMETIC, "independent path in lm-eval's batches"),
        kind("kernel_threads", P, "environment.json: kernels.torch_threads changed",
             json_file("environment.json", lambda o: o["kernels"].update(torch_threads=o["kernels"]["torch_threads"] + 1)),
             ARITHMETIC, "environment.json consistency"),
    ]


# ---- options -------------------------------------------------------------------------------------------------------

OPTION_PREDS = ("official.pred_position", "independent.pred_position", "pred_position", "pred_position_norm_chars",
                "pred_position_norm_tokens")


def m_options_pred(recs):
    recs[0]["independent"]["pred_position"] = 1 - recs[0]["independent"]["pred_position"]


def m_options_pi(recs):
    recs[0]["pi"] = recs[0]["pi"][::-1]


def m_options_prompt(rows):
    k = sorted(rows[0]["prompts"])[0]
    rows[0]["prompts"][k] += " "


def options_kinds():
    O, rec = "options", lambda fn, n=1: records("options", fn, n)   # noqa: E731
    return [
        kind("options_pred_position", O, "record 0: independent.pred_position -> the other position",
             rec(m_options_pred), ARITHMETIC, "predictions"),
        kind("options_permutation", O, "record 0: pi reversed (gold position no longer pi^-1(label))",
             rec(m_options_pi), ARITHMETIC, "conditions"),
        kind("options_summary_n_records", O, "summary.json: n_records += 1",
             json_file("options/summary.json", lambda o: o.update(n_records=o["n_records"] + 1)),
             ARITHMETIC, "summary.json"),
        kind("options_private_prompt", O, "private texts, line 1: one rendered prompt gains a trailing space",
             private_rows(O, "texts.jsonl", m_options_prompt), IDENTITY, "private texts"),
        kind("options_candidate_token_id", O, "record 0: candidates[0].token_ids[0] += 1", rec(m_token_id),
             IDENTITY, "tokenisation"),
        kind("options_scores_shifted", O, "a losing candidate's score -= 1e-3 on both paths (predictions, norms and "
             "agreement unchanged)", rec(shift_loser(("official", "independent"), OPTION_PREDS)),
             FORWARD, "candidate scores"),
        kind("options_difference_interval", O, "summary.json: the first comparison's upper difference bound -= 1e-4",
             json_file("options/summary.json", m_difference_ci), ARITHMETIC, "summary.json"),
    ]


# ---- mctaco --------------------------------------------------------------------------------------------------------

def m_question_id(recs):
    recs[0]["question_id"] = flip_hex(recs[0]["question_id"])


def m_f1_pair(recs):
    recs[0]["official"]["f1_pair"] = recs[0]["official"]["f1_pair"][::-1]


def m_private_answer(rows):
    rows[0]["answer"] += "s"


def m_limit_scores(o):
    """A limit run's losing score lowered on both paths, to a float32 value, with every figure the audit derives from
    the row's scores kept consistent (predictions, acc, F1 and EM do not move): only the forward level can tell."""
    rows = o["limit_demo"]["rows"]
    if not rows:
        raise NotApplicable("no limit runs")
    row = rows[-1]
    loser = 1 - row["preds"][0]
    for side in ("official", "independent"):
        row["scores"][side][0][loser] = float32(row["scores"][side][0][loser] - 1e-3)
    main = o.get("_main_scores")
    if main is None:
        raise NotApplicable("needs the main run's scores")


def m_limit_scores_in(d):
    """m_limit_scores on summary.json, with max_abs_diff_vs_main_run and the observed count recomputed from the
    main run's records as the audit does."""
    from evidence_audit.reading import read_jsonl

    main = {r["idx"]: r["official"]["scores"] for r in read_jsonl(d / "mctaco" / "records.jsonl")}

    def fn(o):
        o["_main_scores"] = main
        m_limit_scores(o)
        del o["_main_scores"]
        rows = o["limit_demo"]["rows"]
        for row in rows:
            row["max_abs_diff_vs_main_run"] = max(abs(a - b) for i, pair in enumerate(row["scores"]["official"])
                                                  for a, b in zip(pair, main[i]))
        o["limit_demo"]["shuffle_before_cut"]["observed"]["scores_identical_to_main_run"] = sum(
            r["max_abs_diff_vs_main_run"] == 0.0 for r in rows)
    edit_json(d, "mctaco/summary.json", fn)


def mctaco_kinds():
    M, rec = "mctaco", lambda fn, n=1: records("mctaco", fn, n)   # noqa: E731
    return [
        kind("mctaco_flip_label", M, "record 0: label -> 1 - label", rec(m_flip_label), ARITHMETIC, "correctness"),
        kind("mctaco_f1_pair", M, "record 0: official.f1_pair reversed", rec(m_f1_pair), ARITHMETIC, "correctness"),
        kind("mctaco_question_id", M, "record 0: question_id changed (breaks the question grouping)",
             rec(m_question_id), ARITHMETIC, "documents and groups"),
        kind("mctaco_complete_questions", M, "summary.json: n_complete_questions += 1",
             json_file("mctaco/summary.json", lambda o: o.update(n_complete_questions=o["n_complete_questions"] + 1)),
             ARITHMETIC, "summary.json"),
        kind("mctaco_private_answer", M, "private texts, line 1: answer + 's'",
             private_rows(M, "texts.jsonl", m_private_answer), IDENTITY, "private texts"),
        kind("mctaco_scores_shifted", M, "a losing candidate's score -= 1e-3 on both paths (every derived figure "
             "stays consistent)", rec(shift_loser(("official", "independent"), ("official.pred", "independent.pred"))),
             FORWARD, "candidate scores"),
        kind("mctaco_limit_scores_shifted", M, "summary.json: the last limit run's first losing score -= 1e-3 on both "
             "paths (every figure derived from it kept consistent)", m_limit_scores_in, FORWARD,
             "limit runs' scores vs the forward pass"),
    ]


def score_kinds():
    return protocol_kinds() + options_kinds() + mctaco_kinds()
