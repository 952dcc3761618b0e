"""The mutation self-test (`audit.py O --mutations`): tamper with copies of O, one kind at a time; each kind names
the level and the check that must catch it, and the untouched copy must pass.

Modules: tools (the Kind record, edits of a copy, the forger's reseal of MANIFEST.json), scores (protocol, options,
mctaco), generations (extraction, harness), files (the manifest, run ids, environment.json, report.html, links,
directories, lenient JSON), selftest (the runner and its table). Most kinds are sealed: after the edit the forger
rewrites MANIFEST.json to match (evidence_audit.manifest.reseal), so the row shows what the levels below the
manifest catch on their own; the kinds that attack the manifest itself are not sealed.
"""
from evidence_audit.mutations.files import file_kinds
from evidence_audit.mutations.generations import generation_kinds
from evidence_audit.mutations.scores import score_kinds
from evidence_audit.mutations.selftest import mutation_selftest
from evidence_audit.mutations.tools import Kind, NotApplicable

MUTATIONS = score_kinds() + generation_kinds() + file_kinds()

__all__ = ["MUTATIONS", "Kind", "NotApplicable", "mutation_selftest"]
