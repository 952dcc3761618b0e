"""How far the same loglikelihood requests move when only the kernels change: the measurement behind the forward
level's tolerances and shift bound (evidence_audit/forward.py TOLERANCE, evidence_audit/lmeval/rescore.py
SHIFT_FLOOR; docs/forward-dtypes.md has the table).

The requests are those of an lm-eval run directory (its samples file; default: the cross-machine batch-4 run in
tests/fixtures/cross_machine/), tokenised as the audit tokenises them. Each kernel path (default; MKL, ATen and
oneDNN restricted to AVX2; to SSE4.2) at each thread count runs in its own child process (the variables must be set
before torch is imported) and scores every request in lm-eval's batches of --batch-size through the audit's own
Llama pass (sdpa attention), in each dtype. Printed per dtype: every path against the first (default kernels,
1 thread) — max / p99 / median |diff| and the mean signed difference — and, where the run dir holds a run in that
dtype, every path against its logged scores (a run made on another machine).

    .venv/bin/python tools/measure_kernel_paths.py --model cache/models/smollm2-135m-instruct-q4_1
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATHS = {"default": {}, "AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                                 "ONEDNN_MAX_CPU_ISA": "AVX2"},
         "SSE4.2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default",
                    "ONEDNN_MAX_CPU_ISA": "SSE41"}}


def requests_of(run_dir, model_dir):
    """[(context ids, continuation ids)], the logged scores and the dtype of the run's samples, in file order, and
    the request indices of each sample (a document's choices)."""
    sys.path.insert(0, str(REPO))
    from evidence_audit import tokens
    from evidence_audit.lmeval import rescore
    top = json.loads(next(Path(run_dir).rglob("results_*.json")).read_text())
    encode = rescore.encoder(tokens.load_tokenizer(Path(model_dir) / "tokenizer.json"), top["config"], top,
                             "tokenizer-default")
    reqs, logged, docs = [], [], []
    for path in sorted(Path(run_dir).rglob("samples_*.jsonl")):
        for line in path.read_text().splitlines():
            s = json.loads(line)
            docs.append(list(range(len(reqs), len(reqs) + len(s["arguments"]))))
            for i, a in enumerate(s["arguments"].values()):
                reqs.append(rescore.encode_pair(encode, a["arg_0"], a["arg_1"])[:2])
                logged.append(float(s["resps"][i][0][0]))
    return reqs, logged, top["config"]["model_dtype"].replace("torch.", ""), docs


def child(args):
    """Score the requests in one process, as its environment's kernels give them; print the scores as JSON."""
    sys.path.insert(0, str(REPO))
    import torch
    from evidence_audit import forward, hflm
    torch.set_num_threads(args.threads)
    reqs = [tuple(r) for r in json.loads(Path(args.requests).read_text())]
    scorer, why = forward.load_scorer(args.model, args.dtype, "sdpa")
    if scorer is None:
        raise SystemExit(why)
    got = hflm.score_requests(scorer.logits, reqs, args.batch_size, None)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "scores": [g[0] for g in got]}))


def figures(a, b, docs):
    """max / p99 / median |a - b|, the mean of a - b, how many are bit-identical, and the largest change of a
    margin between two choices of one document ((a_i - a_j) - (b_i - b_j))."""
    d = sorted(abs(x - y) for x, y in zip(a, b))
    n = len(d)
    margin = max((abs((a[i] - a[j]) - (b[i] - b[j])) for doc in docs for i in doc for j in doc if i < j), default=0)
    return {"max": d[-1], "p99": d[max(0, -(-99 * n // 100) - 1)], "median": d[(n + 1) // 2 - 1],
            "mean_signed": sum(x - y for x, y in zip(a, b)) / n, "bit_identical": d.count(0.0), "margin": margin}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", nargs="*", default=[str(p) for p in sorted(
        (REPO / "tests/fixtures/cross_machine/lm-eval-0.4.9.2").glob("*")) if p.is_dir()])
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16", "float16"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--requests", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = args.threads[0]
        return child(args)
    reqs, _, _, docs = requests_of(args.runs[0], args.model)
    logged = {}
    for run in args.runs:
        r, scores, dtype, _ = requests_of(run, args.model)
        if r == reqs:
            logged.setdefault(dtype, []).append((Path(run).name, scores))
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"kernel-paths-{os.getpid()}.json"
    tmp.write_text(json.dumps(reqs))
    try:
        for dtype in args.dtypes:
            print(f"## {dtype}: {len(reqs)} requests, lm-eval's batches of {args.batch_size}, own Llama (sdpa)")
            got = {}
            for name, env in PATHS.items():
                for n in args.threads:
                    proc = subprocess.run([sys.executable, __file__, "--child", "--model", args.model, "--requests",
                                           str(tmp), "--dtype", dtype, "--threads", str(n), "--batch-size",
                                           str(args.batch_size)], env={**os.environ, **env}, capture_output=True,
                                          text=True, check=True)
                    out = json.loads(proc.stdout.strip().splitlines()[-1])
                    got[(name, n)] = out["scores"]
                    print(f"  {name:8s} {n} thread(s) (torch capability {out['capability']})", flush=True)
            ref = next(iter(got))
            for key, scores in got.items():
                f = figures(scores, got[ref], docs)
                print(f"  vs {ref[0]}/{ref[1]}: {key[0]}/{key[1]}: max {f['max']:.3g} p99 {f['p99']:.3g} median "
                      f"{f['median']:.3g} mean {f['mean_signed']:+.3g} bit-identical {f['bit_identical']}/{len(reqs)} "
                      f"margin change max {f['margin']:.3g}")
            for run, scores in logged.get(dtype, []):
                for key, mine in got.items():
                    f = figures(scores, mine, docs)
                    print(f"  logged {run} - {key[0]}/{key[1]}: max {f['max']:.3g} p99 {f['p99']:.3g} median "
                          f"{f['median']:.3g} mean {f['mean_signed']:+.3g} bit-identical "
                          f"{f['bit_identical']}/{len(reqs)} margin change max {f['margin']:.3g}")
    finally:
        tmp.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
