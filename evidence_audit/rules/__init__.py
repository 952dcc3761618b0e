"""One rule per experiment, holding only what is particular to it; the check groups every experiment shares are in
evidence_audit.shared.

A rule is rule(C, name, out, levels, cache) -> dict of figures for audit.json. It records one row per check group
with C.add (failure messages name the item and field) or C.skip (with the reason), for every level in
("arithmetic", "identity", "forward"), and raises reading.Unreadable for a file it cannot parse. An experiment
directory with no rule here is reported as FAIL ("no audit rule"), never passed.
"""
from evidence_audit.rules.extraction import audit_extraction
from evidence_audit.rules.harness import audit_harness
from evidence_audit.rules.mctaco import audit_mctaco
from evidence_audit.rules.options import audit_options
from evidence_audit.rules.protocol import audit_protocol

RULES = {"protocol": audit_protocol, "options": audit_options, "harness": audit_harness,
         "extraction": audit_extraction, "mctaco": audit_mctaco}
