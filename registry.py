"""Every experiment, declared once: its name, the config.py sections its scores depend on, its three modules, the
files it writes beyond the five every experiment writes, and the code files that can change its scores.

    runner    experiments/<name>.py: the contract of experiments/context.py (run.py runs it)
    rule      evidence_audit/rules/<name>.py: "module:function", the audit rule (audit.py runs it)
    section   evidence_report/sections/<name>.py: its part of report.html (report.py renders it)

The order of EXPERIMENTS is the order run.py runs them (with no --experiment) and the order of the report page.
The lists the rest of the code reads are derived from this one: experiments.EXPERIMENTS (names),
evidence_audit.rules.RULES, evidence_report.sections.SECTIONS, evidence_audit.shared.CONFIG_SECTIONS, each
runner's CONFIG_SECTIONS, the audit's lists of the files each experiment writes (evidence_audit/driver.py), and
the code files hashed into every identity and result-cache key (experiments/evidence.CODE_FILES). run.py refuses a
Result whose extra files are not the ones declared here, so a missing declaration fails the run, not silently the
audit. config.py keeps the settings themselves; tests/test_registry.py fails when its sections and this file
disagree.

This module is plain data and imports nothing but the standard library: the audit and the report read it without
importing the code that wrote the evidence. The modules are named as dotted strings, and each consumer imports only
its own kind (the audit refuses a rule outside evidence_audit.rules, the report a section outside
evidence_report.sections).
"""
from typing import NamedTuple, Optional


class Experiment(NamedTuple):
    name: str                     # the evidence goes to O/<name>/; also run.py --experiment <name>
    config_sections: tuple        # config.py sections, "shared" first: what ctx.config merges and the cache keys on
    runner: str                   # dotted module name
    rule: str                     # "dotted.module:function"
    section: str                  # dotted module name
    private_files: tuple = ()     # O/private/<name>/ beside run.json: the files its Result.private names
    public_extras: tuple = ()     # O/<name>/ beyond the five every experiment writes: its Result.public
    top_files: tuple = ()         # files it writes into O itself, before the model loads
    code_files: tuple = ()        # repository files that can change its scores, beyond the ones every experiment uses


def declare(name, config_sections, private_files=(), public_extras=(), top_files=(), code_files=()):
    """An experiment whose modules have the conventional names: experiments.<name>,
    evidence_audit.rules.<name>:audit_<name>, evidence_report.sections.<name>. Its runner module is always one of
    its code files; `code_files` names the others."""
    return Experiment(name, tuple(config_sections), f"experiments.{name}", f"evidence_audit.rules.{name}:audit_{name}",
                      f"evidence_report.sections.{name}", tuple(private_files), tuple(public_extras),
                      tuple(top_files), (f"experiments/{name}.py", *code_files))


# What the sandboxed mini harness runs: its tasks, generation, metrics, the code_exec sandbox and its leaderboard.
HARNESS_CODE = ("harness/tasks.py", "harness/adapters.py", "harness/runner.py", "harness/metrics.py",
                "harness/leaderboard.py", "harness/sandbox.py", "harness/jail.py", "harness/proctree.py",
                "harness/strict_json.py")

EXPERIMENTS = (
    declare("protocol", ("shared", "protocol"), private_files=("texts.jsonl",)),
    declare("options", ("shared", "protocol", "options"), private_files=("texts.jsonl",)),
    declare("harness", ("shared", "harness"), private_files=("leaderboard.json",),
            public_extras=("leaderboard.json",), code_files=HARNESS_CODE),
    # protocol: target_delimiter and num_fewshot
    declare("mctaco", ("shared", "protocol", "mctaco"), private_files=("texts.jsonl",)),
    declare("extraction", ("shared", "extraction"), private_files=("generations.jsonl",),
            top_files=("extraction.preregistration.json",),       # the pre-registration, written before the model loads
            code_files=("experiments/extraction_scorers.py", "experiments/extraction_sample.py")),
)

NAMES = tuple(e.name for e in EXPERIMENTS)
# every config.py section some experiment reads, in first-use order ("shared" first)
CONFIG_SECTIONS = tuple(dict.fromkeys(s for e in EXPERIMENTS for s in e.config_sections))
# every experiment's own code files, in declaration order (experiments/evidence.CODE_FILES adds the shared ones)
CODE_FILES = tuple(dict.fromkeys(f for e in EXPERIMENTS for f in e.code_files))


def find(name) -> Optional[Experiment]:
    """The declaration of experiment `name`, or None when no experiment has that name."""
    return next((e for e in EXPERIMENTS if e.name == name), None)


def config_sections(name):
    """The config sections of a declared experiment (KeyError for an undeclared name)."""
    entry = find(name)
    if entry is None:
        raise KeyError(f"{name!r} is not declared in registry.py")
    return entry.config_sections
