"""Token boundaries (identity level, --tokens --model DIR) and the forward level (--forward --model DIR): every
loglikelihood request (multiple_choice and loglikelihood tasks) re-tokenised as lm-eval 0.4.9.2's TemplateLM._encode_pair does and
re-scored with the audit's own float32 Llama forward pass (evidence_audit/forward.py).

_encode_pair: trailing whitespace of the context moves to the continuation; context and context + continuation are
tokenised (no special tokens unless model_args say add_bos_token=True); the continuation is the whole's tokens after
the context's count. HFLM keeps the last max_length + 1 tokens. --sample N: documents ranked by
sha256(f"{SAMPLE_SALT}:{task}:{doc_id}") — fixed before any score is read — taken in that order while their requests
total at most N per task (at least one document); the report says it is a sample.
"""
import hashlib
import time
from pathlib import Path

from evidence_audit import forward, tokens
from evidence_audit.checks import FORWARD, IDENTITY, expect
from evidence_audit.definitions import argmax_first
from evidence_audit.lmeval import fmt
from evidence_audit.lmeval.persample import LOGLIKELIHOOD
from evidence_audit.model_files import check_model_dir

SAMPLE_SALT = "lmeval-forward-sample-v1"
BOUNDARIES = "continuation token boundaries (model's tokenizer, lm-eval's _encode_pair)"


def encode_pair(tok, context, continuation, add_bos):
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=add_bos).ids
    ctx = tok.encode(context, add_special_tokens=add_bos).ids
    return ctx, whole[len(ctx):], whole[:len(ctx)] == ctx


def special_tokens(bad, tok, top):
    """The tokenizer's ids of the bos/eos/pad tokens lm-eval recorded (tokenizer_*_token: [text, id])."""
    for key in ("tokenizer_bos_token", "tokenizer_eos_token", "tokenizer_pad_token"):
        rec = top.get(key)
        if isinstance(rec, list) and len(rec) == 2 and isinstance(rec[0], str):
            expect(bad, "results", key, rec[1], str(tok.token_to_id(rec[0])), "id of that token in --model's tokenizer")


def boundary_rows(C, t, model_dir, top):
    """Row BOUNDARIES; returns {(doc_id, request index): (context ids, continuation ids)} for the forward level,
    or None (after a SKIPPED row) when there is no tokenizer or the task has no loglikelihood requests."""
    if t.output_type not in LOGLIKELIHOOD:
        C.skip(t.label, IDENTITY, BOUNDARIES, f"output_type {t.output_type}: no loglikelihood request", requested=False)
        return None
    if model_dir:
        check_model_dir(model_dir)      # a hostile directory: one line, exit 2, before anything of it loads
    tok_path = Path(model_dir) / "tokenizer.json" if model_dir else None
    if tok_path is None or not tok_path.exists():
        C.skip(t.label, IDENTITY, BOUNDARIES, f"needs --model DIR with tokenizer.json (found {tok_path})")
        return None
    tok = tokens.load_tokenizer(tok_path)
    add_bos = "add_bos_token=True" in str(t.run_config.get("model_args"))
    max_len = top.get("max_length") if isinstance(top.get("max_length"), int) else None
    bad, out, not_prefix = [], {}, 0
    special_tokens(bad, tok, top)
    for s in t.samples:
        for i, (ctx, cont) in enumerate(s.requests):
            if not ctx:
                bad.append(f"{s.where} arguments.gen_args_{i}: empty context (scored after the eot token): not "
                           "implemented here")
                continue
            c_ids, k_ids, prefix = encode_pair(tok, ctx, cont, add_bos)
            not_prefix += not prefix
            if not k_ids:
                bad.append(f"{s.where} arguments.gen_args_{i}.arg_1: {cont!r} tokenises to no token")
            if max_len and len(c_ids) + len(k_ids) > max_len + 1:
                c_ids = (c_ids + k_ids)[-(max_len + 1):][:-len(k_ids)]     # HFLM's left truncation
            out[(s.doc_id, i)] = (c_ids, k_ids)
    C.add(t.label, IDENTITY, BOUNDARIES, len(out), bad,
          note=f"{tok_path}; {not_prefix} requests whose context tokens are not a prefix of context+continuation")
    return None if bad else out


def chosen(t, n):
    """The documents --sample n re-scores (module docstring), or every document when n is None."""
    docs = sorted({s.doc_id: len(s.requests) for s in t.samples}.items())
    if n is None:
        return {d for d, _ in docs}
    ranked = sorted(docs, key=lambda d: hashlib.sha256(f"{SAMPLE_SALT}:{t.name}:{d[0]}".encode()).hexdigest())
    out, total = set(), 0
    for d, k in ranked:
        if out and total + k > n:
            break
        out.add(d)
        total += k
    return out


def model_row(C, t, model_dir, top):
    """Row "model (parameters == results' model_num_parameters)"; the loaded Llama or None (SKIPPED rows)."""
    st = Path(model_dir) / "model.safetensors" if model_dir else None
    if st is None or not st.exists():
        C.skip(t.label, FORWARD, "loglikelihoods re-scored", f"needs --model DIR with model.safetensors (found {st})")
        return None
    dtype = t.run_config.get("model_dtype")
    if dtype not in (None, "torch.float32"):
        C.skip(t.label, FORWARD, "loglikelihoods re-scored",
               f"the run's model_dtype is {dtype}: the audit's forward pass is float32 and its 1e-4 tolerance does not "
               "cover that rounding (run lm-eval with dtype=float32)")
        return None
    check_model_dir(model_dir)
    forward.use_threads(C.options.threads)
    model, why = forward.load_llama(model_dir)
    if model is None:
        C.skip(t.label, FORWARD, "loglikelihoods re-scored", why)
        return None
    bad = []
    n_params = sum(w.numel() for k, w in model[2].items())
    expect(bad, "results", "config.model_num_parameters", t.run_config.get("model_num_parameters"), n_params,
           f"parameters in {st}")
    C.add(t.label, FORWARD, "model (parameters == results' model_num_parameters)", 1, bad)
    return model


def forward_rows(C, t, model_dir, top, ids, sample_n):
    """Rows "loglikelihoods re-scored" and "is_greedy / argmax re-derived": max abs diff, argmax changes, the
    documents whose values moved. Returns the figures for audit.json, or None."""
    if t.output_type not in LOGLIKELIHOOD:
        C.skip(t.label, FORWARD, "loglikelihoods re-scored", f"output_type {t.output_type}: generations are not re-run "
                                                             "(only loglikelihood requests are)", requested=False)
        return None
    if ids is None:
        C.skip(t.label, FORWARD, "loglikelihoods re-scored", "needs the identity level's token boundaries (--model DIR "
                                                             "with its tokenizer), which were unavailable or failed")
        return None
    model = model_row(C, t, model_dir, top)
    if model is None:
        return None
    keep, t0 = chosen(t, sample_n), time.perf_counter()
    bad, bad_argmax, moved, worst, n = [], [], set(), 0.0, 0
    scored = {}
    for s in t.samples:
        if s.doc_id not in keep:
            continue
        logged = [fmt.loglikelihood(t.path, s, v, f"resps[{i}][0]") for i, v in enumerate(x[0] for x in s.raw["resps"])]
        new = []
        for i in range(len(s.requests)):
            if (s.doc_id, i) not in scored:
                scored[(s.doc_id, i)] = forward.candidate_scores(model, ids[(s.doc_id, i)][0], [ids[(s.doc_id, i)][1]])
            (score,), (greedy,) = scored[(s.doc_id, i)]
            new.append(score)
            d = abs(score - logged[i][0])
            worst, n = max(worst, d), n + 1
            if not d <= forward.FORWARD_TOL:
                moved.add(s.doc_id)
                bad.append(f"{s.where} resps[{i}]: logged {logged[i][0]!r}, recomputed {score!r} (|diff| {d:.3g} > "
                           f"{forward.FORWARD_TOL:g})")
            expect(bad, s.where, f"resps[{i}] is_greedy", logged[i][1], greedy, "argmax at every continuation token")
        expect(bad_argmax, s.where, "argmax of the loglikelihoods", argmax_first([ll for ll, _ in logged]),
               argmax_first(new), "the prediction acc is computed from")
    what = f"a sample: {len(keep)} of {len({s.doc_id for s in t.samples})} documents (--sample {sample_n}, " \
           f"sha256({SAMPLE_SALT}:task:doc_id) order)" if sample_n is not None else "every request"
    C.add(t.label, FORWARD, "loglikelihoods re-scored (own float32 Llama forward)", n, bad,
          note=f"max |recomputed - logged| = {worst:.3g} over {what}; documents moved: {sorted(moved)}")
    C.add(t.label, FORWARD, "argmax changes (the prediction) after re-scoring", len(keep), bad_argmax)
    return {"max_abs_diff": worst, "requests": n, "documents": len(keep), "sample": sample_n, "salt": SAMPLE_SALT,
            "moved": sorted(moved), "tolerance": forward.FORWARD_TOL, "seconds": round(time.perf_counter() - t0, 2)}
