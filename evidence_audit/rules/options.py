"""The options experiment's rule: five prompt/scoring conditions per item, flips between conditions, McNemar."""
import json
import time
from pathlib import Path

from evidence_audit.checks import MISSING, compare_tree, expect, get, short
from evidence_audit.definitions import (SPLITS, argmax_divided, argmax_first, is_int, is_num, is_sha, mcnemar_exact,
                                        select_items)
from evidence_audit.forward import FORWARD_TOL, llama_logprobs, load_llama, use_threads
from evidence_audit.reading import (REQUIRED, load_evidence, read_jsonl, resolve_cache, sha256_file, sha256_text)
from evidence_audit.shared import check_scoring_identity, environment_check, stage_time_problems
from evidence_audit.tokens import load_tokenizer

# ---- the options experiment (seed study 003) ---------------------------------------------------------------------
# Five conditions per item: the official prompt scored on the option texts, and an A/B options list (forward and
# reversed contents; the letters stay in place) scored on the option texts or on the letters. Every rule is written
# out again here from the definitions (experiments/options.py is not imported):
#   pi            displayed position -> semantic label (config.options_orders); gold position g = pi^-1(label)
#   prediction    argmax over displayed positions, the first position wins ties; semantic prediction = pi(argmax)
#   acc_norm      lm-eval 0.4.9.2: argmax of score / len(choice) in characters, the choice without the leading
#                 target delimiter (lm_eval/api/task.py ConfigurableTask.process_results, completion_len)
#   acc_norm_tokens  argmax of score / number of candidate tokens (a different metric)
#   paired        flips = items whose semantic predictions differ; gains = a wrong -> b right; losses = a right ->
#                 b wrong; net = gains - losses; exact two-sided McNemar p = min(1, 2 P(X <= min(g, l))),
#                 X ~ Bin(g + l, 1/2), 1.0 without discordant pairs (computed exactly with integers here; run.py
#                 uses scipy's binomtest, so the recorded p must match to OPT_P_TOL relative)

OPT_P_TOL = 1e-12
OPT_RECORD_FIELDS = {
    "idx": is_int, "rank": is_int, "label": is_int, "condition": lambda v: isinstance(v, str),
    "space": lambda v: isinstance(v, str), "order": lambda v: isinstance(v, str),
    "prompt_kind": lambda v: isinstance(v, str), "pi": lambda v: isinstance(v, list) and all(is_int(x) for x in v),
    "gold_position": is_int, "sentence_sha256": is_sha, "prompt_sha256": is_sha, "context_tokens": is_int,
    "candidates": lambda v: isinstance(v, list) and len(v) > 0, "official": lambda v: isinstance(v, dict),
    "independent": lambda v: isinstance(v, dict), "abs_diff": lambda v: isinstance(v, list) and all(is_num(x) for x in v),
    "pred_position": is_int, "semantic_pred": is_int, "correct": is_int, "pred_position_norm_chars": is_int,
    "correct_norm_chars": is_int, "pred_position_norm_tokens": is_int, "correct_norm_tokens": is_int,
}
OPT_CAND_FIELDS = {"position": is_int, "text": lambda v: isinstance(v, str), "choice": lambda v: isinstance(v, str),
                   "n_chars": is_int, "semantic_label": is_int, "start": is_int,
                   "token_ids": lambda v: isinstance(v, list) and len(v) > 0 and all(is_int(t) for t in v)}
OPT_SIDE_FIELDS = {"official": {"scores": None, "is_greedy": None, "pred_position": is_int, "lm_eval_acc": is_num,
                                "lm_eval_acc_norm": is_num},
                   "independent": {"scores": None, "pred_position": is_int}}
OPT_IDENTITY_FIELDS = {
    "idx": "arithmetic/item selection", "label": "arithmetic/shared item identity and identity/data parquet",
    "sentence_sha256": "identity/private texts and identity/data parquet",
    "prompt_sha256 (shared per order by the list conditions)":
        "arithmetic/shared item identity, identity/private texts",
    "official requests == (context, candidate)": "arithmetic/conditions (candidate texts = delimiter + choice)",
    "candidate token ids and start (official _encode_pair)": "identity/tokenisation",
    "lm-eval process_results acc/acc_norm == local": "arithmetic/predictions",
}
OPT_TEMPLATE_KEYS = ("sst2_prompt", "sst2_choices", "target_delimiter", "options_list_prompt", "options_letters",
                     "options_orders", "options_conditions")



def opt_conditions(conf):
    """The conditions recomputed from config.options_* (the same shape run.py writes into config.json)."""
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
    """The context of one prompt kind; placeholders are filled with str.replace (options first, then the sentence),
    so braces in the data are never interpreted."""
    if kind == "official":
        return conf["sst2_prompt"].replace("{sentence}", sentence)
    pi = conf["options_orders"][kind[len("list_"):]]
    t = conf["options_list_prompt"]
    for j, letter in enumerate(conf["options_letters"]):
        t = t.replace("{option_" + letter + "}", conf["sst2_choices"][pi[j]])
    return t.replace("{sentence}", sentence)


def opt_metrics(recs, gold_of, pos_of):
    """Per-condition counts from the recomputed positions (pos_of(r) -> (raw, norm chars, norm tokens))."""
    n = len(recs)
    labels = [r["label"] for r in recs]
    raw = [pos_of(r)[0] for r in recs]
    chars = [pos_of(r)[1] for r in recs]
    toks = [pos_of(r)[2] for r in recs]
    gold = [gold_of(r) for r in recs]
    correct = sum(int(p == g) for p, g in zip(raw, gold))
    c_chars = sum(int(p == g) for p, g in zip(chars, gold))
    c_toks = sum(int(p == g) for p, g in zip(toks, gold))
    return {
        "n": n, "correct": correct, "acc": correct / n, "correct_norm": c_chars, "acc_norm": c_chars / n,
        "correct_norm_tokens": c_toks, "acc_norm_tokens": c_toks / n,
        "predicted_positive": sum(int(r["pi"][p] == 1) for r, p in zip(recs, raw)),
        "chose_first_position": raw.count(0),
        "baseline_all_negative_correct": labels.count(0), "baseline_all_positive_correct": labels.count(1),
        "baseline_all_negative_acc": labels.count(0) / n, "baseline_all_positive_acc": labels.count(1) / n,
        "norm_chars_changes_choice": sum(int(a != b) for a, b in zip(chars, raw)),
        "norm_tokens_changes_choice": sum(int(a != b) for a, b in zip(toks, raw)),
    }


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


def opt_record_problems(r, n_choices):
    where = f"idx {r.get('idx', '?')} {r.get('condition', '?')}" if isinstance(r, dict) else "record"
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = [f"{where} {k}: missing" if k not in r else f"{where} {k}: wrong type or empty ({short(r[k], 60)})"
           for k, ok in OPT_RECORD_FIELDS.items() if k not in r or not ok(r[k])]
    bad += [f"{where} {k}: a field audit.py has no rule for" for k in r if k not in OPT_RECORD_FIELDS]
    if bad:
        return bad
    n = len(r["candidates"])
    if n != n_choices:
        bad.append(f"{where} candidates: {n} candidates, the conditions have {n_choices}")
    for j, c in enumerate(r["candidates"]):
        if not isinstance(c, dict) or set(c) != set(OPT_CAND_FIELDS):
            bad.append(f"{where} candidates[{j}]: fields {sorted(c) if isinstance(c, dict) else c!r}, expected "
                       f"{sorted(OPT_CAND_FIELDS)}")
            continue
        bad += [f"{where} candidates[{j}].{k}: wrong type ({short(c[k], 60)})"
                for k, ok in OPT_CAND_FIELDS.items() if not ok(c[k])]
    for side, fields in OPT_SIDE_FIELDS.items():
        d = r[side]
        bad += [f"{where} {side}.{k}: missing" for k in fields if k not in d]
        bad += [f"{where} {side}.{k}: wrong type ({short(d[k], 60)})"
                for k, ok in fields.items() if k in d and ok is not None and not ok(d[k])]
        bad += [f"{where} {side}.{k}: a field audit.py has no rule for" for k in d if k not in fields]
        if not (isinstance(d.get("scores"), list) and len(d["scores"]) == n and all(is_num(s) for s in d["scores"])):
            bad.append(f"{where} {side}.scores: expected {n} numbers, found {short(d.get('scores'), 60)}")
    g = r["official"].get("is_greedy")
    if not (isinstance(g, list) and len(g) == n and all(isinstance(x, bool) for x in g)):
        bad.append(f"{where} official.is_greedy: expected {n} booleans, found {short(g, 60)}")
    if len(r["abs_diff"]) != n:
        bad.append(f"{where} abs_diff: expected {n} numbers, found {short(r['abs_diff'], 60)}")
    return bad


def audit_options_arithmetic(C, name, ev):
    """Level 1 for the options experiment. Returns (records, conditions) when deeper levels may use them."""
    A = "arithmetic"
    cfg, ident, records, summ, stages = (ev.get(k) for k in ("config", "identity", "records", "summary", "stages"))
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    if ev["environment"] is None:
        missing.insert(0, "../environment.json")
    C.add(name, A, "required files", len(REQUIRED) + 1,
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    if cfg is None or records is None:
        C.skip(name, A, "(all arithmetic checks)", "config.json or records.jsonl missing; nothing to recompute from")
        return None, None

    # -- config: conditions, comparisons, tie rule, selection, official task fields, identity.json --
    bad = []
    conf = cfg.get("config") if isinstance(cfg.get("config"), dict) else {}
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split = cfg.get("split")
    if split not in SPLITS:
        bad.append(f"config.json split: {short(split)} is not one of {SPLITS}")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    expect(bad, "config.json", "selection.split", sel.get("split", MISSING), split)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING),
           split == "confirm", "must be true exactly when split is confirm")
    for sel_key, conf_key in (("salt", "selection_salt"), ("n_dev", "n_dev"), ("n_confirm", "n_confirm"),
                              ("n_smoke", "n_smoke"), ("rule", "selection_rule")):
        expect(bad, "config.json", f"selection.{sel_key}", sel.get(sel_key, MISSING), conf.get(conf_key, MISSING),
               f"config.{conf_key} says otherwise")
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("data", MISSING))
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), conf.get("model", MISSING))
    expect(bad, "config.json", "tie_rule", cfg.get("tie_rule", MISSING), conf.get("options_tie_rule", MISSING))
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot")
    expect(bad, "config.json", "zero_shot", cfg.get("zero_shot", MISSING), True)
    expect(bad, "config.json", "chat_template", cfg.get("chat_template", MISSING), False)
    conds, why = opt_conditions(conf)
    if conds is None:
        bad.append(f"config.json config: {why}")
    else:
        expect(bad, "config.json", "conditions", cfg.get("conditions", MISSING), conds,
               "recomputed from config.options_conditions / options_orders / options_letters / sst2_choices")
        names = [c["name"] for c in conds]
        comps = conf.get("options_comparisons")
        if not (isinstance(comps, list) and all(isinstance(x, list) and len(x) == 2 and set(x) <= set(names)
                                                for x in comps)):
            bad.append(f"config.json config.options_comparisons: {short(comps)} is not a list of condition pairs")
        expect(bad, "config.json", "comparisons", cfg.get("comparisons", MISSING), comps)
        lp = conf.get("options_list_prompt")
        if not (isinstance(lp, str) and lp.count("{sentence}") == 1 and all(
                f"\n{x}. {{option_{x}}}\n" in lp for x in conf.get("options_letters", []))):
            bad.append(f"config.json config.options_list_prompt: {short(lp)} needs '{{sentence}}' once and one line "
                       "'X. {option_X}' per letter")
    prompt_t, choices = conf.get("sst2_prompt"), conf.get("sst2_choices")
    task = cfg.get("official_task_fields") if isinstance(cfg.get("official_task_fields"), dict) else {}
    for k, want in (("doc_to_text", prompt_t.replace("{sentence}", "{{sentence}}") if isinstance(prompt_t, str)
                     else MISSING), ("doc_to_choice", choices), ("doc_to_target", "label"),
                    ("output_type", "multiple_choice")):
        expect(bad, "config.json", f"official_task_fields.{k}", task.get(k, MISSING), want,
               "the installed glue/sst2 task must be the baseline this experiment claims")
    if ident is not None:
        check_scoring_identity(bad, conf, ident)
        spec = {k: conf.get(k, MISSING) for k in OPT_TEMPLATE_KEYS}
        if MISSING not in spec.values():
            expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
                   sha256_text(json.dumps(spec, sort_keys=True)), "sha256 of the prompt/condition spec in config")
        if "official" in cfg:
            expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
                   sha256_text(json.dumps(cfg["official"], sort_keys=True)))
        for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                         ("data_content_sha256", "data_content_sha256")):
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split, "config.json split")
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING), conf.get("threads", MISSING))
    C.add(name, A, "config consistency (conditions, pi, comparisons, tie rule, selection, official task, identity)",
          1, bad, note="CONFIRMATION SPLIT SCORED" if split == "confirm" else "")
    environment_check(C, name, ev)
    if conds is None:
        C.skip(name, A, "(remaining arithmetic checks)", "the conditions cannot be recomputed from config.json")
        return None, None
    cond_by = {c["name"]: c for c in conds}
    names = [c["name"] for c in conds]

    # -- record shape --
    bad = []
    for r in records:
        bad += opt_record_problems(r, len(choices) if isinstance(choices, list) else 2)
    C.add(name, A, "record fields and types", len(records), bad)
    if bad:
        C.skip(name, A, "(remaining arithmetic checks)", "records.jsonl has malformed records")
        return None, None

    # -- selection: records are (idx in rank order) x (conditions in config order), nothing else --
    bad = []
    want, why = None, "selection settings in config.json are unusable"
    if all(is_int(x) for x in (cfg.get("n_rows"), sel.get("n_dev"), sel.get("n_confirm"), sel.get("n_smoke"))) \
            and isinstance(sel.get("salt"), str):
        want, why = select_items(split, sel["salt"], cfg["n_rows"], sel["n_dev"], sel["n_confirm"], sel["n_smoke"])
    if want is None:
        bad.append(f"config.json selection: {why}")
    else:
        expected = [(i, c) for i in want for c in names]
        got = [(r["idx"], r["condition"]) for r in records]
        for k, (g, e) in enumerate(zip(got, expected)):
            if g != e:
                bad.append(f"idx {g[0]} {g[1]} idx/condition: at line {k + 1} the selection rule and condition order "
                           f"give idx {e[0]} {e[1]}")
        if len(got) != len(expected):
            bad.append(f"records.jsonl: {len(got)} records, the selection rule gives {len(want)} items x "
                       f"{len(names)} conditions = {len(expected)}")
        bad += [f"idx {i} {c}: appears {got.count((i, c))} times" for i, c in sorted(set(got), key=str)
                if got.count((i, c)) > 1]
        expect(bad, "config.json", "selection.item_idx", sel.get("item_idx", MISSING), want)
        rank_of = {i: k for k, i in enumerate(want)}
        for r in records:
            expect(bad, f"idx {r['idx']} {r['condition']}", "rank", r["rank"], rank_of.get(r["idx"], MISSING))
    C.add(name, A, "item selection (hash rule, rank order, idx x condition)", len(records), bad)

    # -- conditions: pi, gold position, candidates as the condition defines them; limits --
    bad = []
    limit = conf.get("max_input_tokens")
    for r in records:
        w = f"idx {r['idx']} {r['condition']}"
        c = cond_by.get(r["condition"])
        if c is None:
            bad.append(f"{w} condition: not a condition of config.json")
            continue
        for k in ("space", "order", "pi"):
            expect(bad, w, k, r[k], c[k])
        expect(bad, w, "prompt_kind", r["prompt_kind"], opt_prompt_kind(c))
        if 0 <= r["label"] < len(c["pi"]):
            expect(bad, w, "gold_position", r["gold_position"], c["pi"].index(r["label"]), "pi^-1(label)")
        else:
            bad.append(f"{w} label: {r['label']} is not a label of pi {c['pi']}")
        for j, x in enumerate(r["candidates"]):
            expect(bad, w, f"candidates[{j}].position", x["position"], j)
            expect(bad, w, f"candidates[{j}].choice", x["choice"],
                   c["choices"][j] if j < len(c["choices"]) else MISSING)
            expect(bad, w, f"candidates[{j}].text", x["text"], c["candidates"][j] if j < len(c["candidates"])
                   else MISSING, "delimiter + displayed choice (the request lm-eval builds)")
            expect(bad, w, f"candidates[{j}].n_chars", x["n_chars"], len(x["choice"]))
            expect(bad, w, f"candidates[{j}].semantic_label", x["semantic_label"], c["pi"][j] if j < len(c["pi"])
                   else MISSING, "pi(position)")
            expect(bad, w, f"candidates[{j}].start", x["start"], r["context_tokens"], "must equal context_tokens")
            if is_int(limit) and r["context_tokens"] + len(x["token_ids"]) > limit:
                bad.append(f"{w} candidates[{j}]: input of {r['context_tokens'] + len(x['token_ids'])} tokens is over "
                           f"max_input_tokens {limit}")
    C.add(name, A, "conditions (pi, gold position = pi^-1(label), candidates, limits)", len(records), bad)

    # -- shared identity: one item has one label and sentence; list conditions of one order share one context --
    bad = []
    by_idx = {}
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
    C.add(name, A, "shared item identity (label, sentence, one context per prompt kind)", len(by_idx), bad)

    # -- predictions and correctness, recomputed from the scores (never from the recorded predictions) --
    bad = []
    pos = {}
    for r in records:
        w = f"idx {r['idx']} {r['condition']}"
        c = cond_by[r["condition"]]
        s_ind, s_off = r["independent"]["scores"], r["official"]["scores"]
        p_ind, p_off = argmax_first(s_ind), argmax_first(s_off)
        p_chars = argmax_divided(s_ind, [len(ch) for ch in c["choices"]])
        p_toks = argmax_divided(s_ind, [len(x["token_ids"]) for x in r["candidates"]])
        g = c["pi"].index(r["label"])
        pos[(r["idx"], r["condition"])] = (p_ind, p_chars, p_toks)
        expect(bad, w, "independent.pred_position", r["independent"]["pred_position"], p_ind, "argmax, first wins")
        expect(bad, w, "official.pred_position", r["official"]["pred_position"], p_off, "argmax, first wins")
        expect(bad, w, "pred_position", r["pred_position"], p_ind)
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
    C.add(name, A, "predictions (argmax, pi, acc, acc_norm chars, acc_norm_tokens, lm-eval per-record metrics)",
          len(records), bad)

    bad = []
    for r in records:
        expect(bad, f"idx {r['idx']} {r['condition']}", "abs_diff", r["abs_diff"],
               [abs(a - b) for a, b in zip(r["official"]["scores"], r["independent"]["scores"])])
    C.add(name, A, "agreement per candidate (abs_diff from the score lists)", len(records), bad)

    # -- summary.json: rebuilt from the records and compared value by value --
    recs_of = {n_: [r for r in records if r["condition"] == n_] for n_ in names}
    n = len(recs_of[names[0]])
    labels = [r["label"] for r in recs_of[names[0]]]
    metrics = {n_: opt_metrics(recs_of[n_], lambda r: r["pi"].index(r["label"]),
                               lambda r: pos[(r["idx"], r["condition"])]) for n_ in names}
    flips = {}
    if isinstance(conf.get("options_comparisons"), list):
        for a, b in conf["options_comparisons"]:
            sa = {r["idx"]: (cond_by[a]["pi"][pos[(r["idx"], a)][0]], r["label"]) for r in recs_of[a]}
            sb = {r["idx"]: (cond_by[b]["pi"][pos[(r["idx"], b)][0]], r["label"]) for r in recs_of[b]}
            ids = sorted(sa)
            flipped = [i for i in ids if sa[i][0] != sb[i][0]]
            gains = [i for i in ids if sa[i][0] != sa[i][1] and sb[i][0] == sb[i][1]]
            losses = [i for i in ids if sa[i][0] == sa[i][1] and sb[i][0] != sb[i][1]]
            flips[f"{a} vs {b}"] = {"a": a, "b": b, "flips": len(flipped), "flipped_idx": flipped,
                                    "gains": len(gains), "gain_idx": gains, "losses": len(losses), "loss_idx": losses,
                                    "net": len(gains) - len(losses), "n_discordant": len(gains) + len(losses),
                                    "mcnemar_p": mcnemar_exact(len(gains), len(losses))}
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]
    fields = get(summ, "identity_checks.fields") if summ is not None else MISSING
    expected = {
        "experiment": name, "split": split, "confirmation_items_scored": split == "confirm", "n_items": n,
        "n_conditions": len(names), "n_records": len(records), "n_candidates": len(diffs),
        "label_counts": {str(k): labels.count(k) for k in (0, 1)}, "flips": flips, "conditions": metrics,
        "agreement": {"max_abs_diff": max(diffs) if diffs else MISSING,
                      "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(argmax_first(r["official"]["scores"])
                                                     != argmax_first(r["independent"]["scores"]) for r in records),
                      "n_lm_eval_metric_mismatches": sum(
                          (r["official"]["lm_eval_acc"], r["official"]["lm_eval_acc_norm"])
                          != (float(pos[(r["idx"], r["condition"])][0] == r["pi"].index(r["label"])),
                              float(pos[(r["idx"], r["condition"])][1] == r["pi"].index(r["label"])))
                          for r in records)},
        "identity_checks": {"passed": True, "n_records_joined": len(records), "fields": fields},
    }
    if summ is None:
        C.skip(name, A, "summary.json values", "summary.json missing (named under 'required files')")
    else:
        bad = []
        # the p-values: scipy's binomtest in run.py vs exact integer arithmetic here, equal to OPT_P_TOL relative
        for key, f in flips.items():
            rec_p = get(summ, f"flips.{key}.mcnemar_p")
            if is_num(rec_p) and abs(rec_p - f["mcnemar_p"]) <= OPT_P_TOL * max(1.0, f["mcnemar_p"]):
                f["mcnemar_p"] = rec_p
        expected["table"] = opt_table(flips, metrics, n)
        compare_tree(bad, "summary.json", summ, expected)
        if not isinstance(fields, list):
            bad.append("summary.json identity_checks.fields: not a list")
        else:
            bad += [f"summary.json identity_checks.fields: {f!r} is an identity field audit.py has no check for"
                    for f in fields if f not in OPT_IDENTITY_FIELDS]
        C.add(name, A, "summary.json (metrics, baselines, flips, gains, losses, net, McNemar, table, agreement)",
              len(records), bad, note=f"McNemar p recomputed exactly, tolerance {OPT_P_TOL:g} relative")

    # -- stages.json: token counts recomputed; timings only sanity-checked --
    if stages is None:
        C.skip(name, A, "stages.json token counts", "stages.json missing (named under 'required files')")
    else:
        bad = []
        per = {}
        for n_ in names:
            ctx = [r["context_tokens"] for r in recs_of[n_]]
            inp = [r["context_tokens"] + len(x["token_ids"]) for r in recs_of[n_] for x in r["candidates"]]
            per[n_] = {"context_tokens": {"min": min(ctx), "max": max(ctx), "total": sum(ctx)},
                       "input_tokens_per_candidate": {"min": min(inp), "max": max(inp), "total": sum(inp)}}
        inp = [r["context_tokens"] + len(x["token_ids"]) for r in records for x in r["candidates"]]
        distinct = {(r["idx"], r["prompt_sha256"], tuple(x["token_ids"][:-1]))
                    for r in records for x in r["candidates"]}
        tokens = {"per_condition": per, "n_items": n, "n_records": len(records), "n_candidates": len(inp),
                  "input_tokens_per_candidate": {"min": min(inp), "max": max(inp), "total": sum(inp)},
                  "official_requests": len(inp), "independent_forward_passes": len(distinct)}
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), tokens, "tokens.")
        bad += stage_time_problems(stages)
        C.add(name, A, "stages.json token counts (+ sanity of timings)", len(records), bad,
              note="wall times and RSS are measurements: sanity-checked, not recomputed")
    return records, conds


def audit_options_identity(C, name, out, cfg, ident, records, model_dir, data_parquet):
    """Level 2: private texts (hashes, contexts rebuilt from the templates), tokenisation, data parquet.
    Returns {(idx, condition): (context ids, [candidate ids])} for the forward level, or None."""
    L = "identity"
    if records is None:
        C.skip(name, L, "(whole level)", "the arithmetic level found the evidence unusable")
        return None
    conf = cfg.get("config", {})
    texts_path = out / "private" / name / "texts.jsonl"
    texts = None
    if not texts_path.exists():
        C.skip(name, L, "private texts (sentence/prompt hashes, contexts rebuilt from the templates)",
               f"{texts_path} absent (private evidence not shipped); sentence and prompt hashes NOT checked")
    else:
        bad, texts = [], {}
        for n_line, t in enumerate(read_jsonl(texts_path), start=1):
            if not (isinstance(t, dict) and is_int(t.get("idx")) and isinstance(t.get("sentence"), str)
                    and isinstance(t.get("prompts"), dict) and all(isinstance(v, str) for v in t["prompts"].values())):
                bad.append(f"private/{name}/texts.jsonl line {n_line}: needs idx, sentence, prompts ({short(t, 60)})")
                continue
            if t["idx"] in texts:
                bad.append(f"idx {t['idx']} private texts: duplicated (line {n_line})")
            texts[t["idx"]] = t
        rec_idx = sorted({r["idx"] for r in records})
        bad += [f"idx {i} private texts: no text for this item" for i in rec_idx if i not in texts]
        bad += [f"idx {i} private texts: text for an idx with no record" for i in texts if i not in rec_idx]
        kinds = sorted({r["prompt_kind"] for r in records})
        for i in rec_idx:
            t = texts.get(i)
            if t is None:
                continue
            expect(bad, f"idx {i}", "private prompts", sorted(t["prompts"]), kinds)
            for kind in kinds:
                if kind in t["prompts"]:
                    expect(bad, f"idx {i}", f"prompts.{kind}", t["prompts"][kind],
                           opt_render(conf, kind, t["sentence"]), "the template in config.json filled with the sentence")
        for r in records:
            t = texts.get(r["idx"])
            if t is None:
                continue
            w = f"idx {r['idx']} {r['condition']}"
            expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(t["sentence"]))
            expect(bad, w, "prompt_sha256", r["prompt_sha256"], sha256_text(t["prompts"].get(r["prompt_kind"], "")),
                   f"sha256 of the private {r['prompt_kind']} prompt")
        C.add(name, L, "private texts (sentence/prompt hashes, contexts rebuilt from the templates)", len(records), bad)

    result = None
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    if texts is None:
        C.skip(name, L, "tokenisation (candidate ids, start, context-prefix property)",
               "needs the private texts (absent); candidate token ids and boundaries NOT checked")
    elif tok_path is None or not tok_path.exists():
        C.skip(name, L, "tokenisation (candidate ids, start, context-prefix property)",
               f"tokenizer not found ({tok_path}); pass --cache with the prepared cache")
    else:
        bad, result = [], {}
        tok = load_tokenizer(tok_path)
        expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
               if ident else MISSING, "identity.json tokenizer_sha256")
        for r in records:
            t = texts.get(r["idx"])
            w = f"idx {r['idx']} {r['condition']}"
            if t is None or r["prompt_kind"] not in t["prompts"]:
                bad.append(f"{w} prompt: no private context for this record; cannot re-tokenise it")
                continue
            prompt = t["prompts"][r["prompt_kind"]]
            if prompt != prompt.rstrip():
                bad.append(f"{w} prompt: ends with whitespace; the candidate boundary would be ambiguous")
            ctx_ids = tok.encode(prompt, add_special_tokens=False).ids
            expect(bad, w, "context_tokens", r["context_tokens"], len(ctx_ids), "re-tokenised context")
            cands = []
            for j, x in enumerate(r["candidates"]):
                whole = tok.encode(prompt + x["text"], add_special_tokens=False).ids
                if whole[:len(ctx_ids)] != ctx_ids:
                    bad.append(f"{w} candidates[{j}]: context tokens are not a prefix of context+candidate tokens")
                expect(bad, w, f"candidates[{j}].token_ids", x["token_ids"], whole[len(ctx_ids):])
                expect(bad, w, f"candidates[{j}].start", x["start"], len(ctx_ids))
                cands.append(whole[len(ctx_ids):])
            result[(r["idx"], r["condition"])] = (ctx_ids, cands)
        C.add(name, L, "tokenisation (candidate ids, start, context-prefix property)", len(records), bad,
              note=f"tokenizers.Tokenizer from {tok_path}, add_special_tokens=False")
        if bad:
            result = None

    if data_parquet is None or not data_parquet.exists():
        C.skip(name, L, "data parquet (n_rows, content hash, sentence and label per idx)",
               f"data parquet not found ({data_parquet}); labels NOT checked against the data")
    else:
        import pyarrow.parquet as pq
        bad = []
        cols = pq.read_table(data_parquet).to_pydict()
        rows = {int(i): (int(l), s) for i, l, s in zip(cols["idx"], cols["label"], cols["sentence"])}
        expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows))
        content = "".join(f"{i}\t{rows[i][0]}\t{rows[i][1]}\n" for i in sorted(rows))
        expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING), sha256_text(content))
        for r in records:
            w = f"idx {r['idx']} {r['condition']}"
            if r["idx"] not in rows:
                bad.append(f"{w} idx: not in the data")
                continue
            expect(bad, w, "label", r["label"], rows[r["idx"]][0], "label in the data")
            expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(rows[r["idx"]][1]))
        C.add(name, L, "data parquet (n_rows, content hash, sentence and label per idx)", len(records), bad,
              note=str(data_parquet))
    return result


def audit_options_forward(C, name, ident, records, tokens, model_dir):
    """Level 3: every candidate score recomputed with audit.py's own Llama forward pass (llama_logprobs)."""
    L = "forward"
    st = Path(model_dir) / "model.safetensors" if model_dir else None
    if st is None or not st.exists():
        C.skip(name, L, "candidate scores vs both paths", f"model not found ({st}); pass --cache")
        return None
    bad = []
    expect(bad, str(st), "sha256", sha256_file(st), ident.get("model_sha256", MISSING) if ident else MISSING,
           "identity.json model_sha256")
    C.add(name, L, "model file (sha256 == identity.json model_sha256)", 1, bad)
    model, why = None, "needs the identity level's verified token ids (private texts + tokenizer)"
    if tokens is not None:
        use_threads()
        model, why = load_llama(model_dir)
    if model is None:
        C.skip(name, L, "candidate scores vs both paths", why)
        return None
    import torch
    t0 = time.perf_counter()
    bad_s, bad_p, bad_g, max_d = [], [], [], 0.0
    for r in records:
        w = f"idx {r['idx']} {r['condition']}"
        ctx_ids, cand_lists = tokens[(r["idx"], r["condition"])]
        scores, greedy = [], []
        for cand_ids in cand_lists:
            ids = ctx_ids + cand_ids
            rows = llama_logprobs(model, ids[:-1])[len(ctx_ids) - 1:len(ctx_ids) - 1 + len(cand_ids)]
            scores.append(float(rows.gather(1, torch.tensor(cand_ids).unsqueeze(1)).sum()))
            greedy.append(bool((rows.argmax(dim=-1) == torch.tensor(cand_ids)).all()))
        for side in ("official", "independent"):
            for j, (s_new, s_rec) in enumerate(zip(scores, r[side]["scores"])):
                d = abs(s_new - s_rec)
                max_d = max(max_d, d)
                if not d <= FORWARD_TOL:
                    bad_s.append(f"{w} {side}.scores[{j}]: recorded {s_rec!r}, recomputed {s_new!r} "
                                 f"(|diff| {d:.3g} > tolerance {FORWARD_TOL:g})")
            expect(bad_p, w, f"{side}.pred_position", r[side]["pred_position"], argmax_first(scores))
        expect(bad_g, w, "official.is_greedy", r["official"]["is_greedy"], greedy)
    C.add(name, L, "candidate scores vs both paths", sum(len(r["candidates"]) for r in records), bad_s,
          note=f"max |recomputed - recorded| = {max_d:.3g} (tolerance {FORWARD_TOL:g}, audit.py's own Llama forward)")
    C.add(name, L, "predictions (argmax) vs both paths", len(records), bad_p)
    C.add(name, L, "lm-eval is_greedy", len(records), bad_g)
    return {"max_abs_diff": max_d, "tolerance": FORWARD_TOL, "seconds": round(time.perf_counter() - t0, 2)}


def audit_options(C, name, out, levels, cache):
    ev = load_evidence(out, name)
    records, _conds = audit_options_arithmetic(C, name, ev)
    info = {}
    if "identity" in levels or "forward" in levels:
        model_dir, parquet = resolve_cache(ev["config"], cache) if ev["config"] else (None, None)
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        tokens = audit_options_identity(C, name, out, ev["config"], ev["identity"], records, model_dir, parquet)
        if "forward" in levels:
            info["forward"] = audit_options_forward(C, name, ev["identity"], records, tokens, model_dir)
    for level, flag in (("identity", "--tokens"), ("forward", "--forward")):
        if level not in levels:
            C.skip(name, level, "(whole level)", f"not requested (pass {flag})", requested=False)
    return info
