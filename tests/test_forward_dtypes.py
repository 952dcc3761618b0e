"""The forward level in every scored dtype and for the architectures people evaluate (evidence_audit/forward.py).

Fast tests build tiny random models (save_pretrained, safetensors) and evidence for the forward level by hand: the
recorded scores come from transformers' own model class run in lm-eval's batches, so the audit's own Llama pass is
compared with an implementation it does not share code with. The slow tests run run.py --model DIR on tiny models
of three architectures in bfloat16 and audit the evidence with --tokens --forward --strict.
"""
import json
import shutil

import pytest

import conftest
from conftest import run_cli

torch = pytest.importorskip("torch")

from evidence_audit import forward, hflm                              # noqa: E402
from evidence_audit.checks import Checks                              # noqa: E402
from evidence_audit.reading import sha256_file                        # noqa: E402

# whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = pytest.mark.kernels

VOCAB = 300
BATCH = 4


def save_tiny(kind, out):
    """A tiny random `kind` model saved with safetensors (no tokenizer: the unit tests hand the token ids)."""
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=256, tie_word_embeddings=False))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=256))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256))
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_forward")
    return {kind: save_tiny(kind, root / kind) for kind in ("llama", "gpt2", "qwen2")}


def requests_of(n_items=6, seed=1):
    """{idx: (context ids, [two candidates' ids])} of different lengths, so lm-eval's batches pad."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for idx in range(n_items):
        ctx = torch.randint(1, VOCAB, (5 + 3 * idx,), generator=g).tolist()
        out[idx] = (ctx, [torch.randint(1, VOCAB, (1,), generator=g).tolist(),
                          torch.randint(1, VOCAB, (2,), generator=g).tolist()])
    return out


def evidence(model_dir, dtype, tokens):
    """(identity, records) as run.py would record them for `tokens`, the scores from transformers' own class in
    lm-eval's batches of BATCH in `dtype` (both paths: on cpu they agree bit for bit)."""
    ref, why = hflm.load_transformers(model_dir, dtype)
    assert ref is not None, why
    keys = [(idx, j) for idx in tokens for j in range(len(tokens[idx][1]))]
    got = hflm.score_requests(ref.logits, [(tokens[i][0], tokens[i][1][j]) for i, j in keys], BATCH)
    records = []
    for idx in tokens:
        scored = [g for (i, _), g in zip(keys, got) if i == idx]
        scores = [s for s, _ in scored]
        pred = max(range(len(scores)), key=lambda j: (scores[j], -j))
        side = {"scores": scores, "pred": pred}
        records.append({"idx": idx, "candidates": [{}] * len(scores), "independent": dict(side),
                        "official": {**side, "is_greedy": [g for _, g in scored]}})
    ident = {"model_sha256": sha256_file(model_dir / "model.safetensors"),
             "scoring_config": {"dtype": dtype, "official_batch_size": BATCH}}
    return ident, records


def forward_rows(model_dir, ident, records, tokens):
    C = Checks()
    figures = forward.audit_candidate_scores(C, "protocol", ident, records, tokens, model_dir)
    return {r["check"]: r for r in C.rows}, figures


# ---- the audit's own Llama pass against transformers', bit for bit ---------------------------------------------

@pytest.mark.parametrize("attention", forward.ATTENTIONS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_own_llama_is_bit_identical_to_transformers_in_a_padded_batch(tiny, dtype, attention):
    """The same padded batch through the audit's own Llama and transformers' LlamaForCausalLM, with eager attention
    and with sdpa (transformers' default, which lm-eval runs unless told otherwise): equal logits, bit for bit, in
    every dtype -- what lets the forward level expect the recorded scores."""
    own, why = forward.load_llama(tiny["llama"])
    ref, why2 = hflm.load_transformers(tiny["llama"], dtype, attention)
    assert why is None and why2 is None
    ids = torch.randint(1, VOCAB, (3, 17), generator=torch.Generator().manual_seed(3))
    ids[1, 12:] = 0
    ids[2, 6:] = 0
    with torch.no_grad():
        a, b = forward.own_llama_batch(own, ids, dtype, attention), ref.logits(ids)
    assert a.dtype == b.dtype == getattr(torch, dtype)
    assert torch.equal(a, b), (a.float() - b.float()).abs().max()


def test_a_sharded_llama_is_read_from_every_shard(tiny, tmp_path):
    """A model saved in shards (model.safetensors.index.json, as large checkpoints are) gives the own pass every
    weight: the same logits as the single file, bit for bit."""
    from transformers import LlamaForCausalLM
    sharded = tmp_path / "sharded"
    LlamaForCausalLM.from_pretrained(tiny["llama"]).save_pretrained(sharded, max_shard_size="100KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 1 and not (sharded / "model.safetensors").exists()
    one, why_one = forward.load_llama(tiny["llama"])
    many, why = forward.load_llama(sharded)
    assert why_one is None and why is None and sorted(many[2]) == sorted(one[2])
    ids = torch.randint(1, VOCAB, (2, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(forward.own_llama_batch(one, ids, "float32"), forward.own_llama_batch(many, ids, "float32"))


# ---- the level on bfloat16 / float16 evidence ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_clean_half_precision_evidence_passes_in_lm_evals_batches(tiny, dtype):
    tokens = requests_of()
    ident, records = evidence(tiny["llama"], dtype, tokens)
    rows, fig = forward_rows(tiny["llama"], ident, records, tokens)
    assert [rows[c]["status"] for c in forward.FORWARD_CHECKS] == ["PASS"] * 3, rows
    assert fig["mode"] == f"lm-eval's batches of {BATCH}" and fig["dtype"] == dtype
    assert fig["implementation"] == "audit.py's own Llama forward"
    assert fig["official"]["max"] == 0.0                              # bit for bit: see the test above
    assert "float32_beside" in fig and fig["float32_beside"]["official"]["max"] > 0
    assert f"{dtype}, audit.py's own Llama forward, lm-eval's batches of {BATCH}" in rows[
        forward.FORWARD_CHECKS[0]]["note"]


def test_a_forged_bfloat16_score_fails_the_forward_level(tiny):
    """A score moved by more than the bfloat16 tolerance, and a prediction flipped with its scores swapped (every
    arithmetic claim still consistent), each fail their row naming the item."""
    tokens = requests_of()
    ident, records = evidence(tiny["llama"], "bfloat16", tokens)
    forged = json.loads(json.dumps(records))
    for side in ("official", "independent"):
        forged[2][side]["scores"][0] += 2 * forward.TOLERANCE["bfloat16"] + 0.125
    rows, fig = forward_rows(tiny["llama"], ident, forged, tokens)
    assert rows[forward.FORWARD_CHECKS[0]]["status"] == "FAIL"
    assert rows[forward.FORWARD_CHECKS[0]]["first_failure"].startswith("idx 2 official.scores[0]")
    assert fig["moved_past_tolerance"] == ["idx 2"]

    swapped = json.loads(json.dumps(records))
    for side in ("official", "independent"):
        s = swapped[4][side]["scores"]
        s.reverse()
        swapped[4][side]["pred"] = 1 - swapped[4][side]["pred"]
    rows, fig = forward_rows(tiny["llama"], ident, swapped, tokens)
    assert rows[forward.FORWARD_CHECKS[1]]["status"] == "FAIL"
    assert fig["argmax_flips"]["official"] == ["idx 4"]


def test_tolerance_is_stated_for_every_scored_dtype():
    assert set(forward.TOLERANCE) == set(forward.TORCH_DTYPES)
    assert forward.FORWARD_TOL == forward.TOLERANCE["float32"]
    assert all(t >= 0 for t in forward.TOLERANCE.values())


# ---- other architectures: transformers' own class, named in the row -------------------------------------------

@pytest.mark.parametrize("kind,cls", [("gpt2", "GPT2LMHeadModel"), ("qwen2", "Qwen2ForCausalLM")])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_architectures_run_transformers_and_say_so(tiny, kind, cls, dtype):
    tokens = requests_of()
    ident, records = evidence(tiny[kind], dtype, tokens)
    rows, fig = forward_rows(tiny[kind], ident, records, tokens)
    assert [rows[c]["status"] for c in forward.FORWARD_CHECKS] == ["PASS"] * 3, rows
    assert fig["implementation"] == f"transformers' {cls}, not the audit's own"
    assert fig["implementation"] in rows[forward.FORWARD_CHECKS[0]]["note"]
    forged = json.loads(json.dumps(records))
    forged[1]["official"]["scores"][1] += 2 * forward.TOLERANCE[dtype] + 0.125
    rows, _ = forward_rows(tiny[kind], ident, forged, tokens)
    assert rows[forward.FORWARD_CHECKS[0]]["status"] == "FAIL"


def test_a_dtype_the_level_cannot_read_is_skipped_with_the_reason(tiny):
    tokens = requests_of(2)
    ident, records = evidence(tiny["llama"], "float32", tokens)
    ident["scoring_config"]["dtype"] = "int8"
    rows, fig = forward_rows(tiny["llama"], ident, records, tokens)
    assert fig is None and rows[forward.FORWARD_CHECKS[0]]["status"] == "SKIPPED"
    assert "int8" in rows[forward.FORWARD_CHECKS[0]]["note"]


# ---- end to end: run.py --model DIR --dtype bfloat16, then audit.py --forward ----------------------------------

@pytest.fixture(scope="module")
def data_cache(prepared_cache, tmp_path_factory):
    """A cache with the fixture data only."""
    cache = tmp_path_factory.mktemp("data_only_cache")
    shutil.copytree(prepared_cache / "data" / "fixture-sentiment", cache / "data" / "fixture-sentiment")
    manifest = json.loads((prepared_cache / "manifest.json").read_text())
    (cache / "manifest.json").write_text(json.dumps(
        {"resources": {"fixture-sentiment": manifest["resources"]["fixture-sentiment"]}}))
    return cache


def build_with_tokenizer(kind, out):
    """A tiny random model of `kind` with a real tokenizer (test_local_model's, trained on the fixture)."""
    from test_local_model import gpt2_tokenizer, llama_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    tok = llama_tokenizer() if kind == "llama" else gpt2_tokenizer()
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    cfg = {"llama": lambda: AutoConfig.for_model("llama", vocab_size=len(tok), tie_word_embeddings=False, **sizes),
           "qwen2": lambda: AutoConfig.for_model("qwen2", vocab_size=len(tok), **sizes),
           "gpt2": lambda: AutoConfig.for_model("gpt2", vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2,
                                                n_positions=512)}[kind]()
    cfg.bos_token_id, cfg.eos_token_id = tok.bos_token_id, tok.eos_token_id
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind,impl", [("llama", "audit.py's own Llama forward"),
                                       ("gpt2", "transformers' GPT2LMHeadModel, not the audit's own"),
                                       ("qwen2", "transformers' Qwen2ForCausalLM, not the audit's own")])
def test_run_py_bfloat16_evidence_is_re_scored_by_the_forward_level(data_cache, tmp_path, kind, impl):
    model = build_with_tokenizer(kind, tmp_path / kind)
    out = tmp_path / "out"
    proc = run_cli("run.py", "--cache", data_cache, "--out", out, "--experiment", "protocol", "--smoke",
                   "--model", model, "--dtype", "bfloat16", "--no-cache", "--threads", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("audit.py", out, "--strict", "--tokens", "--forward", "--cache", data_cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "audit.json").read_text())
    fwd = [r for r in report["checks"] if r["level"] == "forward" and r["check"] in forward.FORWARD_CHECKS]
    assert [r["status"] for r in fwd] == ["PASS"] * 3, fwd
    assert impl in fwd[0]["note"] and "bfloat16" in fwd[0]["note"]


# ---- greedy generations made in bfloat16 / float16 ----------------------------------------------------------------

@pytest.mark.parametrize("dtype, passes", [("float32", False), ("bfloat16", True), ("float16", False)])
def test_a_greedy_token_within_the_dtypes_margin_is_a_near_tie_not_a_failure(tiny, dtype, passes):
    """The greedy check runs the audit's float32 pass. A generation made in bfloat16 picks the float32 runner-up
    where the top two are closer than MARGIN_TOLERANCE["bfloat16"] (measured: gaps of 0.038-0.103 on a real
    12-item bfloat16 extraction run, 4 of its positions): a near-tie, not a failure. The same token recorded for a
    float32 generation (tolerance 1e-4) or a float16 one (0.05) fails. The position is chosen so its float32 gap
    lies between 0.05 and 0.25."""
    from evidence_audit.greedy import GREEDY, greedy_check

    model_dir = tiny["llama"]
    model, _ = forward.load_llama(model_dir)
    g = torch.Generator().manual_seed(3)
    for _ in range(200):                          # a prompt whose next-token top two are 0.05..0.25 apart
        prompt = torch.randint(1, VOCAB, (6,), generator=g).tolist()
        row = forward.llama_logprobs(model, prompt)[-1]
        top2 = torch.topk(row, 2)
        gap = float(top2.values[0] - top2.values[1])
        if forward.MARGIN_TOLERANCE["float16"] < gap < forward.MARGIN_TOLERANCE["bfloat16"]:
            break
    else:
        pytest.fail("no prompt with a top-two gap in (0.05, 0.25) among 200")
    runner_up = int(top2.indices[1])
    ident = {"model_sha256": sha256_file(model_dir / "model.safetensors"), "scoring_config": {"dtype": dtype}}
    C = Checks()
    greedy_check(C, "extraction", ident, [{"idx": 0}], {0: (prompt, [runner_up])}, model_dir)
    (row,) = [r for r in C.rows if r["check"] == GREEDY]
    assert row["status"] == ("PASS" if passes else "FAIL"), row
    if passes:
        assert "generated in bfloat16, re-run in float32: a gap within 0.25 is a near-tie" in row["note"], row
