"""Token boundaries (identity level, --tokens --model DIR) and the forward level (--forward --model DIR): every
loglikelihood request (multiple_choice and loglikelihood tasks) re-tokenised as TemplateLM._encode_pair of the
release that wrote the run does and re-scored from the weights, in the run's dtype (float32 beside it for bfloat16 /
float16), with forward.load_scorer: the audit's own Llama pass where it covers the model, else transformers' class
for config.json's architecture (hflm.py; named in the row; cannot catch an error that implementation shares with the
run).

_encode_pair (lm-eval 0.4.9.2 lm_eval/api/model.py:389-401): trailing whitespace of the context moves to the
continuation; context and context + continuation are tokenised with tok_encode; the continuation is the whole's
tokens after the context's count. tok_encode and an empty context follow the run's release (versions.py tok_encode,
each release's lines there; encoder, empty_context_pair): "tokenizer-default" (0.4.9.2 on): add_special_tokens is
model_args' add_bos_token when given, else the tokenizer's default (True: its post-processor decides), and False for
a string that starts with the prefix token's text (0.4.9.2 lm_eval/models/huggingface.py:855-872,
models/utils.py:886-900); an empty context is the prefix token, or the continuation's own leading prefix token.
"add_bos_token" (0.4.5 to 0.4.9.1): add_special_tokens is model_args' add_bos_token (default False), True for a
model whose config.json model_type contains "gemma" (--model DIR's); an empty context is the prefix token before
the continuation's tok_encode tokens. A run without a version field whose candidate releases tokenise otherwise is
not guessed: its token boundaries (and so its re-scores) are SKIPPED with that reason. loglikelihood_rolling
documents are tokenised by the same tok_encode.

Two modes, named in the row (docs/forward-dtypes.md; choose_mode, rescore_plan):
- equality expected: the release that wrote the run batches as 0.4.9.2 does (versions.py loglikelihood_batches
  "same": 0.4.9 to 0.4.13, each release's lines read there; a run without a version field must be so in every
  candidate release), the run records an integer batch size, ran the audit's transformers_version on the cpu, with
  an attention the audit computes (forward.ATTENTIONS: eager, or sdpa, transformers' default when model_args name
  none), no mixed_precision_dtype, and its pretty_env_info names this machine's kind of CPU and torch build with the
  audit at default kernels (kernels.reproduces). lm-eval records no thread count: the run machine's default, 1 and
  --threads are tried. The lines cited below are 0.4.9.2's. lm-eval runs every loglikelihood request of every task
  of the run in one call (evaluator.py:573), so the batches are formed over all of them, as HFLM forms and scores
  them (evidence_audit/hflm.py, the audit's one reading of HFLM). A run whose scores are bit-identical on more than
  REPRODUCED of its requests is held to equality; fewer (an unrecorded thread count or kernel variable): the
  tolerance, said so.
- the dtype's tolerance otherwise: in lm-eval's batches when the batch plan is known, else one unpadded sequence per
  pass (--sample, a release batching otherwise, no fixed batch size), the reason named in a reader's words. Safe on
  its own, since the facts that choose the mode are the run's record: every score within forward.TOLERANCE[dtype],
  no systematic shift (forward.SHIFT_FLOOR), each flipped prediction (acc, acc_norm, acc_bytes, acc_mutual_info,
  is_greedy) a failure past forward.MARGIN_TOLERANCE and a named near-tie within it, the aggregates recomputed from
  the re-scored loglikelihoods.

loglikelihood_rolling tasks (rolling_rows): each document's text tokenised as HFLM.tok_encode does, cut into
lm-eval's rolling windows of the results' max_length (rolling_windows), each window re-scored as one unpadded pass
in the run's dtype and the window scores summed as the run's Python sum() adds them, against the logged
log-likelihood: equality when the run scored at batch size 1 (the same tensors) by a release and transformers that
qualify as above (other_code, shared with choose_mode), else forward.TOLERANCE[dtype] per window, the mode and its
reason named in the row (lm-eval pads a run's windows in chunks of its batch size over every rolling request of the
run: not rebuilt here).

--sample N: N documents of each task drawn from the audit's seed (evidence_audit/sampling.py: fresh randomness
unless --sample-seed; the row names the seed and the detection bound); the other levels still read every document.
Limits: a run made by several processes (accelerate) is re-scored as one process's batches; --device cuda runs
transformers' class for every architecture (the own Llama pass is CPU only) and is untested here (no GPU).
"""
import json
import math
import struct
import time
from pathlib import Path

from evidence_audit import forward, kernels, tokens
from evidence_audit.hflm import score_requests, score_with_margins
from evidence_audit.checks import FORWARD, IDENTITY, expect
from evidence_audit.definitions import argmax_first
from evidence_audit.lmeval import child, fmt, persample
from evidence_audit.lmeval.bootstrap import python_summation
from evidence_audit.lmeval.files import SAMPLES_RE
from evidence_audit.lmeval.fmt import ROLLING
from evidence_audit.lmeval.metrics import builtin_sum
from evidence_audit.lmeval.persample import LOGLIKELIHOOD
from evidence_audit.lmeval.versions import BATCHES_DIFFER, BATCHES_SAME, KNOWN_VERSIONS, TOK_ADD_BOS, TOK_ENCODE
from evidence_audit.model_files import INDEX, MAX_JSON_BYTES, check_model_dir
from evidence_audit.reading import Unreadable, read_json

# The share of bit-identical scores above which a run whose record matches this machine is held to equality. On
# one machine, the same requests under another thread count or kernel path were bit-identical on at most 15 of 80
# (bfloat16, 3 threads against 1; float32: 3 of 80): docs/forward-dtypes.md.
REPRODUCED = 0.5
BOUNDARIES = "continuation token boundaries (model's tokenizer, lm-eval's _encode_pair)"
RESCORED = "loglikelihoods re-scored in the run's dtype"
ROLLING_RESCORED = "rolling loglikelihoods re-scored in the run's dtype (lm-eval's windows)"
ARGMAX = "argmax changes (the prediction) after re-scoring"
GREEDY = "is_greedy changes after re-scoring"
SHIFT = "no systematic shift (mean of logged - recomputed)"
AGGREGATES = "aggregates recomputed from the re-scored loglikelihoods"
BATCHES_OF = "0.4.9.2"          # the release whose HFLM batching score_requests is written from; the releases
                                # batching as it does: versions.py loglikelihood_batches "same"
MAX_MODEL_ARGS = 4000           # characters of model_args read (a command-line string)
MAX_HEADER = 100 * 2 ** 20      # bytes of a safetensors header read to count parameters
_RUNS = {}                      # (run, settings) -> {(task, doc_id, request): (score, greedy)}: one pass per run


# ---- what the run recorded ---------------------------------------------------------------------------------------

def model_args(run_config):
    """model_args as {key: value string}: lm-eval's "k=v,k=v" string (or the dict simple_evaluate accepts)."""
    raw = run_config.get("model_args")
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if not isinstance(raw, str):
        return {}
    return dict(p.split("=", 1) for p in raw[:MAX_MODEL_ARGS].split(",") if "=" in p)


def flag(args, key):
    """A boolean model_arg as lm-eval's simple_parse_args_string reads it (True/False, any case), or None."""
    v = args.get(key, "").strip().lower()
    return True if v == "true" else False if v == "false" else None


def run_dtype(run_config):
    """(dtype name, None) the run scored in: results' model_dtype ("torch.bfloat16"), else model_args' dtype; or
    (None, why not)."""
    rec = run_config.get("model_dtype")
    name = rec[len("torch."):] if isinstance(rec, str) and rec.startswith("torch.") else None
    if name is None and not rec:
        name = model_args(run_config).get("dtype")
    if name in forward.TORCH_DTYPES:
        return name, None
    return None, (f"the run's model_dtype is {rec!r} (model_args dtype {model_args(run_config).get('dtype')!r}); the "
                  f"forward level re-scores {', '.join(forward.TORCH_DTYPES)}")


def run_device_kind(run_config, top):
    """'cpu', 'cuda', ... the run's model ran on (config.device, else model_args device, else 'cpu' when its
    environment says CUDA was unavailable: HFLM then falls back to cpu), or None when unknown."""
    dev = run_config.get("device") or model_args(run_config).get("device")
    if isinstance(dev, str) and dev:
        return dev.split(":")[0]
    env = top.get("pretty_env_info")
    if isinstance(env, str) and "Is CUDA available: False" in env[:20000]:
        return "cpu"
    return None


def run_batch_size(run_config):
    """The run's fixed batch size (config.batch_size: an int, or the CLI's digit string), or None ("auto", none)."""
    bs = run_config.get("batch_size")
    if isinstance(bs, bool):
        return None
    if isinstance(bs, str) and bs.strip().isdigit():
        bs = int(bs)
    return bs if isinstance(bs, int) and 1 <= bs <= 1 << 20 else None


def check_device(device):
    """Refuse (Unreadable: one line, exit 2) a --device this machine does not have."""
    if device in (None, "cpu"):
        return
    import torch
    if not device.startswith("cuda"):
        raise Unreadable(f"--device {device}: the forward level runs on cpu or cuda")
    if not torch.cuda.is_available():
        raise Unreadable(f"--device {device}: torch {torch.__version__} sees no CUDA device on this machine; "
                         "run without --device (cpu)")


def audit_transformers():
    """The transformers version this audit runs with (importlib.metadata), or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def run_versions(t, top):
    """The release(s) that may have written t's run: fmt's candidates (a run without a version field may be any of
    several), else the results' lm_eval_version."""
    release = getattr(t, "release", None)
    return tuple(release.versions) if release is not None else (top.get("lm_eval_version"),)


def release_batches(t, top):
    """Why lm-eval's batches of the release(s) that wrote t's run are not score_requests' (versions.py
    loglikelihood_batches: not "same" as 0.4.9.2's), or None. A run without a version field may be any of its
    candidate releases: all of them must batch as 0.4.9.2 does."""
    versions = run_versions(t, top)
    how = {v: KNOWN_VERSIONS[v]["loglikelihood_batches"] if v in KNOWN_VERSIONS else None for v in versions}
    other = [v for v in versions if how[v] != BATCHES_SAME]
    if not other:
        return None
    what = BATCHES_DIFFER.get(how[other[0]], "a release whose batching was not read")
    return f"lm-eval {' or '.join(map(str, other))}'s batching differs from {BATCHES_OF}'s: {what}"


class Plan:
    """How the forward level re-scores a run: `batch_size` (lm-eval's batches of it; None: one unpadded sequence per
    pass), `attention` (the implementation re-scored with: the run's where the audit computes it, ATTENTIONS),
    `equality` (True: the run's kernels are reproduced here, every difference FAILs), `why` (in a reader's words: what
    matches, or why equality cannot be expected), `threads` (the torch thread counts equality is tried at) and `env`."""

    def __init__(self, batch_size, attention, equality, why, threads=(), env=None):
        self.batch_size, self.attention, self.equality, self.why, self.threads = \
            batch_size, attention, equality, why, tuple(threads)
        self.env = env          # kernel variables of a child process that re-scores (kernels.restriction), or None


def run_attention(t, top):
    """(the run's attention implementation, None) — model_args attn_implementation, else transformers' default for
    a model with sdpa support (sdpa since transformers 4.36) — or (None, why it is unknown)."""
    named = model_args(t.run_config).get("attn_implementation")
    if named:
        return named, None
    ran = top.get("transformers_version")
    parts = ran.split(".")[:2] if isinstance(ran, str) and len(ran) < 100 else []
    if len(parts) == 2 and all(p.isdigit() for p in parts) and (int(parts[0]), int(parts[1])) >= (4, 36):
        return "sdpa", None
    return None, f"the run names no attn_implementation and its transformers ({str(ran)[:20]}) has no known default"


def choose_mode(t, top, device, sample_n, threads=1, environ=None):
    """The Plan for t's run (module docstring): lm-eval's batches whenever the run's batch plan is known (the same
    tensors: on other kernels their differences are the smallest), and equality where the run's kernels are
    reproduced here (kernels.reproduces: this machine's kind of CPU, torch build and default kernels, the run's
    transformers, attention the audit computes, no autocast); else the dtype's tolerance, the reason named."""
    attention, why_attn = run_attention(t, top)
    recompute = attention if attention in forward.ATTENTIONS else "eager"
    bs = run_batch_size(t.run_config)
    if sample_n is not None:
        return Plan(None, recompute, False, "--sample re-scores part of the run, whose batches held all of it")
    why = release_batches(t, top)
    if why:
        return Plan(None, recompute, False, why)
    if bs is None:
        return Plan(None, recompute, False, f"the run records no fixed batch size (config.batch_size "
                                            f"{t.run_config.get('batch_size')!r})")
    why = other_code(t, top) or other_tensors(t, top, device, attention, why_attn)
    if why:
        return Plan(bs, recompute, False, why)
    run_cpu, here = kernels.from_pretty_env_info(top.get("pretty_env_info")), kernels.this_machine()
    same, why = kernels.reproduces(run_cpu, here, device, environ)
    if not same:
        return Plan(bs, recompute, False, why)
    candidates = dict.fromkeys(n for n in (kernels.default_threads(run_cpu), 1, threads) if n)
    return Plan(bs, recompute, True, why, candidates, kernels.restriction(run_cpu, here))


def other_code(t, top):
    """Why the run's scores did not come from the code the audit's equality is written from: its release batches
    otherwise (release_batches) or it ran another transformers than the audit's; or None."""
    why = release_batches(t, top)
    if why:
        return why
    ran, audit = top.get("transformers_version"), audit_transformers()
    if not isinstance(ran, str) or len(ran) > 100:
        return f"the run records no transformers_version (the audit's: {audit}): the same tensors are not guaranteed"
    if ran != audit:
        return f"the run's transformers {ran} is not the audit's {audit}: the same tensors are not guaranteed"
    return None


def other_tensors(t, top, device, attention=None, why_attention=None):
    """Why the audit's passes cannot give the run's numbers even on the run's tensors (its device kind, an attention
    implementation the audit does not compute, or autocast), or None."""
    args, kind = model_args(t.run_config), run_device_kind(t.run_config, top)
    if kind != device.split(":")[0]:
        return f"the run ran on {kind or 'an unrecorded device'}, the audit on {device}"
    if attention is None:
        return why_attention or "the run's attention implementation is unknown"
    if attention not in forward.ATTENTIONS:
        return (f"the run's attention is {attention}; the audit computes {' and '.join(forward.ATTENTIONS)} (re-scored "
                "with eager)")
    if args.get("mixed_precision_dtype"):
        return f"the run used autocast (mixed_precision_dtype={args['mixed_precision_dtype']})"
    return None


# ---- token boundaries (identity level) ---------------------------------------------------------------------------

def tokenising_rule(t, top):
    """(rule, None): the versions.py tok_encode rule of the release(s) that may have written t's run, or (None,
    why): candidate releases that tokenise otherwise (a run without a version field), or a release not read."""
    versions = run_versions(t, top)
    rules = {v: KNOWN_VERSIONS[v]["tok_encode"] if v in KNOWN_VERSIONS else None for v in versions}
    if None in rules.values():
        return None, f"lm-eval {' or '.join(map(str, versions))}: a release whose tokenising was not read"
    if len(set(rules.values())) > 1:
        return None, (f"the run may have been written by lm-eval {' or '.join(versions)}, which tokenise requests "
                      "otherwise (versions.py tok_encode: " + "; ".join(f"{v}: {r}" for v, r in rules.items()) +
                      "): which tokens it ran is unknown")
    return next(iter(rules.values())), None


def model_type(model_dir):
    """config.json's model_type of --model DIR ("" when absent; check_model_dir has read the file before): the
    releases of tok_encode "add_bos_token" add a BOS token for every model_type containing "gemma"."""
    path = Path(model_dir) / "config.json"
    cfg = read_json(path, MAX_JSON_BYTES) if path.is_file() else {}
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    return kind if isinstance(kind, str) else ""


def run_encoder(tok, t, top, model_dir):
    """(encode, None): encoder() under the tok_encode rule of the release(s) that wrote t's run (tokenising_rule)
    for --model DIR's model_type; or (None, why) when that rule is unknown."""
    rule, why = tokenising_rule(t, top)
    if rule is None:
        return None, why
    return encoder(tok, t.run_config, top, rule, model_type(model_dir)), None


def encoder(tok, run_config, top, rule=None, kind=""):
    """encode(text, special=None) -> ids as HFLM.tok_encode does for this run under versions.py tok_encode `rule`
    (default: that of the results' lm_eval_version; module docstring), `kind` the model's config model_type;
    encode.prefix_id: HFLM.prefix_token_id (model_args prefix_token_id, else the bos token's id, else the eos
    token's: lm_eval/models/huggingface.py:449-455), the context of an empty-context request; encode.rule."""
    if rule is None:
        rule = KNOWN_VERSIONS.get(top.get("lm_eval_version"), {}).get("tok_encode")
    if rule not in TOK_ENCODE:
        raise ValueError(f"tok_encode rule {rule!r} (results' lm_eval_version {top.get('lm_eval_version')!r}): pass "
                         f"one of {sorted(TOK_ENCODE)} (tokenising_rule)")
    args = model_args(run_config)
    add_bos = flag(args, "add_bos_token")
    if rule == TOK_ADD_BOS:     # add_special_tokens = add_bos_token (default False), True for a Gemma model_type
        add_bos = add_bos is True or "gemma" in kind
    prefix = next((rec[0] for rec in (top.get("tokenizer_bos_token"), top.get("tokenizer_eos_token"))
                   if isinstance(rec, list) and len(rec) == 2 and isinstance(rec[0], str)), None)

    def encode(text, special=None):
        if special is None:
            special = add_bos if add_bos is not None else not (prefix is not None and text.startswith(prefix))
        return tok.encode(text, add_special_tokens=special).ids
    custom = args.get("prefix_token_id", "")
    encode.prefix_id = int(custom) if custom.isdigit() else tok.token_to_id(prefix) if prefix is not None else None
    encode.rule, encode.add_bos = rule, add_bos
    return encode


def empty_context_pair(encode, continuation):
    """An empty context, by encode.rule: "tokenizer-default" (lm-eval 0.4.9.2 api/model.py:436-446) the prefix
    token, unless the continuation's tokens (no special tokens) already start with it, which then becomes the
    context; "add_bos_token" (0.4.9.1 api/model.py:375-391) the prefix token before the continuation's tok_encode
    tokens (a BOS of their own with add_bos_token)."""
    if getattr(encode, "rule", None) == TOK_ADD_BOS:
        return [encode.prefix_id], encode(continuation)
    k = encode(continuation, False)
    if k and k[0] == encode.prefix_id:
        return k[:1], k[1:]
    return [encode.prefix_id], k


def encode_pair(encode, context, continuation):
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = encode(context + continuation), encode(context)
    return ctx, whole[len(ctx):], whole[:len(ctx)] == ctx


def special_tokens(bad, tok, top):
    """The tokenizer's ids of the bos/eos/pad tokens lm-eval recorded (tokenizer_*_token: [text, id])."""
    for key in ("tokenizer_bos_token", "tokenizer_eos_token", "tokenizer_pad_token"):
        rec = top.get(key)
        if isinstance(rec, list) and len(rec) == 2 and isinstance(rec[0], str):
            expect(bad, "results", key, rec[1], str(tok.token_to_id(rec[0])), "id of that token in --model's tokenizer")


def task_ids(samples, encode):
    """{(doc_id, request index): (context ids, continuation ids)} of one task's samples (untruncated), the
    problems, and how many contexts were not a token prefix of context + continuation."""
    bad, out, not_prefix = [], {}, 0
    for s in samples:
        for i, (ctx, cont) in enumerate(s.requests):
            if (s.doc_id, i) in out:        # the same document logged under another filter
                continue
            if not ctx and encode.prefix_id is None:
                bad.append(f"{s.where} arguments.gen_args_{i}: empty context, and the results name no bos or eos "
                           "token to score it after")
                continue
            c_ids, k_ids, prefix = encode_pair(encode, ctx, cont) if ctx else empty_context_pair(encode, cont) + (True,)
            not_prefix += not prefix
            if not k_ids:
                bad.append(f"{s.where} arguments.gen_args_{i}.arg_1: {cont!r} tokenises to no token")
                continue
            out[(s.doc_id, i)] = (c_ids, k_ids)
    return out, bad, not_prefix


def missing_model(tok_path):
    """Why the tokenizer is not there, for a SKIPPED row: no --model given, or the file the directory lacks."""
    return "no --model given" if tok_path is None else f"{tok_path} not found"


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
        C.skip(t.label, IDENTITY, BOUNDARIES, f"needs --model DIR with tokenizer.json ({missing_model(tok_path)})")
        return None
    tok = tokens.load_tokenizer(tok_path)
    encode, why = run_encoder(tok, t, top, model_dir)
    if encode is None:
        C.skip(t.label, IDENTITY, BOUNDARIES, why)
        return None
    bad = []
    special_tokens(bad, tok, top)
    out, more, not_prefix = task_ids(t.samples, encode)
    bad += more
    C.add(t.label, IDENTITY, BOUNDARIES, len(out), bad,
          note=f"{tok_path}; tokenised as lm-eval {' or '.join(map(str, run_versions(t, top)))} does (versions.py "
               f"tok_encode {encode.rule!r}, add_special_tokens {special_note(encode)}); {not_prefix} requests whose "
               "context tokens are not a prefix of context+continuation")
    return None if bad else out


def special_note(encode):
    """How encode adds special tokens to a text, for a row's note."""
    if encode.add_bos is None:
        return "the tokenizer's default (none for a text starting with the prefix token)"
    return f"{encode.add_bos} (model_args add_bos_token" + (", default False, True for a Gemma model_type)"
                                                             if encode.rule == TOK_ADD_BOS else ")")


def chosen(t, sample):
    """The documents the forward level re-scores: `sample`'s draw (sampling.Sample: --sample N documents of the
    task from the audit's seed), or every document."""
    return set(sample.keys(t.name, sorted({s.doc_id for s in t.samples})))


def sample_words(C, t, keep):
    """What the forward level covered, for its row: every document, or the sample with its seed and bound."""
    return C.options.sample.describe(len(keep), len({s.doc_id for s in t.samples}), "documents")


# ---- the forward level ---------------------------------------------------------------------------------------------

def safetensors_parameters(path):
    """The number of values in a safetensors file, from its header alone (what lm-eval's model_num_parameters
    counts when the file holds parameters only, tied weights once)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER:
                raise Unreadable(f"{path}: safetensors header of {n} bytes (over {MAX_HEADER}): refused")
            header = json.loads(f.read(n))
        return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    except (struct.error, ValueError, TypeError, KeyError, AttributeError) as e:
        raise Unreadable(f"{path}: not a readable safetensors header ({type(e).__name__})") from None


def run_tasks(t, top):
    """[(task name, samples)] of every loglikelihood task of t's run (one lm-eval call scored them together), or
    (None, why) when one cannot be read."""
    m = SAMPLES_RE.fullmatch(Path(t.path).name)
    out = []
    for name, cfg in sorted(top.get("configs", {}).items()):
        if not isinstance(cfg, dict) or cfg.get("output_type") not in LOGLIKELIHOOD:
            continue
        if name == t.name:
            out.append((name, t.samples))
            continue
        path = Path(t.path).parent / f"samples_{name}_{m.group(2)}.jsonl" if m else None
        if path is None or not path.is_file():
            return None, f"task {name} of the same run has no samples file beside {Path(t.path).name}"
        out.append((name, fmt.read_samples(path, t.release, cfg)[0]))
    return out, None


def softmax_dtype(args):
    """HFLM's softmax_dtype model_arg as a torch dtype, or None (log_softmax in the logits' dtype)."""
    import torch
    sdt = getattr(torch, args.get("softmax_dtype", "").replace("torch.", ""), None)
    return sdt if isinstance(sdt, torch.dtype) else None


def rescored(t, top, model_dir, dtype, batch_size, device, keep, tok, attention="eager", threads=None, env=None):
    """{(task, doc_id, request): (score, greedy, greedy margin)}: in lm-eval's batches, every loglikelihood request
    of the run (cached per run: the other tasks read it back); one unpadded sequence per pass, t's kept documents
    only; at `threads` torch threads when given; in a child process under the kernel variables `env` when given
    (child.py). Returns (scores, scorer label, why not)."""
    args = model_args(t.run_config)
    key = (id(top), str(model_dir), dtype, batch_size, device, attention, threads, tuple(sorted((env or {}).items())),
           None if batch_size else (t.name, frozenset(keep)))
    if key in _RUNS:
        return _RUNS[key][1], _RUNS[key][2], None
    scorer, why = forward.load_scorer(model_dir, dtype, attention, device)
    if scorer is None:
        return None, None, why
    tasks, why = run_tasks(t, top) if batch_size else ([(t.name, t.samples)], None)
    if tasks is None:
        return None, None, why
    encode, why = run_encoder(tok, t, top, model_dir)
    if encode is None:
        return None, None, why
    requests, names = [], []
    for name, samples in tasks:
        ids, bad, _ = task_ids(samples, encode)
        if bad:
            return None, None, f"task {name}: {bad[0]}"
        for (doc, i), pair in sorted(ids.items()):
            if batch_size or doc in keep:
                requests.append(pair)
                names.append((name, doc, i))
    max_len = top.get("max_length") if isinstance(top.get("max_length"), int) else None
    if env:
        sdt = softmax_dtype(args)
        job = {"model_dir": str(model_dir), "dtype": dtype, "attention": attention, "threads": threads or 1,
               "batch_size": batch_size or 1, "max_length": max_len, "group": flag(args, "logits_cache") is not False,
               "softmax_dtype": str(sdt).replace("torch.", "") if sdt else None, "requests": requests}
        got, why = child.score_in_child(job, env)
        if got is None:
            return None, None, why
        label = scorer.label + " in a child process held to " + ", ".join(f"{k}={v}" for k, v in env.items())
        _RUNS[key] = (top, dict(zip(names, got)), label)
        return _RUNS[key][1], label, None
    if threads:
        forward.use_threads(threads)
    got = score_with_margins(scorer.logits, requests, batch_size or 1, max_len, flag(args, "logits_cache") is not False,
                             softmax_dtype(args), device)
    _RUNS[key] = (top, dict(zip(names, got)), scorer.label)
    return _RUNS[key][1], scorer.label, None


def model_row(C, t, model_dir, check=RESCORED):
    """Row "model (parameters == results' model_num_parameters)"; False after a SKIPPED row `check`."""
    weights = check_model_dir(model_dir) if model_dir else []   # model.safetensors or every shard of its index
    if not weights:
        C.skip(t.label, FORWARD, check, f"needs --model DIR with model.safetensors or model.safetensors.index.json "
                                        f"(found neither in {model_dir})")
        return False
    bad = []
    where = weights[0] if len(weights) == 1 else f"the {len(weights)} shards of {Path(model_dir) / INDEX}"
    expect(bad, "results", "config.model_num_parameters", t.run_config.get("model_num_parameters"),
           sum(safetensors_parameters(p) for p in weights), f"values in {where}")
    C.add(t.label, FORWARD, "model (parameters == results' model_num_parameters)", 1, bad)
    return True


DECIDED = ("acc", "acc_norm", "acc_bytes", "acc_mutual_info")   # multiple_choice metrics decided by an argmax


def decisions(t, s, lls, delim):
    """{metric: ([score per choice], [weight per choice], gold)} for each argmax-decided metric the sample lists
    (DECIDED): the prediction is the scores' argmax (first index wins). weight: how far one nat on the underlying
    loglikelihood(s) moves that score (acc 1, acc_norm 1/len(choice), acc_bytes 1/bytes, acc_mutual_info 2: its
    conditional and unconditional terms). gold: the target's choice index, or None. `lls`: every request's
    loglikelihood, in request order; delim: persample.target_delimiter."""
    metrics = s.raw.get("metrics", [])
    listed = [m for m in metrics if m in DECIDED]
    if "acc" not in listed and any(m in metrics for m in ("f1", "mcc", "exact_match")):
        listed.append("acc")            # their (gold, prediction) pairs take the loglikelihoods' argmax
    if t.output_type != "multiple_choice" or not listed or t.config.get("process_results") is not None:
        return {}                       # process_results: the task's own code decides its metrics (driver.py)
    bad, requests, at_cond, at_unc = [], s.requests, list(range(len(lls))), None
    if "acc_mutual_info" in listed:
        split = persample.mutual_info_split(t, s, bad, delim)
        if split is None:
            return {}
        requests, at_cond, at_unc = split
    choices = persample.choices_of(t, s, bad, delim, requests)
    cond = [lls[i] for i in at_cond]
    # a variant persample.py does not read (one context per choice: lm-eval's gold is doc_to_text(doc), not the
    # target; several golds) has no gold index here: the argmax is still compared, the aggregate is not recomputed
    gold = persample.gold_of(s.raw["target"], choices) if choices and not persample.mc_variant(t, s, requests) \
        else None
    out = {"acc": (cond, [1.0] * len(cond), gold)}
    if choices and all(choices):
        out["acc_norm"] = ([ll / len(c) for ll, c in zip(cond, choices)], [1 / len(c) for c in choices], gold)
        out["acc_bytes"] = ([ll / len(c.encode("utf-8")) for ll, c in zip(cond, choices)],
                            [1 / len(c.encode("utf-8")) for c in choices], gold)
    if at_unc is not None:
        out["acc_mutual_info"] = ([ll - lls[u] for ll, u in zip(cond, at_unc)], [2.0] * len(cond), gold)
    return {m: out[m] for m in listed if m in out}


def logged_rows(t, keep, scores):
    """[(sample, [(logged loglikelihood, is_greedy)], [recomputed (score, greedy, greedy margin)])] of the kept
    documents, the first line of each (a document logged under several filters is scored once)."""
    rows, seen = [], set()
    for s in t.samples:
        if s.doc_id not in keep or s.doc_id in seen:
            continue
        seen.add(s.doc_id)
        logged = [fmt.loglikelihood(t.path, s, v, f"resps[{i}][0]") for i, v in enumerate(x[0] for x in s.raw["resps"])]
        rows.append((s, logged, [scores[(t.name, s.doc_id, i)] for i in range(len(s.requests))]))
    return rows


def compare(t, keep, scores, dtype, tol, delim=("", "")):
    """Every kept sample's logged (loglikelihood, is_greedy) against `scores` {(task, doc, request): (score, greedy,
    greedy margin)}: the figures and the failures. tol 0: equality. Otherwise a score may differ by tol (the dtype's
    measured tolerance; a run whose other scores are bit-identical is no reason to allow less: an honest run on
    another CPU was seen with 17 of 18 scores bit-identical and one a float32 ulp off); a flipped prediction is a
    near-tie (reported, not failed) when its recomputed margin is within forward.MARGIN_TOLERANCE[dtype] (scaled by
    the larger weight of the two scores: decisions), a flipped is_greedy when its token margin is within twice the
    tolerance; else a failure."""
    rows = logged_rows(t, keep, scores)
    signed = [ll - new[0] for _, logged, got in rows for (ll, _), new in zip(logged, got)]
    diffs = [abs(d) for d in signed]
    margin_allow = forward.MARGIN_TOLERANCE[dtype] if math.isfinite(tol) and tol else tol
    bad, bad_flip, bad_greedy, moved, flips, near, greedy_flips = [], [], [], set(), [], [], []
    agg = {}
    for s, logged, got in rows:
        for i, ((ll, greedy), (score, greedy_new, margin)) in enumerate(zip(logged, got)):
            d = abs(score - ll)
            if not d <= tol:
                moved.add(s.doc_id)
                bad.append(f"{s.where} resps[{i}]: logged {ll!r}, recomputed {score!r} in lm-eval's batches (|diff| "
                           f"{d:.3g}; equality expected, {dtype})" if not tol else
                           f"{s.where} resps[{i}]: logged {ll!r}, recomputed {score!r} (|diff| {d:.3g} > allowance "
                           f"{tol:.3g}, {dtype})")
            if greedy != greedy_new:
                if tol and abs(margin) <= 2 * tol:
                    near.append(f"{s.where} resps[{i}] is_greedy (recomputed margin {margin:.3g})")
                else:
                    greedy_flips.append(s.doc_id)
                    bad_greedy.append(f"{s.where} resps[{i}] is_greedy: logged {greedy}, recomputed {greedy_new} "
                                      f"({dtype}, recomputed margin {margin:.3g}, |diff| {d:.3g})")
        old = decisions(t, s, [ll for ll, _ in logged], delim)
        for m, (sc, w, gold) in decisions(t, s, [g[0] for g in got], delim).items():
            a, b = argmax_first(old[m][0]), argmax_first(sc)
            agg.setdefault(m, [[], 0, gold is not None])
            agg[m][0].append(1.0 if b == gold else 0.0)
            agg[m][2] = agg[m][2] and gold is not None
            if a == b:
                continue
            margin = sc[b] - sc[a]
            # two choices of one context move together (MARGIN_TOLERANCE); mutual information's unconditional terms
            # are scored apart, so each of its scores may move by its own tolerance
            near_allow = tol * (w[a] + w[b]) if m == "acc_mutual_info" else margin_allow * max(w[a], w[b])
            if tol and margin <= near_allow:
                agg[m][1] += 1
                near.append(f"{s.where} {m}: logged choice {a}, recomputed {b} (recomputed margin {margin:.3g})")
            else:
                flips.append(s.doc_id)
                bad_flip.append(f"{s.where} {m}: argmax of the logged loglikelihoods {a}, of the recomputed {dtype} "
                                f"ones {b}, by a margin of {margin:.3g}" + (f" (past the near-tie allowance "
                                f"{near_allow:.3g}: a flipped prediction)" if tol else
                                " (equality expected: a flipped prediction)"))
    mean, sd = forward.mean_sd(signed)
    fig = {"spread": forward.spread(diffs), "n": len(signed), "moved": sorted(moved), "argmax_flips": sorted(set(flips)),
           "is_greedy_flips": sorted(set(greedy_flips)), "near_ties": near, "bit_identical": diffs.count(0.0),
           "mean_signed_diff": mean, "sd_signed_diff": sd,
           "recomputed_metrics": {m: (sum(v) / len(v), k) for m, (v, k, ok) in agg.items() if ok and v}}
    return fig, bad, bad_flip, bad_greedy


def shift_row(C, t, fig, dtype, tol):
    """Row SHIFT: the mean of logged - recomputed over every request within forward.SHIFT_FLOOR[dtype] +
    forward.SHIFT_Z standard errors (forward.shift_problem): noise averages out, an edit that moves every score one
    way does not."""
    problem = forward.shift_problem(fig["n"], fig["mean_signed_diff"], fig["sd_signed_diff"], dtype, tol)
    C.add(t.label, FORWARD, SHIFT, fig["n"], [problem] if problem else [],
          note=f"mean {fig['mean_signed_diff']:+.3g}, sd {fig['sd_signed_diff']:.3g}")


def aggregate_row(C, t, top, fig, keep):
    """Row AGGREGATES: each argmax-decided metric's aggregate (mean) recomputed from the re-scored loglikelihoods,
    against the results' value; it may differ by one document per near-tie of that metric, no more."""
    res = top.get("results", {}).get(t.name, {}) if isinstance(top.get("results"), dict) else {}
    every = keep == {s.doc_id for s in t.samples}
    bad, notes = [], []
    for m, (value, ties) in sorted(fig["recomputed_metrics"].items()):
        key = next((k for k in res if isinstance(k, str) and k.startswith(m + ",")), None)
        logged = res.get(key) if key else None
        if not every or not isinstance(logged, (int, float)) or isinstance(logged, bool):
            continue
        n = len(keep)
        bound = ties / n + 1e-9
        notes.append(f"{m} logged {logged:.4f}, from the re-score {value:.4f} ({ties} near-tie(s))")
        if abs(logged - value) > bound:
            bad.append(f"results {t.name} {key}: logged {logged!r}, recomputed from the re-scored loglikelihoods "
                       f"{value!r} (|diff| {abs(logged - value):.4g} > {bound:.4g}: {ties} near-tie(s) of {n} documents)")
    if not notes:
        C.skip(t.label, FORWARD, AGGREGATES, "no argmax-decided metric (acc, acc_norm, acc_bytes, acc_mutual_info) "
                                             "with a gold index over every document"
               + (" (process_results is set: the task's own code computes its metrics)"
                  if t.config.get("process_results") is not None else ""), requested=False)
        return
    C.add(t.label, FORWARD, AGGREGATES, len(notes), bad, note="; ".join(notes))


def rescore_plan(t, top, model_dir, dtype, plan, device, keep, tok, threads):
    """(scores, label, why not, mode text, tolerance, threads used) for `plan`: where equality is expected, the
    candidate thread counts are tried in order until one gives every score bit for bit. The best of them holds the
    run to equality when more than half its scores are bit-identical (REPRODUCED): the kernels are the run's, and a
    score that differs was edited. Fewer: the run's kernels were not reproduced (a thread count or kernel variable
    lm-eval does not record), and the tolerance applies, the row naming how many were bit-identical."""
    tol = forward.TOLERANCE[dtype]
    where = f"lm-eval's batches of {plan.batch_size}" if plan.batch_size else "one unpadded sequence per pass"
    if not plan.equality:
        scores, label, why = rescored(t, top, model_dir, dtype, plan.batch_size, device, keep, tok, plan.attention,
                                      threads)
        return scores, label, why, f"{where}, tolerance {tol:g} ({plan.why})", tol, threads
    best = None
    for n in plan.threads:
        scores, label, why = rescored(t, top, model_dir, dtype, plan.batch_size, device, keep, tok, plan.attention, n,
                                      plan.env)
        if scores is None:
            return None, None, why, None, None, None
        pairs = [(ll, got[0]) for _, logged, new in logged_rows(t, keep, scores) for (ll, _), got in zip(logged, new)]
        same, total = sum(a == b for a, b in pairs), len(pairs)
        if best is None or same > best[0]:
            best = (same, n, scores, label)
        if same == total:
            break
    same, n, scores, label = best
    forward.use_threads(threads)
    if same > REPRODUCED * total:
        return scores, label, None, (f"{where} at {n} torch thread(s) (the same tensors and kernels: {plan.why}), "
                                     f"equality expected; {same} of {total} bit-identical"), 0.0, n
    tried = " or ".join(map(str, plan.threads))
    return scores, label, None, (f"{where}, tolerance {tol:g} ({plan.why}, but only {same} of {total} scores are "
                                 f"bit-identical at {tried} torch thread(s): the run's kernels were not reproduced "
                                 "here, e.g. a thread count or kernel variable lm-eval does not record)"), tol, n


def forward_rows(C, t, model_dir, top, ids, sample_n, device=None):
    """Rows RESCORED, ARGMAX, GREEDY, SHIFT, AGGREGATES (and the model row): the spread of |logged - recomputed|,
    the requests past the allowance (equality where the run's kernels are reproduced), argmax and is_greedy flips
    past their margins (near-ties named), a systematic shift, the aggregates; for bfloat16 / float16 the float32
    figures beside them. Returns the figures for audit.json, or None."""
    device = device or getattr(C.options, "device", None) or "cpu"
    if t.output_type == ROLLING:
        return rolling_rows(C, t, model_dir, top, sample_n, device)
    if t.output_type not in LOGLIKELIHOOD:
        # a level the user asked for that did not look at the run's numbers: never part of a PASS
        C.skip(t.label, FORWARD, RESCORED, f"output_type {t.output_type}: generations are not re-generated "
                                           "(only loglikelihood requests are re-scored): NOT checked")
        return None
    if ids is None:
        C.skip(t.label, FORWARD, RESCORED, "needs the identity level's token boundaries (--model DIR with its "
                                           "tokenizer), which were unavailable or failed")
        return None
    dtype, why = run_dtype(t.run_config)
    if dtype is None:
        C.skip(t.label, FORWARD, RESCORED, why)
        return None
    check_device(device)
    if not model_row(C, t, model_dir):
        return None
    threads = C.options.threads
    forward.use_threads(threads)
    keep, t0 = chosen(t, C.options.sample), time.perf_counter()
    plan = choose_mode(t, top, device, sample_n, threads)
    tok = tokens.load_tokenizer(Path(model_dir) / "tokenizer.json")
    scores, label, why, mode, tol, used = rescore_plan(t, top, model_dir, dtype, plan, device, keep, tok, threads)
    if scores is None and plan.batch_size:
        plan = Plan(None, plan.attention, False, why)
        scores, label, why, mode, tol, used = rescore_plan(t, top, model_dir, dtype, plan, device, keep, tok, threads)
    if scores is None:
        C.skip(t.label, FORWARD, RESCORED, why)
        return None
    delim = persample.target_delimiter(t, top)
    fig, bad, bad_argmax, bad_greedy = compare(t, keep, scores, dtype, tol, delim)
    what = sample_words(C, t, keep)
    note = (f"{dtype}, {label}, {mode}; |recomputed - logged| {forward.spread_text(fig['spread'])} over "
            f"{what}, {fig['bit_identical']} bit-identical; documents past it: {fig['moved']}")
    figures = {"dtype": dtype, "implementation": label, "mode": mode, "batch_size": plan.batch_size,
               "attention": plan.attention, "threads": used, "equality": tol == 0.0, "tolerance": tol,
               "max_abs_diff": fig["spread"]["max"],
               "spread": fig["spread"], "requests": fig["n"], "bit_identical": fig["bit_identical"],
               "mean_signed_diff": fig["mean_signed_diff"], "documents": len(keep),
               "sample": C.options.sample.figures(len(keep), len({s.doc_id for s in t.samples})),
               "moved": fig["moved"], "argmax_flips": fig["argmax_flips"],
               "near_ties": fig["near_ties"], "is_greedy_flips": fig["is_greedy_flips"], "device": device}
    if dtype != "float32":
        s32, label32, why32 = rescored(t, top, model_dir, "float32", plan.batch_size, device, keep, tok,
                                       plan.attention, used, plan.env)
        forward.use_threads(threads)
        if s32 is None:
            note += f"; float32 beside it: not run ({why32})"
        else:
            f32 = compare(t, keep, s32, "float32", math.inf, delim)[0]
            figures["float32_beside"] = {"implementation": label32, **{k: f32[k] for k in (
                "spread", "n", "argmax_flips", "is_greedy_flips", "mean_signed_diff")}}
            note += (f"; float32 beside it (a figure, not a check): |float32 - logged| "
                     f"{forward.spread_text(f32['spread'])}, prediction changes {len(f32['near_ties'])}")
    C.add(t.label, FORWARD, RESCORED, fig["n"], bad, note=note)
    ties = f"; near-ties (within the allowance, not failed): {'; '.join(fig['near_ties'][:5])}" + \
        (f" (+{len(fig['near_ties']) - 5} more)" if len(fig["near_ties"]) > 5 else "") if fig["near_ties"] else ""
    for check, n, failed in ((ARGMAX, len(keep), bad_argmax), (GREEDY, fig["n"], bad_greedy)):
        C.add(t.label, FORWARD, check, n, failed, note=f"{len(failed)} flip(s) against the {dtype} re-score{ties}")
    shift_row(C, t, fig, dtype, tol)
    aggregate_row(C, t, top, fig, keep)
    figures["seconds"] = round(time.perf_counter() - t0, 2)
    return figures


# ---- loglikelihood_rolling: lm-eval's windows ---------------------------------------------------------------------

def rolling_windows(ids, prefix_id, max_length):
    """[(context ids, continuation ids)] lm-eval scores for one document's tokens `ids`, written again from
    lm-eval 0.4.9.2 lm_eval/utils.py:261-309 (get_rolling_token_windows with context_len 1, as
    models/huggingface.py:1049-1059 calls it, then make_disjoint_window; the same in every release read, 0.4.5 to
    0.4.13): the first window predicts the first min(max_length, n) tokens after the prefix token alone; each next
    one predicts the next at most max_length tokens after the max_length + 1 - (their count) tokens before them, so
    that context + continuation is max_length + 1 tokens and every token is predicted once. No tokens: no window."""
    if not ids:
        return []
    done = min(max_length, len(ids))
    out = [([prefix_id], ids[:done])]
    while done < len(ids):
        end = min(len(ids), done + max_length)
        out.append((ids[end - max_length - 1:done], ids[done:end]))
        done = end
    return out


def logged_rolling(s):
    """(the log-likelihood lm-eval returned for the sample's rolling request: resps[0][0] as a float, None) or
    (None, why not); rolling.py ties filtered_resps and the metric pairs to it at the arithmetic level."""
    r = s.raw["resps"]
    v = r[0][0] if isinstance(r, list) and len(r) == 1 and isinstance(r[0], list) and len(r[0]) == 1 else None
    try:
        ll = float(v) if isinstance(v, str) and len(v) < 100 else None
    except ValueError:
        ll = None
    if ll is None or not math.isfinite(ll):
        return None, f"{s.where} resps: expected [[\"<finite float>\"]] (one rolling request), found {str(r)[:60]}"
    return ll, None


def rolling_documents(t, keep, encode, max_length):
    """{doc_id: (logged ll, [windows], where)} of the kept documents (the first line of each), and the problems."""
    docs, bad = {}, []
    for s in t.samples:
        if s.doc_id not in keep or s.doc_id in docs:
            continue
        ll, why = logged_rolling(s)
        if why:
            bad.append(why)
            continue
        docs[s.doc_id] = (ll, rolling_windows(encode(s.requests[0][0]), encode.prefix_id, max_length), s.where)
    return docs, bad


def rolling_sums(scorer, docs, max_length, sdt, device):
    """{doc_id: [each window's score]} in window order: each window one unpadded pass (score_requests at batch 1:
    the row (context + continuation)[:-1], its continuation's log-probabilities gathered and summed in the
    log-softmax's dtype, then read as a Python float, as HFLM._loglikelihood_tokens does)."""
    flat = [(d, w) for d, (_, windows, _) in sorted(docs.items()) for w in windows]
    got = score_requests(scorer.logits, [w for _, w in flat], 1, max_length, False, sdt, device)
    out = {d: [] for d in docs}
    for (d, _), (score, _) in zip(flat, got):
        out[d].append(score)
    return out


def rolling_compare(docs, scores, sums, tol, dtype):
    """Each document's logged log-likelihood against the sum of its windows' scores (builtin sum() in window order,
    as loglikelihood_rolling sums them, each way the run's Python may have added: python_summation); tol is per
    window (0: equality; a document without tokens has no window and must log 0). Returns the figures and the
    failures."""
    diffs, moved, bad = [], [], []
    for d, (ll, windows, where) in sorted(docs.items()):
        totals = [builtin_sum(scores[d], comp) for comp in sums]
        diff = min(abs(x - ll) for x in totals)
        diffs.append(diff)
        limit = tol * len(windows) if windows else 0.0
        if not diff <= limit:
            moved.append(d)
            bad.append(f"{where} resps[0][0]: logged {ll!r}, recomputed {totals[0]!r} over {len(windows)} "
                       f"window(s) (|diff| {diff:.3g}; " + (f"over {len(windows)} x {tol:g} per window, {dtype})" if tol
                                                             else f"equality expected, {dtype})"))
    return {"spread": forward.spread(diffs), "n": len(diffs), "moved": moved}, bad


def rolling_mode(t, top, device, environ=None):
    """(tolerance per window, mode text, attention): equality when the run scored at batch size 1 (each window one
    unpadded pass: the tensors the audit builds) with code, attention and kernels the audit reproduces (choose_mode's
    conditions); else the dtype's forward.TOLERANCE per window, the reason named (lm-eval padded its windows in
    chunks of the batch size over every rolling request of the run, an order the audit does not rebuild)."""
    plan = choose_mode(t, top, device, None, environ=environ)
    bs = run_batch_size(t.run_config)
    if plan.equality and plan.env:      # the windows are scored in this process: its kernels are not the run's
        plan.equality, plan.why = False, (f"{plan.why}; rolling windows are re-scored in this process only, at its "
                                          "own kernels")
    if bs == 1 and plan.equality:
        return 0.0, (f"one unpadded window per pass, as the run at batch size 1 (the same tensors and kernels: "
                     f"{plan.why}), equality expected"), plan.attention
    why = plan.why if not plan.equality else f"the run padded its windows in chunks of {bs}"
    dtype = run_dtype(t.run_config)[0]
    return forward.TOLERANCE[dtype], (f"one unpadded window per pass, tolerance {forward.TOLERANCE[dtype]:g} per "
                                      f"window ({why})"), plan.attention


def rolling_rows(C, t, model_dir, top, sample_n, device):
    """Row ROLLING_RESCORED (and the model row) of a loglikelihood_rolling task: every kept document's text
    tokenised as HFLM.tok_encode does (encoder), cut into lm-eval's windows of the results' max_length, each window
    re-scored from the weights in the run's dtype, summed, and compared with the logged log-likelihood; for bfloat16
    / float16 the float32 figures beside it. Limit: forward.TOLERANCE was measured on candidate scores of a few
    tokens; a window scores up to max_length tokens (a tolerance per window, not per token). Returns the figures."""
    check = ROLLING_RESCORED
    dtype, why = run_dtype(t.run_config)
    if dtype is None:
        C.skip(t.label, FORWARD, check, why)
        return None
    check_device(device)
    if not model_row(C, t, model_dir, check):
        return None
    tok_path, max_len = Path(model_dir) / "tokenizer.json", top.get("max_length")
    if not tok_path.is_file():
        C.skip(t.label, FORWARD, check, f"needs --model DIR with tokenizer.json ({missing_model(tok_path)})")
        return None
    if not (isinstance(max_len, int) and not isinstance(max_len, bool) and 1 <= max_len <= 1 << 24):
        C.skip(t.label, FORWARD, check, f"the results' max_length is {str(max_len)[:40]}: lm-eval's window size "
                                        "is unknown")
        return None
    tok, bad = tokens.load_tokenizer(tok_path), []
    special_tokens(bad, tok, top)
    encode, why = run_encoder(tok, t, top, model_dir)
    if encode is None:
        C.skip(t.label, FORWARD, check, why)
        return None
    if encode.prefix_id is None:
        C.skip(t.label, FORWARD, check, "the results name no bos or eos token: the first window's prefix token "
                                        "(HFLM.prefix_token_id) is unknown")
        return None
    forward.use_threads(C.options.threads)
    keep, t0 = chosen(t, C.options.sample), time.perf_counter()
    tol, mode, attention = rolling_mode(t, top, device)
    scorer, why = forward.load_scorer(model_dir, dtype, attention, device)
    if scorer is None:
        C.skip(t.label, FORWARD, check, why)
        return None
    docs, more = rolling_documents(t, keep, encode, max_len)
    bad += more
    sums, sdt = python_summation(top), softmax_dtype(model_args(t.run_config))
    fig, more = rolling_compare(docs, rolling_sums(scorer, docs, max_len, sdt, device), sums, tol, dtype)
    bad += more
    counts = {str(d): len(w) for d, (_, w, _) in sorted(docs.items())}
    what = sample_words(C, t, keep)
    note = (f"{dtype}, {scorer.label}, {mode}; max_length {max_len}: {sum(counts.values())} windows, at most "
            f"{max(counts.values(), default=0)} per document; |sum of windows - logged| "
            f"{forward.spread_text(fig['spread'])} over {what}; documents past it: {fig['moved']}")
    figures = {"dtype": dtype, "implementation": scorer.label, "mode": mode, "tolerance_per_window": tol,
               "max_length": max_len, "windows": sum(counts.values()), "windows_per_document": counts,
               "max_abs_diff": fig["spread"]["max"], "spread": fig["spread"], "documents": fig["n"],
               "sample": C.options.sample.figures(len(keep), len({s.doc_id for s in t.samples})), "moved": fig["moved"],
               "device": device}
    if dtype != "float32":
        s32, why32 = forward.load_scorer(model_dir, "float32", attention, device)
        if s32 is None:
            note += f"; float32 beside it: not run ({why32})"
        else:
            f32 = rolling_compare(docs, rolling_sums(s32, docs, max_len, sdt, device), sums, math.inf,
                                  "float32")[0]
            figures["float32_beside"] = {"implementation": s32.label, **f32}
            note += ("; float32 beside it (a figure, not a check): |float32 - logged| "
                     f"{forward.spread_text(f32['spread'])}")
    C.add(t.label, FORWARD, check, len(docs), bad, note=note)
    figures["seconds"] = round(time.perf_counter() - t0, 2)
    return figures
