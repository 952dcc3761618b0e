"""--split all (slow): every row of an SST-2-shaped data file, in idx order, then `audit.py O --strict --tokens
--forward`, which must pass at every level.

The data is conftest's SMALL_DATA: the first 24 rows of fixtures/reviews_872_dev.tsv (12 per label), imported with
`prepare.py --data-file --name` like a user's own file, so that "every row" is cheap enough for the suite: the
protocol on the real model, and options (5 conditions) + extraction (pre-registered sample drawn from all rows
before generation) on the tiny random model. Whole splits at full size are a benchmark (bench.py, README), not a
test. The selection rules behind `all` are unit-tested in test_stats.py (options, extraction's sample, MC-TACO's
whole questions, harness).
"""
import json

import pytest

from conftest import SMALL_DATA, SMALL_N, run_cli


@pytest.mark.slow
def test_protocol_split_all_runs_every_row_and_audits_at_every_level(small_data_cache, tmp_path):
    out = tmp_path / "O"
    proc = run_cli("run.py", "--cache", small_data_cache, "--out", out, "--experiment", "protocol", "--data",
                   SMALL_DATA, "--split", "all", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SPLIT ALL" in proc.stdout and "[protocol] split=all" in proc.stdout
    records = [json.loads(l) for l in (out / "protocol" / "records.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in records] == list(range(SMALL_N))
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    assert cfg["split"] == summary["split"] == cfg["selection"]["split"] == "all"
    assert cfg["confirmation_items_scored"] is summary["confirmation_items_scored"] is True
    assert cfg["selection"]["item_idx"] == list(range(SMALL_N)) and summary["n_items"] == SMALL_N
    assert summary["agreement"]["max_abs_diff"] == 0.0
    unc = summary["uncertainty"]
    ind = unc["accuracies"]["independent/accuracy"]
    assert (ind["correct"], ind["n"]) == (summary["independent"]["correct"], SMALL_N)
    assert ind["wilson95"][0] < summary["independent"]["accuracy"] < ind["wilson95"][1]
    assert unc["paired"]["independent_vs_constant_class"]["n"] == SMALL_N
    assert 'SPLIT ALL' in (out / "report.html").read_text()

    audit = run_cli("audit.py", out, "--strict", "--tokens", "--forward", "--cache", small_data_cache)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr
    assert "SPLIT ALL SCORED" in audit.stdout


@pytest.mark.slow
def test_options_and_extraction_accept_split_all_on_a_tiny_model(tiny_split_all_run, tiny_small_data_cache):
    """Plumbing on the tiny random model: options (5 conditions) and extraction (with its pre-registered sample
    drawn from all rows before generation) on --split all; the audit passes at every level."""
    out, _ = tiny_split_all_run
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
    audit = run_cli("audit.py", out, "--strict", "--tokens", "--forward", "--cache", tiny_small_data_cache,
                    "--report", out.parent / "tiny_split_all.audit.json")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr
