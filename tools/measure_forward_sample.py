"""Measure what the forward level costs against `--sample N`: `audit.py O --forward --sample N` on run.py evidence
and `audit.py --lm-eval RUN --forward --model DIR --sample N` on a real multi-task lm-eval run, each audit a fresh
subprocess (wall time, CPU time and peak RSS of that process, from os.wait4), beside the seconds the forward rows
report themselves (audit.json details.<experiment or task>.forward.seconds: scoring after the model is loaded, so
what the whole command adds on top is imports, the model load and the other levels, which read every item).

(a) run.py evidence: the protocol experiment on every row of fixtures/reviews_872_dev.tsv (prepare.py --data-file
    ... --name reviews-872 into WORK/cache, a hardlink copy of --cache without its result cache; run.py --split all
    --no-cache), then audit.py --forward --experiment protocol for each N of --evidence-n and without --sample.
(b) an lm-eval 0.4.9.2 run made here (simple_evaluate + EvaluationTracker, as tests/lmeval_runs.py makes the test
    suite's, HFLM float32 eager at --batch-size): sst2 (the installed GLUE YAML) and sst2_ll (a loglikelihood task)
    on the sentiment fixture's 200 rows, mc_taco on its 62-row fixture, sst2_gen (generate_until, max_gen_toks 6)
    on the fixture's first --gen-docs rows; then audit.py --lm-eval for each N of --lmeval-n and without --sample.

Also measured: torch.mm of 2048 x 2048 matrices in float32 and bfloat16 at 1 and 2 threads, per wall and per CPU
second, before and after each part (the rates the 7B projection of docs/speed.md uses beside the per-token cost),
and the load average before and after every step: on a shared machine a wall time alone says little, and the CPU
seconds are the steadier figure. Writes WORK/forward_sample.json (atomically; a part at a time, merged into what
is there) and prints the tables. An existing WORK/r872 or WORK/lmeval-run-b<batch size> is reused (the JSON says so).

    nice -n 5 .venv/bin/python tools/measure_forward_sample.py --cache ./cache --work /tmp/fs-work
    .venv/bin/python tools/measure_forward_sample.py --table /tmp/fs-work/forward_sample.json     # the tables again
    .venv/bin/python tools/measure_forward_sample.py --project /tmp/fs-work/forward_sample.json   # the 7B MMLU table
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL_ID = "smollm2-135m-instruct-q4_1"
EXPERIMENT = "protocol"
LMEVAL_DATA = {"sst2": "fixture-sentiment", "sst2_ll": "fixture-sentiment", "mc_taco": "fixture-mctaco"}


# ---- pure parts (tests/test_measure_forward_sample.py) -------------------------------------------------------------

def matmul_weights(cfg):
    """The weights a Llama forward pass multiplies every position by: the layers' matmuls (non-embedding) and the
    output layer (the audit's own pass and HFLM take logits at every position). From a config.json dict."""
    d, layers, ff = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or d // heads
    kv = cfg.get("num_key_value_heads") or heads
    layer = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * ff
    return {"non_embedding": layers * layer, "output_layer": d * cfg["vocab_size"]}


def pass_tokens(items):
    """(forward passes, tokens through them) of one unpadded sequence per pass, as hflm.score_requests groups
    requests: per item (context length, [candidate ids]), one pass per distinct context + candidate[:-1], of
    length context + the longest such candidate - 1."""
    passes = tokens = 0
    for ctx_len, cands in items:
        longest = {}
        for c in cands:
            key = tuple(c[:-1])
            longest[key] = max(longest.get(key, 0), len(c))
        passes += len(longest)
        tokens += sum(ctx_len + n - 1 for n in longest.values())
    return passes, tokens


def fit(rows, x="tokens", y="cpu_s"):
    """Least squares y = fixed + per_unit * x over the audits of one part (one point per N): what every audit pays
    whatever N (imports, the model load, the levels that read every item) and what each token re-scored adds.
    CPU seconds rather than wall: on a shared machine they move less with the neighbours' load."""
    pts = [(r[x], r[y]) for r in rows if r.get(x) is not None and r.get(y) is not None]
    if len(pts) < 2 or len({p for p, _ in pts}) < 2:
        return None
    n, sx, sy = len(pts), sum(p for p, _ in pts), sum(q for _, q in pts)
    sxx, sxy = sum(p * p for p, _ in pts), sum(p * q for p, q in pts)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return {"x": x, "y": y, "fixed": (sy - slope * sx) / n, "per_unit": slope, "points": n}


def per_token(seconds, tokens):
    return seconds / tokens if tokens else None


def project(per_token_s, weights_small, weights_big, passes, tokens_per_pass, rate_flops=None):
    """A forward audit of `passes` unpadded passes of `tokens_per_pass` tokens on a model whose matmul weights per
    position are `weights_big`, two ways, each with its arithmetic as text:
      scaled: the measured seconds per token of the small model times weights_big / weights_small (linear in the
              weights; ignores that large matrices run nearer the machine's peak, memory bandwidth, attention);
      floor:  2 * weights_big FLOPs per token / `rate_flops` (a matmul rate: measured, or an assumed GPU's)."""
    tokens = passes * tokens_per_pass
    ratio = weights_big / weights_small
    out = {"passes": passes, "tokens_per_pass": tokens_per_pass, "tokens": tokens, "weights_ratio": ratio}
    s = per_token_s * ratio * tokens
    out["scaled_s"] = s
    out["scaled_text"] = (f"{per_token_s * 1e3:.4g} ms/token x {weights_big:,} / {weights_small:,} (= {ratio:.4g}) "
                          f"x {passes:,} passes x {tokens_per_pass} tokens = {s:,.0f} s ({hours(s)})")
    if rate_flops:
        flops = 2 * weights_big * tokens
        f = flops / rate_flops
        out.update(flops=flops, floor_s=f, floor_text=(
            f"2 x {weights_big:,} x {tokens:,} tokens = {flops:.3e} FLOP / {rate_flops / 1e9:,.0f} GFLOP/s = "
            f"{f:,.0f} s ({hours(f)})"))
    return out


# A Llama-2-7B-shaped model (config.json fields as matmul_weights reads them): 6.74e9 parameters
LLAMA_7B = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_key_value_heads": 32, "vocab_size": 32000}
LLAMA_7B_PARAMETERS = 6_738_415_616
# MMLU's test split (cais/mmlu), questions per subject: lm-eval's mmlu group runs each subject as its own task, so
# `--sample N` draws N of each (sum: 14,042)
MMLU_SUBJECTS = {
    "abstract_algebra": 100, "anatomy": 135, "astronomy": 152, "business_ethics": 100, "clinical_knowledge": 265,
    "college_biology": 144, "college_chemistry": 100, "college_computer_science": 100, "college_mathematics": 100,
    "college_medicine": 173, "college_physics": 102, "computer_security": 100, "conceptual_physics": 235,
    "econometrics": 114, "electrical_engineering": 145, "elementary_mathematics": 378, "formal_logic": 126,
    "global_facts": 100, "high_school_biology": 310, "high_school_chemistry": 203,
    "high_school_computer_science": 100, "high_school_european_history": 165, "high_school_geography": 198,
    "high_school_government_and_politics": 193, "high_school_macroeconomics": 390, "high_school_mathematics": 270,
    "high_school_microeconomics": 238, "high_school_physics": 151, "high_school_psychology": 545,
    "high_school_statistics": 216, "high_school_us_history": 204, "high_school_world_history": 237,
    "human_aging": 223, "human_sexuality": 131, "international_law": 121, "jurisprudence": 108,
    "logical_fallacies": 163, "machine_learning": 112, "management": 103, "marketing": 234, "medical_genetics": 100,
    "miscellaneous": 783, "moral_disputes": 346, "moral_scenarios": 895, "nutrition": 306, "philosophy": 311,
    "prehistory": 324, "professional_accounting": 282, "professional_law": 1534, "professional_medicine": 272,
    "professional_psychology": 612, "public_relations": 110, "security_studies": 245, "sociology": 201,
    "us_foreign_policy": 100, "virology": 166, "world_religions": 171}
# assumptions, not measurements (docs/speed.md says where each comes from)
MMLU_TOKENS = {"0-shot": 150, "5-shot": 800}        # average prompt tokens of one question (one pass: the four
                                                    # one-token answers " A".." D" share it)
GPU_FLOPS = 312e12 * 0.4                            # an A100's published dense bf16 peak at an assumed 40% use


def mmlu_plan(n=None, subjects=MMLU_SUBJECTS):
    """(questions re-scored, [(subject, drawn, of, k for p = 0.99)]) of `--sample n` per subject (None: all)."""
    from evidence_audit.sampling import detection_k
    rows = [(s, m if n is None else min(n, m), m) for s, m in subjects.items()]
    return sum(d for _, d, _ in rows), [(s, d, m, detection_k(m, d) if d < m else 1) for s, d, m in rows]


def projections(per_token_s, weights_small, cpu_flops, gpu_flops=GPU_FLOPS, tokens=MMLU_TOKENS,
                samples=(None, 200, 20, 10), cpu32_flops=None):
    """The 7B MMLU projections of docs/speed.md: for each prompt length and --sample N per subject, the CPU time
    scaled from the measured per-token cost, the CPU FLOP floors at `cpu_flops` (bfloat16) and `cpu32_flops`
    (float32) and the GPU time at `gpu_flops`; and one stratum of 14,042 sampled at 200 with its bound."""
    from evidence_audit.sampling import detection_k
    w = matmul_weights(LLAMA_7B)
    big = w["non_embedding"] + w["output_layer"]
    out = {"weights_7b": big, "weights_small": weights_small, "rows": []}
    for shots, t in tokens.items():
        for n in samples:
            passes, per_subject = mmlu_plan(n)
            cpu = project(per_token_s, weights_small, big, passes, t, cpu_flops)
            gpu = project(per_token_s, weights_small, big, passes, t, gpu_flops)
            fp32 = project(per_token_s, weights_small, big, passes, t, cpu32_flops) if cpu32_flops else {}
            worst = max(k / m for _, d, m, k in per_subject if d < m) if n else None
            out["rows"].append({"shots": shots, "n": n, "passes": passes, "cpu": cpu,
                                "cpu32_floor_s": fp32.get("floor_s"), "cpu32_floor_text": fp32.get("floor_text"),
                                "gpu_s": gpu["floor_s"], "gpu_text": gpu["floor_text"],
                                "largest_k_share": worst})
    total = sum(MMLU_SUBJECTS.values())
    out["one_stratum"] = {"M": total, "n": 200, "k": detection_k(total, 200), "rows": [
        {"shots": shots, "cpu": project(per_token_s, weights_small, big, 200, t, cpu_flops),
         "cpu32_floor_s": project(per_token_s, weights_small, big, 200, t, cpu32_flops)["floor_s"]
         if cpu32_flops else None, "gpu_s": project(per_token_s, weights_small, big, 200, t, gpu_flops)["floor_s"]}
        for shots, t in tokens.items()]}
    return out


def hours(s):
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def fmt(x, nd=1):
    return "—" if x is None else f"{x:,.{nd}f}"


def table(result):
    """The markdown table of a forward_sample.json: one row per audit."""
    lines = ["| part | --sample N | items re-scored (of) | forward passes / tokens | audit wall s | audit CPU s | "
             "forward rows' s | forward share of wall | wall − forward s | forward ms / token | peak RSS MiB | "
             "load before / after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for part in ("evidence", "lmeval"):
        for row in result.get(part, {}).get("audits", []):
            n = "full" if row["n"] is None else str(row["n"])
            items = f"{row['items']:,} ({row['population']:,})"
            pt = ("—" if row.get("passes") is None else f"{row['passes']:,} / {row['tokens']:,}")
            ms = row.get("forward_s_per_token")
            lines.append(
                f"| {part} | {n} | {items} | {pt} | {fmt(row['wall_s'])} | {fmt(row['cpu_s'])} | "
                f"{fmt(row['forward_s'], 2)} | {row['forward_s'] / row['wall_s']:.0%} | "
                f"{fmt(row['wall_s'] - row['forward_s'])} | "
                f"{'—' if ms is None else f'{ms * 1e3:.3f}'} | {fmt(row['peak_rss_mib'], 0)} | "
                f"{row['load_before']:.2f} / {row['load_after']:.2f} |")
    return "\n".join(lines)


def derived(part, x):
    """The fits of one part: CPU and wall seconds against `x` (tokens re-scored, or items), and per audit the
    forward rows' estimated CPU seconds (the audit's CPU seconds times the forward rows' share of its wall time: the
    neighbours' load slows both alike) per `x`."""
    rows = part.get("audits", [])
    est = [{x: r[x], "forward_cpu_s": r["cpu_s"] * r["forward_s"] / r["wall_s"]} for r in rows
           if r.get(x) and r.get("wall_s")]
    return {"fit_cpu": fit(rows, x, "cpu_s"), "fit_wall": fit(rows, x, "wall_s"),
            "forward_cpu_s_per_unit": [{"n": r["n"], x: e[x], "forward_cpu_s": round(e["forward_cpu_s"], 2),
                                        "per_unit": e["forward_cpu_s"] / e[x]} for r, e in zip(rows, est)]}


def derived_text(result):
    lines = []
    for name, x in (("evidence", "tokens"), ("lmeval", "items")):
        if name not in result:
            continue
        d = derived(result[name], x)
        for key in ("fit_cpu", "fit_wall"):
            f = d[key]
            if f:
                lines.append(f"{name}: {f['y']} = {f['fixed']:.2f} + {f['per_unit'] * 1e3:.4f} ms x {x} "
                             f"({f['points']} audits)")
        lines += [f"{name} --sample {e['n'] or 'full'}: forward rows ~{e['forward_cpu_s']} CPU s, "
                  f"{e['per_unit'] * 1e3:.4f} ms CPU per {x[:-1]}" for e in d["forward_cpu_s_per_unit"]]
    return "\n".join(lines)


def task_table(result):
    """Per task of the lm-eval audits: documents re-scored, the forward row's seconds and mode."""
    lines = ["| --sample N | task | documents (of) | requests | forward s | mode |", "|---|---|---|---|---|---|"]
    for row in result.get("lmeval", {}).get("audits", []):
        for name, t in row["strata"].items():
            lines.append(f"| {'full' if row['n'] is None else row['n']} | {name} | {t['items']} ({t['population']}) | "
                         f"{t.get('requests', '—')} | {fmt(t['seconds'], 2)} | {t.get('mode', '')[:70]} |")
    return "\n".join(lines)


def projection_text(result, vcpus=2):
    """docs/speed.md's 7B MMLU table from a forward_sample.json: the per-token cost of the 135M model's full forward
    level on the 872 rows (its forward rows' CPU seconds, estimated as in `derived`, per token), spread over `vcpus`
    at perfect scaling; the bfloat16 matmul rate per CPU second measured beside it (before the part, 2 threads),
    times `vcpus`; the GPU rate assumed (GPU_FLOPS)."""
    ev = result["evidence"]
    full = next(r for r in ev["audits"] if r["n"] is None)
    cpu_per_token = full["cpu_s"] * full["forward_s"] / full["wall_s"] / full["tokens"]
    w = result["matmul_weights"]
    small = w["non_embedding"] + w["output_layer"]
    rate = ev["matmul_gflops_before"]["bfloat16@2"]["per_cpu_s"] * 1e9 * vcpus
    rate32 = ev["matmul_gflops_before"]["float32@2"]["per_cpu_s"] * 1e9 * vcpus
    p = projections(cpu_per_token / vcpus, small, rate, cpu32_flops=rate32)
    lines = [f"measured: {cpu_per_token * 1e3:.4f} ms CPU per token (135M, float32, 1 thread; {full['tokens']:,} "
             f"tokens, forward rows ~{full['cpu_s'] * full['forward_s'] / full['wall_s']:.1f} CPU s) -> "
             f"{cpu_per_token / vcpus * 1e3:.4f} ms per token on {vcpus} vCPUs at perfect scaling; matmul "
             f"{rate32 / 1e9:,.0f} GFLOP/s float32, {rate / 1e9:,.0f} bfloat16 on {vcpus} vCPUs (per CPU second x "
             f"{vcpus}); GPU {GPU_FLOPS / 1e12:.1f} TFLOP/s (assumed)", "",
             "| prompt | --sample N per subject | questions (passes) | 2 vCPU, scaled from 135M fp32 | "
             "2 vCPU, fp32 FLOP floor | 2 vCPU, bf16 FLOP floor | 1 GPU, assumed rate | "
             "largest k/M of a sampled subject (p = 0.99) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        share = "—" if r["largest_k_share"] is None else f"{r['largest_k_share']:.0%}"
        lines.append(f"| {r['shots']} ({MMLU_TOKENS[r['shots']]} tokens) | {r['n'] or 'full'} | {r['passes']:,} | "
                     f"{hours(r['cpu']['scaled_s'])} | {hours(r['cpu32_floor_s'])} | {hours(r['cpu']['floor_s'])} | "
                     f"{hours(r['gpu_s'])} | "
                     f"{share} |")
    o = p["one_stratum"]
    for r in o["rows"]:
        lines.append(f"| {r['shots']} ({MMLU_TOKENS[r['shots']]} tokens) | 200 of all {o['M']:,} as one stratum | "
                     f"200 | {hours(r['cpu']['scaled_s'])} | {hours(r['cpu32_floor_s'])} | "
                     f"{hours(r['cpu']['floor_s'])} | {hours(r['gpu_s'])} | {o['k'] / o['M']:.1%} (k = {o['k']}) |")
    lines += ["", "arithmetic (0-shot, full):"]
    r0 = p["rows"][0]
    lines += [f"  scaled: {r0['cpu']['scaled_text']}", f"  fp32 floor: {r0['cpu32_floor_text']}",
              f"  bf16 floor: {r0['cpu']['floor_text']}",
              f"  GPU:    {r0['gpu_text']}",
              f"one stratum of {o['M']:,} sampled at n = {o['n']}: k = {o['k']} ({o['k'] / o['M']:.1%}) for p = 0.99"]
    return "\n".join(lines)


# ---- measuring -----------------------------------------------------------------------------------------------------

def atomic_json(path, obj):
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def timed(cmd, log):
    """Run cmd (stdout+stderr to `log`): exit code, wall s, CPU s (user + system) and peak RSS of that process
    (os.wait4: its own rusage, not the maximum over every child so far), the load average before and after."""
    before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"cmd": " ".join(map(str, cmd)), "exit": proc.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
            "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)}


def say(*a):
    print(*a, flush=True)


def copy_cache(src, dst):
    """dst: a hardlink copy of src (cp -al) without its result cache (SQLite writes in place: a hardlink would
    write into src). prepare.py writes every file by temp file + rename, which leaves src's links alone."""
    if not dst.exists():
        subprocess.run(["cp", "-al", str(src), str(dst)], check=True)
        for p in dst.glob("results.sqlite*"):
            p.unlink()
    return dst


def matmul_rates(threads=(1, 2), size=2048, rounds=3):
    """torch.mm of size x size matrices in float32 and bfloat16 at each thread count, best of `rounds`: GFLOP per
    wall second, and GFLOP per CPU second of this process (on a shared machine the wall rate is the share it got;
    the CPU rate, times the threads, is what the cores do when they are not shared)."""
    import torch
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        for n in threads:
            torch.set_num_threads(n)
            torch.mm(a, b)
            wall, cpu = min(timeit(lambda: torch.mm(a, b)) for _ in range(rounds))
            name = f"{str(dtype).replace('torch.', '')}@{n}"
            out[name] = {"wall": round(2 * size ** 3 / wall / 1e9, 1), "per_cpu_s": round(2 * size ** 3 / cpu / 1e9, 1)}
    return out


def timeit(fn):
    """(wall, CPU) seconds of fn()."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def cpu_info():
    text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return {"model_name": name, "cpus": os.cpu_count(), "avx512f": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


def evidence_part(args, work, cache):
    """(a): the 872-row protocol evidence, then the audits."""
    out, part = work / "r872", {"audits": []}
    if (out / "MANIFEST.json").exists():
        part["run"] = {"reused": str(out)}
    else:
        part["prepare"] = timed([sys.executable, "prepare.py", "--cache", cache, "--data-file",
                                 "fixtures/reviews_872_dev.tsv", "--name", "reviews-872"], work / "prepare.log")
        part["run"] = timed([sys.executable, "run.py", "--cache", cache, "--out", out, "--experiment", EXPERIMENT,
                             "--data", "reviews-872", "--split", "all", "--no-cache", "--threads",
                             str(args.run_threads)], work / "run872.log")
        if part["run"]["exit"] != 0:
            raise SystemExit(f"run.py failed: see {work / 'run872.log'}")
    say(f"(a) evidence {out}: {part['run']}")
    records = [json.loads(ln) for ln in (out / EXPERIMENT / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    by_idx = {str(r["idx"]): (r["context_tokens"], [c["token_ids"] for c in r["candidates"]]) for r in records}
    from evidence_audit import sampling
    for n in [*args.evidence_n, None]:
        report = work / f"audit-evidence-{n or 'full'}.json"
        cmd = [sys.executable, "audit.py", out, "--forward", "--experiment", EXPERIMENT, "--cache", cache,
               "--threads", str(args.threads), "--report", report] + ([] if n is None else ["--sample", str(n)])
        row = timed(cmd, work / f"audit-evidence-{n or 'full'}.log")
        rep = json.loads(report.read_text(encoding="utf-8"))
        fwd = rep["details"][EXPERIMENT]["forward"]
        keys = list(by_idx) if n is None else sampling.draw(rep["sample"]["seed"], EXPERIMENT, list(by_idx), n)
        passes, tokens = pass_tokens([by_idx[k] for k in keys])
        row.update(n=n, result=rep.get("result"), items=len(keys), population=len(by_idx), passes=passes,
                   tokens=tokens, forward_s=fwd["seconds"], forward_s_per_token=per_token(fwd["seconds"], tokens),
                   mode=fwd["mode"], threads=fwd.get("threads"), seed=(rep.get("sample") or {}).get("seed"),
                   strata={EXPERIMENT: {"items": len(keys), "population": len(by_idx), "seconds": fwd["seconds"],
                                        "mode": fwd["mode"]}})
        part["audits"].append(row)
        say(f"(a) --sample {n}: {json.dumps({k: v for k, v in row.items() if k != 'strata'})}")
    return part


def lmeval_data(cache, work, gen_docs):
    """{task: parquet}: the fixtures from the cache; sst2_gen's, the sentiment fixture's first gen_docs rows."""
    import pyarrow.parquet as pq
    data = {t: cache / "data" / d / "validation.parquet" for t, d in LMEVAL_DATA.items()}
    gen = work / f"sentiment-first-{gen_docs}.parquet"
    if not gen.exists():
        pq.write_table(pq.read_table(data["sst2"]).slice(0, gen_docs), gen)
    data["sst2_gen"] = gen
    return data


def make_lmeval_run(out, model_dir, data, batch_size, threads):
    """In this process: the four tasks through lm-eval's simple_evaluate into `out` (tests/lmeval_runs.py)."""
    os.environ.setdefault("DISABLE_MULTIPROC", "1")
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    import torch
    torch.set_num_threads(threads)
    import lmeval_runs
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(model_dir), device="cpu", dtype="float32", batch_size=batch_size, max_length=512,
              attn_implementation="eager")
    tasks = [lmeval_runs.sst2_task(data["sst2"]), lmeval_runs.loglikelihood_task(data["sst2_ll"]),
             lmeval_runs.mctaco_task(data["mc_taco"]), lmeval_runs.generate_task(data["sst2_gen"])]
    # recorded as `lm_eval --model_args ... --batch_size B` records them: the audit reads the attention and the batch
    # size from them (without them: transformers' default attention, no fixed batches, and a tolerance)
    lmeval_runs.lm_eval_run(lm, model_dir, out, tasks, batch_size=batch_size, model_args=(
        f"pretrained={model_dir},dtype=float32,attn_implementation=eager,max_length=512"))


def lmeval_requests(run, model_dir):
    """{task: {doc_id: (context length, [continuation ids])}} of the run's loglikelihood samples, tokenised as the
    audit tokenises them (rescore.encoder under the results' release rule)."""
    from evidence_audit import tokens
    from evidence_audit.lmeval import rescore
    top = json.loads(next(Path(run).rglob("results_*.json")).read_text(encoding="utf-8"))
    encode = rescore.encoder(tokens.load_tokenizer(Path(model_dir) / "tokenizer.json"), top["config"], top)
    out = {}
    for path in sorted(Path(run).rglob("samples_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            s = json.loads(line)
            task = path.name[len("samples_"):].rsplit("_", 1)[0]
            args = list(s["arguments"].values())
            if not args or "arg_1" not in args[0] or not isinstance(args[0]["arg_1"], str):
                out.setdefault(task, {})[s["doc_id"]] = None          # generate_until: no token count here
                continue
            pairs = [rescore.encode_pair(encode, a["arg_0"], a["arg_1"])[:2] for a in args]
            out.setdefault(task, {})[s["doc_id"]] = (len(pairs[0][0]), [c for _, c in pairs])
    return out


def lmeval_part(args, work, cache):
    """(b): the lm-eval run, then the audits."""
    model_dir = cache / "models" / MODEL_ID
    data = lmeval_data(cache, work, args.gen_docs)
    run = work / f"lmeval-run-b{args.batch_size}"
    part = {"audits": [], "data": {t: str(p) for t, p in data.items()}, "batch_size": args.batch_size}
    if run.exists() and any(run.rglob("results_*.json")):
        part["run"] = {"reused": str(run)}
    else:
        log = work / f"lmeval-run-b{args.batch_size}.log"
        part["run"] = timed([sys.executable, __file__, "--make-lmeval-run", run, "--cache", cache, "--work", work,
                             "--gen-docs", str(args.gen_docs), "--batch-size", str(args.batch_size),
                             "--threads", str(args.threads)], log)
        if part["run"]["exit"] != 0:
            raise SystemExit(f"the lm-eval run failed: see {log}")
    say(f"(b) lm-eval run {run}: {part['run']}")
    reqs = lmeval_requests(run, model_dir)
    from evidence_audit import sampling
    data_args = [a for t, p in data.items() for a in ("--data", f"{t}={p}")]
    for n in [*args.lmeval_n, None]:
        report = work / f"audit-lmeval-{n or 'full'}.json"
        cmd = [sys.executable, "audit.py", "--lm-eval", run, "--forward", "--model", model_dir, *data_args,
               "--threads", str(args.threads), "--report", report] + ([] if n is None else ["--sample", str(n)])
        row = timed(cmd, work / f"audit-lmeval-{n or 'full'}.log")
        rep = json.loads(report.read_text(encoding="utf-8"))
        strata, items, population, passes, toks, ll_seconds = {}, 0, 0, 0, 0, 0.0
        for task, docs in reqs.items():
            fwd = rep["details"].get(task, {}).get("forward") or {}
            keep = sorted(docs) if n is None else sampling.draw(rep["sample"]["seed"], task, sorted(docs), n)
            t = {"items": len(keep), "population": len(docs), "seconds": fwd.get("seconds", 0.0),
                 "mode": fwd.get("mode") or ("re-generated" if docs[keep[0]] is None else "")}
            if docs[keep[0]] is not None:
                p, k = pass_tokens([docs[d] for d in keep])
                t.update(passes=p, tokens=k, requests=fwd.get("requests"))
                passes, toks, ll_seconds = passes + p, toks + k, ll_seconds + t["seconds"]
            strata[task] = t
            items, population = items + len(keep), population + len(docs)
        row.update(n=n, result=rep.get("result"), items=items, population=population, passes=passes, tokens=toks,
                   forward_s=round(sum(t["seconds"] for t in strata.values()), 2),
                   loglikelihood_forward_s=round(ll_seconds, 2),
                   forward_s_per_token=per_token(ll_seconds, toks), seed=(rep.get("sample") or {}).get("seed"),
                   strata=strata)
        part["audits"].append(row)
        say(f"(b) --sample {n}: {json.dumps(row)}")
    return part


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=REPO / "cache", help="prepared cache (read only: copied by "
                                                                       "hardlinks into WORK/cache)")
    ap.add_argument("--work", type=Path, help="where the copies, runs, logs and reports go (default: a new temp dir)")
    ap.add_argument("--parts", nargs="+", default=["evidence", "lmeval"], choices=["evidence", "lmeval"])
    ap.add_argument("--evidence-n", type=int, nargs="*", default=[10, 50, 200])
    ap.add_argument("--lmeval-n", type=int, nargs="*", default=[5, 25, 100])
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the audits and the lm-eval run "
                                                           "(audit.py's default: 1)")
    ap.add_argument("--run-threads", type=int, default=2, help="run.py --threads for the 872-row evidence")
    ap.add_argument("--batch-size", type=int, default=16, help="the lm-eval run's HFLM batch size")
    ap.add_argument("--gen-docs", type=int, default=100, help="documents of the generate_until task")
    ap.add_argument("--table", type=Path, metavar="JSON", help="print the tables of a forward_sample.json and stop")
    ap.add_argument("--project", type=Path, metavar="JSON", help="print the 7B MMLU projection of a "
                                                                "forward_sample.json (docs/speed.md) and stop")
    ap.add_argument("--make-lmeval-run", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.project:
        sys.path.insert(0, str(REPO))
        print(projection_text(json.loads(args.project.read_text(encoding="utf-8"))))
        return
    if args.table:
        result = json.loads(args.table.read_text(encoding="utf-8"))
        print(table(result) + "\n\n" + task_table(result) + "\n\n" + derived_text(result))
        return
    work = (args.work or Path(tempfile.mkdtemp(prefix="measure-forward-sample-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    if args.make_lmeval_run:
        make_lmeval_run(args.make_lmeval_run, cache / "models" / MODEL_ID, lmeval_data(cache, work, args.gen_docs),
                        args.batch_size, args.threads)
        return
    copy_cache(args.cache.resolve(), cache)
    sys.path.insert(0, str(REPO))
    cfg = json.loads((cache / "models" / MODEL_ID / "config.json").read_text(encoding="utf-8"))
    path = work / "forward_sample.json"
    result = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}    # a part at a time: merged
    result.update(commit=git_head(), cpu=cpu_info(), work=str(work), model=MODEL_ID, matmul_weights=matmul_weights(cfg),
                  note="a shared machine: read the load average and the CPU seconds beside each wall time")
    say(f"machine: {result['cpu']}; load {os.getloadavg()}; work {work}")
    for name in args.parts:
        started, rates = time.strftime("%Y-%m-%d %H:%M:%S"), matmul_rates()
        say(f"matmul GFLOP/s before {name}: {rates}")
        part = (evidence_part if name == "evidence" else lmeval_part)(args, work, cache)
        part.update(started=started, threads=args.threads, matmul_gflops_before=rates,
                    matmul_gflops_after=matmul_rates())
        part["derived"] = derived(part, "tokens" if name == "evidence" else "items")
        result[name] = part
        atomic_json(path, result)
    say(f"\nwrote {path}\n\n{table(result)}\n\n{task_table(result)}\n\n{derived_text(result)}")


def git_head():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    main()
