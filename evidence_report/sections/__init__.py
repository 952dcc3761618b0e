"""One section per experiment, holding only what is particular to its evidence; what several sections share is in
evidence_report.shared, the number cells in evidence_report.cells, the shared plots in evidence_report.plots.

A section module has NAME (the experiment, the name of its directory in O) and render(exp_dir, summary) -> HTML:
the body of the experiment's section, drawn from exp_dir (O/<experiment>/) and its summary.json, already read
(numbers marked with their data-src). It may raise on evidence of an unexpected shape: the page then shows the error
and the generic view instead (evidence_report.page). An experiment directory with no section here is shown in the
generic view (every summary.json field), after the known ones.

SECTIONS (insertion order is the page's order): experiment name -> its section module.
"""
from evidence_report.sections import extraction, harness, mctaco, options, protocol

SECTIONS = {"protocol": protocol, "options": options, "extraction": extraction, "mctaco": mctaco,
            "harness": harness}
