"""Fast mode of the independent scorer: the same candidate score as experiments/scoring.py, computed in batches.

    s_ij = sum_t log p(y_jt | x_i, y_j,<t)      (as in scoring.py: no BOS, no EOS, no normalisation)

Parity mode (scoring.py: lm-eval's own batches, so lm-eval's tensors) stays the default and is the one that must
agree with lm-eval bit for bit. This mode runs batches of its own, other shapes than lm-eval's, so it trades
bit-exactness for speed; it is accepted only where it agrees with parity mode (every argmax identical, max |fast -
parity| within config `fast_tolerance`), and the protocol experiment reports that comparison on the same run
(`run.py --fast`). Scores from this mode are never written to the result cache.

What makes it fast (all of it plain PyTorch around the Hugging Face model; no custom kernels):
1. One forward pass per shared context. Candidates whose context token ids are identical share one pass; a
   one-token candidate is read from the last context position, so every one-token candidate of a context costs
   one output-layer row between them.
2. Output-layer logits only where they are scored: `model.model(...)` gives the final hidden states, the scored
   positions are gathered, `model.lm_head` is applied to those rows only and log_softmax runs over the vocabulary
   on those rows (parity mode computes logits and log_softmax at every position).
3. Batches grouped by length: contexts are sorted by token count and cut into batches of at most `batch_size`
   sequences and `max_batch_tokens` padded tokens. Right padding with an explicit attention_mask: the real tokens
   keep positions 0..L-1 and never see a pad token (pads come after them; the causal mask does the rest), and pad
   positions are never read. (Hugging Face Llama takes position ids from the cache position, not from the mask;
   with left padding the real tokens would be shifted, which rotary embeddings forgive -- attention depends on
   relative positions -- but a missing mask would not.) Where positions do matter is step 4.
4. Key/value reuse for a shared prefix ("trunk" and "branches"): requests given the same `group` share the
   longest common token prefix of their contexts. The trunk runs once (with use_cache); every branch -- the rest of
   a context, plus a multi-token candidate's tokens but its last -- runs on the trunk's keys and values with
   explicit position_ids (the trunk's own length + offset: the default would continue after the padded length
   and put a short trunk's branch too far from it) and a mask that hides the trunk batch's padding. Multi-token
   candidates always go this way: their context runs once and each candidate only adds its own tokens.
5. Data parallel on the CPU (`workers`, config fast_workers, default one per configured thread): whole batches run
   on Python threads with one intra-op torch thread each, instead of one batch split across threads. Small
   matrices split across threads wait on each other at every operation, and on a shared machine one descheduled
   thread stalls them all; independent batches do not. A batch's scores do not depend on which worker ran it
   (bit-identical with 1 or 3 workers at one intra-op thread each); they can differ in the last bits from a run
   with more intra-op threads, whose kernels split the matrices differently (seen on a tiny model, within 1e-5).

API (for experiments that want to adopt it; options, MC-TACO, extraction):

    score_candidate_sets(model, tokenizer, items, limit, batch_size, max_batch_tokens, workers) -> (results, stats)
        items: [{"key": any hashable, "context": str, "candidate_sets": [[str, ...], ...], "group": optional}]
        Several candidate sets for one context are scored in one pass (e.g. the options experiment's text and
        letter candidates after one list prompt). Items with equal `group` (e.g. the item idx) share their common
        token prefix. results[key] is a list (one per candidate set) of lists of
        {"text", "token_ids", "start", "score"} -- the same record shape as scoring.score_items', built with
        the same tokenisation (scoring.encode_pair: the context tokens must be a prefix; the limit is an error).
    score_token_requests(model, requests, batch_size, max_batch_tokens, workers=1) -> (scores, stats)
        The token-level core. requests: [TokenRequest(ctx_ids, cands=[ids, ...], group=None)];
        scores[i][j] is the float score of candidate j of request i.
    plan(requests, batch_size, max_batch_tokens) -> Plan   (pure Python; what will run, without a model)

`stats` counts forward passes, real and padded tokens, and output-layer rows, so a caller (bench.py) can compute
the FLOPs actually spent. workers(config) gives the worker count the configuration asks for.
"""
from dataclasses import dataclass, field

import torch

from experiments import scoring


@dataclass
class TokenRequest:
    ctx_ids: list
    cands: list                 # list of candidate token id lists (each non-empty)
    group: object = None        # requests with equal group share their contexts' common token prefix


@dataclass
class Trunk:
    ids: tuple
    row_picks: list = field(default_factory=list)      # (token, target) read from the trunk's last position
    branches: list = field(default_factory=list)       # indices into Plan.branches


@dataclass
class Branch:
    trunk: int
    ids: tuple                                         # tokens after the trunk (non-empty)
    picks: list = field(default_factory=list)          # (position in branch, token, target)


@dataclass
class Plan:
    trunks: list
    branches: list
    batches: list               # [[trunk index, ...], ...] in the order they run
    targets: list               # [(request index, candidate index)] in request order


def workers(config):
    """config fast_workers, or one worker per configured torch thread when it is None."""
    return config.get("fast_workers") or config["threads"]


def _lcp(seqs):
    first = seqs[0]
    n = min(len(s) for s in seqs)
    k = 0
    while k < n and all(s[k] == first[k] for s in seqs):
        k += 1
    return k


def plan(requests, batch_size, max_batch_tokens):
    """Decide trunks, branches and batches. Pure Python; deterministic in the order of `requests`."""
    if batch_size < 1 or max_batch_tokens < 1:
        raise ValueError("batch_size and max_batch_tokens must be positive")
    # group -> distinct contexts, in first-appearance order
    groups, order = {}, []
    for i, r in enumerate(requests):
        ctx = tuple(r.ctx_ids)
        if not ctx:
            raise scoring.ScoringError(f"request {i}: empty context (nothing predicts the first candidate token)")
        if not r.cands or any(len(c) == 0 for c in r.cands):
            raise scoring.ScoringError(f"request {i}: a candidate with no tokens")
        g = ("ctx", ctx) if r.group is None else ("group", r.group)
        if g not in groups:
            groups[g] = []
            order.append(g)
        if ctx not in groups[g]:
            groups[g].append(ctx)
    trunk_of_ctx = {}          # (group, ctx) -> (trunk index, trunk length)
    trunks, trunk_index = [], {}

    def trunk_for(ids):
        if ids not in trunk_index:
            trunk_index[ids] = len(trunks)
            trunks.append(Trunk(ids=ids))
        return trunk_index[ids]

    for g in order:
        ctxs = groups[g]
        k = _lcp(ctxs)
        for ctx in ctxs:
            if k == 0:                       # nothing shared: each context is its own trunk
                trunk_of_ctx[(g, ctx)] = (trunk_for(ctx), len(ctx))
            else:
                trunk_of_ctx[(g, ctx)] = (trunk_for(ctx[:k]), k)

    branches, branch_index, targets = [], {}, []
    for i, r in enumerate(requests):
        ctx = tuple(r.ctx_ids)
        g = ("ctx", ctx) if r.group is None else ("group", r.group)
        t, k = trunk_of_ctx[(g, ctx)]
        suffix = ctx[k:]
        for j, cand in enumerate(r.cands):
            target = len(targets)
            targets.append((i, j))
            tokens = suffix + tuple(cand[:-1])
            picks = []
            for q, tok in enumerate(cand):
                pos = len(suffix) + q - 1    # position (within the branch) whose output predicts tok
                picks.append((pos, int(tok)))
            if picks[0][0] == -1:
                trunks[t].row_picks.append((picks[0][1], target))
                picks = picks[1:]
            if not picks:
                continue
            key = (t, tokens)
            if key not in branch_index:
                branch_index[key] = len(branches)
                branches.append(Branch(trunk=t, ids=tokens))
                trunks[t].branches.append(branch_index[key])
            branches[branch_index[key]].picks += [(pos, tok, target) for pos, tok in picks]

    # batches of trunks grouped by length (stable: equal lengths keep first-appearance order)
    by_len = sorted(range(len(trunks)), key=lambda t: len(trunks[t].ids))
    batches, cur = [], []
    for t in by_len:
        n = len(trunks[t].ids)           # the longest so far (ascending order)
        if cur and (len(cur) + 1 > batch_size or (len(cur) + 1) * n > max_batch_tokens):
            batches.append(cur)
            cur = []
        cur.append(t)
    if cur:
        batches.append(cur)
    return Plan(trunks=trunks, branches=branches, batches=batches, targets=targets)


def _pad(seqs, pad_id):
    """Right-padded [B, Lmax] ids and the [B, Lmax] attention mask (1 real, 0 pad)."""
    lmax = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), lmax), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), lmax), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[b, :len(s)] = 1
    return ids, mask


def _row_logprobs(model, hidden_rows):
    """log_softmax over the vocabulary of the output layer applied to the given final hidden states only."""
    return torch.log_softmax(model.lm_head(hidden_rows), dim=-1)


def score_token_requests(model, requests, batch_size=16, max_batch_tokens=4096, pad_id=None, workers=1):
    """Score every candidate of every request. Returns (scores, stats): scores[i][j] is a Python float.

    workers > 1 runs the batches on that many Python threads with one intra-op torch thread each (data parallel;
    torch releases the GIL inside its kernels). A batch's result does not depend on which worker runs it."""
    p = plan(requests, batch_size, max_batch_tokens)
    if pad_id is None:
        pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    parts = [[] for _ in p.targets]      # per target: the candidate tokens' log-probabilities, in token order
    keys = ["forward_passes", "trunk_forward_passes", "branch_forward_passes", "real_tokens", "padded_tokens",
            "output_rows", "sequences"]
    per_worker = [dict.fromkeys(keys, 0) for _ in range(max(1, workers))]
    run = lambda batch, st: _run_batch(model, p, batch, pad_id, parts, st, batch_size, max_batch_tokens)
    if workers <= 1:
        with torch.inference_mode():
            for batch in p.batches:
                run(batch, per_worker[0])
    else:
        _run_parallel(p.batches, run, per_worker)
    stats = {k: sum(w[k] for w in per_worker) for k in keys}
    stats.update(trunks=len(p.trunks), branches=len(p.branches), batch_size=batch_size,
                 max_batch_tokens=max_batch_tokens, workers=max(1, workers))
    scores = [[None] * len(r.cands) for r in requests]
    for target, (i, j) in enumerate(p.targets):
        # the same reduction as parity mode: fp32 sum of the candidate tokens' fp32 log-probabilities, in order
        scores[i][j] = float(torch.tensor(parts[target], dtype=torch.float32).sum())
    return scores, stats


def _run_parallel(batches, run, per_worker):
    import queue
    import threading

    todo = queue.Queue()
    for batch in sorted(batches, key=len, reverse=True):
        todo.put(batch)
    errors = []

    def work(st):
        try:
            with torch.inference_mode():             # thread-local: each worker enters it itself
                while True:
                    try:
                        batch = todo.get_nowait()
                    except queue.Empty:
                        return
                    run(batch, st)
        except BaseException as e:                   # re-raised in the caller below
            errors.append(e)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        threads = [threading.Thread(target=work, args=(st,), daemon=True) for st in per_worker]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        torch.set_num_threads(before)
    if errors:
        raise errors[0]


def _run_batch(model, p, batch, pad_id, parts, stats, batch_size, max_batch_tokens):
    """One trunk batch (right-padded) and then the branches that continue from its keys and values."""
    seqs = [p.trunks[t].ids for t in batch]
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    ids, mask = _pad(seqs, pad_id)
    padded = bool((mask == 0).any())
    need_kv = any(p.trunks[t].branches for t in batch)
    out = model.model(input_ids=ids, attention_mask=mask if padded else None, use_cache=need_kv)
    stats["forward_passes"] += 1
    stats["trunk_forward_passes"] += 1
    stats["sequences"] += len(seqs)
    stats["real_tokens"] += int(lens.sum())
    stats["padded_tokens"] += ids.numel()
    hidden = out.last_hidden_state                          # [B, Lmax, d]

    # one-token candidates (and first tokens) read at each trunk's last position
    row_b = [b for b, t in enumerate(batch) if p.trunks[t].row_picks]
    if row_b:
        idx = torch.tensor(row_b, dtype=torch.long)
        lp = _row_logprobs(model, hidden[idx, lens[idx] - 1])   # [R, V]
        stats["output_rows"] += len(row_b)
        picks = [(r, tok, target) for r, b in enumerate(row_b) for tok, target in p.trunks[batch[b]].row_picks]
        _collect(lp, picks, parts)
    if not need_kv:
        return

    # branches continue from their trunk's keys and values
    legacy = out.past_key_values.to_legacy_cache()
    rows = [(b, bi) for b, t in enumerate(batch) for bi in p.trunks[t].branches]
    rows.sort(key=lambda x: len(p.branches[x[1]].ids))
    chunk, trunk_max = [], 0
    for b, bi in rows:                  # ascending branch length: the newest row is the longest branch
        cost = (len(chunk) + 1) * (max(trunk_max, int(lens[b])) + len(p.branches[bi].ids))
        if chunk and (len(chunk) + 1 > batch_size or cost > max_batch_tokens):
            _run_branches(model, p, chunk, lens, mask, legacy, pad_id, parts, stats)
            chunk, trunk_max = [], 0
        chunk.append((b, bi))
        trunk_max = max(trunk_max, int(lens[b]))
    _run_branches(model, p, chunk, lens, mask, legacy, pad_id, parts, stats)


def _run_branches(model, p, chunk, trunk_lens, trunk_mask, legacy, pad_id, parts, stats):
    from transformers import DynamicCache

    sel = torch.tensor([b for b, _ in chunk], dtype=torch.long)
    seqs = [p.branches[bi].ids for _, bi in chunk]
    lk = int(trunk_lens[sel].max())                      # drop trunk padding no selected row needs
    past = DynamicCache.from_legacy_cache(tuple((k.index_select(0, sel)[:, :, :lk], v.index_select(0, sel)[:, :, :lk])
                                                for k, v in legacy))
    ids, bmask = _pad(seqs, pad_id)
    mask = torch.cat([trunk_mask[sel, :lk], bmask], dim=1)       # trunk padding hidden, branch padding after
    pos = trunk_lens[sel].unsqueeze(1) + torch.arange(ids.shape[1]).unsqueeze(0)
    out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=past, use_cache=True)
    stats["forward_passes"] += 1
    stats["branch_forward_passes"] += 1
    stats["sequences"] += len(chunk)
    stats["real_tokens"] += sum(len(s) for s in seqs)
    stats["padded_tokens"] += ids.numel()
    hidden = out.last_hidden_state                               # [n, M, d]
    where = [(r, pos_, tok, target) for r, (_, bi) in enumerate(chunk) for pos_, tok, target in p.branches[bi].picks]
    rows = sorted({(r, pos_) for r, pos_, _, _ in where})
    row_of = {rp: k for k, rp in enumerate(rows)}
    lp = _row_logprobs(model, hidden[torch.tensor([r for r, _ in rows]), torch.tensor([q for _, q in rows])])
    stats["output_rows"] += len(rows)
    _collect(lp, [(row_of[(r, pos_)], tok, target) for r, pos_, tok, target in where], parts)


def _collect(lp, picks, parts):
    """parts[target] += lp[row, token] for each (row, token, target), as exact Python floats (fp32 values)."""
    vals = lp[torch.tensor([r for r, _, _ in picks]), torch.tensor([t for _, t, _ in picks])].tolist()
    for (_, _, target), v in zip(picks, vals):
        parts[target].append(v)


def score_candidate_sets(model, tokenizer, items, limit, batch_size=16, max_batch_tokens=4096, workers=1):
    """Text-level API: several candidate sets per context, each candidate tokenised exactly as parity mode does.

    Returns ({key: [[{"text", "token_ids", "start", "score"}, ...] per candidate set]}, stats)."""
    requests, layout = [], []
    for it in items:
        where = f"{it['key']}"
        texts = []
        for cset in it["candidate_sets"]:
            for c in cset:
                if c not in texts:
                    texts.append(c)
        ctx_ids, cands = None, []
        for c in texts:
            c_ctx, c_ids = scoring.encode_pair(tokenizer, it["context"], c, where)
            scoring.check_length(len(c_ctx) + len(c_ids), limit, where)
            if ctx_ids is None:
                ctx_ids = c_ctx
            elif c_ctx != ctx_ids:       # encode_pair tokenises the context alone: it cannot differ, but check
                raise scoring.ScoringError(f"{where}: context tokenised differently for candidate {c!r}")
            cands.append(c_ids)
        requests.append(TokenRequest(ctx_ids=ctx_ids, cands=cands, group=it.get("group")))
        layout.append((it, texts, ctx_ids, cands))
    scores, stats = score_token_requests(model, requests, batch_size, max_batch_tokens, workers=workers)
    results = {}
    for (it, texts, ctx_ids, cands), sc in zip(layout, scores):
        by_text = {t: {"text": t, "token_ids": list(ids), "start": len(ctx_ids), "score": s}
                   for t, ids, s in zip(texts, cands, sc)}
        results[it["key"]] = [[dict(by_text[c]) for c in cset] for cset in it["candidate_sets"]]
    return results, stats


def score_candidates_fast(model, tokenizer, contexts, limit, batch_size=16, max_batch_tokens=4096, workers=1):
    """One candidate set per context: [(key, context, candidates)] -> ({key: [scored dicts]}, stats)."""
    items = [{"key": k, "context": c, "candidate_sets": [cands]} for k, c, cands in contexts]
    res, stats = score_candidate_sets(model, tokenizer, items, limit, batch_size, max_batch_tokens, workers)
    return {k: v[0] for k, v in res.items()}, stats
