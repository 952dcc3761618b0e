"""The runner: prompts go to the adapter in batches of `batch_size`; each reply is scored by its task's metric.

Timeouts. A batch of n prompts gets n * timeout_s seconds of wall clock; if the adapter has not answered by
then, every example of the batch counts as a timeout (prediction None, score 0, counted in `timeouts`). With
batch_size 1 that is exactly a per-example timeout. A Python thread cannot be stopped from outside: if the
adapter has a `cancel()` method the runner calls it and waits (up to CANCEL_GRACE_S) for the call to return;
otherwise the call is left running in a daemon thread and its late answer is discarded. Wall-clock timeouts
depend on the machine's load: the same model can time out on a busy machine and not on an idle one, which is
why `timeouts` is reported next to every score. Code execution has its own limits (sandbox.py).

Latency is wall time per batch, divided evenly among its examples. Task score = mean of example scores in file
order; `correct` = examples with full credit (score == 1.0); overall = mean of task scores, tasks by name.
"""
import hashlib
import threading
import time
from dataclasses import asdict, dataclass, field

from harness import metrics

CANCEL_GRACE_S = 60.0


@dataclass
class ExampleResult:
    task: str
    id: str
    prompt_sha256: str
    prediction: str
    score: float
    timed_out: bool
    latency_s: float
    details: dict = field(default_factory=dict)


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def generate_with_timeout(adapter, prompts, budget_s):
    """(replies or None, wall seconds). None means the adapter did not answer within budget_s."""
    box = {}

    def call():
        try:
            box["replies"] = adapter.generate(list(prompts))
        except BaseException as e:  # noqa: BLE001  re-raised in the caller's thread
            box["error"] = e

    t0 = time.perf_counter()
    worker = threading.Thread(target=call, name=f"adapter-{adapter.name}", daemon=True)
    worker.start()
    worker.join(budget_s)
    wall = time.perf_counter() - t0
    if worker.is_alive():
        if hasattr(adapter, "cancel"):
            adapter.cancel()
            worker.join(CANCEL_GRACE_S)
        return None, wall
    if "error" in box:
        raise box["error"]
    replies = box["replies"]
    if len(replies) != len(prompts) or not all(isinstance(r, str) for r in replies):
        raise TypeError(f"adapter {adapter.name} returned {len(replies)} replies for {len(prompts)} prompts "
                        "(expected one string per prompt)")
    return replies, wall


def run_task(adapter, task, batch_size=4, timeout_s=60.0, sandbox_limits=None, progress=None):
    results = []
    for start in range(0, len(task.examples), batch_size):
        batch = task.examples[start:start + batch_size]
        replies, wall = generate_with_timeout(adapter, [e.prompt for e in batch], timeout_s * len(batch))
        for i, ex in enumerate(batch):
            if replies is None:
                score, details, reply = 0.0, {}, None
            else:
                reply = replies[i]
                score, details = metrics.score(ex.metric, reply, ex.targets, ex.extras, sandbox_limits)
            results.append(ExampleResult(task.name, ex.id, sha256_text(ex.prompt), reply, score, replies is None,
                                         round(wall / len(batch), 4), details))
        if progress is not None:
            progress.update(len(batch))
    return results


def summarise_task(task, results):
    scores = [r.score for r in results]
    latency = sum(r.latency_s for r in results)
    return {"metric": task.metric, "sha256": task.sha256, "score": sum(scores) / len(scores),
            "correct": sum(s == 1.0 for s in scores), "total": len(scores),
            "timeouts": sum(r.timed_out for r in results),
            "latency_s": round(latency, 4), "latency_s_mean": round(latency / len(results), 4)}


def run_leaderboard(adapter, tasks, batch_size=4, timeout_s=60.0, sandbox_limits=None, progress=None):
    """Every task (by name) -> (per-task summary dict, list of ExampleResult)."""
    per_task, examples = {}, []
    for name in sorted(tasks):
        results = run_task(adapter, tasks[name], batch_size, timeout_s, sandbox_limits, progress)
        per_task[name] = summarise_task(tasks[name], results)
        examples += results
    return per_task, [asdict(r) for r in examples]
