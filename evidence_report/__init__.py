"""The page a person reads, O/report.html: one self-contained page built from the evidence under O alone
(report.py is its command line; run.py calls report.write after its experiments).

Per experiment: the headline table, the agreement figures (official vs independent), identity checks, stage times
and peak RSS, and plots where looking beats reading. Plots are PNGs embedded as data URIs (matplotlib, Agg), so
the page needs no network and no other file. Like audit.py it reads only the evidence files, never the code that
wrote them; unlike audit.py it checks nothing — it shows what the evidence says. Neither report.py nor this package
imports anything of the repository (run, experiments, harness, resources, config, adapter, bench, prepare, audit,
evidence_audit) nor lm_eval: tests/test_report.py checks this by AST scan. The one exception is registry.py, plain
data importing only the standard library: the experiments, in page order, and each one's section module, which is
imported only from evidence_report.sections.

Numbers are rounded for reading, by what they are: counts as integers, accuracies and other rates to 4 decimals,
p-values to 3 decimals (e-notation below 0.001), differences of log-likelihoods to 2 significant digits (0.0,
1.2e-05), seconds to the millisecond; null is "—". The exact value, as json.dumps wrote it into the evidence, stays
in every number cell's data-value attribute (and its tooltip), and the place it was read from in data-src
("<exp>/<file>#<dotted.path>", or "<exp>/records.jsonl#<line>.<path>", line from 1): audit.py checks every such
cell against the evidence. A short list of item ids is a number cell too; a JSON object shown whole has data-src and
no data-value (its text is exact). A figure
the page computes is labelled derived: the MiB of a byte count names its value and derivation (data-of,
data-derive: cells.DERIVATIONS) so the audit recomputes it; a count the page makes itself (the flip matrices counted
from records.jsonl, sums) has neither and may appear only in the tables audit.py lists. The page is deterministic
(the same evidence gives the same bytes: no clock, no path of O nor of the code, even in an error box) and shows no
audit state: it tells the reader to run audit.py O. `report.py --check O` rebuilds it and compares bytes (page.check).
Its layout follows the evidence format the evidence declares (layout.py says why: an audit rebuilds the page of older
evidence with today's code, and must get the page that evidence was given).

audit.py checks the page against its own whitelist (evidence_audit/report_page.py), not by importing this package:
the page writes only the elements and attributes listed there, one stylesheet (page.CSS, whose sha256 the audit
keeps), no script, no style attribute, and no decimal number outside a number cell. A change here that writes new
markup, a new derivation or a new derived table must be made there too (tests/test_report_forgery.py).

Every table that a test or a reader may want to find has an id: "<experiment>-<what>", e.g. "options-conditions".
A section that cannot be rendered (evidence of an unexpected shape) shows the error and the generic table of its
summary instead of breaking the page; the error box has class "render-error". Evidence of an evidence format the
page does not read (reading.READS_EVIDENCE_FORMATS), or of none, is not drawn at all: build raises UnknownFormat,
one line naming the file, and report.py exits 2.

    layout.py             which layout the page is drawn in: the one of the evidence format the evidence declares
                          (format 2 evidence keeps the page it was given, byte for byte; format 3 gets the newer one)
    cells.py              numbers as text (fmt), the number cell (data-value, data-src) and the values that carry
                          their place in the evidence (sourced)
    reading.py            the evidence files, read with their numbers marked (read_json, read_jsonl); the
                          evidence formats the page reads
    tables.py             HTML tables and the small pieces of text around them
    plots.py              the plots several experiments share (matplotlib, imported only when drawing)
    shared.py             the agreement and paired-comparison tables; stages, identity and the generic view
    sections/<exp>.py     what is particular to one experiment; sections.SECTIONS orders and names them
    page.py               the page: every experiment's section, the environment, the atomic write
"""
