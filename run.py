"""Run experiments on verified resources and write per-item evidence.

    python run.py --cache ./cache --out smoke --smoke              # smoke of every experiment (2 items each)
    python run.py --cache ./cache --out O --experiment protocol     # the 64 development items

Exit codes: 0 success; 1 evidence or identity mismatch (the message names item and field); 2 bad input, failed
verification or missing resource (the message names the file and what to do).

Each experiment's evidence is written into a temporary directory and renamed into O/<experiment> only when the
experiment finished and every check passed, so an interrupted or failed run never leaves half-written evidence
(a failed run leaves O/<experiment>.FAILED.json with the mismatch table instead).
"""
import argparse
import copy
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import resources
from config import CONFIG
from resources import ResourceError, fail

T_START = time.perf_counter()


def parse_args(argv=None):
    from experiments import EXPERIMENTS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", required=True, help="cache directory filled by prepare.py")
    p.add_argument("--out", required=True, help="output directory for evidence")
    p.add_argument("--experiment", choices=EXPERIMENTS, action="append",
                   help="experiment to run (repeatable); default: all")
    p.add_argument("--smoke", action="store_true", help="first 2 development items of each experiment")
    p.add_argument("--split", choices=["dev", "confirm"], default="dev",
                   help="dev (default) or confirm: the 128 held-back confirmation items; only when you mean it")
    p.add_argument("--data", default=CONFIG["data"], help="data resource id from resources.lock.json")
    p.add_argument("--model", default=CONFIG["model"], help="model resource id from resources.lock.json")
    p.add_argument("--no-sort-samples", action="store_true",
                   help="reproduce lm-eval 0.4.9.2's doc_id defect by passing indices unsorted (the run must stop)")
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
    args = p.parse_args(argv)
    if args.smoke and args.split == "confirm":
        p.error("--smoke takes development items; it cannot be combined with --split confirm")
    if args.allow_partial_groups and args.limit is None:
        fail("--allow-partial-groups only applies together with --limit N")
    if args.limit is not None:
        import importlib

        if args.limit < 1 or args.smoke:
            fail(f"--limit {args.limit}: expected N >= 1, without --smoke (the two select documents differently)")
        mods = {n: importlib.import_module(f"experiments.{n}") for n in (args.experiment or EXPERIMENTS)}
        unsupported = [n for n, m in mods.items() if not getattr(m, "SUPPORTS_LIMIT", False)]
        grouped = [n for n, m in mods.items() if getattr(m, "DOCUMENTS_ARE_GROUP_PARTS", False)]
        if unsupported:
            fail(f"--limit is not implemented for experiment(s) {', '.join(unsupported)}; name one that implements "
                 f"it, e.g. --experiment mctaco")
        if grouped and not args.allow_partial_groups:
            fail(f"--limit {args.limit} refused: {', '.join(grouped)} documents are parts of a group (one per "
                 f"candidate answer of a question), so the first {args.limit} documents can cut a question's "
                 f"candidates and make acc/F1/EM misleading; add --allow-partial-groups to accept it")
    return args


def verified_inputs(cache, model_id, data_id):
    """Re-hash the model and data files the manifest vouches for; nothing unverified is ever read."""
    cache = Path(cache)
    if not (cache / resources.MANIFEST).exists():
        raise ResourceError(f"{cache / resources.MANIFEST}: no prepared cache here; run: "
                            f"python prepare.py --cache {cache}")
    manifest = resources.load_manifest(cache)
    model_entry = resources.verify_resource_files(cache, model_id, manifest)
    data_entry = resources.verify_resource_files(cache, data_id, manifest)
    model_dir = cache / "models" / model_id
    parquet = cache / "data" / data_id / "validation.parquet"
    for path in (model_dir / "model.safetensors", model_dir / "tokenizer.json", parquet):
        rel = str(path.relative_to(cache))
        if rel not in model_entry["files"] and rel not in data_entry["files"]:
            raise ResourceError(f"{path}: not listed in the manifest; run: python prepare.py --cache {cache}")
    model_identity = {
        "id": model_id, "dir": str(model_dir),
        "model_sha256": model_entry["files"][str((model_dir / "model.safetensors").relative_to(cache))]["sha256"],
        "tokenizer_sha256": model_entry["files"][str((model_dir / "tokenizer.json").relative_to(cache))]["sha256"],
        "source": model_entry["source"],
    }
    return model_dir, parquet, model_identity, data_entry


def run_identity(env, config, model_identity, data_entry, result):
    """The full identity of this run: a cached score may only serve a request whose identity matches all of it."""
    scoring = config  # config.py holds every setting that can change a score, so all of it is identity
    return {
        "model_sha256": model_identity["model_sha256"], "tokenizer_sha256": model_identity["tokenizer_sha256"],
        # an experiment with its own data (mctaco) names it; the others score the --data resource
        "data_content_sha256": result["config"].get("data_content_sha256", data_entry["content_sha256"]),
        "prompt_template_sha256": result["prompt_template_sha256"],
        "scoring_config": scoring,
        "scoring_config_sha256": hashlib.sha256(json.dumps(scoring, sort_keys=True).encode()).hexdigest(),
        "git_commit": env["git_commit"], "git_dirty": env["git_dirty"], "code_sha256": env["code_sha256"],
        "versions": env["versions"],
        "official_config_sha256": hashlib.sha256(json.dumps(
            result["config"].get("official"), sort_keys=True).encode()).hexdigest(),
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


def write_failure(out, name, err):
    from experiments.evidence import write_json

    rows = [{"idx": r[0], "field": r[1], "official": r[2], "independent": r[3]} for r in err.rows]
    write_json(Path(out) / f"{name}.FAILED.json", {"experiment": name, "error": str(err), "mismatches": rows})
    print(f"\nIDENTITY/EVIDENCE MISMATCH in {name}: {err}", file=sys.stderr)
    print(f"{'idx':>6}  {'field':<28} {'official':<40} independent", file=sys.stderr)
    for r in rows[:50]:
        print(f"{str(r['idx']):>6}  {r['field']:<28} {str(r['official'])[:40]:<40} {str(r['independent'])[:60]}",
              file=sys.stderr)
    if len(rows) > 50:
        print(f"... {len(rows) - 50} more rows in {Path(out) / f'{name}.FAILED.json'}", file=sys.stderr)


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    try:
        model_dir, parquet, model_identity, data_entry = verified_inputs(args.cache, args.model, args.data)
    except ResourceError as e:
        fail(str(e))

    t_imports = time.perf_counter()
    import torch  # (timed: the imports stage)
    import transformers  # noqa: F401  (timed with torch)
    import experiments
    from experiments import scoring
    from experiments.evidence import IdentityMismatch, Stages, environment, write_json, write_jsonl
    imports_s = time.perf_counter() - t_imports

    config = copy.deepcopy(CONFIG)
    config.update(model=args.model, data=args.data)
    torch.set_num_threads(config["threads"])  # process-wide: the official and the independent path alike
    split = "smoke" if args.smoke else args.split
    names = args.experiment or experiments.EXPERIMENTS
    if split == "confirm":
        print("*** CONFIRMATION SPLIT: scoring the 128 held-back items; every output says so ***")
    out.mkdir(parents=True, exist_ok=True)
    env = environment(config["threads"])
    write_json(out / "environment.json", env)

    exit_code = 0
    for name in names:
        module = __import__(f"experiments.{name}", fromlist=["run"])
        stages = Stages()
        stages.stages.append({"name": "imports", "wall_s": round(imports_s, 4), "peak_rss_bytes_at_end": None})
        ctx = {"args": args, "config": config, "split": split, "stages": stages, "model_dir": model_dir,
               "parquet_path": parquet, "data_id": args.data, "data_content_sha256": data_entry["content_sha256"],
               "model_identity": model_identity, "cache": Path(args.cache)}
        (out / f"{name}.FAILED.json").unlink(missing_ok=True)
        print(f"[{name}] split={split} data={args.data} model={args.model}")
        try:
            result = module.run(ctx)
        except IdentityMismatch as e:
            write_failure(out, name, e)
            exit_code = 1
            continue
        except scoring.ScoringError as e:
            print(f"error: [{name}] {e}", file=sys.stderr)
            exit_code = 1
            continue
        tmp = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}.tmp-"))
        tmp_private = Path(tempfile.mkdtemp(dir=out, prefix=f".private-{name}.tmp-"))
        try:
            with stages.stage("write"):
                identity = run_identity(env, config, model_identity, data_entry, result)
                write_json(tmp / "config.json", result["config"])
                write_json(tmp / "identity.json", identity)
                write_jsonl(tmp / "records.jsonl", result["records"])
                write_json(tmp / "summary.json", result["summary"])
                for fname, content in result.get("public", {}).items():
                    resources.atomic_write_text(tmp / fname, content)
                for fname, content in result["private"].items():
                    resources.atomic_write_text(tmp_private / fname, content)
            write_json(tmp / "stages.json", {"stages": stages.stages, "tokens": result["token_stats"],
                                             "threads": config["threads"],
                                             "total_wall_s": round(time.perf_counter() - T_START, 4),
                                             "peak_rss_semantics": "process peak RSS up to the end of the stage"})
            (out / "private").mkdir(exist_ok=True)
            install(tmp, out / name)
            install(tmp_private, out / "private" / name)
        finally:
            for d in (tmp, tmp_private):
                if d.exists():
                    shutil.rmtree(d)
        print(f"[{name}] {result['headline']}")
        print(f"[{name}] evidence: {out / name}/ (private texts: {out / 'private' / name}/)")
    if any((out / n / "summary.json").exists() for n in names):
        import report

        try:  # the evidence is already installed; a report that cannot be written must not hide it
            print(f"report: {report.write(out)}")
        except OSError as e:
            print(f"warning: report.html not written ({e}); run: python report.py {out}", file=sys.stderr)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
