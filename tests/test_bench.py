"""bench.py's plumbing and the larger SST-2-shaped benchmark file (the figures themselves are not asserted: speed
is measured by bench.py on a quiet machine, never tested)."""
import json

import pytest

from conftest import PY, REPO, run_cli


def test_reviews_872_is_the_generators_output_and_reads_as_glue_sst2():
    import resources

    proc = run_cli(REPO / "fixtures" / "make_reviews_872.py", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = resources.read_glue_tsv(REPO / "fixtures" / "reviews_872_dev.tsv")
    assert len(rows) == 872 and [r["idx"] for r in rows] == list(range(872))
    assert sum(r["label"] for r in rows) == 436
    assert len({r["sentence"] for r in rows}) == 872
    assert min(map(len, (r["sentence"] for r in rows))) < 20 < 200 < max(map(len, (r["sentence"] for r in rows)))
