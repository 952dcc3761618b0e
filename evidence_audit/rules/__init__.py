"""One rule per experiment, holding only what is particular to it; the check groups every experiment shares are in
evidence_audit.shared.

A rule is rule(C, name, out, levels, cache) -> dict of figures for audit.json. It records one row per check group
with C.add (failure messages name the item and field) or C.skip (with the reason), for every level in
("arithmetic", "identity", "forward"), and raises reading.Unreadable for a file it cannot parse. An experiment
directory with no rule here is reported as FAIL ("no audit rule"), never passed.

RULES (experiment name -> rule) is derived from registry.py, where each experiment names its rule as
"evidence_audit.rules.<module>:<function>". The rule is imported by that name, and only from this package: a name
outside it is refused, so the registry cannot make the audit import the code that wrote the evidence.
"""
import importlib

import registry

PACKAGE = "evidence_audit.rules."


def load_rule(dotted):
    """The rule function named "evidence_audit.rules.<module>:<function>"; ValueError for any other name."""
    module, _, function = dotted.partition(":")
    if not (module.startswith(PACKAGE) and module[len(PACKAGE):].isidentifier() and function.isidentifier()):
        raise ValueError(f"{dotted!r}: an audit rule is a function of a module in {PACKAGE[:-1]}, named "
                         f"'{PACKAGE}<module>:<function>'")
    return getattr(importlib.import_module(module), function)


RULES = {e.name: load_rule(e.rule) for e in registry.EXPERIMENTS}
