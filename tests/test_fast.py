"""Fast mode of the independent scorer: agreement with parity mode, padding, shared prefixes, the plan, bench.py.

No timed assertions: speed is measured by bench.py, not tested."""
import random

import pytest
import torch

import config
from experiments import fast_scoring, scoring, selection
from experiments.fast_scoring import TokenRequest, plan
from experiments.protocol import build_items

CONFIG = config.effective(("shared", "protocol", "options"))   # the options prompt is used below too
LIMIT = CONFIG["max_input_tokens"]


@pytest.fixture(scope="module")
def real(model_dir):
    from adapter import load_model, load_tokenizer

    return load_model(model_dir, CONFIG), load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def tiny(tiny_cache):
    from adapter import load_model, load_tokenizer

    d = tiny_cache / "models" / "tiny-random-llama"
    return load_model(d, CONFIG), load_tokenizer(d)


@pytest.fixture(scope="module")
def dev_items(prepared_cache):
    rows = selection.load_rows(prepared_cache / "data" / "fixture-sentiment" / "validation.parquet")
    idx = selection.select("dev", CONFIG["selection_salt"], len(rows), CONFIG["n_dev"], CONFIG["n_confirm"],
                           CONFIG["n_smoke"])
    return build_items(rows, idx, CONFIG)


def parity(model, tok, context, cands):
    """One item scored alone by the parity path (one unpadded sequence per distinct input)."""
    return scoring.score_items(model, tok, [("", context, cands)], LIMIT, 1)[0][0]


def agreement(ref, got):
    """(max abs diff, argmax changes, token ids identical) over {key: [scored dicts]} maps."""
    diffs = [abs(a["score"] - b["score"]) for k in ref for a, b in zip(ref[k], got[k])]
    changes = sum(scoring.argmax_first([c["score"] for c in ref[k]]) != scoring.argmax_first([c["score"] for c in
                                                                                              got[k]]) for k in ref)
    same_ids = all([(c["token_ids"], c["start"]) for c in ref[k]] == [(c["token_ids"], c["start"]) for c in got[k]]
                   for k in ref)
    return max(diffs), changes, same_ids


# ---- the real model ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_fast_agrees_with_parity_on_32_dev_items(real, dev_items):
    model, tok = real
    items = dev_items[:32]
    ref = {it["idx"]: parity(model, tok, it["prompt"], it["candidates"]) for it in items}
    for bs in (8, CONFIG["fast_batch_size"]):
        got, stats = fast_scoring.score_candidates_fast(model, tok, [(it["idx"], it["prompt"], it["candidates"])
                                                                     for it in items], LIMIT, bs,
                                                        CONFIG["fast_max_batch_tokens"], fast_scoring.workers(CONFIG))
        max_diff, changes, same_ids = agreement(ref, got)
        assert changes == 0 and same_ids, bs
        assert max_diff <= CONFIG["fast_tolerance"], (bs, max_diff)
        assert stats["output_rows"] == 32                  # one output-layer row per item: both candidates share it
        assert stats["sequences"] == 32 and stats["trunk_forward_passes"] >= 32 // bs


@pytest.mark.slow
def test_multi_token_candidates_and_shared_prefixes_agree_with_parity(real, dev_items):
    """Multi-token candidates (key/value continuation) and the options experiment's contexts grouped per item
    (base and list prompts share a prefix; text and letter candidate sets share a context) against parity."""
    model, tok = real
    fast_items, refs = [], {}
    for it in dev_items[:6]:
        lists = {o: CONFIG["options_list_prompt"].format(sentence=it["sentence"], option_A=a, option_B=b)
                 for o, (a, b) in {"fwd": ("negative", "positive"), "rev": ("positive", "negative")}.items()}
        contexts = {"base": (it["prompt"], [[" negative", " positive"], [" rather negative", " quite positive!"]]),
                    "fwd": (lists["fwd"], [[" negative", " positive"], [" A", " B"], [" A. negative", " B"]]),
                    "rev": (lists["rev"], [[" positive", " negative"], [" A", " B"]])}
        for name, (context, sets) in contexts.items():
            key = (it["idx"], name)
            fast_items.append({"key": key, "context": context, "candidate_sets": sets, "group": it["idx"]})
            for s, cands in enumerate(sets):
                refs[(key, s)] = parity(model, tok, context, cands)
    for bs in (1, 4, 16):
        res, stats = fast_scoring.score_candidate_sets(model, tok, fast_items, LIMIT, bs, 4096)
        got = {(it["key"], s): res[it["key"]][s] for it in fast_items for s in range(len(it["candidate_sets"]))}
        max_diff, changes, same_ids = agreement(refs, got)
        assert changes == 0 and same_ids and max_diff <= CONFIG["fast_tolerance"], (bs, max_diff, changes)
        assert stats["trunks"] == 6                         # one shared trunk per item
        assert stats["branch_forward_passes"] > 0


@pytest.mark.slow
def test_padding_lengths_differ_within_one_batch(real, dev_items):
    """Contexts of very different lengths in ONE right-padded forward pass score as they do alone."""
    model, tok = real
    contexts = ["Good.\nAnswer:", dev_items[0]["prompt"],
                dev_items[1]["prompt"].replace("\nQuestion", " " + " ".join(it["sentence"] for it in dev_items[2:8])
                                               + "\nQuestion")]
    lens = [len(tok(c)["input_ids"]) for c in contexts]
    assert lens[0] < 10 and lens[2] > 4 * lens[1], lens
    cands = [" negative", " positive", " not at all positive"]
    req = [(i, c, cands) for i, c in enumerate(contexts)]
    together, st = fast_scoring.score_candidates_fast(model, tok, req, LIMIT, batch_size=8, max_batch_tokens=10 ** 6)
    assert st["trunk_forward_passes"] == 1 and st["padded_tokens"] > st["real_tokens"]
    alone, st1 = fast_scoring.score_candidates_fast(model, tok, req, LIMIT, batch_size=1)
    assert st1["trunk_forward_passes"] == 3 and st1["padded_tokens"] == st1["real_tokens"]
    ref = {i: parity(model, tok, c, cands) for i, c in enumerate(contexts)}
    for got in (together, alone):
        max_diff, changes, same_ids = agreement(ref, got)
        assert changes == 0 and same_ids and max_diff <= CONFIG["fast_tolerance"], max_diff

    # control: the comparison can see a padding error. Left padding without an attention mask lets the short
    # context attend to the pad tokens; its score moves far beyond the tolerance. (Left padding WITH the mask but
    # without position_ids is harmless for Llama: rotary embeddings make attention depend on relative positions
    # only. Positions matter in fast mode where a branch continues a right-padded trunk's keys and values: the
    # shared-prefix tests above put trunks of different lengths in one batch.)
    ids = [tok(c)["input_ids"] for c in contexts[:2]]
    lmax = max(map(len, ids))
    x = torch.tensor([[2] * (lmax - len(s)) + s for s in ids])
    with torch.inference_mode():
        h = model.model(input_ids=x).last_hidden_state[:, -1]
        lp = torch.log_softmax(model.lm_head(h), dim=-1)
    wrong = float(lp[0, 3524])                                   # " negative" after the short context
    assert abs(wrong - ref[0][0]["score"]) > 100 * CONFIG["fast_tolerance"]


# ---- the tiny model: many shapes, cheaply -------------------------------------------------------------------

@pytest.mark.slow
def test_random_mixtures_agree_with_parity_on_tiny_model(tiny):
    model, tok = tiny
    rng = random.Random(0)
    words = "the film was good bad slow fast a very not quite dull bright long short story acting plot".split()
    items, refs = [], {}
    for i in range(24):
        ctx = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) + ":"
        sets = [[" " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
                for _ in range(rng.randint(1, 2))]
        group = rng.choice([None, i % 3])
        if group is not None:
            ctx = f"shared prefix {group} " + ctx
        items.append({"key": i, "context": ctx, "candidate_sets": sets, "group": group})
        for s, cands in enumerate(sets):
            refs[(i, s)] = parity(model, tok, ctx, cands)
    for bs, mbt in ((1, 4096), (3, 64), (8, 4096), (64, 10 ** 6)):
        res, _ = fast_scoring.score_candidate_sets(model, tok, items, LIMIT, bs, mbt)
        got = {(it["key"], s): res[it["key"]][s] for it in items for s in range(len(it["candidate_sets"]))}
        max_diff, changes, same_ids = agreement(refs, got)
        assert same_ids and max_diff <= 1e-5, (bs, mbt, max_diff)
        # data parallel: the same batches on 3 worker threads (one intra-op thread each) give the same floats, bit
        # for bit, as one worker with one intra-op thread. With more intra-op threads the kernels split the
        # matrices differently, so only the tolerance above holds against `res`.
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            res1, _ = fast_scoring.score_candidate_sets(model, tok, items, LIMIT, bs, mbt, workers=1)
        finally:
            torch.set_num_threads(before)
        res3, st3 = fast_scoring.score_candidate_sets(model, tok, items, LIMIT, bs, mbt, workers=3)
        assert res3 == res1 and st3["workers"] == 3


# ---- the plan (pure Python) ---------------------------------------------------------------------------------

def test_plan_one_forward_per_shared_context_and_length_batches():
    reqs = [TokenRequest([1, 2, 3], [[7], [8]]), TokenRequest([1, 2, 3], [[9]]),       # same context: one trunk
            TokenRequest([4] * 10, [[7], [8, 9, 10]]), TokenRequest([5] * 2, [[7]])]
    p = plan(reqs, batch_size=2, max_batch_tokens=100)
    assert [t.ids for t in p.trunks] == [(1, 2, 3), (4,) * 10, (5, 5)]
    assert [(tok, tgt) for tok, tgt in p.trunks[0].row_picks] == [(7, 0), (8, 1), (9, 2)]
    # the 3-token candidate continues from its context: a branch of its two first tokens, read at positions 0, 1
    assert len(p.branches) == 1 and p.branches[0].ids == (8, 9) and \
        [(pos, tok) for pos, tok, _ in p.branches[0].picks] == [(0, 9), (1, 10)]
    assert p.batches == [[2, 0], [1]]                     # sorted by length, at most 2 per batch
    assert plan(reqs, batch_size=8, max_batch_tokens=12).batches == [[2, 0], [1]]   # 3 * 10 > 12 tokens


def test_plan_groups_share_their_longest_common_prefix():
    reqs = [TokenRequest([1, 2, 3, 4], [[9]], group="a"), TokenRequest([1, 2, 5], [[9], [8]], group="a"),
            TokenRequest([1, 2, 3, 4], [[9]], group=None), TokenRequest([6, 7], [[9]], group="b")]
    p = plan(reqs, 16, 4096)
    assert [t.ids for t in p.trunks] == [(1, 2), (1, 2, 3, 4), (6, 7)]
    assert sorted(b.ids for b in p.branches) == [(3, 4), (5,)]
    # groups without a common first token fall back to one trunk per context
    p = plan([TokenRequest([1, 2], [[9]], group="g"), TokenRequest([3, 4], [[9]], group="g")], 16, 4096)
    assert [t.ids for t in p.trunks] == [(1, 2), (3, 4)] and not p.branches


def test_plan_refuses_empty_context_or_candidate():
    with pytest.raises(scoring.ScoringError):
        plan([TokenRequest([], [[1]])], 1, 10)
    with pytest.raises(scoring.ScoringError):
        plan([TokenRequest([1], [[]])], 1, 10)
