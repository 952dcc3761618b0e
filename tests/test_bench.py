"""bench.py's plumbing and the larger SST-2-shaped benchmark file (the figures themselves are not asserted: speed
is measured by bench.py on a quiet machine, never tested)."""
import json

import pytest

from conftest import REPO, run_cli


def test_reviews_872_is_the_generators_output_and_reads_as_glue_sst2():
    import resources

    proc = run_cli(REPO / "fixtures" / "make_reviews_872.py", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = resources.read_glue_tsv(REPO / "fixtures" / "reviews_872_dev.tsv")
    assert len(rows) == 872 and [r["idx"] for r in rows] == list(range(872))
    assert sum(r["label"] for r in rows) == 436
    assert len({r["sentence"] for r in rows}) == 872
    assert min(map(len, (r["sentence"] for r in rows))) < 20 < 200 < max(map(len, (r["sentence"] for r in rows)))


def test_bench_refuses_a_bad_data_file_in_one_line(tmp_path):
    bad = tmp_path / "dev.tsv"
    bad.write_text("sentence\tlabel\nfine\t1\nbroken row without a label\n", encoding="utf-8")
    proc = run_cli("bench.py", "--cache", tmp_path / "no-cache", "--data-file", bad)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {bad}:3: expected 2 TAB-separated fields (sentence, "
                                                "label), found 1: 'broken row without a label'"]


def test_bench_method_names(tmp_path):
    """lm_eval_b<N>, parity_b<N> and fast_b<N> pass the --methods check (and reach the cache check); other names do not.
    Through the command line: nothing imports bench.py."""
    for methods in ("lm_eval_b0", "lm_eval_bx", "fast_b", "dual2", "parity,nope", "parity_b0"):
        proc = run_cli("bench.py", "--cache", tmp_path, "--methods", methods)
        assert proc.returncode == 2 and "--methods" in proc.stderr, methods
    proc = run_cli("bench.py", "--cache", tmp_path, "--methods", "lm_eval_b32,parity_b32,fast_b8,dual,options")
    assert proc.returncode == 2 and "--methods" not in proc.stderr and "no prepared cache" in proc.stderr


@pytest.mark.slow
def test_bench_runs_every_method_on_a_data_file_and_writes_bench_json(tiny_cache, tmp_path):
    """Every method on the tiny random model, 20 rows of a file read directly (two batches at 16): the table, the
    ratios to lm-eval, the floor, each lm-eval batch size against the parity path at that batch size (the same
    tensors: bit for bit), the dual run's exact official-vs-independent comparison (the experiments' own code),
    options. Run from another directory with relative paths, as a user's shell gives them (the workers run in the
    repository's directory: relative paths once failed every method there)."""
    out, data = tmp_path / "bench.json", tmp_path / "rows.tsv"
    data.write_bytes((REPO / "fixtures" / "reviews_872_dev.tsv").read_bytes())
    (tmp_path / "cache").symlink_to(tiny_cache)
    proc = run_cli(REPO / "bench.py", "--cache", "./cache", "--model", "tiny-random-llama", "--n", "20", "--out",
                   "bench.json", "--data-file", "rows.tsv", "--sgemm-size", "256", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    b = json.loads(out.read_text())
    rows = {r["method"]: r for r in b["table"]}
    assert list(rows) == ["lm_eval_b1", "lm_eval_b16", "parity_b1", "parity", "fast", "dual", "options"]
    import resources

    assert b["data"] == "file:rows.tsv" and b["idx"] == list(range(20))
    assert b["data_content_sha256"] == resources.content_sha256(resources.read_glue_tsv(data))
    assert b["work"]["n_items"] == 20 and b["work"]["R_rows"] == 20
    assert b["work"]["T_tokens"] == b["work"]["context_tokens"]            # one-token candidates: contexts only
    fm = b["flop_model"]
    assert b["flops"] == 2 * fm["n_nonemb_matmul_params"] * b["work"]["T_tokens"] + 2 * fm["d_model"] * fm["vocab"] * 20
    for m, r in rows.items():
        assert r["peak_rss_mib"] > 0 and r["failure"] is None
        # wall_s is stored rounded (0.01 s) and the tiny model's times are fractions of a second: allow the rounding
        assert r["x_lm_eval_b1"] == pytest.approx(r["wall_s"] / rows["lm_eval_b1"]["wall_s"], rel=0.05, abs=0.01)
        if m not in ("options", "parity"):
            assert r["argmax_changes_vs_parity"] == 0
    # like with like: lm-eval at batch N against the independent path at batch N, every score bit for bit
    assert (rows["lm_eval_b1"]["compared_with"], rows["lm_eval_b16"]["compared_with"]) == ("parity_b1", "parity")
    for m in ("lm_eval_b1", "lm_eval_b16"):
        assert rows[m]["vs_ref_max_abs_diff"] == 0.0 and rows[m]["vs_ref_n_scores_equal"] == 40, m
    assert rows["fast"]["compared_with"] == "parity" and rows["fast"]["vs_ref_n_argmax_changes"] == 0
    assert rows["dual"]["official_vs_independent"]["n_scores_equal"] == 40
    assert rows["dual"]["official_batch_size"] == b["official_batch_size"]
    assert rows["dual"]["x_flop_floor"] == pytest.approx(rows["dual"]["wall_s"] / (2 * b["flop_floor_s"]), rel=0.05)
    assert b["work_done"]["parity"]["forward_passes"] == 20                # one per distinct input
    assert (b["work_done"]["parity"]["batches"], b["work_done"]["parity_b1"]["batches"]) == (2, 20)
    assert b["targets"]["lm_eval_equals_parity_at_each_batch_size"] and b["targets"]["dual_bit_exact"]
    assert "FLOP floor = 2 * N_nonemb * T + 2 * d_model * V * R" in proc.stdout and "targets:" in proc.stdout
