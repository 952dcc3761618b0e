"""The audit's one reading of lm-eval's HFLM (lm-eval 0.4.9.2 lm_eval/models/huggingface.py, written again: nothing
imports lm_eval): how it batches loglikelihood requests, how it turns a batch's logits into each request's score and
is_greedy, and transformers' own class loaded as HFLM loads it. Both forward levels call it: run.py evidence's
(forward.py: its official path is lm-eval's) and `audit.py --lm-eval`'s (lmeval/rescore.py), so a batching fix for a
new lm-eval release is made here once.

Batches (HFLM._loglikelihood_tokens, models/huggingface.py:1131-1363, with its Collator, models/utils.py:355-560):
requests grouped by context + continuation[:-1] (unless logits_cache=False), one representative per group (its
longest continuation, first in request order), sorted by (-len(tokens), tokens), chunks of batch_size, each row
(context + continuation)[-(max_length + 1):][:-1], right-padded with 0. Scores: log_softmax over the vocabulary (in
softmax_dtype when given, else the logits' dtype); each member reads the representative's last len(continuation)
rows: greedy from the trailing len(its continuation) of them, its score gathered from the LEADING ones
(torch.gather over the first len(its continuation) rows) and summed in that dtype, as lm-eval does.

torch and transformers are imported inside the functions: the arithmetic level never imports them.
"""
from pathlib import Path

_MODELS = {}    # (model directory, dtype, attention, device) -> transformers' model, loaded once per audit


class Scorer:
    """One implementation in one dtype: `label` (what ran, for the report) and `logits(ids)` for a padded batch."""

    def __init__(self, label, dtype, logits):
        self.label, self.dtype, self.logits = label, dtype, logits


class NoTransformers(ImportError):
    """transformers is not installed (the caller names what it would have loaded)."""


def load_model(model_dir, dtype, attention="eager", device="cpu"):
    """(transformers' model for config.json's architecture in `dtype` with `attention` on `device`, None) — loaded
    as HFLM loads it (safetensors only, no custom code, inference mode), once per audit — or (None, why not);
    NoTransformers without transformers."""
    import torch
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise NoTransformers(str(e)) from None
    key = (str(Path(model_dir).resolve()), dtype, attention, device)
    if key not in _MODELS:
        try:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                         attn_implementation=attention, use_safetensors=True,
                                                         trust_remote_code=False, local_files_only=True)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            return None, f"transformers could not load {model_dir}: {str(e).splitlines()[0][:200]}"
        if device != "cpu":
            model = model.to(device)
        _MODELS[key] = model.train(False)     # inference mode (dropout off), as eval() sets
    return _MODELS[key], None


def model_label(model, attention, device):
    """What ran, for a row: transformers' class, its attention and device."""
    return f"transformers' {type(model).__name__}" + (f" ({attention} attention)" if attention != "eager" else "") \
        + (f" on {device}" if device != "cpu" else "") + ", not the audit's own"


def load_transformers(model_dir, dtype, attention="eager", device="cpu"):
    """(Scorer, None) running transformers' own class for config.json's architecture (load_model), or (None, why
    not); NoTransformers without transformers."""
    model, why = load_model(model_dir, dtype, attention, device)
    if model is None:
        return None, why
    return Scorer(model_label(model, attention, device), dtype, lambda ids: model(ids).logits), None


def lm_eval_groups(requests, group=True):
    """lm-eval's order of one loglikelihood call over `requests` [(context ids, continuation ids)]: a list of
    (representative, [members]) request indices, in the order HFLM runs them (module docstring)."""
    groups = {}
    for n, (c, k) in enumerate(requests):
        groups.setdefault(tuple(c) + tuple(k[:-1]) if group else n, []).append(n)
    reps = [(max(m, key=lambda n: len(requests[n][1])), m) for m in groups.values()]    # max: the first longest
    full = lambda n: tuple(requests[n][0]) + tuple(requests[n][1])                      # noqa: E731
    return sorted(reps, key=lambda rm: (-len(full(rm[0])), full(rm[0])))


def score_requests(logits, requests, batch_size, max_length=None, group=True, softmax_dtype=None, device="cpu",
                   margins=None):
    """[(score, is_greedy)] per request, computed as HFLM computes them in its batches of batch_size (1: one
    unpadded sequence per pass); `logits(ids)` is a Scorer's, ids a right-padded LongTensor [B, T]. With a dict
    `margins`, margins[n] = request n's greedy margin: over its continuation's tokens, the least of (its
    log-probability - the best other token's); >= 0 when is_greedy (ties aside), how far is_greedy is from
    flipping."""
    import torch
    import torch.nn.functional as F

    order = lm_eval_groups(requests, group)
    out = [None] * len(requests)
    with torch.no_grad():
        for lo in range(0, len(order), batch_size):
            chunk = order[lo:lo + batch_size]
            rows = []
            for rep, _ in chunk:
                whole = list(requests[rep][0]) + list(requests[rep][1])
                rows.append((whole[-(max_length + 1):] if max_length else whole)[:-1])
            ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            lp = F.log_softmax(logits(ids.to(device)), dim=-1, dtype=softmax_dtype)
            for i, (rep, members) in enumerate(chunk):
                inplen, contlen = len(rows[i]), len(requests[rep][1])
                sel = lp[i, inplen - contlen:inplen].unsqueeze(0)                     # [1, contlen, vocab]
                greedy_tokens = sel.argmax(dim=-1)
                for n in members:
                    cont = torch.tensor(requests[n][1], dtype=torch.long, device=sel.device).unsqueeze(0)
                    greedy = bool((greedy_tokens[:, -cont.shape[1]:] == cont).all())
                    picked = torch.gather(sel, 2, cont.unsqueeze(-1)).squeeze(-1)
                    out[n] = (float(picked.sum()), greedy)
                    if margins is not None:
                        lps = sel[0, -cont.shape[1]:].float()
                        top2 = lps.topk(2, dim=-1)
                        best_other = torch.where(top2.indices[:, 0] == cont[0], top2.values[:, 1], top2.values[:, 0])
                        margins[n] = float((lps.gather(1, cont[0].unsqueeze(1)).squeeze(1) - best_other).min())
            del lp
    return out


def score_with_margins(logits, requests, batch_size, max_length, group, softmax_dtype, device):
    """score_requests' [(score, is_greedy)] with each request's greedy margin: [(score, is_greedy, margin)]."""
    margins = {}
    got = score_requests(logits, requests, batch_size, max_length, group, softmax_dtype, device, margins)
    return [(score, greedy, margins[n]) for n, (score, greedy) in enumerate(got)]
