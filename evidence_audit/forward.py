"""The forward level: audit.py's own float32 Llama forward pass (torch + safetensors only), and the check that
recomputes every candidate score of a multiple-choice record with it.

A minimal Llama written from the architecture's definition: token embedding; per layer x += attn(rmsnorm(x)),
x += mlp(rmsnorm(x)); final rmsnorm; logits = x @ embed^T (tied). Rotary embeddings use the half-rotation layout
(the two halves of each head dimension form the pairs), as Hugging Face's Llama does.
"""
import math
import time
from pathlib import Path

from evidence_audit.checks import FORWARD, MISSING, expect, get
from evidence_audit.definitions import argmax_first
from evidence_audit.model_files import is_local, rehash_problems
from evidence_audit.reading import read_json, sha256_file

FORWARD_TOL = 1e-4          # max |recomputed - recorded| per candidate score (nats) for the forward level to pass

_MODELS = {}
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
    """(model, None) for a plain Llama in model_dir (weights as float32, cached per file), or (None, why not)."""
    import torch
    from safetensors.torch import load_file

    path = Path(model_dir) / "model.safetensors"
    key = (str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns)
    if key not in _MODELS:
        hp = read_json(Path(model_dir) / "config.json")
        unsupported = [f"{k}={hp.get(k)!r}" for k, ok in (
            ("model_type", hp.get("model_type") == "llama"), ("rope_scaling", hp.get("rope_scaling") is None),
            ("hidden_act", hp.get("hidden_act") == "silu"), ("attention_bias", not hp.get("attention_bias")),
            ("mlp_bias", not hp.get("mlp_bias"))) if not ok]
        if unsupported:
            return None, f"audit.py's forward pass supports plain Llama only; this model has {', '.join(unsupported)}"
        W = {k: v.to(torch.float32) for k, v in load_file(str(path)).items()}
        _MODELS[key] = (key, hp, W)
    return _MODELS[key], None


def llama_logprobs(model, ids):
    """log_softmax of the next-token logits at every position of `ids` ([len(ids), vocab], float32)."""
    import torch

    key, hp, W = model
    cache_key = (key, tuple(ids))
    if cache_key in _SCORES:
        return _SCORES[cache_key]
    d, nh, nkv = hp["hidden_size"], hp["num_attention_heads"], hp["num_key_value_heads"]
    hd = hp.get("head_dim") or d // nh
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
        head = W["model.embed_tokens.weight"] if hp.get("tie_word_embeddings", True) or "lm_head.weight" not in W \
            else W["lm_head.weight"]
        out = torch.log_softmax(x @ head.T, dim=-1)
    _SCORES[cache_key] = out
    return out


FORWARD_CHECKS = ("candidate scores vs both paths", "predictions (argmax) vs both paths", "lm-eval is_greedy")


def model_for_forward(C, name, ident, tokens, model_dir):
    """Row "model file (...)": the cached weights are the ones identity.json names. Returns the loaded model, or
    None after SKIPPED rows for FORWARD_CHECKS saying why (no model, no verified token ids, no torch)."""
    st = Path(model_dir) / "model.safetensors" if model_dir else None
    if st is None or not st.exists() or not (Path(model_dir) / "config.json").exists():
        for check in ("model file",) + FORWARD_CHECKS:
            C.skip(name, FORWARD, check, f"model not found ({st}); pass --cache with the prepared cache")
        return None
    bad = []
    if is_local(ident):     # a local --model directory: every file it had, re-hashed
        rehash_problems(bad, model_dir, ident, sorted(ident.get("model_files") or {}))
        C.add(name, FORWARD, "model files (sha256 of each == identity.json model_files)", 1, bad)
    else:
        expect(bad, str(st), "sha256", sha256_file(st), ident.get("model_sha256", MISSING) if ident else MISSING,
               "identity.json model_sha256: the cached weights are not the ones the evidence names")
        C.add(name, FORWARD, "model file (sha256 == identity.json model_sha256)", 1, bad)
    model, why = None, ("needs the identity level's verified token ids (private texts + tokenizer), which were "
                        "unavailable or failed")
    dtype = get(ident, "scoring_config.dtype") if ident else MISSING
    if dtype not in ("float32", MISSING):
        model, why, tokens = None, (f"the evidence was scored in {dtype}; audit.py's forward pass is float32 only, "
                                    f"and its tolerance {FORWARD_TOL:g} does not apply to {dtype} scores"), None
    if tokens is not None:
        try:
            use_threads(C.options.threads)
            model, why = load_llama(model_dir)
        except ImportError as e:
            why = f"cannot import torch/safetensors ({e})"
    if model is None:
        for check in FORWARD_CHECKS:
            C.skip(name, FORWARD, check, why)
    return model


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


class ScoreDiffs:
    """The largest |recomputed - recorded| per path, the worst candidate, and one failure per score over
    FORWARD_TOL."""

    def __init__(self):
        self.max = {"official": 0.0, "independent": 0.0}
        self.worst, self.bad = None, []

    def compare(self, r, w, side, scores):
        for j, (s_new, s_rec) in enumerate(zip(scores, r[side]["scores"])):
            d = abs(s_new - s_rec)
            self.max[side] = max(self.max[side], d)
            if self.worst is None or d > self.worst["abs_diff"]:
                self.worst = {"abs_diff": d, "idx": r["idx"], "path": side, "candidate": j}
            if not d <= FORWARD_TOL:
                self.bad.append(f"{w} {side}.scores[{j}]: recorded {s_rec!r}, recomputed {s_new!r} "
                                f"(|diff| {d:.3g} > tolerance {FORWARD_TOL:g})")


def audit_candidate_scores(C, name, ident, records, tokens, model_dir, key_of=lambda r: r["idx"],
                           where_of=lambda r: f"idx {r['idx']}", pred_field="pred"):
    """The forward level of a multiple-choice experiment whose records carry idx, candidates, official and
    independent scores and `pred_field`, and official.is_greedy (protocol, MC-TACO, options): rows FORWARD_CHECKS.
    `tokens` maps key_of(record) to the identity level's verified (context ids, [candidate ids]). Returns the
    figures it measured (for audit.json), or None."""
    model = model_for_forward(C, name, ident, tokens, model_dir)
    if model is None:
        return None
    import torch

    t0 = time.perf_counter()
    diffs, bad_pred, bad_greedy = ScoreDiffs(), [], []
    for r in records:
        w = where_of(r)
        scores, greedy = candidate_scores(model, *tokens[key_of(r)])
        for side in ("official", "independent"):
            diffs.compare(r, w, side, scores)
            expect(bad_pred, w, f"{side}.{pred_field}", r[side][pred_field], argmax_first(scores),
                   f"argmax of recomputed scores {[round(s, 6) for s in scores]}")
        expect(bad_greedy, w, "official.is_greedy", r["official"]["is_greedy"], greedy,
               "greedy argmax at every candidate position, recomputed")
    max_off, max_ind = diffs.max["official"], diffs.max["independent"]
    C.add(name, FORWARD, FORWARD_CHECKS[0], sum(len(r["candidates"]) for r in records), diffs.bad,
          note=f"max |recomputed - official| = {max_off:.3g}, max |recomputed - independent| = {max_ind:.3g} "
               f"(tolerance {FORWARD_TOL:g}, float32, audit.py's own Llama forward)")
    C.add(name, FORWARD, FORWARD_CHECKS[1], len(records), bad_pred)
    C.add(name, FORWARD, FORWARD_CHECKS[2], len(records), bad_greedy)
    return {"max_abs_diff_official": max_off, "max_abs_diff_independent": max_ind, "tolerance": FORWARD_TOL,
            "worst": diffs.worst, "dtype": "float32", "seconds": round(time.perf_counter() - t0, 2),
            "threads": torch.get_num_threads()}


def two_path_forward(C, name, ev, records, tokens, model_dir):
    """audit_candidate_scores for records keyed and named by idx (protocol, MC-TACO), in shared.run_levels' form."""
    return audit_candidate_scores(C, name, ev["identity"], records, tokens, model_dir)
