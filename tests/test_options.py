"""The options experiment: permutation map, scoring spaces, length normalisations, paired flips,
and the real model through both paths on every row of conftest's 24-row SMALL_DATA split and on the session's smoke
run."""
import json

import pytest

import config
import shutil

from conftest import SMALL_N, run_cli
from experiments import options, scoring, selection
from experiments.evidence import IdentityMismatch

CONFIG = config.effective(options.CONFIG_SECTIONS)

CONDITIONS = ["base_text", "list_text_fwd", "list_text_rev", "list_letter_fwd", "list_letter_rev"]


@pytest.fixture(scope="module")
def conds():
    return {c["name"]: c for c in options.conditions_from_config(CONFIG)}


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from adapter import load_tokenizer
    return load_tokenizer(model_dir)


@pytest.fixture(scope="session")
def options_all_run(small_split_all_run):
    """Every row of SMALL_DATA through the options experiment on the real model: conftest's session run of it
    (with the protocol before it and extraction after it, in one process)."""
    return small_split_all_run


def read(out, name):
    path = out / "options" / name
    if name.endswith(".jsonl"):
        return [json.loads(l) for l in path.read_text().splitlines()]
    return json.loads(path.read_text())


# ---- pure functions -------------------------------------------------------------------------------------------

def test_pi_and_gold_position_for_both_orders(conds):
    assert [c for c in conds] == CONDITIONS
    assert conds["base_text"]["pi"] == conds["list_text_fwd"]["pi"] == conds["list_letter_fwd"]["pi"] == [0, 1]
    assert conds["list_text_rev"]["pi"] == conds["list_letter_rev"]["pi"] == [1, 0]
    # gold position g = pi^-1(label)
    assert [options.gold_position([0, 1], y) for y in (0, 1)] == [0, 1]
    assert [options.gold_position([1, 0], y) for y in (0, 1)] == [1, 0]
    # a reversed list with the model choosing "A" (position 0) means positive; the forward list, negative
    rev, fwd = conds["list_letter_rev"], conds["list_letter_fwd"]
    assert rev["candidates"][0] == fwd["candidates"][0] == " A"
    assert options.semantic_prediction(rev["pi"], 0) == 1
    assert options.semantic_prediction(fwd["pi"], 0) == 0
    assert options.semantic_prediction(rev["pi"], 1) == 0
    # texts: the candidates are the option texts in displayed order; their meaning is pi(position)
    assert conds["list_text_fwd"]["candidates"] == conds["base_text"]["candidates"] == [" negative", " positive"]
    assert conds["list_text_rev"]["candidates"] == [" positive", " negative"]
    assert conds["list_letter_rev"]["candidates"] == [" A", " B"]
    for name in ("base_text", "list_text_fwd", "list_text_rev"):
        c = conds[name]
        assert [CONFIG["sst2_choices"][p] for p in c["pi"]] == c["choices"]


def test_list_prompts_and_shared_contexts(conds):
    contexts = options.render_contexts("Fine film.", CONFIG)
    q = "Fine film.\nQuestion: Is this sentence positive or negative?\n"
    assert contexts == {"official": q + "Answer:", "list_fwd": q + "A. negative\nB. positive\nAnswer:",
                        "list_rev": q + "A. positive\nB. negative\nAnswer:"}
    assert contexts["official"] == CONFIG["sst2_prompt"].format(sentence="Fine film.")
    rows = [{"idx": 0, "label": 1, "sentence": "Fine film."}, {"idx": 1, "label": 0, "sentence": "Dull."}]
    items = options.build_items(rows, [1, 0], CONFIG, list(conds.values()))
    options.check_shared_contexts(items, list(conds.values()))
    for it in items:
        c = it["conds"]
        assert c["list_text_fwd"]["context"] == c["list_letter_fwd"]["context"] == it["contexts"]["list_fwd"]
        assert c["list_text_rev"]["context"] == c["list_letter_rev"]["context"] == it["contexts"]["list_rev"]
    assert items[1]["conds"]["list_letter_rev"]["gold"] == 0 and items[0]["conds"]["list_letter_rev"]["gold"] == 1
    items[0]["conds"]["list_letter_fwd"]["context"] += "!"
    with pytest.raises(IdentityMismatch, match="share a context"):
        options.check_shared_contexts(items, list(conds.values()))


def test_a_condition_config_cannot_mean_is_bad_input():
    """A config.py error is refused with one line naming the setting (run.py: exit 2), not a traceback."""
    import copy

    from resources import ResourceError

    for edit, phrase in ((lambda c: c["options_conditions"][1].update(space="colour"), "unknown scoring space"),
                         (lambda c: c["options_orders"].update(rev=[1, 1]), "not a permutation"),
                         (lambda c: c["options_conditions"][0].update(order="rev"), "must be the identity"),
                         (lambda c: c.update(options_list_prompt="{sentence}\nAnswer:"), "lacks the line")):
        cfg = copy.deepcopy(CONFIG)
        edit(cfg)
        with pytest.raises(ResourceError, match=phrase):
            options.conditions_from_config(cfg)


def rec(idx, label, pi, pos, **extra):
    return {"idx": idx, "label": label, "pi": pi, "pred_position": pos, "semantic_pred": pi[pos],
            "correct": int(pos == pi.index(label)), "correct_norm_chars": int(pos == pi.index(label)),
            "correct_norm_tokens": int(pos == pi.index(label)), "pred_position_norm_chars": pos,
            "pred_position_norm_tokens": pos, **extra}


def test_letter_bias_flips_every_item_but_moves_accuracy_little():
    """Always answering "A": forward means always negative, reversed always positive. Every item flips."""
    labels = [0, 1, 1, 0, 1, 1]
    fwd = [rec(i, y, [0, 1], 0) for i, y in enumerate(labels)]
    rev = [rec(i, y, [1, 0], 0) for i, y in enumerate(labels)]
    p = options.paired(fwd, rev)
    assert p["flips"] == 6 and p["flipped_idx"] == list(range(6))
    assert (p["gains"], p["losses"], p["net"]) == (4, 2, 2)
    assert p["gain_idx"] == [1, 2, 4, 5] and p["loss_idx"] == [0, 3]
    assert p["mcnemar_p"] == pytest.approx(0.6875)               # 2 * P(X <= 2), X ~ Bin(6, 1/2) = 2 * 22/64
    same = options.paired(fwd, fwd)
    assert (same["flips"], same["gains"], same["losses"], same["mcnemar_p"]) == (0, 0, 0, 1.0)
    m = options.condition_metrics(rev)
    assert (m["correct"], m["predicted_positive"], m["chose_first_position"]) == (4, 6, 6)
    assert (m["baseline_all_negative_correct"], m["baseline_all_positive_correct"]) == (2, 4)
    assert options.condition_metrics(fwd)["predicted_positive"] == 0
    with pytest.raises(ValueError, match="same items"):
        options.paired(fwd, rev[:-1])


def test_mcnemar_exact():
    assert options.mcnemar_exact(0, 0) == 1.0
    assert options.mcnemar_exact(5, 0) == pytest.approx(2 * 0.5 ** 5)
    assert options.mcnemar_exact(32, 31) == 1.0
    assert options.mcnemar_exact(1, 0) == 1.0


def test_mcnemar_scipy_equals_exact_integer_binomial():
    """audit.py recomputes the p-value with integers; scipy's binomtest must agree for every table up to 64 pairs."""
    from fractions import Fraction
    from math import comb

    for n in range(1, 65):
        for g in range(n + 1):
            exact = min(Fraction(1), 2 * Fraction(sum(comb(n, i) for i in range(min(g, n - g) + 1)), 2 ** n))
            assert abs(options.mcnemar_exact(g, n - g) - float(exact)) <= 1e-12 * max(1.0, float(exact)), (g, n)


@pytest.mark.slow
def test_single_token_candidates_with_the_real_tokenizer(tokenizer):
    ctx = options.render_contexts("Fine film.", CONFIG)["list_rev"]
    got = {c: scoring.encode_pair(tokenizer, ctx, c)[1] for c in (" A", " B", " negative", " positive")}
    assert got == {" A": [330], " B": [389], " negative": [3524], " positive": [2731]}


@pytest.mark.slow
def test_acc_norm_characters_and_tokens_can_disagree(tokenizer):
    """Multi-token candidates of different lengths: lm-eval's acc_norm (characters, no delimiter) and the token
    normalisation pick different options. lm-eval's own process_results is the reference for acc_norm."""
    from experiments import official

    choices = ["so-so", "unforgettable"]
    ctx = "Fine film.\nQuestion: Is this sentence positive or negative?\nAnswer:"
    n_tokens = [len(scoring.encode_pair(tokenizer, ctx, " " + c)[1]) for c in choices]
    assert n_tokens == [3, 1]                                    # 5 chars / 3 tokens vs 13 chars / 1 token
    scores = [-3.0, -6.0]
    assert scoring.argmax_first(scores) == 0                     # raw: -3 > -6
    assert options.argmax_norm_chars(scores, choices) == 1       # -3/5 = -0.6 < -6/13 = -0.46
    assert options.argmax_norm_tokens(scores, n_tokens) == 0     # -3/3 = -1 > -6/1
    assert official.multiple_choice_results(choices, 1, [(s, False) for s in scores]) == {"acc": 0.0,
                                                                                         "acc_norm": 1.0}
    # the leading target delimiter is not counted: with it the choice would flip (-1/2 > -1.9/3)
    assert options.argmax_norm_chars([-1.0, -1.9], ["a", "bb"]) == 1
    assert official.multiple_choice_results(["a", "bb"], 1, [(-1.0, False), (-1.9, False)])["acc_norm"] == 1.0
    # ties: the first displayed position wins, in lm-eval (np.argmax) and here
    assert official.multiple_choice_results(["A", "B"], 0, [(-2.0, False), (-2.0, False)]) == {"acc": 1.0,
                                                                                               "acc_norm": 1.0}
    assert options.argmax_norm_chars([-2.0, -2.0], ["A", "B"]) == 0
    # lm-eval's own requests: delimiter + choice, in displayed order
    assert official.multiple_choice_requests(["positive", "negative"], ctx) == [(ctx, " positive"),
                                                                                (ctx, " negative")]


def test_a_single_differing_score_stops_the_run(conds):
    """make_records lists every disagreement; one ulp on one candidate is enough."""
    cl = list(conds.values())
    items = options.build_items([{"idx": 0, "label": 1, "sentence": "Fine film."}], [0], CONFIG, cl)
    off, ind = {}, {}
    for c in cl:
        ctx = items[0]["conds"][c["name"]]["context"]
        off[(0, c["name"])] = [{"request": (ctx, cand), "score": -1.0 - j, "is_greedy": False,
                                "boundary": ([0] * 20, [100 + j]),
                                "lm_eval": {"acc": 0.0 if c["pi"] == [0, 1] else 1.0,
                                            "acc_norm": 0.0 if c["pi"] == [0, 1] else 1.0}}
                               for j, cand in enumerate(c["candidates"])]
        ind[(0, c["name"])] = [{"text": cand, "token_ids": [100 + j], "start": 20, "score": -1.0 - j}
                               for j, cand in enumerate(c["candidates"])]
    records, bad = options.make_records(items, cl, off, ind)
    assert bad == [] and len(records) == 5
    ind[(0, "list_letter_rev")][1]["score"] = -2.0000000000000004
    _, bad = options.make_records(items, cl, off, ind)
    assert [(b[0], b[1]) for b in bad] == [("0 list_letter_rev", "scores")]
    ind[(0, "list_text_rev")][0]["start"] = 19
    _, bad = options.make_records(items, cl, off, ind)
    assert ("0 list_text_rev", "boundary ' positive'") in [(b[0], b[1]) for b in bad]


# ---- the real model -----------------------------------------------------------------------------------------

def check_evidence(out, n_items):
    summary, records, config = read(out, "summary.json"), read(out, "records.jsonl"), read(out, "config.json")
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    assert summary["n_items"] == n_items and summary["n_conditions"] == 5
    assert len(records) == summary["n_records"] == 5 * n_items
    assert summary["n_candidates"] == 10 * n_items == sum(len(r["candidates"]) for r in records)
    assert summary["agreement"] == {"max_abs_diff": 0.0, "n_candidate_score_mismatches": 0,
                                    "n_prediction_mismatches": 0, "n_lm_eval_metric_mismatches": 0}
    assert config["tie_rule"] == CONFIG["options_tie_rule"]
    by = {}
    for r in records:
        by.setdefault(r["idx"], {})[r["condition"]] = r
    assert list(by) == (list(range(n_items)) if summary["split"] == "all" else ranked[:n_items])
    texts = {t["idx"]: t for t in map(json.loads, (out / "private" / "options" / "texts.jsonl").read_text()
                                      .splitlines())}
    expected_ids = {"text": {" negative": [3524], " positive": [2731]}, "letter": {" A": [330], " B": [389]}}
    for idx, rs in by.items():
        assert list(rs) == CONDITIONS
        assert rs["list_text_fwd"]["prompt_sha256"] == rs["list_letter_fwd"]["prompt_sha256"]
        assert rs["list_text_rev"]["prompt_sha256"] == rs["list_letter_rev"]["prompt_sha256"]
        assert len({r["prompt_sha256"] for r in rs.values()}) == 3
        assert rs["base_text"]["prompt_sha256"] == scoring.sha256_text(
            CONFIG["sst2_prompt"].format(sentence=texts[idx]["sentence"]))
        for r in rs.values():
            assert r["prompt_sha256"] == scoring.sha256_text(texts[idx]["prompts"][r["prompt_kind"]])
            assert r["official"]["scores"] == r["independent"]["scores"] and r["abs_diff"] == [0.0, 0.0]
            assert r["gold_position"] == r["pi"].index(r["label"])
            assert r["semantic_pred"] == r["pi"][r["pred_position"]]
            assert r["correct"] == int(r["semantic_pred"] == r["label"])
            assert r["official"]["lm_eval_acc"] == r["correct"]
            assert r["official"]["lm_eval_acc_norm"] == r["correct_norm_chars"]
            assert all(c["token_ids"] == expected_ids[r["space"]][c["text"]] and c["start"] == r["context_tokens"]
                       for c in r["candidates"])
            assert "sentence" not in json.dumps(r).replace("sentence_sha256", "")    # no dataset text
    # one-token candidates of equal character length: both normalisations keep every choice (algebra, not luck)
    for m in summary["conditions"].values():
        assert m["norm_chars_changes_choice"] == m["norm_tokens_changes_choice"] == 0
        assert m["correct"] == m["correct_norm"] == m["correct_norm_tokens"]
    # the summary is what its records say
    recs_of = {c: [by[i][c] for i in by] for c in CONDITIONS}
    for name in CONDITIONS:
        assert summary["conditions"][name] == options.condition_metrics(recs_of[name])
    for a, b in CONFIG["options_comparisons"]:
        assert summary["flips"][f"{a} vs {b}"] == {"a": a, "b": b, **options.paired(recs_of[a], recs_of[b])}
    assert summary["table"][1].startswith("list_letter_fwd vs list_letter_rev")   # flips first
    return summary, records


@pytest.mark.slow
def test_smoke_run_options(smoke_run, prepared_cache, tmp_path):
    """The session's smoke run (conftest; every experiment), copied: this test edits a record."""
    src, proc = smoke_run
    shutil.copytree(src, tmp_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("audit*.json"))
    summary, _ = check_evidence(tmp_path, 2)
    assert summary["split"] == "smoke"
    assert "[options] flips of 2:" in proc.stdout
    ok = run_cli("audit.py", tmp_path, "--forward", "--strict", "--cache", prepared_cache, "--experiment", "options")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    forward = next(l for l in ok.stdout.splitlines() if l.startswith("options ") and "candidate scores" in l)
    assert " PASS" in forward and "|recomputed - official| max " in forward, forward
    # a semantic prediction that does not follow pi(argmax) is caught
    path = tmp_path / "options" / "records.jsonl"
    recs = [json.loads(l) for l in path.read_text().splitlines()]
    recs[4]["semantic_pred"] = 1 - recs[4]["semantic_pred"]
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
    bad = run_cli("audit.py", tmp_path)
    assert bad.returncode == 1 and "semantic_pred" in bad.stdout, bad.stdout


@pytest.mark.slow
def test_every_row_of_a_small_split_five_conditions_bit_exact(options_all_run):
    out, proc = options_all_run
    summary, records = check_evidence(out, SMALL_N)
    assert summary["split"] == "all" and summary["confirmation_items_scored"] is True
    line = next(l for l in proc.stdout.splitlines() if l.startswith("[options] flips of "))
    assert line.endswith(f"{10 * SMALL_N} candidates, max |official - independent| = 0.0"), line
    stages = read(out, "stages.json")      # the run's imports are timed in its first experiment's (the protocol's)
    assert [s["name"] for s in stages["stages"]] == ["official_model_load", "official", "independent_model_load",
                                                      "independent", "compare", "write"]
    assert json.loads((out / "protocol" / "stages.json").read_text())["stages"][0]["name"] == "imports"
    assert stages["tokens"]["n_candidates"] == 10 * SMALL_N == stages["tokens"]["official_requests"]
    assert stages["tokens"]["independent_forward_rows"] == 3 * SMALL_N     # one per distinct input sequence
    per = stages["tokens"]["per_condition"]
    assert per["list_text_fwd"] == per["list_letter_fwd"]       # same contexts, one-token candidates
    cfg = read(out, "config.json")
    assert cfg["official_task_fields"]["doc_to_text"] == CONFIG["sst2_prompt"].replace("{sentence}", "{{sentence}}")
    assert [c["name"] for c in cfg["conditions"]] == CONDITIONS
    assert set(cfg["config"]) == set(CONFIG) and "harness_batch_size" not in cfg["config"]   # its sections only


@pytest.mark.slow
def test_audit_recomputes_options(small_split_all_audit):
    """conftest's session audit of the run (--strict --tokens --forward): every options row passes, the forward
    level's recomputed candidate scores among them."""
    proc, _ = small_split_all_audit
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [l for l in proc.stdout.splitlines() if l.startswith("options ")]
    assert len(rows) >= 13 and all(" PASS" in l for l in rows), proc.stdout
    assert any(l.split()[1] == "forward" and "candidate scores" in l for l in rows), rows


@pytest.mark.slow
def test_confirm_split_plumbing_on_tiny_model(tiny_cache, tmp_path):
    """A tiny random model: --split confirm scores exactly the 128 held-back items, says so, and stays bit-exact."""
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", tmp_path, "--model", "tiny-random-llama",
                   "--split", "confirm", "--experiment", "options")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CONFIRMATION SPLIT" in proc.stdout
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    records = read(tmp_path, "records.jsonl")
    assert sorted({r["idx"] for r in records}) == sorted(ranked[64:192]) and len(records) == 5 * 128
    for name in ("summary.json", "config.json"):
        doc = read(tmp_path, name)
        assert doc["split"] == "confirm" and doc["confirmation_items_scored"] is True
    assert read(tmp_path, "summary.json")["agreement"]["max_abs_diff"] == 0.0
