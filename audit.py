"""Recompute every claim in an evidence directory written by run.py, from the evidence alone.

    python audit.py O                              # arithmetic level (stdlib only, no model, no private files)
    python audit.py O --tokens                     # + identity level: private texts, tokenizer, data parquet
    python audit.py O --tokens --forward           # + forward level: audit.py's own Llama forward pass
    python audit.py O --mutations                  # self-test: tamper with copies of O, each must be caught
    python audit.py O --review SHEET               # + import a filled extraction review sheet (human audit)

Options: --cache C (prepared cache; default: two levels above config.json's model.dir), --experiment NAME (audit
only NAME; repeatable), --report PATH (default O/audit.json, or O/audit.mutations.json with --mutations), --threads
N (torch threads for --forward, default 1), --strict (a requested check that had to be skipped exits 1).
The report on stdout has one line per check group; the JSON report holds every check and every failure message.

Levels (each reported separately, per experiment and per check group, with the number of items checked):
  arithmetic  recomputes predictions (first index wins ties), correctness, accuracies, counts, the constant-class
              baseline, agreement figures, lm-eval's per-item acc, the item-selection rule, token counts and every
              value in summary.json from records.jsonl + config.json. Needs nothing but O.
  identity    (--tokens) re-hashes the private sentences and prompts, rebuilds each prompt from the template in
              config.json, re-tokenises context and context+candidate with the cached tokenizer.json (no special
              tokens) and checks candidate ids, start boundaries and the context-prefix property; recomputes
              lm-eval's doc_hash; when the data parquet is in the cache, checks row count, content hash, and each
              item's sentence and label against it.
  forward     (--forward, implies --tokens) recomputes every candidate score with the minimal Llama forward pass
              written below (torch + safetensors only) and compares with both recorded paths.

What this does not prove (limits, stated honestly):
  - audit.py is independent code, not an independent measurement: the forward level re-runs the same weights from
    the cache, and passes if they reproduce the recorded scores within FORWARD_TOL. It cannot tell whether those
    weights are the right ones beyond comparing their sha256 with the one identity.json records.
  - Wall times and peak RSS in stages.json are measurements; they are sanity-checked (non-negative, RSS
    non-decreasing), not recomputed.
  - Without private texts the sentence/prompt hashes are only checked for internal consistency; an edit of a score
    that keeps every derived figure consistent (e.g. swapping the score lists of two items with the same
    prediction) is only caught by the forward level. Skipped checks are reported as SKIPPED with the reason,
    never as passed.
  - lm-eval's doc_hash is recomputed with lm-eval 0.4.9.2's definition (sha256 of json.dumps(doc, indent=2,
    ensure_ascii=False)) and the GLUE SST-2 column order (sentence, label, idx), duplicated here on purpose.
  - config.json n_rows only matters to the arithmetic level through the selection it produces: a value that leaves
    the selected idx unchanged is caught only by the identity level's data check (the parquet's row count).
  - Experiments with no rule in RULES are reported as FAIL ("no audit rule"), never passed.
  - The mutation self-test reuses forward results across its copies (keyed by model file and exact token ids; a
    forward pass is a pure function of both), otherwise it would re-run the model once per mutation.

audit.py imports nothing from this repository (run, experiments, resources, config, adapter) and nothing from
lm_eval: every rule it checks is written out again below, on purpose. The arithmetic level uses only the standard
library; torch, tokenizers, safetensors and pyarrow are imported inside the deeper levels only.

Exit codes: 0 every claim recomputes; 1 a check failed (the message names the item idx and the field); 2 the
evidence is unreadable (missing O, unparseable JSON: the message names the file and line; no report is written).
With --strict, a requested check that had to be skipped also exits 1.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

AUDIT_FORMAT = 1
THREADS = 1                 # torch intra-op threads for the forward level (--threads)
FORWARD_TOL = 1e-4          # max |recomputed - recorded| per candidate score (nats) for the forward level to pass
REQUIRED = ["config.json", "identity.json", "records.jsonl", "summary.json", "stages.json"]
SPLITS = ("smoke", "dev", "confirm")
MISSING = type("Missing", (), {"__repr__": lambda self: "<missing>"})()


class Unreadable(Exception):
    """The evidence cannot be read at all (exit 2); the message names the file and line."""


# ---- reading evidence --------------------------------------------------------------------------------------------

def read_json(path):
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise Unreadable(f"{path}: not UTF-8 ({e})")
    except json.JSONDecodeError as e:
        raise Unreadable(f"{path}: line {e.lineno}: unparseable JSON ({e.msg}); re-run run.py to regenerate it")
    except OSError as e:
        raise Unreadable(f"{path}: cannot read ({e.strerror})")


def read_jsonl(path):
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise Unreadable(f"{path}: not UTF-8 ({e})")
    except OSError as e:
        raise Unreadable(f"{path}: cannot read ({e.strerror})")
    # split on "\n" only: json.dumps(ensure_ascii=False) leaves U+2028 and friends unescaped inside strings
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    rows = []
    for n, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise Unreadable(f"{path}: line {n}: unparseable JSON ({e.msg}); re-run run.py to regenerate it")
    return rows


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_FILE_SHA = {}  # (path, size, mtime_ns) -> sha256; the mutation self-test hashes the same 500 MB file many times


def sha256_file(path):
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FILE_SHA:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _FILE_SHA[key] = h.hexdigest()
    return _FILE_SHA[key]


def get(obj, dotted):
    """obj['a']['b'] for 'a.b', or MISSING: a missing claim compares unequal to any recomputed value."""
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return MISSING
        obj = obj[part]
    return obj


def same(a, b):
    """Equality that does not let JSON's true pass for 1 (Python's True == 1) and compares containers deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def short(v, n=120):
    s = repr(v)
    return s if len(s) <= n else s[:n - 3] + "..."


# ---- check bookkeeping -------------------------------------------------------------------------------------------
# One row per check group: what was checked, on how many items, PASS/FAIL/SKIPPED, every failure message (the first
# is printed). Failure messages start with the item ("idx 100") or the file, then the field.

class Checks:
    def __init__(self):
        self.rows = []

    def add(self, experiment, level, check, items, failures, note=""):
        self.rows.append({"experiment": experiment, "level": level, "check": check, "items": items,
                          "status": "FAIL" if failures else "PASS", "n_failures": len(failures),
                          "first_failure": failures[0] if failures else None, "failures": failures[:200],
                          "note": note})

    def skip(self, experiment, level, check, reason, requested=True):
        self.rows.append({"experiment": experiment, "level": level, "check": check, "items": 0,
                          "status": "SKIPPED", "n_failures": 0, "first_failure": None, "failures": [],
                          "note": reason, "requested": requested})


def expect(bad, where, field, recorded, recomputed, why=""):
    if not same(recorded, recomputed):
        bad.append(f"{where} {field}: recorded {short(recorded)}, recomputed {short(recomputed)}"
                   + (f" ({why})" if why else ""))


def compare_tree(bad, where, recorded, expected, prefix=""):
    """Every leaf of `recorded` must equal `expected`; a recorded key audit.py cannot recompute is a failure too."""
    if isinstance(expected, dict) and isinstance(recorded, dict):
        for k in expected:
            compare_tree(bad, where, recorded.get(k, MISSING), expected[k], f"{prefix}{k}.")
        for k in recorded:
            if k not in expected:
                bad.append(f"{where} {prefix}{k}: recorded {short(recorded[k])} is a claim audit.py has no rule "
                           "to recompute")
        return
    expect(bad, where, prefix.rstrip("."), recorded, expected)


# ---- definitions duplicated from DESIGN.md on purpose ------------------------------------------------------------

def check_scoring_identity(bad, conf, ident):
    """identity.json's scoring config is the whole config.json `config` block (every setting that can change a
    score, config.py) and its sha256 over the sorted-key JSON."""
    expect(bad, "identity.json", "scoring_config", ident.get("scoring_config", MISSING), conf)
    expect(bad, "identity.json", "scoring_config_sha256", ident.get("scoring_config_sha256", MISSING),
           sha256_text(json.dumps(conf, sort_keys=True)))


def argmax_first(scores):
    """Index of the largest score; the first one wins a tie (DESIGN.md, Scoring definitions)."""
    best = 0
    for j, s in enumerate(scores):
        if s > scores[best]:
            best = j
    return best


def select_items(split, salt, n_rows, n_dev, n_confirm, n_smoke):
    """Rank rows by sha256(f"{salt}:{idx}") ascending; first n_dev = dev, next n_confirm = confirm, smoke = the
    first n_smoke of dev. Returns (idx list in rank order, None) or (None, reason)."""
    bounds = {"smoke": (0, n_smoke), "dev": (0, n_dev), "confirm": (n_dev, n_dev + n_confirm)}
    if split not in bounds:
        return None, f"unknown split {split!r}"
    lo, hi = bounds[split]
    if hi > n_rows:
        return None, f"split {split!r} needs {hi} ranked rows but n_rows is {n_rows}"
    ranked = sorted(range(n_rows), key=lambda i: hashlib.sha256(f"{salt}:{i}".encode("utf-8")).hexdigest())
    return ranked[lo:hi], None


def lm_eval_doc_hash(sentence, label, idx):
    """lm-eval 0.4.9.2 logs sha256(json.dumps(doc, indent=2, ensure_ascii=False)); an SST-2 doc is the parquet row
    with columns in the order sentence, label, idx."""
    doc = {"sentence": sentence, "label": label, "idx": idx}
    return sha256_text(json.dumps(doc, indent=2, ensure_ascii=False))


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_sha(v):
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


# ---- the protocol experiment: level 1, arithmetic ----------------------------------------------------------------
# Every rule reads records.jsonl + config.json and recomputes; nothing recorded is trusted as an input except the
# per-candidate scores, labels and token lists (which the deeper levels check in turn).

RECORD_FIELDS = {
    "idx": is_int, "rank": is_int, "label": is_int, "sentence_sha256": is_sha, "prompt_sha256": is_sha,
    "context_tokens": is_int, "candidates": lambda v: isinstance(v, list) and len(v) > 0,
    "official": lambda v: isinstance(v, dict), "independent": lambda v: isinstance(v, dict),
    "abs_diff": lambda v: isinstance(v, list),
}
OFFICIAL_FIELDS = {"doc_id": is_int, "scores": None, "is_greedy": None, "pred": is_int, "acc": is_num,
                   "doc_hash": is_sha, "prompt_hash": is_sha}
INDEPENDENT_FIELDS = {"scores": None, "pred": is_int, "correct": is_int}
CANDIDATE_FIELDS = {"text": lambda v: isinstance(v, str), "start": is_int,
                    "token_ids": lambda v: isinstance(v, list) and len(v) > 0 and all(is_int(t) for t in v)}
# identity.json: fields recomputed from config.json, and facts about the producing code that evidence cannot recompute
IDENTITY_RECOMPUTED = {"model_sha256", "tokenizer_sha256", "data_content_sha256", "prompt_template_sha256",
                       "scoring_config", "scoring_config_sha256", "official_config_sha256",
                       "official_task_config_sha256"}
IDENTITY_DECLARED = {"git_commit", "git_dirty", "code_sha256", "versions"}
# identity fields run.py claims to have joined on -> the audit check that re-verifies each one
IDENTITY_FIELD_RULES = {
    "doc_id": "arithmetic/selection (official.doc_id == idx)",
    "doc.idx": "identity/private texts (doc_hash recomputed from idx, label, sentence)",
    "label": "identity/private texts (doc_hash) and identity/data (parquet label)",
    "target": "arithmetic/correctness (lm-eval acc recomputed against the label)",
    "sentence_sha256": "identity/private texts and identity/data",
    "prompt_sha256": "arithmetic/prompt hashes and identity/private texts",
    "candidate texts": "arithmetic/candidates",
    "candidate token ids and start": "identity/tokenisation",
}


def record_schema_problems(r, n_cands_expected):
    where = f"idx {r.get('idx', '?')}" if isinstance(r, dict) else "record"
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = []
    for k, ok in RECORD_FIELDS.items():
        if k not in r:
            bad.append(f"{where} {k}: missing")
        elif not ok(r[k]):
            bad.append(f"{where} {k}: wrong type or empty ({short(r[k], 60)})")
    for k in r:
        if k not in RECORD_FIELDS and k != "fast":   # "fast": run.py --fast (recomputed in fast_expected)
            bad.append(f"{where} {k}: a field audit.py has no rule for")
    if bad:
        return bad
    n = len(r["candidates"])
    if n != n_cands_expected:
        bad.append(f"{where} candidates: {n} candidates, the protocol has {n_cands_expected} choices")
    for j, c in enumerate(r["candidates"]):
        if not isinstance(c, dict) or set(c) != set(CANDIDATE_FIELDS):
            bad.append(f"{where} candidates[{j}]: fields {sorted(c) if isinstance(c, dict) else c!r}, expected "
                       f"{sorted(CANDIDATE_FIELDS)}")
            continue
        bad += [f"{where} candidates[{j}].{k}: wrong type ({short(c[k], 60)})"
                for k, ok in CANDIDATE_FIELDS.items() if not ok(c[k])]
    for side, fields in (("official", OFFICIAL_FIELDS), ("independent", INDEPENDENT_FIELDS)):
        d = r[side]
        for k, ok in fields.items():
            if k not in d:
                bad.append(f"{where} {side}.{k}: missing")
            elif ok is not None and not ok(d[k]):
                bad.append(f"{where} {side}.{k}: wrong type ({short(d[k], 60)})")
        bad += [f"{where} {side}.{k}: a field audit.py has no rule for" for k in d if k not in fields]
        if "scores" in d and not (isinstance(d["scores"], list) and len(d["scores"]) == n
                                  and all(is_num(s) for s in d["scores"])):
            bad.append(f"{where} {side}.scores: expected {n} numbers, found {short(d['scores'], 60)}")
    g = r["official"].get("is_greedy")
    if not (isinstance(g, list) and len(g) == n and all(isinstance(x, bool) for x in g)):
        bad.append(f"{where} official.is_greedy: expected {n} booleans, found {short(g, 60)}")
    if not (len(r["abs_diff"]) == n and all(is_num(d) for d in r["abs_diff"])):
        bad.append(f"{where} abs_diff: expected {n} numbers, found {short(r['abs_diff'], 60)}")
    return bad


def score_comparison(records, a_of, b_of):
    """max abs diff, equal scores and argmax changes between two score lists per record (run.py --fast)."""
    diffs, changed = [], []
    for r in records:
        a, b = a_of(r), b_of(r)
        diffs += [abs(x - y) for x, y in zip(a, b)]
        if argmax_first(a) != argmax_first(b):
            changed.append(r["idx"])
    return {"argmax_changed_idx": changed, "max_abs_diff": max(diffs) if diffs else MISSING,
            "n_argmax_changes": len(changed), "n_scores": len(diffs), "n_scores_equal": sum(d == 0.0 for d in diffs)}


def fast_expected(recorded, records, C, name):
    """summary.fast of run.py --fast: the agreement figures recomputed from each record's fast scores; the
    settings, timings and work counters in it are declared (they describe the run, not the items)."""
    bad = []
    for r in records:
        f = r.get("fast")
        if not isinstance(f, dict) or set(f) != {"scores", "scores_batch1", "pred"}:
            bad.append(f"idx {r['idx']} fast: expected scores, scores_batch1, pred; found {short(f, 60)}")
            continue
        expect(bad, f"idx {r['idx']}", "fast.pred", f["pred"], argmax_first(f["scores"]))
    C.add(name, "arithmetic", "fast mode records (--fast: predictions from the fast scores)", len(records), bad)
    if bad or not isinstance(recorded, dict):
        return MISSING
    parity, fast, fast1 = (lambda r: r["independent"]["scores"]), (lambda r: r["fast"]["scores"]), \
        (lambda r: r["fast"]["scores_batch1"])
    vs = score_comparison(records, parity, fast)
    tol = recorded.get("tolerance", MISSING)
    return {**recorded, "vs_parity": vs, "n_candidates": vs["n_scores"],
            "passed": vs["n_argmax_changes"] == 0 and is_num(tol) and vs["max_abs_diff"] <= tol,
            "batch_invariance": {f"parity_vs_fast_batch{recorded.get('batch_size')}": vs,
                                 "parity_vs_fast_batch1": score_comparison(records, parity, fast1),
                                 f"fast_batch1_vs_batch{recorded.get('batch_size')}":
                                     score_comparison(records, fast1, fast)}}


def audit_protocol_arithmetic(C, name, ev):
    """Level 1 for the protocol experiment. `ev` holds the parsed files (None where a file is missing).
    Returns the validated records (or None when they cannot be trusted enough for deeper levels)."""
    A = "arithmetic"
    cfg, ident, records, summ, stages = (ev.get(k) for k in ("config", "identity", "records", "summary", "stages"))
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    if ev["environment"] is None:
        missing.insert(0, "../environment.json")
    C.add(name, A, "required files", len(REQUIRED) + 1,
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    if cfg is None or records is None:
        for check in ("config", "selection", "records", "predictions", "summary", "stages"):
            C.skip(name, A, check, "config.json or records.jsonl missing; nothing to recompute from")
        return None

    # -- config: the settings every later rule reads, and their consistency with each other --
    bad = []
    conf = cfg.get("config") if isinstance(cfg.get("config"), dict) else {}
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split = cfg.get("split")
    if split not in SPLITS:
        bad.append(f"config.json split: {short(split)} is not one of {SPLITS}")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    expect(bad, "config.json", "selection.split", sel.get("split", MISSING), split)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING),
           split == "confirm", "must be true exactly when split is confirm")
    for sel_key, conf_key in (("salt", "selection_salt"), ("n_dev", "n_dev"), ("n_confirm", "n_confirm"),
                              ("n_smoke", "n_smoke"), ("rule", "selection_rule")):
        expect(bad, "config.json", f"selection.{sel_key}", sel.get(sel_key, MISSING), conf.get(conf_key, MISSING),
               f"config.{conf_key} says otherwise")
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("data", MISSING))
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), conf.get("model", MISSING))
    for k in ("n_rows",):
        if not is_int(cfg.get(k)) or cfg.get(k) <= 0:
            bad.append(f"config.json {k}: {short(cfg.get(k, MISSING))} is not a positive integer")
    for k in ("n_dev", "n_confirm", "n_smoke"):
        if not is_int(sel.get(k)) or sel.get(k) < 0:
            bad.append(f"config.json selection.{k}: {short(sel.get(k, MISSING))} is not a non-negative integer")
    if is_int(sel.get("n_smoke")) and is_int(sel.get("n_dev")) and sel["n_smoke"] > sel["n_dev"]:
        bad.append(f"config.json selection.n_smoke: {sel['n_smoke']} > n_dev {sel['n_dev']} (smoke is a prefix of dev)")
    prompt_t, choices, delim = conf.get("sst2_prompt"), conf.get("sst2_choices"), conf.get("target_delimiter")
    if not (isinstance(prompt_t, str) and prompt_t.count("{sentence}") == 1):
        bad.append(f"config.json config.sst2_prompt: {short(prompt_t)} must contain '{{sentence}}' once")
    if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) for c in choices)):
        bad.append(f"config.json config.sst2_choices: {short(choices)} is not a list of >= 2 strings")
        choices = ["negative", "positive"]
    if not isinstance(delim, str):
        bad.append(f"config.json config.target_delimiter: {short(delim)} is not a string")
        delim = " "
    # the official task lm-eval actually ran (dumped by run.py) must be the protocol these rules recompute
    dumped = get(cfg, "official.dumped_task_config")
    if not isinstance(dumped, dict):
        bad.append("config.json official.dumped_task_config: missing")
        dumped = {}
    for k, want in (("doc_to_text", prompt_t.replace("{sentence}", "{{sentence}}") if isinstance(prompt_t, str)
                     else MISSING), ("doc_to_choice", choices), ("target_delimiter", delim),
                    ("num_fewshot", conf.get("num_fewshot", MISSING)), ("output_type", "multiple_choice"),
                    ("doc_to_target", "label"), ("metric_list", [{"metric": "acc"}])):
        expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), want)
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot protocol")
    # identity.json restates config.json: every restated value and hash must recompute
    if ident is not None:
        check_scoring_identity(bad, conf, ident)
        # run.py hashes the whole `official` block of config.json (older evidence: only the dumped task config)
        if "official_task_config_sha256" in ident:
            expect(bad, "identity.json", "official_task_config_sha256", ident["official_task_config_sha256"],
                   sha256_text(json.dumps(dumped, sort_keys=True)), "sha256 of config.json official.dumped_task_config")
        else:
            expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
                   sha256_text(json.dumps(cfg.get("official"), sort_keys=True)), "sha256 of config.json official")
        bad += [f"identity.json {k}: a field audit.py has no rule for" for k in ident
                if k not in IDENTITY_RECOMPUTED | IDENTITY_DECLARED]
        if isinstance(prompt_t, str):
            expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
                   sha256_text(prompt_t))
        for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                         ("data_content_sha256", "data_content_sha256")):
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split, "config.json split")
        expect(bad, "summary.json", "confirmation_items_scored", summ.get("confirmation_items_scored", MISSING),
               split == "confirm")
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING), conf.get("threads", MISSING))
    C.add(name, A, "config consistency (split, selection, official task, identity.json)", 1, bad,
          note="CONFIRMATION SPLIT SCORED" if split == "confirm" else "")

    # -- record shape: every field a later rule reads, with the right type; unknown fields are unrecomputed claims --
    bad = []
    for r in records:
        bad += record_schema_problems(r, len(choices))
    C.add(name, A, "record fields and types", len(records), bad)
    if bad:
        for check in ("selection", "candidates", "predictions", "correctness", "agreement", "prompt hashes",
                      "summary", "stages"):
            C.skip(name, A, check, "records.jsonl has malformed records (see 'record fields and types')")
        return None

    # -- selection: the hash rule recomputed from config.json; records must be exactly those idx in rank order --
    bad = []
    idx_list = [r["idx"] for r in records]
    want, why = (None, "selection settings in config.json are unusable")
    if all(is_int(x) for x in (cfg.get("n_rows"), sel.get("n_dev"), sel.get("n_confirm"), sel.get("n_smoke"))) \
            and isinstance(sel.get("salt"), str):
        want, why = select_items(split, sel["salt"], cfg["n_rows"], sel["n_dev"], sel["n_confirm"], sel["n_smoke"])
    settings = (f"salt={sel.get('salt')!r}, n_rows={cfg.get('n_rows')}, n_dev={sel.get('n_dev')}, "
                f"n_confirm={sel.get('n_confirm')}, n_smoke={sel.get('n_smoke')}, split={split!r}")
    if want is None:
        bad.append(f"config.json selection: {why} ({settings})")
    else:
        for rank, (got, exp) in enumerate(zip(idx_list, want)):
            if got != exp:
                bad.append(f"idx {got} idx: at rank {rank} the selection rule gives idx {exp} ({settings})")
        bad += [f"idx {i} idx: selected by the rule (rank {k}) but has no record ({settings})"
                for k, i in enumerate(want) if i not in idx_list]
        bad += [f"idx {i} idx: has a record but is not selected by the rule ({settings})"
                for i in idx_list if i not in want]
        bad += [f"idx {i} idx: appears {idx_list.count(i)} times in records.jsonl"
                for i in sorted({i for i in idx_list if idx_list.count(i) > 1})]
        if len(records) != len(want):
            bad.append(f"records.jsonl: {len(records)} records, the selection rule gives {len(want)} ({settings})")
        expect(bad, "config.json", "selection.item_idx", sel.get("item_idx", MISSING), want, settings)
    for rank, r in enumerate(records):
        expect(bad, f"idx {r['idx']}", "rank", r["rank"], rank, "line position in records.jsonl")
        expect(bad, f"idx {r['idx']}", "official.doc_id", r["official"]["doc_id"], r["idx"])
        if not (0 <= r["label"] < len(choices)):
            bad.append(f"idx {r['idx']} label: {r['label']} is not a choice index 0..{len(choices) - 1}")
    passed = get(cfg, "official.indices_passed_to_lm_eval")
    if not (isinstance(passed, list) and sorted(passed, key=str) == sorted(idx_list, key=str)):
        bad.append(f"config.json official.indices_passed_to_lm_eval: {short(passed)} is not the set of record idx")
    else:
        expect(bad, "config.json", "official.indices_sorted", get(cfg, "official.indices_sorted"),
               passed == sorted(passed))
        if passed != sorted(passed):
            bad.append("config.json official.indices_passed_to_lm_eval: unsorted; lm-eval 0.4.9.2 then labels "
                       "logged samples with the wrong doc_id, so these scores cannot be joined to items")
    C.add(name, A, "item selection (hash rule, rank order, doc_id, lm-eval indices)", len(records), bad)

    # -- candidates: texts are the protocol's choices, each starts where the context ends, no input over the limit --
    bad = []
    limit = conf.get("max_input_tokens")
    for r in records:
        w = f"idx {r['idx']}"
        for j, c in enumerate(r["candidates"]):
            expect(bad, w, f"candidates[{j}].text", c["text"], delim + choices[j] if j < len(choices) else MISSING)
            expect(bad, w, f"candidates[{j}].start", c["start"], r["context_tokens"], "must equal context_tokens")
            if is_int(limit) and r["context_tokens"] + len(c["token_ids"]) > limit:
                bad.append(f"{w} candidates[{j}].token_ids: input of {r['context_tokens'] + len(c['token_ids'])} "
                           f"tokens is over max_input_tokens {limit} (must have been an error)")
        if r["context_tokens"] < 1:
            bad.append(f"{w} context_tokens: {r['context_tokens']} (a context has at least one token)")
    C.add(name, A, "candidates (texts, start == context_tokens, length limit)", len(records), bad)

    # -- predictions: argmax with the first-index tie rule, recomputed from each path's own scores --
    bad = []
    for r in records:
        for side in ("official", "independent"):
            expect(bad, f"idx {r['idx']}", f"{side}.pred", r[side]["pred"], argmax_first(r[side]["scores"]),
                   f"argmax of {side}.scores {r[side]['scores']}, first index wins ties")
    C.add(name, A, "predictions, both paths (argmax, first index wins ties)", len(records), bad)

    # -- correctness: from the label and the recomputed prediction, never from the recorded one --
    bad = []
    for r in records:
        ind_pred, off_pred = argmax_first(r["independent"]["scores"]), argmax_first(r["official"]["scores"])
        expect(bad, f"idx {r['idx']}", "independent.correct", r["independent"]["correct"], int(ind_pred == r["label"]),
               f"label {r['label']}, recomputed pred {ind_pred}")
        expect(bad, f"idx {r['idx']}", "official.acc", r["official"]["acc"], float(off_pred == r["label"]),
               f"lm-eval acc: label {r['label']}, recomputed official pred {off_pred}")
    C.add(name, A, "correctness (independent.correct, lm-eval per-item acc)", len(records), bad)

    # -- agreement: |official - independent| per candidate, recomputed from the two score lists --
    bad = []
    for r in records:
        diffs = [abs(a - b) for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]
        expect(bad, f"idx {r['idx']}", "abs_diff", r["abs_diff"], diffs, "recomputed from the two score lists")
    C.add(name, A, "agreement per candidate (abs_diff from the score lists)", len(records), bad)

    bad = []
    for r in records:
        expect(bad, f"idx {r['idx']}", "official.prompt_hash", r["official"]["prompt_hash"], r["prompt_sha256"],
               "lm-eval's hash of the prompt it scored must equal prompt_sha256")
    C.add(name, A, "prompt hashes (official.prompt_hash == prompt_sha256)", len(records), bad)

    # -- summary.json: rebuilt from the records, every recorded value compared --
    n = len(records)
    labels = [r["label"] for r in records]
    counts = {k: labels.count(k) for k in range(len(choices))}
    majority = max(range(len(choices)), key=lambda k: (counts[k], -k))    # ties -> the lower label
    ind_preds = [argmax_first(r["independent"]["scores"]) for r in records]
    off_preds = [argmax_first(r["official"]["scores"]) for r in records]
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]

    def side(preds):
        correct = sum(int(p == l) for p, l in zip(preds, labels))
        return {"correct": correct, "accuracy": correct / n if n else MISSING,
                "pred_counts": {str(k): preds.count(k) for k in range(len(choices))}}

    reported = get(cfg, "official.reported_acc")
    expected = {
        "experiment": name, "split": split, "confirmation_items_scored": split == "confirm",
        "n_items": n, "n_candidates": len(diffs), "label_counts": {str(k): v for k, v in counts.items()},
        "official": {**side(off_preds), "lm_eval_reported_acc": reported},
        "independent": side(ind_preds),
        "constant_class_baseline": {"label": majority, "accuracy": counts[majority] / n if n else MISSING},
        "agreement": {"max_abs_diff": max(diffs) if diffs else MISSING,
                      "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(a != b for a, b in zip(off_preds, ind_preds))},
        "identity_checks": {"passed": True, "n_samples_joined": n,
                            "fields": get(summ, "identity_checks.fields") if summ is not None else MISSING},
    }
    if summ is not None and ("fast" in summ or any("fast" in r for r in records)):
        expected["fast"] = fast_expected(summ.get("fast"), records, C, name)
    if summ is None:
        C.skip(name, A, "summary.json values", "summary.json missing (named under 'required files')")
    else:
        bad = []
        compare_tree(bad, "summary.json", summ, expected)
        # lm-eval's own aggregate: the mean of its per-item acc, which must also be the official accuracy
        accs = [r["official"]["acc"] for r in records]
        expect(bad, "config.json", "official.reported_acc", reported, sum(accs) / n if n else MISSING,
               "mean of the records' official.acc (lm-eval's acc aggregation)")
        fields = get(summ, "identity_checks.fields")
        if not isinstance(fields, list):
            bad.append("summary.json identity_checks.fields: not a list")
        else:
            bad += [f"summary.json identity_checks.fields: {f!r} is an identity field audit.py has no check for"
                    for f in fields if f not in IDENTITY_FIELD_RULES]
        C.add(name, A, "summary.json values (every value recomputed from the records)", n, bad)

    # -- stages.json: token counts recomputed; timings are measurements and only sanity-checked --
    if stages is None:
        C.skip(name, A, "stages.json token counts", "stages.json missing (named under 'required files')")
    else:
        bad = []
        ctx = [r["context_tokens"] for r in records]
        per_cand = [r["context_tokens"] + len(c["token_ids"]) for r in records for c in r["candidates"]]
        tokens = {"context_tokens": {"min": min(ctx), "max": max(ctx), "total": sum(ctx)} if ctx else MISSING,
                  "input_tokens_per_candidate": {"min": min(per_cand), "max": max(per_cand), "total": sum(per_cand)}
                  if per_cand else MISSING, "n_items": n, "n_candidates": len(per_cand)}
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), tokens, "tokens.")
        st = stages.get("stages")
        if not isinstance(st, list) or not st:
            bad.append("stages.json stages: missing or empty")
        else:
            last_rss = 0
            for s in st:
                if not (isinstance(s, dict) and isinstance(s.get("name"), str) and is_num(s.get("wall_s"))
                        and s["wall_s"] >= 0):
                    bad.append(f"stages.json stages: malformed stage {short(s, 80)}")
                    continue
                rss = s.get("peak_rss_bytes_at_end")
                if rss is not None:
                    if not is_int(rss) or rss < last_rss:
                        bad.append(f"stages.json stage {s['name']!r} peak_rss_bytes_at_end: {rss} is not a "
                                   f"non-decreasing process peak (previous {last_rss})")
                    else:
                        last_rss = rss
        C.add(name, A, "stages.json token counts (+ sanity of timings)", n, bad,
              note="wall times and RSS are measurements: sanity-checked, not recomputed")
    return records


# ---- the protocol experiment: level 2, identity ------------------------------------------------------------------

_TOKENIZERS = {}


def load_tokenizer(path):
    """tokenizers.Tokenizer straight from tokenizer.json (what AutoTokenizer's fast tokenizer wraps); no special
    tokens are added at encode time."""
    key = (str(Path(path).resolve()), Path(path).stat().st_mtime_ns)
    if key not in _TOKENIZERS:
        from tokenizers import Tokenizer
        _TOKENIZERS[key] = Tokenizer.from_file(str(path))
    return _TOKENIZERS[key]


def audit_protocol_identity(C, name, out, cfg, ident, records, model_dir, data_parquet):
    """Level 2. Returns {idx: (context ids, [candidate ids])} for the forward level, or None."""
    L = "identity"
    texts_path = out / "private" / name / "texts.jsonl"
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    texts = None
    if records is None:
        for check in ("private texts", "tokenisation", "data parquet"):
            C.skip(name, L, check, "the arithmetic level found records.jsonl or config.json unusable")
        return None
    prompt_t = cfg.get("config", {}).get("sst2_prompt")

    # -- private texts: re-hash, rebuild the prompt from the template, recompute lm-eval's doc_hash --
    if not texts_path.exists():
        C.skip(name, L, "private texts (sentence/prompt hashes, prompt from template, doc_hash)",
               f"{texts_path} absent (private evidence not shipped); sentence and prompt hashes NOT checked")
    else:
        texts_rows = read_jsonl(texts_path)
        bad = []
        texts = {}
        for n_line, t in enumerate(texts_rows, start=1):
            if not (isinstance(t, dict) and is_int(t.get("idx")) and isinstance(t.get("sentence"), str)
                    and isinstance(t.get("prompt"), str)):
                bad.append(f"private/{name}/texts.jsonl line {n_line}: needs idx, sentence, prompt ({short(t, 60)})")
                continue
            if t["idx"] in texts:
                bad.append(f"idx {t['idx']} private texts: duplicated (line {n_line})")
            texts[t["idx"]] = t
        rec_idx = [r["idx"] for r in records]
        bad += [f"idx {i} private texts: no text for this record" for i in rec_idx if i not in texts]
        bad += [f"idx {i} private texts: text for an idx with no record" for i in texts if i not in rec_idx]
        for r in records:
            t = texts.get(r["idx"])
            if t is None:
                continue
            w = f"idx {r['idx']}"
            expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(t["sentence"]),
                   "sha256 of the private sentence")
            expect(bad, w, "prompt_sha256", r["prompt_sha256"], sha256_text(t["prompt"]), "sha256 of the private prompt")
            if isinstance(prompt_t, str):
                # str.replace, not str.format: the template is data, and a brace in it must not be interpreted
                expect(bad, w, "prompt", t["prompt"], prompt_t.replace("{sentence}", t["sentence"]),
                       "config.sst2_prompt filled with the sentence")
            expect(bad, w, "official.doc_hash", r["official"]["doc_hash"],
                   lm_eval_doc_hash(t["sentence"], r["label"], r["idx"]),
                   "lm-eval's doc hash of (sentence, label, idx)")
        C.add(name, L, "private texts (sentence/prompt hashes, prompt from template, doc_hash)",
              len(records), bad)

    # -- tokenisation: context and context+candidate together; context ids must be a prefix of the whole --
    result = None
    if texts is None:
        C.skip(name, L, "tokenisation (candidate ids, start, context-prefix property)",
               "needs the private texts (absent); candidate token ids and boundaries NOT checked")
    elif tok_path is None or not tok_path.exists():
        C.skip(name, L, "tokenisation (candidate ids, start, context-prefix property)",
               f"tokenizer not found ({tok_path}); pass --cache with the prepared cache")
    else:
        bad = []
        try:
            tok = load_tokenizer(tok_path)
        except ImportError as e:
            C.skip(name, L, "tokenisation (candidate ids, start, context-prefix property)",
                   f"cannot import tokenizers ({e})")
            tok = None
        if tok is not None:
            expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
                   if ident else MISSING, "identity.json tokenizer_sha256: the cached tokenizer is not the one used")
            result = {}
            for r in records:
                t = texts.get(r["idx"])
                if t is None:
                    bad.append(f"idx {r['idx']} prompt: no private text for this record; cannot re-tokenise it")
                    continue
                w, prompt = f"idx {r['idx']}", t["prompt"]
                if prompt != prompt.rstrip():
                    bad.append(f"{w} prompt: ends with whitespace; the candidate boundary would be ambiguous")
                ctx_ids = tok.encode(prompt, add_special_tokens=False).ids
                expect(bad, w, "context_tokens", r["context_tokens"], len(ctx_ids), "re-tokenised prompt")
                cand_ids_all = []
                for j, c in enumerate(r["candidates"]):
                    whole = tok.encode(prompt + c["text"], add_special_tokens=False).ids
                    if whole[:len(ctx_ids)] != ctx_ids:
                        bad.append(f"{w} candidates[{j}]: context tokens are not a prefix of context+candidate "
                                   f"tokens ({c['text']!r})")
                    expect(bad, w, f"candidates[{j}].token_ids", c["token_ids"], whole[len(ctx_ids):],
                           "re-tokenised context+candidate minus the context")
                    expect(bad, w, f"candidates[{j}].start", c["start"], len(ctx_ids))
                    cand_ids_all.append(whole[len(ctx_ids):])
                result[r["idx"]] = (ctx_ids, cand_ids_all)
            C.add(name, L, "tokenisation (candidate ids, start, context-prefix property)", len(records), bad,
                  note=f"tokenizers.Tokenizer from {tok_path}, add_special_tokens=False")
            if bad:
                result = None   # the forward level must not score token lists this level rejected

    # -- data parquet: row count, canonical content hash, each item's sentence and label --
    if data_parquet is None or not data_parquet.exists():
        C.skip(name, L, "data parquet (n_rows, content hash, sentence and label per idx)",
               f"data parquet not found ({data_parquet}); labels NOT checked against the data")
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            C.skip(name, L, "data parquet (n_rows, content hash, sentence and label per idx)",
                   f"cannot import pyarrow ({e})")
        else:
            bad = []
            cols = pq.read_table(data_parquet).to_pydict()
            if not {"idx", "label", "sentence"} <= set(cols):
                raise Unreadable(f"{data_parquet}: columns {sorted(cols)}, expected idx, label, sentence")
            rows = {int(i): (int(l), s) for i, l, s in zip(cols["idx"], cols["label"], cols["sentence"])}
            expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows), f"rows in {data_parquet}")
            content = "".join(f"{i}\t{rows[i][0]}\t{rows[i][1]}\n" for i in sorted(rows))
            expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING),
                   sha256_text(content), f"canonical content hash of {data_parquet}")
            for r in records:
                w = f"idx {r['idx']}"
                if r["idx"] not in rows:
                    bad.append(f"{w} idx: not in the data")
                    continue
                expect(bad, w, "label", r["label"], rows[r["idx"]][0], "label in the data")
                expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(rows[r["idx"]][1]),
                       "sentence in the data")
            C.add(name, L, "data parquet (n_rows, content hash, sentence and label per idx)", len(records), bad,
                  note=str(data_parquet))
    return result


# ---- the protocol experiment: level 3, forward -------------------------------------------------------------------
# A minimal Llama written from the architecture's definition: token embedding; per layer x += attn(rmsnorm(x)),
# x += mlp(rmsnorm(x)); final rmsnorm; logits = x @ embed^T (tied). Rotary embeddings use the half-rotation layout
# (the two halves of each head dimension form the pairs), as Hugging Face's Llama does.

_MODELS = {}
_SCORES = {}  # (model key, input ids) -> log-softmax rows; a forward pass is a pure function of weights and ids


def load_llama(model_dir):
    import torch
    from safetensors.torch import load_file

    path = Path(model_dir) / "model.safetensors"
    key = (str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns)
    if key not in _MODELS:
        hp = read_json(Path(model_dir) / "config.json")
        unsupported = [f"{k}={hp.get(k)!r}" for k, ok in (
            ("model_type", hp.get("model_type") == "llama"), ("rope_scaling", hp.get("rope_scaling") is None),
            ("hidden_act", hp.get("hidden_act") == "silu"), ("attention_bias", not hp.get("attention_bias")),
            ("mlp_bias", not hp.get("mlp_bias"))) if not ok]
        if unsupported:
            return None, f"audit.py's forward pass supports plain Llama only; this model has {', '.join(unsupported)}"
        W = {k: v.to(torch.float32) for k, v in load_file(str(path)).items()}
        _MODELS[key] = (key, hp, W)
    return _MODELS[key], None


def llama_logprobs(model, ids):
    """log_softmax of the next-token logits at every position of `ids` ([len(ids), vocab], float32)."""
    import torch

    key, hp, W = model
    cache_key = (key, tuple(ids))
    if cache_key in _SCORES:
        return _SCORES[cache_key]
    d, nh, nkv = hp["hidden_size"], hp["num_attention_heads"], hp["num_key_value_heads"]
    hd = hp.get("head_dim") or d // nh
    eps, theta = hp["rms_norm_eps"], hp["rope_theta"]
    T = len(ids)

    def rmsnorm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)

    with torch.no_grad():
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]      # [T, hd/2]
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # [T, hd]
        causal = torch.full((T, T), float("-inf")).triu(1)
        x = W["model.embed_tokens.weight"][torch.tensor(ids)]                            # [T, d]
        for layer in range(hp["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rmsnorm(x, W[p + "input_layernorm.weight"])
            q = (h @ W[p + "self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)    # [nh, T, hd]
            k = (h @ W[p + "self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)   # [nkv, T, hd]
            v = (h @ W[p + "self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = k.repeat_interleave(nh // nkv, dim=0), v.repeat_interleave(nh // nkv, dim=0)  # grouped-query
            att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + causal, dim=-1)
            o = (att @ v).transpose(0, 1).reshape(T, nh * hd)
            x = x + o @ W[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
            gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
        x = rmsnorm(x, W["model.norm.weight"])
        head = W["model.embed_tokens.weight"] if hp.get("tie_word_embeddings", True) or "lm_head.weight" not in W \
            else W["lm_head.weight"]
        out = torch.log_softmax(x @ head.T, dim=-1)
    _SCORES[cache_key] = out
    return out


def audit_protocol_forward(C, name, ident, records, tokens, model_dir):
    """Level 3. Returns the figures it measured (for audit.json), or None."""
    L = "forward"
    st = Path(model_dir) / "model.safetensors" if model_dir else None
    if st is None or not st.exists() or not (Path(model_dir) / "config.json").exists():
        for check in ("model file", "candidate scores vs both paths", "predictions (argmax) vs both paths",
                      "lm-eval is_greedy"):
            C.skip(name, L, check, f"model not found ({st}); pass --cache with the prepared cache")
        return None
    bad = []
    expect(bad, str(st), "sha256", sha256_file(st), ident.get("model_sha256", MISSING) if ident else MISSING,
           "identity.json model_sha256: the cached weights are not the ones the evidence names")
    C.add(name, L, "model file (sha256 == identity.json model_sha256)", 1, bad)
    model, why = None, ("needs the identity level's verified token ids (private texts + tokenizer), which were "
                        "unavailable or failed")
    if tokens is not None:
        try:
            import torch
            # One intra-op thread by default: on the shared 2-vCPU machines here a second thread that has to wait
            # for a busy CPU made each forward pass ~10x slower (0.16 s vs 1-4 s); numerics stay within tolerance.
            torch.set_num_threads(THREADS)
            model, why = load_llama(model_dir)
        except ImportError as e:
            why = f"cannot import torch/safetensors ({e})"
    if model is None:
        for check in ("candidate scores vs both paths", "predictions (argmax) vs both paths", "lm-eval is_greedy"):
            C.skip(name, L, check, why)
        return None

    t0 = time.perf_counter()
    bad_scores, bad_pred, bad_greedy = [], [], []
    max_off = max_ind = 0.0
    worst = None
    for r in records:
        w = f"idx {r['idx']}"
        ctx_ids, cand_lists = tokens[r["idx"]]
        scores, greedy = [], []
        for j, cand_ids in enumerate(cand_lists):
            ids = ctx_ids + cand_ids
            if len(ids) > 1 and cand_ids:
                lp = llama_logprobs(model, ids[:-1])                   # position t predicts token t+1
                rows = lp[len(ctx_ids) - 1:len(ctx_ids) - 1 + len(cand_ids)]
                picked = rows.gather(1, torch.tensor(cand_ids).unsqueeze(1)).squeeze(1)
                scores.append(float(picked.sum()))
                greedy.append(bool((rows.argmax(dim=-1) == torch.tensor(cand_ids)).all()))
            else:
                scores.append(float("nan"))
                greedy.append(False)
        for side in ("official", "independent"):
            for j, (s_new, s_rec) in enumerate(zip(scores, r[side]["scores"])):
                d = abs(s_new - s_rec)
                if side == "official":
                    max_off = max(max_off, d)
                else:
                    max_ind = max(max_ind, d)
                if worst is None or d > worst[0]:
                    worst = (d, r["idx"], side, j)
                if not d <= FORWARD_TOL:
                    bad_scores.append(f"{w} {side}.scores[{j}]: recorded {s_rec!r}, recomputed {s_new!r} "
                                      f"(|diff| {d:.3g} > tolerance {FORWARD_TOL:g})")
            expect(bad_pred, w, f"{side}.pred", r[side]["pred"], argmax_first(scores),
                   f"argmax of recomputed scores {[round(s, 6) for s in scores]}")
        expect(bad_greedy, w, "official.is_greedy", r["official"]["is_greedy"], greedy,
               "greedy argmax at every candidate position, recomputed")
    elapsed = time.perf_counter() - t0
    figure = (f"max |recomputed - official| = {max_off:.3g}, max |recomputed - independent| = {max_ind:.3g} "
              f"(tolerance {FORWARD_TOL:g}, float32, audit.py's own Llama forward)")
    C.add(name, L, "candidate scores vs both paths", sum(len(r["candidates"]) for r in records), bad_scores,
          note=figure)
    C.add(name, L, "predictions (argmax) vs both paths", len(records), bad_pred)
    C.add(name, L, "lm-eval is_greedy", len(records), bad_greedy)
    return {"max_abs_diff_official": max_off, "max_abs_diff_independent": max_ind, "tolerance": FORWARD_TOL,
            "worst": {"abs_diff": worst[0], "idx": worst[1], "path": worst[2], "candidate": worst[3]} if worst
            else None, "dtype": "float32", "seconds": round(elapsed, 2), "threads": torch.get_num_threads()}


# ---- experiment rules --------------------------------------------------------------------------------------------

def resolve_cache(cfg, cache):
    """(model dir, data parquet) for an experiment: --cache is a prepared cache root (cache/models/<id>,
    cache/data/<id>) or a model dir; default: the model dir config.json records, whose grandparent is the cache."""
    model_id, data_id = get(cfg, "model.id"), cfg.get("data") if cfg else None
    if cache is not None:
        cache = Path(cache)
        if (cache / "config.json").exists() and (cache / "tokenizer.json").exists():
            model_dir, root = cache, cache.parent.parent
        else:
            model_dir, root = (cache / "models" / model_id if isinstance(model_id, str) else None), cache
    else:
        recorded = get(cfg, "model.dir")
        if not isinstance(recorded, str):
            return None, None
        model_dir, root = Path(recorded), Path(recorded).parent.parent
    parquet = root / "data" / data_id / "validation.parquet" if isinstance(data_id, str) else None
    return model_dir, parquet


def audit_protocol(C, name, out, levels, cache):
    exp = out / name
    ev = {"environment": read_json(out / "environment.json") if (out / "environment.json").exists() else None}
    for key, fname in zip(("config", "identity", "records", "summary", "stages"), REQUIRED):
        p = exp / fname
        ev[key] = (read_jsonl(p) if fname.endswith(".jsonl") else read_json(p)) if p.exists() else None
    for key in ("config", "identity", "summary", "stages"):
        if ev[key] is not None and not isinstance(ev[key], dict):
            raise Unreadable(f"{exp / (key + '.json')}: line 1: expected a JSON object, found {type(ev[key]).__name__}")
    records = audit_protocol_arithmetic(C, name, ev)
    info = {}
    if "identity" in levels or "forward" in levels:
        model_dir, parquet = resolve_cache(ev["config"], cache) if ev["config"] else (None, None)
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        tokens = audit_protocol_identity(C, name, out, ev["config"], ev["identity"], records, model_dir, parquet)
        if "forward" in levels:
            info["forward"] = audit_protocol_forward(C, name, ev["identity"], records, tokens, model_dir)
    for level, flag in (("identity", "--tokens"), ("forward", "--forward")):
        if level not in levels:
            C.skip(name, level, "(whole level)", f"not requested (pass {flag})", requested=False)
    return info


# Later experiments (options, extraction, mctaco, harness) add their own rule here: name -> audit function.
# A rule is rule(C, name, out, levels, cache) -> dict of figures for audit.json. It records one row per check
# group with C.add (failure messages name the idx and field) or C.skip (with the reason), for every level in
# ("arithmetic", "identity", "forward"), and raises Unreadable for a file it cannot parse. It may reuse the
# generic helpers above (select_items, argmax_first, compare_tree, llama_logprobs, load_tokenizer) but nothing
# outside this file.
RULES = {"protocol": audit_protocol}


# ---- the options experiment (seed study 003) ---------------------------------------------------------------------
# Five conditions per item: the official prompt scored on the option texts, and an A/B options list (forward and
# reversed contents; the letters stay in place) scored on the option texts or on the letters. Every rule is written
# out again here from the definitions (experiments/options.py is not imported):
#   pi            displayed position -> semantic label (config.options_orders); gold position g = pi^-1(label)
#   prediction    argmax over displayed positions, the first position wins ties; semantic prediction = pi(argmax)
#   acc_norm      lm-eval 0.4.9.2: argmax of score / len(choice) in characters, the choice without the leading
#                 target delimiter (lm_eval/api/task.py ConfigurableTask.process_results, completion_len)
#   acc_norm_tokens  argmax of score / number of candidate tokens (a different metric)
#   paired        flips = items whose semantic predictions differ; gains = a wrong -> b right; losses = a right ->
#                 b wrong; net = gains - losses; exact two-sided McNemar p = min(1, 2 P(X <= min(g, l))),
#                 X ~ Bin(g + l, 1/2), 1.0 without discordant pairs (computed exactly with integers here; run.py
#                 uses scipy's binomtest, so the recorded p must match to OPT_P_TOL relative)

OPT_P_TOL = 1e-12
OPT_RECORD_FIELDS = {
    "idx": is_int, "rank": is_int, "label": is_int, "condition": lambda v: isinstance(v, str),
    "space": lambda v: isinstance(v, str), "order": lambda v: isinstance(v, str),
    "prompt_kind": lambda v: isinstance(v, str), "pi": lambda v: isinstance(v, list) and all(is_int(x) for x in v),
    "gold_position": is_int, "sentence_sha256": is_sha, "prompt_sha256": is_sha, "context_tokens": is_int,
    "candidates": lambda v: isinstance(v, list) and len(v) > 0, "official": lambda v: isinstance(v, dict),
    "independent": lambda v: isinstance(v, dict), "abs_diff": lambda v: isinstance(v, list) and all(is_num(x) for x in v),
    "pred_position": is_int, "semantic_pred": is_int, "correct": is_int, "pred_position_norm_chars": is_int,
    "correct_norm_chars": is_int, "pred_position_norm_tokens": is_int, "correct_norm_tokens": is_int,
}
OPT_CAND_FIELDS = {"position": is_int, "text": lambda v: isinstance(v, str), "choice": lambda v: isinstance(v, str),
                   "n_chars": is_int, "semantic_label": is_int, "start": is_int,
                   "token_ids": lambda v: isinstance(v, list) and len(v) > 0 and all(is_int(t) for t in v)}
OPT_SIDE_FIELDS = {"official": {"scores": None, "is_greedy": None, "pred_position": is_int, "lm_eval_acc": is_num,
                                "lm_eval_acc_norm": is_num},
                   "independent": {"scores": None, "pred_position": is_int}}
OPT_IDENTITY_FIELDS = {
    "idx": "arithmetic/item selection", "label": "arithmetic/shared item identity and identity/data parquet",
    "sentence_sha256": "identity/private texts and identity/data parquet",
    "prompt_sha256 (shared per order by the list conditions)":
        "arithmetic/shared item identity, identity/private texts",
    "official requests == (context, candidate)": "arithmetic/conditions (candidate texts = delimiter + choice)",
    "candidate token ids and start (official _encode_pair)": "identity/tokenisation",
    "lm-eval process_results acc/acc_norm == local": "arithmetic/predictions",
}
OPT_TEMPLATE_KEYS = ("sst2_prompt", "sst2_choices", "target_delimiter", "options_list_prompt", "options_letters",
                     "options_orders", "options_conditions")


def opt_argmax_div(scores, dens):
    return argmax_first([float(s) / float(d) for s, d in zip(scores, dens)])


def opt_mcnemar_exact(gains, losses):
    n = gains + losses
    if n == 0:
        return 1.0
    k = min(gains, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def opt_conditions(conf):
    """The conditions recomputed from config.options_* (the same shape run.py writes into config.json)."""
    letters, orders, choices, delim = (conf.get(k) for k in ("options_letters", "options_orders", "sst2_choices",
                                                               "target_delimiter"))
    specs = conf.get("options_conditions")
    if not (isinstance(letters, list) and isinstance(orders, dict) and isinstance(choices, list)
            and isinstance(delim, str) and isinstance(specs, list) and specs
            and all(isinstance(x, dict) and isinstance(x.get("name"), str) for x in specs)
            and len({x["name"] for x in specs}) == len(specs)):
        return None, "config.options_letters / options_orders / options_conditions / sst2_choices unusable"
    out = []
    for spec in specs:
        name = spec["name"]
        pi = orders.get(spec.get("order"))
        if not (isinstance(pi, list) and sorted(pi) == list(range(len(choices))) and len(pi) == len(letters)):
            return None, f"condition {name}: order {short(pi)} is not a permutation of the {len(choices)} labels"
        if spec.get("space") == "text":
            shown = [choices[p] for p in pi]
        elif spec.get("space") == "letter":
            shown = list(letters)
        else:
            return None, f"condition {name}: unknown scoring space {spec.get('space')!r}"
        if spec.get("prompt") == "official" and pi != list(range(len(pi))):
            return None, f"condition {name}: the official prompt has no list, its order must be the identity"
        if spec.get("prompt") not in ("official", "list"):
            return None, f"condition {name}: unknown prompt kind {spec.get('prompt')!r}"
        out.append({"name": name, "prompt": spec["prompt"], "space": spec["space"], "order": spec["order"],
                    "pi": list(pi), "choices": shown, "candidates": [delim + c for c in shown]})
    return out, None


def opt_prompt_kind(cond):
    return "official" if cond["prompt"] == "official" else f"list_{cond['order']}"


def opt_render(conf, kind, sentence):
    """The context of one prompt kind; placeholders are filled with str.replace (options first, then the sentence),
    so braces in the data are never interpreted."""
    if kind == "official":
        return conf["sst2_prompt"].replace("{sentence}", sentence)
    pi = conf["options_orders"][kind[len("list_"):]]
    t = conf["options_list_prompt"]
    for j, letter in enumerate(conf["options_letters"]):
        t = t.replace("{option_" + letter + "}", conf["sst2_choices"][pi[j]])
    return t.replace("{sentence}", sentence)


def opt_metrics(recs, gold_of, pos_of):
    """Per-condition counts from the recomputed positions (pos_of(r) -> (raw, norm chars, norm tokens))."""
    n = len(recs)
    labels = [r["label"] for r in recs]
    raw = [pos_of(r)[0] for r in recs]
    chars = [pos_of(r)[1] for r in recs]
    toks = [pos_of(r)[2] for r in recs]
    gold = [gold_of(r) for r in recs]
    correct = sum(int(p == g) for p, g in zip(raw, gold))
    c_chars = sum(int(p == g) for p, g in zip(chars, gold))
    c_toks = sum(int(p == g) for p, g in zip(toks, gold))
    return {
        "n": n, "correct": correct, "acc": correct / n, "correct_norm": c_chars, "acc_norm": c_chars / n,
        "correct_norm_tokens": c_toks, "acc_norm_tokens": c_toks / n,
        "predicted_positive": sum(int(r["pi"][p] == 1) for r, p in zip(recs, raw)),
        "chose_first_position": raw.count(0),
        "baseline_all_negative_correct": labels.count(0), "baseline_all_positive_correct": labels.count(1),
        "baseline_all_negative_acc": labels.count(0) / n, "baseline_all_positive_acc": labels.count(1) / n,
        "norm_chars_changes_choice": sum(int(a != b) for a, b in zip(chars, raw)),
        "norm_tokens_changes_choice": sum(int(a != b) for a, b in zip(toks, raw)),
    }


def opt_table(flips, metrics, n):
    """summary.json `table`: the same numbers as text lines, flips first (a list keeps its order in sorted JSON)."""
    t = [f"{'comparison (semantic predictions, a vs b)':<38} {'flips':>5} {'gains':>5} {'losses':>6} {'net':>4} "
         f"{'McNemar p':>9}"]
    for name, f in flips.items():
        t.append(f"{name:<38} {f['flips']:>5} {f['gains']:>5} {f['losses']:>6} {f['net']:>+4} {f['mcnemar_p']:>9.4g}")
    t.append(f"{'condition':<16} {'correct':>8} {'acc':>6} {'acc_norm':>8} {'acc_norm_tok':>12} {'pred_pos':>8} "
             f"{'first_pos':>9} {'all_neg':>7} {'all_pos':>7}")
    for name, m in metrics.items():
        t.append(f"{name:<16} {m['correct']:>5}/{n:<2} {m['acc']:>6.4f} {m['acc_norm']:>8.4f} "
                 f"{m['acc_norm_tokens']:>12.4f} {m['predicted_positive']:>8} {m['chose_first_position']:>9} "
                 f"{m['baseline_all_negative_correct']:>7} {m['baseline_all_positive_correct']:>7}")
    return t


def opt_record_problems(r, n_choices):
    where = f"idx {r.get('idx', '?')} {r.get('condition', '?')}" if isinstance(r, dict) else "record"
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = [f"{where} {k}: missing" if k not in r else f"{where} {k}: wrong type or empty ({short(r[k], 60)})"
           for k, ok in OPT_RECORD_FIELDS.items() if k not in r or not ok(r[k])]
    bad += [f"{where} {k}: a field audit.py has no rule for" for k in r if k not in OPT_RECORD_FIELDS]
    if bad:
        return bad
    n = len(r["candidates"])
    if n != n_choices:
        bad.append(f"{where} candidates: {n} candidates, the conditions have {n_choices}")
    for j, c in enumerate(r["candidates"]):
        if not isinstance(c, dict) or set(c) != set(OPT_CAND_FIELDS):
            bad.append(f"{where} candidates[{j}]: fields {sorted(c) if isinstance(c, dict) else c!r}, expected "
                       f"{sorted(OPT_CAND_FIELDS)}")
            continue
        bad += [f"{where} candidates[{j}].{k}: wrong type ({short(c[k], 60)})"
                for k, ok in OPT_CAND_FIELDS.items() if not ok(c[k])]
    for side, fields in OPT_SIDE_FIELDS.items():
        d = r[side]
        bad += [f"{where} {side}.{k}: missing" for k in fields if k not in d]
        bad += [f"{where} {side}.{k}: wrong type ({short(d[k], 60)})"
                for k, ok in fields.items() if k in d and ok is not None and not ok(d[k])]
        bad += [f"{where} {side}.{k}: a field audit.py has no rule for" for k in d if k not in fields]
        if not (isinstance(d.get("scores"), list) and len(d["scores"]) == n and all(is_num(s) for s in d["scores"])):
            bad.append(f"{where} {side}.scores: expected {n} numbers, found {short(d.get('scores'), 60)}")
    g = r["official"].get("is_greedy")
    if not (isinstance(g, list) and len(g) == n and all(isinstance(x, bool) for x in g)):
        bad.append(f"{where} official.is_greedy: expected {n} booleans, found {short(g, 60)}")
    if len(r["abs_diff"]) != n:
        bad.append(f"{where} abs_diff: expected {n} numbers, found {short(r['abs_diff'], 60)}")
    return bad


def audit_options_arithmetic(C, name, ev):
    """Level 1 for the options experiment. Returns (records, conditions) when deeper levels may use them."""
    A = "arithmetic"
    cfg, ident, records, summ, stages = (ev.get(k) for k in ("config", "identity", "records", "summary", "stages"))
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    if ev["environment"] is None:
        missing.insert(0, "../environment.json")
    C.add(name, A, "required files", len(REQUIRED) + 1,
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    if cfg is None or records is None:
        C.skip(name, A, "(all arithmetic checks)", "config.json or records.jsonl missing; nothing to recompute from")
        return None, None

    # -- config: conditions, comparisons, tie rule, selection, official task fields, identity.json --
    bad = []
    conf = cfg.get("config") if isinstance(cfg.get("config"), dict) else {}
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split = cfg.get("split")
    if split not in SPLITS:
        bad.append(f"config.json split: {short(split)} is not one of {SPLITS}")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    expect(bad, "config.json", "selection.split", sel.get("split", MISSING), split)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING),
           split == "confirm", "must be true exactly when split is confirm")
    for sel_key, conf_key in (("salt", "selection_salt"), ("n_dev", "n_dev"), ("n_confirm", "n_confirm"),
                              ("n_smoke", "n_smoke"), ("rule", "selection_rule")):
        expect(bad, "config.json", f"selection.{sel_key}", sel.get(sel_key, MISSING), conf.get(conf_key, MISSING),
               f"config.{conf_key} says otherwise")
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("data", MISSING))
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), conf.get("model", MISSING))
    expect(bad, "config.json", "tie_rule", cfg.get("tie_rule", MISSING), conf.get("options_tie_rule", MISSING))
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot")
    expect(bad, "config.json", "zero_shot", cfg.get("zero_shot", MISSING), True)
    expect(bad, "config.json", "chat_template", cfg.get("chat_template", MISSING), False)
    conds, why = opt_conditions(conf)
    if conds is None:
        bad.append(f"config.json config: {why}")
    else:
        expect(bad, "config.json", "conditions", cfg.get("conditions", MISSING), conds,
               "recomputed from config.options_conditions / options_orders / options_letters / sst2_choices")
        names = [c["name"] for c in conds]
        comps = conf.get("options_comparisons")
        if not (isinstance(comps, list) and all(isinstance(x, list) and len(x) == 2 and set(x) <= set(names)
                                                for x in comps)):
            bad.append(f"config.json config.options_comparisons: {short(comps)} is not a list of condition pairs")
        expect(bad, "config.json", "comparisons", cfg.get("comparisons", MISSING), comps)
        lp = conf.get("options_list_prompt")
        if not (isinstance(lp, str) and lp.count("{sentence}") == 1 and all(
                f"\n{x}. {{option_{x}}}\n" in lp for x in conf.get("options_letters", []))):
            bad.append(f"config.json config.options_list_prompt: {short(lp)} needs '{{sentence}}' once and one line "
                       "'X. {option_X}' per letter")
    prompt_t, choices = conf.get("sst2_prompt"), conf.get("sst2_choices")
    task = cfg.get("official_task_fields") if isinstance(cfg.get("official_task_fields"), dict) else {}
    for k, want in (("doc_to_text", prompt_t.replace("{sentence}", "{{sentence}}") if isinstance(prompt_t, str)
                     else MISSING), ("doc_to_choice", choices), ("doc_to_target", "label"),
                    ("output_type", "multiple_choice")):
        expect(bad, "config.json", f"official_task_fields.{k}", task.get(k, MISSING), want,
               "the installed glue/sst2 task must be the baseline this experiment claims")
    if ident is not None:
        check_scoring_identity(bad, conf, ident)
        spec = {k: conf.get(k, MISSING) for k in OPT_TEMPLATE_KEYS}
        if MISSING not in spec.values():
            expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
                   sha256_text(json.dumps(spec, sort_keys=True)), "sha256 of the prompt/condition spec in config")
        if "official" in cfg:
            expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
                   sha256_text(json.dumps(cfg["official"], sort_keys=True)))
        for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                         ("data_content_sha256", "data_content_sha256")):
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split, "config.json split")
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING), conf.get("threads", MISSING))
    C.add(name, A, "config consistency (conditions, pi, comparisons, tie rule, selection, official task, identity)",
          1, bad, note="CONFIRMATION SPLIT SCORED" if split == "confirm" else "")
    if conds is None:
        C.skip(name, A, "(remaining arithmetic checks)", "the conditions cannot be recomputed from config.json")
        return None, None
    cond_by = {c["name"]: c for c in conds}
    names = [c["name"] for c in conds]

    # -- record shape --
    bad = []
    for r in records:
        bad += opt_record_problems(r, len(choices) if isinstance(choices, list) else 2)
    C.add(name, A, "record fields and types", len(records), bad)
    if bad:
        C.skip(name, A, "(remaining arithmetic checks)", "records.jsonl has malformed records")
        return None, None

    # -- selection: records are (idx in rank order) x (conditions in config order), nothing else --
    bad = []
    want, why = None, "selection settings in config.json are unusable"
    if all(is_int(x) for x in (cfg.get("n_rows"), sel.get("n_dev"), sel.get("n_confirm"), sel.get("n_smoke"))) \
            and isinstance(sel.get("salt"), str):
        want, why = select_items(split, sel["salt"], cfg["n_rows"], sel["n_dev"], sel["n_confirm"], sel["n_smoke"])
    if want is None:
        bad.append(f"config.json selection: {why}")
    else:
        expected = [(i, c) for i in want for c in names]
        got = [(r["idx"], r["condition"]) for r in records]
        for k, (g, e) in enumerate(zip(got, expected)):
            if g != e:
                bad.append(f"idx {g[0]} {g[1]} idx/condition: at line {k + 1} the selection rule and condition order "
                           f"give idx {e[0]} {e[1]}")
        if len(got) != len(expected):
            bad.append(f"records.jsonl: {len(got)} records, the selection rule gives {len(want)} items x "
                       f"{len(names)} conditions = {len(expected)}")
        bad += [f"idx {i} {c}: appears {got.count((i, c))} times" for i, c in sorted(set(got), key=str)
                if got.count((i, c)) > 1]
        expect(bad, "config.json", "selection.item_idx", sel.get("item_idx", MISSING), want)
        rank_of = {i: k for k, i in enumerate(want)}
        for r in records:
            expect(bad, f"idx {r['idx']} {r['condition']}", "rank", r["rank"], rank_of.get(r["idx"], MISSING))
    C.add(name, A, "item selection (hash rule, rank order, idx x condition)", len(records), bad)

    # -- conditions: pi, gold position, candidates as the condition defines them; limits --
    bad = []
    limit = conf.get("max_input_tokens")
    for r in records:
        w = f"idx {r['idx']} {r['condition']}"
        c = cond_by.get(r["condition"])
        if c is None:
            bad.append(f"{w} condition: not a condition of config.json")
            continue
        for k in ("space", "order", "pi"):
            expect(bad, w, k, r[k], c[k])
        expect(bad, w, "prompt_kind", r["prompt_kind"], opt_prompt_kind(c))
        if 0 <= r["label"] < len(c["pi"]):
            expect(bad, w, "gold_position", r["gold_position"], c["pi"].index(r["label"]), "pi^-1(label)")
        else:
            bad.append(f"{w} label: {r['label']} is not a label of pi {c['pi']}")
        for j, x in enumerate(r["candidates"]):
            expect(bad, w, f"candidates[{j}].position", x["position"], j)
            expect(bad, w, f"candidates[{j}].choice", x["choice"],
                   c["choices"][j] if j < len(c["choices"]) else MISSING)
            expect(bad, w, f"candidates[{j}].text", x["text"], c["candidates"][j] if j < len(c["candidates"])
                   else MISSING, "delimiter + displayed choice (the request lm-eval builds)")
            expect(bad, w, f"candidates[{j}].n_chars", x["n_chars"], len(x["choice"]))
            expect(bad, w, f"candidates[{j}].semantic_label", x["semantic_label"], c["pi"][j] if j < len(c["pi"])
                   else MISSING, "pi(position)")
            expect(bad, w, f"candidates[{j}].start", x["start"], r["context_tokens"], "must equal context_tokens")
            if is_int(limit) and r["context_tokens"] + len(x["token_ids"]) > limit:
                bad.append(f"{w} candidates[{j}]: input of {r['context_tokens'] + len(x['token_ids'])} tokens is over "
                           f"max_input_tokens {limit}")
    C.add(name, A, "conditions (pi, gold position = pi^-1(label), candidates, limits)", len(records), bad)

    # -- shared identity: one item has one label and sentence; list conditions of one order share one context --
    bad = []
    by_idx = {}
    for r in records:
        by_idx.setdefault(r["idx"], []).append(r)
    for idx, rs in by_idx.items():
        for k in ("label", "sentence_sha256"):
            if len({x[k] for x in rs}) != 1:
                bad.append(f"idx {idx} {k}: differs between its condition records ({sorted({str(x[k]) for x in rs})})")
        kinds = {}
        for x in rs:
            kinds.setdefault(x["prompt_kind"], set()).add((x["prompt_sha256"], x["context_tokens"]))
        for kind, vals in kinds.items():
            if len(vals) != 1:
                bad.append(f"idx {idx} prompt_sha256: the conditions of prompt kind {kind} do not share one context")
        if len({next(iter(v))[0] for v in kinds.values()}) != len(kinds):
            bad.append(f"idx {idx} prompt_sha256: two prompt kinds have the same context")
    C.add(name, A, "shared item identity (label, sentence, one context per prompt kind)", len(by_idx), bad)

    # -- predictions and correctness, recomputed from the scores (never from the recorded predictions) --
    bad = []
    pos = {}
    for r in records:
        w = f"idx {r['idx']} {r['condition']}"
        c = cond_by[r["condition"]]
        s_ind, s_off = r["independent"]["scores"], r["official"]["scores"]
        p_ind, p_off = argmax_first(s_ind), argmax_first(s_off)
        p_chars = opt_argmax_div(s_ind, [len(ch) for ch in c["choices"]])
        p_toks = opt_argmax_div(s_ind, [len(x["token_ids"]) for x in r["candidates"]])
        g = c["pi"].index(r["label"])
        pos[(r["idx"], r["condition"])] = (p_ind, p_chars, p_toks)
        expect(bad, w, "independent.pred_position", r["independent"]["pred_position"], p_ind, "argmax, first wins")
        expect(bad, w, "official.pred_position", r["official"]["pred_position"], p_off, "argmax, first wins")
        expect(bad, w, "pred_position", r["pred_position"], p_ind)
        expect(bad, w, "semantic_pred", r["semantic_pred"], c["pi"][p_ind], "pi(argmax)")
        expect(bad, w, "correct", r["correct"], int(p_ind == g))
        expect(bad, w, "pred_position_norm_chars", r["pred_position_norm_chars"], p_chars,
               "argmax of score / len(choice), no delimiter")
        expect(bad, w, "correct_norm_chars", r["correct_norm_chars"], int(p_chars == g))
        expect(bad, w, "pred_position_norm_tokens", r["pred_position_norm_tokens"], p_toks,
               "argmax of score / candidate token count")
        expect(bad, w, "correct_norm_tokens", r["correct_norm_tokens"], int(p_toks == g))
        expect(bad, w, "official.lm_eval_acc", r["official"]["lm_eval_acc"], float(p_off == g),
               "lm-eval acc from the official scores")
        expect(bad, w, "official.lm_eval_acc_norm", r["official"]["lm_eval_acc_norm"],
               float(opt_argmax_div(s_off, [len(ch) for ch in c["choices"]]) == g),
               "lm-eval acc_norm from the official scores")
    C.add(name, A, "predictions (argmax, pi, acc, acc_norm chars, acc_norm_tokens, lm-eval per-record metrics)",
          len(records), bad)

    bad = []
    for r in records:
        expect(bad, f"idx {r['idx']} {r['condition']}", "abs_diff", r["abs_diff"],
               [abs(a - b) for a, b in zip(r["official"]["scores"], r["independent"]["scores"])])
    C.add(name, A, "agreement per candidate (abs_diff from the score lists)", len(records), bad)

    # -- summary.json: rebuilt from the records and compared value by value --
    recs_of = {n_: [r for r in records if r["condition"] == n_] for n_ in names}
    n = len(recs_of[names[0]])
    labels = [r["label"] for r in recs_of[names[0]]]
    metrics = {n_: opt_metrics(recs_of[n_], lambda r: r["pi"].index(r["label"]),
                               lambda r: pos[(r["idx"], r["condition"])]) for n_ in names}
    flips = {}
    if isinstance(conf.get("options_comparisons"), list):
        for a, b in conf["options_comparisons"]:
            sa = {r["idx"]: (cond_by[a]["pi"][pos[(r["idx"], a)][0]], r["label"]) for r in recs_of[a]}
            sb = {r["idx"]: (cond_by[b]["pi"][pos[(r["idx"], b)][0]], r["label"]) for r in recs_of[b]}
            ids = sorted(sa)
            flipped = [i for i in ids if sa[i][0] != sb[i][0]]
            gains = [i for i in ids if sa[i][0] != sa[i][1] and sb[i][0] == sb[i][1]]
            losses = [i for i in ids if sa[i][0] == sa[i][1] and sb[i][0] != sb[i][1]]
            flips[f"{a} vs {b}"] = {"a": a, "b": b, "flips": len(flipped), "flipped_idx": flipped,
                                    "gains": len(gains), "gain_idx": gains, "losses": len(losses), "loss_idx": losses,
                                    "net": len(gains) - len(losses), "n_discordant": len(gains) + len(losses),
                                    "mcnemar_p": opt_mcnemar_exact(len(gains), len(losses))}
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]
    fields = get(summ, "identity_checks.fields") if summ is not None else MISSING
    expected = {
        "experiment": name, "split": split, "confirmation_items_scored": split == "confirm", "n_items": n,
        "n_conditions": len(names), "n_records": len(records), "n_candidates": len(diffs),
        "label_counts": {str(k): labels.count(k) for k in (0, 1)}, "flips": flips, "conditions": metrics,
        "agreement": {"max_abs_diff": max(diffs) if diffs else MISSING,
                      "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(argmax_first(r["official"]["scores"])
                                                     != argmax_first(r["independent"]["scores"]) for r in records),
                      "n_lm_eval_metric_mismatches": sum(
                          (r["official"]["lm_eval_acc"], r["official"]["lm_eval_acc_norm"])
                          != (float(pos[(r["idx"], r["condition"])][0] == r["pi"].index(r["label"])),
                              float(pos[(r["idx"], r["condition"])][1] == r["pi"].index(r["label"])))
                          for r in records)},
        "identity_checks": {"passed": True, "n_records_joined": len(records), "fields": fields},
    }
    if summ is None:
        C.skip(name, A, "summary.json values", "summary.json missing (named under 'required files')")
    else:
        bad = []
        # the p-values: scipy's binomtest in run.py vs exact integer arithmetic here, equal to OPT_P_TOL relative
        for key, f in flips.items():
            rec_p = get(summ, f"flips.{key}.mcnemar_p")
            if is_num(rec_p) and abs(rec_p - f["mcnemar_p"]) <= OPT_P_TOL * max(1.0, f["mcnemar_p"]):
                f["mcnemar_p"] = rec_p
        expected["table"] = opt_table(flips, metrics, n)
        compare_tree(bad, "summary.json", summ, expected)
        if not isinstance(fields, list):
            bad.append("summary.json identity_checks.fields: not a list")
        else:
            bad += [f"summary.json identity_checks.fields: {f!r} is an identity field audit.py has no check for"
                    for f in fields if f not in OPT_IDENTITY_FIELDS]
        C.add(name, A, "summary.json (metrics, baselines, flips, gains, losses, net, McNemar, table, agreement)",
              len(records), bad, note=f"McNemar p recomputed exactly, tolerance {OPT_P_TOL:g} relative")

    # -- stages.json: token counts recomputed; timings only sanity-checked --
    if stages is None:
        C.skip(name, A, "stages.json token counts", "stages.json missing (named under 'required files')")
    else:
        bad = []
        per = {}
        for n_ in names:
            ctx = [r["context_tokens"] for r in recs_of[n_]]
            inp = [r["context_tokens"] + len(x["token_ids"]) for r in recs_of[n_] for x in r["candidates"]]
            per[n_] = {"context_tokens": {"min": min(ctx), "max": max(ctx), "total": sum(ctx)},
                       "input_tokens_per_candidate": {"min": min(inp), "max": max(inp), "total": sum(inp)}}
        inp = [r["context_tokens"] + len(x["token_ids"]) for r in records for x in r["candidates"]]
        distinct = {(r["idx"], r["prompt_sha256"], tuple(x["token_ids"][:-1]))
                    for r in records for x in r["candidates"]}
        tokens = {"per_condition": per, "n_items": n, "n_records": len(records), "n_candidates": len(inp),
                  "input_tokens_per_candidate": {"min": min(inp), "max": max(inp), "total": sum(inp)},
                  "official_requests": len(inp), "independent_forward_passes": len(distinct)}
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), tokens, "tokens.")
        st = stages.get("stages")
        if not isinstance(st, list) or not st or not all(
                isinstance(s, dict) and isinstance(s.get("name"), str) and is_num(s.get("wall_s")) and s["wall_s"] >= 0
                for s in st):
            bad.append("stages.json stages: missing, empty or malformed")
        C.add(name, A, "stages.json token counts (+ sanity of timings)", len(records), bad,
              note="wall times and RSS are measurements: sanity-checked, not recomputed")
    return records, conds


def audit_options_identity(C, name, out, cfg, ident, records, model_dir, data_parquet):
    """Level 2: private texts (hashes, contexts rebuilt from the templates), tokenisation, data parquet.
    Returns {(idx, condition): (context ids, [candidate ids])} for the forward level, or None."""
    L = "identity"
    if records is None:
        C.skip(name, L, "(whole level)", "the arithmetic level found the evidence unusable")
        return None
    conf = cfg.get("config", {})
    texts_path = out / "private" / name / "texts.jsonl"
    texts = None
    if not texts_path.exists():
        C.skip(name, L, "private texts (sentence/prompt hashes, contexts rebuilt from the templates)",
               f"{texts_path} absent (private evidence not shipped); sentence and prompt hashes NOT checked")
    else:
        bad, texts = [], {}
        for n_line, t in enumerate(read_jsonl(texts_path), start=1):
            if not (isinstance(t, dict) and is_int(t.get("idx")) and isinstance(t.get("sentence"), str)
                    and isinstance(t.get("prompts"), dict) and all(isinstance(v, str) for v in t["prompts"].values())):
                bad.append(f"private/{name}/texts.jsonl line {n_line}: needs idx, sentence, prompts ({short(t, 60)})")
                continue
            if t["idx"] in texts:
                bad.append(f"idx {t['idx']} private texts: duplicated (line {n_line})")
            texts[t["idx"]] = t
        rec_idx = sorted({r["idx"] for r in records})
        bad += [f"idx {i} private texts: no text for this item" for i in rec_idx if i not in texts]
        bad += [f"idx {i} private texts: text for an idx with no record" for i in texts if i not in rec_idx]
        kinds = sorted({r["prompt_kind"] for r in records})
        for i in rec_idx:
            t = texts.get(i)
            if t is None:
                continue
            expect(bad, f"idx {i}", "private prompts", sorted(t["prompts"]), kinds)
            for kind in kinds:
                if kind in t["prompts"]:
                    expect(bad, f"idx {i}", f"prompts.{kind}", t["prompts"][kind],
                           opt_render(conf, kind, t["sentence"]), "the template in config.json filled with the sentence")
        for r in records:
            t = texts.get(r["idx"])
            if t is None:
                continue
            w = f"idx {r['idx']} {r['condition']}"
            expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(t["sentence"]))
            expect(bad, w, "prompt_sha256", r["prompt_sha256"], sha256_text(t["prompts"].get(r["prompt_kind"], "")),
                   f"sha256 of the private {r['prompt_kind']} prompt")
        C.add(name, L, "private texts (sentence/prompt hashes, contexts rebuilt from the templates)", len(records), bad)

    result = None
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    if texts is None:
        C.skip(name, L, "tokenisation (candidate ids, start, context-prefix property)",
               "needs the private texts (absent); candidate token ids and boundaries NOT checked")
    elif tok_path is None or not tok_path.exists():
        C.skip(name, L, "tokenisation (candidate ids, start, context-prefix property)",
               f"tokenizer not found ({tok_path}); pass --cache with the prepared cache")
    else:
        bad, result = [], {}
        tok = load_tokenizer(tok_path)
        expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
               if ident else MISSING, "identity.json tokenizer_sha256")
        for r in records:
            t = texts.get(r["idx"])
            w = f"idx {r['idx']} {r['condition']}"
            if t is None or r["prompt_kind"] not in t["prompts"]:
                bad.append(f"{w} prompt: no private context for this record; cannot re-tokenise it")
                continue
            prompt = t["prompts"][r["prompt_kind"]]
            if prompt != prompt.rstrip():
                bad.append(f"{w} prompt: ends with whitespace; the candidate boundary would be ambiguous")
            ctx_ids = tok.encode(prompt, add_special_tokens=False).ids
            expect(bad, w, "context_tokens", r["context_tokens"], len(ctx_ids), "re-tokenised context")
            cands = []
            for j, x in enumerate(r["candidates"]):
                whole = tok.encode(prompt + x["text"], add_special_tokens=False).ids
                if whole[:len(ctx_ids)] != ctx_ids:
                    bad.append(f"{w} candidates[{j}]: context tokens are not a prefix of context+candidate tokens")
                expect(bad, w, f"candidates[{j}].token_ids", x["token_ids"], whole[len(ctx_ids):])
                expect(bad, w, f"candidates[{j}].start", x["start"], len(ctx_ids))
                cands.append(whole[len(ctx_ids):])
            result[(r["idx"], r["condition"])] = (ctx_ids, cands)
        C.add(name, L, "tokenisation (candidate ids, start, context-prefix property)", len(records), bad,
              note=f"tokenizers.Tokenizer from {tok_path}, add_special_tokens=False")
        if bad:
            result = None

    if data_parquet is None or not data_parquet.exists():
        C.skip(name, L, "data parquet (n_rows, content hash, sentence and label per idx)",
               f"data parquet not found ({data_parquet}); labels NOT checked against the data")
    else:
        import pyarrow.parquet as pq
        bad = []
        cols = pq.read_table(data_parquet).to_pydict()
        rows = {int(i): (int(l), s) for i, l, s in zip(cols["idx"], cols["label"], cols["sentence"])}
        expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows))
        content = "".join(f"{i}\t{rows[i][0]}\t{rows[i][1]}\n" for i in sorted(rows))
        expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING), sha256_text(content))
        for r in records:
            w = f"idx {r['idx']} {r['condition']}"
            if r["idx"] not in rows:
                bad.append(f"{w} idx: not in the data")
                continue
            expect(bad, w, "label", r["label"], rows[r["idx"]][0], "label in the data")
            expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(rows[r["idx"]][1]))
        C.add(name, L, "data parquet (n_rows, content hash, sentence and label per idx)", len(records), bad,
              note=str(data_parquet))
    return result


def audit_options_forward(C, name, ident, records, tokens, model_dir):
    """Level 3: every candidate score recomputed with audit.py's own Llama forward pass (llama_logprobs)."""
    L = "forward"
    st = Path(model_dir) / "model.safetensors" if model_dir else None
    if st is None or not st.exists():
        C.skip(name, L, "candidate scores vs both paths", f"model not found ({st}); pass --cache")
        return None
    bad = []
    expect(bad, str(st), "sha256", sha256_file(st), ident.get("model_sha256", MISSING) if ident else MISSING,
           "identity.json model_sha256")
    C.add(name, L, "model file (sha256 == identity.json model_sha256)", 1, bad)
    model, why = None, "needs the identity level's verified token ids (private texts + tokenizer)"
    if tokens is not None:
        import torch
        torch.set_num_threads(THREADS)
        model, why = load_llama(model_dir)
    if model is None:
        C.skip(name, L, "candidate scores vs both paths", why)
        return None
    import torch
    t0 = time.perf_counter()
    bad_s, bad_p, bad_g, max_d = [], [], [], 0.0
    for r in records:
        w = f"idx {r['idx']} {r['condition']}"
        ctx_ids, cand_lists = tokens[(r["idx"], r["condition"])]
        scores, greedy = [], []
        for cand_ids in cand_lists:
            ids = ctx_ids + cand_ids
            rows = llama_logprobs(model, ids[:-1])[len(ctx_ids) - 1:len(ctx_ids) - 1 + len(cand_ids)]
            scores.append(float(rows.gather(1, torch.tensor(cand_ids).unsqueeze(1)).sum()))
            greedy.append(bool((rows.argmax(dim=-1) == torch.tensor(cand_ids)).all()))
        for side in ("official", "independent"):
            for j, (s_new, s_rec) in enumerate(zip(scores, r[side]["scores"])):
                d = abs(s_new - s_rec)
                max_d = max(max_d, d)
                if not d <= FORWARD_TOL:
                    bad_s.append(f"{w} {side}.scores[{j}]: recorded {s_rec!r}, recomputed {s_new!r} "
                                 f"(|diff| {d:.3g} > tolerance {FORWARD_TOL:g})")
            expect(bad_p, w, f"{side}.pred_position", r[side]["pred_position"], argmax_first(scores))
        expect(bad_g, w, "official.is_greedy", r["official"]["is_greedy"], greedy)
    C.add(name, L, "candidate scores vs both paths", sum(len(r["candidates"]) for r in records), bad_s,
          note=f"max |recomputed - recorded| = {max_d:.3g} (tolerance {FORWARD_TOL:g}, audit.py's own Llama forward)")
    C.add(name, L, "predictions (argmax) vs both paths", len(records), bad_p)
    C.add(name, L, "lm-eval is_greedy", len(records), bad_g)
    return {"max_abs_diff": max_d, "tolerance": FORWARD_TOL, "seconds": round(time.perf_counter() - t0, 2)}


def audit_options(C, name, out, levels, cache):
    exp = out / name
    ev = {"environment": read_json(out / "environment.json") if (out / "environment.json").exists() else None}
    for key, fname in zip(("config", "identity", "records", "summary", "stages"), REQUIRED):
        p = exp / fname
        ev[key] = (read_jsonl(p) if fname.endswith(".jsonl") else read_json(p)) if p.exists() else None
    for key in ("config", "identity", "summary", "stages"):
        if ev[key] is not None and not isinstance(ev[key], dict):
            raise Unreadable(f"{exp / (key + '.json')}: line 1: expected a JSON object, found {type(ev[key]).__name__}")
    records, _conds = audit_options_arithmetic(C, name, ev)
    info = {}
    if "identity" in levels or "forward" in levels:
        model_dir, parquet = resolve_cache(ev["config"], cache) if ev["config"] else (None, None)
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        tokens = audit_options_identity(C, name, out, ev["config"], ev["identity"], records, model_dir, parquet)
        if "forward" in levels:
            info["forward"] = audit_options_forward(C, name, ev["identity"], records, tokens, model_dir)
    for level, flag in (("identity", "--tokens"), ("forward", "--forward")):
        if level not in levels:
            C.skip(name, level, "(whole level)", f"not requested (pass {flag})", requested=False)
    return info


RULES["options"] = audit_options


# ---- the harness experiment (seed study 002) ---------------------------------------------------------------------
# One record per example (task, id, prompt/prediction sha256, score, timeout, latency; code_exec adds the code
# sha256 and the sandbox's observed outputs). Rules written out again here (harness/ is not imported):
#   exact_match         lowercase, collapse whitespace, equal;   substring_contains  same, target in prediction
#   multiple_choice     first non-space character of the prediction, uppercased, == target
#   rouge_l             F1 of LCS precision/recall over lowercase whitespace tokens
#   code_exec           fraction of io pairs [x, y] whose recorded sandbox output == canonical JSON of y
#                       (json.dumps(y, sort_keys=True)). The outputs themselves are TRUSTED: audit.py does not
#                       re-run untrusted code; it re-derives the code from the prediction (first ``` block, else
#                       all), checks its sha256, and recomputes the matches and the score from the outputs.
#   example score       the best over targets (code_exec: over io pairs as above); a timed-out example scores 0
#   task                score = mean of example scores in file order, correct = #(score == 1.0), total,
#                       timeouts = #timed out, latency_s = round(sum of example latencies, 4), mean likewise
#   overall             mean of task scores, tasks sorted by name
# Levels: arithmetic (public records/config/summary only: aggregation, selection, code_exec matched/total),
# identity (--tokens: the private task files and private leaderboard: file sha256, prompt hashes, prediction
# hashes, every example score recomputed from prediction + targets). Generations are not re-run (no forward level).

H_SCHEMA = "harness-leaderboard/v1"
H_METRICS = ("exact_match", "substring_contains", "multiple_choice", "rouge_l", "code_exec")
H_RECORD_FIELDS = {"task": lambda v: isinstance(v, str), "id": lambda v: isinstance(v, str),
                   "prompt_sha256": is_sha, "prediction_sha256": lambda v: v is None or is_sha(v),
                   "score": is_num, "timed_out": lambda v: isinstance(v, bool), "latency_s": is_num}


def h_norm(text):
    return " ".join(text.lower().split())


def h_lcs(a, b):
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def h_rouge_l(pred, ref):
    p, r = pred.lower().split(), ref.lower().split()
    lcs = h_lcs(p, r) if p and r else 0
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def h_code_of(prediction):
    """The first ``` fenced block (an unclosed one runs to the end), else the whole prediction."""
    import re

    m = re.search(r"```[^\n`]*\n(.*?)(?:```|\Z)", prediction, re.S)
    return m.group(1) if m else prediction


def h_matches(outputs, io_pairs):
    return [isinstance(o, str) and o == json.dumps(y, sort_keys=True) for o, (_, y) in zip(outputs, io_pairs)]


def h_score(metric, prediction, targets):
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


def audit_harness_arithmetic(C, name, ev):
    cfg, records, summary = ev["config"], ev["records"], ev["summary"]
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    C.add(name, "arithmetic", "required files", len(REQUIRED), [f"{name}/{f}: missing" for f in missing])
    if cfg is None or records is None or summary is None:
        return None
    tasks_cfg = cfg.get("tasks") if isinstance(cfg.get("tasks"), dict) else {}
    names = sorted(tasks_cfg)

    bad = []
    for i, r in enumerate(records):
        where = f"record {i} ({r.get('task')}/{r.get('id')})"
        for f, ok in H_RECORD_FIELDS.items():
            if f not in r or not ok(r[f]):
                bad.append(f"{where} {f}: recorded {short(r.get(f, MISSING))} is missing or malformed")
        if is_num(r.get("score")) and not 0.0 <= r["score"] <= 1.0:
            bad.append(f"{where} score: recorded {r['score']} outside [0, 1]")
    C.add(name, "arithmetic", "record schema", len(records), bad)

    # selection: the records are exactly the first n examples of each task (smoke) or all of them, tasks by name
    bad = []
    split = cfg.get("split")
    n_smoke = get(cfg, "config.harness_smoke_examples")
    expected_keys = []
    for tname in names:
        t = tasks_cfg[tname]
        want = min(n_smoke, t.get("n_in_file", -1)) if split == "smoke" else t.get("n_in_file")
        expect(bad, f"task {tname}", "n_scored", t.get("n_scored"), want, f"split {split}")
        expect(bad, f"task {tname}", "metric", t.get("metric") in H_METRICS, True)
        expected_keys += [(tname, i) for i in (t.get("ids") or [])]
    expect(bad, "records", "(task, id) in order", [(r.get("task"), r.get("id")) for r in records], expected_keys,
           "config.json tasks.*.ids, tasks sorted by name")
    expect(bad, "summary.json", "split", summary.get("split"), split)
    expect(bad, "summary.json", "n_examples", summary.get("n_examples"), len(records))
    C.add(name, "arithmetic", "example selection", len(records), bad)

    # code_exec: score = matched / total, recomputed from the recorded outputs and the io pair count
    bad, n = [], 0
    for r in records:
        metric = tasks_cfg.get(r.get("task"), {}).get("metric")
        where = f"{r.get('task')}/{r.get('id')}"
        if r.get("timed_out") is True:
            expect(bad, where, "score (timed out)", r.get("score"), 0.0)
            expect(bad, where, "prediction_sha256 (timed out)", r.get("prediction_sha256"), None)
            continue
        if metric == "code_exec":
            n += 1
            sb = r.get("sandbox")
            if not isinstance(sb, dict) or not is_int(sb.get("total")) or not isinstance(sb.get("outputs"), list):
                bad.append(f"{where} sandbox: recorded {short(sb)} is missing or malformed")
                continue
            expect(bad, where, "sandbox.outputs length", len(sb["outputs"]), sb["total"])
            expect(bad, where, "score", r.get("score"), sb.get("matched", -1) / sb["total"] if sb["total"] else None,
                   "matched / total")
        elif metric in ("exact_match", "substring_contains", "multiple_choice"):
            if r.get("score") not in (0.0, 1.0):
                bad.append(f"{where} score: recorded {r.get('score')} but {metric} scores only 0 or 1")
    C.add(name, "arithmetic", "example scores (code_exec from sandbox counts, 0/1 metrics)", len(records), bad)

    # task and overall figures, and the leaderboard in summary.json
    bad = []
    tasks, overall = h_aggregate(records, names)
    board = summary.get("leaderboard") if isinstance(summary.get("leaderboard"), dict) else {}
    expect(bad, "summary.json", "leaderboard.schema", board.get("schema"), H_SCHEMA)
    for tname in names:
        rec_t = get(board, f"tasks.{tname}")
        expected = dict(tasks.get(tname, {}), metric=tasks_cfg[tname].get("metric"),
                        sha256=tasks_cfg[tname].get("sha256"), n_examples_in_file=tasks_cfg[tname].get("n_in_file"))
        compare_tree(bad, f"summary.json leaderboard task {tname}", rec_t, expected)
    for extra in sorted(set(board.get("tasks", {})) - set(names)):
        bad.append(f"summary.json leaderboard task {extra}: not in config.json tasks")
    expect(bad, "summary.json", "leaderboard.overall", board.get("overall"), overall, "mean of task scores by name")
    expect(bad, "summary.json", "leaderboard.settings", board.get("settings"), cfg.get("settings"))
    C.add(name, "arithmetic", "task and overall scores", len(names), bad,
          note="sandbox_isolation and latencies are declared measurements, not recomputed")

    # task files vs the shipped fixtures (a claim in summary.json)
    bad = []
    fixtures = Path(__file__).resolve().parent / "fixtures" / "harness_tasks"
    claimed = summary.get("tasks_are_shipped_fixtures") or {}
    for tname in names:
        p = fixtures / f"{tname}.jsonl"
        is_fixture = p.exists() and sha256_file(p) == tasks_cfg[tname].get("sha256")
        expect(bad, f"summary.json tasks_are_shipped_fixtures.{tname}", "", claimed.get(tname), is_fixture)
    C.add(name, "arithmetic", "task files vs shipped fixtures", len(names), bad)
    return tasks_cfg


def audit_harness_identity(C, name, out, records, tasks_cfg):
    priv = out / "private" / name
    board_path, tasks_path = priv / "leaderboard.json", priv / "tasks"
    if not board_path.exists() or not tasks_path.is_dir():
        for check in ("private task files", "example scores from predictions"):
            C.skip(name, "identity", check, f"private/{name}/leaderboard.json or tasks/ absent")
        return
    # the task files scored: bytes hash to config.json's sha256, prompts hash to the records' prompt_sha256
    bad, examples = [], {}
    for tname, t in tasks_cfg.items():
        p = tasks_path / f"{tname}.jsonl"
        if not p.exists():
            bad.append(f"private/{name}/tasks/{tname}.jsonl: missing")
            continue
        expect(bad, f"private/{name}/tasks/{tname}.jsonl", "sha256", sha256_file(p), t.get("sha256"))
        try:
            for n, ex in h_task_examples(p.read_text(encoding="utf-8")):
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
    C.add(name, "identity", "private task files", len(records), bad)

    # every example score from its prediction and targets (code_exec: from the recorded sandbox outputs)
    board = read_json(board_path)
    per_example = board.get("per_example") if isinstance(board, dict) else None
    if not isinstance(per_example, list):
        C.add(name, "identity", "example scores from predictions", 0,
              [f"private/{name}/leaderboard.json: no per_example list"])
        return
    bad = []
    by_key = {(e.get("task"), e.get("id")): e for e in per_example if isinstance(e, dict)}
    expect(bad, f"private/{name}/leaderboard.json", "per_example count", len(per_example), len(records))
    recomputed = []
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
            code = h_code_of(pred)
            expect(bad, where, "code_sha256", r.get("code_sha256"), sha256_text(code), "first ``` block of the prediction")
            outputs = get(e, "details.sandbox.outputs")
            expect(bad, where, "sandbox.outputs (private vs public)", outputs, get(r, "sandbox.outputs"))
            pairs = get(ex, "extras.io_pairs")
            m = h_matches(outputs if isinstance(outputs, list) else [], pairs if isinstance(pairs, list) else [])
            expect(bad, where, "sandbox.matched", get(r, "sandbox.matched"), sum(m), "outputs vs io pairs")
            expect(bad, where, "sandbox.total", get(r, "sandbox.total"), len(pairs) if isinstance(pairs, list) else None)
            score = sum(m) / len(pairs) if isinstance(pairs, list) and pairs else None
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
    C.add(name, "identity", "example scores from predictions", len(records), bad,
          note="code_exec trusts the recorded sandbox outputs (untrusted code is not re-run)")


def audit_harness(C, name, out, levels, cache):
    exp = out / name
    ev = {}
    for key, fname in zip(("config", "identity", "records", "summary", "stages"), REQUIRED):
        p = exp / fname
        ev[key] = (read_jsonl(p) if fname.endswith(".jsonl") else read_json(p)) if p.exists() else None
    for key in ("config", "identity", "summary", "stages"):
        if ev[key] is not None and not isinstance(ev[key], dict):
            raise Unreadable(f"{exp / (key + '.json')}: line 1: expected a JSON object, found {type(ev[key]).__name__}")
    tasks_cfg = audit_harness_arithmetic(C, name, ev)
    if "identity" in levels and tasks_cfg is not None:
        audit_harness_identity(C, name, out, ev["records"], tasks_cfg)
    elif "identity" not in levels:
        C.skip(name, "identity", "(whole level)", "not requested (pass --tokens)", requested=False)
    C.skip(name, "forward", "(whole level)", "generations are not re-run by audit.py (no rule for this level)",
           requested="forward" in levels)
    return {"tasks": sorted(tasks_cfg or {})}


RULES["harness"] = audit_harness


# ---- the extraction experiment (seed study 001) ------------------------------------------------------------------
# One greedy generation per item, scored three ways; a human-audit sample chosen before generation. Every rule is
# written out again here from its definition (experiments/extraction*.py and lm_eval are not imported):
#   exact     [strip(y) == json.dumps({"sentiment": label})]
#   strict    json.loads(y) (no NaN/Infinity) is an object, no duplicate key at any level, keys exactly
#             {"sentiment"}, value "positive"|"negative"; reason = the first failing step of EXT_STRICT_REASONS
#   regex     re.findall(r"(?i)\b(positive|negative)\b", y): first match (stripped) or the fallback; prediction
#             = match lowercased; correct = prediction == label (audit.py uses Python's re here, a third
#             implementation next to lm-eval's RegexFilter and the experiment's character scan)
#   sample    per class, rank idx by sha256(f"{salt}:{idx}"), first per_class, interleave (lowest label first)
#   review    (--review SHEET) over decidable items (stance positive/negative) with an undisputed reference:
#             disagreement = [regex correct != human content_correct]; FP = regex right, human wrong; FN = the
#             reverse; class-weighted estimate (weights N_c/n_c) only when every sampled item is decidable

REVIEW_SHEET = None          # --review SHEET: a filled review sheet exported by the extraction review page
EXT_PREREG = "extraction.preregistration.json"
EXT_SHEET_FORMAT = "extraction-review-sheet/v1"
EXT_STANCES = ("positive", "negative", "uncertain", "no_conclusion")
EXT_STRICT_REASONS = ("empty", "code_fence", "not_json", "not_object", "duplicate_key", "missing_key", "extra_keys",
                      "bad_value", "wrong_label")
EXT_CATEGORIES = ("no_match", "several_matches", "conflicting_matches", "format_failure", "length_stop")
EXT_SCORERS = ("exact", "strict", "regex")
EXT_REVIEW_KEYS = ("sheet", "n_reviewed", "n_decidable_undisputed", "disagreement_rate", "false_positives",
                   "false_negatives", "weighted_disagreement_rate")
EXT_RECORD_FIELDS = {
    "idx": is_int, "rank": is_int, "label": is_int, "label_name": lambda v: isinstance(v, str),
    "sentence_sha256": is_sha, "user_message_sha256": is_sha, "prompt_sha256": is_sha, "input_tokens": is_int,
    "generated_tokens": is_int, "finish_reason": lambda v: v in ("eos", "length"), "generation_sha256": is_sha,
    "generated_ids_sha256": is_sha, "exact": lambda v: isinstance(v, dict), "strict": lambda v: isinstance(v, dict),
    "regex": lambda v: isinstance(v, dict), "categories": lambda v: isinstance(v, dict),
    "lm_eval_generate_until": lambda v: isinstance(v, dict),
    "audit_position": lambda v: v is None or is_int(v),
}
EXT_SUB_FIELDS = {
    "exact": {"correct": lambda v: v in (0, 1) and is_int(v)},
    "strict": {"reason": lambda v: v is None or v in EXT_STRICT_REASONS, "format_ok": is_int, "correct": is_int},
    "regex": {"official": lambda v: isinstance(v, str), "independent": lambda v: isinstance(v, str),
              "n_matches": is_int, "pred": lambda v: v is None or isinstance(v, str), "correct": is_int},
    "categories": {k: is_int for k in EXT_CATEGORIES},
    "lm_eval_generate_until": {"identical": lambda v: v is None or isinstance(v, bool),
                               "input_ids_identical": lambda v: v is None or isinstance(v, bool),
                               "text_sha256": lambda v: v is None or is_sha(v)},
}


def ext_strict_reason(text, label, labels):
    if text.strip() == "":
        return "empty"
    dups = []

    def hook(pairs):
        if len({k for k, _ in pairs}) != len(pairs):
            dups.append(pairs)
        return dict(pairs)

    def no_constants(name):
        raise ValueError(name)

    try:
        obj = json.loads(text, object_pairs_hook=hook, parse_constant=no_constants)
    except (ValueError, RecursionError):
        return "code_fence" if "```" in text else "not_json"
    if not isinstance(obj, dict):
        return "not_object"
    if dups:
        return "duplicate_key"
    if "sentiment" not in obj:
        return "missing_key"
    if set(obj) != {"sentiment"}:
        return "extra_keys"
    if not (isinstance(obj["sentiment"], str) and obj["sentiment"] in labels):
        return "bad_value"
    return "wrong_label" if obj["sentiment"] != label else None


def ext_regex(labels):
    import re
    return re.compile(r"(?i)\b(" + "|".join(re.escape(l) for l in labels) + r")\b")


def ext_scores_from_text(text, label, finish, labels, fallback):
    """Every per-item score and category recomputed from the generated text (what records.jsonl must say)."""
    found = ext_regex(labels).findall(text)
    extracted = found[0].strip() if found else fallback
    reason = ext_strict_reason(text, label, labels)
    pred = None if extracted == fallback or extracted.lower() not in labels else extracted.lower()
    return {
        "exact": {"correct": int(text.strip() == json.dumps({"sentiment": label}))},
        "strict": {"reason": reason, "format_ok": int(reason in (None, "wrong_label")), "correct": int(reason is None)},
        "regex": {"official": extracted, "independent": extracted, "n_matches": len(found), "pred": pred,
                  "correct": int(pred == label)},
        "categories": {"no_match": int(not found), "several_matches": int(len(found) > 1),
                       "conflicting_matches": int(len({m.lower() for m in found}) > 1),
                       "format_failure": int(reason not in (None, "wrong_label")),
                       "length_stop": int(finish == "length")},
    }


def ext_sample(idx_labels, salt, per_class):
    by = {}
    for i, l in idx_labels:
        by.setdefault(l, []).append(i)
    chosen = {c: sorted(v, key=lambda i: sha256_text(f"{salt}:{i}"))[:per_class] for c, v in by.items()}
    order = [(chosen[c][k], c) for k in range(per_class) for c in sorted(chosen) if k < len(chosen[c])]
    return [{"position": p + 1, "idx": i, "label": c, "rank_key": sha256_text(f"{salt}:{i}")}
            for p, (i, c) in enumerate(order)]


def ext_record_problems(r):
    where = f"idx {r.get('idx', '?')}" if isinstance(r, dict) else "record"
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = [f"{where} {k}: missing" if k not in r else f"{where} {k}: wrong type ({short(r[k], 60)})"
           for k, ok in EXT_RECORD_FIELDS.items() if k not in r or not ok(r[k])]
    bad += [f"{where} {k}: a field audit.py has no rule for" for k in r if k not in EXT_RECORD_FIELDS]
    for sub, fields in EXT_SUB_FIELDS.items():
        d = r.get(sub)
        if not isinstance(d, dict):
            continue
        bad += [f"{where} {sub}.{k}: missing" if k not in d else f"{where} {sub}.{k}: wrong type ({short(d[k], 60)})"
                for k, ok in fields.items() if k not in d or not ok(d[k])]
        bad += [f"{where} {sub}.{k}: a field audit.py has no rule for" for k in d if k not in fields]
    return bad


def ext_paired(rec, a, b, idx):
    ra, rb = rec[a], rec[b]
    return {"a": a, "b": b, "both_correct": sum(bool(ra[i] and rb[i]) for i in idx),
            "neither": sum(bool(not ra[i] and not rb[i]) for i in idx),
            "only_a": sum(bool(ra[i] and not rb[i]) for i in idx), "only_b": sum(bool(rb[i] and not ra[i]) for i in idx),
            "only_a_idx": [i for i in idx if ra[i] and not rb[i]], "only_b_idx": [i for i in idx if rb[i] and not ra[i]]}


def ext_expected_summary(name, split, records, labels, lm_ran, prereg_sha, prereg_items, review_note):
    n = len(records)
    idx = [r["idx"] for r in records]
    corr = {s: {r["idx"]: r[s]["correct"] for r in records} for s in EXT_SCORERS}
    preds = [r["regex"]["pred"] for r in records]
    patterns = {}
    for r in records:
        patterns.setdefault("".join(str(r[s]["correct"]) for s in EXT_SCORERS), []).append(r["idx"])
    cats = {k: sum(r["categories"][k] for r in records) for k in EXT_CATEGORIES}
    lm = [r["lm_eval_generate_until"] for r in records]
    if lm_ran:
        gen = {"n_compared": n, "n_identical": sum(bool(x["identical"]) for x in lm),
               "n_input_ids_identical": sum(bool(x["input_ids_identical"]) for x in lm)}
        gen.update(all_identical=gen["n_identical"] == n and gen["n_input_ids_identical"] == n,
                   mismatch_idx=[r["idx"] for r in records if not r["lm_eval_generate_until"]["identical"]], ran=True)
    else:
        gen = {"ran": False, "n_compared": 0, "n_identical": None, "n_input_ids_identical": None,
               "all_identical": None, "mismatch_idx": []}
    return {
        "experiment": name, "split": split, "confirmation_items_scored": split == "confirm", "n_items": n,
        "label_counts": {str(k): sum(r["label"] == k for r in records) for k in range(len(labels))},
        "constant_answer_baselines": {f"always_{l}": sum(r["label_name"] == l for r in records) for l in labels},
        "scorers": {
            "exact": {"correct": sum(corr["exact"].values()), "accuracy": sum(corr["exact"].values()) / n},
            "strict": {"correct": sum(corr["strict"].values()), "accuracy": sum(corr["strict"].values()) / n,
                       "format_ok": sum(r["strict"]["format_ok"] for r in records),
                       "reasons": {k: sum(r["strict"]["reason"] == k for r in records) for k in EXT_STRICT_REASONS}},
            "regex": {"correct": sum(corr["regex"].values()), "accuracy": sum(corr["regex"].values()) / n,
                      "pred_counts": {**{l: preds.count(l) for l in labels}, "none": preds.count(None)}},
        },
        "paired": {f"{a}_vs_{b}": ext_paired(corr, a, b, idx)
                   for a, b in (("exact", "strict"), ("exact", "regex"), ("strict", "regex"))},
        "patterns": {k: {"n": len(v), "idx": v} for k, v in sorted(patterns.items())},
        "match_failures": {"all": cats,
                           "regex_wrong": {k: sum(r["categories"][k] for r in records if not r["regex"]["correct"])
                                           for k in EXT_CATEGORIES},
                           "regex_right": {k: sum(r["categories"][k] for r in records if r["regex"]["correct"])
                                           for k in EXT_CATEGORIES}},
        "finish_reasons": {k: sum(r["finish_reason"] == k for r in records) for k in ("eos", "length")},
        "regex_agreement": {"n_items": n, "n_mismatches": sum(r["regex"]["official"] != r["regex"]["independent"]
                                                               for r in records)},
        "lm_eval_generate_until": gen,
        "audit_sample": {"preregistration_sha256": prereg_sha, "n": len(prereg_items),
                         "idx": [s["idx"] for s in prereg_items],
                         "per_class": {str(k): sum(s["label"] == k for s in prereg_items) for k in range(len(labels))}},
        # a run never has human-review figures: they are null until a sheet is imported here (--review)
        "human_review": {**{k: None for k in EXT_REVIEW_KEYS}, "note": review_note},
    }


def ext_load(out, name):
    exp = out / name
    ev = {"environment": read_json(out / "environment.json") if (out / "environment.json").exists() else None}
    for key, fname in zip(("config", "identity", "records", "summary", "stages"), REQUIRED):
        p = exp / fname
        ev[key] = (read_jsonl(p) if fname.endswith(".jsonl") else read_json(p)) if p.exists() else None
    for key in ("config", "identity", "summary", "stages"):
        if ev[key] is not None and not isinstance(ev[key], dict):
            raise Unreadable(f"{exp / (key + '.json')}: line 1: expected a JSON object, found {type(ev[key]).__name__}")
    p = out / EXT_PREREG
    ev["prereg_text"] = p.read_text(encoding="utf-8") if p.exists() else None
    gp = out / "private" / name / "generations.jsonl"
    ev["generations"] = read_jsonl(gp) if gp.exists() else None
    return ev


def audit_extraction_arithmetic(C, name, out, ev):
    """Level 1 (+ the scorers recomputed from the private generations when present). Returns the records when the
    deeper levels and the review may use them, else None."""
    A = "arithmetic"
    cfg, ident, records, summ, stages = (ev.get(k) for k in ("config", "identity", "records", "summary", "stages"))
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    if ev["environment"] is None:
        missing.insert(0, "../environment.json")
    if ev["prereg_text"] is None:
        missing.append(f"../{EXT_PREREG}")
    C.add(name, A, "required files (+ the pre-registration written before generation)", len(REQUIRED) + 2,
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    if cfg is None or records is None:
        C.skip(name, A, "(rest of the level)", "config.json or records.jsonl missing; nothing to recompute from")
        return None

    # -- config consistency --
    bad = []
    conf = cfg.get("config") if isinstance(cfg.get("config"), dict) else {}
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split = cfg.get("split")
    labels = conf.get("extraction_labels")
    if not (isinstance(labels, list) and len(labels) >= 2 and all(isinstance(l, str) for l in labels)):
        bad.append(f"config.json config.extraction_labels: {short(labels)} is not a list of label names")
        labels = ["negative", "positive"]
    fallback = conf.get("extraction_regex_fallback")
    if not isinstance(fallback, str):
        bad.append(f"config.json config.extraction_regex_fallback: {short(fallback)} is not a string")
        fallback = "[invalid]"
    n_new, limit = conf.get("extraction_max_new_tokens"), conf.get("max_input_tokens")
    if not (is_int(n_new) and n_new > 0 and is_int(limit) and limit > 0):
        bad.append(f"config.json: max_new_tokens {short(n_new)} / max_input_tokens {short(limit)} are not positive ints")
    if split not in SPLITS:
        bad.append(f"config.json split: {short(split)} is not one of {SPLITS}")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    expect(bad, "config.json", "selection.split", sel.get("split", MISSING), split)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING),
           split == "confirm")
    for sel_key, conf_key in (("salt", "selection_salt"), ("n_dev", "n_dev"), ("n_confirm", "n_confirm"),
                              ("n_smoke", "n_smoke"), ("rule", "selection_rule")):
        expect(bad, "config.json", f"selection.{sel_key}", sel.get(sel_key, MISSING), conf.get(conf_key, MISSING))
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("data", MISSING))
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), conf.get("model", MISSING))
    # the alternatives have distinct first letters and equal length, so their order cannot change a match
    import itertools
    rx = conf.get("extraction_regex", MISSING)
    allowed = [r"(?i)\b(" + "|".join(p) + r")\b" for p in itertools.permutations(labels)]
    if rx not in allowed:
        bad.append(f"config.json config.extraction_regex: {short(rx)} is not the first-match whole-word "
                   f"case-insensitive rule over the label names ({allowed[0]!r})")
    expect(bad, "config.json", "official.filter_list", get(cfg, "official.filter_list"),
           [{"name": "extract", "filter": [{"function": "regex", "regex_pattern": rx, "group_select": 0,
                                            "fallback": fallback}, {"function": "take_first"}]}],
           "lm-eval filters: regex (first match) then take_first")
    expect(bad, "config.json", "generation.generate_call.do_sample", get(cfg, "generation.generate_call.do_sample"),
           False, "greedy")
    expect(bad, "config.json", "generation.generate_call.max_new_tokens",
           get(cfg, "generation.generate_call.max_new_tokens"), n_new)
    lm_meta = get(cfg, "official.generate_until")
    lm_ran = isinstance(lm_meta, dict)
    expect(bad, "config.json", "official.generate_until (ran)", lm_ran, conf.get("extraction_crosscheck_lm_eval") is True,
           "config.extraction_crosscheck_lm_eval")
    if lm_ran:
        expect(bad, "config.json", "official.generate_until.gen_kwargs", lm_meta.get("gen_kwargs", MISSING),
               {"until": [], "max_gen_toks": n_new, "do_sample": False}, "stop only at eos, greedy")
        expect(bad, "config.json", "official.generate_until.hflm.max_length", get(lm_meta, "hflm.max_length"),
               limit + n_new if is_int(limit) and is_int(n_new) else MISSING, "no left truncation of admissible input")
    if ident is not None:
        check_scoring_identity(bad, conf, ident)
        expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
               sha256_text(json.dumps(cfg.get("official"), sort_keys=True)), "sha256 of config.json official")
        tmpl = conf.get("extraction_user_prompt")
        expect(bad, "config.json", "prompt.user_template", get(cfg, "prompt.user_template"), tmpl)
        if isinstance(tmpl, str):
            expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
                   sha256_text(tmpl))
        for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                         ("data_content_sha256", "data_content_sha256")):
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
        bad += [f"identity.json {k}: a field audit.py has no rule for" for k in ident
                if k not in IDENTITY_RECOMPUTED | IDENTITY_DECLARED]
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split)
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING), conf.get("threads", MISSING))
    C.add(name, A, "config consistency (split, selection, scorers, greedy settings, identity.json)", 1, bad,
          note="CONFIRMATION SPLIT SCORED" if split == "confirm" else "")

    bad = []
    for r in records:
        bad += ext_record_problems(r)
    C.add(name, A, "record fields and types", len(records), bad)
    if bad:
        C.skip(name, A, "(rest of the level)", "records.jsonl has malformed records (see 'record fields and types')")
        return None

    # -- selection --
    bad = []
    idx_list = [r["idx"] for r in records]
    want, why = (None, "selection settings in config.json are unusable")
    if all(is_int(x) for x in (cfg.get("n_rows"), sel.get("n_dev"), sel.get("n_confirm"), sel.get("n_smoke"))) \
            and isinstance(sel.get("salt"), str):
        want, why = select_items(split, sel["salt"], cfg["n_rows"], sel["n_dev"], sel["n_confirm"], sel["n_smoke"])
    if want is None:
        bad.append(f"config.json selection: {why}")
    else:
        expect(bad, "records.jsonl", "idx (in rank order)", idx_list, want, "the selection hash rule")
        expect(bad, "config.json", "selection.item_idx", sel.get("item_idx", MISSING), want)
    for rank, r in enumerate(records):
        expect(bad, f"idx {r['idx']}", "rank", r["rank"], rank, "line position")
        if not 0 <= r["label"] < len(labels):
            bad.append(f"idx {r['idx']} label: {r['label']} is not a label index")
        else:
            expect(bad, f"idx {r['idx']}", "label_name", r["label_name"], labels[r["label"]])
    C.add(name, A, "item selection (hash rule, rank order, labels)", len(records), bad)

    # -- the pre-registered audit sample: recomputed from idx and labels only; written before generation --
    bad = []
    prereg_cfg = get(cfg, "audit_sample")
    prereg = None
    if ev["prereg_text"] is None:
        bad.append(f"{EXT_PREREG}: missing; the sample cannot be shown to predate the generations")
    else:
        expect(bad, EXT_PREREG, "sha256", sha256_text(ev["prereg_text"]),
               get(cfg, "audit_sample.preregistration_sha256"), "config.json audit_sample.preregistration_sha256")
        try:
            prereg = json.loads(ev["prereg_text"])
        except json.JSONDecodeError as e:
            raise Unreadable(f"{out / EXT_PREREG}: line {e.lineno}: unparseable JSON ({e.msg})")
        expect(bad, "config.json", "audit_sample.preregistration", get(cfg, "audit_sample.preregistration"), prereg,
               f"must be the content of {EXT_PREREG}")
    if isinstance(prereg, dict):
        salt, per = prereg.get("salt"), prereg.get("per_class")
        expect(bad, EXT_PREREG, "salt", salt, conf.get("extraction_audit_salt", MISSING))
        expect(bad, EXT_PREREG, "per_class", per, conf.get("extraction_audit_per_class", MISSING))
        expect(bad, EXT_PREREG, "split", prereg.get("split", MISSING), split)
        expect(bad, EXT_PREREG, "population.item_idx", get(prereg, "population.item_idx"), idx_list)
        expect(bad, EXT_PREREG, "population.labels", get(prereg, "population.labels"), [r["label"] for r in records])
        expect(bad, EXT_PREREG, "population.data_content_sha256", get(prereg, "population.data_content_sha256"),
               cfg.get("data_content_sha256", MISSING))
        items = prereg.get("items") if isinstance(prereg.get("items"), list) else []
        if isinstance(salt, str) and is_int(per):
            want_s = ext_sample([(r["idx"], r["label"]) for r in records], salt, per)
            got_s = [{k: s.get(k) for k in ("position", "idx", "label", "rank_key")} if isinstance(s, dict) else s
                     for s in items]
            expect(bad, EXT_PREREG, "items (position, idx, label, rank_key)", got_s, want_s,
                   "recomputed from idx, labels, salt and per_class")
            pop, got_n = {}, {}
            for r in records:
                pop[r["label"]] = pop.get(r["label"], 0) + 1
            for s in want_s:
                got_n[s["label"]] = got_n.get(s["label"], 0) + 1
            expect(bad, EXT_PREREG, "class_weights", prereg.get("class_weights", MISSING),
                   {str(c): {"population": pop[c], "sampled": got_n.get(c, 0),
                             "weight": f"{pop[c]}/{got_n[c]}" if got_n.get(c) else None,
                             "weight_float": pop[c] / got_n[c] if got_n.get(c) else None} for c in sorted(pop)})
        by_idx = {r["idx"]: r for r in records}
        for s in items:
            if not isinstance(s, dict) or s.get("idx") not in by_idx:
                bad.append(f"{EXT_PREREG} items: {short(s, 60)} is not a scored item")
                continue
            r = by_idx[s["idx"]]
            expect(bad, f"idx {s['idx']}", "pre-registered sentence_sha256", s.get("sentence_sha256"),
                   r["sentence_sha256"])
            expect(bad, f"idx {s['idx']}", "pre-registered label_name", s.get("label_name"), r["label_name"])
        positions = {s.get("idx"): s.get("position") for s in items if isinstance(s, dict)}
        for r in records:
            expect(bad, f"idx {r['idx']}", "audit_position", r["audit_position"], positions.get(r["idx"]))
        created, started = prereg.get("created_at_utc"), get(cfg, "generation.generation_started_utc")
        try:
            from datetime import datetime
            if not datetime.fromisoformat(created) < datetime.fromisoformat(started):
                bad.append(f"{EXT_PREREG} created_at_utc: {created} is not before the generation started ({started})")
        except (TypeError, ValueError):
            bad.append(f"{EXT_PREREG} created_at_utc / config.json generation.generation_started_utc: "
                       f"{short(created)} / {short(started)} are not comparable ISO times")
        if stages is not None and isinstance(stages.get("stages"), list):
            names = [s.get("name") for s in stages["stages"] if isinstance(s, dict)]
            if not ("audit_sample_preregistration" in names and "model_load" in names
                    and names.index("audit_sample_preregistration") < names.index("model_load")):
                bad.append("stages.json: the audit sample was not written before the model was loaded "
                           f"(stages {names})")
    C.add(name, A, "audit sample (recomputed from idx/labels/salt; written before the model was loaded)",
          len(prereg.get("items", [])) if isinstance(prereg, dict) else 0, bad)

    # -- per-item consistency from the public fields alone --
    bad = []
    for r in records:
        w, rx, st, ca = f"idx {r['idx']}", r["regex"], r["strict"], r["categories"]
        expect(bad, w, "regex.independent", rx["independent"], rx["official"],
               "lm-eval's extraction and the independent one must agree")
        low = rx["official"].lower()
        pred = None if rx["official"] == fallback or low not in labels else low
        expect(bad, w, "regex.pred", rx["pred"], pred, "the official extraction lowercased")
        expect(bad, w, "regex.correct", rx["correct"], int(pred == r["label_name"]))
        expect(bad, w, "strict.format_ok", st["format_ok"], int(st["reason"] in (None, "wrong_label")))
        expect(bad, w, "strict.correct", st["correct"], int(st["reason"] is None))
        if st["reason"] is None and rx["correct"] != 1:
            bad.append(f"{w} regex.correct: a strictly correct answer has the label as its only sentiment word")
        if r["exact"]["correct"] and st["reason"] is not None:
            bad.append(f"{w} strict.reason: the canonical string is strictly valid, found {st['reason']!r}")
        expect(bad, w, "categories.no_match", ca["no_match"], int(rx["n_matches"] == 0))
        expect(bad, w, "categories.no_match vs fallback", ca["no_match"], int(rx["official"] == fallback))
        expect(bad, w, "categories.several_matches", ca["several_matches"], int(rx["n_matches"] > 1))
        if ca["conflicting_matches"] and not ca["several_matches"]:
            bad.append(f"{w} categories.conflicting_matches: conflicting matches need several matches")
        expect(bad, w, "categories.format_failure", ca["format_failure"], int(st["reason"] not in (None, "wrong_label")))
        expect(bad, w, "categories.length_stop", ca["length_stop"], int(r["finish_reason"] == "length"))
        if is_int(n_new):
            if r["finish_reason"] == "length" and r["generated_tokens"] != n_new:
                bad.append(f"{w} generated_tokens: {r['generated_tokens']} with a length stop (limit {n_new})")
            if not 1 <= r["generated_tokens"] <= n_new:
                bad.append(f"{w} generated_tokens: {r['generated_tokens']} outside 1..{n_new}")
        if is_int(limit) and not 1 <= r["input_tokens"] <= limit:
            bad.append(f"{w} input_tokens: {r['input_tokens']} outside 1..{limit} (over the limit is an error)")
        lm = r["lm_eval_generate_until"]
        if lm_ran:
            if lm["identical"] is None or lm["text_sha256"] is None:
                bad.append(f"{w} lm_eval_generate_until: the cross-check ran but this item has no result")
            else:
                expect(bad, w, "lm_eval_generate_until.identical", lm["identical"],
                       lm["text_sha256"] == r["generation_sha256"], "text sha256 equality")
        elif any(v is not None for v in lm.values()):
            bad.append(f"{w} lm_eval_generate_until: results recorded but the cross-check did not run")
    C.add(name, A, "per-item scores and categories (consistency of the public fields)", len(records), bad)

    # -- the scorers recomputed from the private generations --
    gens = ev["generations"]
    if gens is None:
        C.skip(name, A, "scores recomputed from the private generations",
               f"private/{name}/generations.jsonl absent (private evidence not shipped); exact/strict/regex scores "
               "checked for consistency only, NOT recomputed from the texts")
    else:
        bad, by = [], {}
        for n_line, g in enumerate(gens, start=1):
            if not (isinstance(g, dict) and is_int(g.get("idx")) and all(isinstance(g.get(k), str) for k in (
                    "sentence", "user_message", "prompt", "generation"))
                    and isinstance(g.get("generated_ids"), list) and all(is_int(t) for t in g["generated_ids"])):
                bad.append(f"private/{name}/generations.jsonl line {n_line}: malformed ({short(g, 60)})")
                continue
            if g["idx"] in by:
                bad.append(f"idx {g['idx']} private generations: duplicated (line {n_line})")
            by[g["idx"]] = g
        bad += [f"idx {i} private generations: no record for this idx" for i in by if i not in set(idx_list)]
        tmpl = conf.get("extraction_user_prompt")
        for r in records:
            g, w = by.get(r["idx"]), f"idx {r['idx']}"
            if g is None:
                bad.append(f"{w} private generations: missing")
                continue
            expect(bad, w, "sentence_sha256", r["sentence_sha256"], sha256_text(g["sentence"]))
            expect(bad, w, "user_message_sha256", r["user_message_sha256"], sha256_text(g["user_message"]))
            expect(bad, w, "prompt_sha256", r["prompt_sha256"], sha256_text(g["prompt"]))
            expect(bad, w, "generation_sha256", r["generation_sha256"], sha256_text(g["generation"]))
            expect(bad, w, "generated_ids_sha256", r["generated_ids_sha256"], sha256_text(json.dumps(g["generated_ids"])))
            expect(bad, w, "generated_tokens", r["generated_tokens"], len(g["generated_ids"]))
            if isinstance(tmpl, str):
                expect(bad, w, "user_message", g["user_message"], tmpl.replace("{sentence}", g["sentence"]),
                       "config.extraction_user_prompt filled with the sentence")
            if g["user_message"] not in g["prompt"]:
                bad.append(f"{w} prompt: does not contain the user message")
            want = ext_scores_from_text(g["generation"], r["label_name"], r["finish_reason"], labels, fallback)
            for part in ("exact", "strict", "regex", "categories"):
                for k, v in want[part].items():
                    expect(bad, w, f"{part}.{k}", r[part][k], v, "recomputed from the private generation")
            if lm_ran and isinstance(g.get("lm_eval_generation"), str):
                expect(bad, w, "lm_eval_generate_until.text_sha256", r["lm_eval_generate_until"]["text_sha256"],
                       sha256_text(g["lm_eval_generation"]), "sha256 of the private lm-eval generation")
            elif lm_ran:
                bad.append(f"{w} private lm_eval_generation: missing")
        C.add(name, A, "scores recomputed from the private generations (exact, strict, regex, categories)",
              len(records), bad, note="audit.py's own scorers (Python re for the regex), no lm_eval")

    # -- summary.json and stages.json --
    prereg_items = prereg.get("items", []) if isinstance(prereg, dict) else []
    prereg_items = [s for s in prereg_items if isinstance(s, dict)]
    if summ is None:
        C.skip(name, A, "summary.json values", "summary.json missing (named under 'required files')")
    else:
        bad = []
        note = get(summ, "human_review.note")
        if not isinstance(note, str):
            bad.append("summary.json human_review.note: not a string")
        compare_tree(bad, "summary.json", summ, ext_expected_summary(
            name, split, records, labels, lm_ran, get(cfg, "audit_sample.preregistration_sha256"), prereg_items,
            note if isinstance(note, str) else MISSING))
        C.add(name, A, "summary.json values (counts, paired tables, categories; human-review figures null)",
              len(records), bad)
    if stages is None:
        C.skip(name, A, "stages.json token counts", "stages.json missing (named under 'required files')")
    else:
        bad = []
        it, gt = [r["input_tokens"] for r in records], [r["generated_tokens"] for r in records]
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), {
            "input_tokens": {"min": min(it), "max": max(it), "total": sum(it)},
            "generated_tokens": {"min": min(gt), "max": max(gt), "total": sum(gt), "includes_eos": True},
            "n_items": len(records)}, "tokens.")
        C.add(name, A, "stages.json token counts", len(records), bad,
              note="wall times and RSS are measurements: not recomputed")
    return records


def audit_extraction_identity(C, name, out, cfg, ident, records, gens, model_dir, data_parquet):
    """Level 2: prompt re-rendered from the chat template and re-tokenised, generated ids decoded back to the text,
    finish reasons from the ids, and labels/sentences against the data parquet. Returns {idx: (prompt ids,
    generated ids)} for the forward level, or None."""
    L = "identity"
    if records is None:
        C.skip(name, L, "(whole level)", "the arithmetic level found the evidence unusable")
        return None
    result = None
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    if gens is None:
        C.skip(name, L, "tokenisation (prompt ids, generated ids -> text, finish reason)",
               "needs the private generations (absent)")
    elif tok_path is None or not tok_path.exists():
        C.skip(name, L, "tokenisation (prompt ids, generated ids -> text, finish reason)",
               f"tokenizer not found ({tok_path}); pass --cache with the prepared cache")
    else:
        bad = []
        tok = load_tokenizer(tok_path)
        expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
               if ident else MISSING, "identity.json tokenizer_sha256")
        eos_id, eos_tok = get(cfg, "generation.eos_token_id"), get(cfg, "generation.eos_token")
        if not is_int(eos_id) or tok.id_to_token(eos_id) != eos_tok:
            bad.append(f"config.json generation.eos_token_id: {short(eos_id)} is not {short(eos_tok)} in {tok_path}")
        n_new = get(cfg, "config.extraction_max_new_tokens")
        by = {g["idx"]: g for g in gens if isinstance(g, dict) and is_int(g.get("idx"))}
        # the chat template, rendered as transformers does (jinja2 sandbox, trim_blocks, lstrip_blocks)
        template, render = None, None
        tc = model_dir / "tokenizer_config.json"
        if tc.exists():
            template = read_json(tc).get("chat_template")
        if template is None and (model_dir / "chat_template.jinja").exists():
            template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            if isinstance(template, str):
                render = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
        except ImportError:
            render = None
        if isinstance(template, str):
            expect(bad, "config.json", "prompt.chat_template_sha256", get(cfg, "prompt.chat_template_sha256"),
                   sha256_text(template), f"the chat template in {model_dir}")
        result = {}
        for r in records:
            g, w = by.get(r["idx"]), f"idx {r['idx']}"
            if g is None:
                bad.append(f"{w}: no private generation")
                continue
            if render is not None:
                expect(bad, w, "prompt", g["prompt"], render.render(
                    messages=[{"role": "user", "content": g["user_message"]}], add_generation_prompt=True),
                    "the chat template rendered with the user message")
            ids = tok.encode(g["prompt"], add_special_tokens=False).ids
            expect(bad, w, "input_tokens", r["input_tokens"], len(ids), "re-tokenised prompt")
            gen = g["generated_ids"]
            ends_eos = bool(gen) and gen[-1] == eos_id
            expect(bad, w, "finish_reason", r["finish_reason"], "eos" if ends_eos else "length",
                   "from the generated ids")
            if eos_id in gen[:-1]:
                bad.append(f"{w} generated_ids: eos before the end")
            if not ends_eos and is_int(n_new) and len(gen) != n_new:
                bad.append(f"{w} generated_ids: {len(gen)} ids without eos, the limit is {n_new}")
            text_ids = gen[:-1] if ends_eos else gen
            expect(bad, w, "generation", g["generation"], tok.decode(text_ids, skip_special_tokens=False),
                   "the generated ids decoded (final eos removed)")
            result[r["idx"]] = (ids, gen)
        C.add(name, L, "tokenisation (prompt ids, generated ids -> text, finish reason)", len(records), bad,
              note=("chat template re-rendered with jinja2" if render is not None
                    else "jinja2 or the chat template unavailable: prompt NOT re-rendered"))
        if bad:
            result = None
    if data_parquet is None or not data_parquet.exists():
        C.skip(name, L, "data parquet (label and sentence per idx)", f"data parquet not found ({data_parquet})")
    else:
        import pyarrow.parquet as pq
        bad = []
        cols = pq.read_table(data_parquet).to_pydict()
        rows = {int(i): (int(l), s) for i, l, s in zip(cols["idx"], cols["label"], cols["sentence"])}
        expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows), f"rows in {data_parquet}")
        content = "".join(f"{i}\t{rows[i][0]}\t{rows[i][1]}\n" for i in sorted(rows))
        expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING), sha256_text(content))
        for r in records:
            if r["idx"] not in rows:
                bad.append(f"idx {r['idx']} idx: not in the data")
                continue
            expect(bad, f"idx {r['idx']}", "label", r["label"], rows[r["idx"]][0], "label in the data")
            expect(bad, f"idx {r['idx']}", "sentence_sha256", r["sentence_sha256"], sha256_text(rows[r["idx"]][1]))
        C.add(name, L, "data parquet (label and sentence per idx)", len(records), bad, note=str(data_parquet))
    return result


def audit_extraction_forward(C, name, ident, records, tokens, model_dir):
    """Level 3: audit.py's own Llama forward over prompt + generation; every generated token must be the argmax
    (greedy) at its position, up to a numerical near-tie (top-1 minus recorded token log-prob <= FORWARD_TOL)."""
    L = "forward"
    if tokens is None:
        C.skip(name, L, "greedy tokens (argmax at every generated position)",
               "needs verified prompt and generated ids from the identity level")
        return None
    model, why = load_llama(model_dir)
    if model is None:
        C.skip(name, L, "greedy tokens (argmax at every generated position)", why)
        return None
    import torch
    torch.set_num_threads(THREADS)
    bad, ties, min_margin = [], 0, None
    expect(bad, str(model_dir / "model.safetensors"), "sha256", sha256_file(model_dir / "model.safetensors"),
           ident.get("model_sha256", MISSING) if ident else MISSING, "identity.json model_sha256")
    n_pos = 0
    for r in records:
        ids, gen = tokens[r["idx"]]
        seq = ids + gen
        key = (model[0], tuple(seq[:-1]))
        lp = llama_logprobs(model, seq[:-1])
        _SCORES.pop(key, None)       # one use per sequence: do not keep 20 MB per item
        for k, t in enumerate(gen):
            row = lp[len(ids) - 1 + k]
            top = int(torch.argmax(row))
            n_pos += 1
            if top != t:
                gap = float(row[top] - row[t])
                if gap <= FORWARD_TOL:
                    ties += 1
                else:
                    bad.append(f"idx {r['idx']} generated_ids[{k}]: {t} is not the greedy token ({top}, "
                               f"log-prob gap {gap:.3g})")
            else:
                second = float(torch.topk(row, 2).values[1])
                margin = float(row[t]) - second
                min_margin = margin if min_margin is None else min(min_margin, margin)
    C.add(name, L, "greedy tokens (argmax at every generated position)", len(records), bad,
          note=f"{n_pos} positions, {ties} numerical near-ties, smallest top-1 margin "
               f"{min_margin if min_margin is None else round(min_margin, 6)} (max |recomputed - greedy| tol "
               f"{FORWARD_TOL:g})")
    return {"positions": n_pos, "near_ties": ties, "min_margin": min_margin}


def ext_review(sheet_path, cfg, records):
    """Import a review sheet. Returns (figures, problems): problems lists every missing field or binding mismatch;
    figures are computed only when there are none (otherwise every figure is null)."""
    null = {**{k: None for k in EXT_REVIEW_KEYS}, "sheet": str(sheet_path)}
    sheet = read_json(sheet_path)
    problems = []
    if not isinstance(sheet, dict):
        return {**null, "refused": True}, [f"{sheet_path}: not a JSON object"]
    labels = get(cfg, "config.extraction_labels")
    prereg = get(cfg, "audit_sample.preregistration")
    sample = prereg.get("items", []) if isinstance(prereg, dict) else []
    by_idx = {r["idx"]: r for r in records}
    expect(problems, "sheet", "sheet_format", sheet.get("sheet_format", MISSING), EXT_SHEET_FORMAT)
    expect(problems, "sheet", "preregistration_sha256", sheet.get("preregistration_sha256", MISSING),
           get(cfg, "audit_sample.preregistration_sha256"), "the sheet must belong to this pre-registered sample")
    items = sheet.get("items")
    if not isinstance(items, list) or len(items) != len(sample):
        problems.append(f"sheet items: {len(items) if isinstance(items, list) else 'no'} items, the sample has "
                        f"{len(sample)}")
        items = []
    missing = []
    rv = sheet.get("reviewer") if isinstance(sheet.get("reviewer"), dict) else {}
    if not (isinstance(rv.get("name"), str) and rv["name"].strip()):
        missing.append("reviewer.name: blank")
    t = rv.get("time")
    if not (isinstance(t, str) and t.strip()):
        missing.append("reviewer.time: blank")
    else:
        try:
            from datetime import datetime
            datetime.fromisoformat(t.strip())
        except ValueError:
            missing.append(f"reviewer.time: {t!r} is not an ISO 8601 date-time")
    for s, it in zip(sample, items):
        w = f"position {s.get('position')} (idx {s.get('idx')})"
        if not isinstance(it, dict):
            problems.append(f"{w}: not a JSON object")
            continue
        expect(problems, w, "idx", it.get("idx", MISSING), s.get("idx"))
        expect(problems, w, "position", it.get("position", MISSING), s.get("position"))
        r = by_idx.get(s.get("idx"))
        if r is not None:
            expect(problems, w, "sentence_sha256", it.get("sentence_sha256", MISSING), r["sentence_sha256"])
            expect(problems, w, "answer_sha256", it.get("answer_sha256", MISSING), r["generation_sha256"],
                   "the answer the reviewer saw must be this run's generation")
        if it.get("final_stance") not in EXT_STANCES:
            missing.append(f"{w} final_stance: " + ("blank" if it.get("final_stance") in (None, "")
                                                    else f"{it.get('final_stance')!r} is not one of {EXT_STANCES}"))
        for k in ("content_correct", "format_compliant", "reference_disputed"):
            if not isinstance(it.get(k), bool):
                missing.append(f"{w} {k}: " + ("blank" if it.get(k) is None else f"{it.get(k)!r} is not true/false"))
        if not (isinstance(it.get("reason"), str) and it["reason"].strip()):
            missing.append(f"{w} reason: blank")
    if problems or missing:
        return {**null, "refused": True, "missing_fields": missing, "binding_problems": problems}, problems + missing

    # -- the figures, over decidable items with an undisputed reference --
    rows = []
    for s, it in zip(sample, items):
        r = by_idx[s["idx"]]
        decidable = it["final_stance"] in labels and not it["reference_disputed"]
        rows.append({"position": s["position"], "idx": s["idx"], "label": r["label"], "label_name": r["label_name"],
                     "R": r["regex"]["correct"], "H": int(it["content_correct"]), "stance": it["final_stance"],
                     "regex_pred": r["regex"]["pred"], "exact": r["exact"]["correct"], "strict": r["strict"]["correct"],
                     "strict_format_ok": r["strict"]["format_ok"], "format_compliant": int(it["format_compliant"]),
                     "disputed": it["reference_disputed"], "decidable": decidable})
    D = [x for x in rows if x["decidable"]]
    n_d = len(D)
    dis = [x for x in D if x["R"] != x["H"]]
    fp = [x for x in D if x["R"] == 1 and x["H"] == 0]
    fn = [x for x in D if x["R"] == 0 and x["H"] == 1]
    pop = {}
    for r in records:
        pop[r["label"]] = pop.get(r["label"], 0) + 1
    classes = sorted({x["label"] for x in rows})
    per_class = {}
    for c in classes:
        sampled = [x for x in rows if x["label"] == c]
        dc = [x for x in D if x["label"] == c]
        per_class[str(c)] = {"population": pop.get(c, 0), "sampled": len(sampled), "decidable": len(dc),
                             "disagreements": sum(x["R"] != x["H"] for x in dc),
                             "false_positives": sum(x["R"] == 1 and x["H"] == 0 for x in dc),
                             "false_negatives": sum(x["R"] == 0 and x["H"] == 1 for x in dc)}
    all_decidable = all(v["decidable"] == v["sampled"] for v in per_class.values()) and n_d > 0
    n_pop = sum(pop.values())
    if all_decidable:
        w = {c: v["population"] / v["sampled"] for c, v in per_class.items()}
        est = {"weights": {c: f"{v['population']}/{v['sampled']}" for c, v in per_class.items()},
               "disagreements": sum(w[c] * v["disagreements"] for c, v in per_class.items()),
               "false_positives": sum(w[c] * v["false_positives"] for c, v in per_class.items()),
               "false_negatives": sum(w[c] * v["false_negatives"] for c, v in per_class.items()),
               "population": n_pop}
        est["disagreement_rate"] = est["disagreements"] / n_pop
        weighted_rate, weighted_note = est["disagreement_rate"], None
    else:
        est, weighted_rate = None, None
        weighted_note = (f"null by the pre-registered rule: {len(rows) - n_d} sampled item(s) are undecidable or have "
                         "a disputed reference")
    inconsistent = [f"position {x['position']} (idx {x['idx']}): stance {x['stance']!r}, label {x['label_name']!r}, "
                    f"content_correct {bool(x['H'])}" for x in rows
                    if (x["stance"] in labels and x["H"] != int(x["stance"] == x["label_name"]))
                    or (x["stance"] not in labels and x["H"] == 1)]
    figures = {
        "sheet": str(sheet_path), "sheet_sha256": sha256_file(sheet_path), "refused": False,
        "reviewer": {"name": rv["name"], "time": rv["time"]},
        "n_reviewed": len(rows), "n_decidable_undisputed": n_d,
        "excluded": [{"position": x["position"], "idx": x["idx"],
                      "why": "reference disputed" if x["disputed"] else f"stance {x['stance']}"}
                     for x in rows if not x["decidable"]],
        "disagreement_rate": len(dis) / n_d if n_d else None, "disagreements": len(dis),
        "disagreement_idx": [x["idx"] for x in dis],
        "false_positives": len(fp), "false_positive_idx": [x["idx"] for x in fp],
        "false_negatives": len(fn), "false_negative_idx": [x["idx"] for x in fn],
        "stance_agreement": {"n": n_d, "regex_pred_equals_stance": sum(x["regex_pred"] == x["stance"] for x in D)},
        "per_class": per_class,
        "weighted_disagreement_rate": weighted_rate, "weighted_estimate": est, "weighted_note": weighted_note,
        "other_scorers_vs_human": {s: {"disagreements": sum(x[s] != x["H"] for x in D), "n": n_d}
                                   for s in ("exact", "strict")},
        "format_agreement": {"n": len(rows), "strict_format_ok_equals_human": sum(
            x["strict_format_ok"] == x["format_compliant"] for x in rows)},
        "inconsistent_content_correct": inconsistent,
        "scope": "descriptive figures on the pre-registered sample; the extractor is the regex scorer (R), the "
                 "human judgement is content_correct (H)",
    }
    return figures, []


def audit_extraction(C, name, out, levels, cache):
    ev = ext_load(out, name)
    records = audit_extraction_arithmetic(C, name, out, ev)
    info = {}
    if REVIEW_SHEET is None:
        info["human_review"] = {**{k: None for k in EXT_REVIEW_KEYS},
                                "note": "no sheet given (--review SHEET): figures are null, not estimated"}
        C.skip(name, "arithmetic", "human review sheet (--review)", "no sheet given; human-review figures are null",
               requested=False)
    elif records is None:
        info["human_review"] = {**{k: None for k in EXT_REVIEW_KEYS}, "sheet": str(REVIEW_SHEET), "refused": True}
        C.add(name, "arithmetic", "human review sheet (--review)", 0,
              [f"{REVIEW_SHEET}: the evidence it refers to did not pass the arithmetic level"])
    else:
        figures, problems = ext_review(Path(REVIEW_SHEET), ev["config"], records)
        info["human_review"] = figures
        C.add(name, "arithmetic", "human review sheet (--review): complete and bound to this sample",
              figures.get("n_reviewed") or 0,
              [f"{REVIEW_SHEET} refused: {p}" for p in problems])
    if "identity" in levels or "forward" in levels:
        model_dir, parquet = resolve_cache(ev["config"], cache) if ev["config"] else (None, None)
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        tokens = audit_extraction_identity(C, name, out, ev["config"], ev["identity"], records, ev["generations"],
                                           model_dir, parquet)
        if "forward" in levels:
            info["forward"] = audit_extraction_forward(C, name, ev["identity"], records, tokens, model_dir)
    for level, flag in (("identity", "--tokens"), ("forward", "--forward")):
        if level not in levels:
            C.skip(name, level, "(whole level)", f"not requested (pass {flag})", requested=False)
    return info


def ext_print_review(report, stream=sys.stdout):
    """After the report: the human-review figures of --review SHEET, or every reason the sheet was refused."""
    hr = get(report, "details.extraction.human_review")
    if not isinstance(hr, dict):
        print(f"review: no extraction evidence audited here, so {REVIEW_SHEET} was not read", file=stream)
        report["exit_code"] = 1
        return
    if hr.get("refused"):
        print(f"review: {REVIEW_SHEET} REFUSED; human-review figures stay null. Missing or invalid:", file=stream)
        for p in hr.get("binding_problems", []) + hr.get("missing_fields", []):
            print(f"  - {p}", file=stream)
        return
    est = hr["weighted_estimate"]
    rate = "null (no decidable item)" if hr["disagreement_rate"] is None else \
        f"{hr['disagreements']}/{hr['n_decidable_undisputed']} = {hr['disagreement_rate']:.4f}"
    print(f"review: {hr['n_reviewed']} items reviewed by {hr['reviewer']['name']!r} ({hr['reviewer']['time']}); "
          f"{hr['n_decidable_undisputed']} decidable with an undisputed reference", file=stream)
    print(f"  regex extractor vs human: disagreement {rate}; false positives {hr['false_positives']}, false "
          f"negatives {hr['false_negatives']}", file=stream)
    print("  class-weighted estimate over the scored items: " + (
        f"{est['disagreements']:.3f} disagreements of {est['population']} (rate {est['disagreement_rate']:.4f}; "
        f"weights {est['weights']})" if est else hr["weighted_note"]), file=stream)
    if hr["inconsistent_content_correct"]:
        print(f"  note: content_correct inconsistent with stance vs label on {len(hr['inconsistent_content_correct'])}"
              " item(s): " + "; ".join(hr["inconsistent_content_correct"]), file=stream)


RULES["extraction"] = audit_extraction


# ---- the MC-TACO experiment (seed study 004) ---------------------------------------------------------------------
# Documents are the rows (question-candidate pairs) of an MC-TACO-shaped split, scored by lm-eval's mc_taco task and
# by the independent path. Every rule is written out again here (experiments/mctaco.py is not imported):
#   question id   sha256 of f"{sentence}\t{question}" (UTF-8); config.json split_questions lists every question of
#                 the split with its row idx; a question is complete in a document set when all its idx are in it,
#                 cut when only some are
#   documents     all rows in order (split dev); smoke: every row of the first mctaco_smoke_questions questions;
#                 limit N: rows 0..N-1 (lm-eval's limit is itertools.islice over eval_docs in dataset order)
#   prediction    argmax over the candidates " no", " yes", the first index wins ties
#   acc           mean over documents of (prediction == label)
#   F1            F1 of class 1 ("yes") over all documents at once: 2TP / (2TP + FP + FN), 0.0 when that is 0/0
#                 (sklearn's binary f1_score with its zero_division default, which lm-eval's f1 aggregation calls)
#   EM            share of the complete questions whose every candidate is predicted right (cut questions excluded)

MCT_LABELS = ("no", "yes")
MCT_CATEGORIES = ("Event Duration", "Event Ordering", "Frequency", "Typical Time", "Stationarity")
MCT_RECORD_FIELDS = {
    "idx": is_int, "question_id": is_sha, "question_rank": is_int, "candidate_rank": is_int, "label": is_int,
    "category": lambda v: v in MCT_CATEGORIES, "sentence_sha256": is_sha, "question_sha256": is_sha,
    "answer_sha256": is_sha, "prompt_sha256": is_sha, "context_tokens": is_int,
    "candidates": lambda v: isinstance(v, list) and len(v) > 0, "official": lambda v: isinstance(v, dict),
    "independent": lambda v: isinstance(v, dict), "abs_diff": lambda v: isinstance(v, list) and all(is_num(x) for x in v),
}
MCT_SIDE_FIELDS = {
    "official": {"doc_id": is_int, "scores": None, "is_greedy": None, "pred": is_int, "acc": is_num,
                 "f1_pair": lambda v: isinstance(v, list) and len(v) == 2 and all(is_int(x) for x in v),
                 "doc_hash": is_sha, "prompt_hash": is_sha},
    "independent": {"scores": None, "pred": is_int, "correct": is_int},
}
MCT_IDENTITY_FIELDS = {
    "doc_id": "arithmetic/documents and groups (official.doc_id == idx)",
    "label": "arithmetic/correctness (f1 pair gold) and identity/data parquet",
    "target": "arithmetic/correctness (lm-eval acc and f1 pair recomputed against the label)",
    "category": "identity/private texts and identity/data parquet",
    "sentence_sha256": "identity/private texts and identity/data parquet",
    "question_sha256": "identity/private texts and identity/data parquet",
    "answer_sha256": "identity/private texts and identity/data parquet",
    "prompt_sha256": "arithmetic/prompt hashes and identity/private texts",
    "candidate texts": "arithmetic/candidates",
    "candidate token ids and start": "identity/tokenisation",
    "f1 pair": "arithmetic/correctness",
}


def mct_f1(golds, preds):
    """Binary F1 of class 1 over all documents at once (never an average of per-item or per-question F1)."""
    tp = sum(1 for g, p in zip(golds, preds) if g == 1 and p == 1)
    fp = sum(1 for g, p in zip(golds, preds) if g == 0 and p == 1)
    fn = sum(1 for g, p in zip(golds, preds) if g == 1 and p == 0)
    return (2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0), {"tp": tp, "fp": fp, "fn": fn,
                                                                          "tn": len(golds) - tp - fp - fn}


def mct_acc(golds, preds):
    return sum(int(g == p) for g, p in zip(golds, preds)) / len(golds) if golds else None


def mct_em(idx_lists, correct):
    ok = sum(all(correct[i] for i in idx) for idx in idx_lists)
    return {"em": ok / len(idx_lists) if idx_lists else None, "n_correct_questions": ok,
            "n_complete_questions": len(idx_lists)}


def mct_groups(doc_ids, split_questions):
    """(complete questions, cut questions as the experiment reports them) of a document set."""
    present = set(doc_ids)
    complete, cut = [], []
    for q in split_questions:
        kept = [i for i in q["idx"] if i in present]
        if kept and len(kept) == len(q["idx"]):
            complete.append(q)
        elif kept:
            cut.append({"question_id": q["question_id"], "question_rank": q["question_rank"],
                        "n_candidates": len(q["idx"]), "n_scored": len(kept), "scored_idx": kept})
    return complete, cut


def mct_limit_ns(config_ns, n_docs, split_questions, doc_ids):
    """The demonstration's N: config values below n_docs, plus a group boundary if none is one and a cut inside a
    group if none cuts (the derivation experiments/mctaco.py documents)."""
    docs = set(doc_ids)
    qs = [q for q in split_questions if set(q["idx"]) <= docs]
    ends = sorted({max(q["idx"]) + 1 for q in qs if max(q["idx"]) + 1 < n_docs})
    ns = {n: "config" for n in config_ns if 1 <= n < n_docs}
    if ends and not any(n in ends for n in ns):
        ns[min(ends, key=lambda e: (abs(e - n_docs / 2), e))] = "derived: a group boundary (no question cut)"
    if not any(n not in ends for n in ns):
        for e in [0] + ends:
            if e + 2 < n_docs and e + 2 not in ends:
                ns.setdefault(e + 2, "derived: inside a group")
                break
    return dict(sorted(ns.items()))


def mct_doc_hash(sentence, question, answer, label, category):
    """lm-eval's doc_hash of an mc_taco document: the cache parquet's row, columns in its order."""
    doc = {"sentence": sentence, "question": question, "answer": answer, "label": label, "category": category}
    return sha256_text(json.dumps(doc, indent=2, ensure_ascii=False))


def mct_render(template, text):
    """config.mctaco_prompt filled in one pass (a brace in a text is never read as a placeholder)."""
    import re
    return re.sub(r"\{(sentence|question|answer)\}", lambda m: text[m.group(1)], template)


def mct_record_problems(r, n_choices):
    where = f"idx {r.get('idx', '?')}" if isinstance(r, dict) else "record"
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = [f"{where} {k}: missing" for k in MCT_RECORD_FIELDS if k not in r]
    bad += [f"{where} {k}: wrong type ({short(r[k], 60)})" for k, ok in MCT_RECORD_FIELDS.items()
            if k in r and not ok(r[k])]
    bad += [f"{where} {k}: a field audit.py has no rule for" for k in r if k not in MCT_RECORD_FIELDS]
    if bad:
        return bad
    n = len(r["candidates"])
    if n != n_choices:
        bad.append(f"{where} candidates: {n} candidates, the task has {n_choices} choices")
    for j, c in enumerate(r["candidates"]):
        if not isinstance(c, dict) or set(c) != set(CANDIDATE_FIELDS):
            bad.append(f"{where} candidates[{j}]: fields {sorted(c) if isinstance(c, dict) else c!r}, expected "
                       f"{sorted(CANDIDATE_FIELDS)}")
            continue
        bad += [f"{where} candidates[{j}].{k}: wrong type ({short(c[k], 60)})"
                for k, ok in CANDIDATE_FIELDS.items() if not ok(c[k])]
    for side, fields in MCT_SIDE_FIELDS.items():
        d = r[side]
        bad += [f"{where} {side}.{k}: missing" for k in fields if k not in d]
        bad += [f"{where} {side}.{k}: wrong type ({short(d[k], 60)})" for k, ok in fields.items()
                if k in d and ok is not None and not ok(d[k])]
        bad += [f"{where} {side}.{k}: a field audit.py has no rule for" for k in d if k not in fields]
        if "scores" in d and not (isinstance(d["scores"], list) and len(d["scores"]) == n
                                  and all(is_num(s) for s in d["scores"])):
            bad.append(f"{where} {side}.scores: expected {n} numbers, found {short(d['scores'], 60)}")
    g = r["official"].get("is_greedy")
    if not (isinstance(g, list) and len(g) == n and all(isinstance(x, bool) for x in g)):
        bad.append(f"{where} official.is_greedy: expected {n} booleans, found {short(g, 60)}")
    if len(r["abs_diff"]) != n:
        bad.append(f"{where} abs_diff: expected {n} numbers, found {short(r['abs_diff'], 60)}")
    return bad


def audit_mctaco_arithmetic(C, name, ev):
    """Level 1 for the MC-TACO experiment; returns the validated records or None."""
    A = "arithmetic"
    cfg, ident, records, summ, stages = (ev.get(k) for k in ("config", "identity", "records", "summary", "stages"))
    missing = [f for f, k in zip(REQUIRED, ("config", "identity", "records", "summary", "stages")) if ev[k] is None]
    if ev["environment"] is None:
        missing.insert(0, "../environment.json")
    C.add(name, A, "required files", len(REQUIRED) + 1,
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    if cfg is None or records is None:
        for check in ("config", "documents", "records", "predictions", "metrics", "summary", "stages"):
            C.skip(name, A, check, "config.json or records.jsonl missing; nothing to recompute from")
        return None

    # -- config: documents, groups, official task, identity.json --
    bad = []
    conf = cfg.get("config") if isinstance(cfg.get("config"), dict) else {}
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split, mode, limit = cfg.get("split"), sel.get("mode"), sel.get("limit")
    n_rows = cfg.get("n_rows")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING), False,
           "MC-TACO has no held-back confirmation items")
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("mctaco_data", MISSING))
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), conf.get("model", MISSING))
    want_mode = {"smoke": "smoke", "dev": "limit" if limit is not None else "all"}.get(split)
    if want_mode is None:
        bad.append(f"config.json split: {short(split)} is not smoke or dev")
    expect(bad, "config.json", "selection.mode", mode, want_mode, f"split {split!r}, limit {limit!r}")
    if mode == "limit":
        expect(bad, "config.json", "selection.allow_partial_groups", sel.get("allow_partial_groups", MISSING), True,
               "run.py refuses --limit on grouped documents without --allow-partial-groups")
    expect(bad, "config.json", "selection.smoke_questions", sel.get("smoke_questions", MISSING),
           conf.get("mctaco_smoke_questions", MISSING))
    sq = cfg.get("split_questions")
    sq_ok = isinstance(sq, list) and is_int(n_rows) and all(
        isinstance(q, dict) and is_sha(q.get("question_id")) and is_int(q.get("question_rank"))
        and isinstance(q.get("idx"), list) and q["idx"] and all(is_int(i) for i in q["idx"])
        and q.get("category") in MCT_CATEGORIES for q in sq)
    if not sq_ok:
        bad.append("config.json split_questions: missing or malformed (needs question_id, question_rank, idx, "
                   "category per question)")
        sq = []
    else:
        for k, q in enumerate(sq):
            expect(bad, f"config.json split_questions[{k}]", "question_rank", q["question_rank"], k)
        all_idx = sorted(i for q in sq for i in q["idx"])
        if all_idx != list(range(n_rows)):
            bad.append(f"config.json split_questions: the questions' idx do not partition 0..{n_rows - 1}")
        if len({q["question_id"] for q in sq}) != len(sq):
            bad.append("config.json split_questions: a question_id appears twice")
    if mode == "all":
        want_docs = list(range(n_rows)) if is_int(n_rows) else MISSING
    elif mode == "smoke":
        k = sel.get("smoke_questions")
        want_docs = sorted(i for q in sq[:k] for i in q["idx"]) if is_int(k) else MISSING
    elif mode == "limit" and is_int(limit) and is_int(n_rows) and 1 <= limit <= n_rows:
        want_docs = list(range(limit))
    else:
        want_docs = MISSING
    expect(bad, "config.json", "selection.documents", sel.get("documents", MISSING), want_docs,
           f"the selection rule for mode {mode!r}")
    # the official task: the YAML as loaded, changed only in the data transport; and the protocol implemented here
    prompt_t, choices, delim = conf.get("mctaco_prompt"), conf.get("mctaco_choices"), conf.get("target_delimiter")
    if not (isinstance(prompt_t, str) and all(prompt_t.count("{" + f + "}") == 1
                                              for f in ("sentence", "question", "answer"))):
        bad.append(f"config.json config.mctaco_prompt: {short(prompt_t)} needs {{sentence}}, {{question}}, {{answer}}")
        prompt_t = None
    if choices != list(MCT_LABELS):
        bad.append(f"config.json config.mctaco_choices: {short(choices)}, expected {list(MCT_LABELS)} (label 0 no, 1 yes)")
        choices = list(MCT_LABELS)
    if not isinstance(delim, str):
        bad.append(f"config.json config.target_delimiter: {short(delim)} is not a string")
        delim = " "
    dumped, yaml_cfg = get(cfg, "official.dumped_task_config"), get(cfg, "official.yaml_config")
    if not isinstance(dumped, dict) or not isinstance(yaml_cfg, dict):
        bad.append("config.json official.dumped_task_config / official.yaml_config: missing")
        dumped, yaml_cfg = {}, {}
    for k, v in yaml_cfg.items():
        if k == "test_split":
            expect(bad, "config.json", "official.dumped_task_config.test_split", dumped.get(k), None,
                   "the one change besides custom_dataset: lm-eval would evaluate the test split")
            expect(bad, "config.json", "official.modifications.test_split.yaml",
                   get(cfg, "official.modifications.test_split.yaml"), v)
        else:
            expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), v,
                   "official.yaml_config (the installed YAML as loaded)")
    extra = sorted(set(dumped) - set(yaml_cfg) - {"custom_dataset", "description", "target_delimiter",
                                                  "fewshot_delimiter", "num_fewshot", "unsafe_code", "repeats"})
    if extra:
        bad.append(f"config.json official.dumped_task_config: keys {extra} are neither in the YAML nor lm-eval defaults")
    if not isinstance(dumped.get("custom_dataset"), str):
        bad.append("config.json official.dumped_task_config.custom_dataset: missing (the data transport)")
    for k, want in (("doc_to_text", None if prompt_t is None else prompt_t.replace("{sentence}", "{{sentence}}")
                     .replace("{question}", "{{question}}").replace("{answer}", "{{answer}}")),
                    ("doc_to_choice", choices), ("doc_to_target", "label"), ("output_type", "multiple_choice"),
                    ("target_delimiter", delim), ("num_fewshot", 0), ("validation_split", "validation"),
                    ("metric_list", [{"metric": "acc"}, {"metric": "f1"}])):
        if want is not None:
            expect(bad, "config.json", f"official.dumped_task_config.{k}", dumped.get(k, MISSING), want)
    expect(bad, "config.json", "config.num_fewshot", conf.get("num_fewshot", MISSING), 0, "zero-shot task")
    expect(bad, "config.json", "official.documents_passed_as_samples", get(cfg, "official.documents_passed_as_samples"),
           want_docs if mode == "smoke" else None, "smoke passes its sorted documents; otherwise lm-eval selects")
    expect(bad, "config.json", "official.lm_eval_limit", get(cfg, "official.lm_eval_limit"), limit)
    # lm-eval's n-samples: effective = limit, or the whole split when no limit is given, even when `samples`
    # restricts the documents (smoke): lm_eval/evaluator.py:753-760 counts limit only
    expect(bad, "config.json", "official.n_samples", get(cfg, "official.n_samples"),
           {"original": n_rows, "effective": limit if mode == "limit" else n_rows}, "lm-eval's n-samples")
    if ident is not None:
        check_scoring_identity(bad, conf, ident)
        expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
               sha256_text(json.dumps(cfg.get("official"), sort_keys=True)), "sha256 of config.json official")
        bad += [f"identity.json {k}: a field audit.py has no rule for" for k in ident
                if k not in IDENTITY_RECOMPUTED | IDENTITY_DECLARED]
        if prompt_t is not None:
            expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
                   sha256_text(prompt_t))
        for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                         ("data_content_sha256", "data_content_sha256")):
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split)
        expect(bad, "summary.json", "confirmation_items_scored", summ.get("confirmation_items_scored", MISSING), False)
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING), conf.get("threads", MISSING))
    doc_ids = want_docs if isinstance(want_docs, list) else []
    want_ns = mct_limit_ns(conf.get("mctaco_limit_ns", []), len(doc_ids), sq, doc_ids) \
        if isinstance(conf.get("mctaco_limit_ns"), list) else {}
    expect(bad, "config.json", "limit_ns", cfg.get("limit_ns", MISSING),
           [{"limit": n, "kind": k} for n, k in want_ns.items()], "config.mctaco_limit_ns + the derivation rule")
    C.add(name, A, "config consistency (documents, split questions, official task, identity.json)", 1, bad,
          note="INCOMPLETE SET (--limit)" if mode == "limit" else "")

    # -- record shape --
    bad = []
    for r in records:
        bad += mct_record_problems(r, len(choices))
    C.add(name, A, "record fields and types", len(records), bad)
    if bad:
        for check in ("documents", "candidates", "predictions", "correctness", "agreement", "prompt hashes",
                      "metrics", "limit table", "summary", "stages"):
            C.skip(name, A, check, "records.jsonl has malformed records (see 'record fields and types')")
        return None

    # -- documents and groups: records are exactly the selected documents, in order, with their question identity --
    bad = []
    idx_list = [r["idx"] for r in records]
    expect(bad, "records.jsonl", "idx (in line order)", idx_list, want_docs, "config.json selection.documents")
    q_of = {i: (q, pos) for q in sq for pos, i in enumerate(q["idx"])}
    for r in records:
        w = f"idx {r['idx']}"
        expect(bad, w, "official.doc_id", r["official"]["doc_id"], r["idx"])
        if r["label"] not in (0, 1):
            bad.append(f"{w} label: {r['label']} is not 0 (no) or 1 (yes)")
        if r["idx"] not in q_of:
            bad.append(f"{w} idx: not in any question of config.json split_questions")
            continue
        q, pos = q_of[r["idx"]]
        for k, v in (("question_id", q["question_id"]), ("question_rank", q["question_rank"]),
                     ("candidate_rank", pos), ("category", q["category"])):
            expect(bad, w, k, r[k], v, "config.json split_questions")
    C.add(name, A, "documents and groups (selection rule, question identity, doc_id)", len(records), bad)

    # -- candidates, predictions, correctness, agreement, prompt hashes --
    bad = []
    lim_tok = conf.get("max_input_tokens")
    for r in records:
        w = f"idx {r['idx']}"
        for j, c in enumerate(r["candidates"]):
            expect(bad, w, f"candidates[{j}].text", c["text"], delim + choices[j] if j < len(choices) else MISSING)
            expect(bad, w, f"candidates[{j}].start", c["start"], r["context_tokens"], "must equal context_tokens")
            if is_int(lim_tok) and r["context_tokens"] + len(c["token_ids"]) > lim_tok:
                bad.append(f"{w} candidates[{j}].token_ids: input over max_input_tokens {lim_tok}")
    C.add(name, A, "candidates (texts ' no'/' yes', start == context_tokens, length limit)", len(records), bad)
    bad = []
    for r in records:
        for side in ("official", "independent"):
            expect(bad, f"idx {r['idx']}", f"{side}.pred", r[side]["pred"], argmax_first(r[side]["scores"]),
                   f"argmax of {side}.scores, first index wins ties")
    C.add(name, A, "predictions, both paths (argmax, first index wins ties)", len(records), bad)
    bad = []
    for r in records:
        w, off, ind = f"idx {r['idx']}", argmax_first(r["official"]["scores"]), argmax_first(r["independent"]["scores"])
        expect(bad, w, "independent.correct", r["independent"]["correct"], int(ind == r["label"]))
        expect(bad, w, "official.acc", r["official"]["acc"], float(off == r["label"]), "lm-eval per-document acc")
        expect(bad, w, "official.f1_pair", r["official"]["f1_pair"], [r["label"], off], "lm-eval's (gold, pred)")
    C.add(name, A, "correctness (independent.correct, lm-eval acc and f1 pair)", len(records), bad)
    bad = []
    for r in records:
        expect(bad, f"idx {r['idx']}", "abs_diff", r["abs_diff"],
               [abs(a - b) for a, b in zip(r["official"]["scores"], r["independent"]["scores"])])
        expect(bad, f"idx {r['idx']}", "official.prompt_hash", r["official"]["prompt_hash"], r["prompt_sha256"])
    C.add(name, A, "agreement per candidate and prompt hashes", len(records), bad)

    # -- metrics, group completeness, limit table: the whole summary.json rebuilt from the records --
    labels = [r["label"] for r in records]
    off_preds = [argmax_first(r["official"]["scores"]) for r in records]
    ind_preds = [argmax_first(r["independent"]["scores"]) for r in records]
    correct = {r["idx"]: int(p == r["label"]) for r, p in zip(records, ind_preds)}
    complete, cut = mct_groups(idx_list, sq)
    incomplete = bool(cut)
    scope = (f"INCOMPLETE SET: {len(cut)} question(s) cut (only some of their candidates scored); acc and F1 cover "
             f"the {len(records)} scored documents, EM only the {len(complete)} complete questions" if incomplete
             else f"complete set: every candidate of each of the {len(complete)} questions scored")
    reported = get(cfg, "official.reported")

    def side(preds):
        f1, counts = mct_f1(labels, preds)
        return {"correct": sum(int(p == l) for p, l in zip(preds, labels)), "acc": mct_acc(labels, preds),
                "f1": f1 if labels else None, "f1_counts": counts,
                "pred_counts": {"no": preds.count(0), "yes": preds.count(1)}, "computed_on": scope}

    ind = side(ind_preds)
    em = mct_em([q["idx"] for q in complete], correct)
    by_cat = {}
    for cat in MCT_CATEGORIES:
        rs = [(r, p) for r, p in zip(records, ind_preds) if r["category"] == cat]
        if rs:
            by_cat[cat] = {"n_documents": len(rs), "acc": mct_acc([r["label"] for r, _ in rs], [p for _, p in rs]),
                           **mct_em([q["idx"] for q in complete if q["category"] == cat], correct),
                           "computed_on": scope}
    diffs = [abs(a - b) for r in records for a, b in zip(r["official"]["scores"], r["independent"]["scores"])]
    reference = {"documents": len(records), "acc": ind["acc"], "f1": ind["f1"], "em": em["em"],
                 "incomplete_set": incomplete}
    # the limit table: each row claims lm-eval's limit=N run scored documents 0..N-1 exactly as the main run did;
    # every figure is recomputed from the first N records, so a row that does not hold fails here
    rec_by_idx = {r["idx"]: (r, p) for r, p in zip(records, off_preds)}
    demo = get(summ, "limit_demo") if summ is not None else MISSING
    exp_rows, bad_lim = [], []
    for n, kind in want_ns.items():
        first = [rec_by_idx[i] for i in range(n) if i in rec_by_idx]
        if len(first) != n:
            bad_lim.append(f"limit {n}: documents 0..{n - 1} are not all in records.jsonl; cannot recompute the row")
            continue
        golds, preds = [r["label"] for r, _ in first], [p for _, p in first]
        f1, counts = mct_f1(golds, preds)
        lim_correct = {r["idx"]: int(p == r["label"]) for r, p in first}
        l_complete, l_cut = mct_groups(list(range(n)), sq)
        cut_full = [q for q in sq if q["question_id"] in {c["question_id"] for c in l_cut}]
        acc = mct_acc(golds, preds)
        exp_rows.append({
            "limit": n, "kind": kind,
            "lm_eval": {"acc": acc, "f1": f1, "n_samples": {"original": n_rows, "effective": n}},
            "doc_ids": list(range(n)), "doc_ids_are_first_n": True, "preds": preds, "max_abs_diff_vs_main_run": 0.0,
            "recomputed": {"acc": acc, "f1": f1, "f1_counts": counts},
            "questions_touched": len(l_complete) + len(l_cut), "n_complete_questions": len(l_complete),
            "cut_questions": l_cut,
            "em_complete_questions": mct_em([q["idx"] for q in l_complete], lim_correct),
            "em_cut_questions_on_scored_candidates": mct_em([c["scored_idx"] for c in l_cut], lim_correct),
            "em_cut_questions_on_all_candidates": mct_em([q["idx"] for q in cut_full], correct)
            if all(i in correct for q in cut_full for i in q["idx"]) else None,
            "delta_vs_reference": {"acc": acc - ind["acc"], "f1": f1 - ind["f1"]},
        })
    shuffle = demo.get("shuffle_before_cut") if isinstance(demo, dict) else None
    if not isinstance(shuffle, dict):
        bad_lim.append("summary.json limit_demo.shuffle_before_cut: missing")
        shuffle_exp = MISSING
    else:
        # the source citations are declared (audit.py does not read lm_eval); each must say it was found, and the
        # conclusion must agree with what the limit rows show
        src = shuffle.get("source")
        if not (isinstance(src, list) and src and all(isinstance(s, dict) and s.get("found") is True for s in src)):
            bad_lim.append("summary.json limit_demo.shuffle_before_cut.source: a cited line range was not found")
        files = shuffle.get("files_without_the_word_shuffle")
        if not (isinstance(files, dict) and files and all(v is True for v in files.values())):
            bad_lim.append("summary.json limit_demo.shuffle_before_cut.files_without_the_word_shuffle: not all true")
        shuffle_exp = {"documents_shuffled_before_limit": False, "conclusion": shuffle.get("conclusion", MISSING),
                       "source": src, "files_without_the_word_shuffle": files,
                       "observed": {"limit_runs": len(exp_rows), "doc_ids_first_n": len(exp_rows),
                                    "scores_identical_to_main_run": len(exp_rows)}}
    C.add(name, A, "limit table (lm-eval limit=N == first N documents; acc, F1, cut groups, EM recomputed)",
          len(want_ns), bad_lim, note=f"N = {list(want_ns)}")
    expected = {
        "experiment": name, "split": split, "confirmation_items_scored": False, "selection": mode, "limit": limit,
        "n_documents": len(records), "n_candidates": len(diffs),
        "n_questions_touched": len(complete) + len(cut), "n_complete_questions": len(complete),
        "label_counts": {"no": labels.count(0), "yes": labels.count(1)},
        "incomplete_set": incomplete, "metrics_computed_on": scope, "cut_questions": cut,
        "official": {**side(off_preds), "lm_eval_reported": {"acc": side(off_preds)["acc"], "f1": side(off_preds)["f1"]}},
        "independent": {**ind, "em": {**em, "computed_on": scope}},
        "by_category": by_cat,
        "baselines": {nm: {"acc": mct_acc(labels, [k] * len(labels)),
                           "f1": mct_f1(labels, [k] * len(labels))[0] if labels else None, "computed_on": scope}
                      for k, nm in ((0, "always_no"), (1, "always_yes"))},
        "agreement": {"max_abs_diff": max(diffs) if diffs else MISSING,
                      "n_candidate_score_mismatches": sum(d != 0.0 for d in diffs),
                      "n_prediction_mismatches": sum(a != b for a, b in zip(off_preds, ind_preds)),
                      "acc_official_vs_independent": [side(off_preds)["acc"], ind["acc"]],
                      "f1_official_vs_independent": [side(off_preds)["f1"], ind["f1"]]},
        "identity_checks": {"passed": True, "n_samples_joined": len(records),
                            "fields": get(summ, "identity_checks.fields") if summ is not None else MISSING},
        "limit_demo": {"reference": reference, "rows": exp_rows, "shuffle_before_cut": shuffle_exp},
    }
    if summ is not None and ("fast" in summ or any("fast" in r for r in records)):
        expected["fast"] = fast_expected(summ.get("fast"), records, C, name)
    if summ is None:
        C.skip(name, A, "summary.json values", "summary.json missing (named under 'required files')")
    else:
        bad = []
        compare_tree(bad, "summary.json", summ, expected)
        # lm-eval's own aggregates (config.json official.reported) must be the recomputed acc and corpus F1
        expect(bad, "config.json", "official.reported", reported, expected["official"]["lm_eval_reported"],
               "lm-eval's acc (mean) and f1 (corpus F1 of 'yes') recomputed from the records")
        fields = get(summ, "identity_checks.fields")
        if not isinstance(fields, list):
            bad.append("summary.json identity_checks.fields: not a list")
        else:
            bad += [f"summary.json identity_checks.fields: {f!r} is an identity field audit.py has no check for"
                    for f in fields if f not in MCT_IDENTITY_FIELDS]
        C.add(name, A, "summary.json values (acc, corpus F1, EM, groups, limit table, every value recomputed)",
              len(records), bad, note="INCOMPLETE SET" if incomplete else "")

    # -- stages.json token counts --
    if stages is None:
        C.skip(name, A, "stages.json token counts", "stages.json missing (named under 'required files')")
    else:
        bad = []
        ctx = [r["context_tokens"] for r in records]
        per_cand = [r["context_tokens"] + len(c["token_ids"]) for r in records for c in r["candidates"]]
        tokens = {"context_tokens": {"min": min(ctx), "max": max(ctx), "total": sum(ctx)} if ctx else MISSING,
                  "input_tokens_per_candidate": {"min": min(per_cand), "max": max(per_cand), "total": sum(per_cand)}
                  if per_cand else MISSING, "n_items": len(records), "n_candidates": len(per_cand),
                  "limit_run_documents": sum(want_ns)}
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), tokens, "tokens.")
        st = stages.get("stages")
        if not isinstance(st, list) or not st or not all(isinstance(s, dict) and is_num(s.get("wall_s"))
                                                         and s["wall_s"] >= 0 for s in st):
            bad.append("stages.json stages: missing, empty or malformed")
        C.add(name, A, "stages.json token counts (+ sanity of timings)", len(records), bad,
              note="wall times and RSS are measurements: sanity-checked, not recomputed")
    return records


def audit_mctaco_identity(C, name, out, cfg, ident, records, model_dir, data_parquet):
    """Level 2: private texts, tokenisation, the data parquet. Returns {idx: (ctx ids, [cand ids])} or None."""
    L = "identity"
    if records is None:
        for check in ("private texts", "tokenisation", "data parquet"):
            C.skip(name, L, check, "the arithmetic level found records.jsonl or config.json unusable")
        return None
    prompt_t = cfg.get("config", {}).get("mctaco_prompt")
    texts_path = out / "private" / name / "texts.jsonl"
    texts = None
    check = "private texts (text hashes, question id, prompt from template, lm-eval doc_hash)"
    if not texts_path.exists():
        C.skip(name, L, check, f"{texts_path} absent (private evidence not shipped); text hashes NOT checked")
    else:
        bad, texts = [], {}
        for n_line, t in enumerate(read_jsonl(texts_path), start=1):
            if not (isinstance(t, dict) and is_int(t.get("idx")) and all(isinstance(t.get(k), str) for k in
                                                                          ("sentence", "question", "answer", "prompt"))):
                bad.append(f"private/{name}/texts.jsonl line {n_line}: needs idx, sentence, question, answer, prompt")
                continue
            if t["idx"] in texts:
                bad.append(f"idx {t['idx']} private texts: duplicated (line {n_line})")
            texts[t["idx"]] = t
        rec_idx = [r["idx"] for r in records]
        bad += [f"idx {i} private texts: no text for this record" for i in rec_idx if i not in texts]
        bad += [f"idx {i} private texts: text for an idx with no record" for i in texts if i not in rec_idx]
        for r in records:
            t = texts.get(r["idx"])
            if t is None:
                continue
            w = f"idx {r['idx']}"
            for k in ("sentence", "question", "answer", "prompt"):
                expect(bad, w, f"{k}_sha256", r[f"{k}_sha256"], sha256_text(t[k]), f"sha256 of the private {k}")
            expect(bad, w, "question_id", r["question_id"], sha256_text(f"{t['sentence']}\t{t['question']}"),
                   "sha256 of sentence TAB question")
            expect(bad, w, "category", r["category"], t.get("category"), "private texts")
            if isinstance(prompt_t, str):
                expect(bad, w, "prompt", t["prompt"], mct_render(prompt_t, t), "config.mctaco_prompt filled in")
            expect(bad, w, "official.doc_hash", r["official"]["doc_hash"],
                   mct_doc_hash(t["sentence"], t["question"], t["answer"], r["label"], r["category"]),
                   "lm-eval's doc hash of (sentence, question, answer, label, category)")
        C.add(name, L, check, len(records), bad)

    result = None
    check = "tokenisation (candidate ids, start, context-prefix property)"
    tok_path = model_dir / "tokenizer.json" if model_dir else None
    if texts is None:
        C.skip(name, L, check, "needs the private texts (absent); candidate token ids and boundaries NOT checked")
    elif tok_path is None or not tok_path.exists():
        C.skip(name, L, check, f"tokenizer not found ({tok_path}); pass --cache with the prepared cache")
    else:
        try:
            tok = load_tokenizer(tok_path)
        except ImportError as e:
            tok = None
            C.skip(name, L, check, f"cannot import tokenizers ({e})")
        if tok is not None:
            bad, result = [], {}
            expect(bad, str(tok_path), "sha256", sha256_file(tok_path), ident.get("tokenizer_sha256", MISSING)
                   if ident else MISSING, "identity.json tokenizer_sha256")
            for r in records:
                t = texts.get(r["idx"])
                if t is None:
                    bad.append(f"idx {r['idx']} prompt: no private text; cannot re-tokenise it")
                    continue
                w, prompt = f"idx {r['idx']}", t["prompt"]
                ctx_ids = tok.encode(prompt, add_special_tokens=False).ids
                expect(bad, w, "context_tokens", r["context_tokens"], len(ctx_ids), "re-tokenised prompt")
                cands = []
                for j, c in enumerate(r["candidates"]):
                    whole = tok.encode(prompt + c["text"], add_special_tokens=False).ids
                    if whole[:len(ctx_ids)] != ctx_ids:
                        bad.append(f"{w} candidates[{j}]: context tokens are not a prefix of context+candidate tokens")
                    expect(bad, w, f"candidates[{j}].token_ids", c["token_ids"], whole[len(ctx_ids):])
                    cands.append(whole[len(ctx_ids):])
                result[r["idx"]] = (ctx_ids, cands)
            C.add(name, L, check, len(records), bad, note=f"tokenizers.Tokenizer from {tok_path}")
            if bad:
                result = None

    check = "data parquet (n_rows, canonical content hash, questions, labels, categories, text hashes)"
    if data_parquet is None or not data_parquet.exists():
        C.skip(name, L, check, f"data parquet not found ({data_parquet}); labels NOT checked against the data")
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            C.skip(name, L, check, f"cannot import pyarrow ({e})")
        else:
            cols = pq.read_table(data_parquet).to_pydict()
            if not {"sentence", "question", "answer", "label", "category"} <= set(cols):
                raise Unreadable(f"{data_parquet}: columns {sorted(cols)}, expected sentence, question, answer, "
                                 "label, category")
            rows = [dict(zip(("sentence", "question", "answer", "label", "category"), v)) for v in
                    zip(cols["sentence"], cols["question"], cols["answer"], cols["label"], cols["category"])]
            bad = []
            expect(bad, "config.json", "n_rows", cfg.get("n_rows", MISSING), len(rows), f"rows in {data_parquet}")
            content = "".join(f"{i}\t{MCT_LABELS[r['label']] if r['label'] in (0, 1) else r['label']}\t"
                              f"{r['category']}\t{r['sentence']}\t{r['question']}\t{r['answer']}\n"
                              for i, r in enumerate(rows))
            expect(bad, "config.json", "data_content_sha256", cfg.get("data_content_sha256", MISSING),
                   sha256_text(content), f"canonical MC-TACO content hash of {data_parquet}")
            qs = {}
            for i, r in enumerate(rows):
                qid = sha256_text(f"{r['sentence']}\t{r['question']}")
                qs.setdefault(qid, {"question_id": qid, "question_rank": len(qs), "idx": [],
                                    "category": r["category"]})["idx"].append(i)
            expect(bad, "config.json", "split_questions", cfg.get("split_questions", MISSING), list(qs.values()),
                   "questions recomputed from the data")
            for rec in records:
                w = f"idx {rec['idx']}"
                if not 0 <= rec["idx"] < len(rows):
                    bad.append(f"{w} idx: not in the data")
                    continue
                r = rows[rec["idx"]]
                expect(bad, w, "label", rec["label"], r["label"], "label in the data")
                expect(bad, w, "category", rec["category"], r["category"], "category in the data")
                for k in ("sentence", "question", "answer"):
                    expect(bad, w, f"{k}_sha256", rec[f"{k}_sha256"], sha256_text(r[k]), f"{k} in the data")
            C.add(name, L, check, len(records), bad, note=str(data_parquet))
    return result


def audit_mctaco(C, name, out, levels, cache):
    exp = out / name
    ev = {"environment": read_json(out / "environment.json") if (out / "environment.json").exists() else None}
    for key, fname in zip(("config", "identity", "records", "summary", "stages"), REQUIRED):
        p = exp / fname
        ev[key] = (read_jsonl(p) if fname.endswith(".jsonl") else read_json(p)) if p.exists() else None
    for key in ("config", "identity", "summary", "stages"):
        if ev[key] is not None and not isinstance(ev[key], dict):
            raise Unreadable(f"{exp / (key + '.json')}: line 1: expected a JSON object, found {type(ev[key]).__name__}")
    records = audit_mctaco_arithmetic(C, name, ev)
    info = {}
    if ev["summary"] is not None:
        s = ev["summary"]
        info["figures"] = {"acc": get(s, "independent.acc"), "f1": get(s, "independent.f1"),
                           "em": get(s, "independent.em.em"), "incomplete_set": s.get("incomplete_set")}
    if "identity" in levels or "forward" in levels:
        model_dir, parquet = resolve_cache(ev["config"], cache) if ev["config"] else (None, None)
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        tokens = audit_mctaco_identity(C, name, out, ev["config"], ev["identity"], records, model_dir, parquet)
        if "forward" in levels:
            # the protocol's forward level reads exactly the fields these records share with it (idx, candidates,
            # official/independent scores and pred, official.is_greedy)
            info["forward"] = audit_protocol_forward(C, name, ev["identity"], records, tokens, model_dir)
    for level, flag in (("identity", "--tokens"), ("forward", "--forward")):
        if level not in levels:
            C.skip(name, level, "(whole level)", f"not requested (pass {flag})", requested=False)
    return info


RULES["mctaco"] = audit_mctaco


def audit(out, levels=("arithmetic",), cache=None, only=None):
    """Audit every experiment directory under `out` (or those named in `only`; the rest are reported as SKIPPED).
    Returns the report dict; raises Unreadable (exit 2)."""
    out = Path(out)
    if not out.is_dir():
        raise Unreadable(f"{out}: no such evidence directory; run: python run.py --cache CACHE --out {out}")
    C = Checks()
    experiments = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")
                         and p.name != "private")
    private = sorted(p.name for p in (out / "private").iterdir() if p.is_dir()) \
        if (out / "private").is_dir() else []
    info = {}
    if not experiments:
        C.add("-", "arithmetic", "experiment directories", 0, [f"{out}: no experiment directory to audit"])
    if not (out / "environment.json").exists():
        C.add("-", "arithmetic", "required files", 1, [f"{out}/environment.json: missing"])
    for name in experiments:
        if only and name not in only:
            C.skip(name, "-", "(whole experiment)", "not selected (--experiment)", requested=False)
            continue
        if name not in RULES:
            C.add(name, "arithmetic", "audit rule", 0, [f"{name}/: no audit rule for this experiment; its claims "
                                                        "are NOT verified (add one to RULES in audit.py)"])
            continue
        info[name] = RULES[name](C, name, out, levels, cache)
    for name in only or []:
        if name not in experiments:
            C.add(name, "arithmetic", "experiment directory", 0, [f"{out}/{name}: no such experiment directory"])
    for name in private:
        if name not in experiments and (not only or name in only):
            C.add(name, "arithmetic", "private evidence", 0,
                  [f"private/{name}/: private files for an experiment with no public evidence"])
    for failed in sorted(out.glob("*.FAILED.json")):
        if only and failed.name[:-len(".FAILED.json")] not in only:
            continue
        C.add(failed.name[:-len(".FAILED.json")], "arithmetic", "run outcome", 0,
              [f"{failed.name}: run.py recorded a failed run of this experiment (see that file)"])
    status = [r["status"] for r in C.rows]
    skipped_requested = [r for r in C.rows if r["status"] == "SKIPPED" and r.get("requested", True)]
    return {"audit_format": AUDIT_FORMAT, "evidence": str(out), "levels": list(levels),
            "cache": str(cache) if cache else None, "experiments": experiments, "checks": C.rows,
            "n_pass": status.count("PASS"), "n_fail": status.count("FAIL"), "n_skipped": status.count("SKIPPED"),
            "n_skipped_requested": len(skipped_requested), "details": info,
            "exit_code": 1 if "FAIL" in status else 0}


def first_failure(report):
    return next((r for r in report["checks"] if r["status"] == "FAIL"), None)


def print_report(report, stream=sys.stdout):
    p = lambda s="": print(s, file=stream)  # noqa: E731
    p(f"audit of {report['evidence']} (levels requested: {', '.join(report['levels'])})")
    p(f"{'experiment':<10} {'level':<10} {'check':<72} {'items':>5}  status")
    for r in report["checks"]:
        line = f"{r['experiment']:<10} {r['level']:<10} {r['check'][:72]:<72} {r['items']:>5}  {r['status']}"
        if r["status"] == "FAIL":
            more = f" (+{r['n_failures'] - 1} more)" if r["n_failures"] > 1 else ""
            line += f"  {r['first_failure']}{more}"
        elif r["note"] and (r["status"] == "SKIPPED" or "max |" in r["note"] or r["note"].isupper()):
            line += f"  {r['note']}"
        p(line)
    verdict = "PASS" if report["exit_code"] == 0 else "FAIL"
    p(f"RESULT: {verdict}: {report['n_pass']} passed, {report['n_fail']} failed, {report['n_skipped']} skipped "
      f"({report['n_skipped_requested']} of them requested but impossible here) -> exit {report['exit_code']}")


def write_report(path, report):
    """Temp file in the same directory + os.replace: a reader never sees half an audit.json."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, sort_keys=True, ensure_ascii=False, default=str)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---- mutation self-test ------------------------------------------------------------------------------------------
# Each mutation tampers with a fresh copy of O in one way and names the check that must catch it. They target the
# protocol experiment (records 0 and 1 in rank order). A mutation whose catching check cannot run here (no private
# file, no tokenizer, no model) is SKIPPED, which counts as not caught: the self-test only passes when every kind
# was demonstrably caught.

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
    skips = {(r["level"], r["check"]): r["note"] for r in probe["checks"] if r["status"] == "SKIPPED"}
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
            print(f"  {kind:<24} {row['status']:<8} {msg if len(msg) < 160 else msg[:157] + '...'}", file=stream)
    ok = clean_row["passed"] and all(r["caught"] for r in rows)
    print(f"MUTATIONS: {sum(r['caught'] for r in rows)}/{len(rows)} caught, clean copy "
          f"{'passed' if clean_row['passed'] else 'FAILED'} -> exit {0 if ok else 1}", file=stream)
    return {"audit_format": AUDIT_FORMAT, "evidence": str(out), "levels": list(levels), "clean": clean_row,
            "mutations": rows, "exit_code": 0 if ok else 1}


# ---- CLI ---------------------------------------------------------------------------------------------------------

def main(argv=None):
    global THREADS, REVIEW_SHEET
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("out", type=Path, help="evidence directory written by run.py --out")
    ap.add_argument("--tokens", action="store_true", help="identity level: private texts, tokenizer, data parquet")
    ap.add_argument("--forward", action="store_true", help="forward level (implies --tokens): recompute every score")
    ap.add_argument("--cache", type=Path, help="prepared cache (default: two levels above config.json's model.dir)")
    ap.add_argument("--experiment", action="append",
                    help="audit only this experiment (repeatable); the others are reported as not selected")
    ap.add_argument("--mutations", action="store_true", help="mutation self-test on temporary copies of OUT")
    ap.add_argument("--report", type=Path,
                    help="where to write the JSON report (default: OUT/audit.json, OUT/audit.mutations.json)")
    ap.add_argument("--threads", type=int, default=THREADS, help="torch threads for --forward (default: %(default)s)")
    ap.add_argument("--strict", action="store_true", help="a requested level that had to be skipped exits 1")
    ap.add_argument("--review", type=Path, metavar="SHEET",
                    help="extraction: import a review sheet exported by O/private/extraction/review.html; a blank or "
                         "partly blank sheet is refused with the list of missing fields")
    args = ap.parse_args(argv)
    THREADS = args.threads
    REVIEW_SHEET = args.review
    try:
        if args.mutations:
            report = mutation_selftest(args.out, args.cache)
            default_report = args.out / "audit.mutations.json"
        else:
            levels = ("arithmetic",) + (("identity",) if args.tokens or args.forward else ()) \
                + (("forward",) if args.forward else ())
            report = audit(args.out, levels, args.cache, args.experiment)
            if args.strict and report["n_skipped_requested"] and report["exit_code"] == 0:
                report["exit_code"] = 1
            print_report(report)
            if REVIEW_SHEET is not None:
                ext_print_review(report)
            default_report = args.out / "audit.json"
    except Unreadable as e:
        print(f"error: unreadable evidence: {e}", file=sys.stderr)
        return 2
    path = args.report or default_report
    write_report(path, report)
    print(f"report: {path}")
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
