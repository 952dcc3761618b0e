"""Integration tests of adapter.py on the real SmolLM2-135M-Instruct Q4_1 GGUF and the directory prepare.py
materialises from it. Nothing is mocked: every check reads the real files through the `model_dir` and `gguf_path`
session fixtures. Heavy objects (tokenizers, models, GGUF metadata) are loaded once per module.

What is checked and why:
1. the rebuilt tokenizer has the ORIGINAL SmolLM2 behaviour (no BOS, eos = pad = <|im_end|> = 2, chat template);
2. transformers' own GGUF tokenizer conversion really has the defect we avoid (it prepends id 1);
3. token ids agree with an independent pure-Python byte-level BPE written here from the GGUF vocabulary and
   merges (llama.cpp `smollm` pre-tokenizer: single digits, then the GPT-2 regex), and decode round-trips;
4. the materialised fp32 weights and next-token log-probabilities are bit-identical to loading the GGUF directly
   with transformers (an independent dequantise + rotary un-permute implementation), and the config is right;
5. the q/k rotary un-permutation is load-bearing: without it q_proj/k_proj differ and the outputs change;
6. (fast, no model) the GGUF metadata the tokenizer rebuild relies on is checked explicitly, one line naming the
   field, the expected and the found value, also under `python -O`, which drops asserts.
"""
import random
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import regex

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the tests/ dir, not the repo root, is what pytest puts on sys.path
    sys.path.insert(0, str(REPO))

import adapter  # noqa: E402

torch = pytest.importorskip("torch")

# Every test marked slow reads the real prepared model, its tokenizer or the GGUF; the others need none of them.

NEG, POS, A_ID, B_ID = 3524, 2731, 330, 389
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


# ---- module-scoped fixtures: load everything once ---------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Every comparison here is between two models run in the same process with the same settings, so the thread
    count cannot change a verdict; one thread keeps the module fast when other processes share the 2 vCPUs (two
    OpenMP threads on a busy 2-vCPU machine were measured ~30x slower). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def gguf_meta(gguf_path):
    """(reader, metadata) read straight from the GGUF file with gguf.GGUFReader."""
    return adapter.read_gguf(gguf_path)


@pytest.fixture(scope="module")
def reference_bpe(gguf_path):
    return ReferenceBPE.from_gguf(gguf_path)


@pytest.fixture(scope="module")
def gguf_tok(gguf_path):
    """transformers' own conversion of the GGUF tokenizer (the known-wrong one)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    return m.eval()


@pytest.fixture(scope="module")
def gguf_model(gguf_path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                             dtype=torch.float32, attn_implementation="eager")
    return m.eval()


# ---- an independent reference byte-level BPE (pure Python, reads the GGUF directly) -----------------------------

def gpt2_bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table.

    Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves; the other 68 bytes (controls, space,
    DEL, NBSP, soft hyphen, ...) map in byte order to U+0100, U+0101, ... so that no byte becomes whitespace."""
    keep = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


GPT2_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
DIGIT_PATTERN = regex.compile(r"(\p{N})")


# Bytes whose GPT-2 unicode character is NOT in the SmolLM2 vocabulary. 0xC0, 0xC1, 0xF5..0xFF never occur in
# UTF-8; 0xF1/0xF2 only lead the unassigned planes 4..11; but six ASCII control characters are missing too. Both
# llama.cpp (token not found -> skip it) and HF `tokenizers` (BPE with no unk token) silently DROP such symbols.
MISSING_BYTES = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)}
DROPPED_CHARS = "".join(chr(b) for b in sorted(MISSING_BYTES) if b < 0x80)


class ReferenceBPE:
    """Byte-level BPE as llama.cpp's `smollm` pre-tokenizer + GPT-2 BPE define it. Control tokens (GGUF token
    type 3) found literally in the text are matched first, leftmost-longest, as the HF tokenizer does. Symbols
    absent from the vocabulary (see MISSING_BYTES) are dropped, as llama.cpp and HF both do."""

    def __init__(self, tokens, token_types, merges):
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.id_to_token = list(tokens)
        self.ranks = {}
        for rank, m in enumerate(merges):
            a, b = m.split(" ")
            self.ranks.setdefault((a, b), rank)
        specials = sorted((t for t, ty in zip(tokens, token_types) if ty == 3), key=len, reverse=True)
        self.special_re = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
        self.specials = set(specials)
        self.byte_map = gpt2_bytes_to_unicode()
        self.byte_unmap = {c: b for b, c in self.byte_map.items()}
        self._bpe = lru_cache(maxsize=None)(self._bpe_uncached)

    @classmethod
    def from_gguf(cls, path):
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields
        return cls(fields["tokenizer.ggml.tokens"].contents(), fields["tokenizer.ggml.token_type"].contents(),
                   fields["tokenizer.ggml.merges"].contents())

    def pretokenize(self, text):
        pieces = []
        for chunk in DIGIT_PATTERN.split(text):          # every numeric char is its own chunk
            if chunk:
                pieces.extend(GPT2_PATTERN.findall(chunk))
        return pieces

    def _bpe_uncached(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = list(zip(parts, parts[1:]))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):                         # merge every occurrence, left to right
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return tuple(parts)

    def encode(self, text):
        ids = []
        for seg in self.special_re.split(text):
            if not seg:
                continue
            if seg in self.specials:
                ids.append(self.vocab[seg])
                continue
            for piece in self.pretokenize(seg):
                word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
                ids.extend(self.vocab[p] for p in self._bpe(word) if p in self.vocab)
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t = self.id_to_token[i]
            out += t.encode("utf-8") if t in self.specials else bytes(self.byte_unmap[c] for c in t)
        return out.decode("utf-8")


# ---- test corpus ----------------------------------------------------------------------------------------------

HAND_WRITTEN = [
    "", " ", "  ", "\t", "\n", "\n\n", " \n ", "x", " negative", " positive", " A", " B", "negative", "Positive",
    "Answer: negative", "Answer: positive", "Question: Is this sentence positive or negative?\nAnswer:",
    "it 's a charming and often affecting journey . ", "unflinchingly bleak and desperate ",
    "hello world", "Hello, World!", "HELLO   WORLD", "  leading and trailing  ", "trailing space ",
    "tabs\tand\t\ttabs", "new\nline\r\nwindows\rmac", "   \n\n   \t\t  x", "a\u00a0b\u3000c\u2009d\u202fe",
    "don't", "I'm", "we're", "they've", "you'll", "he'd", "it's", "IT'S", "I'M", "rock'n'roll", "'s", "''", "'''s",
    "O'Neil's", "l'été", "’s curly", "«guillemets»", "“quoted”",
    "0", "7", "42", "2024", " 12345", "3.14159", "1,000,000", "-17", "+1e-10", "0x1F", "v1.2.3", "call 555-0199",
    "12345678901234567890123456789", "a1b2c3", "abc123def", "½ cup", "x² + y²", "٣٤٥", "१२३", "Ⅻ", "①②③", "𝟙𝟚",
    "café", "naïve", "Straße", "ÅÄÖ åäö", "İstanbul", "ǅemal", "e\u0301", "Ω≈ç√∫", "Ελληνικά", "Русский текст",
    "עברית", "العربية", "हिन्दी", "ภาษาไทย", "中文", "日本語のテキスト", "한국어", "中文 English 混合 123",
    "😀", "👍🏽", "🇺🇸🇫🇷", "👨‍👩‍👧‍👦", "I ❤️ NY", "🤖🤖🤖", "zero\u200bwidth", "\ufeffbom", "\x00\x01\x1f\x7f",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] = b[i]; }", "<div class=\"x\">y</div>",
    "SELECT * FROM t WHERE id = 1;", "https://example.com/a?b=c&d=e#f", "user@example.org", "C:\\Users\\me",
    "#include <stdio.h>", "$$\\sum_{i=1}^n i$$", "!!!", "?!?!", "...", "—", "-- -- --", "====", "***bold***",
    "(((nested)))", "[1, 2, 3]", "{'a': 1}", "~`@#$%^&*_+=|\\/<>", "a  b   c    d",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n", "<repo_name>x<file_sep>",
    "<|im_start", "im_end|>", "< |im_end| >", "<|IM_END|>", "<|im_start|><|im_start|>", "text<|endoftext|>text",
    "<reponame><repo_name>", "<jupyter_code>print(1)<jupyter_output>1",
    # characters whose bytes have no token: dropped (see MISSING_BYTES)
    "a\x04b", "x\x06\x13\x14\x16\x1dy", "\x1d", "\U00040000x", " \x04 negative",
]

ALPHABET_CHUNKS = [
    "the", " the", "cat", " sat", " on", " mat", "Movie", " movie", "film", " was", " not", " good", " bad",
    " great", "ing", "tion", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'", "’", "\"",
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "12", "345", "2024", "½", "²", "٣",
    " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000",
    ".", ",", "!", "?", ";", ":", "-", "--", "...", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|", "_",
    "=", "+", "*", "&", "%", "$", "#", "@", "^", "~", "`",
    "é", "ü", "ñ", "ø", "ß", "à", "Ç", "e\u0301", "中", "文", "日本", "語", "한", "국", "Ж", "ж", "λ", "ع", "ש", "क",
    "😀", "👍", "🏽", "🇺", "🇸", "\u200d", "❤️", "🤖", "\u200b",
    "def", " return", "x", "y", "_id", "__init__", "0x", "ff", "E", "Z",
    "<|im_start|>", "<|im_end|>", "<|", "|>", "im_end", "<file_sep>", "<", "endoftext",
]


def random_strings(n=300, seed=20250101):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 14)
        parts = []
        for _ in range(k):
            if rng.random() < 0.8:
                parts.append(rng.choice(ALPHABET_CHUNKS))
            else:  # a random code point from a few varied blocks
                lo, hi = rng.choice([(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x52F), (0x4E00, 0x4FFF),
                                     (0x3040, 0x30FF), (0xAC00, 0xACFF), (0x1F300, 0x1F64F), (0x2000, 0x206F)])
                parts.append(chr(rng.randint(lo, hi)))
        out.append("".join(parts))
    return out


CORPUS = HAND_WRITTEN + random_strings()


# ---- 1. tokenizer facts ---------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("text,ids", [(" negative", [NEG]), (" positive", [POS]), (" A", [A_ID]), (" B", [B_ID])])
def test_candidate_tokens(tok, text, ids):
    assert tok(text)["input_ids"] == ids
    assert tok.encode(text) == ids


@pytest.mark.slow
def test_no_bos_prepended(tok, model_dir):
    assert len(CORPUS) >= 400
    for s in CORPUS:
        ids = tok(s)["input_ids"]
        assert ids == tok(s, add_special_tokens=False)["input_ids"], s
        if "<|im_start|>" not in s:
            assert 1 not in ids, (s, ids)
    assert tok("")["input_ids"] == []
    # the SST-2 prompt + candidate: the context is a prefix of the whole and nothing is added at either end
    ctx = "a gorgeous film .\nQuestion: Is this sentence positive or negative?\nAnswer:"
    whole = tok(ctx + " positive")["input_ids"]
    assert whole[:-1] == tok(ctx)["input_ids"] and whole[-1] == POS
    # adapter.load_tokenizer applies its own guard and must accept the materialised tokenizer
    assert adapter.load_tokenizer(model_dir).encode(" negative") == [NEG]


@pytest.mark.slow
def test_special_token_ids(tok):
    assert tok.eos_token_id == tok.pad_token_id == 2
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    assert tok.bos_token_id == 1 and tok.bos_token == "<|im_start|>"
    assert tok.unk_token_id == 0 and tok.unk_token == "<|endoftext|>"
    assert len(tok) == 49152
    for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]):
        assert tok.convert_tokens_to_ids(t) == i
        assert tok.encode(t) == [i]  # matched as one special token, never split into pieces


@pytest.mark.slow
def test_chat_template(tok, gguf_meta):
    _, meta = gguf_meta
    assert tok.chat_template == meta["tokenizer.chat_template"]
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == (f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
                        "<|im_start|>user\nhi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    with_system = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                          tokenize=False, add_generation_prompt=False)
    assert with_system == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # 3x <|im_start|>, 2x <|im_end|>, nothing extra
    assert ids == tok(rendered)["input_ids"]


@pytest.mark.slow
def test_config_and_generation_config_special_ids(model_dir, gguf_meta):
    import json

    _, meta = gguf_meta
    assert meta["tokenizer.ggml.bos_token_id"] == 1 and meta["tokenizer.ggml.eos_token_id"] == 2
    assert meta["tokenizer.ggml.padding_token_id"] == 2 and meta["tokenizer.ggml.unknown_token_id"] == 0
    assert not meta["tokenizer.ggml.add_bos_token"]
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    gen = json.loads((Path(model_dir) / "generation_config.json").read_text())
    for c in (cfg, gen):
        assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (1, 2, 2)


# ---- 2. the defect of transformers' GGUF tokenizer is real, and ours avoids it ----------------------------------

@pytest.mark.slow
def test_transformers_gguf_tokenizer_defect_is_real_and_avoided(tok, gguf_tok):
    assert gguf_tok(" negative")["input_ids"] == [1, NEG]   # transformers' conversion prepends <|im_start|>
    assert gguf_tok.eos_token_id == 1                       # ... and reports <|im_start|> as eos
    assert tok(" negative")["input_ids"] == [NEG]           # ours does neither
    assert tok.eos_token_id == 2
    # past the spurious BOS the vocabulary is the same: the rebuild changes only what it must
    for s in [" positive", "hello 12345 world", "Answer:", "café 😀"]:
        assert gguf_tok(s)["input_ids"] == [1] + tok(s)["input_ids"], s


# ---- 3. agreement with an independent byte-level BPE over the GGUF vocabulary and merges -----------------------

@pytest.mark.slow
def test_reference_bpe_self_checks(reference_bpe, gguf_meta):
    _, meta = gguf_meta
    table = gpt2_bytes_to_unicode()
    assert len(set(table.values())) == 256 and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    missing = {b for b, c in table.items() if c not in reference_bpe.vocab}
    assert missing == MISSING_BYTES, sorted(missing)
    for a, b in reference_bpe.ranks:                              # merges only ever build vocabulary tokens
        assert a in reference_bpe.vocab and b in reference_bpe.vocab and a + b in reference_bpe.vocab, (a, b)
    assert len(reference_bpe.id_to_token) == meta["llama.vocab_size"] == 49152
    assert reference_bpe.pretokenize("ab 123 don't  x") == ["ab", " ", "1", "2", "3", " don", "'t", " ", " x"]
    assert reference_bpe.encode(" negative") == [NEG]
    assert reference_bpe.encode(" positive") == [POS]


@pytest.mark.slow
def test_token_ids_match_reference_bpe(tok, reference_bpe):
    mismatches = []
    for s in CORPUS:
        ours, ref = tok(s)["input_ids"], reference_bpe.encode(s)
        if ours != ref:
            mismatches.append((s, ours, ref))
    assert not mismatches, f"{len(mismatches)}/{len(CORPUS)} strings differ, first: {mismatches[:3]}"


@pytest.mark.slow
def test_decode_roundtrip(tok, reference_bpe):
    checked = 0
    for s in CORPUS:
        ids = tok(s)["input_ids"]
        if any(c in DROPPED_CHARS or ord(c) >= 0x40000 for c in s):
            continue  # not representable; covered below
        assert tok.decode(ids) == s, (s, ids)
        assert reference_bpe.decode(ids) == s, (s, ids)
        checked += 1
    assert checked >= 400


@pytest.mark.slow
def test_unrepresentable_control_chars_are_dropped(tok):
    """Documents a property of the SmolLM2 vocabulary, not a choice of ours: six ASCII control bytes have no token
    and are silently dropped (no unk id), exactly like llama.cpp does."""
    # the control char still separates pre-tokens ("a", "\x04", "b", ...), then vanishes: a, b, c stay unmerged
    assert tok("a\x04b\x1dc")["input_ids"] == [tok.convert_tokens_to_ids(c) for c in "abc"] != tok("abc")["input_ids"]
    assert tok.decode(tok("a\x04b")["input_ids"]) == "ab"
    assert 0 not in tok("".join(DROPPED_CHARS))["input_ids"] and tok(DROPPED_CHARS)["input_ids"] == []


# ---- 4. the materialised model equals transformers' direct GGUF load ------------------------------------------

@pytest.mark.slow
def test_config_facts(model, model_dir):
    c = model.config
    assert c.model_type == "llama"
    assert c.num_hidden_layers == 30 and c.hidden_size == 576
    assert c.num_attention_heads == 9 and c.num_key_value_heads == 3 and c.head_dim == 64
    assert c.intermediate_size == 1536 and c.vocab_size == 49152
    assert float(c.rope_theta) == 100000.0
    assert c.tie_word_embeddings is True
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert c.hidden_act == "silu" and c.max_position_embeddings == 8192
    assert abs(c.rms_norm_eps - 1e-5) < 1e-10
    assert all(p.dtype == torch.float32 for p in model.parameters())
    names = {p.name for p in Path(model_dir).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names


@pytest.mark.slow
def test_state_dict_identical_to_transformers_gguf_load(model, gguf_model):
    ours, theirs = model.state_dict(), gguf_model.state_dict()
    assert sorted(ours) == sorted(theirs)
    assert len(ours) == 30 * 9 + 3  # 9 tensors per layer + embeddings, final norm, (tied) lm_head
    for k in ours:
        assert ours[k].shape == theirs[k].shape, k
        assert ours[k].dtype == theirs[k].dtype == torch.float32, k
        assert (ours[k] - theirs[k]).abs().max().item() == 0.0, k


PROMPTS = [
    "a gorgeous , witty , seductive movie .\nQuestion: Is this sentence positive or negative?\nAnswer: positive",
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
    "Ünïcödé 中文 😀 and\ttabs  and digits 3141592653",
]


@pytest.mark.slow
def test_logprobs_identical_to_transformers_gguf_load(tok, model, gguf_model):
    for p in PROMPTS:
        ids = torch.tensor([tok(p)["input_ids"]])
        with torch.no_grad():
            a = torch.log_softmax(model(ids).logits.float(), dim=-1)
            b = torch.log_softmax(gguf_model(ids).logits.float(), dim=-1)
        assert a.shape == (1, ids.shape[1], 49152)
        assert torch.isfinite(a).all()
        assert (a - b).abs().max().item() == 0.0, p


@pytest.mark.slow
def test_model_is_sane(tok, model):
    """Guard against both loaders being wrong in the same way: the model must actually know things."""
    ids = torch.tensor([tok("The capital of France is")["input_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, -1], dim=-1)
    assert int(logp.argmax()) == tok.encode(" Paris")[0]


# ---- 5. the rotary un-permutation is load-bearing -------------------------------------------------------------

def llama_cpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py `permute` (HF -> GGUF row order), written independently of the adapter."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.fixture(scope="module")
def raw_qk(gguf_meta):
    """q/k weights of a few layers dequantised straight from the GGUF, WITHOUT undo_rope_permute."""
    from gguf.quants import dequantize

    reader, _ = gguf_meta
    wanted = {f"blk.{i}.attn_{x}.weight" for i in (0, 1, 15, 29) for x in ("q", "k")}
    out = {}
    for t in reader.tensors:
        if t.name in wanted:
            arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            out[t.name] = arr.reshape(tuple(int(d) for d in reversed(t.shape)))
    assert set(out) == wanted
    return out


@pytest.mark.slow
def test_rope_unpermute_changes_q_and_k(raw_qk, model, gguf_meta):
    _, meta = gguf_meta
    n_head, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    sd = model.state_dict()
    for name, raw in raw_qk.items():
        layer, kind = int(name.split(".")[1]), name.split(".")[2][-1]
        heads = n_head if kind == "q" else n_kv
        hf = sd[f"model.layers.{layer}.self_attn.{kind}_proj.weight"].numpy()
        assert raw.shape == hf.shape == ((576, 576) if kind == "q" else (192, 576))
        # skipping the un-permutation gives different weights: this fails if the adapter drops it
        assert not np.array_equal(raw, hf), name
        assert np.abs(raw - hf).max() > 1e-2, name
        # ... and it is exactly the un-permutation that makes the difference, in both directions
        assert np.array_equal(adapter.undo_rope_permute(raw, heads), hf), name
        assert np.array_equal(llama_cpp_permute(hf, heads), raw), name
        # the permutation only reorders rows: the same values, in another order
        assert np.array_equal(np.sort(raw, axis=None), np.sort(hf, axis=None)), name


@pytest.mark.slow
def test_rope_unpermute_matters_for_outputs(tok, model, raw_qk):
    """Swapping the un-permuted q/k back in for one layer visibly moves the next-token log-probabilities."""
    ids = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    layer = model.model.layers[0].self_attn
    saved_q, saved_k = layer.q_proj.weight.data.clone(), layer.k_proj.weight.data.clone()
    try:
        with torch.no_grad():
            good = torch.log_softmax(model(ids).logits, dim=-1)
            layer.q_proj.weight.data.copy_(torch.from_numpy(raw_qk["blk.0.attn_q.weight"]))
            layer.k_proj.weight.data.copy_(torch.from_numpy(raw_qk["blk.0.attn_k.weight"]))
            bad = torch.log_softmax(model(ids).logits, dim=-1)
    finally:
        layer.q_proj.weight.data.copy_(saved_q)
        layer.k_proj.weight.data.copy_(saved_k)
    assert (good - bad).abs().max().item() > 1e-3
    with torch.no_grad():
        assert torch.equal(torch.log_softmax(model(ids).logits, dim=-1), good)  # restored


# ---- the GGUF metadata checks (no model, no GGUF file) ---------------------------------------------------------

GOOD_META = {**adapter.TOKENIZER_META,
             "tokenizer.ggml.tokens": [adapter.UNK_TOKEN, adapter.BOS_TOKEN, adapter.EOS_TOKEN]}


@pytest.mark.parametrize("field,value,message", [
    ("tokenizer.ggml.model", "llama", "GGUF metadata tokenizer.ggml.model: expected 'gpt2', found 'llama'"),
    ("tokenizer.ggml.pre", "llama-bpe", "GGUF metadata tokenizer.ggml.pre: expected 'smollm', found 'llama-bpe'"),
    ("tokenizer.ggml.add_bos_token", True,
     "GGUF metadata tokenizer.ggml.add_bos_token: expected False, found True"),
    ("tokenizer.ggml.eos_token_id", 0, "GGUF metadata tokenizer.ggml.eos_token_id: expected 2, found 0"),
    ("tokenizer.ggml.padding_token_id", None,
     "GGUF metadata tokenizer.ggml.padding_token_id: expected 2, found '(missing)'"),
    ("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>"],
     "GGUF metadata tokenizer.ggml.tokens[0]: expected '<|endoftext|>', found '<unk>'"),
])
def test_gguf_metadata_is_checked_field_by_field(field, value, message):
    meta = {k: v for k, v in GOOD_META.items() if k != field or value is not None}
    if value is not None:
        meta[field] = value
    with pytest.raises(adapter.AdapterError) as caught:
        adapter.build_tokenizer(meta)
    assert str(caught.value) == message
    adapter.check_tokenizer_meta(GOOD_META)  # the good metadata passes


def test_gguf_metadata_check_survives_python_O():
    """The checks are not asserts: under `python -O` (which removes asserts) a wrong pre-tokenizer is still refused
    with the same one line."""
    code = ("import sys, adapter\n"
            "assert False, 'asserts are on'\n"  # proves -O is in force: this line is dropped
            "meta = {**adapter.TOKENIZER_META, 'tokenizer.ggml.pre': 'llama-bpe'}\n"
            "try:\n"
            "    adapter.build_tokenizer(meta)\n"
            "except adapter.AdapterError as e:\n"
            "    print(sys.flags.optimize, e)\n")
    proc = subprocess.run([sys.executable, "-O", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1 GGUF metadata tokenizer.ggml.pre: expected 'smollm', found 'llama-bpe'"


def test_materialising_a_gguf_of_another_tokenizer_is_refused_before_anything_is_written(tmp_path):
    """A real (tiny, tensorless) GGUF file whose pre-tokenizer is not `smollm`: materialise_from_gguf, what
    prepare.py calls, stops on the metadata line (prepare.py reports it as one line naming the file) before it
    dequantises or writes anything."""
    from gguf import GGUFWriter

    path = tmp_path / "other.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", "llama-bpe")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(adapter.AdapterError) as caught:
        adapter.materialise_from_gguf(path, tmp_path / "out")
    assert str(caught.value) == "GGUF metadata tokenizer.ggml.pre: expected 'smollm', found 'llama-bpe'"
    assert list((tmp_path / "out").iterdir()) == []
