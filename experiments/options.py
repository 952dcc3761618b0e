"""Option order and scoring space: A or the text?

Five zero-shot conditions score every selected item (no chat template, no few-shot examples):

    base_text        the official SST-2 prompt,                          candidates " negative" / " positive"
    list_text_fwd    the prompt + "A. negative / B. positive" list,      candidates " negative" / " positive"
    list_text_rev    the prompt + "A. positive / B. negative" list,      candidates " positive" / " negative"
    list_letter_fwd  the list_text_fwd context, unchanged,               candidates " A" / " B"
    list_letter_rev  the list_text_rev context, unchanged,               candidates " A" / " B"

Letters stay in place and the option contents move. For item i the permutation pi_i maps a displayed position j
to a semantic label (0 negative, 1 positive); the gold position is g_i = pi_i^-1(label_i) and the semantic
prediction is pi_i(argmax_j s_ij), first displayed position winning ties. Conditions are compared on semantic
predictions only (flips, gains, losses, exact McNemar); log-probabilities from different scoring spaces (letters vs
texts) are never compared with each other as confidence.

Every candidate is scored twice: by lm-eval's model API (HFLM.loglikelihood, one call over every request of the
run) on the requests lm-eval's own ConfigurableTask.construct_requests builds from the displayed choices, and by the
independent path (experiments/scoring.py) in the batches lm-eval forms for that call. The two are joined on item
identity and candidate token boundaries and must agree bit for bit; lm-eval's process_results (acc, acc_norm) on the official scores must agree with the metrics computed
here. Any disagreement stops the run (IdentityMismatch, exit 1).

Flags it honours (ctx.options): limit only (selection.limited_selection: the first N items of the selection, in
its order).

Read top to bottom: conditions -> items -> official run -> independent run -> join + compare -> metrics ->
paired analysis -> evidence.
"""
import hashlib
import json

import registry
from experiments import official, scoring, stats, two_paths
from experiments.context import Result
from experiments.evidence import IdentityMismatch, jsonl
from experiments.selection import (config_head, confirmation_items_scored, limited_selection, load_rows, select_items,
                                  with_limit)
from resources import ResourceError

NAME = "options"
CONFIG_SECTIONS = registry.config_sections(NAME)   # declared in registry.py
EXACT_AGREEMENT_ONLY = True  # its two paths must agree bit for bit: run.py refuses a device without that claim
DATA_PARALLEL = True   # its scoring goes through parallel.shard_map (torchrun, --shard, --merge)
SUPPORTS_LIMIT = True  # --limit N: the first N items of the selection (selection.limited_selection)
TASK_YAML = "tasks/glue/sst2/default.yaml"


# ---- pure definitions (unit-tested; audit.py re-implements them on its own) ---------------------------------

def gold_position(pi, label):
    """g = pi^-1(label): the displayed position whose content is the gold label."""
    return pi.index(label)


def semantic_prediction(pi, position):
    """pi(position): the semantic label of the chosen displayed position."""
    return pi[position]


def argmax_norm_chars(scores, choices):
    """lm-eval 0.4.9.2 acc_norm's argmax: score / len(choice) in characters, the choice as doc_to_choice returns it.

    lm_eval/api/task.py, ConfigurableTask.process_results (lines 1546-1747): line 1584 `choices =
    self.doc_to_choice(doc)`, line 1585 `completion_len = np.array([float(len(i)) for i in choices])`, line 1602
    `pred_norm = np.argmax(lls / completion_len)`. The target delimiter is added only in construct_requests
    (lines 1445-1544, line 1481 `arguments = [(ctx, f"{target_delimiter}{cont}") for cont in choices]`), so the
    leading space is not counted.
    np.argmax returns the first maximum, like scoring.argmax_first; the division is the same float64 operation."""
    return scoring.argmax_first([float(s) / float(len(c)) for s, c in zip(scores, choices)])


def argmax_norm_tokens(scores, n_tokens):
    """Token-length normalisation (a different metric, acc_norm_tokens): score / number of candidate tokens."""
    return scoring.argmax_first([float(s) / float(n) for s, n in zip(scores, n_tokens)])


def mcnemar_exact(gains, losses):
    """Exact two-sided McNemar test: binomial test of the discordant pairs at 1/2; 1.0 when there are none
    (stats.mcnemar_exact, integer arithmetic)."""
    return stats.mcnemar_exact(gains, losses)


def conditions_from_config(config):
    """Each condition: its prompt kind, scoring space, order, pi, displayed choices and candidate strings.
    A condition config.py cannot mean is bad input (ResourceError, exit 2)."""
    letters = config["options_letters"]
    for j, letter in enumerate(letters):
        if f"\n{letter}. {{option_{letter}}}\n" not in config["options_list_prompt"]:
            raise ResourceError(f"config.py options_list_prompt: lacks the line '{letter}. {{option_{letter}}}'")
    out = []
    for spec in config["options_conditions"]:
        name = spec["name"]
        pi = list(config["options_orders"][spec["order"]])
        if sorted(pi) != list(range(len(config["sst2_choices"]))) or len(pi) != len(letters):
            raise ResourceError(f"config.py options_conditions {name}: order {pi} is not a permutation of the labels")
        if spec["space"] == "text":
            choices = [config["sst2_choices"][pi[j]] for j in range(len(pi))]
        elif spec["space"] == "letter":
            choices = list(letters)
        else:
            raise ResourceError(f"config.py options_conditions {name}: unknown scoring space {spec['space']!r}")
        if spec["prompt"] == "official" and pi != list(range(len(pi))):
            raise ResourceError(f"config.py options_conditions {name}: the official prompt has no list; its order "
                                "must be the identity")
        out.append({"name": name, "prompt": spec["prompt"], "space": spec["space"], "order": spec["order"],
                    "pi": pi, "choices": choices,
                    "candidates": [config["target_delimiter"] + c for c in choices]})
    return out


def context_key(cond):
    return "official" if cond["prompt"] == "official" else f"list_{cond['order']}"


def render_contexts(sentence, config):
    """Every context string of one item: the official prompt and one list prompt per order (written once)."""
    contexts = {"official": config["sst2_prompt"].format(sentence=sentence)}
    for order, pi in config["options_orders"].items():
        fill = {f"option_{letter}": config["sst2_choices"][pi[j]] for j, letter in enumerate(config["options_letters"])}
        contexts[f"list_{order}"] = config["options_list_prompt"].format(sentence=sentence, **fill)
    return contexts


def condition_metrics(recs):
    """Per-condition counts from records of one condition (fields as written to records.jsonl)."""
    n = len(recs)
    labels = [r["label"] for r in recs]
    correct = sum(r["correct"] for r in recs)
    correct_norm = sum(r["correct_norm_chars"] for r in recs)
    correct_tok = sum(r["correct_norm_tokens"] for r in recs)
    return {
        "n": n, "correct": correct, "acc": correct / n,
        "correct_norm": correct_norm, "acc_norm": correct_norm / n,
        "correct_norm_tokens": correct_tok, "acc_norm_tokens": correct_tok / n,
        "predicted_positive": sum(r["semantic_pred"] == 1 for r in recs),
        "chose_first_position": sum(r["pred_position"] == 0 for r in recs),
        "baseline_all_negative_correct": labels.count(0), "baseline_all_positive_correct": labels.count(1),
        "baseline_all_negative_acc": labels.count(0) / n, "baseline_all_positive_acc": labels.count(1) / n,
        "norm_chars_changes_choice": sum(r["pred_position_norm_chars"] != r["pred_position"] for r in recs),
        "norm_tokens_changes_choice": sum(r["pred_position_norm_tokens"] != r["pred_position"] for r in recs),
    }


def paired(recs_a, recs_b):
    """Semantic predictions of two conditions on the same items: flips, gains (a wrong -> b right), losses, net,
    exact McNemar p on the discordant pairs."""
    a = {r["idx"]: r for r in recs_a}
    b = {r["idx"]: r for r in recs_b}
    if sorted(a) != sorted(b):
        raise ValueError("paired conditions do not cover the same items")
    flipped = [i for i in sorted(a) if a[i]["semantic_pred"] != b[i]["semantic_pred"]]
    gains = [i for i in sorted(a) if not a[i]["correct"] and b[i]["correct"]]
    losses = [i for i in sorted(a) if a[i]["correct"] and not b[i]["correct"]]
    return {"flips": len(flipped), "flipped_idx": flipped, "gains": len(gains), "gain_idx": gains,
            "losses": len(losses), "loss_idx": losses, "net": len(gains) - len(losses),
            "n_discordant": len(gains) + len(losses), "mcnemar_p": mcnemar_exact(len(gains), len(losses))}


# ---- items --------------------------------------------------------------------------------------------------

def data_label(ctx):
    return ctx.data.id


def build_items(rows, idx_list, config, conditions):
    items = []
    for rank, idx in enumerate(idx_list):
        row = rows[idx]
        contexts = render_contexts(row["sentence"], config)
        conds = {c["name"]: {"context": contexts[context_key(c)], "gold": gold_position(c["pi"], row["label"])}
                 for c in conditions}
        items.append({"idx": idx, "rank": rank, "label": row["label"], "sentence": row["sentence"],
                      "contexts": contexts, "conds": conds})
    return items


def check_shared_contexts(items, conditions):
    """The list conditions of one order must score exactly the same context string (only candidates differ)."""
    bad = []
    for it in items:
        by_key = {}
        for c in conditions:
            by_key.setdefault(context_key(c), []).append(c["name"])
        for key, names in by_key.items():
            shas = {n: scoring.sha256_text(it["conds"][n]["context"]) for n in names}
            if len(set(shas.values())) != 1:
                bad.append((it["idx"], f"shared context {key}", shas, scoring.sha256_text(it["contexts"][key])))
    if bad:
        raise IdentityMismatch("conditions that must share a context do not", bad)


def check_official_prompt(parquet_path, config):
    """base_text must be the installed task's prompt and choices, or it is not the official baseline."""
    cfg = official.task_config(TASK_YAML, parquet_path)
    expected = {"doc_to_text": config["sst2_prompt"].replace("{sentence}", "{{sentence}}"),
                "doc_to_choice": config["sst2_choices"], "doc_to_target": "label", "output_type": "multiple_choice"}
    bad = [(None, f"task yaml {k}", cfg.get(k), v) for k, v in expected.items() if cfg.get(k) != v]
    if bad:
        raise IdentityMismatch("the installed SST-2 task differs from config.sst2_prompt / sst2_choices", bad)
    return {k: cfg.get(k) for k in expected}


# ---- the two paths ------------------------------------------------------------------------------------------
# The unit both paths score and data parallelism assigns is one context of one item -- (idx, context key) with the
# conditions that share it -- rather than the item: an item's official-prompt context and list contexts differ in
# length and land in different batches, and a unit per context lets every rank take whole batches.

def scoring_units(items, conditions):
    """[{"key": (idx, context key), "item", "conditions"}] in item order, then context order."""
    keys = list(dict.fromkeys(context_key(c) for c in conditions))
    return [{"key": (it["idx"], k), "item": it, "conditions": [c for c in conditions if context_key(c) == k]}
            for it in items for k in keys]


def unit_requests(unit):
    """(key, where, context, candidates) of a unit: every candidate of its conditions, in condition order."""
    it = unit["item"]
    return (unit["key"], f"idx {it['idx']} {unit['key'][1]}", it["contexts"][unit["key"][1]],
            [cand for c in unit["conditions"] for cand in c["candidates"]])


def by_pair(per_unit):
    """{(idx, condition): value} from shard_map's {(idx, context key): {condition: value}}."""
    return {(key[0], name): v for key, conds in per_unit.items() for name, v in conds.items()}


def by_condition(units, scored):
    """{(idx, condition): its scored candidates} from the independent path's {(idx, context key): every candidate
    of the unit's conditions, in condition order} (unit_requests)."""
    out = {}
    for u in units:
        cands = iter(scored[u["key"]])
        out.update({(u["key"][0], c["name"]): [next(cands) for _ in c["candidates"]] for c in u["conditions"]})
    return out


def summed(key):
    """A shard_map combine: the first part's meta with `key` summed over the parts."""
    return lambda metas, _: {**metas[0], key: sum(m[key] for m in metas)}


def official_part(ctx, lm, units):
    """lm-eval builds the requests from the displayed choices (construct_requests), its HFLM scores them in one
    loglikelihood call, and its process_results computes acc and acc_norm from the official scores."""
    keys, pairs = [], []
    for u in units:
        it = u["item"]
        for c in u["conditions"]:
            reqs = official.multiple_choice_requests(c["choices"], it["conds"][c["name"]]["context"])
            for j, pair in enumerate(reqs):
                keys.append((u["key"], c["name"], j))
                pairs.append(pair)
    results = official.loglikelihood(lm, pairs)
    out = {}
    for (key, name, j), pair, res in zip(keys, pairs, results):
        out.setdefault(key, {}).setdefault(name, []).append({"request": pair, "score": res[0], "is_greedy": res[1],
                                                             "boundary": official.encode_pair(lm, *pair)})
    for u in units:
        for c in u["conditions"]:
            cands = out[u["key"]][c["name"]]
            gold = u["item"]["conds"][c["name"]]["gold"]
            metrics = official.multiple_choice_results(c["choices"], gold,
                                                       [(x["score"], x["is_greedy"]) for x in cands])
            for x in cands:
                x["lm_eval"] = metrics
    meta = {
        "lm_eval_version": official.version(),
        "lm_eval_files_sha256": official.file_hashes(extra=[TASK_YAML]),
        "api": "HFLM.loglikelihood on the requests of ConfigurableTask.construct_requests (one minimal in-memory "
               "multiple_choice task per displayed choice list), every request of the run in one call; acc and "
               "acc_norm from its process_results",
        "n_requests": len(pairs),
        **official.lm_facts(lm, ctx.inputs.model_dir, ctx.config),
    }
    return out, meta


def scoring_call(ctx, units):
    """The options experiment's one call: every (item, context) unit, its conditions' requests on both paths (the
    independent side: two_paths.score_independent on unit_requests, split back by condition with by_condition)."""
    return two_paths.Call(units, lambda lm, part: official_part(ctx, lm, part), unit=unit_requests,
                          combine_official=summed("n_requests"))


# ---- join, compare, records ---------------------------------------------------------------------------------

def make_records(items, conditions, off, ind):
    """One record per item x condition; the mismatch table lists every field where the paths disagree."""
    records, bad = [], []
    for it in items:
        for c in conditions:
            key = (it["idx"], c["name"])
            where = f"{it['idx']} {c['name']}"
            o, i = off[key], ind[key]
            context = it["conds"][c["name"]]["context"]
            pi, gold = c["pi"], it["conds"][c["name"]]["gold"]
            expected_pairs = [(context, cand) for cand in c["candidates"]]
            if [tuple(x["request"]) for x in o] != expected_pairs:
                bad.append((where, "official requests", [[scoring.sha256_text(a), b] for a, b in
                                                         (x["request"] for x in o)],
                            [[scoring.sha256_text(a), b] for a, b in expected_pairs]))
            for x, y in zip(o, i):
                ob = [len(x["boundary"][0]), list(x["boundary"][1])]
                if ob != [y["start"], y["token_ids"]]:
                    bad.append((where, f"boundary {y['text']!r}", ob, [y["start"], y["token_ids"]]))
            o_scores = [x["score"] for x in o]
            i_scores = [y["score"] for y in i]
            diffs, o_pos, pos, agree = two_paths.compare_scores(o_scores, i_scores)
            if not agree:
                bad.append((where, "scores", o_scores, i_scores))
            if o_pos != pos:
                bad.append((where, "pred_position", o_pos, pos))
            pos_chars = argmax_norm_chars(i_scores, c["choices"])
            pos_tok = argmax_norm_tokens(i_scores, [len(y["token_ids"]) for y in i])
            correct, correct_chars = int(pos == gold), int(pos_chars == gold)
            lm_eval_metrics = o[0]["lm_eval"]
            if lm_eval_metrics != {"acc": float(correct), "acc_norm": float(correct_chars)}:
                bad.append((where, "lm_eval acc/acc_norm", lm_eval_metrics,
                            {"acc": float(correct), "acc_norm": float(correct_chars)}))
            records.append({
                "idx": it["idx"], "rank": it["rank"], "label": it["label"], "condition": c["name"],
                "space": c["space"], "order": c["order"], "prompt_kind": context_key(c),
                "pi": pi, "gold_position": gold,
                "sentence_sha256": scoring.sha256_text(it["sentence"]),
                "prompt_sha256": scoring.sha256_text(context),
                "context_tokens": i[0]["start"],
                "candidates": [{"position": j, "text": y["text"], "choice": c["choices"][j],
                                "n_chars": len(c["choices"][j]), "semantic_label": pi[j],
                                "token_ids": y["token_ids"], "start": y["start"]} for j, y in enumerate(i)],
                "official": {"scores": o_scores, "is_greedy": [x["is_greedy"] for x in o], "pred_position": o_pos,
                             "lm_eval_acc": lm_eval_metrics["acc"], "lm_eval_acc_norm": lm_eval_metrics["acc_norm"]},
                "independent": {"scores": i_scores, "pred_position": pos},
                "abs_diff": diffs,
                "pred_position": pos, "semantic_pred": semantic_prediction(pi, pos), "correct": correct,
                "pred_position_norm_chars": pos_chars, "correct_norm_chars": correct_chars,
                "pred_position_norm_tokens": pos_tok, "correct_norm_tokens": int(pos_tok == gold),
            })
    return records, bad


# ---- summary ------------------------------------------------------------------------------------------------

def comparison_name(a, b):
    return f"{a} vs {b}"


def summarise(records, conditions, comparisons, split):
    by_cond = {c["name"]: [r for r in records if r["condition"] == c["name"]] for c in conditions}
    n = len(by_cond[conditions[0]["name"]])
    labels = [r["label"] for r in by_cond[conditions[0]["name"]]]
    flips = {}
    for a, b in comparisons:
        flips[comparison_name(a, b)] = {"a": a, "b": b, **paired(by_cond[a], by_cond[b])}
    metrics = {name: condition_metrics(recs) for name, recs in by_cond.items()}
    table = [f"{'comparison (semantic predictions, a vs b)':<38} {'flips':>5} {'gains':>5} {'losses':>6} "
             f"{'net':>4} {'McNemar p':>9}"]
    for name, f in flips.items():
        table.append(f"{name:<38} {f['flips']:>5} {f['gains']:>5} {f['losses']:>6} {f['net']:>+4} "
                     f"{f['mcnemar_p']:>9.4g}")
    table.append(f"{'condition':<16} {'correct':>8} {'acc':>6} {'acc_norm':>8} {'acc_norm_tok':>12} "
                 f"{'pred_pos':>8} {'first_pos':>9} {'all_neg':>7} {'all_pos':>7}")
    for name, m in metrics.items():
        table.append(f"{name:<16} {m['correct']:>5}/{n:<2} {m['acc']:>6.4f} {m['acc_norm']:>8.4f} "
                     f"{m['acc_norm_tokens']:>12.4f} {m['predicted_positive']:>8} {m['chose_first_position']:>9} "
                     f"{m['baseline_all_negative_correct']:>7} {m['baseline_all_positive_correct']:>7}")
    return {
        "experiment": NAME, "split": split, "confirmation_items_scored": confirmation_items_scored(split),
        "n_items": n, "n_conditions": len(conditions), "n_records": len(records),
        "n_candidates": sum(len(r["abs_diff"]) for r in records),
        "label_counts": {str(k): labels.count(k) for k in (0, 1)},
        "flips": flips,
        "conditions": metrics,
        "table": table,
        "agreement": {**two_paths.agreement(records, lambda r: r["official"]["pred_position"],
                                            lambda r: r["pred_position"]),
                      "n_lm_eval_metric_mismatches": sum(
                          (r["official"]["lm_eval_acc"], r["official"]["lm_eval_acc_norm"])
                          != (float(r["correct"]), float(r["correct_norm_chars"])) for r in records)},
        "identity_checks": {"passed": True, "n_records_joined": len(records),
                            "fields": ["idx", "label", "sentence_sha256", "prompt_sha256 (shared per order by the "
                                       "list conditions)", "official requests == (context, candidate)",
                                       "candidate token ids and start (official _encode_pair)",
                                       "lm-eval process_results acc/acc_norm == local"]},
        "uncertainty": uncertainty(by_cond, metrics, comparisons),
    }


# the accuracies of one condition (summary["conditions"][name]) and the correct count each is made of
CONDITION_ACCURACIES = (("acc", "correct"), ("acc_norm", "correct_norm"), ("acc_norm_tokens", "correct_norm_tokens"),
                        ("baseline_all_negative_acc", "baseline_all_negative_correct"),
                        ("baseline_all_positive_acc", "baseline_all_positive_correct"))


def uncertainty(by_cond, metrics, comparisons):
    """summary["uncertainty"]: a Wilson interval for every accuracy of every condition; for every configured
    comparison a vs b, the paired difference of their accuracies (Newcombe) and the exact McNemar p on the items
    one condition gets right and the other wrong (the same p as flips[...]["mcnemar_p"])."""
    accuracies = {f"conditions/{c}/{acc}": (m[k], m["n"]) for c, m in metrics.items()
                  for acc, k in CONDITION_ACCURACIES}
    paired = {}
    for a, b in comparisons:
        right_b = {r["idx"]: bool(r["correct"]) for r in by_cond[b]}
        paired[comparison_name(a, b)] = (f"conditions.{a}.acc", f"conditions.{b}.acc",
                                         [(bool(r["correct"]), right_b[r["idx"]]) for r in by_cond[a]])
    return stats.uncertainty_block(accuracies, paired)


def headline(s):
    f = s["flips"]
    n = s["n_items"]

    def fl(a, b):
        x = f[comparison_name(a, b)]
        return f"{x['flips']} (+{x['gains']}/-{x['losses']}, net {x['net']:+d}, p={x['mcnemar_p']:.3g})"

    acc = ", ".join(f"{name} {m['correct']}" for name, m in s["conditions"].items())
    m0 = next(iter(s["conditions"].values()))
    tl_fwd = f[comparison_name("list_text_fwd", "list_letter_fwd")]["flips"]
    tl_rev = f[comparison_name("list_text_rev", "list_letter_rev")]["flips"]
    return (f"flips of {n}: letters fwd/rev {fl('list_letter_fwd', 'list_letter_rev')}, texts fwd/rev "
            f"{fl('list_text_fwd', 'list_text_rev')}, texts/letters fwd {tl_fwd} rev {tl_rev}; correct/{n}: {acc} "
            f"(all-negative {m0['baseline_all_negative_correct']}, all-positive "
            f"{m0['baseline_all_positive_correct']}); {s['n_candidates']} candidates, max |official - independent| = "
            f"{s['agreement']['max_abs_diff']}")


def token_stats(records, conditions, items, official_meta, independent_meta):
    """stages.json "tokens": per condition and over all records."""
    per = {}
    for c in conditions:
        stats = two_paths.candidate_token_stats([r for r in records if r["condition"] == c["name"]])
        per[c["name"]] = {k: stats[k] for k in ("context_tokens", "input_tokens_per_candidate")}
    every = two_paths.candidate_token_stats(records)
    return {"per_condition": per, "n_items": len(items), "n_records": len(records),
            "n_candidates": every["n_candidates"], "input_tokens_per_candidate": every["input_tokens_per_candidate"],
            "official_requests": official_meta["n_requests"],
            "independent_forward_rows": independent_meta["batching"]["n_rows"]}


def template_sha256(config):
    spec = {k: config[k] for k in ("sst2_prompt", "sst2_choices", "target_delimiter", "options_list_prompt",
                                   "options_letters", "options_orders", "options_conditions")}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode("utf-8")).hexdigest()


def config_of(ctx, rows, idx_list, conditions, comparisons, task_fields, official_meta, independent_meta):
    """config.json: what was run, and what the measures mean."""
    return {
        **config_head(ctx, NAME, len(rows), idx_list),
        "conditions": conditions,
        "comparisons": [list(x) for x in comparisons],
        "pi": "displayed position -> semantic label (0 negative, 1 positive); gold position = pi^-1(label); "
              "semantic prediction = pi(argmax over displayed positions)",
        "tie_rule": ctx.config["options_tie_rule"],
        "primary_measure": "flips: items whose semantic prediction pi(argmax) differs between two conditions (then "
                           "gains, losses, net and the exact two-sided McNemar p on the discordant pairs); "
                           "accuracies are secondary",
        "not_compared": "log-probabilities of different scoring spaces (letters vs texts) are never compared as "
                        "confidence; only choices are",
        "metrics": {
            "acc": "argmax of summed candidate log-probability == gold position",
            "acc_norm": "lm-eval 0.4.9.2: argmax of score / len(choice) in characters, choice without the leading "
                        "target delimiter (lm_eval/api/task.py:1584-1585,1602); checked against lm-eval's own "
                        "process_results on every record",
            "acc_norm_tokens": "argmax of score / number of candidate tokens (not an lm-eval metric)",
        },
        "zero_shot": True, "chat_template": False,
        "official_task_fields": task_fields,
        "official": official_meta, "independent": independent_meta,
    }


def score_and_compare(ctx, items, conditions):
    """Both paths on every item x condition and the exact comparison: (records, official meta, independent meta).
    Raises IdentityMismatch on any difference. bench.py times this too."""
    config = ctx.config
    check_shared_contexts(items, conditions)
    units = scoring_units(items, conditions)
    scored = two_paths.score_twice(ctx, {"": scoring_call(ctx, units)}, template_sha256(config))
    (off, official_meta), (ind, independent_meta) = scored.official[""], scored.independent[""]
    off, ind = by_pair(off), by_condition(units, ind)
    with ctx.stages.stage("compare"):
        records, bad = make_records(items, conditions, off, ind)
        if bad:
            differing = sorted({tuple(b[0].split()) for b in bad if b[1] in ("scores", "pred_position")})
            message = (two_paths.score_disagreement([(int(i), n) for i, n in differing], ind, config,
                                                    "item x condition records") if differing else
                       f"{len({b[0] for b in bad})} item x condition records differ between the official and "
                       "independent paths")
            raise IdentityMismatch(message, bad)
    return records, official_meta, independent_meta


def run(ctx):
    config = ctx.config
    conditions = conditions_from_config(config)
    comparisons = [tuple(x) for x in config["options_comparisons"]]
    rows = load_rows(ctx.data.parquet_path)
    idx_list, limit = limited_selection(ctx, select_items(config, ctx.split, len(rows)))
    items = build_items(rows, idx_list, config, conditions)
    task_fields = check_official_prompt(ctx.data.parquet_path, config)
    records, official_meta, independent_meta = score_and_compare(ctx, items, conditions)
    summary = summarise(records, conditions, comparisons, ctx.split)
    config_out = config_of(ctx, rows, idx_list, conditions, comparisons, task_fields, official_meta,
                           independent_meta)
    line = with_limit(limit, summary, config_out, headline(summary))

    texts = [{"idx": it["idx"], "sentence": it["sentence"], "prompts": it["contexts"]} for it in items]
    return Result(config=config_out,
                  records=records, summary=summary,
                  token_stats=token_stats(records, conditions, items, official_meta, independent_meta),
                  private={"texts.jsonl": jsonl(texts)}, headline=line,
                  prompt_template_sha256=template_sha256(config))
