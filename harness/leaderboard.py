"""leaderboard.json: what one adapter scored on one set of task files, and a diff between two of them.

Schema `harness-leaderboard/v1`:
    schema, adapter, overall (mean of task scores),
    tasks: {name: {metric, sha256 (of the task file bytes), score, correct, total, timeouts, latency_s,
                   latency_s_mean, n_examples_in_file}},
    settings: {batch_size, timeout_s, sandbox limits, ...},  sandbox_isolation (when code ran),
    per_example (only with --include-per-example): [{task, id, prompt_sha256, prediction, score, timed_out,
                   latency_s, details}]   (details of code_exec: code sha256 + the sandbox's outputs)
No timestamps: two runs of a deterministic adapter give files that differ only in latencies.
"""
import json
import os
import tempfile
from pathlib import Path

from harness import strict_json

SCHEMA = "harness-leaderboard/v1"


def build(adapter_name, tasks, per_task, examples, settings, include_per_example):
    for name, t in tasks.items():
        per_task[name]["n_examples_in_file"] = t.n_in_file
    board = {"schema": SCHEMA, "adapter": adapter_name, "tasks": per_task, "settings": settings,
             "overall": sum(t["score"] for t in per_task.values()) / len(per_task)}
    isolation = next((e["details"]["sandbox"]["isolation"] for e in examples
                      if e["details"].get("sandbox", {}).get("isolation")), None)
    if isolation:
        board["sandbox_isolation"] = isolation
    if include_per_example:
        board["per_example"] = examples
    return board


def dumps(board):
    return json.dumps(board, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write(path, board):
    """Atomically: the bytes are made first (a board that cannot be encoded, e.g. a lone surrogate in a
    prediction, raises ValueError before any file is touched), written to a temporary file in the same
    directory, fsync'ed, then renamed over `path`; the parent directory is created. An existing file at `path`
    is replaced whole or not at all, and the temporary file never outlives the call. (resources.py has the same
    few lines: the harness package imports nothing from the repository around it, so it keeps its own.)"""
    path = Path(path)
    try:
        data = dumps(board).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{path}: cannot write the leaderboard: {e.reason} in a string "
                         f"({e.object[max(0, e.start - 30):e.end]!r})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path):
    """A leaderboard read strictly (harness/strict_json): ValueError with one line naming the file and field."""
    board = strict_json.loads(strict_json.decode_utf8(Path(path).read_bytes(), str(path)), str(path))
    found = board.get("schema") if isinstance(board, dict) else type(board).__name__
    if found != SCHEMA:
        raise ValueError(f"{path}: expected schema {SCHEMA!r}, found {found!r}")
    return board


def task_differences(a, b):
    """Task names whose files differ between two leaderboards (hash differs, or present in one only)."""
    out = []
    for name in sorted(set(a["tasks"]) | set(b["tasks"])):
        ha, hb = a["tasks"].get(name, {}).get("sha256"), b["tasks"].get(name, {}).get("sha256")
        if ha != hb:
            out.append(f"{name} (A {ha[:12] if ha else 'absent'}, B {hb[:12] if hb else 'absent'})")
    return out


def _short(text, n=60):
    return "None" if text is None else repr(text if len(text) <= n else text[:n] + "...")


def diff(a, b, allow_different_tasks=False):
    """(exit code, report lines). Exit 2 (with a one-line reason) when the task files differ and that is not
    allowed; otherwise 0 whether or not anything moved."""
    differ = task_differences(a, b)
    if differ and not allow_different_tasks:
        return 2, [f"error: refusing to compare: task files differ: {'; '.join(differ)}; "
                   "rerun both on the same tasks or pass --allow-different-tasks"]
    lines = [f"A: {a['adapter']}    B: {b['adapter']}"]
    if differ:
        lines.append(f"WARNING: task files differ: {'; '.join(differ)}")
    lines.append(f"{'task':<20} {'A':>8} {'B':>8} {'B - A':>9}")
    moved = 0
    for name in sorted(set(a["tasks"]) | set(b["tasks"])):
        sa, sb = a["tasks"].get(name, {}).get("score"), b["tasks"].get(name, {}).get("score")
        if sa is None or sb is None:
            lines.append(f"{name:<20} {'-' if sa is None else f'{sa:.4f}':>8} {'-' if sb is None else f'{sb:.4f}':>8}")
            continue
        moved += sa != sb
        delta = f"{sb - sa:+.4f}" if sa != sb else "same"
        lines.append(f"{name:<20} {sa:>8.4f} {sb:>8.4f} {delta:>9}")
    oa, ob = a["overall"], b["overall"]
    lines.append(f"{'overall':<20} {oa:>8.4f} {ob:>8.4f} {f'{ob - oa:+.4f}' if oa != ob else 'same':>9}")
    lines.append(f"{moved} task(s) moved")
    if "per_example" not in a or "per_example" not in b:
        lines.append("examples: not compared (run both with --include-per-example)")
        return 0, lines
    ea = {(e["task"], e["id"]): e for e in a["per_example"]}
    eb = {(e["task"], e["id"]): e for e in b["per_example"]}
    changed = []
    for key in sorted(set(ea) | set(eb)):
        x, y = ea.get(key), eb.get(key)
        if x is None or y is None:
            changed.append(f"  {key[0]}/{key[1]}: only in {'B' if x is None else 'A'}")
        elif (x["prediction"], x["score"], x["timed_out"]) != (y["prediction"], y["score"], y["timed_out"]):
            changed.append(f"  {key[0]}/{key[1]}: score {x['score']:.4g} -> {y['score']:.4g}; "
                           f"prediction {_short(x['prediction'])} -> {_short(y['prediction'])}")
    lines.append(f"{len(changed)} example(s) changed" + (":" if changed else ""))
    return 0, lines + changed
