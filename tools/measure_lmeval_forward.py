"""Measure the forward level of `audit.py --lm-eval RUN --forward --model DIR` on the real model: its time against
lm-eval's for the same requests, and the per-dtype figures behind forward.TOLERANCE (docs/forward-dtypes.md).

For each dtype it runs the real lm-eval 0.4.9.2 (HFLM, eager attention, cpu, --batch_size B, in-process
simple_evaluate + EvaluationTracker, as `lm_eval ... --log_samples --output_path` writes) on the sst2 task YAML
served from N distinct documents (fixtures/reviews_872_dev.tsv, then fixtures/sentiment_dev.tsv sentences not in
it: no document repeated), then audits the run in-process:
  1. the forward level in lm-eval's batches (the mode an audit of this run takes): its wall time against lm-eval's
     simple_evaluate wall time, and max |recomputed - logged| (expected 0);
  2. the same run re-scored one unpadded sequence per pass (--sample covering every document, the fallback mode):
     max / p99 / median |unbatched - lm-eval's batches| and the prediction / is_greedy flips: what a tolerance must
     cover when the batches cannot be reproduced.
Both sides run on the same torch thread count. Run it niced on a quiet machine:

    nice -n 5 .venv/bin/python tools/measure_lmeval_forward.py --model cache/models/smollm2-135m-instruct-q4_1 \
        --docs 1000 --dtypes float32 bfloat16 --tolerance-docs 200
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def documents(n):
    """N distinct (sentence, label) rows: reviews_872 first, then the fixture sentences it lacks."""
    rows, seen = [], set()
    for name in ("reviews_872_dev.tsv", "sentiment_dev.tsv"):
        for line in (REPO / "fixtures" / name).read_text(encoding="utf-8").splitlines()[1:]:
            sentence, label = line.rsplit("\t", 1)
            if sentence not in seen:
                seen.add(sentence)
                rows.append((sentence, int(label)))
    if len(rows) < n:
        raise SystemExit(f"only {len(rows)} distinct documents in the fixtures; ask for at most that many")
    return rows[:n]


def write_parquet(rows, path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sentence": [s for s, _ in rows], "label": [y for _, y in rows],
                             "idx": pa.array(range(len(rows)), pa.int32())}), path)
    return path


def lm_eval_run(model_dir, parquet, out, dtype, batch_size):
    """(wall, CPU) seconds of simple_evaluate, and the run directory."""
    from lm_eval import evaluator
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.models.huggingface import HFLM

    from experiments import official

    cfg = official.task_config("tasks/glue/sst2/default.yaml", parquet)
    cfg["metric_list"] = [{"metric": "acc"}]
    lm = HFLM(pretrained=str(model_dir), device="cpu", dtype=dtype, batch_size=batch_size,
              attn_implementation="eager")
    tracker = EvaluationTracker(output_path=str(out))
    t0, c0 = time.perf_counter(), time.process_time()
    results = evaluator.simple_evaluate(
        model=lm, model_args=f"pretrained={model_dir},dtype={dtype},attn_implementation=eager", tasks=[cfg],
        batch_size=batch_size, device="cpu", log_samples=True, evaluation_tracker=tracker, bootstrap_iters=0,
        cache_requests=False)
    seconds = (time.perf_counter() - t0, time.process_time() - c0)
    logged = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=logged)
    for name in results["configs"]:
        tracker.save_results_samples(task_name=name, samples=logged[name])
    return seconds, out


def audit(run, model_dir, parquet, threads, sample=None):
    """((wall, CPU) seconds of the whole audit, the forward figures of sst2, the forward rows, the result)."""
    from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY, AuditOptions
    from evidence_audit.lmeval import rescore
    from evidence_audit.lmeval.driver import audit_lmeval

    rescore._RUNS.clear()              # time a fresh audit: nothing re-used from the previous one
    t0, c0 = time.perf_counter(), time.process_time()
    report = audit_lmeval(run, (ARITHMETIC, IDENTITY, FORWARD), [str(parquet)], Path(model_dir), sample,
                          options=AuditOptions(threads=threads))
    seconds = (time.perf_counter() - t0, time.process_time() - c0)
    rows = {r["check"]: r for r in report["checks"] if r["level"] == "forward"}
    return seconds, report["details"]["sst2"]["forward"], rows, report["result"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "cache" / "models" / "smollm2-135m-instruct-q4_1")
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--tolerance-docs", type=int, default=200, help="documents of the unbatched re-score")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("DISABLE_MULTIPROC", "1")
    root = args.out or Path(tempfile.mkdtemp(prefix="measure-lmeval-forward-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} cpu(s), torch {torch.__version__}, {args.threads} thread(s); model "
          f"{args.model}; batch size {args.batch_size}; runs in {root}", flush=True)
    out = {}
    for dtype in args.dtypes:
        for label, n in (("perf", args.docs), ("tolerance", args.tolerance_docs)):
            if label == "tolerance" and n == args.docs and "perf" in out.get(dtype, {}):
                run, lm_s = out[dtype]["perf"]["run"], None
            else:
                parquet = write_parquet(documents(n), root / f"docs-{n}.parquet")
                lm_s, run = lm_eval_run(args.model, parquet, root / f"run-{dtype}-{n}", dtype, args.batch_size)
            parquet = root / f"docs-{n}.parquet"
            if label == "perf":
                secs, fig, rows, result = audit(run, args.model, parquet, args.threads)
                out.setdefault(dtype, {})["perf"] = {"run": run, "documents": n,
                                                     "lm_eval_seconds_wall_cpu": [round(x, 1) for x in lm_s],
                                                     "audit_seconds_wall_cpu": [round(x, 1) for x in secs],
                                                     "forward_rows_seconds_wall": fig["seconds"],
                                                     "ratio_wall": round(secs[0] / lm_s[0], 2),
                                                     "ratio_cpu": round(secs[1] / lm_s[1], 2), "mode": fig["mode"],
                                                     "max_abs_diff": fig["max_abs_diff"], "result": result,
                                                     "float32_beside": fig.get("float32_beside", {}).get("spread")}
            else:
                secs, fig, rows, result = audit(run, args.model, parquet, args.threads, sample=10 ** 9)
                out.setdefault(dtype, {})["tolerance"] = {
                    "documents": n, "requests": fig["requests"], "mode": fig["mode"], "spread": fig["spread"],
                    "argmax_flips": len(fig["argmax_flips"]), "is_greedy_flips": len(fig["is_greedy_flips"]),
                    "audit_seconds_wall_cpu": [round(x, 1) for x in secs]}
            shown = {k: v for k, v in out[dtype][label].items() if k != "run"}
            print(f"{dtype} {label}: {json.dumps(shown)}", flush=True)
    print(json.dumps({d: {k: {kk: vv for kk, vv in v.items() if kk != "run"} for k, v in x.items()}
                      for d, x in out.items()}, indent=1, default=str))


if __name__ == "__main__":
    main()
