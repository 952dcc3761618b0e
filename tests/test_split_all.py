"""--split all on the real model (slow): the protocol experiment on every row of the fixture (200 rows, idx order),
then `audit.py O --strict --tokens --forward` on the result, which must pass at every level.

The protocol is the cheapest experiment for all 200 rows (two candidates per item); the other experiments accept
`--split all` through the same selection code, unit-tested in test_stats.py (options, extraction's pre-registered
sample, MC-TACO's whole questions, the harness's note).
"""
import json

import pytest

from conftest import run_cli


@pytest.mark.slow
def test_protocol_split_all_runs_every_row_and_audits_at_every_level(prepared_cache, tmp_path):
    out = tmp_path / "O"
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", out, "--experiment", "protocol", "--split", "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SPLIT ALL" in proc.stdout and "[protocol] split=all" in proc.stdout
    records = [json.loads(l) for l in (out / "protocol" / "records.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in records] == list(range(200))
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    assert cfg["split"] == summary["split"] == cfg["selection"]["split"] == "all"
    assert cfg["confirmation_items_scored"] is summary["confirmation_items_scored"] is True
    assert cfg["selection"]["item_idx"] == list(range(200)) and summary["n_items"] == 200
    assert summary["agreement"]["max_abs_diff"] == 0.0
    unc = summary["uncertainty"]
    ind = unc["accuracies"]["independent/accuracy"]
    assert (ind["correct"], ind["n"]) == (summary["independent"]["correct"], 200)
    assert ind["wilson95"][0] < summary["independent"]["accuracy"] < ind["wilson95"][1]
    assert unc["paired"]["independent_vs_constant_class"]["n"] == 200
    assert 'SPLIT ALL' in (out / "report.html").read_text()

    audit = run_cli("audit.py", out, "--strict", "--tokens", "--forward", timeout=1800)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr
    assert "SPLIT ALL SCORED" in audit.stdout


@pytest.mark.slow
def test_options_and_extraction_accept_split_all_on_a_tiny_model(tiny_cache, tmp_path):
    """Plumbing on the tiny random model (cheap): options (5 conditions) and extraction (with its pre-registered
    sample drawn from all 200 rows before generation) on --split all; the audit passes at every level."""
    out = tmp_path / "O"
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", out, "--model", "tiny-random-llama", "--split", "all",
                   "--experiment", "options", "--experiment", "extraction")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    opt = [json.loads(l) for l in (out / "options" / "records.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in opt[::5]] == list(range(200)) and len(opt) == 5 * 200
    ext = [json.loads(l) for l in (out / "extraction" / "records.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in ext] == list(range(200))
    prereg = json.loads((out / "extraction.preregistration.json").read_text())
    assert prereg["split"] == "all" and prereg["population"]["item_idx"] == list(range(200))
    for name in ("options", "extraction"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["split"] == "all" and summary["confirmation_items_scored"] is True
        assert summary["uncertainty"]["paired"] and summary["uncertainty"]["accuracies"]
    audit = run_cli("audit.py", out, "--strict", "--tokens", "--forward", timeout=1800)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr
