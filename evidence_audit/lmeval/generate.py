"""The forward level of generate_until tasks: every logged generation re-generated greedily from its logged context,
with lm-eval's semantics, and compared with the logged response; then the filters and metrics recomputed from the
re-generated text.

lm-eval's HFLM.generate_until, written again from 0.4.9.2 (lm_eval/models/huggingface.py:1366-1510, models/utils.py:217-272,
:721-736 and :857-883; the same steps in 0.4.5, 0.4.8 and 0.4.13, read there): requests grouped by
their generation kwargs (first appearance order), each group sorted by (-len(tok_encode(context)), context) and cut
into batches of the run's batch size; a batch's contexts encoded with the run's add_special_tokens rule (the one
tok_encode follows: rescore.encoder), left-truncated to max_length - max_gen_toks tokens and left-padded with the
tokenizer's pad id (attention mask 0 there); greedy decoding with a key/value cache until every row has produced one
of the generation config's eos ids, or, for one stop string, every row's last (len(stop tokens) + 2) generated tokens
decode to a text holding it (lm-eval's MultiTokenEOSCriteria: the batch stops together), or max_gen_toks tokens; a
row that produced an eos id is padded after it. The text: the generated tokens decoded without special tokens,
cut before the first occurrence of each stop string (the task's `until` plus the eos token's text) in turn.

The decoding loop is the audit's own; each step's logits come from transformers' class for config.json's
architecture (hflm.load_model: the audit's own Llama pass has no key/value cache), in the run's dtype and attention,
so an error the run shares with that class is not caught here, and the row names the class.

A re-generated text equal to the logged one passes. Otherwise the row names where the two part (the first
generated token whose text leaves the logged response) and the top-2 margin of the audit's logits there: a margin
within forward.MARGIN_TOLERANCE[dtype] is a numerical near-tie (another batch shape, CPU or kernel picks the other
token; named, never failed), past it a FAIL. Equality is expected where the run's kernels are reproduced
(rescore.choose_mode: the same release batching, batch size, CPU kind, torch build, transformers); a near-tie
divergence there is still reported as one (lm-eval records no thread count).

Not re-generated (SKIPPED naming why, INCOMPLETE since the level was asked for): sampling (do_sample, temperature >
0), generation kwargs or a generation_config.json setting that changes greedy decoding (beams, penalties, forced or
suppressed tokens, max_new_tokens), think_end_token, seq2seq models, a run without a max_length or tokenizer record.
"""
import json
import time
from pathlib import Path

from evidence_audit import forward, tokens
from evidence_audit.checks import FORWARD
from evidence_audit.hflm import NoTransformers, load_model, model_label
from evidence_audit.lmeval import rescore
from evidence_audit.lmeval.persample import generation_scores
from evidence_audit.model_files import check_model_dir
from evidence_audit.reading import Unreadable, read_json

GENERATE_UNTIL = "generate_until"
REGENERATED = "generations re-generated greedily (lm-eval's batches, stop strings, max_gen_toks)"
REGEN_METRICS = "filters and metrics recomputed from the re-generated text"
DEFAULT_MAX_GEN_TOKS = 256      # HFLM's max_gen_toks without a model_args value (0.4.5 to 0.4.13)
MAX_NEW_TOKENS = 4096           # a logged max_gen_toks past this is not re-generated (an audit's time bound)
# kwargs lm-eval reads itself or that leave greedy decoding as it is (top_p / top_k act only when sampling)
GREEDY_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "max_length", "top_p", "top_k"}
# generation_config.json fields that change what greedy decoding picks, with the value that leaves it alone
CHANGES_GREEDY = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "bad_words_ids": None, "min_length": 0,
                  "min_new_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
                  "suppress_tokens": None, "begin_suppress_tokens": None, "sequence_bias": None,
                  "encoder_repetition_penalty": 1.0, "exponential_decay_length_penalty": None, "num_beams": 1,
                  "max_new_tokens": None, "do_sample": False}


# ---- what the run asked for ---------------------------------------------------------------------------------------

def greedy_settings(gen_kwargs, default_max):
    """(until list, max_gen_toks, max_length or None, None) for one request's generation kwargs, or (.., why not
    greedy / not re-generated)."""
    if not isinstance(gen_kwargs, dict):
        return None, None, None, f"generation kwargs {str(gen_kwargs)[:60]!r} are not a dict"
    other = sorted(set(gen_kwargs) - GREEDY_KWARGS)
    if other:
        return None, None, None, f"generation kwargs {other} are not re-generated here"
    temp, sample = gen_kwargs.get("temperature", 0.0), gen_kwargs.get("do_sample")
    if sample is True or (isinstance(temp, (int, float)) and not isinstance(temp, bool) and temp > 0):
        return None, None, None, f"a sampled run (do_sample={sample!r}, temperature={temp!r}): not greedy"
    if not isinstance(temp, (int, float)) or isinstance(temp, bool) or temp < 0:
        return None, None, None, f"temperature {temp!r}"
    until = gen_kwargs.get("until")
    until = [until] if isinstance(until, str) else [] if until is None else until
    if not isinstance(until, list) or not all(isinstance(u, str) for u in until):
        return None, None, None, f"until {str(gen_kwargs.get('until'))[:60]!r} is not a string list"
    max_gen = gen_kwargs.get("max_gen_toks", default_max)
    if not isinstance(max_gen, int) or isinstance(max_gen, bool) or not 0 < max_gen <= MAX_NEW_TOKENS:
        return None, None, None, f"max_gen_toks {max_gen!r} (re-generated up to {MAX_NEW_TOKENS})"
    max_len = gen_kwargs.get("max_length")
    if max_len is not None and (not isinstance(max_len, int) or isinstance(max_len, bool) or max_len <= 0):
        return None, None, None, f"max_length {max_len!r}"
    return list(until), max_gen, max_len, None


def generation_config_problem(model_dir):
    """Why the model's generation_config.json changes greedy decoding as HF's generate applies it, or None; and
    the eos ids generate stops a row at (generation_config.json's, else config.json's)."""
    path = Path(model_dir) / "generation_config.json"
    gen = read_json(path) if path.exists() else {}
    cfg = read_json(Path(model_dir) / "config.json")
    if not isinstance(gen, dict) or not isinstance(cfg, dict):
        return f"{path} or config.json is not a JSON object", []
    odd = [f"{k}={gen[k]!r}" for k, neutral in CHANGES_GREEDY.items() if k in gen and gen[k] != neutral
           and not (k == "do_sample")]
    if odd:
        return f"{path.name} sets {', '.join(odd)[:120]}, which changes greedy decoding", []
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    eos = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
    return None, [e for e in eos if isinstance(e, int) and not isinstance(e, bool)]


def recorded_token(top, key):
    """(text, id) of a tokenizer token lm-eval records in the results (tokenizer_eos_token, ...), or None."""
    rec = top.get(key)
    if isinstance(rec, list) and len(rec) == 2 and isinstance(rec[0], str) and isinstance(rec[1], (int, str)) \
            and str(rec[1]).isdigit():
        return rec[0], int(rec[1])
    return None


def cleans_up(model_dir):
    """tokenizer_config.json's clean_up_tokenization_spaces (transformers' decode; absent: False, its default in
    the transformers releases lm-eval 0.4.5 to 0.4.13 pair with here)."""
    path = Path(model_dir) / "tokenizer_config.json"
    cfg = read_json(path) if path.exists() else {}
    return isinstance(cfg, dict) and cfg.get("clean_up_tokenization_spaces") is True


def clean_up(text):
    """transformers' clean_up_tokenization: the spaces before punctuation and English contractions removed."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                 (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


# ---- lm-eval's order and batches ----------------------------------------------------------------------------------

def lm_eval_batches(reqs, encode, batch_size):
    """reqs: [(key, context, gen_kwargs)] in lm-eval's request order -> [[req, ...]] batches in the order HFLM
    runs them: grouped by generation kwargs (first appearance), each group sorted by (-len(tokens), context)."""
    groups = {}
    for r in reqs:
        groups.setdefault(json.dumps(r[2], sort_keys=True), []).append(r)
    out = []
    for group in groups.values():
        group = sorted(group, key=lambda r: (-len(encode(r[1])), r[1]))
        n = batch_size or len(group)
        out += [group[i:i + n] for i in range(0, len(group), n)]
    return out


# ---- the decoding loop ----------------------------------------------------------------------------------------------

def greedy_batch(model, rows, pad_id, eos_ids, stops, max_new, decode_raw):
    """Greedy continuation of the left-padded batch `rows` (token id lists) as HF's generate runs lm-eval's call
    (module docstring): returns per row ([generated ids], [top-1 minus top-2 logit at each step])."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    B = len(rows)
    generated, margins = [[] for _ in rows], [[] for _ in rows]
    unfinished = [True] * B
    stop_done = {s: [False] * B for s in stops}
    stop_len = {s: len(stops[s]) + 2 for s in stops}
    past, step_ids = None, ids
    pos = (mask.cumsum(-1) - 1).clamp(min=0) * mask + (1 - mask)    # HF: position ids from the mask, pads at 1
    step_pos = pos
    with torch.no_grad():
        for _ in range(max_new):
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=past,
                        use_cache=True, logits_to_keep=1)       # generate's call: the head on the last row only
            past = out.past_key_values
            logits = out.logits[:, -1, :].to(torch.float32)
            top2 = torch.topk(logits, 2, dim=-1)
            nxt = torch.argmax(logits, dim=-1).tolist()       # generate's greedy pick (first index on a tie)
            for b in range(B):
                if unfinished[b]:
                    margins[b].append(float(top2.values[b, 0] - top2.values[b, 1]))
                else:
                    nxt[b] = pad_id
                generated[b].append(nxt[b])
            for b in range(B):
                if unfinished[b] and nxt[b] in eos_ids:
                    unfinished[b] = False
            stop_all = False
            for s, done in stop_done.items():
                for b in range(B):
                    if not done[b]:
                        done[b] = s in decode_raw(generated[b][-stop_len[s]:])
                stop_all = stop_all or all(done)
            if stop_all or not any(unfinished):
                break
            step_ids = torch.tensor(nxt)[:, None]
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], dim=1)
            step_pos = step_pos[:, -1:] + 1
    return generated, margins


def first_divergence(generated, decode, logged):
    """The index of the first generated token after which the decoded prefix is no longer a prefix of `logged`
    (a prefix ending in an incomplete character is read on), or None when every prefix is one."""
    for k in range(len(generated)):
        text = decode(generated[:k + 1])
        if text.endswith("\ufffd"):
            continue
        if not logged.startswith(text):
            return k
    return None


# ---- the rows -----------------------------------------------------------------------------------------------------

def skip(C, t, why):
    C.skip(t.label, FORWARD, REGENERATED, why)
    return None


def requests_to_generate(t, keep):
    """[(doc_id, context, gen_kwargs, logged texts, [sample lines])] for the kept documents, one request per
    document (every filter's line holds the same request and responses), in lm-eval's request order (doc_id)."""
    by_doc = {}
    for s in t.samples:
        if s.doc_id in keep:
            by_doc.setdefault(s.doc_id, []).append(s)
    out = []
    for doc_id in sorted(by_doc):
        lines = by_doc[doc_id]
        first = lines[0]
        if len(first.requests) != 1:
            raise Unreadable(f"{t.path}: line {first.n}: a generate_until document with {len(first.requests)} "
                             "requests (lm-eval makes one)")
        texts = first.raw["resps"][0] if len(first.raw["resps"]) == 1 else None
        context, kwargs = first.requests[0]
        out.append((doc_id, context, kwargs, texts, lines))
    return out


def run_record(t, model_dir, top):
    """What the run recorded that re-generation needs: ({dtype, max_length, eos, pad, eos_ids, default_max}, None),
    or (None, why it cannot be re-generated)."""
    tok_path = Path(model_dir) / "tokenizer.json"
    if not tok_path.exists():
        return None, f"needs --model DIR with tokenizer.json ({tok_path} not found)"
    dtype, why = rescore.run_dtype(t.run_config)
    if dtype is None:
        return None, why
    args = rescore.model_args(t.run_config)
    if args.get("think_end_token"):
        return None, f"model_args think_end_token={args['think_end_token'][:40]!r}: not re-generated here"
    max_length = top.get("max_length")
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length <= 0:
        return None, (f"the results record no max_length ({str(max_length)[:40]!r}): the context's left truncation "
                      "is unknown")
    eos = recorded_token(top, "tokenizer_eos_token")
    if eos is None:
        return None, "the results record no tokenizer_eos_token: the eos stop string is unknown"
    why, eos_ids = generation_config_problem(model_dir)
    if why:
        return None, why
    default_max = args.get("max_gen_toks", "")
    return {"dtype": dtype, "max_length": max_length, "eos": eos, "pad": recorded_token(top, "tokenizer_pad_token"),
            "eos_ids": set(eos_ids), "tok_path": tok_path,
            "default_max": int(default_max) if default_max.isdigit() else DEFAULT_MAX_GEN_TOKS}, None


def request_settings(reqs, rec):
    """{doc_id: (stop strings, max_gen_toks, max_length)} for each request, or (None, why one is not re-generated)."""
    plans = {}
    for doc_id, _, kwargs, texts, _ in reqs:
        until, max_gen, max_len, why = greedy_settings(kwargs, rec["default_max"])
        if why:
            return None, f"doc_id {doc_id}: {why}"
        if not isinstance(texts, list) or not texts or not all(isinstance(x, str) for x in texts):
            return None, f"doc_id {doc_id}: resps is not one request's list of texts"
        if rec["max_length"] - max_gen <= 0:
            return None, f"doc_id {doc_id}: max_gen_toks {max_gen} >= max_length {rec['max_length']}"
        eos_text = rec["eos"][0]
        plans[doc_id] = (until + ([eos_text] if eos_text not in until else []), max_gen, max_len)
    return plans, None


def regenerate(model, reqs, plans, rec, encode, decode, batch_size):
    """{doc_id: (generated ids, text, [margin per step])}: every request decoded in lm-eval's batches, per group
    of identical settings."""
    out, by_settings = {}, {}
    pad_id = rec["pad"][1] if rec["pad"] is not None else rec["eos"][1]
    for r in reqs:
        by_settings.setdefault(json.dumps(plans[r[0]], sort_keys=True), []).append(r)
    for group in by_settings.values():
        until, max_gen, max_len = plans[group[0][0]]
        stops = {s: decode.tok.encode(s, add_special_tokens=False).ids for s in until if s}
        for batch in lm_eval_batches([(r[0], r[1], r[2]) for r in group], encode, batch_size):
            rows = [encode(ctx)[-(rec["max_length"] - max_gen):] for _, ctx, _ in batch]
            new = max_gen if max_len is None else max(0, max_len - max(len(r) for r in rows))
            got, margins = greedy_batch(model, rows, pad_id, rec["eos_ids"], stops, new,
                                        lambda ids: decode(ids, special=True))
            for (doc_id, _, _), ids, m in zip(batch, got, margins):
                text = decode(ids)
                for s in until:
                    if s:
                        text = text.split(s)[0]
                out[doc_id] = (ids, text, m)
    return out


def compare(reqs, regenerated, decode, tol):
    """(failures, near-ties, identical count): each re-generated text against the logged response."""
    bad, ties, same = [], [], 0
    for doc_id, _, _, texts, _ in reqs:
        ids, text, margins = regenerated[doc_id]
        logged = texts[0]
        bad += [f"doc_id {doc_id}: resps repeats differ ({other[:40]!r} vs {logged[:40]!r}); greedy repeats are "
                "identical" for other in texts[1:] if other != logged]
        if text == logged:
            same += 1
            continue
        k = first_divergence(ids, decode, logged)
        k = len(ids) - 1 if k is None else k
        margin = margins[k] if 0 <= k < len(margins) else float("inf")
        where = (f"doc_id {doc_id}: re-generated {text[:80]!r}, logged {logged[:80]!r}; they part at generated token "
                 f"{k} (text so far {decode(ids[:k])[-40:]!r}), top-2 margin there {margin:.6g}")
        (ties if margin <= tol else bad).append(where)
    return bad, ties, same


def generate_rows(C, t, model_dir, top, sample_n, device=None):
    """Rows REGENERATED and REGEN_METRICS for a generate_until task (module docstring); the figures for
    audit.json, or None."""
    device = device or getattr(C.options, "device", None) or "cpu"
    if not model_dir:
        return skip(C, t, "needs --model DIR (the model the run generated with)")
    check_model_dir(model_dir)       # a hostile directory: one line, exit 2, before anything of it loads
    rec, why = run_record(t, model_dir, top)
    if rec is None:
        return skip(C, t, why)
    reqs = requests_to_generate(t, rescore.chosen(t, C.options.sample))
    plans, why = request_settings(reqs, rec)
    if plans is None:
        return skip(C, t, why)
    rescore.check_device(device)
    if not rescore.model_row(C, t, model_dir, REGENERATED):
        return None
    tok = tokens.load_tokenizer(rec["tok_path"])
    encode, why = rescore.run_encoder(tok, t, top, model_dir)
    if encode is None:
        return skip(C, t, why)
    plan, dtype = rescore.choose_mode(t, top, device, sample_n, C.options.threads), rec["dtype"]
    try:
        forward.use_threads(C.options.threads)
        model, why = load_model(model_dir, dtype, plan.attention, device)
    except NoTransformers as e:
        model, why = None, f"cannot import transformers ({e})"
    if model is None:
        return skip(C, t, why)
    cleanup = cleans_up(model_dir)

    def decode(ids, special=False):
        text = tok.decode(ids, skip_special_tokens=not special)
        return clean_up(text) if cleanup else text
    decode.tok = tok

    t0 = time.perf_counter()
    regenerated = regenerate(model, reqs, plans, rec, encode, decode, plan.batch_size or 1)
    tol = forward.MARGIN_TOLERANCE.get(dtype, forward.FORWARD_TOL)
    bad, ties, same = compare(reqs, regenerated, decode, tol)
    label, n = model_label(model, plan.attention, device), len(reqs)
    mode = ("equality expected (" + plan.why + ")") if plan.equality else f"tolerance ({plan.why})"
    note = (f"{dtype}, {label}, own decoding loop; {same} of {n} identical, {len(ties)} near-tie(s) within the "
            f"{dtype} margin tolerance {tol:g}; {mode}; {rescore.sample_words(C, t, {r[0] for r in reqs})}")
    if ties:
        note += "; near-ties (not failed): " + "; ".join(ties[:3]) + (f" (+{len(ties) - 3} more)" if len(ties) > 3
                                                                        else "")
    C.add(t.label, FORWARD, REGENERATED, n, bad, note=note)
    metric_row(C, t, reqs, {d: g[1] for d, g in regenerated.items()})
    return {"dtype": dtype, "implementation": label, "documents": n, "identical": same, "near_ties": ties,
            "tolerance": tol, "equality": plan.equality, "batch_size": plan.batch_size,
            "sample": C.options.sample.figures(n, len({s.doc_id for s in t.samples})),
            "seconds": round(time.perf_counter() - t0, 2)}


def metric_row(C, t, reqs, regenerated):
    """Row REGEN_METRICS: each sample line's filter and metrics applied to the re-generated text must give the
    logged filtered_resps and metric values (a document re-generated at a near-tie is counted, not failed)."""
    bad, skipped, changed, lines = [], set(), 0, 0
    for doc_id, _, _, texts, samples in reqs:
        text = regenerated[doc_id]
        for s in samples:
            got = generation_scores(t, s, [text] * len(texts), skipped)
            if got is None:
                continue
            lines += 1
            filtered, values = got
            diffs = [f"filtered_resps {s.raw['filtered_resps']!r} vs {[filtered]!r}"] \
                if s.raw["filtered_resps"] != [filtered] else []
            diffs += [f"{m} {s.raw[m]!r} vs {v!r}" for m, (v, _) in values.items() if s.raw[m] != v]
            if not diffs:
                continue
            if text == texts[0]:
                bad.append(f"{s.where}: from the re-generated (= logged) text, {'; '.join(diffs)}")
            else:
                changed += 1
    if not lines:
        C.skip(t.label, FORWARD, REGEN_METRICS, f"no filter of the task is implemented here ({', '.join(sorted(skipped))})")
        return
    C.add(t.label, FORWARD, REGEN_METRICS, lines, bad,
          note=f"{changed} line(s) of near-tie documents score otherwise with the re-generated text"
               + (f"; not computed here: {', '.join(sorted(skipped))}" if skipped else ""))
