"""Every experiment, declared once: its name, the config.py sections its scores depend on, and its three modules.

    runner    experiments/<name>.py: the contract of experiments/context.py (run.py runs it)
    rule      evidence_audit/rules/<name>.py: "module:function", the audit rule (audit.py runs it)
    section   evidence_report/sections/<name>.py: its part of report.html (report.py renders it)

The order of EXPERIMENTS is the order run.py runs them (with no --experiment) and the order of the report page.
The lists the rest of the code reads are derived from this one: experiments.EXPERIMENTS (names),
evidence_audit.rules.RULES, evidence_report.sections.SECTIONS, evidence_audit.shared.CONFIG_SECTIONS, and each
runner's CONFIG_SECTIONS. config.py keeps the settings themselves; tests/test_registry.py fails when its sections
and this file disagree.

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


def declare(name, config_sections):
    """An experiment whose modules have the conventional names: experiments.<name>,
    evidence_audit.rules.<name>:audit_<name>, evidence_report.sections.<name>."""
    return Experiment(name, tuple(config_sections), f"experiments.{name}", f"evidence_audit.rules.{name}:audit_{name}",
                      f"evidence_report.sections.{name}")


EXPERIMENTS = (
    declare("protocol", ("shared", "protocol")),
    declare("options", ("shared", "protocol", "options")),
    declare("harness", ("shared", "harness")),
    declare("mctaco", ("shared", "protocol", "mctaco")),      # protocol: target_delimiter and num_fewshot
    declare("extraction", ("shared", "extraction")),
)

NAMES = tuple(e.name for e in EXPERIMENTS)
# every config.py section some experiment reads, in first-use order ("shared" first)
CONFIG_SECTIONS = tuple(dict.fromkeys(s for e in EXPERIMENTS for s in e.config_sections))


def find(name) -> Optional[Experiment]:
    """The declaration of experiment `name`, or None when no experiment has that name."""
    return next((e for e in EXPERIMENTS if e.name == name), None)


def config_sections(name):
    """The config sections of a declared experiment (KeyError for an undeclared name)."""
    entry = find(name)
    if entry is None:
        raise KeyError(f"{name!r} is not declared in registry.py")
    return entry.config_sections
