"""The forward level of a greedy generation (run.py's extraction and harness experiments): every generated token
must be the argmax of audit.py's own Llama forward pass at its position, up to a numerical near-tie."""
from pathlib import Path

from evidence_audit.checks import FORWARD, MISSING, expect, get
from evidence_audit.forward import FORWARD_TOL, MARGIN_TOLERANCE, forget_scores, llama_logprobs, load_llama, use_threads
from evidence_audit.model_files import is_local, rehash_problems
from evidence_audit.reading import sha256_file
from evidence_audit.sampling import sample_records

GREEDY = "greedy tokens (argmax at every generated position)"


def greedy_check(C, name, ident, records, tokens, model_dir):
    """Row GREEDY: audit.py's own Llama forward over prompt + generation; every generated token must be the argmax
    at its position, up to a numerical near-tie (top-1 minus the recorded token's log-prob <= FORWARD_TOL); the
    cached weights must be the ones identity.json names. Returns the figures for audit.json, or None."""
    weights = Path(model_dir) / "model.safetensors" if model_dir else None
    if tokens is None:
        C.skip(name, FORWARD, GREEDY, "needs verified prompt and generated ids from the identity level")
        return None
    sharded = is_local(ident) and weights is not None and (Path(model_dir) / "model.safetensors.index.json").exists()
    if weights is None or not (weights.exists() or sharded):
        C.skip(name, FORWARD, GREEDY, f"model not found ({weights}); pass --cache with the prepared cache (a local "
               "model: --model DIR)")
        return None
    try:
        use_threads(C.options.threads)
        model, why = load_llama(model_dir)
    except ImportError as e:
        model, why = None, f"cannot import torch/safetensors ({e})"
    if model is None:
        C.skip(name, FORWARD, GREEDY, why)
        return None
    bad = []
    if is_local(ident):     # a local --model directory: model_sha256 is derived from every file; re-hash each
        rehash_problems(bad, model_dir, ident, sorted(ident.get("model_files") or {}))
    else:
        expect(bad, str(weights), "sha256", sha256_file(weights),
               ident.get("model_sha256", MISSING) if ident else MISSING, "identity.json model_sha256")
    dtype = get(ident, "scoring_config.dtype") if isinstance(ident, dict) else MISSING
    dtype = "float32" if dtype is MISSING else dtype          # evidence from before dtypes were recorded
    if not isinstance(dtype, str) or dtype not in MARGIN_TOLERANCE:
        C.skip(name, FORWARD, GREEDY, f"the generations were made in {str(dtype)[:40]}; the audit reads "
                                      f"{', '.join(MARGIN_TOLERANCE)}")
        return None
    # the pass is float32: a generation made in bfloat16 / float16 picks another token where the float32 top two
    # are within that dtype's measured margin tolerance (forward.MARGIN_TOLERANCE), a near-tie, not a forgery
    tol = FORWARD_TOL if dtype == "float32" else MARGIN_TOLERANCE[dtype]
    # a harness record's idx is "<task>/<i>": each task its own stratum, so every task is in the sample
    records, covered, drawn = sample_records(C.options.sample, name, records, lambda r: r["idx"],
                                             lambda r: str(r["idx"]).split("/")[0] if "/" in str(r["idx"]) else None)
    figures = greedy_positions(model, records, tokens, bad, tol)
    figures["sample"] = drawn
    C.add(name, FORWARD, GREEDY, len(records), bad,
          note=f"{figures['positions']} positions, {figures['near_ties']} numerical near-ties, smallest top-1 margin "
               f"{figures['min_margin'] if figures['min_margin'] is None else round(figures['min_margin'], 6)} "
          + (f"(max |recomputed - greedy| tol {tol:g})" if dtype == "float32" else
             f"(generated in {dtype}, re-run in float32: a gap within {tol:g} is a near-tie)") + f"; {covered}")
    return figures


def greedy_positions(model, records, tokens, bad, tol=FORWARD_TOL):
    """Every generated position: the recorded token against the forward pass's argmax (a gap within `tol` is a
    near-tie, not a failure). Returns {positions, near_ties, min_margin}."""
    import torch
    n_pos, ties, min_margin = 0, 0, None
    for r in records:
        ids, gen = tokens[r["idx"]]
        seq = ids + gen
        lp = llama_logprobs(model, seq[:-1])
        forget_scores(model, seq[:-1])       # one use per sequence: do not keep 20 MB per item
        for k, t in enumerate(gen):
            row = lp[len(ids) - 1 + k]
            top = int(torch.argmax(row))
            n_pos += 1
            if top == t:
                margin = float(row[t]) - float(torch.topk(row, 2).values[1])
                min_margin = margin if min_margin is None else min(min_margin, margin)
            elif float(row[top] - row[t]) <= tol:
                ties += 1
            else:
                bad.append(f"idx {r['idx']} generated_ids[{k}]: {t} is not the greedy token ({top}, "
                           f"log-prob gap {float(row[top] - row[t]):.3g})")
    return {"positions": n_pos, "near_ties": ties, "min_margin": min_margin}
