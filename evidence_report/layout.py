"""Which layout the page is drawn in: the one of the evidence format its evidence declares (evidence_format).

Why the layout follows the evidence: audit.py rebuilds the page from the evidence with the checkout it runs from and
compares bytes (report.py --check). Evidence written before a layout change must still rebuild into the very page it
was given, or every audit of older evidence would meet a page that differs for no fault of the evidence
(tests/fixtures/cross_machine/run.py-smoke: format 2 evidence of another machine, whose page must come out byte for
byte). So the page of format 2 evidence keeps the layout it was drawn in, and evidence of format 3 (what run.py writes
today) gets the newer one. The two are renderings of the same numbers: every number cell names its value and its
place in the evidence in both, and the audit's cell check applies to both. The layout is not a second builder: one
code path, and the few places that differ ask `layout.format2` (grep for it).

What format 3's layout changes (docs/report.md says it for readers):
- no signed zero: a number whose rounding is zero is shown as a zero (0.0000), never -0.0000 nor +0.0000;
- a paired difference whose 95% interval is zero at both ends is named below its table, with why;
- the harness's sandbox limits are a table, one limit a row (what it bounds, its value, its unit), not a JSON object;
- the options accuracies are one row per condition and score, so that every table fits a 1300 px wide window.

A page whose files declare several formats (not something run.py writes) is drawn in the layout of the oldest.
"""
from dataclasses import dataclass

NEWEST_FORMAT = 3           # evidence_report.reading.READS_EVIDENCE_FORMATS[1] (tests/test_report.py checks)


@dataclass(frozen=True)
class Layout:
    """The layout of one page: the evidence format it is drawn for."""
    evidence_format: int

    @property
    def format2(self):
        """The page as format 2 evidence was given it, kept byte for byte (module docstring)."""
        return self.evidence_format <= 2


NEWEST = Layout(NEWEST_FORMAT)


def layout_of(formats):
    """The layout of a page whose evidence files declare `formats` (ints): the oldest's; the newest when none does
    (nothing readable declares one: the views that read the files show their own errors)."""
    return Layout(min(formats)) if formats else NEWEST
