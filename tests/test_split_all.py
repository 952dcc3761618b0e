"""--split all (slow): every row of an SST-2-shaped data file, in idx order, then `audit.py O --strict --tokens
--forward`, which must pass at every level.

The data is conftest's SMALL_DATA: the first 24 rows of fixtures/reviews_872_dev.tsv (12 per label), imported with
`prepare.py --data-file --name` like a user's own file, so that "every row" is cheap enough for the suite: the
protocol, options (5 conditions) and extraction (pre-registered sample drawn from all rows before generation) on
the real model, in the session's one run of the three (conftest.small_split_all_run) and its one audit
(conftest.small_split_all_audit). Whole splits at full size are a benchmark (bench.py, README), not a test. The
selection rules behind `all` are unit-tested in test_stats.py (options, extraction's sample, MC-TACO's whole
questions, harness).
"""
import json

import pytest

from conftest import SMALL_N


def audit_passes(audit, names):
    """The session's audit of the run passed at every level, with rows for each experiment of `names`."""
    proc, report = audit
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert report["exit_code"] == 0 and "RESULT: PASS" in proc.stdout
    for name in names:
        levels = {c["level"] for c in report["checks"] if c["experiment"] == name and c["status"] == "PASS"}
        assert {"arithmetic", "identity", "forward"} <= levels, (name, levels)
    return proc


@pytest.mark.slow
def test_protocol_split_all_runs_every_row_and_audits_at_every_level(small_split_all_run, small_split_all_audit):
    out, proc = small_split_all_run
    assert "SPLIT ALL" in proc.stdout and "[protocol] split=all" in proc.stdout
    records = [json.loads(l) for l in (out / "protocol" / "records.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in records] == list(range(SMALL_N))
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    assert cfg["split"] == summary["split"] == cfg["selection"]["split"] == "all"
    assert cfg["confirmation_items_scored"] is summary["confirmation_items_scored"] is True
    assert cfg["selection"]["item_idx"] == list(range(SMALL_N)) and summary["n_items"] == SMALL_N
    assert summary["agreement"]["max_abs_diff"] == 0.0
    assert cfg["independent"]["result_cache"]["enabled"] is False          # every score computed in the run
    unc = summary["uncertainty"]
    ind = unc["accuracies"]["independent/accuracy"]
    assert (ind["correct"], ind["n"]) == (summary["independent"]["correct"], SMALL_N)
    assert ind["wilson95"][0] < summary["independent"]["accuracy"] < ind["wilson95"][1]
    assert unc["paired"]["independent_vs_constant_class"]["n"] == SMALL_N
    assert 'SPLIT ALL' in (out / "report.html").read_text()

    audit = audit_passes(small_split_all_audit, ["protocol"])
    assert "SPLIT ALL SCORED" in audit.stdout


@pytest.mark.slow
def test_options_and_extraction_accept_split_all(small_split_all_run, small_split_all_audit):
    """options (5 conditions) and extraction (with its pre-registered sample drawn from all rows before generation)
    on --split all; the audit passes at every level."""
    out, _ = small_split_all_run
    opt = [json.loads(l) for l in (out / "options" / "records.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in opt[::5]] == list(range(SMALL_N)) and len(opt) == 5 * SMALL_N
    ext = [json.loads(l) for l in (out / "extraction" / "records.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in ext] == list(range(SMALL_N))
    prereg = json.loads((out / "extraction.preregistration.json").read_text())
    assert prereg["split"] == "all" and prereg["population"]["item_idx"] == list(range(SMALL_N))
    for name in ("options", "extraction"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["split"] == "all" and summary["confirmation_items_scored"] is True
        assert summary["uncertainty"]["paired"] and summary["uncertainty"]["accuracies"]
    audit_passes(small_split_all_audit, ["options", "extraction"])
