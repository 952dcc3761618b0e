"""The harness experiment's rule: per-example scores, task and overall figures of the mini harness.

One record per example (task, id, prompt/prediction sha256, score, timeout, latency; code_exec adds the code sha256
and the sandbox's observed outputs). The metrics are written out again here (harness/ is not imported):
  exact_match         lowercase, collapse whitespace, equal;   substring_contains  same, target in prediction
  multiple_choice     first non-space character of the prediction, uppercased, == target
  rouge_l             rouge-score's ROUGE-L F-measure, no stemming: tokens are the lowercased text with every
                      character outside [a-z0-9] turned into a space, split on whitespace; F = 2PR / (P + R) of the
                      longest common subsequence's precision and recall (0.0 when either side has no token)
  code_exec           fraction of io pairs [x, y] whose recorded sandbox output == canonical JSON of y
                      (json.dumps(y, sort_keys=True)). The outputs themselves are TRUSTED: the audit does not re-run
                      untrusted code; it re-derives the code from the prediction (first ``` block, else all), checks
                      its sha256, and recomputes the matches and the score from the outputs.
  example score       the best over targets (code_exec: over io pairs as above); a timed-out example scores 0
  task                score = mean of example scores in file order, correct = #(score == 1.0), total,
                      timeouts = #timed out, latency_s = round(sum of example latencies, 4), mean likewise
  overall             mean of task scores, tasks sorted by name
Levels: arithmetic (the shared groups, then aggregation, selection, code_exec matched/total from the public
records), identity (--tokens: the private task files and leaderboard: file sha256, prompt and prediction hashes,
every example score recomputed from prediction + targets; the chat template behind prompt_template_sha256).
Generations are not re-run (no forward level).
"""
import json
import re
from pathlib import Path

from evidence_audit.checks import MISSING, compare_tree, expect, get, short
from evidence_audit.definitions import is_int, is_num, is_sha
from evidence_audit.reading import Unreadable, load_evidence, read_json, sha256_file, sha256_text
from evidence_audit.shared import (RecordShape, deeper_levels, environment_check, identity_problems, model_problems,
                                   record_shape_check, required_files, restated_problems, split_problems,
                                   stages_check)
from evidence_audit.tokens import chat_template

A, L = "arithmetic", "identity"
H_SCHEMA = "harness-leaderboard/v1"
H_METRICS = ("exact_match", "substring_contains", "multiple_choice", "rouge_l", "code_exec")
SHAPE = RecordShape(
    fields={"task": lambda v: isinstance(v, str), "id": lambda v: isinstance(v, str), "prompt_sha256": is_sha,
            "prediction_sha256": lambda v: v is None or is_sha(v), "score": is_num,
            "timed_out": lambda v: isinstance(v, bool), "latency_s": is_num},
    optional={"code_sha256": is_sha, "sandbox": lambda v: isinstance(v, dict)})    # code_exec examples only
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "harness_tasks"
NO_TIMING_RULE = "stages.json (stage times; token counts declared, not recomputed)"


# ---- the metrics ---------------------------------------------------------------------------------------------------

def h_norm(text):
    return " ".join(text.lower().split())


def h_lcs(a, b):
    """Length of the longest common subsequence of two token lists."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def h_rouge_tokens(text):
    """rouge-score's tokenizer without a stemmer: lowercase, non-[a-z0-9] -> space, split on whitespace."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def h_rouge_l(pred, ref):
    """rouge-score's ROUGE-L F-measure (beta 1) of a prediction against one reference."""
    p, r = h_rouge_tokens(pred), h_rouge_tokens(ref)
    lcs = h_lcs(p, r) if p and r else 0
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def h_code_of(prediction):
    """The first ``` fenced block (an unclosed one runs to the end), else the whole prediction."""
    m = re.search(r"```[^\n`]*\n(.*?)(?:```|\Z)", prediction, re.S)
    return m.group(1) if m else prediction


def h_matches(outputs, io_pairs):
    return [isinstance(o, str) and o == json.dumps(y, sort_keys=True) for o, (_, y) in zip(outputs, io_pairs)]


def h_score(metric, prediction, targets):
    """The example score of a text metric: the best over the targets."""
    if metric == "exact_match":
        return max(float(h_norm(prediction) == h_norm(t)) for t in targets)
    if metric == "substring_contains":
        return max(float(h_norm(t) in h_norm(prediction)) for t in targets)
    if metric == "multiple_choice":
        p = prediction.strip()
        return max(float(bool(p) and p[0].upper() == t.strip().upper()) for t in targets)
    if metric == "rouge_l":
        return max(h_rouge_l(prediction, t) for t in targets)
    raise ValueError(metric)


def h_task_examples(text):
    """(line number, example dict) for each example line of a task file: blank and # lines skipped."""
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            out.append((n, json.loads(line)))
    return out


def h_aggregate(records, names):
    """Task figures (tasks by name) and the overall score, from example scores."""
    tasks = {}
    for name in names:
        rs = [r for r in records if r.get("task") == name]
        if not rs:
            continue
        scores = [r["score"] for r in rs]
        latency = sum(r["latency_s"] for r in rs)
        tasks[name] = {"score": sum(scores) / len(scores), "correct": sum(s == 1.0 for s in scores),
                       "total": len(rs), "timeouts": sum(r["timed_out"] is True for r in rs),
                       "latency_s": round(latency, 4), "latency_s_mean": round(latency / len(rs), 4)}
    overall = sum(t["score"] for t in tasks.values()) / len(tasks) if tasks else None
    return tasks, overall


# ---- the rule ------------------------------------------------------------------------------------------------------

def audit_harness(C, name, out, levels, cache):
    ev = load_evidence(out, name)
    tasks_cfg = audit_harness_arithmetic(C, name, ev)
    info = deeper_levels(C, name, ev, levels, cache,
                         identity=lambda model_dir, _parquet: audit_harness_identity(C, name, out, ev, tasks_cfg,
                                                                                    model_dir),
                         no_forward="generations are not re-run by audit.py (no rule for this level)")
    return {"tasks": sorted(tasks_cfg or {}), **info}


def audit_harness_arithmetic(C, name, ev):
    """Level 1. Returns config.json's tasks block when the records could be checked, else None."""
    if not required_files(C, name, ev):
        C.skip(name, A, "(rest of the level)", "config.json or records.jsonl missing; nothing to recompute from")
        return None
    cfg, records, summary = ev["config"], ev["records"], ev["summary"]
    config_check(C, name, ev)
    environment_check(C, name, ev)
    where = lambda i, r: f"record {i} ({r.get('task')}/{r.get('id')})"      # noqa: E731
    in_range = lambda r, w: [f"{w} score: recorded {r['score']} outside [0, 1]"] \
        if is_num(r.get("score")) and not 0.0 <= r["score"] <= 1.0 else []       # noqa: E731
    shape_ok = record_shape_check(C, name, records, SHAPE, where, check="record schema", extra=in_range)
    stages_check(C, name, ev, None, len(records), check=NO_TIMING_RULE)
    if not shape_ok or summary is None:
        C.skip(name, A, "(rest of the level)", "records.jsonl malformed (see 'record schema') or summary.json "
                                               "missing (see 'required files')")
        return None
    tasks_cfg = cfg.get("tasks") if isinstance(cfg.get("tasks"), dict) else {}
    selection_check(C, name, cfg, records, summary, tasks_cfg)
    example_scores_check(C, name, records, tasks_cfg)
    leaderboard_check(C, name, cfg, records, summary, tasks_cfg)
    fixtures_check(C, name, summary, tasks_cfg)
    return tasks_cfg


def config_check(C, name, ev):
    """Row "config consistency (...)": the experiment, split and model in config.json, the restated split and
    threads, and identity.json (its data hash names the run's --data, which the harness does not score, and its
    prompt template hash needs the chat template: checked at the identity level)."""
    cfg, bad = ev["config"], []
    split = split_problems(bad, name, cfg)
    model_problems(bad, cfg)
    restated_problems(bad, ev, split)
    if ev["identity"] is not None:
        identity_problems(bad, name, cfg, ev["identity"], declared=("data_content_sha256",))
    C.add(name, A, "config consistency (experiment, split, model, threads, identity.json)", 1, bad)


def selection_check(C, name, cfg, records, summary, tasks_cfg):
    """Row "example selection": the records are exactly the first n examples of each task (smoke) or all of them,
    tasks by name."""
    bad, split = [], cfg.get("split")
    n_smoke = get(cfg, "config.harness_smoke_examples")
    expected_keys = []
    for tname in sorted(tasks_cfg):
        t = tasks_cfg[tname]
        want = min(n_smoke, t.get("n_in_file", -1)) if split == "smoke" else t.get("n_in_file")
        expect(bad, f"task {tname}", "n_scored", t.get("n_scored"), want, f"split {split}")
        expect(bad, f"task {tname}", "metric", t.get("metric") in H_METRICS, True)
        expected_keys += [(tname, i) for i in (t.get("ids") or [])]
    expect(bad, "records", "(task, id) in order", [(r.get("task"), r.get("id")) for r in records], expected_keys,
           "config.json tasks.*.ids, tasks sorted by name")
    expect(bad, "summary.json", "split", summary.get("split"), split)
    expect(bad, "summary.json", "n_examples", summary.get("n_examples"), len(records))
    C.add(name, A, "example selection", len(records), bad)


def example_scores_check(C, name, records, tasks_cfg):
    """Row "example scores (...)": code_exec score = matched / total from the recorded outputs; 0/1 metrics score 0
    or 1; a timed-out example scores 0 with no prediction."""
    bad = []
    for r in records:
        metric = tasks_cfg.get(r.get("task"), {}).get("metric")
        where = f"{r.get('task')}/{r.get('id')}"
        if r.get("timed_out") is True:
            expect(bad, where, "score (timed out)", r.get("score"), 0.0)
            expect(bad, where, "prediction_sha256 (timed out)", r.get("prediction_sha256"), None)
        elif metric == "code_exec":
            sb = r.get("sandbox")
            if not isinstance(sb, dict) or not is_int(sb.get("total")) or not isinstance(sb.get("outputs"), list):
                bad.append(f"{where} sandbox: recorded {short(sb)} is missing or malformed")
                continue
            expect(bad, where, "sandbox.outputs length", len(sb["outputs"]), sb["total"])
            expect(bad, where, "score", r.get("score"), sb.get("matched", -1) / sb["total"] if sb["total"] else None,
                   "matched / total")
        elif metric in ("exact_match", "substring_contains", "multiple_choice") and r.get("score") not in (0.0, 1.0):
            bad.append(f"{where} score: recorded {r.get('score')} but {metric} scores only 0 or 1")
    C.add(name, A, "example scores (code_exec from sandbox counts, 0/1 metrics)", len(records), bad)


def leaderboard_check(C, name, cfg, records, summary, tasks_cfg):
    """Row "task and overall scores": the task and overall figures and the leaderboard in summary.json."""
    bad, names = [], sorted(tasks_cfg)
    tasks, overall = h_aggregate(records, names)
    board = summary.get("leaderboard") if isinstance(summary.get("leaderboard"), dict) else {}
    expect(bad, "summary.json", "leaderboard.schema", board.get("schema"), H_SCHEMA)
    for tname in names:
        expected = dict(tasks.get(tname, {}), metric=tasks_cfg[tname].get("metric"),
                        sha256=tasks_cfg[tname].get("sha256"), n_examples_in_file=tasks_cfg[tname].get("n_in_file"))
        compare_tree(bad, f"summary.json leaderboard task {tname}", get(board, f"tasks.{tname}"), expected)
    for extra in sorted(set(board.get("tasks", {})) - set(names)):
        bad.append(f"summary.json leaderboard task {extra}: not in config.json tasks")
    expect(bad, "summary.json", "leaderboard.overall", board.get("overall"), overall, "mean of task scores by name")
    expect(bad, "summary.json", "leaderboard.settings", board.get("settings"), cfg.get("settings"))
    C.add(name, A, "task and overall scores", len(names), bad,
          note="sandbox_isolation and latencies are declared measurements, not recomputed")


def fixtures_check(C, name, summary, tasks_cfg):
    """Row "task files vs shipped fixtures": summary.json's claim that a task file is the shipped fixture."""
    bad = []
    claimed = summary.get("tasks_are_shipped_fixtures") or {}
    for tname in sorted(tasks_cfg):
        p = FIXTURES / f"{tname}.jsonl"
        is_fixture = p.exists() and sha256_file(p) == tasks_cfg[tname].get("sha256")
        expect(bad, f"summary.json tasks_are_shipped_fixtures.{tname}", "", claimed.get(tname), is_fixture)
    C.add(name, A, "task files vs shipped fixtures", len(tasks_cfg), bad)


# ---- level 2, identity ---------------------------------------------------------------------------------------------

def audit_harness_identity(C, name, out, ev, tasks_cfg, model_dir):
    """Level 2: the private task files and leaderboard, and the chat template behind prompt_template_sha256."""
    prompt_template_check(C, name, ev, model_dir)
    priv = out / "private" / name
    board_path, tasks_path = priv / "leaderboard.json", priv / "tasks"
    if tasks_cfg is None or not board_path.exists() or not tasks_path.is_dir():
        why = "the arithmetic level found the evidence unusable" if tasks_cfg is None else \
            f"private/{name}/leaderboard.json or tasks/ absent"
        for check in ("private task files", "example scores from predictions"):
            C.skip(name, L, check, why)
        return
    examples = task_files_check(C, name, tasks_path, ev["records"], tasks_cfg)
    board = read_json(board_path)
    per_example = board.get("per_example") if isinstance(board, dict) else None
    if not isinstance(per_example, list):
        C.add(name, L, "example scores from predictions", 0, [f"private/{name}/leaderboard.json: no per_example list"])
        return
    rescore_check(C, name, ev["records"], examples, board, per_example, tasks_cfg)


def prompt_template_check(C, name, ev, model_dir):
    """Row "prompt template (...)": identity.json's prompt_template_sha256 and config.json's chat_template_sha256
    recomputed from the cached model's chat template and config.json's prompt rule."""
    check = "prompt template (chat template + prompt rule == prompt_template_sha256)"
    template, cfg, ident = chat_template(model_dir), ev["config"], ev["identity"]
    if template is None or cfg is None or ident is None:
        C.skip(name, L, check, f"no chat template in {model_dir} (pass --cache with the prepared cache), or "
                               "config.json / identity.json missing")
        return
    bad = []
    expect(bad, "config.json", "chat_template_sha256", cfg.get("chat_template_sha256", MISSING),
           sha256_text(template), f"the chat template in {model_dir}")
    spec = {"chat_template": template, "prompt_rule": cfg.get("prompt_rule", MISSING)}
    expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
           sha256_text(json.dumps(spec, sort_keys=True)), "sha256 of the chat template and config.json prompt_rule")
    C.add(name, L, check, 1, bad)


def task_files_check(C, name, tasks_path, records, tasks_cfg):
    """Row "private task files": the bytes hash to config.json's sha256, prompts hash to the records'
    prompt_sha256. Returns the examples by (task, id)."""
    bad, examples = [], {}
    for tname, t in tasks_cfg.items():
        p = tasks_path / f"{tname}.jsonl"
        if not p.exists():
            bad.append(f"private/{name}/tasks/{tname}.jsonl: missing")
            continue
        expect(bad, f"private/{name}/tasks/{tname}.jsonl", "sha256", sha256_file(p), t.get("sha256"))
        try:
            for _, ex in h_task_examples(p.read_text(encoding="utf-8")):
                examples[(tname, ex.get("id"))] = ex
        except (ValueError, AttributeError) as e:
            raise Unreadable(f"{p}: not a task file ({e})")
    for r in records:
        ex = examples.get((r.get("task"), r.get("id")))
        where = f"{r.get('task')}/{r.get('id')}"
        if ex is None:
            bad.append(f"{where}: no such example in the private task file")
            continue
        expect(bad, where, "prompt_sha256", r.get("prompt_sha256"), sha256_text(ex.get("prompt", "")))
        expect(bad, where, "metric", ex.get("metric"), tasks_cfg[r["task"]].get("metric"))
    C.add(name, L, "private task files", len(records), bad)
    return examples


def code_exec_score(bad, where, r, e, ex, pred):
    """A code_exec example's score from the recorded sandbox outputs (the code is not re-run)."""
    expect(bad, where, "code_sha256", r.get("code_sha256"), sha256_text(h_code_of(pred)),
           "first ``` block of the prediction")
    outputs = get(e, "details.sandbox.outputs")
    expect(bad, where, "sandbox.outputs (private vs public)", outputs, get(r, "sandbox.outputs"))
    pairs = get(ex, "extras.io_pairs")
    m = h_matches(outputs if isinstance(outputs, list) else [], pairs if isinstance(pairs, list) else [])
    expect(bad, where, "sandbox.matched", get(r, "sandbox.matched"), sum(m), "outputs vs io pairs")
    expect(bad, where, "sandbox.total", get(r, "sandbox.total"), len(pairs) if isinstance(pairs, list) else None)
    return sum(m) / len(pairs) if isinstance(pairs, list) and pairs else None


def rescore_check(C, name, records, examples, board, per_example, tasks_cfg):
    """Row "example scores from predictions": every example score from its private prediction and targets, and
    the private leaderboard's task and overall figures from those."""
    bad, recomputed = [], []
    by_key = {(e.get("task"), e.get("id")): e for e in per_example if isinstance(e, dict)}
    expect(bad, f"private/{name}/leaderboard.json", "per_example count", len(per_example), len(records))
    for r in records:
        key, where = (r.get("task"), r.get("id")), f"{r.get('task')}/{r.get('id')}"
        e, ex = by_key.get(key), examples.get(key)
        if e is None or ex is None:
            bad.append(f"{where}: missing from the private leaderboard or task file")
            continue
        pred = e.get("prediction")
        expect(bad, where, "prediction_sha256", r.get("prediction_sha256"), None if pred is None else sha256_text(pred))
        if ex.get("metric") not in H_METRICS:
            bad.append(f"{where} metric: {ex.get('metric')!r} is not a metric audit.py knows")
            continue
        if pred is None:
            score = 0.0
        elif ex["metric"] == "code_exec":
            score = code_exec_score(bad, where, r, e, ex, pred)
        else:
            score = h_score(ex["metric"], pred, ex.get("targets") or [""])
        expect(bad, where, "score", r.get("score"), score, ex["metric"])
        expect(bad, where, "score (private leaderboard)", e.get("score"), score, ex["metric"])
        recomputed.append(dict(r, score=score if score is not None else r.get("score")))
    tasks, overall = h_aggregate(recomputed, sorted(tasks_cfg))
    for tname, t in tasks.items():
        for k in ("score", "correct"):
            expect(bad, f"private leaderboard task {tname}", k, get(board, f"tasks.{tname}.{k}"), t[k],
                   "from recomputed example scores")
    expect(bad, "private leaderboard", "overall", board.get("overall"), overall, "from recomputed example scores")
    C.add(name, L, "example scores from predictions", len(records), bad,
          note="code_exec trusts the recorded sandbox outputs (untrusted code is not re-run)")
