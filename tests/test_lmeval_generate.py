"""The forward level of generate_until tasks (evidence_audit/lmeval/generate.py), fast parts: the decoding loop
against transformers' own generate on a tiny random Llama (left-padded batch, the same tokens), lm-eval's batch
order, which generation settings are re-generated, where a re-generated text parts from the logged one. The real
model and real lm-eval runs: tests/test_lmeval_audit.py (honest run, forged generations)."""
import pytest

from evidence_audit.lmeval import generate


@pytest.fixture(scope="module")
def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).train(False)


@pytest.mark.parametrize("eos", [set(), {7, 11}])
def test_the_decoding_loop_gives_the_tokens_transformers_generate_gives(tiny_llama, eos):
    import torch

    rows = [[1, 5, 9, 12, 3, 44, 8], [1, 30, 2], [1, 17, 17, 17, 40]]
    pad = 0
    got, margins = generate.greedy_batch(tiny_llama, rows, pad, eos, {}, 12, lambda ids: "")
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    want = tiny_llama.generate(input_ids=ids, attention_mask=mask, max_length=width + 12, do_sample=False,
                               pad_token_id=pad, eos_token_id=sorted(eos) or None, use_cache=True)
    want = want[:, width:].tolist()
    assert [g[:len(w)] for g, w in zip(got, want)] == want
    assert all(len(m) <= 12 and all(x >= 0 for x in m) for m in margins)
    if eos:       # a row that produced an eos id is padded after it, and no margin is read there
        for g, m in zip(got, margins):
            hit = next((i for i, x in enumerate(g) if x in eos), None)
            if hit is not None:
                assert all(x == pad for x in g[hit + 1:]) and len(m) == hit + 1


def test_a_batch_stops_together_once_every_row_shows_one_stop_string(tiny_llama):
    # decode_raw maps token ids to letters: the stop string "C" is seen when token 2 (mod 26) is among the last
    # len(stop tokens) + 2 = 3 generated tokens of every row
    letters = lambda ids: "".join(chr(65 + i % 26) for i in ids)                           # noqa: E731
    free, _ = generate.greedy_batch(tiny_llama, [[1, 5, 9], [1, 30, 2]], 0, set(), {}, 20, letters)
    stop = letters(free[0][3:4])
    got, _ = generate.greedy_batch(tiny_llama, [[1, 5, 9], [1, 30, 2]], 0, set(), {stop: [0]}, 20, letters)
    seen = [next((i for i in range(len(free[b])) if stop in letters(free[b][max(0, i - 2):i + 1])), None)
            for b in range(2)]
    if None in seen:
        assert len(got[0]) == 20
    else:
        assert len(got[0]) == len(got[1]) == max(seen) + 1
        assert got[0] == free[0][:max(seen) + 1]


def test_lm_eval_batch_order_groups_by_kwargs_then_longest_first():
    encode = lambda text: list(range(len(text.split())))                                 # noqa: E731
    reqs = [(0, "a b", {"until": ["\n"]}), (1, "a b c d", {"until": ["\n"]}), (2, "x", {"until": ["."]}),
            (3, "b a", {"until": ["\n"]}), (4, "a b c", {"until": ["\n"]})]
    batches = generate.lm_eval_batches(reqs, encode, 2)
    assert [[r[0] for r in b] for b in batches] == [[1, 4], [0, 3], [2]]


@pytest.mark.parametrize("kwargs, says", [
    ({"until": ["\n"], "do_sample": True}, "sampled run"),
    ({"until": ["\n"], "temperature": 0.7}, "sampled run"),
    ({"until": ["\n"], "num_beams": 4}, "['num_beams']"),
    ({"until": 3}, "until '3'"),
    ({"max_gen_toks": 10 ** 6}, "max_gen_toks 1000000"),
])
def test_settings_that_are_not_greedy_decoding_are_named(kwargs, says):
    assert says in generate.greedy_settings(kwargs, 256)[3]


def test_greedy_settings_read_lm_evals_defaults():
    assert generate.greedy_settings({"until": "\n\n", "do_sample": False, "temperature": 0.0}, 256) == \
        (["\n\n"], 256, None, None)
    assert generate.greedy_settings({}, 32)[:3] == ([], 32, None)


def test_the_first_divergence_is_the_token_whose_text_leaves_the_logged_one():
    vocab = {1: "The", 2: " answer", 3: " is", 4: " 18", 5: " 17", 6: "\xe9"}
    decode = lambda ids: "".join(vocab[i] for i in ids)                                  # noqa: E731
    assert generate.first_divergence([1, 2, 3, 5], decode, "The answer is 18") == 3
    assert generate.first_divergence([1, 2, 3, 4], decode, "The answer is 18") is None
    assert generate.first_divergence([1, 2], decode, "The answer is 18") is None        # stopped early: the caller
    assert generate.first_divergence([1, 3], decode, "The answer is 18") == 1           # reads its last step


def test_clean_up_is_transformers_list():
    assert generate.clean_up("It is n't , he 's here .") == "It isn't, he's here."


def test_a_divergence_fails_only_past_the_margin_tolerance_and_a_near_tie_is_named():
    vocab = {1: "The", 2: " answer", 3: " is", 4: " 18", 5: " 17"}
    decode = lambda ids: "".join(vocab[i] for i in ids)                                  # noqa: E731
    reqs = [(0, "ctx", {}, ["The answer is 18"], []), (1, "ctx", {}, ["The answer is 18"], []),
            (2, "ctx", {}, ["The answer is 18"], [])]
    regenerated = {0: ([1, 2, 3, 4], "The answer is 18", [3.0, 2.0, 1.0, 0.5]),
                   1: ([1, 2, 3, 5], "The answer is 17", [3.0, 2.0, 1.0, 0.00004]),      # a near-tie at token 3
                   2: ([1, 2, 3, 5], "The answer is 17", [3.0, 2.0, 1.0, 0.2])}          # past it
    bad, ties, same = generate.compare(reqs, regenerated, decode, 1e-4)
    assert same == 1
    assert len(ties) == 1 and ties[0].startswith("doc_id 1:") and "part at generated token 3" in ties[0]
    assert len(bad) == 1 and bad[0].startswith("doc_id 2:") and "top-2 margin there 0.2" in bad[0]
