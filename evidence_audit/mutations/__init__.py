"""The mutation self-test (`audit.py O --mutations`): tamper with copies of O, one kind at a time; each kind names
the level and the check that must catch it, and the untouched copy must pass.

Modules: tools (the Kind record, edits of a copy, the forger's cover-ups: report.html rebuilt by report.py,
MANIFEST.json resealed), scores (protocol, options, mctaco), generations (extraction, harness), files (the
manifest, run ids, environment.json, report.html, links, directories, lenient JSON, and what a resealing forger
deletes or adds), selftest (the runner and its table), table (the markdown table of a report, for
docs/tampering.md). Every kind runs in two forms: raw (the edit alone) and resealed (report.html rebuilt and
MANIFEST.json rewritten to match, private digests included), so the table shows what the manifest catches and what
the levels below it catch on their own (selftest's docstring defines both and the statuses).
"""
from evidence_audit.mutations.selftest import MUTATIONS, mutation_selftest
from evidence_audit.mutations.tools import Kind, NotApplicable

__all__ = ["MUTATIONS", "Kind", "NotApplicable", "mutation_selftest"]
