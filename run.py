"""Run experiments on verified resources and write per-item evidence.

    python run.py --cache ./cache --out smoke --smoke              # smoke of every experiment (2 items each)
    python run.py --cache ./cache --out O --experiment protocol     # the 64 development items

Exit codes: 0 success; 1 evidence or identity mismatch (the message names item and field); 2 bad input, failed
verification or missing resource (the message names the file and what to do).

run.py builds one experiments.context.Context per experiment (the verified inputs, the flags it may honour, its
effective config, a stage timer), calls the experiment's run(ctx) and writes the Result it returns. It alone maps
the experiments' exceptions to exit codes. Each experiment's evidence is written into a temporary directory and
renamed into O/<experiment> only when the experiment finished and every check passed, so an interrupted or failed
run never leaves half-written evidence (a failed run leaves O/<experiment>.FAILED.json with the mismatch table
instead). Library chatter (lm-eval, transformers, datasets loggers and Python warnings) goes to O/run.log; the
console keeps progress bars and results (--verbose: everything on the console).
"""
import argparse
import hashlib
import importlib
import json
import shutil
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
    p.add_argument("--split", choices=["dev", "confirm"], default="dev",
                   help="dev (default) or confirm: the 128 held-back confirmation items; only when you mean it")
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
    p.add_argument("--verbose", action="store_true",
                   help="print the libraries' own log messages and warnings on the console (default: O/run.log)")
    args = p.parse_args(argv)
    if args.smoke and args.split == "confirm":
        p.error("--smoke takes development items; it cannot be combined with --split confirm")
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
    }


def install(tmp_dir, final_dir):
    """Replace final_dir by tmp_dir with two renames (the old evidence is kept until the new one is in place)."""
    final_dir = Path(final_dir)
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old-{int(time.time() * 1000)}")
        final_dir.rename(old)
    Path(tmp_dir).rename(final_dir)
    if old is not None:
        shutil.rmtree(old)


def write_evidence(out, ctx, module, result, env, started):
    """Every evidence file of one experiment, written into temp directories and installed by rename.

    stages.json's total_wall_s is this experiment's own wall time: from `started` (just before run(ctx)) to the
    end of the write stage."""
    from experiments.evidence import write_json, write_jsonl

    name, stages = ctx.name, ctx.stages
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}.tmp-"))
    tmp_private = Path(tempfile.mkdtemp(dir=out, prefix=f".private-{name}.tmp-"))
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
        write_json(tmp / "stages.json", {"stages": stages.stages, "tokens": result.token_stats,
                                         "threads": ctx.config["threads"],
                                         "total_wall_s": round(time.perf_counter() - started, 4),
                                         "peak_rss_semantics": "process peak RSS up to the end of the stage"})
        (out / "private").mkdir(exist_ok=True)
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
    A ResourceError propagates: bad input stops the whole run (exit 2)."""
    from experiments.evidence import IdentityMismatch
    from experiments.scoring import ScoringError

    out, name = ctx.options.out, ctx.name
    (out / f"{name}.FAILED.json").unlink(missing_ok=True)
    print(f"[{name}] split={ctx.split} data={module.data_label(ctx)} model={ctx.inputs.model_identity['id']}")
    started = time.perf_counter()
    try:
        result = module.run(ctx)
    except IdentityMismatch as e:
        write_failure(out, name, e)
        return 1
    except ScoringError as e:
        print(f"error: [{name}] {e}", file=sys.stderr)
        return 1
    write_evidence(out, ctx, module, result, env, started)
    print(f"[{name}] {result.headline}")
    print(f"[{name}] evidence: {out / name}/ (private texts: {out / 'private' / name}/)")
    return 0


def write_report(out, names):
    if not any((out / n / "summary.json").exists() for n in names):
        return
    import report

    try:  # the evidence is already installed; a report that cannot be written must not hide it
        print(f"report: {report.write(out)}")
    except OSError as e:
        print(f"warning: report.html not written ({e}); run: python report.py {out}", file=sys.stderr)


def run_all(args, chatter):
    """Every requested experiment in order; the worst exit code (0 or 1). Raises ResourceError (exit 2)."""
    import torch

    from experiments import EXPERIMENTS
    from experiments.evidence import Stages, environment, write_json

    check_flags(args)
    modules, imports_s = import_experiments(args.experiment or EXPERIMENTS, chatter)
    check_limit(args, modules)
    inputs = verified_inputs(args)
    options = options_of(args)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    chatter.to_file(out / "run.log", " ".join(["run.py", *sys.argv[1:]]))
    threads = config.CONFIG["shared"]["threads"]
    torch.set_num_threads(threads)  # process-wide: the official and the independent path alike
    if args.split == "confirm":
        print("*** CONFIRMATION SPLIT: scoring the 128 held-back items; every output says so ***")
    env = environment(threads)
    write_json(out / "environment.json", env)
    exit_code = 0
    for k, module in enumerate(modules.values()):
        stages = Stages()
        if k == 0:  # the imports happened once, before the first experiment
            stages.stages.append({"name": "imports", "wall_s": round(imports_s, 4), "peak_rss_bytes_at_end": None})
        ctx = context_for(module, args, inputs, options, stages)
        exit_code = max(exit_code, run_experiment(module, ctx, env))
    write_report(out, list(modules))
    return exit_code


def main(argv=None):
    args = parse_args(argv)
    chatter = LibraryChatter(verbose=args.verbose)
    try:
        return run_all(args, chatter)
    except ResourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        chatter.close()


if __name__ == "__main__":
    sys.exit(main())
