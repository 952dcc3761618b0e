"""The check groups every experiment runs, whatever it measures.

Each group is either a function that records its own row (C.add / C.skip) under a fixed check name, or, where every
experiment already has a row name of its own ("config consistency (...)", "stages.json token counts ..."), a
function that appends problems to the list the rule reports under that name. The rule modules call them in this
order: required files, config consistency (split, selection settings, model, identity.json), environment.json,
record shape, selection rule, the experiment's own recomputations, summary.json, stages.json (then the deeper levels
through deeper_levels). Each function's docstring names the row it records or the row its problems belong to.
"""
import json
from dataclasses import dataclass, field

from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY, MISSING, compare_tree, expect, get, short
from evidence_audit.definitions import (SPLITS, argmax_first, confirmation_scored, is_int, is_num, is_sha,
                                        is_value_of, select_items)
from evidence_audit.model_files import local_identity_problems
from evidence_audit.reading import EVIDENCE_KEYS, REQUIRED, load_evidence, resolve_cache, sha256_text
from evidence_audit.run_command import command_line_limit
import registry

CONFIG_SECTIONS = registry.CONFIG_SECTIONS      # the config.py sections the declared experiments read
# identity.json: fields recomputed from config.json, and facts about the producing code (checked against
# environment.json by environment_check; the evidence itself cannot recompute them)
IDENTITY_RECOMPUTED = {"model_sha256", "tokenizer_sha256", "data_content_sha256", "prompt_template_sha256",
                       "scoring_config", "scoring_config_sha256", "official_config_sha256",
                       "official_task_config_sha256", "config_sections",
                       "model_source", "model_files"}     # a local --model directory (evidence_audit/model_files.py)
IDENTITY_DECLARED = {"git_commit", "git_dirty", "code_sha256", "versions", "run_id"}
STAGE_SUM_SLACK_S = 0.01    # rounding of the recorded stage times (4 decimals each)
# one candidate of a multiple-choice record (protocol, MC-TACO)
CANDIDATE_FIELDS = {"text": lambda v: isinstance(v, str), "start": is_int,
                    "token_ids": lambda v: isinstance(v, list) and len(v) > 0 and all(is_int(t) for t in v)}


def config_block(cfg):
    """config.json's `config` block: the effective settings the experiment ran with ({} when absent)."""
    return cfg.get("config") if isinstance(cfg.get("config"), dict) else {}


# ---- required files ------------------------------------------------------------------------------------------------

def required_files(C, name, ev, extra=(), check="required files"):
    """Row `check`: the five files of O/<name>/ and O/environment.json, plus `extra` ((path relative to O/<name>,
    present) pairs). Returns True when config.json and records.jsonl are there, i.e. the level can go on."""
    missing = ([] if ev.get("environment") is not None else ["../environment.json"])
    missing += [f for f, k in zip(REQUIRED, EVIDENCE_KEYS) if ev[k] is None]
    missing += [path for path, present in extra if not present]
    C.add(name, ARITHMETIC, check, len(REQUIRED) + 1 + len(extra),
          [f"{name}/{f}: missing (run.py writes it; the evidence is incomplete)" for f in missing])
    return ev["config"] is not None and ev["records"] is not None


# ---- config.json ---------------------------------------------------------------------------------------------------

def split_problems(bad, name, cfg, splits=SPLITS):
    """config.json names this experiment and a known split; returns the split."""
    split = cfg.get("split")
    if split not in splits:
        bad.append(f"config.json split: {short(split)} is not one of {splits}")
    expect(bad, "config.json", "experiment", cfg.get("experiment", MISSING), name)
    return split


def model_problems(bad, cfg):
    """config.json's model block is the model the effective config names."""
    expect(bad, "config.json", "model.id", get(cfg, "model.id"), config_block(cfg).get("model", MISSING))


def hash_selection_problems(bad, cfg):
    """The hash selection settings in config.json: the split is restated consistently, the selection block repeats
    the effective config, the counts are usable, and the data is the configured one."""
    conf, split = config_block(cfg), cfg.get("split")
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    expect(bad, "config.json", "selection.split", sel.get("split", MISSING), split)
    expect(bad, "config.json", "confirmation_items_scored", cfg.get("confirmation_items_scored", MISSING),
           confirmation_scored(split), "must be true exactly when split is confirm or all")
    if split == "all":
        expect(bad, "config.json", "selection.split_rule", sel.get("split_rule", MISSING),
               "every row of the data's validation split in idx order (0..n_rows-1), the confirmation items included")
    elif "split_rule" in sel:
        bad.append(f"config.json selection.split_rule: only split all states one (split is {split!r})")
    for sel_key, conf_key in (("salt", "selection_salt"), ("n_dev", "n_dev"), ("n_confirm", "n_confirm"),
                              ("n_smoke", "n_smoke"), ("rule", "selection_rule")):
        expect(bad, "config.json", f"selection.{sel_key}", sel.get(sel_key, MISSING), conf.get(conf_key, MISSING),
               f"config.{conf_key} says otherwise")
    expect(bad, "config.json", "data", cfg.get("data", MISSING), conf.get("data", MISSING))
    if not is_int(cfg.get("n_rows")) or cfg.get("n_rows") <= 0:
        bad.append(f"config.json n_rows: {short(cfg.get('n_rows', MISSING))} is not a positive integer")
    for k in ("n_dev", "n_confirm", "n_smoke"):
        if not is_int(sel.get(k)) or sel.get(k) < 0:
            bad.append(f"config.json selection.{k}: {short(sel.get(k, MISSING))} is not a non-negative integer")
    if is_int(sel.get("n_smoke")) and is_int(sel.get("n_dev")) and sel["n_smoke"] > sel["n_dev"]:
        bad.append(f"config.json selection.n_smoke: {sel['n_smoke']} > n_dev {sel['n_dev']} (smoke is a prefix of dev)")


def split_note(split):
    """The note of a rule's config row when the split scored held-back items (printed: it is upper case)."""
    return {"confirm": "CONFIRMATION SPLIT SCORED",
            "all": "SPLIT ALL SCORED (EVERY ROW, CONFIRMATION ITEMS INCLUDED)"}.get(split, "")


def restated_problems(bad, ev, split, confirmation_scored=None):
    """summary.json restates the split (and whether confirmation items were scored); stages.json the threads."""
    summ, stages = ev["summary"], ev["stages"]
    if summ is not None:
        expect(bad, "summary.json", "split", summ.get("split", MISSING), split, "config.json split")
        if confirmation_scored is not None:
            expect(bad, "summary.json", "confirmation_items_scored", summ.get("confirmation_items_scored", MISSING),
                   confirmation_scored)
    if stages is not None:
        expect(bad, "stages.json", "threads", stages.get("threads", MISSING),
               config_block(ev["config"]).get("threads", MISSING))


# ---- identity.json -------------------------------------------------------------------------------------------------

def identity_problems(bad, name, cfg, ident, prompt_template_sha256=None, declared=()):
    """identity.json restates config.json: the scoring config is the whole `config` block (the effective settings
    of the experiment's config sections) with its sha256, `config_sections` (newer evidence) names this
    experiment's sections, model/tokenizer/data hashes are config.json's, the official config hash is recomputed,
    and the prompt template hash when the rule can recompute it (None: it cannot at this level). `declared`
    names fields this experiment's config.json does not restate (checked by nothing here). A field with no rule
    at all is a failure."""
    conf = config_block(cfg)
    expect(bad, "identity.json", "scoring_config", ident.get("scoring_config", MISSING), conf)
    expect(bad, "identity.json", "scoring_config_sha256", ident.get("scoring_config_sha256", MISSING),
           sha256_text(json.dumps(conf, sort_keys=True)))
    if "config_sections" in ident:
        config_sections_problems(bad, name, cfg, ident["config_sections"])
    for k, where in (("model_sha256", "model.model_sha256"), ("tokenizer_sha256", "model.tokenizer_sha256"),
                     ("data_content_sha256", "data_content_sha256")):
        if k not in declared:
            expect(bad, "identity.json", k, ident.get(k, MISSING), get(cfg, where), f"config.json {where}")
    local_identity_problems(bad, cfg, ident)
    if "official_task_config_sha256" in ident:     # older protocol evidence hashed the dumped task config only
        dumped = get(cfg, "official.dumped_task_config")
        expect(bad, "identity.json", "official_task_config_sha256", ident["official_task_config_sha256"],
               sha256_text(json.dumps(dumped if isinstance(dumped, dict) else {}, sort_keys=True)),
               "sha256 of config.json official.dumped_task_config")
    else:
        expect(bad, "identity.json", "official_config_sha256", ident.get("official_config_sha256", MISSING),
               sha256_text(json.dumps(cfg.get("official"), sort_keys=True)), "sha256 of config.json official")
    if prompt_template_sha256 is not None:
        expect(bad, "identity.json", "prompt_template_sha256", ident.get("prompt_template_sha256", MISSING),
               prompt_template_sha256)
    bad += [f"identity.json {k}: a field audit.py has no rule for" for k in ident
            if k not in IDENTITY_RECOMPUTED and k not in IDENTITY_DECLARED]


def config_sections_problems(bad, name, cfg, sections):
    """The config sections a score depends on: distinct config.py section names, "shared" first, and exactly the
    ones registry.py declares for this experiment (for a name it does not declare: the experiment's own section
    among them); config.json says the same when it says anything. The declaration is the current code's: evidence
    of an experiment whose sections have since changed fails here."""
    declared = registry.find(name)
    if not (isinstance(sections, list) and sections and sections[0] == "shared"
            and len(set(sections)) == len(sections) and all(s in CONFIG_SECTIONS for s in sections)):
        bad.append(f"identity.json config_sections: {short(sections)} is not a list of distinct config sections "
                   "starting with 'shared'")
    elif declared is not None and sections != list(declared.config_sections):
        bad.append(f"identity.json config_sections: {short(sections)}, but registry.py declares "
                   f"{list(declared.config_sections)} for {name!r}")
    elif declared is None and name not in sections:
        bad.append(f"identity.json config_sections: {short(sections)} does not name {name!r}")
    if "config_sections" in cfg:
        expect(bad, "config.json", "config_sections", cfg["config_sections"], sections, "identity.json config_sections")


# ---- environment.json ----------------------------------------------------------------------------------------------

def environment_check(C, name, ev):
    """Row "environment.json (...)": the process facts identity.json restates (commit, dirty flag, code hash,
    library versions, run id) are environment.json's, the same run's. (The run id is also tied to MANIFEST.json
    and the private run.json files by the manifest level.)"""
    check = "environment.json consistency (commit, dirty, code hash, versions, run id)"
    env, ident = ev.get("environment"), ev["identity"]
    if env is None or ident is None:
        C.skip(name, ARITHMETIC, check, "environment.json or identity.json missing (named under 'required files')")
        return
    bad = []
    if not isinstance(env, dict):
        bad.append(f"environment.json: expected a JSON object, found {type(env).__name__}")
        env = {}
    for k in sorted(IDENTITY_DECLARED):
        expect(bad, "identity.json", k, ident.get(k, MISSING), env.get(k, MISSING), "environment.json says otherwise")
    if not (isinstance(env.get("git_commit"), str) or env.get("git_commit") is None):
        bad.append(f"environment.json git_commit: {short(env.get('git_commit'))} is not a commit id or null")
    if not isinstance(env.get("git_dirty"), (bool, type(None))):
        bad.append(f"environment.json git_dirty: {short(env.get('git_dirty'))} is not true, false or null")
    bad += kernel_problems(env, config_block(ev["config"]) if isinstance(ev.get("config"), dict) else {})
    C.add(name, ARITHMETIC, check, 1, bad, note="declared facts about the producing code: compared, not recomputed")


# Written again on purpose (experiments/evidence.py KERNEL_ENV): the variables that choose the CPU kernels.
KERNEL_ENV = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_NUM_THREADS", "MKL_DYNAMIC", "MKL_DEBUG_CPU_TYPE",
              "MKL_THREADING_LAYER", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
              "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE", "OMP_NUM_THREADS", "OMP_DYNAMIC",
              "OMP_SCHEDULE", "OMP_PROC_BIND", "KMP_AFFINITY", "KMP_BLOCKTIME", "GOMP_CPU_AFFINITY",
              "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "TORCH_MKLDNN_MATMUL_MIN_DIM")
KERNEL_KEYS = ("env", "torch_cpu_capability", "torch_threads", "parallel_info", "float32_matmul_precision", "mkl",
               "onednn")


def kernel_problems(env, conf):
    """environment.json "kernels" (what chose the CPU kernels): its fields, every variable of KERNEL_ENV (a string or
    null), and the thread count it ran with, which must be environment.json's, config.json's and the one torch's
    parallel info names. Declared facts: compared, not recomputed."""
    k = env.get("kernels", MISSING)
    if not (isinstance(k, dict) and sorted(k) == sorted(KERNEL_KEYS) and isinstance(k["env"], dict)):
        return [f"environment.json kernels: expected {{{', '.join(KERNEL_KEYS)}}}, found {short(k, 100)}"]
    bad = []
    if sorted(k["env"]) != sorted(KERNEL_ENV) or not all(isinstance(v, (str, type(None))) for v in k["env"].values()):
        bad.append(f"environment.json kernels.env: expected the variables {', '.join(KERNEL_ENV)}, each a string or "
                   f"null, found {short(k['env'], 100)}")
    if not all(isinstance(k[f], (str, type(None))) for f in KERNEL_KEYS if f not in ("env", "torch_threads")):
        bad.append("environment.json kernels: capability, parallel info, precision and builds must be strings")
    threads = k["torch_threads"]
    expect(bad, "environment.json", "kernels.torch_threads", threads, env.get("torch_threads", MISSING),
           "environment.json torch_threads")
    if "threads" in conf:        # config.json's own threads are checked against identity.json by the config row
        expect(bad, "environment.json", "kernels.torch_threads", threads, conf["threads"], "config.json config.threads")
    if is_int(threads) and f"at::get_num_threads() : {threads}" not in str(k["parallel_info"]):
        bad.append(f"environment.json kernels.parallel_info: does not name {threads} thread(s) "
                   "(at::get_num_threads())")
    return bad


# ---- stages.json ---------------------------------------------------------------------------------------------------

def stage_time_problems(stages):
    """stages.json's timings: one object per stage (name, wall_s >= 0, peak RSS null or a non-decreasing
    integer), the process-level `imports` row at most once and first, total_wall_s >= 0, and the experiment's own
    stage times adding up to no more than its total (+ STAGE_SUM_SLACK_S for rounding). Measurements: sanity-checked,
    not recomputed."""
    bad, st = [], stages.get("stages")
    if not isinstance(st, list) or not st:
        return ["stages.json stages: missing or empty"]
    last_rss, own = 0, 0.0
    for k, s in enumerate(st):
        if not (isinstance(s, dict) and isinstance(s.get("name"), str) and is_num(s.get("wall_s"))
                and s["wall_s"] >= 0):
            bad.append(f"stages.json stages: malformed stage {short(s, 80)}")
            continue
        if s["name"] == "imports" and k != 0:
            bad.append(f"stages.json stages[{k}]: the process-level 'imports' row can only come first")
        own += s["wall_s"] if s["name"] != "imports" else 0.0
        rss = s.get("peak_rss_bytes_at_end")
        if rss is not None:
            if not is_int(rss) or rss < last_rss:
                bad.append(f"stages.json stage {s['name']!r} peak_rss_bytes_at_end: {rss} is not a non-decreasing "
                           f"process peak (previous {last_rss})")
            else:
                last_rss = rss
    total = stages.get("total_wall_s")
    if not (is_num(total) and total >= 0):
        bad.append(f"stages.json total_wall_s: {short(total)} is not a non-negative number")
    elif own > total + STAGE_SUM_SLACK_S:
        bad.append(f"stages.json total_wall_s: {total} s, but the experiment's stages (without 'imports') add up "
                   f"to {own:.4f} s")
    return bad


def stages_check(C, name, ev, tokens, n_items, check="stages.json token counts (+ sanity of timings)",
                 calls=("official", "independent"), unit_of=None):
    """Row `check`: stages.json["tokens"] equals `tokens` (recomputed from the records by the rule; None: the
    experiment's token counts are declared, not recomputable) and the timings pass stage_time_problems."""
    stages = ev["stages"]
    if stages is None:
        C.skip(name, ARITHMETIC, check.split(" (")[0], "stages.json missing (named under 'required files')")
        return
    bad = []
    if tokens is not None:
        compare_tree(bad, "stages.json", stages.get("tokens", MISSING), tokens, "tokens.")
    bad += stage_time_problems(stages)
    bad += data_parallel_problems(stages, ev["records"], calls, unit_of)
    C.add(name, ARITHMETIC, check, n_items, bad,
          note="wall times and RSS are measurements: sanity-checked, not recomputed")


def scored_key(item):
    """A record's key in the ranks' item lists: its idx, or (task, id) for a harness example (JSON: a list)."""
    return tuple(scored_key(x) for x in item) if isinstance(item, list) else item


def record_unit(r):
    """The unit a rank scores for one record: its idx, or (task, id) for a harness example."""
    return r.get("idx") if "idx" in r else (r.get("task"), r.get("id"))


def is_unit(item):
    """A rank's item key as JSON: an int (idx), or a list of ints and strings (an options unit, a harness example)."""
    return is_int(item) or (isinstance(item, list) and all(is_int(x) or isinstance(x, str) for x in item))


def data_parallel_problems(stages, records, calls=("official", "independent"), unit_of=None):
    """stages.json "data_parallel" (a torchrun / accelerate run, or a --merge of --shard runs; absent in one
    process): world_size ranks, one entry each, and for each scoring call (the official and independent paths; the
    harness's one call) the ranks' item lists are a partition of the records' units: their idx, (task, id) for the
    harness, or what `unit_of(record)` says (options: (idx, prompt kind)); every unit scored once, by one rank."""
    dp = stages.get("data_parallel") if isinstance(stages, dict) else None
    if dp is None:
        return []
    ranks = dp.get("ranks") if isinstance(dp, dict) else None
    world = dp.get("world_size") if isinstance(dp, dict) else None
    if not (isinstance(ranks, list) and isinstance(world, int) and len(ranks) == world >= 2):
        return [f"stages.json data_parallel: expected world_size >= 2 and one entry per rank, found "
                f"{short(world)} and {short(ranks, 80)}"]
    unit_of = unit_of or record_unit
    bad, want = rank_measure_problems(ranks), sorted({unit_of(r) for r in records or [] if isinstance(r, dict)},
                                                      key=str)
    for call in calls:
        lists = [r["items_scored"].get(call) if isinstance(r, dict) and isinstance(r.get("items_scored"), dict)
                 else None for r in ranks]
        if any(not isinstance(l, list) for l in lists):
            bad.append(f"stages.json data_parallel: a rank has no items_scored.{call} list")
            continue
        if not all(is_unit(i) for l in lists for i in l):
            bad.append(f"stages.json data_parallel items_scored.{call}: an entry is not an idx or a [key, ...] list "
                       f"of integers and strings ({short(lists, 120)})")
            continue
        got = [scored_key(i) for l in lists for i in l]
        if len(got) != len(set(map(str, got))) or sorted(set(got), key=str) != want:
            bad.append(f"stages.json data_parallel items_scored.{call}: {len(got)} entries over {world} ranks, "
                       f"expected each of the records' {len(want)} units exactly once")
    return bad


def rank_measure_problems(ranks):
    """Each rank's own measurements in stages.json data_parallel (parallel.rank_facts): an object, a wall time that
    is a non-negative number, a peak RSS that is a non-negative integer (null: a --merge's shard that measured none)."""
    bad = []
    for k, r in enumerate(ranks):
        if not isinstance(r, dict):
            bad.append(f"stages.json data_parallel.ranks[{k}]: {short(r, 60)} is not an object")
            continue
        if "wall_s" in r and not (is_num(r["wall_s"]) and r["wall_s"] >= 0):
            bad.append(f"stages.json data_parallel.ranks[{k}] wall_s: {short(r['wall_s'])} is not a non-negative "
                       "number of seconds")
        rss = r.get("peak_rss_bytes")
        if rss is not None and not (is_int(rss) and rss >= 0):
            bad.append(f"stages.json data_parallel.ranks[{k}] peak_rss_bytes: {short(rss)} is not a non-negative "
                       "integer")
    return bad


WHOLE_BATCHES = "data-parallel ranks took whole batches (the plan rebuilt from the token ids)"


def whole_batches_check(C, name, ev, records, tokens, unit_of=None, token_key=lambda r: r["idx"]):
    """Row WHOLE_BATCHES, at the identity level of a data-parallel run (nothing in one process): the one-process
    plan rebuilt from the verified token ids -- one row per distinct input (context + candidate[:-1]), longest
    first then by ids, chunks of official_batch_size; batches one unit's rows span form one group, named by its
    first batch; the k-th group to rank k mod N -- must be the ranks' items_scored of both paths exactly."""
    stages = ev.get("stages")
    dp = stages.get("data_parallel") if isinstance(stages, dict) else None
    if dp is None:
        return
    if tokens is None:
        C.skip(name, IDENTITY, WHOLE_BATCHES, "needs the identity level's verified token ids, which failed")
        return
    unit_of, bad = unit_of or record_unit, []
    size = config_block(ev["config"]).get("official_batch_size")
    ranks, world = dp.get("ranks"), dp.get("world_size")
    if not (is_int(size) and size >= 1 and is_int(world) and world >= 1 and isinstance(ranks, list)):
        C.add(name, IDENTITY, WHOLE_BATCHES, len(records), ["stages.json / config.json: no usable world size, "
                                                            "ranks or official_batch_size"])
        return
    rows_of = {}
    for r in records:
        ctx, cands = tokens[token_key(r)]
        rows_of.setdefault(unit_of(r), set()).update(tuple(ctx + c[:-1]) for c in cands)
    order = sorted({row for rows in rows_of.values() for row in rows}, key=lambda row: (-len(row), row))
    batch_of = {row: n // size for n, row in enumerate(order)}
    root = list(range(len(order) // size + 1))

    def find(b):
        while root[b] != b:
            b = root[b]
        return b

    for rows in rows_of.values():
        batches = sorted({batch_of[row] for row in rows})
        for b in batches[1:]:
            root[max(find(b), find(batches[0]))] = min(find(b), find(batches[0]))
    groups = sorted({find(batch_of[next(iter(rows))]) for rows in rows_of.values()})
    rank_of_group = {g: k % world for k, g in enumerate(groups)}
    want = [sorted((u for u, rows in rows_of.items() if rank_of_group[find(batch_of[next(iter(rows))])] == k),
                   key=str) for k in range(world)]
    for call in ("official", "independent"):
        for k, rank in enumerate(ranks[:world]):
            got = rank.get("items_scored", {}).get(call) if isinstance(rank, dict) and isinstance(
                rank.get("items_scored"), dict) else None
            got = sorted((scored_key(i) for i in got), key=str) if isinstance(got, list) and all(
                is_unit(i) for i in got) else MISSING
            expect(bad, "stages.json", f"data_parallel.ranks[{k}].items_scored.{call}", got, want[k],
                   "whole batches of the one-process plan, the k-th group to rank k mod N")
    C.add(name, IDENTITY, WHOLE_BATCHES, len(records), bad, note=f"{len(groups)} group(s) over {world} ranks")


def identity_with_whole_batches(identity, unit_of=None, token_key=lambda r: r["idx"]):
    """An identity level followed by whole_batches_check on the token ids it verified."""
    def run(C, name, out, ev, records, model_dir, parquet):
        tokens = identity(C, name, out, ev, records, model_dir, parquet)
        if records is not None:
            whole_batches_check(C, name, ev, records, tokens, unit_of, token_key)
        return tokens
    return run


def token_span(values):
    """{"min", "max", "total"} of a list of token counts (MISSING for no values: a claim about nothing fails)."""
    return {"min": min(values), "max": max(values), "total": sum(values)} if values else MISSING


def candidate_token_counts(records):
    """stages.json["tokens"] of a multiple-choice experiment, recomputed from the records."""
    ctx = [r["context_tokens"] for r in records]
    per_cand = [r["context_tokens"] + len(c["token_ids"]) for r in records for c in r["candidates"]]
    return {"context_tokens": token_span(ctx), "input_tokens_per_candidate": token_span(per_cand),
            "n_items": len(records), "n_candidates": len(per_cand)}


# ---- record shape --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RecordShape:
    """What one line of records.jsonl must hold, for record_problems.

    fields      top-level field -> predicate (a missing field, a failing predicate and an unknown field all fail)
    optional    fields a record may carry -> predicate (e.g. run.py --fast's "fast", recomputed elsewhere)
    nested      object field -> {sub-field: predicate, or None for a per-candidate list checked below}
    candidates  per-candidate object fields (exactly these), when records carry a "candidates" list
    per_candidate_numbers / per_candidate_booleans   dotted fields holding one value per candidate
    """
    fields: dict
    optional: dict = field(default_factory=dict)
    nested: dict = field(default_factory=dict)
    candidates: dict = None
    per_candidate_numbers: tuple = ()
    per_candidate_booleans: tuple = ()


def object_problems(where, obj, fields, optional=None, prefix=""):
    """Missing fields, fields whose predicate fails (None: no type rule here), and fields with no rule at all;
    messages read "<where> <prefix><field>: ..."."""
    optional = optional or {}
    bad = [f"{where} {prefix}{k}: missing" for k in fields if k not in obj]
    bad += [f"{where} {prefix}{k}: wrong type or empty ({short(obj[k], 60)})"
            for k, ok in {**fields, **optional}.items() if k in obj and ok is not None and not ok(obj[k])]
    bad += [f"{where} {prefix}{k}: a field audit.py has no rule for" for k in obj
            if k not in fields and k not in optional]
    return bad


def record_problems(r, where, shape, n_choices=None):
    """Every problem with one record's shape; messages name the record (`where`) and the field."""
    if not isinstance(r, dict):
        return [f"{where}: not a JSON object"]
    bad = object_problems(where, r, shape.fields, shape.optional)
    bad += [p for side, fields in shape.nested.items() if isinstance(r.get(side), dict)
            for p in object_problems(where, r[side], fields, prefix=f"{side}.")]
    if bad or shape.candidates is None:
        return bad
    n = len(r["candidates"])
    if n_choices is not None and n != n_choices:
        bad.append(f"{where} candidates: {n} candidates, expected {n_choices} (one per choice)")
    for j, c in enumerate(r["candidates"]):
        if not isinstance(c, dict) or set(c) != set(shape.candidates):
            bad.append(f"{where} candidates[{j}]: fields {sorted(c) if isinstance(c, dict) else c!r}, expected "
                       f"{sorted(shape.candidates)}")
            continue
        bad += [f"{where} candidates[{j}].{k}: wrong type ({short(c[k], 60)})"
                for k, ok in shape.candidates.items() if not ok(c[k])]
    for dotted, ok, what in [(d, is_num, "numbers") for d in shape.per_candidate_numbers] + \
                            [(d, lambda x: isinstance(x, bool), "booleans") for d in shape.per_candidate_booleans]:
        v = get(r, dotted)
        if not (isinstance(v, list) and len(v) == n and all(ok(x) for x in v)):
            bad.append(f"{where} {dotted}: expected {n} {what}, found {short(v, 60)}")
    return bad


def record_shape_check(C, name, records, shape, where_of, n_choices=None, check="record fields and types",
                       extra=None):
    """Row `check`: record_problems for every record (+ `extra(r, where)` problems). Returns True when every record
    is well formed (the later rules may then index its fields without guarding)."""
    bad = []
    for i, r in enumerate(records):
        where = where_of(i, r) if isinstance(r, dict) else f"record {i}"
        bad += record_problems(r, where, shape, n_choices)
        if extra is not None and isinstance(r, dict):
            bad += extra(r, where)
    C.add(name, ARITHMETIC, check, len(records), bad)
    return not bad


def two_path_shape(fields, official=None, optional=None):
    """The record shape of a multiple-choice experiment scored on both paths (protocol, MC-TACO): the experiment's
    own `fields` (and `official`: fields lm-eval logs for it), plus what every such record holds: the context
    length, one candidate per choice, each path's scores and prediction, lm-eval's per-document fields, and the
    per-candidate agreement."""
    return RecordShape(
        fields={**fields, "context_tokens": is_int, "candidates": lambda v: isinstance(v, list) and len(v) > 0,
                "official": lambda v: isinstance(v, dict), "independent": lambda v: isinstance(v, dict),
                "abs_diff": lambda v: isinstance(v, list)},
        optional=optional or {},
        nested={"official": {"doc_id": is_int, "scores": None, "is_greedy": None, "pred": is_int, "acc": is_num,
                             "doc_hash": is_sha, "prompt_hash": is_sha, **(official or {})},
                "independent": {"scores": None, "pred": is_int, "correct": is_int}},
        candidates=CANDIDATE_FIELDS,
        per_candidate_numbers=("official.scores", "independent.scores", "abs_diff"),
        per_candidate_booleans=("official.is_greedy",))


# ---- the selection rule --------------------------------------------------------------------------------------------

def hash_selection(cfg):
    """The item idx the hash rule selects for config.json's split and selection settings, in rank order.
    Returns (idx list or None, why not, the settings as text for messages)."""
    sel = cfg.get("selection") if isinstance(cfg.get("selection"), dict) else {}
    split = cfg.get("split")
    settings = (f"salt={sel.get('salt')!r}, n_rows={cfg.get('n_rows')}, n_dev={sel.get('n_dev')}, "
                f"n_confirm={sel.get('n_confirm')}, n_smoke={sel.get('n_smoke')}, split={split!r}")
    if not (all(is_int(x) for x in (cfg.get("n_rows"), sel.get("n_dev"), sel.get("n_confirm"), sel.get("n_smoke")))
            and isinstance(sel.get("salt"), str)):
        return None, "selection settings in config.json are unusable", settings
    want, why = select_items(split, sel["salt"], cfg["n_rows"], sel["n_dev"], sel["n_confirm"], sel["n_smoke"])
    return want, why, settings


def rank_order_problems(keys, want, settings, where_of=lambda k: f"idx {k}"):
    """The records' keys (idx, or (idx, condition), ...) are exactly `want`, in that order, each once."""
    bad = [f"{where_of(got)} idx: at rank {rank} the selection rule gives {where_of(exp)} ({settings})"
           for rank, (got, exp) in enumerate(zip(keys, want)) if got != exp]
    bad += [f"{where_of(k)} idx: selected by the rule (rank {rank}) but has no record ({settings})"
            for rank, k in enumerate(want) if k not in keys]
    bad += [f"{where_of(k)} idx: has a record but is not selected by the rule ({settings})"
            for k in keys if k not in want]
    bad += [f"{where_of(k)} idx: appears {keys.count(k)} times in records.jsonl"
            for k in sorted({k for k in keys if keys.count(k) > 1}, key=str)]
    if len(keys) != len(want):
        bad.append(f"records.jsonl: {len(keys)} records, the selection rule gives {len(want)} ({settings})")
    return bad


# ---- --limit N -----------------------------------------------------------------------------------------------------
# Written again on purpose (experiments/selection.py limited_selection): the order a limited SST-2 selection keeps.
LIMIT_ORDER = {"all": "idx order"}
LIMIT_RANK_ORDER = "rank order of the hash rule"


def limit_problems(bad, ev, of, order):
    """The run's --limit, checked (problems into `bad`, under the rule's selection row): config.json's `limit`
    block is absent exactly when environment.json's recorded command line gives no --limit; else it is {n, of,
    order} with n that command line's N, 1 <= n <= of, `of` the size of the selection before the limit (recomputed
    by the rule) and `order` the order the first n are taken in. summary.json restates the block (the rule's
    expected summary carries it). Returns (n, the expected block), or (None, None) for a run without a limit (or a
    block too malformed to cut by: the full selection is then expected, and the records fail against it)."""
    cfg = ev["config"]
    given, why_not = command_line_limit(ev.get("environment"))
    block = cfg.get("limit", MISSING)
    if block is MISSING:
        if given is not None:
            bad.append(f"config.json limit: absent, but environment.json's command line gives --limit {given}")
        return None, None
    if not (isinstance(block, dict) and is_int(block.get("n")) and is_int(of) and 1 <= block["n"] <= of):
        bad.append(f"config.json limit: {short(block, 80)} is not {{n: 1..{of}, of: {of}, order}}")
        return None, None
    expected = {"n": block["n"], "of": of, "order": order}
    compare_tree(bad, "config.json", block, expected, "limit.")
    if why_not is None:
        expect(bad, "config.json", "limit.n", block["n"], MISSING if given is None else given,
               "the --limit of environment.json's recorded command line")
    return block["n"], expected


def limited_hash_selection(bad, ev):
    """hash_selection(config.json) cut to the run's --limit (limit_problems, problems into `bad`): (the idx the run
    must have scored, in order, or None; why not; the settings as text; the expected limit block or None)."""
    cfg = ev["config"]
    want, why, settings = hash_selection(cfg)
    if want is None:
        return None, why, settings, None
    n, block = limit_problems(bad, ev, len(want), LIMIT_ORDER.get(cfg.get("split"), LIMIT_RANK_ORDER))
    if n is None:
        return want, why, settings, None
    return want[:n], why, f"{settings}, limit={n} (the first {n} of {len(want)})", block


def limit_note(block, unit="items"):
    """The selection row's note for a limited run (upper case: the printed audit shows it)."""
    if block is None:
        return ""
    return f"LIMITED RUN: FIRST {block['n']} OF {block['of']} {unit.upper()} (--LIMIT {block['n']})"


# ---- multiple-choice records (protocol, MC-TACO; options where its fields match) ----------------------------------

def idx_where(r):
    return f"idx {r['idx']}"


def candidate_problems(records, choices, delim, limit, where_of=idx_where):
    """Each candidate's text is the delimiter + its choice and starts where the context ends; a context has at
    least one token; no input (context + candidate) is over max_input_tokens (run.py must have stopped)."""
    bad = []
    for r in records:
        w = where_of(r)
        for j, c in enumerate(r["candidates"]):
            expect(bad, w, f"candidates[{j}].text", c["text"], delim + choices[j] if j < len(choices) else MISSING)
            expect(bad, w, f"candidates[{j}].start", c["start"], r["context_tokens"], "must equal context_tokens")
            if is_int(limit) and r["context_tokens"] + len(c["token_ids"]) > limit:
                bad.append(f"{w} candidates[{j}].token_ids: input of {r['context_tokens'] + len(c['token_ids'])} "
                           f"tokens is over max_input_tokens {limit} (must have been an error)")
        if r["context_tokens"] < 1:
            bad.append(f"{w} context_tokens: {r['context_tokens']} (a context has at least one token)")
    return bad


def both_paths_pred_problems(records, pred_field="pred", where_of=idx_where):
    """Each path's recorded prediction is the argmax of its own scores, the first index winning ties."""
    bad = []
    for r in records:
        for side in ("official", "independent"):
            expect(bad, where_of(r), f"{side}.{pred_field}", r[side][pred_field], argmax_first(r[side]["scores"]),
                   f"argmax of {side}.scores {r[side]['scores']}, first index wins ties")
    return bad


def abs_diff_problems(records, where_of=idx_where):
    """abs_diff is |official - independent| per candidate, recomputed from the two score lists."""
    bad = []
    for r in records:
        expect(bad, where_of(r), "abs_diff", r["abs_diff"],
               [abs(a - b) for a, b in zip(r["official"]["scores"], r["independent"]["scores"])],
               "recomputed from the two score lists")
    return bad


# ---- the independent path's batches (protocol, options, MC-TACO) ---------------------------------------------------

BATCHES = "independent path in lm-eval's batches (batch size, rows, padded shapes)"
# Written again on purpose (experiments/scoring.py BATCH_RULE): the rule the independent path says it followed.
BATCH_RULE = ("lm-eval 0.4.9.2 HFLM loglikelihood batches, formed independently: one forward row per distinct "
              "input (context + candidate without its last token); rows longest first, equal lengths by token ids "
              "ascending; consecutive chunks of batch_size rows; each right-padded with id 0 to its longest row, "
              "no attention mask; log_softmax over the vocabulary of the whole batch; a candidate's score is the "
              "sum of its tokens' log-probabilities read from the last len(candidate) positions of its row")
BATCHING_KEYS = ("rule", "batch_size", "n_requests", "n_rows", "n_batches", "shapes")


def lm_eval_batch_shapes(records, batch_size):
    """(n requests, n rows, [[rows, padded length] per batch]) of the batches lm-eval forms for these records'
    requests, written again from its definition: one row per distinct input (context + candidate without its last
    token; the prompt hash stands for the context's ids), rows longest first, chunks of batch_size. Equal lengths
    are ordered by their token ids, which leaves every batch's shape the same, so the shapes follow from the
    lengths alone."""
    rows = {(r["prompt_sha256"], c["start"], tuple(c["token_ids"][:-1])): c["start"] + len(c["token_ids"]) - 1
            for r in records for c in r["candidates"]}
    lengths = sorted(rows.values(), reverse=True)
    shapes = [[len(lengths[i:i + batch_size]), lengths[i]] for i in range(0, len(lengths), batch_size)]
    return sum(len(r["candidates"]) for r in records), len(rows), shapes


def is_shapes(v):
    return isinstance(v, list) and all(isinstance(s, list) and len(s) == 2 and all(is_int(x) for x in s) for s in v)


def batching_check(C, name, cfg, records):
    """Row BATCHES: the independent path says it formed lm-eval's batches (config.json independent.batching, the
    rule written again here) at the batch size lm-eval ran (official.hflm.batch_size, config official_batch_size):
    its counts and every batch's shape are recomputed from the records. The batch size itself is declared (both
    paths ran it; float32 on a CPU that rounds a row alike in any batch cannot show it). A data-parallel run took
    whole batches per rank: the same shapes (the identity level rebuilds the ranks' batches)."""
    bad = []
    facts, conf = get(cfg, "independent.batching"), config_block(cfg)
    size = conf.get("official_batch_size", MISSING)
    expect(bad, "config.json", "official.hflm.batch_size", get(cfg, "official.hflm.batch_size"), size,
           "config official_batch_size")
    if not isinstance(facts, dict):
        bad.append(f"config.json independent.batching: {short(facts)} is not the batching facts ({BATCHING_KEYS})")
    elif not (is_int(size) and size >= 1):
        bad.append(f"config.json config.official_batch_size: {short(size)} is not a positive integer")
    else:
        bad += [f"config.json independent.batching.{k}: a claim audit.py has no rule to recompute"
                for k in sorted(set(facts) - set(BATCHING_KEYS))]
        expect(bad, "config.json", "independent.batching.rule", facts.get("rule", MISSING), BATCH_RULE,
               "the rule audit.py recomputes")
        typed = all(is_int(facts.get(k)) for k in ("batch_size", "n_requests", "n_rows", "n_batches"))
        if not (typed and is_shapes(facts.get("shapes"))):
            bad.append("config.json independent.batching: counts must be integers and shapes [[rows, length], ...] "
                       f"of integers, found {short({k: facts.get(k) for k in BATCHING_KEYS[1:]}, 120)}")
        else:
            n_requests, n_rows, shapes = lm_eval_batch_shapes(records, size)
            for key, want in (("batch_size", size), ("n_requests", n_requests), ("n_rows", n_rows),
                              ("n_batches", len(shapes)), ("shapes", shapes)):
                expect(bad, "config.json", f"independent.batching.{key}", facts.get(key, MISSING), want,
                       "recomputed from the records")
    C.add(name, ARITHMETIC, BATCHES, len(records), bad,
          note=(f"batch size {size} declared (lm-eval's); counts and every batch's shape recomputed"
                if is_int(size) else ""))


SCORED_DTYPE = "scores are values of the scored dtype (float32, bfloat16 or float16)"


def dtype_check(C, name, cfg, scores):
    """Row SCORED_DTYPE: both paths sum their scores in a tensor of the run's dtype, so every recorded score is a
    value of it: a float32 run's scores are float32 numbers, a bfloat16 run's have 8 bits of mantissa. `scores`:
    [(where, score)]. An edited score, or a float32 run relabelled bfloat16, is usually not."""
    dtype = config_block(cfg).get("dtype", MISSING)
    if dtype not in ("float32", "bfloat16", "float16"):
        C.add(name, ARITHMETIC, SCORED_DTYPE, len(scores), [f"config.json config.dtype: {short(dtype)} is not float32, "
                                                            "bfloat16 or float16"])
        return
    bad = [f"{where}: {score!r} is not a {dtype} value" for where, score in scores if not is_value_of(score, dtype)]
    C.add(name, ARITHMETIC, SCORED_DTYPE, len(scores),
          bad[:20] + ([f"... {len(bad) - 20} more"] if len(bad) > 20 else []), note=dtype)


def record_scores(records, where_of=lambda r: f"idx {r['idx']}"):
    """[(where, score)] of both paths' scores of every record (the input of dtype_check)."""
    return [(f"{where_of(r)} {side}.scores[{j}]", s) for r in records for side in ("official", "independent")
            for j, s in enumerate(r[side]["scores"])]


# ---- summary.json --------------------------------------------------------------------------------------------------

def summary_check(C, name, ev, expected, check, n_items, extra=(), identity_fields=None, note=""):
    """Row `check`: every value in summary.json equals `expected` (rebuilt from the records by the rule; a recorded
    key with no recomputed value fails too), plus the rule's `extra` problems; with `identity_fields`, each field
    summary.json's identity_checks.fields names must be one the audit re-verifies."""
    summ = ev["summary"]
    if summ is None:
        C.skip(name, ARITHMETIC, "summary.json values", "summary.json missing (named under 'required files')")
        return
    bad = []
    compare_tree(bad, "summary.json", summ, expected)
    bad += list(extra)
    if identity_fields is not None:
        fields = get(summ, "identity_checks.fields")
        if not isinstance(fields, list):
            bad.append("summary.json identity_checks.fields: not a list")
        else:
            bad += [f"summary.json identity_checks.fields: {f!r} is an identity field audit.py has no check for"
                    for f in fields if f not in identity_fields]
    C.add(name, ARITHMETIC, check, n_items, bad, note=note)


# ---- the deeper levels ---------------------------------------------------------------------------------------------

def deeper_levels(C, name, ev, levels, cache, identity, forward=None, no_forward=None):
    """Run the identity level (`identity(model_dir, parquet)` -> what the forward level needs) and the forward level
    (`forward(that, model_dir)` -> figures) when requested, and record a SKIPPED row for a level not requested, or
    (`no_forward`: the reason) a forward level this experiment does not have. Returns the figures for audit.json."""
    info = {}
    if IDENTITY in levels or FORWARD in levels:
        model_dir, parquet = (resolve_cache(ev["config"], cache, C.options.model, ev.get("paths"))
                              if ev["config"] else (None, None))
        info["model_dir"], info["data_parquet"] = str(model_dir), str(parquet)
        verified = identity(model_dir, parquet)
        if FORWARD in levels and forward is not None:
            info["forward"] = forward(verified, model_dir)
    if IDENTITY not in levels:
        C.skip(name, IDENTITY, "(whole level)", "not requested (pass --tokens)", requested=False)
    if forward is None:
        C.skip(name, FORWARD, "(whole level)", no_forward, requested=FORWARD in levels)
    elif FORWARD not in levels:
        C.skip(name, FORWARD, "(whole level)", "not requested (pass --forward)", requested=False)
    return info


def run_levels(C, name, out, levels, cache, arithmetic, identity, forward=None, no_forward=None, headline=None):
    """A rule in one call: ev = load_evidence(out, name); records = arithmetic(C, name, ev); then deeper_levels
    with identity(C, name, out, ev, records, model_dir, parquet) -> verified, and forward(C, name, ev, records,
    verified, model_dir) -> figures (or `no_forward`, the reason the experiment has no forward level). Returns the
    figures for audit.json, plus "figures": headline(summary) when summary.json is there and `headline` is given."""
    ev = load_evidence(out, name)
    records = arithmetic(C, name, ev)
    info = deeper_levels(C, name, ev, levels, cache,
                         identity=lambda model_dir, parquet: identity(C, name, out, ev, records, model_dir, parquet),
                         forward=None if forward is None else
                         lambda verified, model_dir: forward(C, name, ev, records, verified, model_dir),
                         no_forward=no_forward)
    if headline is not None and ev["summary"] is not None:
        info["figures"] = headline(ev["summary"])
    return info
