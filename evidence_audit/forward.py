"""The forward level: every candidate score of a multiple-choice record recomputed from the model's weights, in
the dtype the evidence was scored in, and compared with both recorded paths.

Two implementations, named in every row:
- audit.py's own Llama (torch + safetensors only), written from the architecture's definition: token embedding;
  per layer x += attn(rmsnorm(x)), x += mlp(rmsnorm(x)); final rmsnorm; logits = x @ head^T. Rotary embeddings use
  the half-rotation layout, as Hugging Face's Llama does. In bfloat16 / float16 it rounds where Hugging Face's
  Llama rounds (own_llama_batch), and its logits for a padded batch equal transformers' bit for bit
  (tests/test_forward_dtypes.py, tiny model; the real model in the figures under TOLERANCE).
- any other architecture (GPT-2, Qwen2, Mistral, Gemma, Phi-3, GPT-NeoX, ...): transformers' own class for it,
  loaded from safetensors with eager attention and no custom code (hflm.load_transformers). That re-runs the
  runner's implementation, so it catches scores that are not what that implementation gives for these weights and
  ids, not a bug it shares.

Modes: float32 evidence of a model the own Llama covers is re-scored one unpadded sequence per pass (tolerance 1e-4
for the padded batches the paths ran); everything else in lm-eval's batches (hflm.py: the audit's one reading of
HFLM, which `audit.py --lm-eval` uses too) at the evidence's official_batch_size, in its dtype, so equality can be
expected; bfloat16 / float16 also in float32 beside it, as a figure (how far the dtype moved the scores and
predictions), not a check.
"""
import math
import time
from pathlib import Path

from evidence_audit.checks import FORWARD, MISSING, expect, get, short
from evidence_audit.definitions import argmax_first
from evidence_audit.hflm import NoTransformers, Scorer, load_transformers, score_requests
from evidence_audit.llama_config import llama_hparams
from evidence_audit.model_files import check_model_dir, is_local, rehash_problems
from evidence_audit.reading import read_json, sha256_file
from evidence_audit.sampling import sample_records

# max |recomputed - recorded| per candidate score (nats) where equality is not expected (another CPU, kernel path,
# thread count, transformers or padding than the run's), per scored dtype; each is twice the largest difference
# measured (docs/forward-dtypes.md has the tables and commands): float32 3.2e-5 (the same batches on an AMD EPYC with
# AVX2 and an Intel Xeon with AVX-512; a row alone vs in a padded batch: 6.9e-5 on an AVX-512 Xeon), so 1e-4;
# bfloat16 0.5 (an AMD EPYC run re-scored on the Xeon restricted to SSE4.2; 0.375 at its default kernels), so 1.0;
# float16 0.055 (the Xeon's kernel paths against each other) and 0.06 (a row alone vs in a padded batch), so 0.12.
TOLERANCE = {"float32": 1e-4, "bfloat16": 1.0, "float16": 0.12}
# How far honest noise moves the margin between two choices of one document (their scores share the context, so
# the margin moves less than either score): a flipped prediction whose recomputed margin is within it is a near-tie
# (named, not failed), past it a failure. Each is twice the largest margin change measured between CPUs and kernel
# paths (docs/forward-dtypes.md, tools/measure_kernel_paths.py): float32 1.3e-5 (kept at the score tolerance),
# bfloat16 0.125, float16 0.0156 (this Xeon's kernel paths; no float16 run from another CPU was measured), so 0.05.
MARGIN_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.25, "float16": 0.05}
# A systematic shift: honest differences between kernels average out, an edit that moves every score one way does
# not. The mean signed difference (recorded - recomputed) must lie within SHIFT_FLOOR[dtype] + SHIFT_Z standard
# errors; the floor is twice the largest |mean| measured between CPUs, kernel paths and thread counts on the same
# requests (docs/forward-dtypes.md, tools/measure_kernel_paths.py).
SHIFT_FLOOR = {"float32": 2e-5, "bfloat16": 0.07, "float16": 0.01}
SHIFT_Z = 4
FORWARD_TOL = TOLERANCE["float32"]   # the float32 figure, which the other forward checks (extraction, lm-eval) use

_MODELS = {}
_WEIGHTS = {}  # (model key, dtype) -> the weights cast to that dtype
_SCORES = {}  # (model key, input ids) -> log-softmax rows; a forward pass is a pure function of weights and ids


def use_threads(n):
    """torch intra-op threads for the forward passes (--threads: C.options.threads; imported here: the arithmetic
    level never imports torch)."""
    import torch
    torch.set_num_threads(n)


def forget_scores(model, ids):
    """Drop the cached log-softmax rows of one input (a long generation is scored once; do not keep 20 MB each)."""
    _SCORES.pop((model[0], tuple(ids)), None)


def load_llama(model_dir):
    """(model, None) for a plain Llama in model_dir (weights as float32 from model.safetensors or every shard of its
    index, cached per file), or (None, why not)."""
    import torch
    from safetensors.torch import load_file

    paths = check_model_dir(model_dir)      # model.safetensors or its shards, each inside model_dir
    if not paths:
        return None, f"{model_dir} holds neither model.safetensors nor model.safetensors.index.json"
    cfg = Path(model_dir) / "config.json"
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in [cfg, *paths])   # config.json too: a
    if key not in _MODELS:                                                                  # relabelled head is new
        why = supports_own(model_dir)
        if why:
            return None, f"audit.py's forward pass supports plain Llama only; {why}"
        hp = llama_hparams(read_json(cfg))
        W = {}
        for path in paths:
            W.update({k: v.to(torch.float32) for k, v in load_file(str(path)).items()})
        _MODELS[key] = (key, hp, W)
    return _MODELS[key], None


def llama_logprobs(model, ids):
    """log_softmax of the next-token logits at every position of `ids` ([len(ids), vocab], float32)."""
    import torch

    key, hp, W = model
    cache_key = (key, tuple(ids))
    if cache_key in _SCORES:
        return _SCORES[cache_key]
    nh, nkv, hd = hp["num_attention_heads"], hp["num_key_value_heads"], hp["head_dim"]
    eps, theta = hp["rms_norm_eps"], hp["rope_theta"]
    T = len(ids)

    def rmsnorm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)

    with torch.no_grad():
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]      # [T, hd/2]
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # [T, hd]
        causal = torch.full((T, T), float("-inf")).triu(1)
        x = W["model.embed_tokens.weight"][torch.tensor(ids)]                            # [T, d]
        for layer in range(hp["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rmsnorm(x, W[p + "input_layernorm.weight"])
            q = (h @ W[p + "self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)    # [nh, T, hd]
            k = (h @ W[p + "self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)   # [nkv, T, hd]
            v = (h @ W[p + "self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = k.repeat_interleave(nh // nkv, dim=0), v.repeat_interleave(nh // nkv, dim=0)  # grouped-query
            att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + causal, dim=-1)
            o = (att @ v).transpose(0, 1).reshape(T, nh * hd)
            x = x + o @ W[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
            gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
        x = rmsnorm(x, W["model.norm.weight"])
        head = W["model.embed_tokens.weight"] if hp["tie_word_embeddings"] or "lm_head.weight" not in W \
            else W["lm_head.weight"]
        out = torch.log_softmax(x @ head.T, dim=-1)
    _SCORES[cache_key] = out
    return out


# ---- the batched pass in a scored dtype --------------------------------------------------------------------------

TORCH_DTYPES = ("float32", "bfloat16", "float16")


def supports_own(model_dir):
    """None when audit.py's own Llama pass covers the model in model_dir, else the reason it does not (every field
    read with transformers' LlamaConfig default: llama_config.py)."""
    raw = read_json(Path(model_dir) / "config.json")
    if not (isinstance(raw, dict) and raw.get("model_type") == "llama"):
        return f"this model has model_type={raw.get('model_type') if isinstance(raw, dict) else None!r}"
    try:
        hp = llama_hparams(raw)
    except ValueError as e:
        return str(e)
    unsupported = [f"{k}={hp[k]!r}" for k, ok in (
        ("rope_scaling", hp["rope_scaling"] is None), ("hidden_act", hp["hidden_act"] == "silu"),
        ("attention_bias", not hp["attention_bias"]), ("mlp_bias", not hp["mlp_bias"])) if not ok]
    return f"this model has {', '.join(unsupported)}" if unsupported else None


ATTENTIONS = ("eager", "sdpa")      # the attention implementations the own Llama pass computes as transformers does


def own_llama_batch(model, ids, dtype, attention="eager"):
    """Logits [B, T, vocab] of the padded batch `ids` (LongTensor [B, T], no attention mask: the causal mask keeps
    every real position from the pads after it) from the audit's own Llama, in `dtype`. Where the dtype's rounding
    depends on the order of operations it follows the definition as Hugging Face's Llama computes it: rmsnorm in
    float32 and cast back before the weight; rotary cos/sin in float32, cast; every projection a linear layer in the
    dtype. Attention `eager`: logits scaled in the dtype, their softmax in float32, cast, the causal mask as -inf;
    `sdpa`: torch's scaled_dot_product_attention on the same q, k, v (is_causal, no mask, grouped-query heads
    shared), as transformers' sdpa attention calls it for an unmasked batch (lm-eval passes no attention mask)."""
    import torch
    import torch.nn.functional as F

    key, hp, W32 = model
    wkey = (key, dtype)
    if wkey not in _WEIGHTS:
        _WEIGHTS[wkey] = {k: v.to(getattr(torch, dtype)) for k, v in W32.items()}
    W = _WEIGHTS[wkey]
    nh, nkv, hd = hp["num_attention_heads"], hp["num_key_value_heads"], hp["head_dim"]
    eps, theta = hp["rms_norm_eps"], hp["rope_theta"]
    B, T = ids.shape

    def rmsnorm(x, w):
        x32 = x.to(torch.float32)
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def rotate_half(x):
        return torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)

    with torch.no_grad():
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = (inv_freq[None, :, None] @ torch.arange(T, dtype=torch.float32)[None, None, :]).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x_dtype(W))[:, None], emb.sin().to(x_dtype(W))[:, None]      # [1, 1, T, hd]
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        x = F.embedding(ids, W["model.embed_tokens.weight"])                               # [B, T, d]
        for layer in range(hp["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rmsnorm(x, W[p + "input_layernorm.weight"])
            q = F.linear(h, W[p + "self_attn.q_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)  # [B, nh, T, hd]
            k = F.linear(h, W[p + "self_attn.k_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
            v = F.linear(h, W[p + "self_attn.v_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            if attention == "sdpa":     # torch's fused kernel, grouped-query heads shared, causal without a mask
                o = F.scaled_dot_product_attention(q, k, v, scale=hd ** -0.5, is_causal=T > 1, enable_gqa=nh != nkv)
                o = o.transpose(1, 2).contiguous().reshape(B, T, -1)
            else:
                k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # grouped-query
                att = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5
                att = torch.softmax(att.to(torch.float32).masked_fill(causal, float("-inf")), dim=-1).to(q.dtype)
                o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, -1)
            x = x + F.linear(o, W[p + "self_attn.o_proj.weight"])
            h = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
            gate, up = F.linear(h, W[p + "mlp.gate_proj.weight"]), F.linear(h, W[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(gate) * up, W[p + "mlp.down_proj.weight"])
        x = rmsnorm(x, W["model.norm.weight"])
        head = W["model.embed_tokens.weight"] if hp["tie_word_embeddings"] or "lm_head.weight" not in W \
            else W["lm_head.weight"]
        return F.linear(x, head)


def x_dtype(W):
    """The dtype the weights (and so the activations) are in."""
    return W["model.embed_tokens.weight"].dtype


def load_scorer(model_dir, dtype, attention="eager", device="cpu"):
    """(Scorer, None) for the model in model_dir in `dtype` with `attention` (ATTENTIONS) on `device`: the audit's
    own Llama pass when it covers the model (cpu only), else transformers' implementation named by config.json
    (hflm.load_transformers: never custom code, safetensors only); or (None, why not)."""
    own = supports_own(model_dir)
    if own is None and device == "cpu":
        model, why = load_llama(model_dir)
        if model is None:
            return None, why
        label = "audit.py's own Llama forward" + (f" ({attention} attention)" if attention != "eager" else "")
        return Scorer(label, dtype, lambda ids: own_llama_batch(model, ids, dtype, attention)), None
    try:
        return load_transformers(model_dir, dtype, attention, device)
    except NoTransformers as e:
        what = f"not the audit's own architecture ({own})" if own else f"on {device} (the own Llama pass is cpu only)"
        return None, f"{what} and transformers is absent ({e})"


# ---- the level --------------------------------------------------------------------------------------------------

FORWARD_CHECKS = ("candidate scores vs both paths", "predictions (argmax) vs both paths", "lm-eval is_greedy")


def model_for_forward(C, name, ident, tokens, model_dir):
    """Row "model file (...)": the cached weights are the ones identity.json names. Returns (mode, scorer, beside)
    -- the re-scoring mode, the Scorer in the evidence's dtype and (for bfloat16 / float16) the float32 Scorer run
    beside it -- or None after SKIPPED rows for FORWARD_CHECKS saying why (no model, no verified token ids, no
    torch, a dtype or batch size it cannot read)."""
    st = Path(model_dir) / "model.safetensors" if model_dir else None
    sharded = is_local(ident) and st is not None and (Path(model_dir) / "model.safetensors.index.json").exists()
    if st is None or not (st.exists() or sharded) or not (Path(model_dir) / "config.json").exists():
        for check in ("model file",) + FORWARD_CHECKS:
            C.skip(name, FORWARD, check, f"model not found ({st}); pass --cache with the prepared cache (a local "
                   "model: --model DIR)")
        return None
    bad = []
    if is_local(ident):     # a local --model directory: every file it had, re-hashed
        rehash_problems(bad, model_dir, ident, sorted(ident.get("model_files") or {}))
        C.add(name, FORWARD, "model files (sha256 of each == identity.json model_files)", 1, bad)
    else:
        expect(bad, str(st), "sha256", sha256_file(st), ident.get("model_sha256", MISSING) if ident else MISSING,
               "identity.json model_sha256: the cached weights are not the ones the evidence names")
        C.add(name, FORWARD, "model file (sha256 == identity.json model_sha256)", 1, bad)
    loaded, why = None, ("needs the identity level's verified token ids (private texts + tokenizer), which were "
                         "unavailable or failed")
    dtype = get(ident, "scoring_config.dtype") if ident else MISSING
    dtype = "float32" if dtype is MISSING else dtype
    size = get(ident, "scoring_config.official_batch_size") if ident else MISSING
    if dtype not in TORCH_DTYPES:
        tokens, why = None, f"the evidence was scored in {short(dtype)}; audit.py re-scores {', '.join(TORCH_DTYPES)}"
    elif dtype != "float32" and not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
        tokens, why = None, (f"the evidence was scored in {dtype} but names no usable official_batch_size "
                             f"({short(size)}); a {dtype} score is re-scored in lm-eval's batches only")
    if tokens is not None:
        try:
            use_threads(C.options.threads)
            loaded, why = choose_mode(model_dir, dtype, size)
        except ImportError as e:
            why = f"cannot import torch/safetensors ({e})"
    if loaded is None:
        for check in FORWARD_CHECKS:
            C.skip(name, FORWARD, check, why)
    return loaded


def choose_mode(model_dir, dtype, size):
    """((mode, scorer, beside), None) or (None, why). float32 evidence of a model the audit's own Llama covers:
    one unpadded sequence per pass (its 1e-4 tolerance allows for the padded batches the paths ran). Anything else:
    lm-eval's batches at official_batch_size in the evidence's dtype, and for bfloat16 / float16 the float32
    pass one unpadded sequence at a time beside it (a figure: how far the dtype moved the scores)."""
    scorer, why = load_scorer(model_dir, dtype)
    if scorer is None:
        return None, why
    if dtype == "float32" and supports_own(model_dir) is None:
        return ("one unpadded sequence per pass", scorer, None), None
    beside = None
    if dtype != "float32":
        beside, why = load_scorer(model_dir, "float32")
        if beside is None:
            return None, why
    return (f"lm-eval's batches of {size}", scorer, beside), None

def candidate_scores(model, ctx_ids, cand_lists):
    """Each candidate's summed log-probability given the context, and whether every candidate token is the
    argmax at its position (lm-eval's is_greedy)."""
    import torch

    scores, greedy = [], []
    for cand_ids in cand_lists:
        ids = ctx_ids + cand_ids
        if len(ids) > 1 and cand_ids:
            lp = llama_logprobs(model, ids[:-1])                   # position t predicts token t+1
            rows = lp[len(ctx_ids) - 1:len(ctx_ids) - 1 + len(cand_ids)]
            picked = rows.gather(1, torch.tensor(cand_ids).unsqueeze(1)).squeeze(1)
            scores.append(float(picked.sum()))
            greedy.append(bool((rows.argmax(dim=-1) == torch.tensor(cand_ids)).all()))
        else:
            scores.append(float("nan"))
            greedy.append(False)
    return scores, greedy


def spread(values):
    """max, 99th percentile and median of non-negative figures, by nearest rank (the value at rank ceil(p*n) of
    the sorted list; the median is the lower middle value), each a value that occurred."""
    v = sorted(values)
    if not v:
        return {"max": 0.0, "p99": 0.0, "median": 0.0}
    return {"max": v[-1], "p99": v[math.ceil(0.99 * len(v)) - 1], "median": v[math.ceil(0.5 * len(v)) - 1]}


def spread_text(f):
    return f"max {f['max']:.3g}, p99 {f['p99']:.3g}, median {f['median']:.3g}"


def compare_scores(records, recomputed, key_of, where_of, pred_field, tol, bad, margin_tol=None):
    """Every recorded score of both paths against `recomputed` ({key: [(score, greedy)] per candidate}); a score
    over `tol` appended to `bad` (when bad is not None). Returns the figures: per path the spread of |diff|, the
    worst candidate, the items moved past tol, the predictions and is_greedy that the recomputed scores flip."""
    diffs, signed = {"official": [], "independent": []}, []
    worst, moved, flips, greedy_flips = None, set(), {"official": [], "independent": []}, []
    near, near_tie = [], margin_tol if margin_tol is not None else tol
    for r in records:
        w, got = where_of(r), recomputed[key_of(r)]
        scores = [s for s, _ in got]
        for side in ("official", "independent"):
            for j, (s_new, s_rec) in enumerate(zip(scores, r[side]["scores"])):
                d = abs(s_new - s_rec)
                diffs[side].append(d)
                if side == "official":
                    signed.append(s_rec - s_new)
                if worst is None or d > worst["abs_diff"]:
                    worst = {"abs_diff": d, "idx": r["idx"], "path": side, "candidate": j}
                if not d <= tol:
                    moved.add(w)
                    if bad is not None:
                        bad.append(f"{w} {side}.scores[{j}]: recorded {s_rec!r}, recomputed {s_new!r} "
                                   f"(|diff| {d:.3g} > tolerance {tol:g})")
            pred, best = r[side][pred_field], argmax_first(scores)
            if pred != best and math.isfinite(tol) and isinstance(pred, int) and 0 <= pred < len(scores) \
                    and scores[best] - scores[pred] <= near_tie:     # within what noise moves a margin
                near.append(f"{w} {side}.{pred_field} (recomputed margin {scores[best] - scores[pred]:.3g})")
            elif pred != best:
                flips[side].append(w)
        if r["official"]["is_greedy"] != [g for _, g in got]:
            greedy_flips.append(w)
    mean, sd = mean_sd(signed)
    return {"official": spread(diffs["official"]), "independent": spread(diffs["independent"]), "worst": worst,
            "moved_past_tolerance": sorted(moved), "argmax_flips": flips, "is_greedy_flips": greedy_flips,
            "near_ties": near, "mean_signed_diff": mean, "sd_signed_diff": sd}


def mean_sd(values):
    """The mean and the sample standard deviation of `values` (0.0 for what too few values leave undefined)."""
    n = len(values)
    mean = sum(values) / n if n else 0.0
    return mean, math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1)) if n > 1 else 0.0


def shift_problem(n, mean, sd, dtype, tol):
    """A line when the mean signed difference `mean` of n scores (standard deviation sd) is past SHIFT_FLOOR[dtype]
    + SHIFT_Z standard errors (tol 0: equality, any mean but 0), else None."""
    bound = 0.0 if not tol else SHIFT_FLOOR[dtype] + SHIFT_Z * sd / math.sqrt(max(n, 1))
    if abs(mean) <= bound:
        return None
    return (f"mean of recorded - recomputed {mean:+.3g} (sd {sd:.3g}, {n} scores) past {bound:.3g} "
            f"({SHIFT_FLOOR[dtype]:g} + {SHIFT_Z} standard errors): the scores are shifted, not noisy")


def rescore(scorer, records, tokens, key_of, batch_size):
    """{key: [(score, greedy)] per candidate} for every record, scored in lm-eval's batches of batch_size over
    all the records' requests together (batch_size 1: one unpadded sequence per pass): hflm.score_requests."""
    requests, owner = [], []
    for r in records:
        ctx, cands = tokens[key_of(r)]
        for cand in cands:
            requests.append((ctx, cand))
            owner.append(key_of(r))
    out = {}
    for k, got in zip(owner, score_requests(scorer.logits, requests, batch_size)):
        out.setdefault(k, []).append(got)
    return out


def audit_candidate_scores(C, name, ident, records, tokens, model_dir, key_of=lambda r: r["idx"],
                           where_of=lambda r: f"idx {r['idx']}", pred_field="pred"):
    """The forward level of a multiple-choice experiment whose records carry idx, candidates, official and
    independent scores and `pred_field`, and official.is_greedy (protocol, MC-TACO, options): rows FORWARD_CHECKS.
    `tokens` maps key_of(record) to the identity level's verified (context ids, [candidate ids]). The evidence's
    dtype is re-scored in that dtype against TOLERANCE[dtype]; a flipped prediction or is_greedy fails whatever
    the score difference. Returns the figures it measured (for audit.json), or None."""
    loaded = model_for_forward(C, name, ident, tokens, model_dir)
    if loaded is None:
        return None
    import torch

    records, covered, drawn = sample_records(C.options.sample, name, records, key_of)
    mode, scorer, beside = loaded
    dtype, tol = scorer.dtype, TOLERANCE[scorer.dtype]
    size = 1 if mode.startswith("one unpadded") else get(ident, "scoring_config.official_batch_size")
    t0 = time.perf_counter()
    bad_scores = []
    main = compare_scores(records, rescore(scorer, records, tokens, key_of, size), key_of, where_of, pred_field,
                          tol, bad_scores, MARGIN_TOLERANCE[dtype])
    shifted = shift_problem(sum(len(r["candidates"]) for r in records), main["mean_signed_diff"],
                            main["sd_signed_diff"], dtype, tol)
    if shifted:
        bad_scores.append(shifted)
    figures = {"mode": mode, "implementation": scorer.label, "dtype": dtype, "tolerance": tol,
               "max_abs_diff_official": main["official"]["max"], "max_abs_diff_independent": main["independent"]["max"],
               **main}
    note = (f"{dtype}, {scorer.label}, {mode}; |recomputed - official| {spread_text(main['official'])}, "
            f"|recomputed - independent| {spread_text(main['independent'])} (tolerance {tol:g}); "
            f"{len(main['moved_past_tolerance'])} item(s) past it; mean of recorded - recomputed "
            f"{main['mean_signed_diff']:+.3g}; {covered}")
    figures["sample"] = drawn
    if beside is not None:
        b = compare_scores(records, rescore(beside, records, tokens, key_of, 1), key_of, where_of, pred_field,
                           math.inf, None)
        figures["float32_beside"] = {"implementation": beside.label, "mode": "one unpadded sequence per pass", **b}
        note += (f"; float32 beside it (one unpadded sequence per pass, a figure, not a check): |float32 - "
                 f"official| {spread_text(b['official'])}, argmax flips {len(b['argmax_flips']['official'])}, "
                 f"is_greedy flips {len(b['is_greedy_flips'])}")
    bad_pred = [f"{w} {side}.{pred_field}: the recorded prediction is not the argmax of the recomputed {dtype} "
                "scores (a flipped prediction)" for side in ("official", "independent")
                for w in main["argmax_flips"][side]]
    bad_greedy = [f"{w} official.is_greedy: recorded value differs from the recomputed {dtype} greedy check"
                  for w in main["is_greedy_flips"]]
    C.add(name, FORWARD, FORWARD_CHECKS[0], sum(len(r["candidates"]) for r in records), bad_scores, note=note)
    ties = (f"; near-ties (recomputed margin within {MARGIN_TOLERANCE[dtype]:g}, not failed): "
            f"{', '.join(main['near_ties'])}") if main["near_ties"] else ""
    C.add(name, FORWARD, FORWARD_CHECKS[1], len(records), bad_pred,
          note=f"{len(bad_pred)} flip(s) against the {dtype} re-score{ties}")
    C.add(name, FORWARD, FORWARD_CHECKS[2], len(records), bad_greedy,
          note=f"{len(bad_greedy)} flip(s) against the {dtype} re-score")
    figures.update(seconds=round(time.perf_counter() - t0, 2), threads=torch.get_num_threads())
    return figures


def two_path_forward(C, name, ev, records, tokens, model_dir):
    """audit_candidate_scores for records keyed and named by idx (protocol, MC-TACO), in shared.run_levels' form."""
    return audit_candidate_scores(C, name, ev["identity"], records, tokens, model_dir)
