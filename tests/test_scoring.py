"""Parity mode's forward strategy: one forward pass per distinct input (context + candidate but its last token),
bit-identical to one pass per candidate, and as many passes as lm-eval's HFLM runs on the same requests."""
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
    """The model with its forward calls counted (scoring calls model(inp))."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    @property
    def device(self):             # scoring puts its input tensors on model.device (--device)
        return self.model.device

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)


def compare_with_per_candidate(model, tok, contexts):
    """For every context and candidate set: the memoised scores equal candidate_logprob's exactly; returns
    (forward passes run, distinct inputs, candidates scored)."""
    counting = CountingModel(model)
    passes = distinct = n = 0
    for context in contexts:
        for cands in CANDIDATE_SETS:
            before = counting.calls
            got = scoring.score_candidates(counting, tok, context, cands, LIMIT)
            passes += counting.calls - before
            keys = set()
            for c in got:
                ctx_ids = scoring.encode_pair(tok, context, c["text"])[0]
                want = scoring.candidate_logprob(model, ctx_ids, c["token_ids"])
                assert c["score"] == want, (context, c["text"], c["score"], want)      # exact, not approximate
                keys.add(scoring.input_key(ctx_ids, c["token_ids"]))
            distinct += len(keys)
            n += len(cands)
    return passes, distinct, n


def test_one_pass_per_distinct_input_bit_identical_on_tiny_model(tiny_cache):
    from adapter import load_model, load_tokenizer

    d = tiny_cache / "models" / "tiny-random-llama"
    model, tok = load_model(d, CONFIG), load_tokenizer(d)
    contexts = ["A warm, funny film.\nQuestion: Is this sentence positive or negative?\nAnswer:", "Dull.\nAnswer:"]
    passes, distinct, n = compare_with_per_candidate(model, tok, contexts)
    assert passes == distinct < n
    # the tokeniser really makes the sharing this test means to exercise
    pairs = [scoring.encode_pair(tok, contexts[0], c) for c in CANDIDATE_SETS[3]]
    assert len(pairs[0][1]) == len(pairs[1][1]) == 2 and pairs[0][1][0] == pairs[1][1][0]
    assert all(len(scoring.encode_pair(tok, contexts[0], c)[1]) == 1 for c in CANDIDATE_SETS[0] + CANDIDATE_SETS[1])


def test_a_caller_memo_shares_passes_across_calls(tiny_cache):
    """The options experiment's use: text and letter candidates after one list prompt share one pass."""
    from adapter import load_model, load_tokenizer

    d = tiny_cache / "models" / "tiny-random-llama"
    counting = CountingModel(load_model(d, CONFIG))
    tok = load_tokenizer(d)
    memo, context = {}, "Great.\nA. negative\nB. positive\nAnswer:"
    a = scoring.score_candidates(counting, tok, context, [" negative", " positive"], LIMIT, memo=memo)
    b = scoring.score_candidates(counting, tok, context, [" A", " B"], LIMIT, memo=memo)
    assert counting.calls == len(memo) == 1
    assert [c["score"] for c in a + b] == [scoring.score_candidates(counting.model, tok, context, [c["text"]], LIMIT)
                                           [0]["score"] for c in a + b]


@pytest.mark.slow
def test_one_pass_per_distinct_input_bit_identical_on_real_model(model_dir, prepared_cache):
    from adapter import load_model, load_tokenizer
    from experiments import selection
    from experiments.protocol import build_items

    rows = selection.load_rows(prepared_cache / "data" / "fixture-sentiment" / "validation.parquet")
    idx = selection.select("dev", CONFIG["selection_salt"], len(rows), CONFIG["n_dev"], CONFIG["n_confirm"],
                           CONFIG["n_smoke"])[:3]
    contexts = [it["prompt"] for it in build_items(rows, idx, CONFIG)]
    passes, distinct, n = compare_with_per_candidate(load_model(model_dir, CONFIG), load_tokenizer(model_dir),
                                                     contexts)
    assert passes == distinct < n


@pytest.mark.slow
def test_as_many_passes_as_lm_eval_at_batch_1(tiny_cache):
    """lm-eval's HFLM (batch 1, logits_cache) on the same requests runs exactly as many model calls, and gives
    the same scores (tiny random model: plumbing; the real model's agreement is the protocol's)."""
    from adapter import load_model, load_tokenizer
    from experiments import official

    d = tiny_cache / "models" / "tiny-random-llama"
    lm = official.make_lm(d, dict(CONFIG, official_batch_size=1))
    calls = []
    real_call = lm._model_call
    lm._model_call = lambda *a, **k: calls.append(1) or real_call(*a, **k)
    contexts = ["Fine.\nAnswer:", "Not fine at all.\nAnswer:"]
    pairs = [(c, cand) for c in contexts for cands in CANDIDATE_SETS for cand in cands]
    theirs = [ll for ll, _ in official.loglikelihood(lm, pairs)]
    counting = CountingModel(load_model(d, CONFIG))
    tok = load_tokenizer(d)
    ours = []
    for ctx in contexts:
        memo = {}       # lm-eval groups over its whole request list: one memo per context shares as much here
        ours += [c["score"] for cands in CANDIDATE_SETS
                 for c in scoring.score_candidates(counting, tok, ctx, cands, LIMIT, memo=memo)]
    assert ours == theirs
    assert counting.calls == len(calls) == 3 * len(contexts)   # ctx; ctx + " not"; ctx + " very"


def test_the_official_path_uses_official_batch_size_and_extraction_does_not(tmp_path):
    from experiments import official

    assert CONFIG["batch_size"] == 1 and CONFIG["official_batch_size"] > 1
    assert official.hflm_args(tmp_path, CONFIG)["batch_size"] == CONFIG["official_batch_size"]
    assert official.hflm_args(tmp_path, dict(CONFIG, official_batch_size=3))["batch_size"] == 3
    src = (REPO / "experiments" / "extraction.py").read_text()
    assert '"batch_size": config["batch_size"]' in src and "official_batch_size" not in src


@pytest.mark.slow
def test_lm_eval_at_official_batch_size_equals_parity_with_heavy_padding(model_dir):
    """The measurement behind official_batch_size, at this test's thread count: one HFLM batch holding the 8
    shortest and the 8 longest rows of the 872-row file (shorter rows padded by up to 48 tokens) gives the parity
    path's scores bit for bit."""
    import resources
    from adapter import load_model, load_tokenizer
    from experiments import official

    rows = resources.read_glue_tsv(REPO / "fixtures" / "reviews_872_dev.tsv")
    rows = sorted(rows, key=lambda r: (len(r["sentence"]), r["idx"]))
    picked = rows[:8] + rows[-8:]
    cands = [CONFIG["target_delimiter"] + c for c in CONFIG["sst2_choices"]]
    contexts = [CONFIG["sst2_prompt"].format(sentence=r["sentence"]) for r in picked]
    lm = official.make_lm(model_dir, CONFIG)
    assert lm.batch_size == CONFIG["official_batch_size"] == 16
    theirs = [ll for ll, _ in official.loglikelihood(lm, [(c, cand) for c in contexts for cand in cands])]
    del lm
    model, tok = load_model(model_dir, CONFIG), load_tokenizer(model_dir)
    ours = [c["score"] for ctx in contexts for c in scoring.score_candidates(model, tok, ctx, cands, LIMIT)]
    lens = [len(scoring.encode_pair(tok, c, cands[0])[0]) for c in contexts]
    assert max(lens) - min(lens) >= 40
    assert ours == theirs
