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
import resources
from experiments.context import Context, Inputs, Options
from experiments.runlog import LibraryChatter
from resources import ResourceError


def parse_args(argv=None):
    from experiments import EXPERIMENTS

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
    p.add_argument("--data", default=shared["data"], help="data resource id from resources.lock.json")
    p.add_argument("--model", default=shared["model"], help="model resource id from resources.lock.json")
    p.add_argument("--no-sort-samples", action="store_true",
                   help="protocol experiment: reproduce lm-eval 0.4.9.2's doc_id defect by passing the item "
                        "indices to lm-eval unsorted on purpose (the rank order, or the rank order reversed when it "
                        "is already ascending, as for the smoke items); the identity join then stops the run with "
                        "exit 1 and a table of mismatched items. With fewer than 2 items no unsorted order exists "
                        "and the run says that nothing could be demonstrated")
    p.add_argument("--fast", action="store_true",
                   help="also score with the fast mode of the independent path (batched) and report its max abs "
                        "diff and argmax changes against parity mode, which stays the bit-exact comparison")
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
    args = p.parse_args(argv)
    if args.smoke and args.split in ("confirm", "all"):
        p.error(f"--smoke takes development items; it cannot be combined with --split {args.split}")
    return args


def check_flags(args):
    """Flag combinations refused before anything is loaded."""
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

    modules = {name: importlib.import_module(f"experiments.{name}") for name in names}
    return modules, time.perf_counter() - t0


def verified_inputs(args):
    model_dir, parquet, model_identity, data_entry = resources.verified_inputs(args.cache, args.model, args.data)
    return Inputs(cache=Path(args.cache), model_dir=model_dir, model_identity=model_identity, data_id=args.data,
                  parquet_path=parquet, data_content_sha256=data_entry["content_sha256"])


def options_of(args):
    return Options(out=Path(args.out), no_sort_samples=args.no_sort_samples, fast=args.fast, no_cache=args.no_cache,
                   limit=args.limit, allow_partial_groups=args.allow_partial_groups, verbose=args.verbose)


def context_for(module, args, inputs, options, stages):
    """The experiment's Context: its effective config is its CONFIG_SECTIONS merged flat, with --model and --data."""
    split = "smoke" if args.smoke else args.split
    effective = config.effective(module.CONFIG_SECTIONS, {"model": args.model, "data": args.data})
    return Context(name=module.NAME, split=split, config=effective, inputs=inputs, options=options, stages=stages)


def sha256_json(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def run_identity(env, ctx, sections, result):
    """The full identity of this run: a cached score may only serve a request whose identity matches all of it.

    The scoring config is the experiment's effective config (config.json "config"), i.e. the config.py sections in
    `sections` merged flat; the result cache keys on the same dict (result_cache.scoring_config)."""
    return {
        "model_sha256": ctx.inputs.model_identity["model_sha256"],
        "tokenizer_sha256": ctx.inputs.model_identity["tokenizer_sha256"],
        # an experiment with its own data (mctaco) names it; the others score the --data resource
        "data_content_sha256": result.config.get("data_content_sha256", ctx.inputs.data_content_sha256),
        "prompt_template_sha256": result.prompt_template_sha256,
        "scoring_config": ctx.config,
        "scoring_config_sha256": sha256_json(ctx.config),
        "config_sections": list(sections),
        "git_commit": env["git_commit"], "git_dirty": env["git_dirty"], "code_sha256": env["code_sha256"],
        "versions": env["versions"],
        "official_config_sha256": sha256_json(result.config.get("official")),
        "run_id": env["run_id"],
    }


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


def write_evidence(out, ctx, module, result, env, started):
    """Every evidence file of one experiment, written into temp directories inside the areas they become
    (O/.tmp-<exp>-*, O/private/.tmp-<exp>-*) and installed by rename.

    stages.json's total_wall_s is this experiment's own wall time: from `started` (just before run(ctx)) to the
    end of the write stage. O/private/<exp>/run.json ties the private half to the public one (the run id)."""
    from experiments.evidence import write_json, write_jsonl

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
                                         "peak_rss_semantics": "process peak RSS up to the end of the stage"})
        install(tmp, out / name)
        install(tmp_private, out / "private" / name)
    finally:
        for d in (tmp, tmp_private):
            if d.exists():
                shutil.rmtree(d)


def write_failure(out, name, err):
    from experiments.evidence import write_json

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
    from experiments.evidence import IdentityMismatch
    from experiments.scoring import ScoringError

    out, name = ctx.options.out, ctx.name
    print(f"[{name}] split={ctx.split} data={module.data_label(ctx)} model={ctx.inputs.model_identity['id']}")
    started = time.perf_counter()
    try:
        result = module.run(ctx)
    except IdentityMismatch as e:
        disk_errors(write_failure, out, name, e)
        return 1
    except ScoringError as e:
        print(f"error: [{name}] {e}", file=sys.stderr)
        return 1
    disk_errors(write_evidence, out, ctx, module, result, env, started)
    print(f"[{name}] {result.headline}")
    print(f"[{name}] evidence: {out / name}/ (private texts: {out / 'private' / name}/)")
    return 0


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
    import report

    try:  # the evidence is already installed; a report that cannot be written must not hide it
        print(f"report: {report.write(out)}")
    except OSError as e:
        print(f"warning: report.html not written ({e}); run: python report.py {out}", file=sys.stderr)


# ---- the output directory (PLAN15 decisions 1-4) ---------------------------------------------------------------

def check_out(args, experiment_names):
    """Refuse an unusable --out before anything is imported or loaded: a file, a directory holding evidence of an
    earlier run (without --replace), a directory (or, for a new one, its nearest existing parent) that does not take
    a small probe file: read-only, not writable, or a full disk."""
    from experiments.evidence import evidence_entries, existing_ancestor, probe_writable, stray_entries

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
    from experiments.evidence import evidence_entries, set_aside, sweep_leftovers

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
    from experiments import result_cache

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
    from experiments.evidence import write_json, write_manifest

    if not installed and not failed:
        return
    if installed:
        write_json(out / "environment.json", env)
        write_report(out, installed)
    chatter.close()                     # run.log is listed in the manifest: nothing may be appended after it
    digest = write_manifest(out, env["run_id"], installed, failed)
    print(f"evidence: {out}/MANIFEST.json (run id {env['run_id']})")
    print(f"evidence digest: sha256:{digest}")


def run_experiments(args, modules, imports_s, inputs, options, env, done):
    """Every experiment in order; the worst exit code (0 or 1); `done` collects installed and failed names."""
    from experiments.evidence import Stages

    exit_code = 0
    for k, module in enumerate(modules.values()):
        stages = Stages()
        if k == 0:  # the imports happened once, before the first experiment
            stages.stages.append({"name": "imports", "wall_s": round(imports_s, 4), "peak_rss_bytes_at_end": None})
        ctx = context_for(module, args, inputs, options, stages)
        code = run_experiment(module, ctx, env)
        exit_code = max(exit_code, code)
        if code == 0:
            done["installed"].append(module.NAME)
        elif (options.out / f"{module.NAME}.FAILED.json").exists():
            done["failed"].append(module.NAME)
    return exit_code


def run_all(args, chatter):
    """Every requested experiment in order; the worst exit code (0 or 1). Raises ResourceError (exit 2)."""
    from experiments import EXPERIMENTS
    from experiments.evidence import environment, new_run_id

    check_flags(args)
    check_out(args, EXPERIMENTS)
    modules, imports_s = import_experiments(list(dict.fromkeys(args.experiment or EXPERIMENTS)), chatter)
    check_limit(args, modules)
    inputs = verified_inputs(args)
    check_result_caches(args, modules, inputs)
    import torch

    out = setup_out(args, EXPERIMENTS)
    options = options_of(args)
    env = {**environment(config.CONFIG["shared"]["threads"]), "run_id": new_run_id()}
    chatter.to_file(out / "run.log", " ".join(["run.py", *sys.argv[1:]]) + f" (run id {env['run_id']})")
    torch.set_num_threads(config.CONFIG["shared"]["threads"])  # process-wide: both paths alike
    if args.split == "confirm":
        print("*** CONFIRMATION SPLIT: scoring the 128 held-back items; every output says so ***")
    elif args.split == "all":
        print("*** SPLIT ALL: scoring every row of the validation split in idx order, the held-back confirmation "
              "items included; every output says so ***")
    done = {"installed": [], "failed": []}
    try:
        exit_code = run_experiments(args, modules, imports_s, inputs, options, env, done)
    finally:       # also when a ResourceError stops the run: what was installed gets its manifest
        finished = finish_safely(out, env, done, chatter)
    return exit_code if finished else 2


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
