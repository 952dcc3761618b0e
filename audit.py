"""Recompute every claim in an evidence directory written by run.py, from the evidence alone.

    python audit.py O                              # arithmetic level (stdlib only, no model, no private files)
    python audit.py O --tokens                     # + identity level: private texts, tokenizer, data parquet
    python audit.py O --tokens --forward           # + forward level: audit.py's own Llama forward pass
    python audit.py O --mutations                  # self-test: tamper with copies of O, each must be caught

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
        if k not in RECORD_FIELDS:
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
        scoring_keys = ["dtype", "attn_implementation", "threads", "device", "batch_size", "max_input_tokens",
                        "target_delimiter", "num_fewshot", "tie_rule", "sst2_choices"]
        scoring = {k: conf.get(k, MISSING) for k in scoring_keys}
        expect(bad, "identity.json", "scoring_config", ident.get("scoring_config", MISSING), scoring)
        if MISSING not in scoring.values():
            expect(bad, "identity.json", "scoring_config_sha256", ident.get("scoring_config_sha256", MISSING),
                   sha256_text(json.dumps(scoring, sort_keys=True)))
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
        scoring_keys = ["dtype", "attn_implementation", "threads", "device", "batch_size", "max_input_tokens",
                        "target_delimiter", "num_fewshot", "tie_rule", "sst2_choices"]
        scoring = {k: conf.get(k, MISSING) for k in scoring_keys}
        expect(bad, "identity.json", "scoring_config", ident.get("scoring_config", MISSING), scoring)
        if MISSING not in scoring.values():
            expect(bad, "identity.json", "scoring_config_sha256", ident.get("scoring_config_sha256", MISSING),
                   sha256_text(json.dumps(scoring, sort_keys=True)))
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


def m_salt(o):
    o["selection"]["salt"] = o["config"]["selection_salt"] = o["selection"]["salt"] + "-x"


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
    ("change_salt", "selection salt changed consistently in config.json", edit_file("protocol/config.json", m_salt),
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
    global THREADS
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
    args = ap.parse_args(argv)
    THREADS = args.threads
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
