"""Parity mode's batches: the independent path forms, from its own reading of lm-eval's definitions, the batches
lm-eval's HFLM forms for the same loglikelihood requests, so both present the model with the same tensors and
agree bit for bit at every batch size, thread count, kernel path and dtype; at batch size 1 the batched path is
the definition itself (candidate_logprob), one pass per distinct input."""
import random

import pytest

import config
from conftest import REPO
from experiments import scoring

CONFIG = config.effective(("shared", "protocol"))
LIMIT = CONFIG["max_input_tokens"]

# candidate lists as the experiments score them, plus multi-token ones that share (" not good" / " not bad") or do
# not share (" very negative" / " positive") their input
CANDIDATE_SETS = [
    [" negative", " positive"],                                     # protocol text candidates
    [" A", " B"],                                                   # options letter candidates
    [" no", " yes"],                                                # mctaco
    [" not good", " not bad", " very negative", " positive", " good"],
]


class CountingModel:
    """The model with its forward calls and their input shapes recorded (scoring calls model(ids))."""

    def __init__(self, model):
        self.model, self.shapes = model, []

    @property
    def device(self):             # scoring puts its input tensors on model.device (--device)
        return self.model.device

    def __call__(self, ids, *args, **kwargs):
        self.shapes.append(list(ids.shape))
        return self.model(ids, *args, **kwargs)


# ---- the plan: pure -----------------------------------------------------------------------------------------------

def test_rows_are_distinct_inputs_longest_first_then_by_ids():
    requests = [([1, 2, 3], [9]), ([1, 2, 3], [8]),          # one-token candidates after one context: one row
                ([1, 2], [5, 6]), ([4], [7, 7, 7]),            # multi-token: context + candidate[:-1]
                ([1, 2, 3], [9])]                              # the same request twice: the same row
    plan = scoring.lm_eval_batches(requests, 2)
    assert plan.rows == [(1, 2, 3), (1, 2, 5), (4, 7, 7)]    # length 3 each: by ids ascending
    assert plan.row_of == [0, 0, 1, 2, 0]
    assert plan.batches == [(0, 2), (2, 3)] and plan.shapes() == [[2, 3], [1, 3]]
    assert [plan.where(k) for k in range(5)] == [[0, 0, 2, 3], [0, 0, 2, 3], [0, 1, 2, 3], [1, 0, 1, 3], [0, 0, 2, 3]]
    longer = scoring.lm_eval_batches(requests + [([9, 9, 9], [9, 9])], 2)
    assert longer.rows[0] == (9, 9, 9, 9)                           # longer first


def test_the_plan_depends_on_the_set_of_requests_not_their_order():
    rng = random.Random(0)
    requests = [([rng.randrange(50) for _ in range(rng.randrange(1, 9))], [rng.randrange(50) for _ in
                                                                         range(rng.randrange(1, 3))])
                for _ in range(60)]
    plan = scoring.lm_eval_batches(requests, 16)
    shuffled = requests[:]
    rng.shuffle(shuffled)
    other = scoring.lm_eval_batches(shuffled, 16)
    assert other.rows == plan.rows and other.batches == plan.batches
    lengths = [len(r) for r in plan.rows]
    assert lengths == sorted(lengths, reverse=True) and len(set(plan.rows)) == len(plan.rows)
    assert all(hi - lo == 16 for lo, hi in plan.batches[:-1])
    with pytest.raises(scoring.ScoringError):
        scoring.lm_eval_batches(requests, 0)


# ---- against the definition and against lm-eval --------------------------------------------------------------------

def items_of(tok, contexts):
    return [(f"context {n}", ctx, cands) for n, ctx in enumerate(contexts) for cands in CANDIDATE_SETS]


@pytest.mark.slow     # tiny_cache copies the tokenizer of the prepared real model: the unit tier prepares none
def test_batch_1_is_the_definition_one_pass_per_distinct_input(tiny_cache):
    """At batch size 1 every score equals candidate_logprob's (one pass per candidate) exactly, with one forward
    pass per distinct input: candidates sharing context + candidate[:-1] share it, across items too."""
    from adapter import load_model, load_tokenizer

    d = tiny_cache / "models" / "tiny-random-llama"
    model, tok = load_model(d, CONFIG), load_tokenizer(d)
    contexts = ["A warm, funny film.\nQuestion: Is this sentence positive or negative?\nAnswer:", "Dull.\nAnswer:",
                "Dull.\nAnswer:"]                             # an identical context in two items: lm-eval shares it
    counting = CountingModel(model)
    scored, plan, _ = scoring.score_items(counting, tok, items_of(tok, contexts), LIMIT, 1)
    for (_, ctx, _), cands in zip(items_of(tok, contexts), scored):
        for c in cands:
            want = scoring.candidate_logprob(model, scoring.encode_pair(tok, ctx, c["text"])[0], c["token_ids"])
            assert c["score"] == want, (ctx, c["text"], c["score"], want)      # exact, not approximate
    n = sum(len(c) for c in CANDIDATE_SETS) * len(contexts)
    assert len(counting.shapes) == len(plan.rows) == 6 < n            # 2 distinct contexts x (ctx, " not", " very")
    assert all(s[0] == 1 for s in counting.shapes)
    # the tokeniser really makes the sharing this test means to exercise
    pairs = [scoring.encode_pair(tok, contexts[0], c) for c in CANDIDATE_SETS[3]]
    assert len(pairs[0][1]) == len(pairs[1][1]) == 2 and pairs[0][1][0] == pairs[1][1][0]


def lm_eval_and_ours(model_dir, contexts, batch_size, dtype="float32", candidate_sets=CANDIDATE_SETS):
    """lm-eval's HFLM.loglikelihood at batch_size on every (context, candidate), its model calls' input shapes,
    and the independent path's scores and shapes on the same requests."""
    from adapter import load_model, load_tokenizer
    from experiments import official

    settings = dict(CONFIG, official_batch_size=batch_size, dtype=dtype)
    lm = official.make_lm(model_dir, settings)
    theirs_shapes = []
    real_call = lm._model_call
    lm._model_call = lambda inps, *a, **k: theirs_shapes.append(list(inps.shape)) or real_call(inps, *a, **k)
    pairs = [(c, cand) for c in contexts for cands in candidate_sets for cand in cands]
    theirs = [ll for ll, _ in official.loglikelihood(lm, pairs)]
    del lm
    counting = CountingModel(load_model(model_dir, settings))
    tok = load_tokenizer(model_dir)
    items = [(f"context {n}", ctx, cands) for n, ctx in enumerate(contexts) for cands in candidate_sets]
    scored, _, _ = scoring.score_items(counting, tok, items, LIMIT, batch_size)
    return theirs, theirs_shapes, [c["score"] for s in scored for c in s], counting.shapes


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_the_same_batches_as_lm_eval_on_tiny_model(tiny_cache, batch_size):
    """HFLM at batch 1, 3 and 16 on contexts of different lengths (so batches pad) and multi-token candidates: the
    same model calls with the same input shapes, and the same scores bit for bit."""
    contexts = ["Fine.\nAnswer:", "Not fine at all, and far too long.\nAnswer:", "Fine.\nAnswer:",
                "A film.\nQuestion: Is this sentence positive or negative?\nAnswer:", "Meh\nAnswer:"]
    theirs, their_shapes, ours, our_shapes = lm_eval_and_ours(tiny_cache / "models" / "tiny-random-llama",
                                                              contexts, batch_size)
    assert our_shapes == their_shapes and len({s[1] for s in our_shapes}) >= min(3, len(our_shapes))
    assert ours == theirs


def test_the_official_path_uses_official_batch_size_and_extraction_does_not(tmp_path):
    from experiments import official

    assert CONFIG["batch_size"] == 1 and CONFIG["official_batch_size"] > 1
    assert official.hflm_args(tmp_path, CONFIG)["batch_size"] == CONFIG["official_batch_size"]
    assert official.hflm_args(tmp_path, dict(CONFIG, official_batch_size=3))["batch_size"] == 3
    src = (REPO / "experiments" / "extraction.py").read_text()
    assert '"batch_size": config["batch_size"]' in src and "official_batch_size" not in src


def padded_contexts():
    """The 8 shortest and the 8 longest rows of the 872-row file as SST-2 prompts: one batch of 16 pads the short
    ones by up to 48 tokens."""
    import resources

    rows = resources.read_glue_tsv(REPO / "fixtures" / "reviews_872_dev.tsv")
    rows = sorted(rows, key=lambda r: (len(r["sentence"]), r["idx"]))
    return [CONFIG["sst2_prompt"].format(sentence=r["sentence"]) for r in rows[:8] + rows[-8:]]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_lm_eval_at_official_batch_size_equals_parity_with_heavy_padding_in_every_dtype(model_dir, dtype):
    """The real model: one HFLM batch of 16 rows padded by up to 48 tokens gives the parity path's scores bit for
    bit, in float32, bfloat16 and float16 -- the same tensors through the same kernels. (At batch size 1 the
    parity path differs from this batch by up to 0.06 in float16 on the AMD EPYC here: the shapes matter.)"""
    contexts = padded_contexts()
    sets = [CANDIDATE_SETS[0]]
    theirs, their_shapes, ours, our_shapes = lm_eval_and_ours(model_dir, contexts, CONFIG["official_batch_size"],
                                                              dtype, sets)
    assert their_shapes == our_shapes == [[16, our_shapes[0][1]]]
    assert ours == theirs
