"""The independent scoring path, written from these definitions (not from lm-eval's code). It imports nothing
from lm_eval.

    s_ij = sum_t log p(y_jt | x_i, y_j,<t)      (candidate log-likelihood, no EOS, no normalisation)
    pred_i = argmax_j s_ij                       (first index wins ties)

Special tokens: whatever the tokenizer's own configuration adds at the start of an encoding (a BOS for a Llama
tokenizer with add_bos_token, nothing for SmolLM2's or GPT-2's) is prepended to every context, unless the text
already begins with the tokenizer's BOS (else EOS) token string; `special_tokens` derives this from the tokenizer
(encoding with and without its special tokens) and says what it did, for the evidence. A tokenizer that appends
tokens at the end (add_eos_token) is refused: the candidate boundary would then include them.

Context and context+candidate are tokenised together and the context tokens must be a prefix of the whole;
a context ending in whitespace is refused (the boundary would be ambiguous). Inputs longer than the configured
limit are an error, never truncated. One sequence per forward pass: no padding, no attention mask needed.

One forward pass per distinct input, as lm-eval's HFLM runs it (its Collator with group_by="contexts" keys a
request by context + continuation[:-1], runs one request per key and reads every other one from the same
log-probabilities): candidates whose input ids (context + candidate but its last token) are identical -- every
one-token candidate after one context, say -- share one pass. Each candidate's score is read from the last
len(candidate) rows of its input's log-probabilities, the rows a pass of its own would have given: the input
tensor is the same, so the score is bit for bit the same (tests/test_scoring.py compares it with
candidate_logprob, one pass per candidate, on the real model).
"""
import hashlib

import torch


class ScoringError(Exception):
    """An assertion of the independent path failed: the message names the item and what differed."""


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


SPECIAL_TOKENS_RULE = ("the ids the tokenizer's own configuration adds before a text (encode with its special tokens "
                       "vs without) are prepended to every context, unless the text already starts with the "
                       "tokenizer's bos_token string (eos_token when it has no BOS); nothing is appended")


def special_tokens(tokenizer):
    """What the tokenizer adds around an encoding, derived from the tokenizer itself (computed once per tokenizer):
    {"prefix_ids", "add_bos", "bos_token_id", "marker", "config_add_bos_token", "rule"}. Raises ScoringError
    for a tokenizer that appends tokens."""
    cached = getattr(tokenizer, "_evidence_special_tokens", None)
    if cached is not None:
        return cached
    probe = "special tokens probe"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe)["input_ids"]
    starts = [k for k in range(len(full) - len(plain) + 1) if full[k:k + len(plain)] == plain]
    if not starts or full[starts[0] + len(plain):]:
        raise ScoringError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')}: its special tokens wrap an encoding "
                           f"as {full} around {plain}; only tokens prepended before the text are supported "
                           "(appended ones, e.g. add_eos_token, would become part of a candidate)")
    prefix = full[:starts[0]]
    info = {"prefix_ids": prefix, "add_bos": tokenizer.bos_token_id is not None and prefix == [tokenizer.bos_token_id],
            "bos_token_id": tokenizer.bos_token_id, "marker": tokenizer.bos_token or tokenizer.eos_token,
            "config_add_bos_token": tokenizer.init_kwargs.get("add_bos_token"), "rule": SPECIAL_TOKENS_RULE}
    tokenizer._evidence_special_tokens = info
    return info


def encode_text(tokenizer, text):
    """Token ids of `text` with the tokenizer's own leading special tokens (special_tokens)."""
    info = special_tokens(tokenizer)
    prefix = [] if info["marker"] and text.startswith(info["marker"]) else info["prefix_ids"]
    return prefix + tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_pair(tokenizer, context, candidate, where=""):
    """Token ids of the context and of the candidate, split where the context's own tokens end (the context ids
    include the tokenizer's leading special tokens, if it adds any: encode_text)."""
    if context != context.rstrip():
        raise ScoringError(f"{where}: context ends with whitespace {context[-3:]!r}; the target delimiter "
                           "belongs to the candidate")
    ctx_ids = encode_text(tokenizer, context)
    whole_ids = encode_text(tokenizer, context + candidate)
    if whole_ids[:len(ctx_ids)] != ctx_ids:
        raise ScoringError(f"{where}: context tokens are not a prefix of context+candidate tokens "
                           f"(candidate {candidate!r})")
    cand_ids = whole_ids[len(ctx_ids):]
    if not cand_ids:
        raise ScoringError(f"{where}: candidate {candidate!r} adds no tokens")
    return ctx_ids, cand_ids


def check_boundary(tokenizer, context, candidate, ctx_ids, cand_ids, where=""):
    """Re-derive the split and compare: catches a boundary or token list that does not belong to this text."""
    want_ctx, want_cand = encode_pair(tokenizer, context, candidate, where)
    if (want_ctx, want_cand) != (list(ctx_ids), list(cand_ids)):
        raise ScoringError(f"{where}: candidate {candidate!r} boundary mismatch: expected start {len(want_ctx)} "
                           f"ids {want_cand}, found start {len(ctx_ids)} ids {list(cand_ids)}")


def check_length(n_tokens, limit, where=""):
    if n_tokens > limit:
        raise ScoringError(f"{where}: input has {n_tokens} tokens, over the limit of {limit}; refusing to "
                           "truncate (shorten the input or raise max_input_tokens in config.py)")


@torch.no_grad()
def candidate_logprob(model, ctx_ids, cand_ids):
    """Sum of the candidate tokens' log-probabilities, each predicted from everything before it."""
    inp = torch.tensor([(ctx_ids + cand_ids)[:-1]], dtype=torch.long, device=model.device)
    logprobs = torch.log_softmax(model(inp).logits, dim=-1)[0]       # [L-1, vocab], in the model's dtype
    first = len(ctx_ids) - 1                                        # position that predicts the first candidate token
    rows = logprobs[first:first + len(cand_ids)]
    index = torch.tensor(cand_ids, dtype=torch.long, device=model.device).unsqueeze(1)
    picked = torch.gather(rows, 1, index).squeeze(1)
    return float(picked.sum())


def input_key(ctx_ids, cand_ids):
    """The ids the model sees for this candidate: context + candidate but its last token (lm-eval's group key)."""
    return tuple(ctx_ids) + tuple(cand_ids[:-1])


@torch.no_grad()
def candidate_logprob_memo(model, ctx_ids, cand_ids, memo):
    """candidate_logprob with the forward pass memoised on the exact input ids (input_key).

    The same computation as candidate_logprob, run once per distinct input sequence: candidates that leave the
    model the identical input read their tokens' log-probabilities from the same rows (the last len(cand_ids)
    rows of the input, which is where candidate_logprob reads them too). The caller owns `memo` (a dict; its
    size is the number of forward passes run) and drops it when the contexts change."""
    key = input_key(ctx_ids, cand_ids)
    if key not in memo:
        inp = torch.tensor([list(key)], dtype=torch.long, device=model.device)
        memo[key] = torch.log_softmax(model(inp).logits, dim=-1)[0]       # [L-1, vocab], in the model's dtype
    first = len(ctx_ids) - 1
    rows = memo[key][first:first + len(cand_ids)]
    index = torch.tensor(cand_ids, dtype=torch.long, device=model.device).unsqueeze(1)
    picked = torch.gather(rows, 1, index).squeeze(1)
    return float(picked.sum())


def argmax_first(scores):
    """Index of the largest score; the first one wins a tie."""
    best = 0
    for j, s in enumerate(scores):
        if s > scores[best]:
            best = j
    return best


def score_candidates(model, tokenizer, context, candidates, limit, where="", memo=None):
    """Score every candidate of one item: token ids, start boundary and summed log-probability for each.

    One forward pass per distinct input sequence (candidate_logprob_memo): the candidates of this call share a
    fresh memo, or `memo` (a dict owned by the caller) when several calls share inputs (the options experiment's
    conditions over one list prompt)."""
    memo = {} if memo is None else memo
    scored = []
    for cand in candidates:
        ctx_ids, cand_ids = encode_pair(tokenizer, context, cand, where)
        check_length(len(ctx_ids) + len(cand_ids), limit, where)
        score = candidate_logprob_memo(model, ctx_ids, cand_ids, memo)
        scored.append({"text": cand, "token_ids": cand_ids, "start": len(ctx_ids), "score": score})
    return scored
