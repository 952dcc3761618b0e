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
limit are an error, never truncated.

Why the model sees lm-eval's batches (parity mode). A CPU matrix kernel may split a matrix differently by its shape
and by the thread count, so the same row can round differently alone and inside a padded batch (measured: up to
6.9e-5 nats on an AVX-512 Xeon at 2 threads; nothing on the AMD EPYC here in float32, 0.031 in float16). Agreement
with lm-eval is therefore made by construction, not hoped for: this path forms, from its own reading of how
lm-eval 0.4.9.2's HFLM batches loglikelihood requests (SOURCE_MAP.md, "Batches"), the same padded input tensors
and sends them through the same operations -- model(ids).logits, log_softmax over the vocabulary, the
continuation rows, gather, sum -- so every score is the same float on any CPU, thread count and dtype
(`lm_eval_batches`, `score_batches`). At batch size 1 that is one unpadded sequence per forward pass.

`candidate_logprob` is the definition itself, one pass per candidate: the tests compare it with the batched path
at batch size 1, where the tensors are the same.
"""
import hashlib

import torch

from experiments.evidence import ScoringError  # noqa: F401 -- raised here; defined where run.py can catch it cheaply


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
    """Sum of the candidate tokens' log-probabilities, each predicted from everything before it (one pass, batch 1)."""
    inp = torch.tensor([(ctx_ids + cand_ids)[:-1]], dtype=torch.long, device=model.device)
    logprobs = torch.log_softmax(model(inp).logits, dim=-1)[0]       # [L-1, vocab], in the model's dtype
    first = len(ctx_ids) - 1                                        # position that predicts the first candidate token
    rows = logprobs[first:first + len(cand_ids)]
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


# ---- lm-eval's batches ---------------------------------------------------------------------------------------

BATCH_RULE = ("lm-eval 0.4.9.2 HFLM loglikelihood batches, formed independently: one forward row per distinct "
              "input (context + candidate without its last token); rows longest first, equal lengths by token ids "
              "ascending; consecutive chunks of batch_size rows; each right-padded with id 0 to its longest row, "
              "no attention mask; log_softmax over the vocabulary of the whole batch; a candidate's score is the "
              "sum of its tokens' log-probabilities read from the last len(candidate) positions of its row")


class BatchPlan:
    """How lm-eval batches one loglikelihood call (lm_eval_batches): `rows` (input ids, in lm-eval's order),
    `batches` ([start, end) ranges into rows), `row_of` (each request's row) and `batch_of` (each row's batch)."""

    def __init__(self, rows, batch_size, row_of):
        self.rows, self.batch_size, self.row_of = rows, batch_size, row_of
        self.batches = [(lo, min(lo + batch_size, len(rows))) for lo in range(0, len(rows), batch_size)]
        self.batch_of = [b for b, (lo, hi) in enumerate(self.batches) for _ in range(lo, hi)]

    def where(self, request):
        """[batch, row within the batch, rows in the batch, padded length] of a request: where its score sits in
        the tensors, and their shape."""
        row = self.row_of[request]
        b = self.batch_of[row]
        lo, hi = self.batches[b]
        return [b, row - lo, hi - lo, len(self.rows[lo])]

    def shapes(self):
        """[rows, padded length] of every batch."""
        return [[hi - lo, len(self.rows[lo])] for lo, hi in self.batches]


def lm_eval_batches(requests, batch_size):
    """The batches lm-eval's HFLM forms for one loglikelihood call over `requests` [(context ids, candidate ids)].

    1. A request's forward input is context + candidate without its last token. Requests with the same input (every
       one-token candidate after one context, or the same text twice) share one row: HFLM's Collator groups by
       exactly this key (group_by="contexts", which HFLM uses with logits_cache, its default).
    2. Rows are ordered by HFLM's sort key on context + candidate: longer first, then the token ids ascending. Two
       rows of one length differ somewhere before their last token, so ordering the rows themselves by (-length,
       ids) is the same order, and it is total: the plan depends only on the set of requests, not their order.
    3. Consecutive chunks of batch_size rows form the batches (the last may be short).
    The set of requests must be the set lm-eval receives in that call: a different set is a different plan."""
    if batch_size < 1:
        raise ScoringError(f"batch size {batch_size}: expected 1 or more")
    keys = [tuple(ctx) + tuple(cand[:-1]) for ctx, cand in requests]
    rows = sorted(set(keys), key=lambda k: (-len(k), k))
    index = {k: n for n, k in enumerate(rows)}
    return BatchPlan(rows, batch_size, [index[k] for k in keys])


@torch.no_grad()
def batch_logprobs(model, rows):
    """log_softmax of the logits of one batch, as HFLM computes them: the rows right-padded with id 0 to the
    longest, the model called on the ids alone (the causal mask keeps the pads after every real position),
    log_softmax over the vocabulary of the whole [rows, length, vocab] tensor in the model's dtype."""
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return torch.log_softmax(model(ids.to(model.device)).logits, dim=-1)


def read_score(logprobs, row, row_len, cand_ids):
    """One candidate's summed log-probability from its row of a batch: the last len(cand_ids) real positions,
    gathered and summed in the shapes HFLM uses ([1, n, vocab] -> [1, n] -> a sum)."""
    n = len(cand_ids)
    picked = logprobs[row, row_len - n:row_len].unsqueeze(0)
    index = torch.tensor(cand_ids, dtype=torch.long, device=picked.device).view(1, n, 1)
    return float(torch.gather(picked, 2, index).squeeze(-1).sum())


def score_batches(model, plan, requests, cache=None, progress=None):
    """Every request's score, batch by batch as `plan` says: ([score per request], [served from the cache?]).

    cache (optional): an object with get_batch(rows, picks) -> [score] or None and put_batch(rows, picks, scores)
    (experiments/result_cache.py). A batch is served whole or computed whole: a row's score depends on its batch,
    so a batch is never partly recomputed. progress: called with the number of requests each batch finished."""
    members = [[] for _ in plan.batches]
    for n in range(len(requests)):
        members[plan.batch_of[plan.row_of[n]]].append(n)
    scores, cached = [None] * len(requests), [False] * len(requests)
    for b, (lo, hi) in enumerate(plan.batches):
        rows = plan.rows[lo:hi]
        picks = [[plan.row_of[n] - lo, list(requests[n][1])] for n in members[b]]
        got = cache.get_batch(rows, picks) if cache is not None else None
        if got is None:
            logprobs = batch_logprobs(model, rows)
            got = [read_score(logprobs, row, len(rows[row]), cand) for row, cand in picks]
            del logprobs
            if cache is not None:
                cache.put_batch(rows, picks, got)
        else:
            for n in members[b]:
                cached[n] = True
        for n, s in zip(members[b], got):
            scores[n] = s
        if progress is not None:
            progress(len(members[b]))
    return scores, cached


def encode_items(tokenizer, items, limit):
    """[(where, context, candidates)] -> the (context ids, candidate ids) of every candidate, item by item.
    limit None: no length check (planning only; scoring checks)."""
    requests = []
    for where, context, candidates in items:
        for cand in candidates:
            ctx_ids, cand_ids = encode_pair(tokenizer, context, cand, where)
            if limit is not None:
                check_length(len(ctx_ids) + len(cand_ids), limit, where)
            requests.append((ctx_ids, cand_ids))
    return requests


def score_items(model, tokenizer, items, limit, batch_size, cache=None, progress=None, requests=None):
    """Score every candidate of every item [(where, context, candidates)] in lm-eval's batches for this whole set
    of items (one loglikelihood call of lm-eval over the same requests). `requests`: the items already encoded
    (encode_items without a limit: a data-parallel plan encodes them once, two_paths.by_whole_batches); their
    lengths are checked here as encode_items checks them.

    Returns ([[{"text", "token_ids", "start", "score", "batch": BatchPlan.where}] per item], plan, served) with
    served[k] True for the k-th candidate overall if its batch came from the cache."""
    if requests is None:
        requests = encode_items(tokenizer, items, limit)
    else:
        wheres = [where for where, _, candidates in items for _ in candidates]
        for where, (ctx_ids, cand_ids) in zip(wheres, requests):
            check_length(len(ctx_ids) + len(cand_ids), limit, where)
    plan = lm_eval_batches(requests, batch_size)
    scores, served = score_batches(model, plan, requests, cache, progress)
    out, k = [], 0
    for _, _, candidates in items:
        scored = []
        for cand in candidates:
            ctx_ids, cand_ids = requests[k]
            scored.append({"text": cand, "token_ids": cand_ids, "start": len(ctx_ids), "score": scores[k],
                           "batch": plan.where(k)})
            k += 1
        out.append(scored)
    return out, plan, served
