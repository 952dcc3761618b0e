"""The mutation self-test (--mutations): tamper with copies of O, each tamper must be caught.

Each mutation tampers with a fresh copy of O in one way and names the check that must catch it. They target the
protocol experiment (records 0 and 1 in rank order). A mutation whose catching check cannot run here (no private
file, no tokenizer, no model) is SKIPPED, which counts as not caught: the self-test only passes when every kind
was demonstrably caught.
"""
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

from evidence_audit.checks import cut, first_failure
from evidence_audit.driver import AUDIT_FORMAT, audit
from evidence_audit.reading import Unreadable, read_json, read_jsonl, sha256_text


class NotApplicable(Exception):
    pass


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _edit_json(d, rel, fn):
    obj = read_json(d / rel)
    fn(obj)
    (d / rel).write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def edit_records(fn, need=1):
    """A mutation that edits the list of records in place (fn may also return a new list)."""
    def apply(d):
        recs = read_jsonl(d / "protocol" / "records.jsonl")
        if len(recs) < need:
            raise NotApplicable(f"needs {need} records, the evidence has {len(recs)}")
        new = fn(recs)
        _write_jsonl(d / "protocol" / "records.jsonl", recs if new is None else new)
    return apply


def edit_file(rel, fn):
    return lambda d: _edit_json(d, rel, fn)


def flip_hex(h):
    return h[:-1] + ("0" if h[-1] != "0" else "1")


def other_value(x):
    return 0.5 if x != 0.5 else 0.25


def m_flip_label(recs):
    recs[0]["label"] = 1 - recs[0]["label"]


def m_nudge_score(recs):
    recs[0]["official"]["scores"][0] += 1e-6


def m_swap_idx(recs):
    recs[0]["idx"], recs[1]["idx"] = recs[1]["idx"], recs[0]["idx"]


def m_change_prediction(recs):
    recs[0]["independent"]["pred"] = 1 - recs[0]["independent"]["pred"]


def m_token_count(recs):
    recs[0]["context_tokens"] += 1


def m_prompt_hash(recs):
    recs[0]["prompt_sha256"] = flip_hex(recs[0]["prompt_sha256"])


def m_both_prompt_hashes(recs):
    recs[0]["prompt_sha256"] = recs[0]["official"]["prompt_hash"] = flip_hex(recs[0]["prompt_sha256"])


def m_swap_score_lists(recs):
    a, b = recs[0], recs[1]
    for k in ("official", "independent"):
        a[k]["scores"], b[k]["scores"] = b[k]["scores"], a[k]["scores"]
    a["abs_diff"], b["abs_diff"] = b["abs_diff"], a["abs_diff"]


def m_item_acc(recs):
    recs[0]["official"]["acc"] = 1.0 - recs[0]["official"]["acc"]


def m_token_id(recs):
    recs[0]["candidates"][0]["token_ids"][0] += 1


def m_doc_hash(recs):
    recs[0]["official"]["doc_hash"] = flip_hex(recs[0]["official"]["doc_hash"])


def m_both_scores(recs):
    for side in ("official", "independent"):      # abs_diff stays 0 and, at this margin, no prediction changes
        recs[0][side]["scores"][0] += 1e-3


def m_private_sentence(d):
    p = d / "private" / "protocol" / "texts.jsonl"
    if not p.exists():
        raise NotApplicable(f"{p.relative_to(d)} absent")
    rows = read_jsonl(p)
    rows[0]["sentence"] += " Not."
    _write_jsonl(p, rows)


def m_delete_stages(d):
    (d / "protocol" / "stages.json").unlink()


def m_relabel_split(d):
    """Relabel the split everywhere it is written, consistently: how one would hide which items were scored."""
    new = {"smoke": "dev", "dev": "smoke", "confirm": "dev"}[read_json(d / "protocol" / "config.json")["split"]]

    def relabel(o):
        o["split"], o["confirmation_items_scored"] = new, new == "confirm"
        if "selection" in o:
            o["selection"]["split"] = new
    _edit_json(d, "protocol/config.json", relabel)
    _edit_json(d, "protocol/summary.json", relabel)


def m_salt(d):
    """A careful tamperer: the salt changes in config.json and in identity.json's scoring config (and its hash),
    so only the selection rule itself can notice that the records were not chosen with this salt."""
    def cfg(o):
        o["selection"]["salt"] = o["config"]["selection_salt"] = o["selection"]["salt"] + "-x"

    def ident(o):
        o["scoring_config"]["selection_salt"] += "-x"
        o["scoring_config_sha256"] = sha256_text(json.dumps(o["scoring_config"], sort_keys=True))
    _edit_json(d, "protocol/config.json", cfg)
    _edit_json(d, "protocol/identity.json", ident)


def m_reported_acc(d):
    _edit_json(d, "protocol/config.json", lambda o: o["official"].update(reported_acc=other_value(
        o["official"]["reported_acc"])))
    _edit_json(d, "protocol/summary.json", lambda o: o["official"].update(lm_eval_reported_acc=other_value(
        o["official"]["lm_eval_reported_acc"])))


A_, I_, F_ = "arithmetic", "identity", "forward"
MUTATIONS = [
    # kind, what it does, apply(copy of O), (level, check-name prefix) that must catch it
    ("flip_label", "record 0: label -> 1 - label", edit_records(m_flip_label), (A_, "correctness")),
    ("nudge_score", "record 0: official.scores[0] += 1e-6", edit_records(m_nudge_score), (A_, "agreement")),
    ("drop_record", "remove the last record line", edit_records(lambda recs: recs[:-1]), (A_, "item selection")),
    ("duplicate_record", "append a copy of record 0", edit_records(lambda recs: recs + [copy.deepcopy(recs[0])]),
     (A_, "item selection")),
    ("swap_idx", "records 0 and 1 exchange their idx", edit_records(m_swap_idx, need=2), (A_, "item selection")),
    ("change_prediction", "record 0: independent.pred -> 1 - pred", edit_records(m_change_prediction),
     (A_, "predictions")),
    ("change_token_count", "record 0: context_tokens += 1", edit_records(m_token_count), (A_, "candidates")),
    ("edit_summary_accuracy", "summary.json: independent.accuracy -> another value",
     edit_file("protocol/summary.json", lambda o: o["independent"].update(accuracy=other_value(
         o["independent"]["accuracy"]))), (A_, "summary.json")),
    ("alter_prompt_hash", "record 0: prompt_sha256 changed", edit_records(m_prompt_hash), (A_, "prompt hashes")),
    ("alter_private_sentence", "private texts, line 1: sentence + ' Not.'", m_private_sentence,
     (I_, "private texts")),
    ("delete_stages", "delete protocol/stages.json", m_delete_stages, (A_, "required files")),
    ("move_record_lines", "reverse the order of the record lines", edit_records(lambda recs: recs[::-1], need=2),
     (A_, "item selection")),
    ("swap_score_lists", "records 0 and 1 exchange both score lists and abs_diff (ids no longer pair with scores)",
     edit_records(m_swap_score_lists, need=2), (F_, "candidate scores")),
    # beyond the required list
    ("lm_eval_item_acc", "record 0: official.acc -> 1 - acc", edit_records(m_item_acc), (A_, "correctness")),
    ("lm_eval_reported_acc", "config.json official.reported_acc and summary.json lm_eval_reported_acc, consistently",
     m_reported_acc, (A_, "summary.json")),
    ("relabel_split", "split relabelled consistently in config.json and summary.json (hides what was scored)",
     m_relabel_split, (A_, "item selection")),
    ("change_salt", "selection salt changed consistently in config.json and identity.json", m_salt,
     (A_, "item selection")),
    ("both_prompt_hashes", "record 0: prompt_sha256 and official.prompt_hash changed together",
     edit_records(m_both_prompt_hashes), (I_, "private texts")),
    ("candidate_token_id", "record 0: candidates[0].token_ids[0] += 1", edit_records(m_token_id),
     (I_, "tokenisation")),
    ("doc_hash", "record 0: official.doc_hash changed", edit_records(m_doc_hash), (I_, "private texts")),
    ("both_scores_shifted", "record 0: scores[0] of both paths += 1e-3 (every derived figure stays consistent)",
     edit_records(m_both_scores), (F_, "candidate scores")),
]


def mutation_selftest(out, cache, stream=sys.stdout):
    """Audit an untouched copy of O and one tampered copy per kind, each at every level that can run here:
    arithmetic always, identity (--tokens) when the private texts and the tokenizer are present, forward when the
    model is present too. Returns the report; raises Unreadable when O itself cannot be read."""
    out = Path(out)
    only = ("protocol",)       # the mutations below tamper with the protocol experiment's evidence
    probe = audit(out, ("arithmetic", "identity", "forward"), cache, only)
    ran = {(r["level"], r["check"]) for r in probe["checks"] if r["status"] != "SKIPPED"}
    skips = {(r["level"], r["check"]): r["note"] for r in probe["checks"]
             if r["status"] == "SKIPPED" and r.get("requested", True)}
    levels = ("arithmetic",) + tuple(lv for lv in ("identity", "forward") if any(l == lv for l, _ in ran))
    unavailable = sorted({f"{l}/{c.split(' (')[0]}" for l, c in skips})
    print(f"mutation self-test on copies of {out} (experiment: protocol)\n  audit levels used for every copy: {', '.join(levels)}"
          + (f"\n  checks that cannot run here: {'; '.join(unavailable)}" if unavailable else ""), file=stream)
    rows = []
    with tempfile.TemporaryDirectory(prefix="audit-mutations-") as tmp:
        shutil.copytree(out, Path(tmp) / "clean")
        clean = audit(Path(tmp) / "clean", levels, cache, only)
        f = first_failure(clean)
        clean_row = {"passed": clean["exit_code"] == 0, "first_failure": f and f"[{f['level']}] {f['first_failure']}"}
        print(f"  {'(clean copy)':<24} {'PASS' if clean_row['passed'] else 'FAIL':<8} "
              f"{clean_row['first_failure'] or 'untouched copy passes'}", file=stream)
        for n, (kind, what, apply, (level, check)) in enumerate(MUTATIONS):
            row = {"kind": kind, "what": what, "must_be_caught_by": f"{level}/{check}", "caught": False}
            catcher_ran = any(l == level and c.startswith(check) for l, c in ran)
            d = Path(tmp) / f"{n:02d}-{kind}"
            shutil.copytree(out, d)
            try:
                apply(d)
                if not catcher_ran:
                    why = next((v for (l, c), v in skips.items() if l == level and c.startswith(check)), "")
                    raise NotApplicable(f"{level}/{check} cannot run here: {why}")
            except NotApplicable as e:
                row.update(status="SKIPPED", first_failure=str(e))
            else:
                try:
                    rep = audit(d, levels, cache, only)
                    f = first_failure(rep)
                    failed = [f"{r['level']}/{r['check']}" for r in rep["checks"] if r["status"] == "FAIL"]
                    row.update(caught=rep["exit_code"] != 0, failed_checks=failed,
                               by_expected_check=any(x.startswith(f"{level}/{check}") for x in failed),
                               first_failure=f and f"[{f['level']}] {f['first_failure']}")
                except Unreadable as e:
                    row.update(caught=True, failed_checks=["unreadable"], by_expected_check=False,
                               first_failure=f"[exit 2] {e}")
                # CAUGHT* = rejected, but not (also) by the check named for this kind: worth a look
                row["status"] = ("CAUGHT" if row["by_expected_check"] else "CAUGHT*") if row["caught"] else "MISSED"
            shutil.rmtree(d)
            rows.append(row)
            msg = row["first_failure"] or ""
            print(f"  {kind:<24} {row['status']:<8} {cut(msg, 160)}", file=stream)
    ok = clean_row["passed"] and all(r["caught"] for r in rows)
    print(f"MUTATIONS: {sum(r['caught'] for r in rows)}/{len(rows)} caught, clean copy "
          f"{'passed' if clean_row['passed'] else 'FAILED'} -> exit {0 if ok else 1}", file=stream)
    return {"audit_format": AUDIT_FORMAT, "evidence": str(out), "levels": list(levels), "clean": clean_row,
            "mutations": rows, "exit_code": 0 if ok else 1}


