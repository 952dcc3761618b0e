"""Time the scorers on the same SST-2 requests, as ratios to lm-eval measured in the same run and to the FLOP floor.

    python bench.py --cache ./cache                                # the sentiment fixture (offline), all 200 rows
    python bench.py --cache ./cache --data reviews-872             # any prepared SST-2-shaped data id, all rows
    python bench.py --cache ./cache --data-file fixtures/reviews_872_dev.tsv   # a file read directly (unprepared)
    python bench.py --cache ./cache --scaling --out scaling.json   # run.py in 1 vs 2 processes (torchrun, gloo)

The figures for the README come from a quiet machine (load average near 0; nothing else running), 2 threads:

    .venv/bin/python bench.py --cache ./cache --data reviews-872 --out bench.json      # about 20-25 minutes

(--data-file fixtures/reviews_872_dev.tsv instead of --data reviews-872 where prepare.py cannot import it yet.)

Methods (each in a fresh subprocess, so peak RSS is per method; the timed span is scoring only, after the model
is loaded and one untimed warm-up item, unless said otherwise):
    lm_eval_b1    lm-eval 0.4.9.2 HFLM.loglikelihood, batch size 1
    lm_eval_b16   the same at batch size 16 (any lm_eval_b<N> may be named in --methods)
    parity        the independent path in parity mode (experiments/scoring.py) at config official_batch_size: the
                  batches lm-eval forms at that size, so the same tensors as lm_eval_b<that size>
    parity_b1     the same at batch size 1 (any parity_b<N>): the tensors of lm_eval_b1
    fast          the independent path in fast mode (experiments/fast_scoring.py, config fast_batch_size), and
                  the time its matrix multiplications alone take at the same shapes and threads
    fast_b<N>     (optional) fast mode at batch size N, at most N * 128 padded tokens: a sweep, e.g.
                  --methods fast,fast_b4,fast_b8,fast_b32 (about 5 minutes on 872 rows)
    dual          the full dual run of `run.py --experiment protocol` on these rows: protocol.score_and_compare,
                  the experiment's own code (official path at config official_batch_size through lm-eval's
                  evaluator + independent parity path + identity join + exact comparison); no result cache.
                  Timed: its scoring stages (official + independent + compare), and its total with both model loads
    options       the options experiment's five conditions, dual path, on these rows (options.score_and_compare:
                  its own code); timed from start to end, model loads included
                  (targets: under 10 minutes and 2 GB peak RSS on 872 rows)

Every time is also printed as a ratio to lm-eval measured in the same run (lm_eval_b1 and the best lm-eval time),
since a time alone says little on a shared machine. Scores are compared like with like: lm_eval_b<N> with
parity_b<N> (the same tensors: must be bit for bit), fast with parity (other shapes by design: a measured
difference against fast_tolerance), the dual and options runs within themselves (official vs independent). Requests: the official SST-2 prompt for the first N rows
(default all) in idx order, candidates " negative" and " positive". The FLOP floor is computed exactly from the
model's config.json and the token counts of these requests:

    FLOPs = 2 * N_nonemb * T + 2 * d_model * V * R
    N_nonemb = layers * (d*(heads*hd) + 2*d*(kv_heads*hd) + (heads*hd)*d + 3*d*d_ff)   (the matmul weights)
    T = tokens that must pass through the layers (each distinct context once, plus multi-token candidates' tokens)
    R = output-layer rows that are scored (one per distinct context for one-token candidates)

(attention scores, norms and activations are not counted: the floor is a lower bound; the dual run does the work
twice, so its floor is 2x), and floor_s = FLOPs / the sgemm rate measured in the same run (torch.mm of 4096 x 4096
fp32 matrices with the configured threads, best of several, measured before and after the methods; the higher is
used). Writes bench.json (--out). Wall times are measurements of this machine at this moment: the load average is
recorded next to them.
"""
import argparse
import json
import os
import queue
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import local_model
import resources
from adapter import load_model, load_tokenizer
from config import CONFIG, effective
from experiments import fast_scoring, official, options, protocol, scoring
from experiments.context import Context, Data, Inputs, Options
from experiments.evidence import IdentityMismatch, Stages, cpu_model
from experiments.selection import load_rows
from resources import ResourceError, fail

REPO = Path(__file__).resolve().parent
METHODS = ["lm_eval_b1", "lm_eval_b16", "parity_b1", "parity", "fast", "dual", "options"]
SHARED = CONFIG["shared"]              # defaults of --model / --data, the sgemm threads


def bench_config(overrides=None, sections=None):
    """The protocol experiment's effective settings (these are its requests), plus overrides such as --model."""

    return effective(sections or protocol.CONFIG_SECTIONS, overrides)


def batch_of(m, prefix):
    """N of a method named <prefix><N> (N > 0), else None."""
    n = m[len(prefix):]
    return int(n) if m.startswith(prefix) and n.isdigit() and int(n) > 0 else None


def known_method(m):
    return m in METHODS or any(batch_of(m, p) is not None for p in ("lm_eval_b", "fast_b", "parity_b"))


def parity_batch(m, config):
    """The batch size of a parity method: parity_b<N>'s N, or config official_batch_size for "parity"."""
    return batch_of(m, "parity_b") or config["official_batch_size"]


# ---- worker side (one method per process) ---------------------------------------------------------------------

def _peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(method, spec_path, result_path):
    spec = json.loads(Path(spec_path).read_text())
    config = bench_config(spec["config"])

    torch.set_num_threads(config["threads"])
    reqs = spec["requests"]                     # [{"idx", "label", "context", "candidates"}]
    if method.startswith("lm_eval_b"):
        scored = score_lm_eval(spec["model_dir"], reqs, config, int(method[len("lm_eval_b"):]))
    elif method in ("parity", "fast") or batch_of(method, "fast_b") or batch_of(method, "parity_b"):
        if batch_of(method, "fast_b"):       # a fast-mode variant: N sequences, at most N * 128 padded tokens
            n = batch_of(method, "fast_b")
            config = dict(config, fast_batch_size=n, fast_max_batch_tokens=n * 128)
        scored = score_independent(spec["model_dir"], reqs, config, method)
    elif method in ("dual", "options"):
        scored = run_experiment_method(method, spec)
    else:
        raise SystemExit(f"unknown method {method!r}")
    scores, wall, load_s, extra = scored
    Path(result_path).write_text(json.dumps({
        "method": method, "wall_s": wall, "load_s": load_s, "peak_rss_bytes": _peak_rss_bytes(),
        "threads": torch.get_num_threads(), "scores": scores, "extra": extra}))


def score_lm_eval(model_dir, reqs, config, batch_size):
    """(scores per request, timed wall s, load s, extra) through lm-eval's HFLM.loglikelihood."""
    t0 = time.perf_counter()                    # load_s: the model load, with the imports it triggers

    config = dict(config, official_batch_size=batch_size)
    lm = official.make_lm(model_dir, config)
    pairs = [(r["context"], c) for r in reqs for c in r["candidates"]]
    load_s = time.perf_counter() - t0
    official.loglikelihood(lm, pairs[:2])                               # warm-up (untimed)
    t1 = time.perf_counter()
    flat = [ll for ll, _ in official.loglikelihood(lm, pairs)]
    wall = time.perf_counter() - t1
    scores, k = [], 0
    for r in reqs:
        scores.append(flat[k:k + len(r["candidates"])])
        k += len(r["candidates"])
    return scores, wall, load_s, {"batch_size": batch_size}


def score_independent(model_dir, reqs, config, method):
    """(scores per request, timed wall s, load s, extra) through the independent path in parity or fast mode."""
    t0 = time.perf_counter()                    # load_s: the model load, with the imports it triggers

    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, config)
    load_s = time.perf_counter() - t0
    limit = config["max_input_tokens"]
    if method.startswith("parity"):
        size = parity_batch(method, config)
        items = [(f"idx {r['idx']}", r["context"], r["candidates"]) for r in reqs]
        scoring.score_items(model, tok, items[:2], limit, size)                          # warm-up
        t1 = time.perf_counter()
        scored, plan, _ = scoring.score_items(model, tok, items, limit, size)
        wall = time.perf_counter() - t1
        return ([[c["score"] for c in s] for s in scored], wall, load_s,
                {"forward_passes": len(plan.rows), "batch_size": size, "batches": len(plan.batches)})
    bs, mbt, w = config["fast_batch_size"], config["fast_max_batch_tokens"], fast_scoring.workers(config)
    items = [(i, r["context"], r["candidates"]) for i, r in enumerate(reqs)]
    fast_scoring.score_candidates_fast(model, tok, items[:2 * w], limit, bs, mbt, w)      # warm-up
    t1 = time.perf_counter()
    res, stats = fast_scoring.score_candidates_fast(model, tok, items, limit, bs, mbt, w)
    wall = time.perf_counter() - t1
    treqs = [fast_scoring.TokenRequest(ctx_ids=scoring.encode_pair(tok, r["context"], r["candidates"][0])[0],
                                       cands=[[0]]) for r in reqs]
    if method == "fast":
        stats["gemm_only_s"] = gemm_only(model, fast_scoring.plan(treqs, bs, mbt), w)
    return [[c["score"] for c in res[i]] for i in range(len(reqs))], wall, load_s, dict(stats)


def gemm_only(model, plan, workers):
    """Seconds the fast plan's matrix multiplications take alone: every nn.Linear of the model (and the output
    layer on one row per sequence) on random inputs of each batch's padded shape, with the fast mode's workers
    and threads. fast wall / this = what the rest costs (attention, norms, activations, Python); this / the floor =
    the kernels' efficiency at these shapes. None when the model has no nn.Linear layers."""


    linears = [m for m in model.model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        return None
    shapes = [(len(b), len(b) * max(len(plan.trunks[t].ids) for t in b)) for b in plan.batches]
    todo = queue.Queue()
    for shape in sorted(shapes, key=lambda x: -x[1]):
        todo.put(shape)

    def work():
        with torch.inference_mode():
            while True:
                try:
                    rows, tokens = todo.get_nowait()
                except queue.Empty:
                    return
                xs = {}
                for lin in linears:
                    x = xs.setdefault(lin.in_features, torch.randn(tokens, lin.in_features))
                    torch.nn.functional.linear(x, lin.weight)
                model.lm_head(torch.randn(rows, model.lm_head.in_features))

    before = torch.get_num_threads()
    torch.set_num_threads(1 if workers > 1 else before)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.set_num_threads(before)
    return time.perf_counter() - t0


def experiment_context(module, spec, out_dir):
    """A run.py-like Context for `module` over the bench rows (split "all" of the bench parquet: every row)."""

    data = Data(id=spec["data_id"], schema="sst2", parquet_path=Path(spec["parquet"]),
                content_sha256=spec["data_content_sha256"], split="validation")
    inputs = Inputs(cache=Path(spec["cache"]), model_dir=Path(spec["model_dir"]),
                    model_identity=spec["model_identity"], data={data.id: data})
    config = effective(module.CONFIG_SECTIONS, spec["config"])
    return Context(name=module.NAME, split="all", config=config, inputs=inputs,
                   options=Options(out=Path(out_dir), no_cache=True), stages=Stages(), data=data)


def run_experiment_method(method, spec):
    """dual / options through the experiments' own code on every bench row: (scores, wall, load s, extra).

    An identity mismatch (the paths disagree) is a result here, not a crash: it is recorded and reported."""

    module = protocol if method == "dual" else options
    with tempfile.TemporaryDirectory(prefix=f"bench-{method}-") as out:
        ctx = experiment_context(module, spec, out)
        rows = load_rows(ctx.data.parquet_path)
        idx_list = [r["idx"] for r in spec["requests"]]
        t0 = time.perf_counter()
        failure, scores = None, []
        try:
            if method == "dual":
                items = protocol.build_items(rows, idx_list, ctx.config)
                records = protocol.score_and_compare(ctx, items)[0]
                scores = [r["independent"]["scores"] for r in records]
                official = [r["official"]["scores"] for r in records]
            else:
                conditions = options.conditions_from_config(ctx.config)
                items = options.build_items(rows, idx_list, ctx.config, conditions)
                records = options.score_and_compare(ctx, items, conditions)[0]
                official = None
        except IdentityMismatch as e:
            failure, official = f"{e}; first difference: {e.rows[:1]}", None
        total = time.perf_counter() - t0
    stages = {st["name"]: st["wall_s"] for st in ctx.stages.stages}
    load_s = sum(v for k, v in stages.items() if k.endswith("model_load"))
    scoring_s = sum(v for k, v in stages.items() if not k.endswith("model_load"))
    wall = scoring_s if method == "dual" else total
    return scores, wall, load_s, {"total_s": total, "scoring_s": scoring_s, "stages": ctx.stages.stages,
                                  "failure": failure, "official_scores": official,
                                  "official_batch_size": ctx.config["official_batch_size"]}


def sgemm_worker(result_path, n=4096, reps=5):

    torch.set_num_threads(SHARED["threads"])
    torch.manual_seed(0)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t)
    Path(result_path).write_text(json.dumps({"n": n, "reps": reps, "best_s": min(times),
                                             "gflops": 2 * n ** 3 / min(times) / 1e9,
                                             "threads": torch.get_num_threads()}))


# ---- parent side ----------------------------------------------------------------------------------------------

def flop_model(model_config):
    c = model_config
    d, ff, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or d // heads
    per_layer = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * ff
    return {"d_model": d, "d_ff": ff, "layers": layers, "heads": heads, "kv_heads": kv, "head_dim": hd,
            "vocab": vocab, "n_nonemb_matmul_params": layers * per_layer, "per_layer": per_layer}


def build_requests(rows, n, config):
    rows = rows if n is None else rows[:n]
    cands = [config["target_delimiter"] + c for c in config["sst2_choices"]]
    return [{"idx": r["idx"], "label": r["label"], "context": config["sst2_prompt"].format(sentence=r["sentence"]),
             "candidates": cands} for r in rows]


def count_work(model_dir, reqs, config):
    """T and R of the floor, from the tokenised requests (the fast mode's plan without padding)."""

    tok = load_tokenizer(model_dir)
    treqs, ctx_tokens = [], 0
    for r in reqs:
        pairs = [scoring.encode_pair(tok, r["context"], c) for c in r["candidates"]]
        treqs.append(fast_scoring.TokenRequest(ctx_ids=pairs[0][0], cands=[p[1] for p in pairs]))
        ctx_tokens += len(pairs[0][0])
    p = fast_scoring.plan(treqs, batch_size=1, max_batch_tokens=10 ** 9)
    t = sum(len(tr.ids) for tr in p.trunks) + sum(len(b.ids) for b in p.branches)
    rows = sum(1 for tr in p.trunks if tr.row_picks) + sum(len({pos for pos, _, _ in b.picks}) for b in p.branches)
    return {"T_tokens": t, "R_rows": rows, "context_tokens": ctx_tokens, "n_items": len(reqs),
            "n_candidates": sum(len(r["candidates"]) for r in reqs),
            "max_context_tokens": max(len(tr.ctx_ids) for tr in treqs)}


def run_sub(args, timeout):
    """Run one worker; (ok, stderr tail). A failed method is reported, the other methods still run."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, str(REPO / "bench.py"), *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    return proc.returncode == 0, proc.stderr[-3000:]


def diff_vs(ref, other):

    diffs = [abs(a - b) for x, y in zip(ref, other) for a, b in zip(x, y)]
    return {"max_abs_diff": max(diffs), "n_argmax_changes": sum(scoring.argmax_first(x) != scoring.argmax_first(y)
                                                                for x, y in zip(ref, other)),
            "n_scores_equal": sum(d == 0.0 for d in diffs), "n_scores": len(diffs)}


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:5]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="cache", help="cache directory filled by prepare.py (default ./cache)")
    ap.add_argument("--data", default=SHARED["data"], help="SST-2-shaped data resource id: pinned, or a prepare.py "
                                                          "--name import (default the fixture)")
    ap.add_argument("--data-file", help="read an SST-2-shaped .tsv/.parquet directly (not verified by a lock; "
                                        "for files prepare.py has not imported): overrides --data")
    ap.add_argument("--model", default=SHARED["model"], help="model resource id, or PATH to a local Hugging Face "
                                                            "causal-LM directory (as run.py --model)")
    ap.add_argument("--n", type=int, default=None, help="first N rows in idx order (default: all)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"comma-separated subset of {','.join(METHODS)} (or lm_eval_b<N>, parity_b<N>, fast_b<N>)")
    ap.add_argument("--out", default="bench.json", help="where to write the results (default bench.json)")
    ap.add_argument("--timeout", type=float, default=3600, help="per-method timeout in seconds")
    ap.add_argument("--sgemm-size", type=int, default=4096, help="matrix size of the sgemm rate (default 4096)")
    ap.add_argument("--scaling", action="store_true",
                    help="instead of the methods: data-parallel scaling, run.py in 1 process vs torchrun with 2 "
                         "(one torch thread each, the same items; see scaling_main)")
    ap.add_argument("--experiment", default="protocol", help="--scaling: the experiment run (default protocol)")
    ap.add_argument("--split", default="dev", help="--scaling: dev (default, 64 items) or smoke")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap


def flop_floor(model_dir, work):
    """(flop model, FLOPs of the requests) from the model's config.json and the counted work."""
    fm = flop_model(json.loads((Path(model_dir) / "config.json").read_text()))
    flops = 2 * fm["n_nonemb_matmul_params"] * work["T_tokens"] + 2 * fm["d_model"] * fm["vocab"] * work["R_rows"]
    return fm, flops


def print_floor(fm, work, flops):
    print(f"FLOP floor = 2 * N_nonemb * T + 2 * d_model * V * R\n"
          f"  N_nonemb = {fm['layers']} layers * (d*(h*hd) + 2*d*(kv*hd) + (h*hd)*d + 3*d*d_ff) = {fm['layers']} * "
          f"({fm['d_model']}*{fm['heads'] * fm['head_dim']} + 2*{fm['d_model']}*{fm['kv_heads'] * fm['head_dim']} + "
          f"{fm['heads'] * fm['head_dim']}*{fm['d_model']} + 3*{fm['d_model']}*{fm['d_ff']}) = "
          f"{fm['n_nonemb_matmul_params']:,}\n"
          f"  T = {work['T_tokens']:,} tokens, R = {work['R_rows']:,} rows, d_model = {fm['d_model']}, "
          f"V = {fm['vocab']:,}\n"
          f"  FLOPs = 2*{fm['n_nonemb_matmul_params']:,}*{work['T_tokens']:,} + 2*{fm['d_model']}*{fm['vocab']:,}"
          f"*{work['R_rows']:,} = {flops:,} ({flops / 1e12:.4f} TFLOP)")


def measure(methods, spec_content, timeout, tmp, sgemm_size=4096):
    """Run every method in its own subprocess, with the sgemm rate measured before and after: (results, sgemm)."""
    results, sgemm = {}, []
    spec = Path(tmp) / "spec.json"
    spec.write_text(json.dumps(spec_content))

    def measure_sgemm():
        out = Path(tmp) / f"sgemm{len(sgemm)}.json"
        ok, err = run_sub(["--worker", "sgemm", "--result", str(out), "--sgemm-size", str(sgemm_size)], 600)
        if not ok:
            raise SystemExit(f"bench: the sgemm measurement failed:\n{err}")
        sgemm.append(json.loads(out.read_text()))
        print(f"  sgemm: {sgemm[-1]['gflops']:.1f} GFLOPS (torch.mm {sgemm[-1]['n']}^2 fp32, "
              f"{sgemm[-1]['threads']} threads, best of {sgemm[-1]['reps']})", flush=True)

    measure_sgemm()
    for m in methods:
        out = Path(tmp) / f"{m}.json"
        t0 = time.perf_counter()
        ok, err = run_sub(["--worker", m, "--spec", str(spec), "--result", str(out)], timeout)
        if not ok:
            print(f"  {m}: FAILED\n{err}", flush=True)
            results[m] = {"method": m, "failed": err}
            continue
        results[m] = json.loads(out.read_text())
        results[m]["process_wall_s"] = time.perf_counter() - t0
        r = results[m]
        note = f" -- {r['extra']['failure']}" if r["extra"].get("failure") else ""
        print(f"  {m}: {r['wall_s']:.2f} s scoring (+{r['load_s']:.1f} s load), "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB{note}", flush=True)
    measure_sgemm()
    return results, sgemm


FLOOR_UNITS = {"dual": 2}          # the dual run does the work twice (official + independent)


def lm_eval_refs(results):
    """(lm_eval_b1 wall s or None, the best lm-eval wall s and its method) among the measured lm-eval methods."""
    lm = {m: r["wall_s"] for m, r in results.items() if m.startswith("lm_eval_b") and "failed" not in r}
    best = min(lm, key=lm.get) if lm else None
    return lm.get("lm_eval_b1"), (lm[best] if best else None), best


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def reference_of(m, config):
    """The method whose scores `m` is compared with: the one that ran the same tensors (lm_eval_b<N> and
    parity_b<N>, "parity" standing for parity_b<official_batch_size>), or parity for fast mode; None otherwise."""
    n = batch_of(m, "lm_eval_b")
    if n is not None:
        return "parity" if n == config["official_batch_size"] else f"parity_b{n}"
    if m == "fast" or batch_of(m, "fast_b") is not None:
        return "parity"
    return None


def method_row(m, r, n_items, work, flops, floor_s, refs, ref, parity):
    """One row: time, the ratios to lm-eval (same run) and to the floor, memory, agreement with its reference:
    ref = (its name, its scores) from reference_of, or None."""
    b1, best, _ = refs
    row = {"method": m, "wall_s": round(r["wall_s"], 3), "load_s": round(r["load_s"], 2),
           "x_lm_eval_b1": ratio(r["wall_s"], b1), "x_lm_eval_best": ratio(r["wall_s"], best),
           "peak_rss_mib": round(r["peak_rss_bytes"] / 2**20, 1), "failure": r["extra"].get("failure")}
    if m != "options":              # the options method scores other requests (five conditions per item)
        units = FLOOR_UNITS.get(m, 1)
        row.update(items_per_s=round(n_items / r["wall_s"], 3), floor_units=units,
                   x_flop_floor=round(r["wall_s"] / (floor_s * units), 3),
                   achieved_gflops=round(units * flops / r["wall_s"] / 1e9, 1))
    else:
        row["total_s"] = round(r["extra"]["total_s"], 2)
    if m == "fast" and r["extra"].get("gemm_only_s"):
        row.update(gemm_only_s=round(r["extra"]["gemm_only_s"], 3),
                   gemm_only_x_floor=round(r["extra"]["gemm_only_s"] / floor_s, 3))
    if m == "dual":
        row["total_s"] = round(r["extra"]["total_s"], 2)
        row["official_batch_size"] = r["extra"]["official_batch_size"]
        if r["extra"]["official_scores"]:
            row["official_vs_independent"] = diff_vs(r["extra"]["official_scores"], r["scores"])
    if ref is not None and r["scores"]:
        row["compared_with"] = ref[0]
        row.update({f"vs_ref_{k}": v for k, v in diff_vs(ref[1], r["scores"]).items()})
    if parity is not None and r["scores"] and m not in ("options", "parity"):
        row["argmax_changes_vs_parity"] = diff_vs(parity, r["scores"])["n_argmax_changes"]
    return row


def method_table(methods, results, n_items, work, flops, floor_s, config):
    refs = lm_eval_refs(results)

    def scores(m):
        return results[m]["scores"] if m in results and "failed" not in results[m] else None

    rows = []
    for m in methods:
        if "failed" in results[m]:
            rows.append({"method": m, "failure": results[m]["failed"][-500:]})
            continue
        ref = reference_of(m, config)
        rows.append(method_row(m, results[m], n_items, work, flops, floor_s, refs,
                               (ref, scores(ref)) if ref and scores(ref) is not None else None, scores("parity")))
    return rows


def fmt(v, spec, suffix=""):
    return "-" if v is None else f"{v:{spec}}{suffix}"


def print_table(table, refs):
    _, _, best = refs
    print(f"{'method':<12} {'wall s':>8} {'x lm-eval b1':>12} {'x lm-eval best':>14} {'x floor':>8} "
          f"{'GFLOPS':>7} {'peak RSS MiB':>12} {'compared with':>13} {'max|d|':>8} {'argmax chg':>10}")
    for row in table:
        if "wall_s" not in row:
            print(f"{row['method']:<12} FAILED")
            continue
        print(f"{row['method']:<12} {row['wall_s']:>8.2f} {fmt(row['x_lm_eval_b1'], '.2f', 'x'):>12} "
              f"{fmt(row['x_lm_eval_best'], '.2f', 'x'):>14} {fmt(row.get('x_flop_floor'), '.2f', 'x'):>8} "
              f"{fmt(row.get('achieved_gflops'), '.1f'):>7} {row['peak_rss_mib']:>12.0f} "
              f"{row.get('compared_with') or '-':>13} {fmt(row.get('vs_ref_max_abs_diff'), '.3g'):>8} "
              f"{fmt(row.get('vs_ref_n_argmax_changes'), 'd'):>10}")
    print(f"(x lm-eval best: relative to {best}; x floor: the dual run's floor counts both paths, 2x; dual's wall is "
          "its scoring stages, options' wall its whole run including both model loads; compared with: the method "
          "that ran the same tensors (lm-eval and parity at one batch size: must be 0), or parity for fast mode "
          "(its own shapes: a measured difference))")
    for row in table:
        if row.get("failure"):
            print(f"{row['method']}: {row['failure']}")
        if "official_vs_independent" in row:
            o = row["official_vs_independent"]
            print(f"dual: official (lm-eval batch {row['official_batch_size']}) vs independent parity: max abs diff "
                  f"{o['max_abs_diff']}, {o['n_scores_equal']}/{o['n_scores']} scores bit-identical; total with "
                  f"both model loads {row['total_s']:.1f} s")
        if row["method"] == "fast" and row.get("gemm_only_s"):
            print(f"fast: its matrix multiplications alone (same shapes, workers, threads) take "
                  f"{row['gemm_only_s']:.2f} s "
                  f"= {row['gemm_only_x_floor']:.2f}x the floor; everything else (attention, norms, activations, "
                  f"Python) adds {row['wall_s'] / row['gemm_only_s']:.2f}x on top")
        if row["method"] == "options" and "total_s" in row:
            print(f"options: five conditions, dual path, {row['total_s']:.1f} s in all, peak RSS "
                  f"{row['peak_rss_mib']:.0f} MiB")


def targets_of(table):
    """The speed and memory targets (under 10 minutes and 2 GB peak RSS on 872 rows), for the methods that were
    measured (None: not measured)."""
    by = {r["method"]: r for r in table if "wall_s" in r}
    t = {}
    same_tensors = [r for m, r in by.items() if m.startswith("lm_eval_b") and "vs_ref_max_abs_diff" in r]
    if same_tensors:
        t["lm_eval_equals_parity_at_each_batch_size"] = all(r["vs_ref_max_abs_diff"] == 0.0 for r in same_tensors)
    if "dual" in by:
        t["dual_bit_exact"] = by["dual"]["failure"] is None
        if by["dual"]["x_lm_eval_best"] is not None:
            t["dual_within_2.1x_lm_eval_best"] = by["dual"]["x_lm_eval_best"] <= 2.1
    if "fast" in by:
        t["fast_within_1.15x_of_floor"] = by["fast"]["x_flop_floor"] <= 1.15
    t["every_argmax_identical"] = all(r.get("argmax_changes_vs_parity", 0) == 0 and
                                      r.get("vs_ref_n_argmax_changes", 0) == 0 for r in by.values())
    if "options" in by:
        t["options_under_10_minutes"] = by["options"]["total_s"] < 600 and by["options"]["failure"] is None
    t["peak_rss_under_2GB_all_methods"] = all(r["peak_rss_mib"] * 2**20 < 2e9 for r in by.values())
    return t


def bench_data(args, tmp):
    """(model_dir, model identity, data id, parquet path, content sha256, rows). --data-file is read with the same
    reader prepare.py uses and written as a parquet into `tmp`; --data is the cache's verified copy."""

    rows = resources.read_data_file(args.data_file) if args.data_file else None      # a bad file: one line, first

    manifest = resources.prepared_manifest(args.cache)
    model_dir, model_identity = resources.verified_model(Path(args.cache), args.model, manifest,
                                                         local_model.local_identity)
    if not args.data_file:      # --data-file: only the model comes from the cache
        parquet, entry, _ = resources.verified_rows(args.cache, args.data, manifest)   # rows re-hashed too
        if entry.get("schema", "sst2") != "sst2":
            raise resources.ResourceError(f"--data {args.data}: bench.py measures SST-2-shaped data, this is "
                                          f"{entry['schema']}-shaped")
        return model_dir, model_identity, args.data, parquet, entry["content_sha256"], load_rows(parquet)
    parquet = Path(tmp) / "validation.parquet"
    parquet.write_bytes(resources.rows_to_parquet_bytes(rows))
    name = f"file:{Path(args.data_file).name}"
    return model_dir, model_identity, name, parquet, resources.content_sha256(rows), load_rows(parquet)


# ---- data-parallel scaling (--scaling): 1 process vs torchrun with 2, one torch thread each ------------------

def scaling_run(args, nproc, out):
    """`run.py --experiment E --no-cache` in one process (nproc 1) or under torchrun; (wall seconds, load after)."""

    env = dict(os.environ, EVAL_TORCH_THREADS="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    run = [str(REPO / "run.py"), "--cache", args.cache, "--out", str(out), "--model", args.model, "--data",
           args.data, "--experiment", args.experiment, "--no-cache", *(["--smoke"] if args.split == "smoke" else [])]
    if nproc > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        run = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
               "--master_port", str(port), *run]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *run], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench --scaling: {nproc} process(es) failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return wall


def item_tokens(records):
    """{idx: input tokens both paths run through the model for that item}: per candidate, context + candidate
    tokens, once for lm-eval and once for the independent path (the work of one rank's item, parity mode)."""
    out = {}
    for r in records:
        n = sum(r["context_tokens"] + len(c["token_ids"]) for c in r["candidates"])
        out[r["idx"]] = out.get(r["idx"], 0) + 2 * n
    return out


def scaling_ranks(out, experiment):
    """Per rank: items scored, input tokens, scoring seconds (the official* and independent* stages, model loads
    left out), tokens/s, items/s and peak RSS; a one-process run is one rank."""
    stages = json.loads((out / experiment / "stages.json").read_text())
    records = [json.loads(l) for l in (out / experiment / "records.jsonl").read_text().splitlines()]
    tokens = item_tokens(records)
    ranks = (stages.get("data_parallel") or {}).get("ranks") or [
        {"rank": 0, "stages": stages["stages"], "items_scored": {"independent": sorted(tokens)},
         "peak_rss_bytes": max(s["peak_rss_bytes_at_end"] or 0 for s in stages["stages"])}]
    rows = []
    for r in ranks:
        mine = r["items_scored"]["independent"]
        scoring_s = sum(s["wall_s"] for s in r["stages"]
                        if s["name"].startswith(("official", "independent")) and not s["name"].endswith("model_load"))
        n_tok = sum(tokens[i] for i in mine)
        rows.append({"rank": r["rank"], "items": len(mine), "input_tokens": n_tok, "scoring_s": round(scoring_s, 3),
                     "tokens_per_s": round(n_tok / scoring_s, 1) if scoring_s else None,
                     "items_per_s": round(len(mine) / scoring_s, 3) if scoring_s else None,
                     "peak_rss_mib": round(r["peak_rss_bytes"] / 2 ** 20, 1)})
    return rows, records


def scaling_main(args):
    """1 process vs 2 (torchrun, gloo), one torch thread each, the same items; the records must be identical.
    Writes the "scaling" report to --out (default bench.json)."""
    load_before = os.getloadavg()
    result, records = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        for nproc in (1, 2):
            out = Path(tmp) / f"n{nproc}"
            wall = scaling_run(args, nproc, out)
            ranks, records[nproc] = scaling_ranks(out, args.experiment)
            n_items = len({r["idx"] for r in records[nproc]})
            result[nproc] = {"processes": nproc, "wall_s": round(wall, 2), "items": n_items,
                             "items_per_s": round(n_items / wall, 3), "ranks": ranks}
            print(f"scaling: {nproc} process(es): {wall:.1f} s wall, {n_items / wall:.3f} items/s; " + "; ".join(
                f"rank {r['rank']}: {r['items']} items, {r['tokens_per_s']} tokens/s, {r['items_per_s']} items/s "
                f"scoring, peak RSS {r['peak_rss_mib']} MiB" for r in ranks))
    if records[1] != records[2]:
        raise SystemExit("bench --scaling: the 2-process records differ from the 1-process records")
    report = {"scaling": {"experiment": args.experiment, "split": args.split, "model": args.model, "data": args.data,
                          "threads_per_process": 1, "runs": [result[1], result[2]],
                          "speedup_wall": round(result[1]["wall_s"] / result[2]["wall_s"], 3),
                          "records_identical": True, "load_average_before": load_before,
                          "load_average_after": os.getloadavg(), "cpu_count": os.cpu_count(),
                          "wall_s_meaning": "the whole run.py command: imports, model loads (both paths, every "
                                            "process), scoring, evidence; scoring_s per rank: its official* and "
                                            "independent* stages only", "command_line": sys.argv}}
    print(f"scaling: speed-up (wall) {report['scaling']['speedup_wall']}x; load average {load_before[0]:.2f} before, "
          f"{report['scaling']['load_average_after'][0]:.2f} after")
    Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.worker == "sgemm":
        return sgemm_worker(args.result, args.sgemm_size)
    if args.worker:
        return worker(args.worker, args.spec, args.result)
    # the workers run in the repository's directory: a relative path the user gave names a file from theirs
    for name in ("cache", "data_file", "out"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(os.path.expanduser(getattr(args, name))))
    if os.sep in args.model or args.model.startswith((".", "~")) or os.path.lexists(args.model):
        args.model = os.path.abspath(os.path.expanduser(args.model))     # a model directory, as run.py reads --model
    if args.scaling:
        return scaling_main(args)

    methods = [m for m in args.methods.split(",") if m]
    if not methods or not all(map(known_method, methods)):
        ap.error(f"--methods: expected a comma-separated subset of {','.join(METHODS)} (or lm_eval_b<N>, "
                 "parity_b<N>, fast_b<N>)")
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        try:
            model_dir, model_identity, data_id, parquet, content_sha, rows = bench_data(args, tmp)
        except ResourceError as e:
            fail(str(e))
        overrides = {"model": args.model, "data": data_id}
        config = bench_config(overrides)
        reqs = build_requests(rows, args.n, config)
        work = count_work(model_dir, reqs, config)
        fm, flops = flop_floor(model_dir, work)
        load_before = os.getloadavg()
        print(f"bench: {len(reqs)} items of {data_id}, {work['n_candidates']} candidates, {work['context_tokens']} "
              f"context tokens, model {args.model}, threads {config['threads']}, load average {load_before[0]:.2f}")
        print_floor(fm, work, flops)
        spec = {"model_dir": str(model_dir), "model_identity": model_identity, "cache": str(args.cache),
                "data_id": data_id, "parquet": str(parquet), "data_content_sha256": content_sha,
                "requests": reqs, "config": overrides}
        results, sgemm = measure(methods, spec, args.timeout, tmp, args.sgemm_size)
    load_after = os.getloadavg()
    gflops = max(s["gflops"] for s in sgemm)
    floor_s = flops / (gflops * 1e9)
    table = method_table(methods, results, len(reqs), work, flops, floor_s, config)
    refs = lm_eval_refs(results)
    print(f"\nFLOP floor {flops / 1e12:.4f} TFLOP at {gflops:.1f} GFLOPS = {floor_s:.2f} s; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; {config['threads']} threads")
    print_table(table, refs)
    targets = targets_of(table)
    print("targets: " + ", ".join(f"{k}={v}" for k, v in targets.items()))
    report = {
        "data": data_id, "data_content_sha256": content_sha, "model": args.model, "n_items": len(reqs),
        "threads": config["threads"], "official_batch_size": config["official_batch_size"],
        "fast_batch_size": config["fast_batch_size"], "fast_max_batch_tokens": config["fast_max_batch_tokens"],
        "work": work, "flop_model": fm, "flop_formula": "2 * N_nonemb * T + 2 * d_model * V * R", "flops": flops,
        "sgemm": sgemm, "sgemm_gflops_used": gflops, "flop_floor_s": floor_s, "load_average_before": load_before,
        "load_average_after": load_after, "cpu_count": os.cpu_count(), "cpu": cpu_model(), "table": table,
        "targets": targets,
        "lm_eval_reference": {"b1": refs[0], "best": refs[1], "best_method": refs[2]},
        "timed_span": "scoring only: after model load and one untimed warm-up; tokenisation included. dual: its "
                      "scoring stages (official + independent + compare; model loads in total_s). options: the "
                      "whole run including both model loads",
        "fast_workers": (results.get("fast") or {}).get("extra", {}).get("workers"),
        "idx": [r["idx"] for r in reqs], "scores": {m: results[m].get("scores") for m in methods},
        "work_done": {m: {k: v for k, v in results[m].get("extra", {}).items() if k != "official_scores"}
                      for m in methods},
        "command_line": sys.argv,
    }
    Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0 if all("failed" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
