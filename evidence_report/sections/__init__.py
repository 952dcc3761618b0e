"""One section per experiment, holding only what is particular to its evidence; what several sections share is in
evidence_report.shared, the number cells in evidence_report.cells, the shared plots in evidence_report.plots.

A section module has NAME (the experiment, the name of its directory in O) and render(exp_dir, summary, layout) ->
HTML: the body of the experiment's section, drawn from exp_dir (O/<experiment>/) and its summary.json, already read
(numbers marked with their data-src), in the page's layout (evidence_report.layout: the one of the evidence format
the evidence declares; a section passes it on to every table it draws). It may raise on evidence of an unexpected
shape: the page then shows the error and the generic view instead (evidence_report.page). An experiment directory
with no section here is shown in the generic view (every summary.json field), after the known ones.

SECTIONS (insertion order is the page's order): experiment name -> its section module, derived from registry.py
(its order, each experiment's "evidence_report.sections.<module>"). A section is imported by that name, and only
from this package: a name outside it is refused, so the registry cannot make the report import the code that wrote
the evidence.
"""
import importlib

import registry

PACKAGE = "evidence_report.sections."


def load_section(dotted):
    """The section module named "evidence_report.sections.<module>"; ValueError for any other name."""
    if not (dotted.startswith(PACKAGE) and dotted[len(PACKAGE):].isidentifier()):
        raise ValueError(f"{dotted!r}: a report section is a module of {PACKAGE[:-1]}, named '{PACKAGE}<module>'")
    return importlib.import_module(dotted)


SECTIONS = {e.name: load_section(e.section) for e in registry.EXPERIMENTS}
