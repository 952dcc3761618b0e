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
sibling <O>.replaced-<its run id>. One run at a time: a run holds an flock on the sibling <O>.lock until it ends
(the kernel drops it if the run is killed), and a second run refuses on one line naming the holder's pid. A run
writes O/.run-in-progress (its run id, pid, and the names it may create) into an O that holds nothing else, and
removes it just before MANIFEST.json; what a run that did not finish left is removed by the next run, with one line
naming that run, only when every entry of O is a name its marker claimed (its temp directories carry its run id);
anything else in O (a user's report.html, run.log, notes) makes the run refuse O with nothing deleted. An --out that
is a file, read-only, or on a full disk (a 1 MiB probe is written, fsynced and deleted) is refused before anything
is loaded. The digest is printed only after MANIFEST.json is read back as written. A damaged CACHE/results.sqlite is
set aside with one warning before any scoring. Every run has one run id (uuid4 hex) in each identity.json,
O/private/<exp>/run.json, environment.json and report.html. The run ends with environment.json (only if some
evidence was installed), report.html, and MANIFEST.json last (every public file with size and sha256, the private
halves by digest); it prints "evidence digest: sha256:..." (the sha256 of MANIFEST.json) to cite next to the commit.
With --sign KEY (an OpenSSH private key) the run then signs exactly that digest string with `ssh-keygen -Y sign`
into O/MANIFEST.json.sig (experiments/signing.py; ssh-keygen and the key are checked before anything loads).
"""
import argparse
import difflib
import hashlib
import importlib
import json
import math
import os
import shlex
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import config
import local_model
import registry
import resources
from adapter import device_problem
from evidence_report import page as report_page
from experiments import EXPERIMENTS, launch, parallel, result_cache, signing
from experiments.context import Context, Data, Inputs, Options
from experiments.evidence import (MARKER, PATHS_FILE, IdentityMismatch, LocalPaths, ScoringError, Stages, environment,
                                  evidence_entries, existing_ancestor, new_run_id, probe_writable, read_marker,
                                  refuse_if_locked, remove_marker, set_aside, still_running, sweep_claimed,
                                  take_out_lock, temp_dir_name, unclaimed_entries, write_json, write_jsonl,
                                  write_manifest, write_marker)
from experiments.runlog import LibraryChatter, ending_of
from harness.hf_model import ModelLoadError
from resources import ResourceError


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.smoke and args.split in ("confirm", "all"):
        p.error(f"--smoke takes development items; it cannot be combined with --split {args.split}")
    if args.shard is not None:
        args.shard = parse_shard(args.shard) or p.error(f"--shard {args.shard}: expected K/N with 1 <= K <= N")
    if args.shard and args.merge:
        p.error("--shard scores one shard, --merge joins them: give one of the two")
    return args


def given_flags(argv=None):
    """The options given on the command line (their dests, in the parser's order), whatever their values: a flag
    that repeats its default is still given."""
    p = build_parser()
    dests = list(vars(p.parse_args(argv)))
    for action in p._actions:       # no default at all: a dest then appears only when its flag was given
        action.default = argparse.SUPPRESS
    given = vars(p.parse_args(argv))
    return [d for d in dests if d in given]


def build_parser():
    shared = config.CONFIG["shared"]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", required=True, help="cache directory filled by prepare.py")
    p.add_argument("--out", required=True, help="output directory for evidence")
    p.add_argument("--experiment", choices=EXPERIMENTS, action="append",
                   help="experiment to run (repeatable); default: all")
    p.add_argument("--smoke", action="store_true", help="first 2 development items of each experiment")
    p.add_argument("--split", choices=["dev", "confirm", "all"],
                   help="dev: the 64 development items; confirm: the 128 held-back confirmation items, only "
                        "when you mean it; all: every row of the data's validation split in idx order (for mctaco "
                        "every document, whole questions), the confirmation items included. Default: dev, or all "
                        "for an experiment whose data has fewer rows than dev needs (said on the console)")
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
                   help="lm-eval's limit: score only the first N items of each experiment's selection, in its order "
                        "(harness: the first N examples of each task); a quick look, not a result: every output "
                        "says so. Refused where documents are parts of a group (mctaco) unless --allow-partial-groups")
    p.add_argument("--allow-partial-groups", action="store_true",
                   help="with --limit: accept that the cut splits a question's candidates; the output lists every "
                        "cut question and marks all metrics as computed on an incomplete set")
    p.add_argument("--replace", action="store_true",
                   help="--out already holds evidence: move it aside to the sibling <OUT>.replaced-<its run id> "
                        "(printed) and write this run into OUT; without it such an --out is refused")
    p.add_argument("--sign", metavar="KEY",
                   help="sign the evidence digest with this OpenSSH private key (ssh-keygen -Y sign; a key with a "
                        "passphrase signs through ssh-agent) into OUT/MANIFEST.json.sig; see docs/citing.md")
    p.add_argument("--verbose", action="store_true",
                   help="print the libraries' own log messages and warnings on the console (default: O/run.log)")
    p.add_argument("--shard", metavar="K/N",
                   help="score only shard K of N (1-based; the fixed rule of experiments/parallel.py) into --out, "
                        "the shard's own directory (SHARD.json: raw results, not evidence), for schedulers without a "
                        "shared launcher (Slurm arrays); join the N directories with --merge")
    p.add_argument("--join-timeout", type=float, default=parallel.JOIN_TIMEOUT_S, metavar="SECONDS",
                   help="under torchrun / accelerate launch: how long a rank waits for the others to join (said when "
                        f"it starts waiting; default {parallel.JOIN_TIMEOUT_S:g}); a rank not joined in time stops "
                        "the run with one line (exit 2)")
    p.add_argument("--merge", nargs="+", metavar="SHARD_OUT",
                   help="join the --out directories of every --shard K/N of one run into normal evidence in --out; "
                        "the scoring arguments come from the shards (give only --cache, --out, --replace, --verbose)")
    return p


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
    if not (math.isfinite(args.join_timeout) and args.join_timeout > 0):
        raise ResourceError(f"--join-timeout {args.join_timeout:g}: expected a number of seconds > 0")
    if args.fast and args.device != "cpu":
        raise ResourceError(f"--fast with --device {args.device}: fast mode (experiments/fast_scoring.py) runs on the "
                            "cpu only; drop --fast or use --device cpu")
    if args.allow_partial_groups and args.limit is None:
        raise ResourceError("--allow-partial-groups only applies together with --limit N")
    if args.sign is not None and args.shard:
        raise ResourceError(f"--sign with --shard {args.shard[0]}/{args.shard[1]}: a shard writes no evidence digest; "
                            "give --sign to the --merge that joins the shards")
    if args.limit is not None and (args.limit < 1 or args.smoke):
        raise ResourceError(f"--limit {args.limit}: expected N >= 1, without --smoke (the two select documents "
                            "differently)")


# what --merge uses itself; every other flag comes from the shards (experiments/launch.py OWN_ARGS: shard and
# join_timeout have no part in a merge)
MERGE_TAKES = ("cache", "out", "replace", "verbose", "merge", "sign")


def check_merge_flags(args, argv=None):
    """--merge replays the shards' scoring arguments (launch.plan_for), so any other flag given with it would do
    nothing, even one that repeats its default: refused, naming it, rather than recorded in a command line it did
    not shape."""
    if not args.merge:
        return
    extra = [f"--{d.replace('_', '-')}" for d in given_flags(argv) if d not in MERGE_TAKES]
    if extra:
        raise ResourceError(f"--merge takes the scoring arguments from the shards; {', '.join(extra)} would do "
                            "nothing: leave {} out (a merge takes only --cache, --out, --replace, --verbose, --sign)"
                            .format("it" if len(extra) == 1 else "them"))


def closest_first(given, known):
    """`known` sorted by likeness to `given` (difflib's ratio), most alike first; ties by name."""
    return sorted(known, key=lambda k: (-difflib.SequenceMatcher(None, given, k).ratio(), k))


def known_ids(cache, kind):
    """The ids --model (kind "model") or --data (kind "data") may name: the repository lock's, the cache
    manifest's and, for data, the user's --name imports (CACHE/user.lock.json)."""
    section = {"model": "models", "data": "data"}[kind]
    ids = set(resources.load_lock().get(section, {}))
    ids |= {rid for rid, e in resources.load_manifest(cache)["resources"].items() if e.get("kind") == kind}
    if kind == "data":
        ids |= set(resources.load_user_lock(cache)["data"])
    return ids


def looks_like_path(value):
    return os.sep in value or value.startswith((".", "~")) or os.path.lexists(value)


def check_names(args):
    """--model and --data against what exists, before the cache is verified and anything is imported: a --model
    that reads as a path must be a directory; an id must be one the lock, the manifest (or for data CACHE/
    user.lock.json) knows, else one line lists the known ids, closest first."""
    cache = Path(args.cache)
    if args.model and not Path(args.model).is_dir():
        local = "a local model is a directory holding config.json, *.safetensors and tokenizer.json"
        if looks_like_path(args.model):
            what = "not a directory" if os.path.lexists(args.model) else "no such directory"
            raise ResourceError(f"--model {args.model}: {what}; {local}")
        known = known_ids(cache, "model")
        if args.model not in known:
            raise ResourceError(f"--model {args.model}: unknown model id {args.model!r}; known: "
                                f"{', '.join(closest_first(args.model, known))} (closest first); or {local}")
    if args.data is not None:
        known = known_ids(cache, "data")
        if args.data not in known:
            raise ResourceError(f"--data {args.data}: unknown data id {args.data!r}; known: "
                                f"{', '.join(closest_first(args.data, known))} (closest first); a file of your own "
                                f"is imported first: python prepare.py --cache {cache} --data-file FILE --name NAME")


def check_limit(args, modules):
    """--limit against the experiments' contract attributes SUPPORTS_LIMIT and DOCUMENTS_ARE_GROUP_PARTS."""
    if args.limit is None:
        return
    unsupported = [n for n, m in modules.items() if not getattr(m, "SUPPORTS_LIMIT", False)]
    grouped = [n for n, m in modules.items() if getattr(m, "DOCUMENTS_ARE_GROUP_PARTS", False)]
    if unsupported:
        supported = [n for n, m in modules.items() if getattr(m, "SUPPORTS_LIMIT", False)]
        raise ResourceError(f"--limit is not implemented for experiment(s) {', '.join(unsupported)}; name only "
                            f"experiments that implement it ({', '.join(supported) or 'none of those named'})")
    if grouped and not args.allow_partial_groups:
        raise ResourceError(f"--limit {args.limit} refused: {', '.join(grouped)} documents are parts of a group (one "
                            f"per candidate answer of a question), so the first {args.limit} documents can cut a "
                            "question's candidates and make acc/F1/EM misleading; add --allow-partial-groups to "
                            "accept it, or name only the other experiments (--experiment NAME, repeatable)")


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
    nouns = {resources.SST2.name: "SST-2-shaped", resources.MCTACO.name: "MC-TACO-shaped"}
    if wrong and (named or schema != "sst2"):
        theirs = " / ".join(sorted({nouns.get(wants[n], wants[n]) for n in wrong}))
        raise ResourceError(f"--data {args.data} is {nouns.get(schema, schema)} data; experiment(s) "
                            f"{', '.join(wrong)} score {theirs} data: name data of that schema, or only the "
                            "experiments that read it")
    for n in wrong:
        print(f"note: --data {args.data} is {nouns.get(schema, schema)}; {n} scores its own configured data")
    # an experiment that names its data under a key of its own gets --data there (the others read config "data")
    keys = {n: getattr(m, "DATA_CONFIG_KEY", "data") for n, m in modules.items()}
    return {n: {keys[n]: args.data} for n, w in wants.items() if w == schema and keys[n] != "data"}


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
    # absolute (not resolved: a symlinked cache stays spelled as given), so that config.json's model.dir, and the
    # cache root it implies, can be found by an audit started from any directory
    cache = Path(os.path.abspath(args.cache))
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
    split = split_of(args, module, inputs, routed)
    local = inputs.model_identity.get("source") == "local"
    model = inputs.model_identity["id"] if local else args.model
    effective = config.effective(module.CONFIG_SECTIONS, {"model": model, "data": args.data,
                                                          **numerics_overrides(args),
                                                          **(routed or {}).get(module.NAME, {})})
    data = inputs.data.get(effective[data_key(module)]) if data_key(module) is not None else None
    return Context(name=module.NAME, split=split, config=effective, inputs=inputs, options=options, stages=stages,
                   plan=plan, data=data, environment=env)


def split_of(args, module, inputs, routed=None):
    """The experiment's split: smoke, the --split given, or by default dev, except all (every row in idx order)
    when the experiment draws dev by the hash rule (SST-2-shaped data) and its data has fewer rows than dev needs:
    a user's small file then runs as imported rather than being refused (split_notes says so on the console;
    config.json records the split)."""
    if args.smoke:
        return "smoke"
    if args.split:
        return args.split
    return "all" if rows_short_of_dev(args, module, inputs, routed) else "dev"


def rows_short_of_dev(args, module, inputs, routed=None):
    """(rows, rows dev needs) when the experiment's data is too small for the dev split, else None. Only the
    experiments that draw dev by the hash rule (DATA_SCHEMA "sst2") need a number of rows (mctaco's dev is every
    document; the harness reads no --data)."""
    if getattr(module, "DATA_SCHEMA", "sst2") != "sst2" or data_key(module) is None:
        return None
    entry = resources.load_manifest(inputs.cache)["resources"].get(data_id_of(module, args, routed)) or {}
    need = config.effective(module.CONFIG_SECTIONS, {})["n_dev"]
    rows = entry.get("rows")
    return (rows, need) if isinstance(rows, int) and rows < need else None


def split_notes(args, modules, inputs, routed=None):
    """One console banner per data too small for the dev split, naming the experiments that score split all (as
    loud as --split all's own banner: the run is not a dev-split result)."""
    if args.smoke or args.split:
        return
    short = {}
    for name, module in modules.items():
        gap = rows_short_of_dev(args, module, inputs, routed)
        if gap:
            short.setdefault((data_id_of(module, args, routed), *gap), []).append(name)
    for (data_id, rows, need), names in short.items():
        print(f"*** SPLIT ALL ({', '.join(names)}): data {data_id} has {rows} rows, fewer than the {need} the dev "
              f"split needs: {', '.join(names)} score{'s' if len(names) == 1 else ''} split all (every row in idx "
              "order; config.json records it, every output says so); --split dev is refused on this data ***")


def local_paths(args, inputs):
    """The local paths this run names and their public placeholders (experiments/evidence.LocalPaths): O, the
    cache, a local --model directory, --merge's shard directories, the --sign key, and the machine's checkout,
    Python, home and temp directories."""
    local = inputs.model_identity.get("source") == "local"
    return LocalPaths.for_run(args.out, inputs.cache, inputs.model_identity.get("dir") if local else None,
                              args.merge or (), getattr(args, "sign", None))


# the flags whose values are local paths (--model only when it names a directory, not a lock id; --sign a key file)
PATH_FLAGS = ("--cache", "--out", "--model", "--merge", "--sign")


def public_command_line(argv, paths):
    """sys.argv as the public files record it (environment.json, run.log, report.html): the script by its name
    (run.py), the value of each of PATH_FLAGS by its placeholder however it was spelled (a relative path gives a
    layout away too; a lock id given to --model stays), and any other absolute path by LocalPaths.public. The
    command as typed is in O/private/<exp>/paths.json. Flags are read as argparse reads them (a unique prefix, or
    --flag=value), so that the audit reads the same experiments and --limit from it."""
    longs = [s for a in build_parser()._actions for s in a.option_strings if s.startswith("--")]

    def flag_of(token):
        name = token.partition("=")[0]
        hits = [f for f in longs if f.startswith(name)]
        return name if name in longs else (hits[0] if len(hits) == 1 else None)

    def value(flag, v):
        # a lock id is no directory here (check_names refused a --model that is neither); a root is known by its
        # resolved spelling too, so a symlink or "a/../b" finds it
        local = os.path.isdir(v) or (flag == "--sign" and os.path.isfile(v))
        return paths.path(os.path.realpath(v)) if local else paths.public(v)

    public, k = [Path(argv[0]).name] if argv else [], 1
    while k < len(argv):
        token, k = argv[k], k + 1
        flag = flag_of(token) if token.startswith("--") else None
        name, eq, given = token.partition("=")
        if flag in PATH_FLAGS and eq:
            public.append(f"{name}={value(flag, given)}")
        elif flag in PATH_FLAGS:
            public.append(token)
            while k < len(argv) and not argv[k].startswith("-"):
                public.append(value(flag, argv[k]))
                k += 1
                if flag != "--merge":   # one value; --merge takes every directory up to the next flag
                    break
        elif eq and given.startswith(os.sep):
            public.append(f"{name}={paths.public(given)}")
        else:
            public.append(paths.public(token))
    return public


def sha256_json(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def run_identity(env, ctx, sections, result, paths=None):
    """The full identity of this run: a cached score may only serve a request whose identity matches all of it.

    The scoring config is the experiment's effective config (config.json "config"), i.e. the config.py sections in
    `sections` merged flat; the result cache keys on the same dict (result_cache.scoring_config). `paths`
    (LocalPaths): the identity as the public identity.json holds it, every local path by its placeholder, its
    hashes taken over what config.json holds (the audit recomputes them from there)."""
    public = paths.public if paths is not None else (lambda value: value)
    scoring_config = public(ctx.config)
    return {
        "model_sha256": ctx.inputs.model_identity["model_sha256"],
        "tokenizer_sha256": ctx.inputs.model_identity["tokenizer_sha256"],
        **local_model_identity(ctx.inputs.model_identity),
        "data_content_sha256": ctx.data.content_sha256 if ctx.data is not None else None,   # the data it read
        "prompt_template_sha256": result.prompt_template_sha256,
        "scoring_config": scoring_config,
        "scoring_config_sha256": sha256_json(scoring_config),
        "config_sections": list(sections),
        "git_commit": env["git_commit"], "git_dirty": env["git_dirty"], "code_sha256": env["code_sha256"],
        "versions": env["versions"],
        "official_config_sha256": sha256_json(public(result.config.get("official"))),
        "run_id": env["run_id"],
    }


def local_model_identity(model_identity):
    """A local --model directory's per-file hashes and source (identity.json model_files, model_source): the
    model_sha256 and tokenizer_sha256 above are derived from them (local_model.HASH_RULE). {} for a lock id."""
    if model_identity.get("source") != "local":
        return {}
    return {"model_source": "local", "model_files": model_identity["files"]}


def install(tmp_dir, final_dir, run_id):
    """Move tmp_dir to final_dir by rename. One run per O means final_dir does not exist; if it does (the same
    experiment named twice), the old one is moved into a temp name (the run's, by run id) inside its own area first
    and removed after."""
    final_dir = Path(final_dir)
    old = None
    if final_dir.exists():
        holder = final_dir.parent / temp_dir_name(final_dir.name, run_id, old=True)
        holder.mkdir()
        old = holder / final_dir.name
        final_dir.rename(old)
    Path(tmp_dir).rename(final_dir)
    if old is not None:
        shutil.rmtree(old.parent)


def write_evidence(out, ctx, module, result, env, started, data_parallel=None, paths=None):
    """Every evidence file of one experiment, written into temp directories inside the areas they become
    (O/.tmp-<exp>-*, O/private/.tmp-<exp>-*) and installed by rename. config.json and identity.json name local
    paths by placeholder (`paths`, LocalPaths: the cache, O, a local model directory, the checkout, ...);
    O/private/<exp>/paths.json maps them back.

    stages.json's total_wall_s is this experiment's own wall time: from `started` (just before run(ctx)) to the
    end of the write stage. O/private/<exp>/run.json ties the private half to the public one (the run id).
    A data-parallel run (or a merge) adds stages.json "data_parallel": world size and every rank's (or shard's)
    own stages, wall time and peak RSS."""
    name, stages = ctx.name, ctx.stages
    (out / "private").mkdir(exist_ok=True)
    # named with the run id (O/.run-in-progress claims them): what a killed run left is provably its own
    tmp, tmp_private = out / temp_dir_name(name, env["run_id"]), out / "private" / temp_dir_name(name, env["run_id"])
    try:
        tmp.mkdir()
        tmp_private.mkdir()
        with stages.stage("write"):
            write_json(tmp / "config.json", paths.public(result.config) if paths is not None else result.config)
            write_json(tmp / "identity.json", run_identity(env, ctx, module.CONFIG_SECTIONS, result, paths))
            write_jsonl(tmp / "records.jsonl", result.records)
            write_json(tmp / "summary.json", result.summary)
            for fname, content in result.public.items():
                resources.atomic_write_text(tmp / fname, content)
            for fname, content in result.private.items():
                resources.atomic_write_text(tmp_private / fname, content)
            write_json(tmp_private / "run.json", {"experiment": name, "run_id": env["run_id"]})
            if paths is not None:
                write_json(tmp_private / PATHS_FILE, paths.record(name))
        write_json(tmp / "stages.json", {"stages": stages.stages, "tokens": result.token_stats,
                                         "threads": ctx.config["threads"],
                                         "total_wall_s": round(time.perf_counter() - started, 4),
                                         "peak_rss_semantics": "process peak RSS up to the end of the stage",
                                         **({"data_parallel": data_parallel} if data_parallel else {})})
        install(tmp, out / name, env["run_id"])
        install(tmp_private, out / "private" / name, env["run_id"])
    finally:
        for d in (tmp, tmp_private):
            if d.exists():
                shutil.rmtree(d)


def write_failure(out, name, err, paths=None):
    rows = [{"idx": r[0], "field": r[1], "official": r[2], "independent": r[3]} for r in err.rows]
    failure = {"experiment": name, "error": str(err), "mismatches": rows}
    if err.details:
        failure["details"] = err.details
    # public: a message that names a file names it by placeholder (the console below keeps the real paths)
    write_json(Path(out) / f"{name}.FAILED.json", paths.public_text(failure) if paths is not None else failure)
    print(f"\nIDENTITY/EVIDENCE MISMATCH in {name}: {err}", file=sys.stderr)
    for key, value in (err.details or {}).items():
        print(f"  {key}: {value}", file=sys.stderr)
    print(f"{'idx':>6}  {'field':<28} {'official':<40} independent", file=sys.stderr)
    for r in rows[:50]:
        print(f"{str(r['idx']):>6}  {r['field']:<28} {cell(r['official']):<40} {cell(r['independent'])}",
              file=sys.stderr)
    if len(rows) > 50:
        print(f"... {len(rows) - 50} more rows in {Path(out) / f'{name}.FAILED.json'}", file=sys.stderr)


def cell(value, width=100):
    """A mismatch-table value, whole when it takes at most `width` characters (a pair of scores does), else never
    cut silently: a list keeps its leading items whole and ends "… (N more)]", any other value "… (N more
    characters)". FAILED.json holds every value whole."""
    text = str(value)
    if len(text) <= width:
        return text
    if isinstance(value, (list, tuple)) and value:
        shown = 1
        while shown < len(value) and len(str(list(value[:shown + 1]))) <= width:
            shown += 1
        return f"{str(list(value[:shown]))[:-1]}, … ({len(value) - shown} more)]"
    return f"{text[:width]}… ({len(text) - width} more characters)"


def run_experiment(module, ctx, env, paths=None):
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
            disk_errors(write_failure, out, name, e, paths)
        return 1
    except (ScoringError, parallel.RankFailure) as e:
        print(f"error: [{name}] {e}", file=sys.stderr)
        return 1
    undeclared = undeclared_files(registry.find(name), result)
    if undeclared:
        print(f"error: [{name}] {undeclared}", file=sys.stderr)
        return 1
    data_parallel = launch.rank_stages(plan, name, ctx.stages.stages, started)   # collective: every rank is here
    if not parallel.is_writer(plan):
        return 0
    print(f"[{name}] {result.headline}")
    if plan.mode == "replay":          # a merge installs nothing before every experiment replayed
        plan.pending.append((out, ctx, module, result, env, time.perf_counter() - started, data_parallel))
        return 0
    install_evidence(out, ctx, module, result, env, started, data_parallel, paths)
    return 0


def undeclared_files(declared, result):
    """Why the extra files of `result` disagree with registry.py's declaration of the experiment, or None. The audit
    knows which files an experiment writes only from that declaration: a public file written but not declared would
    fail every audit, a private file declared but not written would too, so the run stops instead. (Private files
    beyond the declared ones are allowed: the harness keeps a copy of each task file it read.)"""
    if sorted(result.public) != sorted(declared.public_extras):
        return (f"the experiment wrote the public files {sorted(result.public)} but registry.py declares "
                f"public_extras={declared.public_extras!r}: declare what it writes")
    missing = [f for f in declared.private_files if f not in result.private]
    if missing:
        return (f"registry.py declares the private files {declared.private_files!r} but the experiment did not "
                f"write {', '.join(missing)}")
    return None


def install_evidence(out, ctx, module, result, env, started, data_parallel, paths=None):
    disk_errors(write_evidence, out, ctx, module, result, env, started, data_parallel, paths)
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
        print(f"report: {report_page.write(out)}")
    except OSError as e:
        print(f"warning: report.html not written ({e}); run: python report.py {out}", file=sys.stderr)


# ---- the output directory: one run per O, leftovers swept, a usable disk, evidence renamed into place ----------

def check_out(args, experiment_names):
    """Refuse an unusable --out before anything is imported or loaded: a file, a directory holding evidence of an
    earlier run (without --replace), a directory holding anything an earlier run cannot be shown to have written
    (O/.run-in-progress names what a run that did not finish may have made), a directory (or, for a new one, its
    nearest existing parent) that does not take a small probe file: read-only, not writable, or a full disk.
    Nothing is created or deleted here."""
    out = Path(args.out)
    if out.is_symlink():        # a second spelling of a directory: its lock and its sweep would be another run's
        raise ResourceError(f"--out {out}: a symbolic link (to {os.path.realpath(out)}); name the directory itself")
    if out.exists() and not out.is_dir():
        raise ResourceError(f"--out {out}: exists and is not a directory; name a directory for the evidence")
    if out.is_dir():
        held = evidence_entries(out, experiment_names)
        if held and not args.replace:
            raise ResourceError(f"--out {out}: already holds the evidence of an earlier run ({', '.join(held[:5])}); "
                                "one run per output directory: name a new --out, or add --replace to move the old "
                                f"one aside to {out.name}.replaced-<its run id>")
        marker = None if held else read_marker(out)
        strays = [] if held else unclaimed_entries(out, marker)
        if strays:
            why = (f"{out / MARKER} (run {marker['run_id']}) does not name {'it' if len(strays) == 1 else 'them'}"
                   if marker else f"no {MARKER} of an earlier run names {'it' if len(strays) == 1 else 'them'}")
            raise ResourceError(f"--out {out}: holds {len(strays)} entr{'y' if len(strays) == 1 else 'ies'} no run "
                                f"writes ({', '.join(strays[:5])}; {why}); every file in O becomes part of the "
                                "evidence and nothing was deleted: name a new or empty directory")
    where = existing_ancestor(out)
    if not where.is_dir():
        raise ResourceError(f"--out {out}: {where} exists and is not a directory")
    problem = probe_writable(where)
    if problem:
        raise ResourceError(f"--out {out}: {where}: {problem}")


def claim_out(args, experiment_names):
    """One run per --out at a time: refuse if another run holds <O>.lock (naming its pid), check O, take the lock,
    and check O again under it (a run that started meanwhile may have written). Returns the held lock."""
    refuse_if_locked(args.out)
    check_out(args, experiment_names)
    try:
        lock = take_out_lock(args.out)
    except OSError as e:
        raise ResourceError(f"--out {args.out}: cannot take its lock file ({e.strerror or e}: {e.filename})")
    try:
        check_out(args, experiment_names)
    except ResourceError:
        lock.release()
        raise
    return lock


def setup_out(args, experiment_names, run_id):
    """Create O for this run: with --replace the old evidence is moved aside first (said where); what an earlier
    run that did not finish left is removed (said what, and whose), only the names its O/.run-in-progress claimed;
    then this run's own marker is written."""
    out = Path(args.out)
    try:
        if out.is_dir() and args.replace and evidence_entries(out, experiment_names):
            print(f"--replace: the earlier evidence in {out} was moved to {set_aside(out)}")
        elif out.is_dir():
            marker = read_marker(out)
            if marker and still_running(marker):    # the lock says it is gone; a live run.py of that pid says not
                raise ResourceError(f"--out {out}: {MARKER} names run {marker['run_id']}, pid {marker['pid']} on this "
                                    "host, which is still running run.py; nothing was removed: wait for it to "
                                    "finish, or name another --out")
            if marker:
                ended = ending_of(out / "run.log", marker["run_id"])     # read before the sweep removes it
                removed = sweep_claimed(out, marker)
                how = (f"it ended ({ended}) without a manifest" if ended else
                       "it did not finish (killed, or stopped before it could log how it ended)")
                print(f"removed from {out} what run {marker['run_id']} (pid {marker['pid']} on {marker['host']}, "
                      f"started {marker['started_utc']}) left: {', '.join(removed) or 'nothing but its marker'}; "
                      f"{how}; each is a name its {MARKER} claimed when it started in an otherwise empty directory")
        out.mkdir(parents=True, exist_ok=True)
        write_marker(out, run_id, experiment_names)
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


def finish(out, env, installed, failed, chatter, sign=None):
    """The end of a run: environment.json (only if some evidence was installed), report.html, MANIFEST.json last;
    print the evidence digest, and with --sign KEY sign it into O/MANIFEST.json.sig (outside the manifest). Nothing
    at all when the run left no evidence (the next run may reuse O)."""
    if not installed and not failed:
        return
    if installed:
        write_json(out / "environment.json", env)
        write_report(out, installed)
    chatter.close()                     # run.log is listed in the manifest: nothing may be appended after it
    remove_marker(out)                  # before the manifest: a finished run leaves no dot-file in O
    digest = write_manifest(out, env["run_id"], installed, failed)
    if sha256_file_or_none(out / "MANIFEST.json") != digest:
        raise ResourceError(f"{out}/MANIFEST.json is not the one this run (run id {env['run_id']}) wrote: something "
                            "else replaced it; no evidence digest is printed for evidence O does not hold")
    print(f"evidence: {out}/MANIFEST.json (run id {env['run_id']})")
    print(f"evidence digest: sha256:{digest}")
    if sign is not None:
        try:
            key = signing.sign_evidence(out, sign, digest)
        except ResourceError as e:
            raise ResourceError(f"{e}; the evidence is complete and its digest printed above, but it is NOT signed "
                                "(docs/citing.md: signing a digest later)")
        print(f"evidence signature: {out}/{signing.SIGNATURE_NAME} (ssh-keygen -Y sign -n {signing.NAMESPACE} of the "
              f"digest string above, {key})")


def sha256_file_or_none(path):
    try:
        return resources.sha256_file(path)
    except OSError:
        return None


def run_experiments(plan, args, modules, imports_s, inputs, options, env, done, routed=None, paths=None):
    """Every experiment in order; the worst exit code (0 or 1); `done` collects installed and failed names."""
    exit_code = 0
    for k, module in enumerate(modules.values()):
        stages = Stages()
        if k == 0:  # the imports happened once, before the first experiment
            stages.stages.append({"name": "imports", "wall_s": round(imports_s, 4), "peak_rss_bytes_at_end": None})
        ctx = context_for(module, args, inputs, options, stages, routed, plan, env)
        done["running"] = module.NAME       # named by the line an interrupt prints
        code = run_experiment(module, ctx, env, paths)
        done["running"] = None
        exit_code = max(exit_code, code)
        if code == 0 and plan.mode not in ("shard", "replay"):
            done["installed"].append(module.NAME)
        elif (options.out / f"{module.NAME}.FAILED.json").exists():
            done["failed"].append(module.NAME)
    for out, ctx, module, result, env, elapsed, data_parallel in plan.pending:
        # --merge: every experiment replayed (every shard item found); its own wall time is kept
        install_evidence(out, ctx, module, result, env, time.perf_counter() - elapsed, data_parallel, paths)
        done["installed"].append(ctx.name)
    return exit_code


def run_all(args, chatter):
    """Every requested experiment in order; the worst exit code (0 or 1). Raises ResourceError (exit 2).

    Under torchrun / accelerate launch every rank runs this; rank 0 alone checks and writes O (its checks' verdicts
    are broadcast, so a refusal stops every rank with the same line)."""
    check_flags(args)
    plan, shard_docs = launch.plan_for(args, defaults=vars(parse_args(["--cache", "-", "--out", "-"])))
    try:
        code = run_planned(plan, shard_docs, args, chatter)
    except BaseException:
        parallel.shutdown(plan, clean=False)
        raise
    parallel.shutdown(plan)
    return code


def run_planned(plan, shard_docs, args, chatter):
    """run_all once the run's plan is made (experiments/launch.py): the checks, the experiments, the evidence."""
    args.as_given = launch.scoring_args(args)   # the shard identity: the arguments before route_data fills defaults
    check_flags(args)
    if args.sign is not None:       # before anything loads: ssh-keygen is there and the key signs (a trial signature)
        launch.on_rank0(plan, signing.check_key, args.sign)
    check_names(args)
    lock = launch.on_rank0(plan, claim_out, args, EXPERIMENTS)
    try:
        return run_claimed(plan, shard_docs, args, chatter)
    finally:
        if lock is not None:
            lock.release()


def run_claimed(plan, shard_docs, args, chatter):
    """run_planned once O is this run's (rank 0 holds its lock): the experiments and the evidence."""
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

    run_id = parallel.broadcast(plan, new_run_id())
    out = launch.on_rank0(plan, setup_out, args, EXPERIMENTS, run_id) or Path(args.out)
    options = options_of(args)
    torch.set_num_threads(args.threads)  # process-wide: both paths alike (--threads, default config.py)
    paths = local_paths(args, inputs)
    env = parallel.broadcast(plan, {**environment(args.threads), "command_line": public_command_line(sys.argv, paths),
                                    "run_id": run_id})
    configs = {name: context_for(m, args, inputs, options, Stages(), routed).config for name, m in modules.items()}
    identity = launch.check_merge_identity(plan, args, configs, inputs, env, shard_docs)
    if parallel.is_writer(plan):
        chatter.to_file(out / "run.log", " ".join(env["command_line"]) + f" (run id {env['run_id']})", paths.text)
    split_notes(args, modules, inputs, routed)
    if args.split == "confirm":
        print("*** CONFIRMATION SPLIT: scoring the 128 held-back items; every output says so ***")
    elif args.split == "all":
        print("*** SPLIT ALL: scoring every row of the validation split in idx order, the held-back confirmation "
              "items included; every output says so ***")
    done = {"installed": [], "failed": [], "running": None}
    started, since = time.perf_counter(), time.time()
    outcome, interrupted = "stopped by an error (exit 2)", False     # what run.log's closing line says
    try:
        exit_code = run_experiments(plan, args, modules, imports_s, inputs, options, env, done, routed, paths)
        outcome = f"exit {exit_code}"
        if exit_code == 0 and plan.mode == "shard":
            launch.write_shard_file(plan, out, identity, env)
            remove_marker(out)          # the shard finished: its directory holds its results, no dot-file
    except KeyboardInterrupt:
        outcome, interrupted = "interrupted (SIGINT)", True
    finally:       # also when a ResourceError stops the run: what was installed gets its manifest
        chatter.log_end(env["run_id"], outcome + ("" if done["installed"] or done["failed"] else
                                                   "; no evidence installed"))
        env = launch.with_rank_environment(plan, env, started)
        finished = finish_safely(out, env, done, chatter, args.sign) if parallel.is_writer(plan) else True
    if interrupted:
        raise Interrupted(interrupted_state(args, done, inputs, modules, configs, env, since))
    return exit_code if finished else 2


# ---- Ctrl-C: one line saying what finished, what the result cache keeps, and how to resume ----------------------

class Interrupted(KeyboardInterrupt):
    """A KeyboardInterrupt caught once the run's state is known: `state` says what finished and what is cached."""

    def __init__(self, state):
        super().__init__(state)
        self.state = state


def interrupted_state(args, done, inputs, modules, configs, env, since):
    """What an interrupted run leaves: the experiments installed, the one that was running, and the forward
    batches the result cache holds for that experiment's identity (a rerun is served those)."""
    text = f"installed: {', '.join(done['installed']) or 'no experiment'}"
    name = done.get("running")
    if name is None:
        return text
    text += f"; {name} was scoring"
    if args.no_cache:
        return text + " (--no-cache: nothing of it is kept for a rerun)"
    path = Path(inputs.cache) / configs[name].get("result_cache_file", result_cache.DEFAULT_FILE)
    counts = cached_batches(path, identity_facts(inputs, modules[name], configs[name], env), since)
    if counts is None:
        return text + f" (its result cache {path} could not be read)"
    total, new, new_scores = counts
    # only what this run stored is known to be this command's items: other batches of the identity may be another
    # split's or another --limit's, which a rerun of this command does not ask for
    if not new:
        return (text + f"; it stored no forward batch before it stopped, so a rerun scores it from the start (the "
                f"result cache holds {total} batch(es) of its identity from earlier runs, served only where a rerun "
                "forms the same batches)")
    return (text + f"; it stored {new} forward batch(es) ({new_scores} candidate scores) in the result cache, "
            "which a rerun of the same command is served")


def identity_facts(inputs, module, config_, env):
    """The parts of a result-cache run identity (result_cache.run_identity) that name this run's experiment."""
    data = inputs.data.get(config_.get(data_key(module))) if data_key(module) else None
    return {"model_sha256": inputs.model_identity["model_sha256"],
            "tokenizer_sha256": inputs.model_identity["tokenizer_sha256"],
            "scoring_config": result_cache.scoring_config(config_), "code_sha256": env["code_sha256"],
            "scorer": "independent-parity", **({"data_content_sha256": data.content_sha256} if data else {})}


def cached_batches(path, facts, since):
    """(forward batches, batches stored since `since`, their candidate scores) the result cache holds under every
    run identity that has `facts`, read-only; None when it cannot be read (absent: zeros)."""
    if not Path(path).exists():
        return 0, 0, 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        try:
            shas = [sha for sha, ident in db.execute("SELECT run_sha, identity FROM runs")
                    if all(json.loads(ident).get(k) == v for k, v in facts.items())]
            if not shas:
                return 0, 0, 0
            marks = ",".join("?" * len(shas))
            total, new, new_scores = db.execute(
                f"SELECT count(*), coalesce(sum(created >= ?), 0), "
                f"coalesce(sum(CASE WHEN created >= ? THEN json_array_length(value) ELSE 0 END), 0) "
                f"FROM results WHERE run_sha IN ({marks})", (since, since, *shas)).fetchone()
            return total, new, new_scores
        finally:
            db.close()
    except (sqlite3.Error, ValueError, OSError):
        return None


def resume_command(args, argv):
    """The command that resumes an interrupted run: the same one, plus --replace when O now holds evidence (what
    finished got its manifest), which moves it aside; the result cache serves what was scored."""
    given = list(sys.argv[1:] if argv is None else argv)
    if Path(args.out).is_dir() and evidence_entries(Path(args.out), EXPERIMENTS) and "--replace" not in given:
        given.append("--replace")
    return shlex.join([sys.executable, sys.argv[0] if argv is None else __file__, *given])


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


def finish_safely(out, env, done, chatter, sign=None):
    """finish(); False (after one error line) when the disk refuses the run's last files, O no longer holds the
    manifest this run wrote, or --sign could not sign its digest."""
    try:
        finish(out, env, done["installed"], done["failed"], chatter, sign)
        return True
    except ResourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return False
    except OSError as e:
        print(f"error: {out}: the run's last files (environment.json, report.html, MANIFEST.json) could not be "
              f"written ({e.strerror or e}); the evidence of this run is incomplete", file=sys.stderr)
        return False


def main(argv=None):
    args = parse_args(argv)
    chatter = LibraryChatter(verbose=args.verbose)
    try:
        check_merge_flags(args, argv)
        return run_all(args, chatter)
    except KeyboardInterrupt as e:      # Ctrl-C: one line, not the traceback of whatever was running
        state = e.state if isinstance(e, Interrupted) else "installed: no experiment"
        print(f"\ninterrupted: {state}; resume with: {resume_command(args, argv)}", file=sys.stderr)
        return 130
    except (ResourceError, ModelLoadError) as e:    # ModelLoadError: one line naming the model directory
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
