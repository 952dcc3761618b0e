"""Re-score loglikelihood requests in a child process whose kernels are held to another instruction set.

MKL, ATen and oneDNN choose their kernels when torch loads, from the CPU and from environment variables
(kernels.AVX2_ONLY), so a run made on an AVX2-only CPU of this machine's kind is re-scored in a fresh interpreter
started with those variables: `python -m evidence_audit.lmeval.child` reads one JSON job on stdin (the model
directory, dtype, attention, thread count, batch size, max_length, grouping, softmax dtype and the token ids) and
writes the scores as one JSON line. The parent bounds what it reads back. Nothing here decides a verdict.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from evidence_audit.forward import load_scorer
from evidence_audit.hflm import score_with_margins

MAX_OUTPUT = 256 * 2 ** 20       # bytes of the child's answer read back
REPO = Path(__file__).resolve().parents[2]


def score_in_child(job, env, timeout=3600):
    """([(score, is_greedy, greedy margin)] per request, None) scored by a child under `env`, or (None, why not)."""
    proc = subprocess.run([sys.executable, "-m", "evidence_audit.lmeval.child"], input=json.dumps(job), text=True,
                          capture_output=True, env={**os.environ, **env}, cwd=REPO, timeout=timeout)
    out = proc.stdout[-MAX_OUTPUT:]
    if proc.returncode != 0 or not out.strip():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        held = ", ".join(f"{k}={v}" for k, v in env.items())
        return None, f"the re-scoring child process (held to {held}) failed: {last}"
    try:
        got = json.loads(out.strip().splitlines()[-1])
        rows = [(float(s), bool(g), float(m)) for s, g, m in got["scores"]]
    except (ValueError, KeyError, TypeError):
        return None, "the re-scoring child process wrote no readable scores"
    if len(rows) != len(job["requests"]):
        return None, f"the re-scoring child process scored {len(rows)} of {len(job['requests'])} requests"
    return rows, None


def main():
    import torch

    job = json.loads(sys.stdin.read())
    torch.set_num_threads(job["threads"])
    scorer, why = load_scorer(job["model_dir"], job["dtype"], job["attention"])
    if scorer is None:
        raise SystemExit(why)
    sdt = getattr(torch, job["softmax_dtype"]) if job["softmax_dtype"] else None
    got = score_with_margins(scorer.logits, [tuple(map(list, r)) for r in job["requests"]], job["batch_size"],
                             job["max_length"], job["group"], sdt, "cpu")
    print(json.dumps({"label": scorer.label, "capability": torch.backends.cpu.get_cpu_capability(),
                      "scores": [list(row) for row in got]}))


if __name__ == "__main__":
    main()
