"""The options experiment's rule: five prompt/scoring conditions per item, flips between
conditions, McNemar.

Five conditions per item: the official prompt scored on the option texts, and an A/B options list (forward and
reversed contents; the letters stay in place) scored on the option texts or on the letters. One record per
(item, condition); failure messages name both ("idx 100 list_text_rev"). What is particular to options is written
out again here from the definitions (experiments/options.py is not imported):
  conditions    recomputed from config.options_conditions / options_orders / options_letters / sst2_choices
  pi            displayed position -> semantic label (config.options_orders); gold position g = pi^-1(label)
  prediction    argmax over displayed positions, the first position wins ties; semantic prediction = pi(argmax)
  acc_norm      lm-eval 0.4.9.2: argmax of score / len(choice) in characters, the choice without the leading
                target delimiter (lm_eval/api/task.py ConfigurableTask.process_results, completion_len)
  acc_norm_tokens  argmax of score / number of candidate tokens (a different metric)
  paired        flips = items whose semantic predictions differ; gains = a wrong -> b right; losses = a right ->
                b wrong; net = gains - losses; exact two-sided McNemar p = min(1, 2 P(X <= min(g, l))),
                X ~ Bin(g + l, 1/2), 1.0 without discordant pairs (computed exactly with integers here and, in
                other code, in run.py; the recorded p must match to OPT_P_TOL relative)
  uncertainty   Wilson intervals of every accuracy of every condition, and per comparison the paired difference
                of the raw accuracies (Newcombe's method 10) with the exact McNemar p (evidence_audit/uncertainty.py)
  prompts       the official SST-2 prompt, or the list prompt per order, filled by str.replace
Everything else (required files, config and identity consistency, environment.json, record shape, the selection
rule, summary comparison, stage timings, private texts file, tokenisation, the data parquet, the forward level) is
a shared group.
"""
import json

from evidence_audit.checks import ARITHMETIC, IDENTITY, MISSING, expect, get, short
from evidence_audit import uncertainty
from evidence_audit.definitions import (argmax_divided, argmax_first, confirmation_scored, is_int, is_num, is_sha,
                                        mcnemar_exact)
from evidence_audit.forward import audit_candidate_scores
from evidence_audit.reading import sha256_text
from evidence_audit.shared import (CANDIDATE_FIELDS, abs_diff_problems, batching_check, both_paths_pred_problems,
                                   candidate_problems, candidate_token_counts, config_block, dtype_check,
                                   environment_check, hash_selection_problems, identity_problems,
                                   identity_with_whole_batches, limit_note, limited_hash_selection, model_problems,
                                   rank_order_problems, record_scores,
                                   record_shape_check, RecordShape, required_files, restated_problems, run_levels,
                                   split_note, split_problems, stages_check, summary_check)
from evidence_audit.tokens import candidate_tokenisation_check, private_texts_check, sst2_data_check

OPT_P_TOL = 1e-12


def is_str(v):
    return isinstance(v, str)


SHAPE = RecordShape(
    fields={"idx": is_int, "rank": is_int, "label": is_int, "condition": is_str, "space": is_str, "order": is_str,
            "prompt_kind": is_str, "pi": lambda v: isinstance(v, list) and all(is_int(x) for x in v),
            "gold_position": is_int, "sentence_sha256": is_sha, "prompt_sha256": is_sha, "context_tokens": is_int,
            "candidates": lambda v: isinstance(v, list) and len(v) > 0, "official": lambda v: isinstance(v, dict),
            "independent": lambda v: isinstance(v, dict), "abs_diff": lambda v: isinstance(v, list),
            "pred_position": is_int, "semantic_pred": is_int, "correct": is_int, "pred_position_norm_chars": is_int,
            "correct_norm_chars": is_int, "pred_position_norm_tokens": is_int, "correct_norm_tokens": is_int},
    nested={"official": {"scores": None, "is_greedy": None, "pred_position": is_int, "lm_eval_acc": is_num,
                         "lm_eval_acc_norm": is_num},
            "independent": {"scores": None, "pred_position": is_int}},
    candidates={"position": is_int, "choice": is_str, "n_chars": is_int, "semantic_label": is_int,
                **CANDIDATE_FIELDS},
    per_candidate_numbers=("official.scores", "independent.scores", "abs_diff"),
    per_candidate_booleans=("official.is_greedy",))
# identity fields run.py claims to have joined on -> the audit check that re-verifies each one
OPT_IDENTITY_FIELDS = {
    "idx": "arithmetic/item selection", "label": "arithmetic/shared item identity and identity/data parquet",
    "sentence_sha256": "identity/private texts and identity/data parquet",
    "prompt_sha256 (shared per order by the list conditions)":
        "arithmetic/shared item identity, identity/private texts",
    "official requests == (context, candidate)": "arithmetic/conditions (candidate texts = delimiter + choice)",
    "candidate token ids and start (official _encode_pair)": "identity/tokenisation",
    "lm-eval process_results acc/acc_norm == local": "arithmetic/predictions",
}
# the config keys prompt_template_sha256 hashes (run.py's prompt/condition spec)
OPT_TEMPLATE_KEYS = ("sst2_prompt", "sst2_choices", "target_delimiter", "options_list_prompt", "options_letters",
                     "options_orders", "options_conditions")
CONFIG_ROW = "config consistency (conditions, pi, comparisons, tie rule, selection, official task, identity)"
SUMMARY_ROW = "summary.json (metrics, baselines, flips, gains, losses, net, McNemar, table, agreement)"
PRIVATE_TEXTS = "private texts (sentence/prompt hashes, contexts rebuilt from the templates)"
DATA_PARQUET = "data parquet (n_rows, content hash, sentence and label per idx)"


def rec_key(r):
    return r["idx"], r["condition"]


def option_unit(r):
    """What one rank scores of a record (experiments/options.py scoring_units): the item's context it uses."""
    return r.get("idx"), r.get("prompt_kind")


def rec_where(r):
    return f"idx {r['idx']} {r['condition']}"


def audit_options(C, name, out, levels, cache):
    return run_levels(C, name, out, levels, cache, audit_options_arithmetic,
                      identity_with_whole_batches(audit_options_identity, unit_of=option_unit, token_key=rec_key),
                      audit_options_forward)


# ---- the options definitions ---------------------------------------------------------------------------------------

def opt_conditions(conf):
    """The conditions recomputed from config.options_* (the same shape run.py writes into config.json), or
    (None, why not)."""
    letters, orders, choices, delim = (conf.get(k) for k in ("options_letters", "options_orders", "sst2_choices",
                                                               "target_delimiter"))
    specs = conf.get("options_conditions")
    if not (isinstance(letters, list) and isinstance(orders, dict) and isinstance(choices, list)
            and isinstance(delim, str) and isinstance(specs, list) and specs
            and all(isinstance(x, dict) and isinstance(x.get("name"), str) for x in specs)
            and len({x["name"] for x in specs}) == len(specs)):
        return None, "config.options_letters / options_orders / options_conditions / sst2_choices unusable"
    out = []
    for spec in specs:
        name = spec["name"]
        pi = orders.get(spec.get("order"))
        if not (isinstance(pi, list) and sorted(pi) == list(range(len(choices))) and len(pi) == len(letters)):
            return None, f"condition {name}: order {short(pi)} is not a permutation of the {len(choices)} labels"
        if spec.get("space") == "text":
            shown = [choices[p] for p in pi]
        elif spec.get("space") == "letter":
            shown = list(letters)
        else:
            return None, f"condition {name}: unknown scoring space {spec.get('space')!r}"
        if spec.get("prompt") == "official" and pi != list(range(len(pi))):
            return None, f"condition {name}: the official prompt has no list, its order must be the identity"
        if spec.get("prompt") not in ("official", "list"):
            return None, f"condition {name}: unknown prompt kind {spec.get('prompt')!r}"
        out.append({"name": name, "prompt": spec["prompt"], "space": spec["space"], "order": spec["order"],
                    "pi": list(pi), "choices": shown, "candidates": [delim + c for c in shown]})
    return out, None


def opt_prompt_kind(cond):
    return "official" if cond["prompt"] == "official" else f"list_{cond['order']}"


def opt_render(conf, kind, sentence):
    """The context of one prompt kind (None for a kind the config does not define); placeholders are filled with
    str.replace (options first, then the sentence), so braces in the data are never interpreted."""
    if kind == "official":
        t = conf.get("sst2_prompt")
        return t.replace("{sentence}", sentence) if isinstance(t, str) else None
    pi, t = conf["options_orders"].get(kind[len("list_"):]), conf.get("options_list_prompt")
    if not (kind.startswith("list_") and isinstance(pi, list) and isinstance(t, str)):
        return None
    for j, letter in enumerate(conf["options_letters"]):
        t = t.replace("{option_" + letter + "}", conf["sst2_choices"][pi[j]])
    return t.replace("{sentence}", sentence)


def opt_metrics(recs, cond, positions):
    """One condition's counts from the recomputed positions (positions[key] = (raw, norm chars, norm tokens))."""
    n, pi = len(recs), cond["pi"]
    labels = [r["label"] for r in recs]
    gold = [pi.index(r["label"]) for r in recs]
    raw, chars, toks = ([positions[rec_key(r)][k] for r in recs] for k in range(3))
    correct = sum(int(p == g) for p, g in zip(raw, gold))
    c_chars = sum(int(p == g) for p, g in zip(chars, gold))
    c_toks = sum(int(p == g) for p, g in zip(toks, gold))
    return {
        "n": n, "correct": correct, "acc": correct / n, "correct_norm": c_chars, "acc_norm": c_chars / n,
        "correct_norm_tokens": c_toks, "acc_norm_tokens": c_toks / n,
        "predicted_positive": sum(int(pi[p] == 1) for p in raw), "chose_first_position": raw.count(0),
        "baseline_all_negative_correct": labels.count(0), "baseline_all_positive_correct": labels.count(1),
        "baseline_all_negative_acc": labels.count(0) / n, "baseline_all_positive_acc": labels.count(1) / n,
        "norm_chars_changes_choice": sum(int(a != b) for a, b in zip(chars, raw)),
        "norm_tokens_changes_choice": sum(int(a != b) for a, b in zip(toks, raw)),
    }


def opt_flips(recs_a, recs_b, a, b, cond_by, positions):
    """The paired comparison a vs b on the items both conditions have (semantic predictions)."""
    sa = {r["idx"]: (cond_by[a]["pi"][positions[rec_key(r)][0]], r["label"]) for r in recs_a}
    sb = {r["idx"]: (cond_by[b]["pi"][positions[rec_key(r)][0]], r["label"]) for r in recs_b}
    ids = sorted(set(sa) & set(sb))     # an item missing from one condition is named by the selection row
    flipped = [i for i in ids if sa[i][0] != sb[i][0]]
    gains = [i for i in ids if sa[i][0] != sa[i][1] and sb[i][0] == sb[i][1]]
    losses = [i for i in ids if sa[i][0] == sa[i][1] and sb[i][0] != sb[i][1]]
    return {"a": a, "b": b, "flips": len(flipped), "flipped_idx": flipped, "gains": len(gains), "gain_idx": gains,
            "losses": len(losses), "loss_idx": losses, "net": len(gains) - len(losses),
            "n_discordant": len(gains) + len(losses), "mcnemar_p": mcnemar_exact(len(gains), len(losses))}


def opt_table(flips, metrics, n):
    """summary.json `table`: the same numbers as text lines, flips first (a list keeps its order in sorted JSON)."""
    t = [f"{'comparison (semantic predictions, a vs b)':<38} {'flips':>5} {'gains':>5} {'losses':>6} {'net':>4} "
         f"{'McNemar p':>9}"]
    for name, f in flips.items():
        t.append(f"{name:<38} {f['flips']:>5} {f['gains']:>5} {f['losses']:>6} {f['net']:>+4} {f['mcnemar_p']:>9.4g}")
    t.append(f"{'condition':<16} {'correct':>8} {'acc':>6} {'acc_norm':>8} {'acc_norm_tok':>12} {'pred_pos':>8} "
             f"{'first_pos':>9} {'all_neg':>7} {'all_pos':>7}")
    for name, m in metrics.items():
        t.append(f"{name:<16} {m['correct']:>5}/{n:<2} {m['acc']:>6.4f} {m['acc_norm']:>8.4f} "
                 f"{m['acc_norm_tokens']:>12.4f} {m['predicted_positive']:>8} {m['chose_first_position']:>9} "
                 f"{m['baseline_all_negative_correct']:>7} {m['baseline_all_positive_correct']:>7}")
    return t


# ---- level 1, arithmetic -------------------------------------------------------------------------------------------

def audit_options_arithmetic(C, name, ev):
    """Level 1. Returns the validated records, or None when they cannot be trusted enough for deeper levels."""
    if not required_files(C, name, ev):
        C.skip(name, ARITHMETIC, "(all arithmetic checks)",
               "config.json or records.jsonl missing; nothing to recompute from")
        return None
    conds, comps = config_check(C, name, ev)
    environment_check(C, name, ev)
    if conds is None:
        C.skip(name, ARITHMETIC, "(remaining arithmetic checks)",
               "the conditions cannot be recomputed from config.json")
        return None
    records, n_choices = ev["records"], len(conds[0]["choices"])

    def label_range(r, where):      # the later rules index pi by the label
        ok = not is_int(r.get("label")) or 0 <= r["label"] < n_choices
        return [] if ok else [f"{where} label: {r['label']} is not a label 0..{n_choices - 1}"]

    if not record_shape_check(C, name, records, SHAPE, lambda i, r: f"idx {r.get('idx', '?')} "
                              f"{r.get('condition', '?')}", n_choices, extra=label_range):
        C.skip(name, ARITHMETIC, "(remaining arithmetic checks)", "records.jsonl has malformed records")
        return None
    cond_by = {c["name"]: c for c in conds}
    selection_check(C, name, ev, records, list(cond_by))
    conditions_check(C, name, config_block(ev["config"]), records, conds)
    shared_item_identity_check(C, name, records)
    positions = predictions_check(C, name, records, cond_by)
    C.add(name, ARITHMETIC, "agreement per candidate (abs_diff from the score lists)", len(records),
          abs_diff_problems(records, where_of=rec_where))
    if positions is None:
        C.skip(name, ARITHMETIC, "summary.json values", "a record's condition is not in config.json (see 'conditions')")
    else:
        summary_values_check(C, name, ev, records, cond_by, comps, positions)
    batching_check(C, name, ev["config"], records)
    dtype_check(C, name, ev["config"], record_scores(records, rec_where))
    stages_check(C, name, ev, token_counts(records, list(cond_by)), len(records), unit_of=option_unit)
    return records


def config_check(C, name, ev):
    """Row CONFIG_ROW: the shared config and identity groups, and what options claims about its conditions, tie
    rule, zero-shot prompt and the official task. Returns (conditions or None, the usable comparisons)."""
    cfg, bad = ev["config"], []
    conf = config_block(cfg)
    split = split_problems(bad, name, cfg)
    hash_selection_problems(bad, cfg)
    model_problems(bad, cfg)
    expect(bad, "config.json", "tie_rule", cfg.get("tie_rule", MISSING), conf.get("options_tie_rule", MISSING))
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot")
    expect(bad, "config.json", "zero_shot", cfg.get("zero_shot", MISSING), True)
    expect(bad, "config.json", "chat_template", cfg.get("chat_template", MISSING), False)
    conds, comps = conditions_config_problems(bad, cfg)
    official_task_problems(bad, cfg)
    if ev["identity"] is not None:
        spec = {k: conf.get(k, MISSING) for k in OPT_TEMPLATE_KEYS}
        template_sha = None if MISSING in spec.values() else sha256_text(json.dumps(spec, sort_keys=True))
        identity_problems(bad, name, cfg, ev["identity"], template_sha)
    restated_problems(bad, ev, split)
    C.add(name, ARITHMETIC, CONFIG_ROW, 1, bad, note=split_note(split))
    return conds, comps


def conditions_config_problems(bad, cfg):
    """config.json's conditions and comparisons are the ones config.options_* define; the list prompt has the
    sentence once and one option line per letter. Returns (conditions or None, usable comparisons or [])."""
    conf = config_block(cfg)
    conds, why = opt_conditions(conf)
    if conds is None:
        bad.append(f"config.json config: {why}")
        return None, []
    expect(bad, "config.json", "conditions", cfg.get("conditions", MISSING), conds,
           "recomputed from config.options_conditions / options_orders / options_letters / sst2_choices")
    names = {c["name"] for c in conds}
    comps = conf.get("options_comparisons")
    expect(bad, "config.json", "comparisons", cfg.get("comparisons", MISSING), comps)
    if not (isinstance(comps, list) and all(isinstance(x, list) and len(x) == 2 and set(x) <= names
                                            for x in comps)):
        bad.append(f"config.json config.options_comparisons: {short(comps)} is not a list of condition pairs")
        comps = []
    lp = conf.get("options_list_prompt")
    if not (isinstance(lp, str) and lp.count("{sentence}") == 1
            and all(f"\n{x}. {{option_{x}}}\n" in lp for x in conf["options_letters"])):
        bad.append(f"config.json config.options_list_prompt: {short(lp)} needs '{{sentence}}' once and one line "
                   "'X. {option_X}' per letter")
    return conds, comps


def official_task_problems(bad, cfg):
    """The installed glue/sst2 task (its fields as run.py read them) is the baseline prompt this experiment claims."""
    conf = config_block(cfg)
    prompt_t, choices = conf.get("sst2_prompt"), conf.get("sst2_choices")
    task = cfg.get("official_task_fields") if isinstance(cfg.get("official_task_fields"), dict) else {}
    for k, want in (("doc_to_text", prompt_t.replace("{sentence}", "{{sentence}}") if isinstance(prompt_t, str)
                     else MISSING), ("doc_to_choice", choices), ("doc_to_target", "label"),
                    ("output_type", "multiple_choice")):
        expect(bad, "config.json", f"official_task_fields.{k}", task.get(k, MISSING), want,
               "the installed glue/sst2 task must be the baseline this experiment claims")


def selection_check(C, name, ev, records, names):
    """Row "item selection (...)": records are (idx in the hash rule's rank order, cut to the first N under --limit
    N: limited_hash_selection) x (conditions in config order), nothing else; each record's rank is its item's
    rank."""
    cfg, bad = ev["config"], []
    want, why, settings, limit = limited_hash_selection(bad, ev)
    if want is None:
        bad.append(f"config.json selection: {why} ({settings})")
    else:
        bad += rank_order_problems([rec_key(r) for r in records], [(i, c) for i in want for c in names],
                                  f"{settings}; {len(names)} conditions per item in config order",
                                  where_of=lambda k: f"idx {k[0]} {k[1]}")
        expect(bad, "config.json", "selection.item_idx", get(cfg, "selection.item_idx"), want, settings)
        rank_of = {i: k for k, i in enumerate(want)}
        for r in records:
            expect(bad, rec_where(r), "rank", r["rank"], rank_of.get(r["idx"], MISSING), "the item's selection rank")
    C.add(name, ARITHMETIC, "item selection (hash rule, rank order, --limit, idx x condition)", len(records), bad,
          note=limit_note(limit))


def conditions_check(C, name, conf, records, conds):
    """Row "conditions (...)": each record is its condition (space, order, pi, prompt kind, gold position), each
    candidate is the displayed choice at its position (delimiter + choice, starting where the context ends), and no
    input is over max_input_tokens."""
    cond_by, bad = {c["name"]: c for c in conds}, []
    for r in records:
        w, c = rec_where(r), cond_by.get(r["condition"])
        if c is None:
            bad.append(f"{w} condition: not a condition of config.json")
            continue
        for k in ("space", "order", "pi"):
            expect(bad, w, k, r[k], c[k])
        expect(bad, w, "prompt_kind", r["prompt_kind"], opt_prompt_kind(c))
        expect(bad, w, "gold_position", r["gold_position"], c["pi"].index(r["label"]), "pi^-1(label)")
        for j, x in enumerate(r["candidates"]):
            expect(bad, w, f"candidates[{j}].position", x["position"], j)
            expect(bad, w, f"candidates[{j}].choice", x["choice"], c["choices"][j])
            expect(bad, w, f"candidates[{j}].n_chars", x["n_chars"], len(x["choice"]))
            expect(bad, w, f"candidates[{j}].semantic_label", x["semantic_label"], c["pi"][j], "pi(position)")
    for c in conds:
        bad += candidate_problems([r for r in records if r["condition"] == c["name"]], c["choices"],
                                  conf["target_delimiter"], conf.get("max_input_tokens"), where_of=rec_where)
    C.add(name, ARITHMETIC, "conditions (pi, gold position = pi^-1(label), candidates, limits)", len(records), bad)


def shared_item_identity_check(C, name, records):
    """Row "shared item identity (...)": one item has one label and sentence in every condition; the conditions
    of one prompt kind share one context, and two prompt kinds never have the same one."""
    bad, by_idx = [], {}
    for r in records:
        by_idx.setdefault(r["idx"], []).append(r)
    for idx, rs in by_idx.items():
        for k in ("label", "sentence_sha256"):
            if len({x[k] for x in rs}) != 1:
                bad.append(f"idx {idx} {k}: differs between its condition records ({sorted({str(x[k]) for x in rs})})")
        kinds = {}
        for x in rs:
            kinds.setdefault(x["prompt_kind"], set()).add((x["prompt_sha256"], x["context_tokens"]))
        for kind, vals in kinds.items():
            if len(vals) != 1:
                bad.append(f"idx {idx} prompt_sha256: the conditions of prompt kind {kind} do not share one context")
        if len({next(iter(v))[0] for v in kinds.values()}) != len(kinds):
            bad.append(f"idx {idx} prompt_sha256: two prompt kinds have the same context")
    C.add(name, ARITHMETIC, "shared item identity (label, sentence, one context per prompt kind)", len(by_idx), bad)


def predictions_check(C, name, records, cond_by):
    """Row "predictions (...)": every recorded prediction and correctness flag recomputed from the score lists
    (never from a recorded prediction). Returns {(idx, condition): (raw, norm chars, norm tokens) positions of the
    independent path} for the summary, or None when a record's condition is unknown (named by the conditions row)."""
    bad = both_paths_pred_problems(records, "pred_position", where_of=rec_where)
    if any(r["condition"] not in cond_by for r in records):
        C.add(name, ARITHMETIC, "predictions (argmax, pi, acc, acc_norm chars, acc_norm_tokens, lm-eval per-record "
              "metrics)", len(records), bad + ["records.jsonl condition: a record's condition is not in config.json "
                                               "(see 'conditions'); the condition-specific predictions are not "
                                               "recomputed"])
        return None
    positions = {}
    for r in records:
        w, c = rec_where(r), cond_by[r["condition"]]
        s_ind, s_off, g = r["independent"]["scores"], r["official"]["scores"], c["pi"].index(r["label"])
        p_ind, p_off = argmax_first(s_ind), argmax_first(s_off)
        p_chars = argmax_divided(s_ind, [len(ch) for ch in c["choices"]])
        p_toks = argmax_divided(s_ind, [len(x["token_ids"]) for x in r["candidates"]])
        positions[rec_key(r)] = (p_ind, p_chars, p_toks)
        expect(bad, w, "pred_position", r["pred_position"], p_ind, "independent argmax, first wins")
        expect(bad, w, "semantic_pred", r["semantic_pred"], c["pi"][p_ind], "pi(argmax)")
        expect(bad, w, "correct", r["correct"], int(p_ind == g))
        expect(bad, w, "pred_position_norm_chars", r["pred_position_norm_chars"], p_chars,
               "argmax of score / len(choice), no delimiter")
        expect(bad, w, "correct_norm_chars", r["correct_norm_chars"], int(p_chars == g))
        expect(bad, w, "pred_position_norm_tokens", r["pred_position_norm_tokens"], p_toks,
               "argmax of score / candidate token count")
        expect(bad, w, "correct_norm_tokens", r["correct_norm_tokens"], int(p_toks == g))
        expect(bad, w, "official.lm_eval_acc", r["official"]["lm_eval_acc"], float(p_off == g),
               "lm-eval acc from the official scores")
        expect(bad, w, "official.lm_eval_acc_norm", r["official"]["lm_eval_acc_norm"],
               float(argmax_divided(s_off, [len(ch) for ch in c["choices"]]) == g),
               "lm-eval acc_norm from the official scores")
    C.add(name, ARITHMETIC, "predictions (argmax, pi, acc, acc_norm chars, acc_norm_tokens, lm-eval per-record "
          "metrics)", len(records), bad)
    return positions


def agreement(records, cond_by, positions):
    """summary.json `agreement` (and the number of candidates): the two paths per candidate and per prediction,
    and lm-eval's per-record metrics against the local ones."""
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]

    def lm_eval_differs(r):
        gold, (raw, chars, _) = cond_by[r["condition"]]["pi"].index(r["label"]), positions[rec_key(r)]
        return (r["official"]["lm_eval_acc"], r["official"]["lm_eval_acc_norm"]) != (float(raw == gold),
                                                                                     float(chars == gold))

    return {"max_abs_diff": max(diffs) if diffs else MISSING,
            "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
            "n_prediction_mismatches": sum(argmax_first(r["official"]["scores"])
                                           != argmax_first(r["independent"]["scores"]) for r in records),
            "n_lm_eval_metric_mismatches": sum(lm_eval_differs(r) for r in records)}, len(diffs)


def summary_values_check(C, name, ev, records, cond_by, comps, positions):
    """Row SUMMARY_ROW: summary.json rebuilt from the records (metrics per condition, flips per comparison, the
    table, the agreement) and compared value by value."""
    summ, split = ev["summary"], ev["config"].get("split")
    recs_of = {c: [r for r in records if r["condition"] == c] for c in cond_by}
    if not all(recs_of.values()):
        C.add(name, ARITHMETIC, SUMMARY_ROW, len(records), [f"records.jsonl condition: no record of condition {c}"
                                                            for c, rs in recs_of.items() if not rs])
        return
    first = next(iter(recs_of.values()))
    metrics = {c: opt_metrics(recs_of[c], cond_by[c], positions) for c in cond_by}
    flips = {f"{a} vs {b}": opt_flips(recs_of[a], recs_of[b], a, b, cond_by, positions) for a, b in comps}
    for key, f in flips.items():
        # the p-values: run.py's code vs the exact integer arithmetic here, equal to OPT_P_TOL relative
        rec_p = get(summ, f"flips.{key}.mcnemar_p") if summ is not None else MISSING
        if is_num(rec_p) and abs(rec_p - f["mcnemar_p"]) <= OPT_P_TOL * max(1.0, f["mcnemar_p"]):
            f["mcnemar_p"] = rec_p
    labels = [r["label"] for r in first]
    agree, n_candidates = agreement(records, cond_by, positions)
    fields = get(summ, "identity_checks.fields") if summ is not None else MISSING
    expected = {
        "experiment": name, "split": split, "confirmation_items_scored": confirmation_scored(split), "n_items": len(first),
        "n_conditions": len(cond_by), "n_records": len(records), "n_candidates": n_candidates,
        "label_counts": {str(k): labels.count(k) for k in (0, 1)}, "flips": flips, "conditions": metrics,
        "agreement": agree, "table": opt_table(flips, metrics, len(first)),
        "identity_checks": {"passed": True, "n_records_joined": len(records), "fields": fields},
        "uncertainty": opt_uncertainty(get(summ, "uncertainty") if summ is not None else None, recs_of, cond_by,
                                       comps, positions),
    }
    limit = limited_hash_selection([], ev)[3]      # its problems are the selection row's
    if limit is not None:
        expected["limit"] = limit
    summary_check(C, name, ev, expected, SUMMARY_ROW, len(records), identity_fields=OPT_IDENTITY_FIELDS,
                  note=f"McNemar p recomputed exactly, tolerance {OPT_P_TOL:g} relative; intervals by formula, "
                       f"tolerance {uncertainty.TOL:g}")


# accuracy name in summary.json conditions.<c> -> what makes one item right for it (recomputed positions / label)
OPT_ACCURACIES = {"acc": lambda pos, gold, label: pos[0] == gold, "acc_norm": lambda pos, gold, label: pos[1] == gold,
                  "acc_norm_tokens": lambda pos, gold, label: pos[2] == gold,
                  "baseline_all_negative_acc": lambda pos, gold, label: label == 0,
                  "baseline_all_positive_acc": lambda pos, gold, label: label == 1}


def opt_uncertainty(recorded, recs_of, cond_by, comps, positions):
    """summary.json uncertainty: per condition a Wilson interval for each accuracy, per comparison a vs b the paired
    difference of raw accuracies (Newcombe) and the exact McNemar p, on the items both conditions have."""
    right = {}
    for c, recs in recs_of.items():
        for acc, rule in OPT_ACCURACIES.items():
            right[c, acc] = {r["idx"]: int(rule(positions[rec_key(r)], cond_by[c]["pi"].index(r["label"]),
                                                r["label"])) for r in recs}
    accuracies = {f"conditions/{c}/{acc}": (sum(right[c, acc].values()), len(recs_of[c]))
                  for c in recs_of for acc in OPT_ACCURACIES}
    paired = {}
    for a, b in comps:
        ids = [r["idx"] for r in recs_of.get(a, []) if r["idx"] in right.get((b, "acc"), {})]
        paired[f"{a} vs {b}"] = (f"conditions.{a}.acc", f"conditions.{b}.acc", [right[a, "acc"][i] for i in ids],
                                 [right[b, "acc"][i] for i in ids])
    return uncertainty.expected_block(recorded, accuracies, paired)


def token_counts(records, names):
    """stages.json["tokens"] recomputed from the records: per condition and overall; one official request per
    candidate; the independent path's forward rows are the distinct (context, candidate[:-1]) inputs of the whole
    call (lm-eval groups them over every request, items included)."""
    per = {}
    for c in names:
        counts = candidate_token_counts([r for r in records if r["condition"] == c])
        per[c] = {k: counts[k] for k in ("context_tokens", "input_tokens_per_candidate")}
    overall = candidate_token_counts(records)
    distinct = {(r["prompt_sha256"], x["start"], tuple(x["token_ids"][:-1])) for r in records for x in r["candidates"]}
    return {"per_condition": per, "n_items": len({r["idx"] for r in records}), "n_records": len(records),
            "n_candidates": overall["n_candidates"],
            "input_tokens_per_candidate": overall["input_tokens_per_candidate"],
            "official_requests": overall["n_candidates"], "independent_forward_rows": len(distinct)}


# ---- level 2, identity ---------------------------------------------------------------------------------------------

def audit_options_identity(C, name, out, ev, records, model_dir, data_parquet):
    """Level 2: private texts (hashes, contexts rebuilt from the templates), tokenisation, data parquet.
    Returns {(idx, condition): (context ids, [candidate ids])} for the forward level, or None."""
    if records is None:
        for check in ("private texts", "tokenisation", "data parquet"):
            C.skip(name, IDENTITY, check, "the arithmetic level found records.jsonl or config.json unusable")
        return None
    texts = private_texts_check(C, name, out, records, lambda t: isinstance(t.get("sentence"), str)
                                and isinstance(t.get("prompts"), dict)
                                and all(isinstance(v, str) for v in t["prompts"].values()),
                                "idx, sentence, prompts", PRIVATE_TEXTS, "sentence and prompt hashes",
                                private_text_problems(config_block(ev["config"]), records))
    tokens = candidate_tokenisation_check(C, name, texts, records, lambda t, r: t["prompts"].get(r["prompt_kind"]),
                                          ev["identity"], model_dir, key_of=rec_key, where_of=rec_where)
    sst2_data_check(C, name, ev["config"], records, data_parquet, DATA_PARQUET, where_of=rec_where)
    return tokens


def private_text_problems(conf, records):
    """The PRIVATE_TEXTS checks of one record and its item's text: once per item, its private prompts are the
    config's templates filled with its sentence, one per prompt kind the records use; per record, the sentence and
    prompt hashes are those texts'."""
    kinds, seen = sorted({r["prompt_kind"] for r in records}), set()

    def problems(bad, where, r, t):
        if r["idx"] not in seen:
            seen.add(r["idx"])
            expect(bad, where, "private prompts", sorted(t["prompts"]), kinds)
            for kind in (k for k in kinds if k in t["prompts"]):
                expect(bad, where, f"prompts.{kind}", t["prompts"][kind], opt_render(conf, kind, t["sentence"]),
                       "the template in config.json filled with the sentence")
        expect(bad, rec_where(r), "sentence_sha256", r["sentence_sha256"], sha256_text(t["sentence"]))
        expect(bad, rec_where(r), "prompt_sha256", r["prompt_sha256"],
               sha256_text(t["prompts"].get(r["prompt_kind"], "")), f"sha256 of the private {r['prompt_kind']} prompt")

    return problems


# ---- level 3, forward ----------------------------------------------------------------------------------------------

def audit_options_forward(C, name, ev, records, tokens, model_dir):
    """Every candidate score recomputed (the shared forward group), records keyed and named by (idx, condition)."""
    return audit_candidate_scores(C, name, ev["identity"], records, tokens, model_dir, key_of=rec_key,
                                  where_of=rec_where, pred_field="pred_position")
