"""The contract between run.py and an experiment: a typed context in, a typed result out.

An experiment module exposes

    NAME                        its name (the evidence goes to O/<NAME>/), as declared in registry.py
    CONFIG_SECTIONS             the config.py sections its scores depend on, e.g. ("shared", "protocol"), as
                                declared in registry.py (registry.config_sections(NAME)); run.py passes their flat
                                merge as ctx.config and writes it into config.json and identity.json (and the
                                result cache keys on it)
    data_label(ctx) -> str      the data the experiment scores, for the console header printed before run()
    run(ctx: Context) -> Result
    SUPPORTS_LIMIT              optional, default False: the experiment implements --limit N
    DATA_SCHEMA                 optional, default "sst2": the schema of the --data it reads ("mctaco"; None: none);
                                run.py routes --data by it and refuses a mismatch (run.route_data)
    DATA_CONFIG_KEY             optional, default "data": the key of its effective config naming the data resource it
                                reads; run.py verifies that resource once and hands it over as ctx.data
    EXACT_AGREEMENT_ONLY        optional, default False: its two paths are compared bit for bit only (no tolerance-
                                based agreement claim), so run.py refuses it off the cpu (--device)
    NEEDS_CHAT_TEMPLATE         optional, default False: it renders prompts with the tokenizer's chat template, so
                                run.py refuses a local --model directory that has none
    DOCUMENTS_ARE_GROUP_PARTS   optional, default False: its documents are parts of a group, so --limit can cut a
                                group and run.py refuses it unless --allow-partial-groups
    DATA_PARALLEL               optional, default False: its scoring call sites use parallel.shard_map, so it can
                                run under torchrun / accelerate launch, --shard K/N and --merge (run.py refuses
                                the others there)

It never reads argparse and never exits: it raises

    IdentityMismatch   evidence does not belong to its item, or the two paths disagree   -> run.py exits 1
    ScoringError       a score cannot be computed as specified (e.g. an input over the limit) -> exit 1
    ResourceError      bad input, a missing or unverifiable resource, a refused option      -> exit 2

and run.py alone maps these to exit codes and messages (IdentityMismatch: O/<NAME>.FAILED.json and a table).
run.py writes the evidence files from the Result (config.json, identity.json, records.jsonl, summary.json,
stages.json, the public and private extras) into a temporary directory and renames it into place.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class Data:
    """One data resource, verified by run.py once per run before any experiment starts: its files re-hashed
    through the cache manifest, its content hash checked against the lock that pins it, its rows re-hashed to that
    content hash (resources.verify_rows). An experiment reads only this; it verifies nothing again."""
    id: str                      # the resource id (a lock id, or a prepare.py --name import)
    schema: str                  # "sst2" | "mctaco"
    parquet_path: Path           # its verified split (data/<id>/<split>.parquet)
    content_sha256: str          # canonical content hash of its rows (the identity keys on it)
    split: str                   # the split the resource holds (manifest entry "split"; validation when unnamed)


@dataclass(frozen=True)
class Inputs:
    """Verified resources: every file named here was re-hashed against the cache manifest before the run."""
    cache: Path                  # the prepared cache root (prepare.py --cache)
    model_dir: Path              # a Hugging Face directory: config.json, model.safetensors, tokenizer files
    model_identity: dict         # id, dir, model_sha256, tokenizer_sha256, source
    data: dict = field(default_factory=dict)   # resource id -> Data: every data resource this run's experiments read


@dataclass(frozen=True)
class Options:
    """The run.py flags an experiment may honour; each experiment says in its docstring which ones it reads."""
    out: Path                    # the output directory O (the experiment's own evidence goes to O/<NAME>)
    no_sort_samples: bool = False
    fast: bool = False
    no_cache: bool = False
    limit: Optional[int] = None
    allow_partial_groups: bool = False
    verbose: bool = False


@dataclass
class Context:
    name: str                    # the experiment's NAME
    split: str                   # smoke | dev | confirm | all
    config: dict                 # the effective config: the sections in CONFIG_SECTIONS merged into one flat dict
    inputs: Inputs
    options: Options
    stages: Any                  # experiments.evidence.Stages: with ctx.stages.stage("name"): ...
    plan: Any = None             # experiments.parallel.Plan: how this process shares the work (None: one process)
    data: Optional[Data] = None  # the data it reads (DATA_CONFIG_KEY), verified once by run.py; None: it reads none
    environment: Optional[dict] = None   # the run's environment.json facts, computed once per run by run.py


@dataclass
class Result:
    config: dict                 # -> O/<NAME>/config.json (what was run: split, items, official meta, ...)
    records: list                # -> O/<NAME>/records.jsonl, one JSON object per item
    summary: dict                # -> O/<NAME>/summary.json
    headline: str                # one line for the console
    token_stats: dict            # -> stages.json "tokens"
    prompt_template_sha256: str  # part of identity.json
    public: dict = field(default_factory=dict)    # extra public files: name -> text
    private: dict = field(default_factory=dict)   # O/private/<NAME>/ files: name -> text (item texts live here)
