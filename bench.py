"""Time the scorers on the same SST-2 requests and compare them with the hardware's FLOP floor.

    python bench.py --cache ./cache --n 200                       # the sentiment fixture (offline), 200 items
    python bench.py --cache ./cache --data glue-sst2              # any prepared SST-2-shaped data, all rows
    python bench.py --cache ./cache --scaling --out scaling.json  # run.py in 1 vs 2 processes (torchrun, gloo)

Methods (each in a fresh subprocess, so peak RSS is per method; the timed span is scoring only, after the model
is loaded and one untimed warm-up item):
    lm_eval_b1    lm-eval 0.4.9.2 HFLM.loglikelihood, batch size 1 (the official path's settings)
    lm_eval_b16   the same at batch size 16
    parity        the independent path in parity mode (experiments/scoring.py: one sequence per forward pass)
    fast          the independent path in fast mode (experiments/fast_scoring.py, config fast_batch_size)

Requests: the official SST-2 prompt for the first N rows in idx order, candidates " negative" and " positive".
The FLOP floor is computed exactly from the model's config.json and the token counts of these requests:

    FLOPs = 2 * N_nonemb * T + 2 * d_model * V * R
    N_nonemb = layers * (d*(heads*hd) + 2*d*(kv_heads*hd) + (heads*hd)*d + 3*d*d_ff)   (the matmul weights)
    T = tokens that must pass through the layers (each distinct context once, plus multi-token candidates' tokens)
    R = output-layer rows that are scored (one per distinct context for one-token candidates)

(attention scores, norms and activations are not counted: the floor is a lower bound), and floor_s = FLOPs /
the sgemm rate measured in the same run (torch.mm of 4096 x 4096 fp32 matrices with the configured threads,
best of several, measured before and after the methods; the higher is used). Writes bench.json (--out).
Wall times are measurements of this machine at this moment: the load average is recorded next to them.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from config import CONFIG, effective

REPO = Path(__file__).resolve().parent
METHODS = ["lm_eval_b1", "lm_eval_b16", "parity", "fast"]
SHARED = CONFIG["shared"]              # defaults of --model / --data, the sgemm threads


def bench_config(overrides=None):
    """The protocol experiment's effective settings (these are its requests), plus overrides such as --model."""
    from experiments.protocol import CONFIG_SECTIONS

    return effective(CONFIG_SECTIONS, overrides)


# ---- worker side (one method per process) ---------------------------------------------------------------------

def _peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(method, spec_path, result_path):
    spec = json.loads(Path(spec_path).read_text())
    config = bench_config(spec["config"])
    import torch

    torch.set_num_threads(config["threads"])
    reqs = spec["requests"]                     # [{"context", "candidates"}]
    if method.startswith("lm_eval_b"):
        scored = score_lm_eval(spec["model_dir"], reqs, config, int(method[len("lm_eval_b"):]))
    elif method in ("parity", "fast"):
        scored = score_independent(spec["model_dir"], reqs, config, method)
    else:
        raise SystemExit(f"unknown method {method!r}")
    scores, wall, load_s, extra = scored
    Path(result_path).write_text(json.dumps({
        "method": method, "wall_s": wall, "load_s": load_s, "peak_rss_bytes": _peak_rss_bytes(),
        "threads": torch.get_num_threads(), "scores": scores, "extra": extra}))


def score_lm_eval(model_dir, reqs, config, batch_size):
    """(scores per request, timed wall s, load s, extra) through lm-eval's HFLM.loglikelihood."""
    t0 = time.perf_counter()                    # load_s counts the imports too
    from experiments import official

    config = dict(config, batch_size=batch_size)
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
    t0 = time.perf_counter()                    # load_s counts the imports too
    from adapter import load_model, load_tokenizer
    from experiments import fast_scoring, scoring

    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, config)
    load_s = time.perf_counter() - t0
    limit = config["max_input_tokens"]
    if method == "parity":
        scoring.score_candidates(model, tok, reqs[0]["context"], reqs[0]["candidates"], limit)   # warm-up
        t1 = time.perf_counter()
        scores = [[c["score"] for c in scoring.score_candidates(model, tok, r["context"], r["candidates"], limit)]
                  for r in reqs]
        wall = time.perf_counter() - t1
        return scores, wall, load_s, {"forward_passes": sum(len(r["candidates"]) for r in reqs)}
    bs, mbt, w = config["fast_batch_size"], config["fast_max_batch_tokens"], fast_scoring.workers(config)
    items = [(i, r["context"], r["candidates"]) for i, r in enumerate(reqs)]
    fast_scoring.score_candidates_fast(model, tok, items[:2 * w], limit, bs, mbt, w)      # warm-up
    t1 = time.perf_counter()
    res, stats = fast_scoring.score_candidates_fast(model, tok, items, limit, bs, mbt, w)
    wall = time.perf_counter() - t1
    return [[c["score"] for c in res[i]] for i in range(len(reqs))], wall, load_s, dict(stats)


def sgemm_worker(result_path, n=4096, reps=5):
    import torch

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


def build_requests(parquet, n, config):
    from resources import read_parquet_rows

    rows = read_parquet_rows(parquet)
    rows = rows if n is None else rows[:n]
    cands = [config["target_delimiter"] + c for c in config["sst2_choices"]]
    return [{"idx": r["idx"], "label": r["label"], "context": config["sst2_prompt"].format(sentence=r["sentence"]),
             "candidates": cands} for r in rows]


def count_work(model_dir, reqs, config):
    """T and R of the floor, from the tokenised requests (the fast mode's plan without padding)."""
    from adapter import load_tokenizer
    from experiments import fast_scoring, scoring

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
            "n_candidates": sum(len(r["candidates"]) for r in reqs)}


def run_sub(args, timeout):
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REPO / "bench.py"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"bench worker {args[:2]} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def diff_vs(ref, other):
    from experiments.scoring import argmax_first

    diffs = [abs(a - b) for x, y in zip(ref, other) for a, b in zip(x, y)]
    return {"max_abs_diff": max(diffs), "n_argmax_changes": sum(argmax_first(x) != argmax_first(y)
                                                                for x, y in zip(ref, other)),
            "n_scores_equal": sum(d == 0.0 for d in diffs)}


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="cache", help="cache directory filled by prepare.py (default ./cache)")
    ap.add_argument("--data", default=SHARED["data"], help="SST-2-shaped data resource id: pinned, or a prepare.py "
                                                          "--name import (default the fixture)")
    ap.add_argument("--model", default=SHARED["model"], help="model resource id")
    ap.add_argument("--n", type=int, default=None, help="first N rows in idx order (default: all)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--out", default="bench.json", help="where to write the results (default bench.json)")
    ap.add_argument("--timeout", type=float, default=3600, help="per-method timeout in seconds")
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


def measure(methods, spec_content, timeout):
    """Run every method in its own subprocess, with the sgemm rate measured before and after: (results, sgemm)."""
    results, sgemm = {}, []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps(spec_content))

        def measure_sgemm():
            out = Path(tmp) / f"sgemm{len(sgemm)}.json"
            run_sub(["--worker", "sgemm", "--result", str(out)], 600)
            sgemm.append(json.loads(out.read_text()))
            print(f"  sgemm: {sgemm[-1]['gflops']:.1f} GFLOPS (torch.mm {sgemm[-1]['n']}^2 fp32, "
                  f"{sgemm[-1]['threads']} threads, best of {sgemm[-1]['reps']})")

        measure_sgemm()
        for m in methods:
            out = Path(tmp) / f"{m}.json"
            t0 = time.perf_counter()
            run_sub(["--worker", m, "--spec", str(spec), "--result", str(out)], timeout)
            results[m] = json.loads(out.read_text())
            results[m]["process_wall_s"] = time.perf_counter() - t0
            print(f"  {m}: {results[m]['wall_s']:.2f} s scoring (+{results[m]['load_s']:.1f} s load), "
                  f"peak RSS {results[m]['peak_rss_bytes'] / 2**20:.0f} MiB")
        measure_sgemm()
    return results, sgemm


def method_table(methods, results, n_items, work, flops, floor_s):
    """One row per method: speed, distance from the FLOP floor, memory, and agreement with parity mode."""
    ref = "parity" if "parity" in results else None
    base = results.get("lm_eval_b16")
    table = []
    for m in methods:
        r = results[m]
        row = {"method": m, "wall_s": round(r["wall_s"], 3), "items_per_s": round(n_items / r["wall_s"], 3),
               "context_tokens_per_s": round(work["context_tokens"] / r["wall_s"], 1),
               "speedup_vs_lm_eval_b16": round(base["wall_s"] / r["wall_s"], 3) if base else None,
               "x_flop_floor": round(r["wall_s"] / floor_s, 3),
               "achieved_gflops": round(flops / r["wall_s"] / 1e9, 1),
               "peak_rss_mib": round(r["peak_rss_bytes"] / 2**20, 1), "load_s": round(r["load_s"], 2)}
        if ref:
            row.update({f"vs_{ref}_{k}": v for k, v in diff_vs(results[ref]["scores"], r["scores"]).items()})
        table.append(row)
    return table


def print_table(table):
    print(f"{'method':<12} {'wall s':>8} {'items/s':>8} {'tok/s':>8} {'vs lm-eval b16':>14} {'x floor':>8} "
          f"{'GFLOPS':>7} {'peak RSS MiB':>12} {'max|d| vs parity':>16} {'argmax chg':>10}")
    for row in table:
        sp = f"{row['speedup_vs_lm_eval_b16']:.2f}x" if row["speedup_vs_lm_eval_b16"] else "-"
        print(f"{row['method']:<12} {row['wall_s']:>8.2f} {row['items_per_s']:>8.2f} "
              f"{row['context_tokens_per_s']:>8.0f} {sp:>14} {row['x_flop_floor']:>7.2f}x {row['achieved_gflops']:>7.1f} "
              f"{row['peak_rss_mib']:>12.0f} {row.get('vs_parity_max_abs_diff', float('nan')):>16.3g} "
              f"{row.get('vs_parity_n_argmax_changes', '-'):>10}")


def targets_of(table):
    """The fast mode's speed and memory targets, when it was measured."""
    fast = next((r for r in table if r["method"] == "fast"), None)
    if fast is None:
        return {}
    has_base = any(r["method"] == "lm_eval_b16" for r in table)
    return {"fast_within_1.25x_of_floor": fast["x_flop_floor"] <= 1.25,
            "fast_at_least_1.3x_faster_than_lm_eval_b16": (fast["speedup_vs_lm_eval_b16"] or 0) >= 1.3
            if has_base else None,
            "peak_rss_under_2GB_all_methods": all(r["peak_rss_mib"] * 2**20 < 2e9 for r in table)}


# ---- data-parallel scaling (--scaling): 1 process vs torchrun with 2, one torch thread each ------------------

def scaling_run(args, nproc, out):
    """`run.py --experiment E --no-cache` in one process (nproc 1) or under torchrun; (wall seconds, load after)."""
    import socket

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
        return sgemm_worker(args.result)
    if args.worker:
        return worker(args.worker, args.spec, args.result)
    if args.scaling:
        return scaling_main(args)

    from resources import ResourceError, fail, verified_data, verified_inputs

    methods = [m for m in args.methods.split(",") if m]
    if not methods or any(m not in METHODS for m in methods):
        ap.error(f"--methods: expected a comma-separated subset of {','.join(METHODS)}")
    try:
        model_dir, parquet, _, data_entry = verified_inputs(args.cache, args.model, args.data)
        verified_data(args.cache, args.data)          # the content the lock (or CACHE/user.lock.json) pins
        if data_entry.get("schema", "sst2") != "sst2":
            raise ResourceError(f"--data {args.data}: bench.py measures SST-2-shaped data, this is "
                                f"{data_entry['schema']}-shaped")
    except ResourceError as e:
        fail(str(e))
    config = bench_config({"model": args.model, "data": args.data})
    reqs = build_requests(parquet, args.n, config)
    work = count_work(model_dir, reqs, config)
    fm, flops = flop_floor(model_dir, work)
    load_before = os.getloadavg()
    print(f"bench: {len(reqs)} items of {args.data}, {work['n_candidates']} candidates, {work['context_tokens']} "
          f"context tokens, model {args.model}, threads {config['threads']}, load average {load_before[0]:.2f}")
    print_floor(fm, work, flops)

    results, sgemm = measure(methods, {"model_dir": str(model_dir), "requests": reqs,
                                       "config": {"model": args.model, "data": args.data}}, args.timeout)
    load_after = os.getloadavg()
    gflops = max(s["gflops"] for s in sgemm)
    floor_s = flops / (gflops * 1e9)
    table = method_table(methods, results, len(reqs), work, flops, floor_s)
    print(f"\nFLOP floor {flops / 1e12:.4f} TFLOP at {gflops:.1f} GFLOPS = {floor_s:.2f} s; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; {config['threads']} threads")
    print_table(table)
    targets = targets_of(table)
    if targets:
        print("targets: " + ", ".join(f"{k}={v}" for k, v in targets.items()))
    report = {
        "data": args.data, "model": args.model, "n_items": len(reqs), "threads": config["threads"],
        "fast_batch_size": config["fast_batch_size"], "fast_max_batch_tokens": config["fast_max_batch_tokens"],
        "work": work, "flop_model": fm,
        "flop_formula": "2 * N_nonemb * T + 2 * d_model * V * R", "flops": flops, "sgemm": sgemm,
        "sgemm_gflops_used": gflops, "flop_floor_s": floor_s, "load_average_before": load_before,
        "load_average_after": load_after, "cpu_count": os.cpu_count(), "table": table, "targets": targets,
        "timed_span": "scoring only: after model load and one untimed warm-up; tokenisation included",
        "fast_workers": None if "fast" not in results else results["fast"]["extra"].get("workers"),
        "idx": [r["idx"] for r in reqs], "scores": {m: results[m]["scores"] for m in methods},
        "work_done": {m: results[m]["extra"] for m in methods},
        "command_line": sys.argv,
    }
    Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
