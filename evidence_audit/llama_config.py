"""config.json's Llama hyperparameters as transformers reads them, for the audit's own Llama forward pass.

A field that config.json leaves out takes the default of transformers' LlamaConfig, derived defaults included
(num_key_value_heads = num_attention_heads, head_dim = hidden_size // num_attention_heads). A default of the
audit's own would make it score another model than the one the runner loaded: with tie_word_embeddings omitted,
transformers keeps lm_head.weight apart from the embedding, so a guessed True re-scores through the wrong head.
The defaults were read from transformers 4.57.6 (models/llama/configuration_llama.py) and are written here as
data: the audit runs without transformers installed.

Limits:
- They are 4.57.6's defaults. Another transformers version could default differently; tests/test_llama_config.py
  compares them with the installed LlamaConfig, so an upgrade that changes one fails there.
- Only the fields the own pass reads (FIELDS). The weights are not checked against these sizes here
  (model_files.check_model_dir compares the tensor shapes with config.json).
- model_type is not defaulted: LlamaConfig is "llama" by construction, but a config.json without model_type names
  no architecture (AutoConfig then guesses from the path), so a missing one is returned as None and the own pass
  must not claim the model.
- rope_theta also comes from transformers 5's `rope_parameters` when config.json has no `rope_theta`. A
  rope_parameters that is more than a plain rotary base (another rope_type, scaling keys) is returned as
  rope_scaling when config.json has none, so a caller that refuses rope_scaling refuses it too. A rope_theta and a
  rope_parameters.rope_theta that differ are a ValueError: transformers 4 reads the one, 5 the other.
"""
import math

# transformers 4.57.6, LlamaConfig.__init__'s keyword defaults. None: derived from other fields, as LlamaConfig does.
TRANSFORMERS_VERSION = "4.57.6"
DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,       # -> num_attention_heads
    "head_dim": None,                  # -> hidden_size // num_attention_heads
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,      # LlamaConfig passes False; PretrainedConfig's own default is True
}
FIELDS = tuple(DEFAULTS) + ("model_type",)


def _fail(field, expected, found):
    text = repr(found)
    text = text if len(text) <= 60 else text[:57] + "..."     # one line, however large the value
    return ValueError(f"config.json {field}: expected {expected}, found {text}")


def _count(config, field, derived=None):
    """A positive integer; a missing (or, where transformers derives it, null) field takes the default."""
    v = config.get(field, DEFAULTS[field])
    if v is None and derived is not None:
        v = derived
    # bool is an int in Python, and JSON 64.0 is no size
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        raise _fail(field, "a positive integer", v)
    return v


def _number(field, v, minimum, strict):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
        v > minimum if strict else v >= minimum)
    if not ok:
        raise _fail(field, f"a finite number {'>' if strict else '>='} {minimum:g}", v)
    return float(v)


def _flag(config, field):
    v = config.get(field, DEFAULTS[field])
    if not isinstance(v, bool):       # "false" or 0 would be read as something by someone
        raise _fail(field, "true or false", v)
    return v


def _rope(config):
    """(rope_theta, rope_scaling) from rope_theta / rope_scaling (transformers 4) or rope_parameters (5)."""
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise _fail("rope_scaling", "null or an object", scaling)
    if scaling is not None:
        scaling = dict(scaling)
        if "type" in scaling:          # LlamaConfig copies the old key to rope_type; so do we
            scaling["rope_type"] = scaling["type"]
    theta = _number("rope_theta", config["rope_theta"], 0, True) if "rope_theta" in config else None
    rp = config.get("rope_parameters")
    if rp is not None:
        if not isinstance(rp, dict):
            raise _fail("rope_parameters", "null or an object", rp)
        if "rope_theta" in rp:
            rp_theta = _number("rope_parameters.rope_theta", rp["rope_theta"], 0, True)
            # transformers 4 reads rope_theta, 5 reads rope_parameters: if they differ, they run different models
            if theta is not None and theta != rp_theta:
                raise _fail("rope_parameters.rope_theta", f"the same value as rope_theta ({theta:g})", rp_theta)
            theta = rp_theta
        plain = rp.get("rope_type", "default") == "default" and set(rp) <= {"rope_type", "rope_theta"}
        if not plain and scaling is None:
            scaling = dict(rp)
    return (DEFAULTS["rope_theta"] if theta is None else theta), scaling


def llama_hparams(config):
    """{field: value} for every name in FIELDS, from config.json's parsed dict, a missing field taking transformers
    4.57.6 LlamaConfig's default (module docstring). Raises ValueError, one line naming the field, what was expected
    and what was found, for a value of the wrong type or out of range, or heads that do not divide."""
    if not isinstance(config, dict):
        raise _fail("(top level)", "an object", config)
    hp = {f: _count(config, f) for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")}
    nh = hp["num_attention_heads"]
    hp["num_key_value_heads"] = nkv = _count(config, "num_key_value_heads", derived=nh)
    if nh % nkv:                        # grouped-query attention repeats each key/value head nh // nkv times
        raise _fail("num_key_value_heads", f"a divisor of num_attention_heads ({nh})", nkv)
    if "head_dim" in config and config["head_dim"] is not None:
        hp["head_dim"] = _count(config, "head_dim")
    elif hp["hidden_size"] // nh < 1:
        raise _fail("hidden_size", f"at least num_attention_heads ({nh}) when head_dim is absent", hp["hidden_size"])
    else:
        hp["head_dim"] = hp["hidden_size"] // nh
    if hp["head_dim"] % 2:              # rotary embeddings turn pairs of dimensions
        raise _fail("head_dim", "an even number", hp["head_dim"])
    hp["rms_norm_eps"] = _number("rms_norm_eps", config.get("rms_norm_eps", DEFAULTS["rms_norm_eps"]), 0, False)
    hp["rope_theta"], hp["rope_scaling"] = _rope(config)
    act = config.get("hidden_act", DEFAULTS["hidden_act"])
    if not (isinstance(act, str) and act):
        raise _fail("hidden_act", "an activation name", act)
    hp["hidden_act"] = act
    for f in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        hp[f] = _flag(config, f)
    mt = config.get("model_type")
    if "model_type" in config and not (isinstance(mt, str) and mt):
        raise _fail("model_type", "an architecture name", mt)
    hp["model_type"] = mt
    return {f: hp[f] for f in FIELDS}
