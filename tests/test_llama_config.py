"""evidence_audit/llama_config.py: config.json's Llama fields with transformers' defaults, checked against the
installed transformers' LlamaConfig field by field, bad values refused, and end to end: a tiny untied Llama whose
config.json omits fields is scored by the audit's own pass as transformers scores it (and was not before)."""
import copy
import inspect
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from evidence_audit import forward                                     # noqa: E402
from evidence_audit.llama_config import DEFAULTS, FIELDS, TRANSFORMERS_VERSION, llama_hparams   # noqa: E402

# whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = pytest.mark.kernels


# Every field set, and set away from its default, so that leaving one out changes something. head_dim 32 is not
# hidden_size // num_attention_heads (16) and num_key_value_heads 2 is not num_attention_heads, so the derived
# defaults are told apart from the given values.
FULL = {"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "hidden_act": "gelu", "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}
COMPARED = [f for f in FIELDS if f != "model_type"]   # model_type: not defaulted on purpose (module docstring)


def transformers_view(config):
    """{field: LlamaConfig(**config).field} for the fields llama_hparams returns (but model_type)."""
    cfg = transformers.LlamaConfig(**copy.deepcopy(config))
    return {f: getattr(cfg, f) for f in COMPARED}


def ours(config):
    hp = llama_hparams(copy.deepcopy(config))
    return {f: hp[f] for f in COMPARED}


def test_fields_and_defaults_are_the_installed_transformers():
    assert set(FIELDS) == set(DEFAULTS) | {"model_type"} and set(llama_hparams(FULL)) == set(FIELDS)
    assert FULL.keys() >= set(FIELDS)
    params = inspect.signature(transformers.LlamaConfig.__init__).parameters
    assert {f: params[f].default for f in DEFAULTS} == DEFAULTS
    assert transformers.__version__ == TRANSFORMERS_VERSION, "defaults read from another version: read them again"


def test_full_config():
    assert ours(FULL) == transformers_view(FULL)
    assert llama_hparams(FULL)["model_type"] == "llama"


@pytest.mark.parametrize("field", COMPARED)
def test_one_field_omitted(field):
    config = {k: v for k, v in FULL.items() if k != field}
    got, want = ours(config), transformers_view(config)
    assert got == want
    assert got[field] != FULL[field]                    # the default was taken, not the given value


@pytest.mark.parametrize("field", COMPARED)
def test_one_field_omitted_from_a_minimal_config(field):
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
    config.pop(field, None)
    assert ours(config) == transformers_view(config)


def test_derived_defaults_follow_the_given_fields():
    config = {"model_type": "llama", "hidden_size": 96, "num_attention_heads": 6}
    hp = llama_hparams(config)
    assert (hp["num_key_value_heads"], hp["head_dim"]) == (6, 16) and ours(config) == transformers_view(config)
    nulls = {**config, "num_key_value_heads": None, "head_dim": None, "rope_scaling": None}
    assert ours(nulls) == transformers_view(nulls) == ours(config)


def test_old_rope_scaling_type_key():
    config = {**FULL, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert ours(config) == transformers_view(config)
    assert llama_hparams(config)["rope_scaling"]["rope_type"] == "linear"


def test_model_type_is_not_defaulted():
    config = {k: v for k, v in FULL.items() if k != "model_type"}
    assert transformers.LlamaConfig(**config).model_type == "llama"      # by construction, not read
    assert llama_hparams(config)["model_type"] is None
    assert llama_hparams({**FULL, "model_type": "mistral"})["model_type"] == "mistral"


def test_rope_parameters_of_transformers_5():
    base = {k: v for k, v in FULL.items() if k not in ("rope_theta", "rope_scaling")}
    plain = llama_hparams({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}})
    assert (plain["rope_theta"], plain["rope_scaling"]) == (100000.0, None)
    yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 100000.0}
    scaled = llama_hparams({**base, "rope_parameters": yarn})
    assert scaled["rope_scaling"] == yarn and scaled["rope_theta"] == 100000.0
    # given both ways and equal: fine; rope_scaling given stays what it was
    both = llama_hparams({**FULL, "rope_parameters": {"rope_theta": 500000.0}})
    assert both["rope_theta"] == 500000.0 and both["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert llama_hparams({**base, "rope_parameters": {"rope_type": "default"}})["rope_theta"] == 10000.0


@pytest.mark.parametrize("field,value", [
    ("hidden_size", True), ("hidden_size", "64"), ("hidden_size", -64), ("hidden_size", 0), ("hidden_size", 64.0),
    ("hidden_size", None), ("num_hidden_layers", -1), ("num_hidden_layers", False), ("num_attention_heads", 0),
    ("num_attention_heads", [4]), ("vocab_size", 3.5), ("vocab_size", "300"),
    ("num_key_value_heads", 3), ("num_key_value_heads", 0), ("num_key_value_heads", True), ("num_key_value_heads", 8),
    ("head_dim", 15), ("head_dim", "32"), ("head_dim", 0), ("head_dim", 32.0),
    ("rms_norm_eps", "1e-5"), ("rms_norm_eps", True), ("rms_norm_eps", -1e-5), ("rms_norm_eps", None),
    ("rope_theta", 0), ("rope_theta", "10000"), ("rope_theta", None), ("rope_theta", False), ("rope_theta", -1.0),
    ("rope_scaling", "linear"), ("rope_scaling", [2.0]),
    ("hidden_act", 1), ("hidden_act", None), ("hidden_act", ""),
    ("attention_bias", "false"), ("attention_bias", 0), ("attention_bias", None), ("mlp_bias", 1),
    ("tie_word_embeddings", "true"), ("tie_word_embeddings", 1), ("tie_word_embeddings", None),
    ("model_type", 1), ("model_type", None), ("model_type", ""),
    ("rope_parameters", "default"), ("rope_parameters", {"rope_theta": "1e4"}),
    ("rope_parameters", {"rope_theta": 10000.0}),          # disagrees with rope_theta 500000
])
def test_bad_value_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError) as e:
        llama_hparams({**FULL, field: value})
    message = str(e.value)
    assert field in message and "expected" in message and "found" in message and "\n" not in message


def test_derived_head_dim_and_top_level():
    with pytest.raises(ValueError, match="hidden_size"):        # head_dim 3 // 4 = 0
        llama_hparams({"hidden_size": 3, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="head_dim: expected an even number, found 17"):
        llama_hparams({"hidden_size": 68, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="top level"):
        llama_hparams(["hidden_size", 64])
    with pytest.raises(ValueError) as e:                        # a huge value: still one short line
        llama_hparams({"attention_bias": "y" * 10000})
    assert len(str(e.value)) < 200 and "\n" not in str(e.value)


@pytest.mark.slow
def test_the_real_models_config(prepared_cache):
    """The shipped model's config.json (as prepare.py writes it) read as transformers reads it."""
    config = json.loads((Path(prepared_cache) / "models" / "smollm2-135m-instruct-q4_1" / "config.json").read_text())
    assert ours(config) == transformers_view(config)
    assert llama_hparams(config)["tie_word_embeddings"] is True


# ---- end to end: the own forward pass with these hparams against transformers -----------------------------------

def tiny_llama(out, **config):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         max_position_embeddings=256, **config))
    model.save_pretrained(out, safe_serialization=True)
    return out


def own_model(model_dir, hp, tag):
    """The model tuple exactly as forward.load_llama builds it, with `hp` for the hyperparameters. `tag` keeps the
    forward module's caches (keyed by the tuple's key) apart for two hp of the same files."""
    from safetensors.torch import load_file
    paths = [Path(model_dir) / "model.safetensors"]
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths) + (tag,)
    W = {}
    for path in paths:
        W.update({k: v.to(torch.float32) for k, v in load_file(str(path)).items()})
    return key, hp, W


def forget(model):
    for cache in (forward._SCORES, forward._WEIGHTS):
        for k in [k for k in cache if k[0] == model[0]]:
            del cache[k]


@pytest.mark.parametrize("variant", ["untied head, tie_word_embeddings omitted",
                                     "untied head, no kv heads, head_dim, eps, theta or tie given"])
def test_own_pass_scores_as_transformers_with_omitted_fields(tmp_path, variant):
    from transformers import LlamaForCausalLM
    if variant.startswith("untied head, tie"):
        model_dir, drop = tiny_llama(tmp_path, num_attention_heads=4, num_key_value_heads=2,
                                     tie_word_embeddings=False), ["tie_word_embeddings"]
    else:
        model_dir, drop = tiny_llama(tmp_path, num_attention_heads=4, tie_word_embeddings=False), [
            "tie_word_embeddings", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta"]
    cfg_path = model_dir / "config.json"
    raw = json.loads(cfg_path.read_text())
    assert raw["tie_word_embeddings"] is False
    cfg_path.write_text(json.dumps({k: v for k, v in raw.items() if k not in drop}, indent=2))
    raw = json.loads(cfg_path.read_text())
    assert not set(drop) & set(raw)

    ref = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    assert not torch.equal(ref.lm_head.weight, ref.model.embed_tokens.weight)   # the head really is untied
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 300, (3, 12), generator=g)
    with torch.no_grad():
        want = ref(ids).logits

    fixed = own_model(model_dir, llama_hparams(raw), "llama_hparams")
    try:
        got = forward.own_llama_batch(fixed, ids, "float32")
        assert (got - want).abs().max().item() < 1e-5
        lp = forward.llama_logprobs(fixed, ids[0].tolist())
        assert (lp - torch.log_softmax(want[0], -1)).abs().max().item() < 1e-5
    finally:
        forget(fixed)

    # config.json's dict as it is (what forward.load_llama passed before llama_hparams): a missing field is a
    # KeyError, or its own default (tie_word_embeddings True: the embedding as head) scores another model
    today = own_model(model_dir, raw, "raw config.json")
    try:
        try:
            off = (forward.own_llama_batch(today, ids, "float32") - want).abs().max().item()
        except KeyError:
            off = None
        assert off is None or off > 1e-2
        if "num_key_value_heads" in drop:
            assert off is None
    finally:
        forget(today)
