"""Tamper kinds for the two generation experiments: extraction (greedy generations scored three ways) and harness
(task files, predictions, sandbox outputs, the leaderboard). The harness forgeries are consistent: every figure the
arithmetic level recomputes is recomputed by the forger too, so only the private evidence (identity level) or the
model itself (forward level) can tell."""
import json

from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY
from evidence_audit.mutations.tools import (NotApplicable, edit_json, edit_jsonl, edit_text, first_where, kind,
                                            need, private_rows, records)
from evidence_audit.reading import local_paths, read_json, read_jsonl, resolve_cache, sha256_file, sha256_text
from evidence_audit.rules.harness import h_aggregate, h_norm


# ---- extraction ----------------------------------------------------------------------------------------------------

def m_exact_flip(recs):
    recs[0]["exact"]["correct"] = 1 - recs[0]["exact"]["correct"]


def m_swap_audit_positions(recs):
    recs[0]["audit_position"], recs[1]["audit_position"] = recs[1]["audit_position"], recs[0]["audit_position"]


def m_generation_text(rows):
    rows[0]["generation"] += " "


def m_generated_id(d):
    """One generated token id changed in the private generations, and the record's generated_ids_sha256 rewritten
    to match: the public fields stay consistent, the ids no longer decode to the recorded text."""
    def gen(rows):
        ids = rows[0]["generated_ids"]
        ids[0] = ids[0] + 1
        new_sha = sha256_text(json.dumps(ids))

        def rec(recs):
            first_where(recs, lambda r: r["idx"] == rows[0]["idx"], "record of generation 0")["generated_ids_sha256"] \
                = new_sha
        edit_jsonl(d, "extraction/records.jsonl", rec)
    edit_jsonl(d, "private/extraction/generations.jsonl", gen)


def split_token(tok, ids):
    """(position, [a, b]) for the first generated id whose token string is the concatenation of two other tokens
    and whose ids, so replaced, decode to the same text; else NotApplicable."""
    text = tok.decode(ids, skip_special_tokens=True)
    for i, t in enumerate(ids):
        s = tok.id_to_token(t) or ""
        for cut in range(1, len(s)):
            a, b = tok.token_to_id(s[:cut]), tok.token_to_id(s[cut:])
            if a is not None and b is not None and \
                    tok.decode(ids[:i] + [a, b] + ids[i + 1:], skip_special_tokens=True) == text:
                return i, [a, b]
    raise NotApplicable("no generated token splits into two tokens with the same text")


def tokenizer_of(d, exp):
    """The tokenizer at the model dir the experiment's config.json records, found as the audit finds it without
    --cache (format 3: through O/private/<exp>/paths.json); NotApplicable without one."""
    model_dir, _ = resolve_cache(read_json(d / exp / "config.json"), None, None, local_paths(d, exp))
    if model_dir is None or not (model_dir / "tokenizer.json").exists():
        raise NotApplicable(f"no tokenizer.json at the model dir {exp}/config.json records")
    from evidence_audit.tokens import load_tokenizer
    return load_tokenizer(model_dir / "tokenizer.json")


def resplit(d, exp, usable=lambda g: True):
    """Split one generated token of the first usable private generation of `exp` (split_token); returns it."""
    tok = tokenizer_of(d, exp)
    gens = read_jsonl(need(d / "private" / exp / "generations.jsonl"))
    g = first_where(gens, usable, "usable private generation")
    i, pair = split_token(tok, g["generated_ids"])
    g["generated_ids"][i:i + 1] = pair
    edit_jsonl(d, f"private/{exp}/generations.jsonl", lambda rows: gens)
    return g


def m_token_resplit(d):
    """One generated token replaced by two tokens that decode to the same text (the generation, every score and
    every hash of the text unchanged); the token counts and generated_ids_sha256 rewritten to match. Greedy
    decoding would never have produced the split: only the model's own argmax (forward level) can tell."""
    g = resplit(d, "extraction")
    recs = read_jsonl(d / "extraction" / "records.jsonl")
    r = first_where(recs, lambda r: r["idx"] == g["idx"], "record of generation 0")
    r["generated_tokens"] += 1
    r["generated_ids_sha256"] = sha256_text(json.dumps(g["generated_ids"]))
    edit_jsonl(d, "extraction/records.jsonl", lambda rows: recs)
    counts = [x["generated_tokens"] for x in recs]
    edit_json(d, "extraction/stages.json", lambda s: s["tokens"]["generated_tokens"].update(
        total=sum(counts), max=max(counts), min=min(counts)))


def extraction_kinds():
    X, rec = "extraction", lambda fn, n=1: records("extraction", fn, n)   # noqa: E731
    return [
        kind("extraction_exact_flip", X, "record 0: exact.correct -> 1 - correct", rec(m_exact_flip),
             ARITHMETIC, "scores recomputed from the private generations"),
        kind("extraction_audit_sample", X, "records 0 and 1 exchange their audit_position (the pre-registered "
             "sample)", rec(m_swap_audit_positions, 2), ARITHMETIC, "audit sample"),
        kind("extraction_summary_n_items", X, "summary.json: n_items += 1",
             lambda d: edit_json(d, "extraction/summary.json", lambda o: o.update(n_items=o["n_items"] + 1)),
             ARITHMETIC, "summary.json"),
        kind("extraction_generation_text", X, "private generations, line 1: the generated text gains a space",
             private_rows(X, "generations.jsonl", m_generation_text), ARITHMETIC,
             "scores recomputed from the private generations"),
        kind("extraction_generated_id", X, "private generations, line 1: generated_ids[0] += 1, record's "
             "generated_ids_sha256 rewritten to match", m_generated_id, IDENTITY, "tokenisation"),
        kind("extraction_token_resplit", X, "one generated token replaced by two that decode to the same text; "
             "token counts and generated_ids_sha256 rewritten (text, scores, hashes unchanged)", m_token_resplit,
             FORWARD, "greedy tokens"),
    ]


# ---- harness -------------------------------------------------------------------------------------------------------

def harness_rescore(d, task, new_score, prediction=None):
    """Set the score of the first scored example of `task` (and its prediction) everywhere it is written, and
    recompute every aggregate the audit recomputes: records.jsonl, summary.json's leaderboard, the private
    leaderboard. Returns that example's record."""
    names = sorted(read_json(d / "harness" / "config.json")["tasks"])
    recs = read_jsonl(d / "harness" / "records.jsonl")
    r = first_where(recs, lambda x: x.get("task") == task and not x.get("timed_out"), f"scored {task} example")
    r["score"] = new_score
    if prediction is not None:
        r["prediction_sha256"] = sha256_text(prediction)
    edit_jsonl(d, "harness/records.jsonl", lambda rows: recs)
    tasks, overall = h_aggregate(recs, names)

    def board_update(board, keys):
        for t, fig in tasks.items():
            board["tasks"][t].update({k: fig[k] for k in keys})
        board["overall"] = overall
    edit_json(d, "harness/summary.json", lambda s: board_update(s["leaderboard"], tasks[task].keys()))

    def private(board):
        board_update(board, ("score", "correct"))
        e = first_where(board["per_example"], lambda e: (e.get("task"), e.get("id")) == (task, r["id"]),
                        "private per-example entry")
        e["score"] = new_score
        if prediction is not None:
            e["prediction"] = prediction
    edit_json(d, "private/harness/leaderboard.json", private)
    return r


def task_example(d, task, ex_id):
    """(path, lines, line number, example) of one example in the private task file."""
    p = d / "private" / "harness" / "tasks" / f"{task}.jsonl"
    if not p.exists():
        raise NotApplicable(f"private/harness/tasks/{task}.jsonl absent")
    lines = p.read_text(encoding="utf-8").split("\n")
    for n, line in enumerate(lines):
        if line.strip().startswith("{") and json.loads(line).get("id") == ex_id:
            return p, lines, n, json.loads(line)
    raise NotApplicable(f"{task}/{ex_id} not in the private task file")


def m_prediction_replaced(d):
    """The model's wrong exact-match answer replaced by the target; the score, its hash and every aggregate
    recomputed to match. The generated token ids (if recorded) still decode to the model's own answer."""
    r = first_where(read_jsonl(d / "harness" / "records.jsonl"),
                    lambda x: x.get("task") == "arithmetic" and x.get("score") == 0.0, "wrong arithmetic answer")
    _, _, _, ex = task_example(d, "arithmetic", r["id"])
    return harness_rescore(d, "arithmetic", 1.0, prediction=ex["targets"][0])


def m_prediction_and_ids_replaced(d):
    """As m_prediction_replaced, and the private generation's ids re-tokenised from the new prediction (eos kept
    last): every public and private figure, hash and decoding agrees; only the model's own greedy argmax (forward
    level) can tell the model never produced these ids."""
    tok = tokenizer_of(d, "harness")
    gens = read_jsonl(need(d / "private" / "harness" / "generations.jsonl"))
    r = m_prediction_replaced(d)
    g = first_where(gens, lambda g: (g["task"], g["id"]) == ("arithmetic", r["id"]) and g["finish_reason"] == "eos",
                    "eos-ended generation of the replaced prediction")
    target = read_json(d / "private" / "harness" / "leaderboard.json")
    prediction = first_where(target["per_example"], lambda e: (e.get("task"), e.get("id")) == ("arithmetic", r["id"]),
                             "private per-example entry")["prediction"]
    g["generated_ids"] = tok.encode(prediction, add_special_tokens=False).ids + g["generated_ids"][-1:]
    edit_jsonl(d, "private/harness/generations.jsonl", lambda rows: gens)


def m_target_to_wrong_answer(d):
    """The task file's target changed to the model's wrong answer; the score, the file's sha256 (config.json,
    summary.json, the private leaderboard) and every aggregate recomputed; the task no longer claimed to be a
    shipped fixture. Only a comparison with the repository's fixture (identity level) can tell."""
    board = read_json(d / "private" / "harness" / "leaderboard.json")
    e = first_where(board["per_example"], lambda e: e.get("task") == "arithmetic" and e.get("score") == 0.0
                    and e.get("prediction"), "wrong arithmetic answer")
    p, lines, n, ex = task_example(d, "arithmetic", e["id"])
    ex["targets"] = [h_norm(e["prediction"])]
    lines[n] = json.dumps(ex, ensure_ascii=False)
    p.write_text("\n".join(lines), encoding="utf-8")
    sha = sha256_file(p, cached=False)
    edit_json(d, "harness/config.json", lambda c: c["tasks"]["arithmetic"].update(sha256=sha))

    def summary(s):
        s["leaderboard"]["tasks"]["arithmetic"]["sha256"] = sha
        s["tasks_are_shipped_fixtures"]["arithmetic"] = False
    edit_json(d, "harness/summary.json", summary)
    if "sha256" in board.get("tasks", {}).get("arithmetic", {}):
        edit_json(d, "private/harness/leaderboard.json", lambda b: b["tasks"]["arithmetic"].update(sha256=sha))
    harness_rescore(d, "arithmetic", 1.0)


def m_code_score(recs):
    r = first_where(recs, lambda r: r.get("task") == "code" and r.get("sandbox"), "code example with sandbox outputs")
    r["score"] = 0.0 if r["score"] != 0.0 else 1.0


def m_private_score(board):
    e = first_where(board["per_example"], lambda e: e.get("task") != "code", "text-metric example")
    e["score"] = 1.0 - e["score"] if e["score"] in (0.0, 1.0) else 0.0


def harness_kinds():
    H = "harness"
    return [
        kind("harness_code_score", H, "code example: score changed although the sandbox counts say otherwise",
             records(H, m_code_score), ARITHMETIC, "example scores"),
        kind("harness_overall", H, "summary.json: leaderboard.overall += 0.1",
             lambda d: edit_json(d, "harness/summary.json", lambda s: s["leaderboard"].update(
                 overall=s["leaderboard"]["overall"] + 0.1)), ARITHMETIC, "task and overall scores"),
        kind("harness_fixture_claim", H, "summary.json: tasks_are_shipped_fixtures.arithmetic -> false",
             lambda d: edit_json(d, "harness/summary.json", lambda s: s["tasks_are_shipped_fixtures"].update(
                 arithmetic=not s["tasks_are_shipped_fixtures"]["arithmetic"])),
             ARITHMETIC, "task files vs shipped fixtures"),
        kind("harness_private_score", H, "private leaderboard: one example's score changed",
             lambda d: edit_json(d, "private/harness/leaderboard.json", m_private_score),
             IDENTITY, "example scores from predictions"),
        kind("harness_prediction_replaced", H, "a wrong answer replaced by the target, recomputed consistently "
             "(score, prediction_sha256, task and overall scores, private leaderboard)", m_prediction_replaced,
             IDENTITY, "private generations"),
        kind("harness_prediction_and_ids_replaced", H, "a wrong answer replaced by the target and its generated ids "
             "re-tokenised from it, everything else recomputed consistently", m_prediction_and_ids_replaced,
             FORWARD, "greedy tokens"),
        kind("harness_target_to_wrong_answer", H, "a task target changed to the model's wrong answer, recomputed "
             "consistently (task file sha256, scores, fixture claim)", m_target_to_wrong_answer,
             IDENTITY, "task files vs the repository's fixtures"),
        kind("harness_token_resplit", H, "private generations: one generated token replaced by two that decode to "
             "the same prediction (nothing public changes)",
             lambda d: resplit(d, "harness", lambda g: g.get("finish_reason") == "eos"), FORWARD, "greedy tokens"),
        kind("harness_task_file_edited", H, "private task file: a prompt edited, nothing else",
             lambda d: edit_text(d, "private/harness/tasks/substring.jsonl",
                                 lambda t: t.replace('"prompt": "', '"prompt": "Please: ', 1)),
             IDENTITY, "private task files"),
    ]


def generation_kinds():
    return extraction_kinds() + harness_kinds()
