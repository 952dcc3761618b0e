"""Run experiments on verified resources and write per-item evidence.

    python run.py --cache ./cache --out smoke --smoke              # smoke of every experiment (2 items each)
    python run.py --cache ./cache --out O --experiment protocol     # the 64 development items
    python run.py --cache ./cache --out O --split all               # every row of the split, in idx order

Exit codes: 0 success; 1 evidence or identity mismatch (the message names item and field); 2 bad input, failed
verification or missing resource (the message names the file and what to do).

run.py builds one experiments.context.Context per experiment (the verified inputs, the flags it may honour, its
effective config, a stage timer), calls the experiment's run(ctx) and writes the Result it returns. It alone maps
the experiments' exceptions to exit codes. Each experiment's evidence is written into a temporary directory and
renamed into O/<experiment> only when the experiment finished and every check passed, so an interrupted or failed
run never leaves half-written evidence (a failed run leaves O/<experiment>.FAILED.json with the mismatch table
instead). Library chatter (lm-eval, transformers, datasets loggers and Python warnings) goes to O/run.log; the
console keeps progress bars and results (--verbose: everything on the console).

One run per O: an --out that already holds evidence is refused (exit 2) unless --replace, which moves it to the
sibling <O>.replaced-<its run id>; what a killed run left (O/.tmp-*, O/private/.tmp-*) is swept with one line; an
--out that is a file, read-only, or on a full disk (a 1 MiB probe is written, fsynced and deleted) is refused
before anything is loaded. A damaged CACHE/results.sqlite is set aside with one warning before any scoring. Every
run has one run id (uuid4 hex) in each identity.json, O/private/<exp>/run.json, environment.json and report.html.
The run ends with environment.json (only if some evidence was installed), report.html, and MANIFEST.json last
(every public file with size and sha256, the private halves by digest); it prints "evidence digest: sha256:..."
(the sha256 of MANIFEST.json) to cite next to the commit.
"""
import argparse
import hashlib
import importlib
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import config
import local_model
import registry
import report
import resources
from adapter import device_problem
from experiments import EXPERIMENTS, launch, parallel, result_cache
from experiments.context import Context, Data, Inputs, Options
from experiments.evidence import (IdentityMismatch, ScoringError, Stages, environment, evidence_entries,
                                  existing_ancestor, new_run_id, probe_writable, set_aside,
                                  stray_entries, sweep_leftovers, write_json, write_jsonl, write_manifest)
from experiments.runlog import LibraryChatter
from resources import ResourceError


def parse_args(argv=None):

    shared = config.CONFIG["shared"]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", required=True, help="cache directory filled by prepare.py")
    p.add_argument("--out", required=True, help="output directory for evidence")
    p.add_argument("--experiment", choices=EXPERIMENTS, action="append",
                   help="experiment to run (repeatable); default: all")
    p.add_argument("--smoke", action="store_true", help="first 2 development items of each experiment")
    p.add_argument("--split", choices=["dev", "confirm", "all"], default="dev",
                   help="dev (default): the 64 development items; confirm: the 128 held-back confirmation items, only "
                        "when you mean it; all: every row of the data's validation split in idx order (for mctaco "
                        "every document, whole questions), the confirmation items included")
    p.add_argument("--data", help="data resource id (resources.lock.json, or a prepare.py --name import), routed by "
                                  "its schema: SST-2-shaped data to protocol/options/extraction, MC-TACO-shaped "
                                  "data (mc-taco, mc-taco-test, fixture-mctaco, ...) to mctaco; an experiment named "
                                  "with data of the other schema is refused. Default: each experiment's own "
                                  f"(SST-2: {shared['data']}; mctaco: config mctaco_data)")
    p.add_argument("--model", default=shared["model"],
                   help="model resource id from resources.lock.json, or PATH to a local Hugging Face causal-LM "
                        "directory (config.json, *.safetensors, tokenizer.json): every file is hashed into the run "
                        "identity (no lock entry needed); pickled weights are never loaded")
    p.add_argument("--device", default=shared["device"],
                   help=f"torch device for both paths: cpu (default: {shared['device']}) or cuda / cuda:N where a "
                        "GPU is present. Bit-exact agreement is claimed on cpu, in every dtype; on cuda the run "
                        "states the measured max abs diff against config.py's agreement_tolerance")
    p.add_argument("--threads", type=int, default=shared["threads"],
                   help=f"torch threads for both paths (default {shared['threads']}: config.py, from the "
                        "EVAL_TORCH_THREADS environment variable when set); recorded in config and identity")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=shared["dtype"],
                   help=f"weights and activations dtype for both paths (default {shared['dtype']}); on cpu both "
                        "paths agree bit for bit in every dtype (the same tensors through the same kernels)")
    p.add_argument("--no-sort-samples", action="store_true",
                   help="protocol experiment: reproduce lm-eval 0.4.9.2's doc_id defect by passing the item "
                        "indices to lm-eval unsorted on purpose (the rank order, or the rank order reversed when it "
                        "is already ascending, as for the smoke items); the identity join then stops the run with "
                        "exit 1 and a table of mismatched items. With fewer than 2 items no unsorted order exists "
                        "and the run says that nothing could be demonstrated")
    p.add_argument("--fast", action="store_true",
                   help="protocol and mctaco experiments: also score with the fast mode of the independent path "
                        "(batched) and report its max abs diff and argmax changes against parity mode, which stays "
                        "the bit-exact comparison (the other experiments do not use it)")
    p.add_argument("--no-cache", action="store_true",
                   help="bypass the result cache (CACHE/results.sqlite): recompute every independent score, "
                        "store nothing; the official path is never served from the cache either way")
    p.add_argument("--limit", type=int, metavar="N",
                   help="lm-eval's own limit: score only its first N documents (experiments that implement it: "
                        "mctaco). Refused where documents are parts of a group unless --allow-partial-groups")
    p.add_argument("--allow-partial-groups", action="store_true",
                   help="with --limit: accept that the cut splits a question's candidates; the output lists every "
                        "cut question and marks all metrics as computed on an incomplete set")
    p.add_argument("--replace", action="store_true",
                   help="--out already holds evidence: move it aside to the sibling <OUT>.replaced-<its run id> "
                        "(printed) and write this run into OUT; without it such an --out is refused")
    p.add_argument("--verbose", action="store_true",
                   help="print the libraries' own log messages and warnings on the console (default: O/run.log)")
    p.add_argument("--shard", metavar="K/N",
                   help="score only shard K of N (1-based; the fixed rule of experiments/parallel.py) into --out, "
                        "the shard's own directory (SHARD.json: raw results, not evidence), for schedulers without a "
                        "shared launcher (Slurm arrays); join the N directories with --merge")
    p.add_argument("--merge", nargs="+", metavar="SHARD_OUT",
                   help="join the --out directories of every --shard K/N of one run into normal evidence in --out; "
                        "the scoring arguments come from the shards (give only --cache, --out, --replace, --verbose)")
    args = p.parse_args(argv)
    if args.smoke and args.split in ("confirm", "all"):
        p.error(f"--smoke takes development items; it cannot be combined with --split {args.split}")
    if args.shard is not None:
        args.shard = parse_shard(args.shard) or p.error(f"--shard {args.shard}: expected K/N with 1 <= K <= N")
    if args.shard and args.merge:
        p.error("--shard scores one shard, --merge joins them: give one of the two")
    return args


def parse_shard(text):
    """(K, N) from 'K/N' with 1 <= K <= N, else None."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        return None
    return int(k), int(n)


def check_flags(args):
    """Flag combinations refused before anything is loaded."""
    if args.threads < 1:
        raise ResourceError(f"--threads {args.threads}: expected an integer >= 1")
    if args.fast and args.device != "cpu":
        raise ResourceError(f"--fast with --device {args.device}: fast mode (experiments/fast_scoring.py) runs on the "
                            "cpu only; drop --fast or use --device cpu")
    if args.allow_partial_groups and args.limit is None:
        raise ResourceError("--allow-partial-groups only applies together with --limit N")
    if args.limit is not None and (args.limit < 1 or args.smoke):
        raise ResourceError(f"--limit {args.limit}: expected N >= 1, without --smoke (the two select documents "
                            "differently)")


def check_limit(args, modules):
    """--limit against the experiments' contract attributes SUPPORTS_LIMIT and DOCUMENTS_ARE_GROUP_PARTS."""
    if args.limit is None:
        return
    unsupported = [n for n, m in modules.items() if not getattr(m, "SUPPORTS_LIMIT", False)]
    grouped = [n for n, m in modules.items() if getattr(m, "DOCUMENTS_ARE_GROUP_PARTS", False)]
    if unsupported:
        raise ResourceError(f"--limit is not implemented for experiment(s) {', '.join(unsupported)}; name one that "
                            "implements it, e.g. --experiment mctaco")
    if grouped and not args.allow_partial_groups:
        raise ResourceError(f"--limit {args.limit} refused: {', '.join(grouped)} documents are parts of a group (one "
                            f"per candidate answer of a question), so the first {args.limit} documents can cut a "
                            "question's candidates and make acc/F1/EM misleading; add --allow-partial-groups to "
                            "accept it")


def import_experiments(names, chatter):
    """{name: module} of the experiments to run, and the seconds the imports took (torch, transformers, lm-eval
    come with them): the `imports` row of the first experiment's stages.json. The libraries' log messages are
    routed first (runlog.py), so nothing they print while importing reaches the console."""
    t0 = time.perf_counter()
    chatter.route()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    modules = {name: importlib.import_module(registry.find(name).runner) for name in names}
    return modules, time.perf_counter() - t0


def route_data(args, modules, named):
    """--data by schema (an experiment's DATA_SCHEMA: "sst2" by default, "mctaco", None for none). Returns
    {experiment: config overrides}. MC-TACO data given to an SST-2 experiment, or SST-2 data to an experiment named
    with --experiment that reads MC-TACO, is refused on one line; with no --experiment (every experiment), mctaco
    keeps its own config mctaco_data when --data is SST-2-shaped (said on the console; config.json records which
    data it scored and how it was chosen: experiments/mctaco.py data_routing)."""
    given = args.data is not None
    args.data = args.data if given else config.CONFIG["shared"]["data"]
    entry = resources.load_manifest(args.cache)["resources"].get(args.data) if given else None
    if not given or entry is None or entry.get("kind") != "data":
        return {}                       # nothing to route (verified_inputs names a missing resource)
    schema = entry.get("schema", "sst2")
    wants = {n: getattr(m, "DATA_SCHEMA", "sst2") for n, m in modules.items()}
    wrong = [n for n, w in wants.items() if w not in (None, schema)]
    nouns = {"sst2": "SST-2-shaped", "mctaco": "MC-TACO-shaped"}
    if wrong and (named or schema != "sst2"):
        theirs = " / ".join(sorted({nouns.get(wants[n], wants[n]) for n in wrong}))
        raise ResourceError(f"--data {args.data} is {nouns.get(schema, schema)} data; experiment(s) "
                            f"{', '.join(wrong)} score {theirs} data: name data of that schema, or only the "
                            "experiments that read it")
    for n in wrong:
        print(f"note: --data {args.data} is {nouns.get(schema, schema)}; {n} scores its own configured data")
    return {n: {"mctaco_data": args.data} for n, w in wants.items() if w == "mctaco" and schema == "mctaco"}


def check_device(args):
    """--device: cpu, or cuda[:N] only where torch sees that GPU (after the imports: it asks torch)."""
    problem = device_problem(args.device)
    if problem:
        raise ResourceError(f"--device {args.device}: {problem}")


def verified_inputs(args, modules, routed=None):
    """The model and every data resource the experiments read, each verified once, before anything is loaded.
    --model is a lock id or a local directory (local_model.local_identity). An experiment reads the resource its
    effective config names under DATA_CONFIG_KEY ("data": --data; mctaco: "mctaco_data"), none when its
    DATA_SCHEMA is None; each is re-hashed through the manifest, checked against the lock that pins it and its
    rows re-hashed (resources.verified_rows), and must have the experiment's schema."""
    cache = Path(args.cache)
    manifest = resources.prepared_manifest(cache)
    model_dir, model_identity = resources.verified_model(cache, args.model, manifest, local_model.local_identity)
    data = {}
    for name, module in modules.items():
        if data_key(module) is None:
            continue
        schema, data_id = getattr(module, "DATA_SCHEMA", "sst2"), data_id_of(module, args, routed)
        if data_id not in data:
            parquet, entry, _ = resources.verified_rows(cache, data_id, manifest)
            data[data_id] = Data(id=data_id, schema=entry.get("schema", "sst2"), parquet_path=parquet,
                                 content_sha256=entry["content_sha256"], split=entry.get("split", "validation"))
        if data[data_id].schema != schema:
            raise ResourceError(f"{cache / resources.MANIFEST}: resource {data_id!r} is {data[data_id].schema} data; "
                                f"experiment {name} reads {schema} data: name data of that schema")
    return Inputs(cache=cache, model_dir=model_dir, model_identity=model_identity, data=data)


def data_key(module):
    """The key of an experiment's effective config naming the data it reads (DATA_CONFIG_KEY, "data" unless it
    says otherwise); None for an experiment that reads none (DATA_SCHEMA None)."""
    if getattr(module, "DATA_SCHEMA", "sst2") is None:
        return None
    return getattr(module, "DATA_CONFIG_KEY", "data")


def data_id_of(module, args, routed=None):
    """The data resource an experiment reads: its effective config's data_key (--data, or the key route_data set
    for it)."""
    effective = config.effective(module.CONFIG_SECTIONS, {"data": args.data, **(routed or {}).get(module.NAME, {})})
    return effective[data_key(module)]


def options_of(args):
    return Options(out=Path(args.out), no_sort_samples=args.no_sort_samples, fast=args.fast, no_cache=args.no_cache,
                   limit=args.limit, allow_partial_groups=args.allow_partial_groups, verbose=args.verbose)


def check_model_fits(modules, inputs):
    """A local --model directory without a chat template cannot run the experiments that render chat prompts
    (NEEDS_CHAT_TEMPLATE): refused before anything is loaded, naming them."""
    if inputs.model_identity.get("source") != "local" or local_model.has_chat_template(inputs.model_dir):
        return
    needs = [name for name, m in modules.items() if getattr(m, "NEEDS_CHAT_TEMPLATE", False)]
    if needs:
        raise ResourceError(f"--model {inputs.model_dir}: no chat template (tokenizer_config.json chat_template or "
                            f"chat_template.jinja), which experiment(s) {', '.join(needs)} need; name the others "
                            "with --experiment (protocol, options, mctaco)")


def numerics_overrides(args):
    """--device, --threads, --dtype as overrides of config.py's shared keys (the single source of their defaults)."""
    return {"device": args.device, "threads": args.threads, "dtype": args.dtype}


def context_for(module, args, inputs, options, stages, routed=None, plan=None, env=None):
    """The experiment's Context: its effective config is its CONFIG_SECTIONS merged flat, with --model (the lock id,
    or the local directory's resolved path), --data, --device, --threads and --dtype (and, for an experiment --data
    was routed to by schema, its own data key: route_data)."""
    split = "smoke" if args.smoke else args.split
    local = inputs.model_identity.get("source") == "local"
    model = inputs.model_identity["id"] if local else args.model
    effective = config.effective(module.CONFIG_SECTIONS, {"model": model, "data": args.data,
                                                          **numerics_overrides(args),
                                                          **(routed or {}).get(module.NAME, {})})
    data = inputs.data.get(effective[data_key(module)]) if data_key(module) is not None else None
    return Context(name=module.NAME, split=split, config=effective, inputs=inputs, options=options, stages=stages,
                   plan=plan, data=data, environment=env)


def sha256_json(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def run_identity(env, ctx, sections, result):
    """The full identity of this run: a cached score may only serve a request whose identity matches all of it.

    The scoring config is the experiment's effective config (config.json "config"), i.e. the config.py sections in
    `sections` merged flat; the result cache keys on the same dict (result_cache.scoring_config)."""
    return {
        "model_sha256": ctx.inputs.model_identity["model_sha256"],
        "tokenizer_sha256": ctx.inputs.model_identity["tokenizer_sha256"],
        **local_model_identity(ctx.inputs.model_identity),
        "data_content_sha256": ctx.data.content_sha256 if ctx.data is not None else None,   # the data it read
        "prompt_template_sha256": result.prompt_template_sha256,
        "scoring_config": ctx.config,
        "scoring_config_sha256": sha256_json(ctx.config),
        "config_sections": list(sections),
        "git_commit": env["git_commit"], "git_dirty": env["git_dirty"], "code_sha256": env["code_sha256"],
        "versions": env["versions"],
        "official_config_sha256": sha256_json(result.config.get("official")),
        "run_id": env["run_id"],
    }


def local_model_identity(model_identity):
    """A local --model directory's per-file hashes and source (identity.json model_files, model_source): the
    model_sha256 and tokenizer_sha256 above are derived from them (local_model.HASH_RULE). {} for a lock id."""
    if model_identity.get("source") != "local":
        return {}
    return {"model_source": "local", "model_files": model_identity["files"]}


def install(tmp_dir, final_dir):
    """Move tmp_dir to final_dir by rename. One run per O means final_dir does not exist; if it does (the same
    experiment named twice), the old one is moved into a temp name inside its own area first and removed after."""
    final_dir = Path(final_dir)
    old = None
    if final_dir.exists():
        old = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".tmp-old-{final_dir.name}-")) / final_dir.name
        final_dir.rename(old)
    Path(tmp_dir).rename(final_dir)
    if old is not None:
        shutil.rmtree(old.parent)


def write_evidence(out, ctx, module, result, env, started, data_parallel=None):
    """Every evidence file of one experiment, written into temp directories inside the areas they become
    (O/.tmp-<exp>-*, O/private/.tmp-<exp>-*) and installed by rename.

    stages.json's total_wall_s is this experiment's own wall time: from `started` (just before run(ctx)) to the
    end of the write stage. O/private/<exp>/run.json ties the private half to the public one (the run id).
    A data-parallel run (or a merge) adds stages.json "data_parallel": world size and every rank's (or shard's)
    own stages, wall time and peak RSS."""
    name, stages = ctx.name, ctx.stages
    (out / "private").mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=f".tmp-{name}-"))
    tmp_private = Path(tempfile.mkdtemp(dir=out / "private", prefix=f".tmp-{name}-"))
    try:
        with stages.stage("write"):
            write_json(tmp / "config.json", result.config)
            write_json(tmp / "identity.json", run_identity(env, ctx, module.CONFIG_SECTIONS, result))
            write_jsonl(tmp / "records.jsonl", result.records)
            write_json(tmp / "summary.json", result.summary)
            for fname, content in result.public.items():
                resources.atomic_write_text(tmp / fname, content)
            for fname, content in result.private.items():
                resources.atomic_write_text(tmp_private / fname, content)
            write_json(tmp_private / "run.json", {"experiment": name, "run_id": env["run_id"]})
        write_json(tmp / "stages.json", {"stages": stages.stages, "tokens": result.token_stats,
                                         "threads": ctx.config["threads"],
                                         "total_wall_s": round(time.perf_counter() - started, 4),
                                         "peak_rss_semantics": "process peak RSS up to the end of the stage",
                                         **({"data_parallel": data_parallel} if data_parallel else {})})
        install(tmp, out / name)
        install(tmp_private, out / "private" / name)
    finally:
        for d in (tmp, tmp_private):
            if d.exists():
                shutil.rmtree(d)


def write_failure(out, name, err):
    rows = [{"idx": r[0], "field": r[1], "official": r[2], "independent": r[3]} for r in err.rows]
    failure = {"experiment": name, "error": str(err), "mismatches": rows}
    if err.details:
        failure["details"] = err.details
    write_json(Path(out) / f"{name}.FAILED.json", failure)
    print(f"\nIDENTITY/EVIDENCE MISMATCH in {name}: {err}", file=sys.stderr)
    for key, value in (err.details or {}).items():
        print(f"  {key}: {value}", file=sys.stderr)
    print(f"{'idx':>6}  {'field':<28} {'official':<40} independent", file=sys.stderr)
    for r in rows[:50]:
        print(f"{str(r['idx']):>6}  {r['field']:<28} {str(r['official'])[:40]:<40} {str(r['independent'])[:60]}",
              file=sys.stderr)
    if len(rows) > 50:
        print(f"... {len(rows) - 50} more rows in {Path(out) / f'{name}.FAILED.json'}", file=sys.stderr)


def run_experiment(module, ctx, env):
    """Run one experiment and install its evidence; 0, or 1 on an identity mismatch or a scoring error.
    A ResourceError propagates: bad input stops the whole run (exit 2); so does a disk that cannot take the
    evidence (the temp directories are removed, nothing already installed is touched)."""
    out, name, plan = ctx.options.out, ctx.name, ctx.plan
    print(f"[{name}] split={ctx.split} data={module.data_label(ctx)} model={ctx.inputs.model_identity['id']}")
    started = time.perf_counter()
    try:
        result = module.run(ctx)
    except parallel.ShardScored:
        launch.shard_scored(plan, name, ctx.stages.stages, started)
        return 0
    except IdentityMismatch as e:
        if parallel.is_writer(plan):
            disk_errors(write_failure, out, name, e)
        return 1
    except (ScoringError, parallel.RankFailure) as e:
        print(f"error: [{name}] {e}", file=sys.stderr)
        return 1
    data_parallel = launch.rank_stages(plan, name, ctx.stages.stages, started)   # collective: every rank is here
    if not parallel.is_writer(plan):
        return 0
    print(f"[{name}] {result.headline}")
    if plan.mode == "replay":          # a merge installs nothing before every experiment replayed
        plan.pending.append((out, ctx, module, result, env, time.perf_counter() - started, data_parallel))
        return 0
    install_evidence(out, ctx, module, result, env, started, data_parallel)
    return 0


def install_evidence(out, ctx, module, result, env, started, data_parallel):
    disk_errors(write_evidence, out, ctx, module, result, env, started, data_parallel)
    print(f"[{ctx.name}] evidence: {out / ctx.name}/ (private texts: {out / 'private' / ctx.name}/)")


def disk_errors(write, out, *args):
    """Call write(out, *args); an OSError (full disk, read-only file system) becomes one ResourceError line."""
    try:
        write(out, *args)
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        raise ResourceError(f"{out}: could not write evidence ({e.strerror or e}{where}); the temporary files were "
                            "removed and nothing already installed was touched")


def write_report(out, names):
    if not any((out / n / "summary.json").exists() for n in names):
        return
    try:  # the evidence is already installed; a report that cannot be written must not hide it
        print(f"report: {report.write(out)}")
    except OSError as e:
        print(f"warning: report.html not written ({e}); run: python report.py {out}", file=sys.stderr)


# ---- the output directory: one run per O, leftovers swept, a usable disk, evidence renamed into place ----------

def check_out(args, experiment_names):
    """Refuse an unusable --out before anything is imported or loaded: a file, a directory holding evidence of an
    earlier run (without --replace), a directory (or, for a new one, its nearest existing parent) that does not take
    a small probe file: read-only, not writable, or a full disk."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ResourceError(f"--out {out}: exists and is not a directory; name a directory for the evidence")
    if out.is_dir():
        held = evidence_entries(out, experiment_names)
        if held and not args.replace:
            raise ResourceError(f"--out {out}: already holds the evidence of an earlier run ({', '.join(held[:5])}); "
                                "one run per output directory: name a new --out, or add --replace to move the old "
                                f"one aside to {out.name}.replaced-<its run id>")
        strays = [] if held else stray_entries(out, experiment_names)
        if strays:
            raise ResourceError(f"--out {out}: holds {len(strays)} entr{'y' if len(strays) == 1 else 'ies'} no run "
                                f"writes ({', '.join(strays[:5])}); every file in O becomes part of the evidence: "
                                "name a new or empty directory")
    where = existing_ancestor(out)
    if not where.is_dir():
        raise ResourceError(f"--out {out}: {where} exists and is not a directory")
    problem = probe_writable(where)
    if problem:
        raise ResourceError(f"--out {out}: {where}: {problem}")


def setup_out(args, experiment_names):
    """Create O for this run: with --replace the old evidence is moved aside first (said where); leftovers of a
    killed run are swept (said what)."""
    out = Path(args.out)
    try:
        if out.is_dir() and args.replace and evidence_entries(out, experiment_names):
            print(f"--replace: the earlier evidence in {out} was moved to {set_aside(out)}")
        elif out.is_dir():
            removed = sweep_leftovers(out)
            if removed:
                print(f"swept the leftovers of an interrupted run from {out}: {', '.join(removed)}")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResourceError(f"--out {out}: cannot prepare it ({e.strerror or e})")
    return out


def check_result_caches(args, modules, inputs):
    """Before any scoring: a result cache that SQLite cannot read, or whose tables have another shape, is set aside
    (renamed results.sqlite.corrupt-<time>) with one warning; the experiments then start a new one."""
    if args.no_cache:
        return
    files = {config.effective(m.CONFIG_SECTIONS, {}).get("result_cache_file", result_cache.DEFAULT_FILE)
             for m in modules.values()}
    for fname in sorted(files):
        try:
            warning = result_cache.set_aside_if_corrupt(Path(inputs.cache) / fname)
        except OSError as e:
            raise ResourceError(f"{Path(inputs.cache) / fname}: damaged, and it cannot be set aside ({e.strerror or e})"
                                "; remove it, or run with --no-cache")
        if warning:
            print(f"warning: {warning}", file=sys.stderr)


def finish(out, env, installed, failed, chatter):
    """The end of a run: environment.json (only if some evidence was installed), report.html, MANIFEST.json last;
    print the evidence digest. Nothing at all when the run left no evidence (the next run may reuse O)."""
    if not installed and not failed:
        return
    if installed:
        write_json(out / "environment.json", env)
        write_report(out, installed)
    chatter.close()                     # run.log is listed in the manifest: nothing may be appended after it
    digest = write_manifest(out, env["run_id"], installed, failed)
    print(f"evidence: {out}/MANIFEST.json (run id {env['run_id']})")
    print(f"evidence digest: sha256:{digest}")


def run_experiments(plan, args, modules, imports_s, inputs, options, env, done, routed=None):
    """Every experiment in order; the worst exit code (0 or 1); `done` collects installed and failed names."""
    exit_code = 0
    for k, module in enumerate(modules.values()):
        stages = Stages()
        if k == 0:  # the imports happened once, before the first experiment
            stages.stages.append({"name": "imports", "wall_s": round(imports_s, 4), "peak_rss_bytes_at_end": None})
        ctx = context_for(module, args, inputs, options, stages, routed, plan, env)
        code = run_experiment(module, ctx, env)
        exit_code = max(exit_code, code)
        if code == 0 and plan.mode not in ("shard", "replay"):
            done["installed"].append(module.NAME)
        elif (options.out / f"{module.NAME}.FAILED.json").exists():
            done["failed"].append(module.NAME)
    for out, ctx, module, result, env, elapsed, data_parallel in plan.pending:
        # --merge: every experiment replayed (every shard item found); its own wall time is kept
        install_evidence(out, ctx, module, result, env, time.perf_counter() - elapsed, data_parallel)
        done["installed"].append(ctx.name)
    return exit_code


def run_all(args, chatter):
    """Every requested experiment in order; the worst exit code (0 or 1). Raises ResourceError (exit 2).

    Under torchrun / accelerate launch every rank runs this; rank 0 alone checks and writes O (its checks' verdicts
    are broadcast, so a refusal stops every rank with the same line)."""
    check_flags(args)
    plan, shard_docs = launch.plan_for(args, defaults=vars(parse_args(["--cache", "-", "--out", "-"])))
    try:
        return run_planned(plan, shard_docs, args, chatter)
    finally:
        parallel.shutdown(plan)


def run_planned(plan, shard_docs, args, chatter):
    """run_all once the run's plan is made (experiments/launch.py): the checks, the experiments, the evidence."""
    args.as_given = launch.scoring_args(args)   # the shard identity: the arguments before route_data fills defaults
    check_flags(args)
    launch.on_rank0(plan, check_out, args, EXPERIMENTS)
    modules, imports_s = import_experiments(list(dict.fromkeys(args.experiment or EXPERIMENTS)), chatter)
    check_limit(args, modules)
    routed = route_data(args, modules, named=bool(args.experiment))
    launch.check_parallel(plan, args, modules)
    check_numerics(args, modules)
    check_device(args)
    inputs = verified_inputs(args, modules, routed)
    check_model_fits(modules, inputs)
    launch.on_rank0(plan, check_result_caches, args, modules, inputs)
    import torch        # loaded with the experiments (import_experiments, timed); here only to set the threads

    out = launch.on_rank0(plan, setup_out, args, EXPERIMENTS) or Path(args.out)
    options = options_of(args)
    torch.set_num_threads(args.threads)  # process-wide: both paths alike (--threads, default config.py)
    env = parallel.broadcast(plan, {**environment(args.threads), "run_id": new_run_id()})
    configs = {name: context_for(m, args, inputs, options, Stages(), routed).config for name, m in modules.items()}
    identity = launch.check_merge_identity(plan, args, configs, inputs, env, shard_docs)
    if parallel.is_writer(plan):
        chatter.to_file(out / "run.log", " ".join(["run.py", *sys.argv[1:]]) + f" (run id {env['run_id']})")
    if args.split == "confirm":
        print("*** CONFIRMATION SPLIT: scoring the 128 held-back items; every output says so ***")
    elif args.split == "all":
        print("*** SPLIT ALL: scoring every row of the validation split in idx order, the held-back confirmation "
              "items included; every output says so ***")
    done = {"installed": [], "failed": []}
    started = time.perf_counter()
    try:
        exit_code = run_experiments(plan, args, modules, imports_s, inputs, options, env, done, routed)
        if exit_code == 0 and plan.mode == "shard":
            launch.write_shard_file(plan, out, identity, env)
    finally:       # also when a ResourceError stops the run: what was installed gets its manifest
        env = launch.with_rank_environment(plan, env, started)
        finished = finish_safely(out, env, done, chatter) if parallel.is_writer(plan) else True
    return exit_code if finished else 2


def check_numerics(args, modules):
    """On the cpu both paths run the same tensors through the same kernels, so every experiment claims exact
    agreement in every dtype. Off the cpu (--device cuda) only an experiment that states a tolerance-based agreement
    claim may run (protocol: summary.json agreement_claim); the others compare their two paths bit for bit only
    (EXACT_AGREEMENT_ONLY), so they are refused on one line rather than failing after scoring."""
    if args.device == "cpu":
        return
    exact_only = [n for n, m in modules.items() if getattr(m, "EXACT_AGREEMENT_ONLY", False)]
    if exact_only:
        raise ResourceError(f"--device {args.device}: experiment(s) {', '.join(exact_only)} claim exact agreement "
                            "only, which is shown on the cpu (any --dtype); run them there, and name the others with "
                            "--experiment (protocol states a tolerance-based claim off the cpu)")


def finish_safely(out, env, done, chatter):
    """finish(); False (after one error line) when the disk refuses the run's last files."""
    try:
        finish(out, env, done["installed"], done["failed"], chatter)
        return True
    except OSError as e:
        print(f"error: {out}: the run's last files (environment.json, report.html, MANIFEST.json) could not be "
              f"written ({e.strerror or e}); the evidence of this run is incomplete", file=sys.stderr)
        return False


def main(argv=None):
    args = parse_args(argv)
    chatter = LibraryChatter(verbose=args.verbose)
    try:
        return run_all(args, chatter)
    except ResourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except sqlite3.DatabaseError as e:
        print(f"error: the result cache (CACHE/results.sqlite) failed during the run ({e}); it is set aside at the "
              "next start; rerun, or use --no-cache", file=sys.stderr)
        return 2
    finally:
        chatter.close()


if __name__ == "__main__":
    sys.exit(main())
