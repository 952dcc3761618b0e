"""The official SST-2 protocol on the real model: both paths, bit for bit, with identity checks that can fail."""
import json

import pytest

from conftest import REPO, run_cli
from experiments import scoring, selection
from config import CONFIG

IDENTITY_FIELDS = {"idx", "rank", "label", "sentence_sha256", "prompt_sha256", "context_tokens", "candidates",
                   "official", "independent", "abs_diff"}


def read_records(out):
    return [json.loads(l) for l in (out / "protocol" / "records.jsonl").read_text().splitlines()]


def check_run(out, n_items):
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    records = read_records(out)
    assert summary["n_items"] == n_items == len(records)
    assert summary["n_candidates"] == 2 * n_items
    assert summary["agreement"] == {"max_abs_diff": 0.0, "n_candidate_score_mismatches": 0,
                                    "n_prediction_mismatches": 0}
    assert summary["identity_checks"]["passed"] and summary["identity_checks"]["n_samples_joined"] == n_items
    assert summary["official"]["lm_eval_reported_acc"] == summary["official"]["accuracy"]
    for r in records:
        assert IDENTITY_FIELDS <= set(r), r.keys()
        assert r["official"]["scores"] == r["independent"]["scores"]
        assert r["official"]["doc_id"] == r["idx"]
        assert r["official"]["prompt_hash"] == r["prompt_sha256"]
        assert [c["token_ids"] for c in r["candidates"]] == [[3524], [2731]]
        assert all(c["start"] == r["context_tokens"] for c in r["candidates"])
        assert "sentence" not in json.dumps(r).replace("sentence_sha256", "")  # no dataset text in public evidence
    return summary, records


def test_smoke_two_items_four_candidates(smoke_run):
    out, proc = smoke_run
    summary, records = check_run(out, 2)
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    assert [r["idx"] for r in records] == ranked[:2]
    assert "identity checks passed" in proc.stdout
    for name in ("environment.json",):
        assert (out / name).exists()
    for name in ("config.json", "identity.json", "records.jsonl", "summary.json", "stages.json"):
        assert (out / "protocol" / name).exists()
    texts = (out / "private" / "protocol" / "texts.jsonl").read_text().splitlines()
    assert len(texts) == 2


def test_dev_64_items_bit_exact(dev_run):
    out, _ = dev_run
    summary, records = check_run(out, 64)
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    assert [r["idx"] for r in records] == ranked[:64]
    assert not set(r["idx"] for r in records) & set(ranked[64:192])  # confirmation items untouched
    assert summary["split"] == "dev" and summary["confirmation_items_scored"] is False
    config = json.loads((out / "protocol" / "config.json").read_text())
    assert config["selection"]["salt"] == CONFIG["selection_salt"]
    assert config["official"]["indices_sorted"] is True
    assert config["official"]["dumped_task_config"]["doc_to_text"].startswith("{{sentence}}")
    assert "api/task.py" in config["official"]["lm_eval_files_sha256"]
    stages = json.loads((out / "protocol" / "stages.json").read_text())
    names = [s["name"] for s in stages["stages"]]
    assert names == ["imports", "official_model_load", "official", "independent_model_load", "independent",
                     "compare", "write"]
    assert stages["tokens"]["context_tokens"]["total"] == sum(r["context_tokens"] for r in records)
    labels = [r["label"] for r in records]
    assert summary["label_counts"] == {"0": labels.count(0), "1": labels.count(1)}


def test_unsorted_samples_defect_is_caught(tiny_cache, tmp_path):
    """lm-eval 0.4.9.2 logs doc_id in the caller's order but iterates docs in dataset order: exit 1, no evidence.

    The defect is in the bookkeeping, not the model, so the tiny random model shows it as well as the real one;
    the 64 development items are needed because the 2 smoke items happen to be in ascending order already."""
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", tmp_path, "--model", "tiny-random-llama",
                   "--experiment", "protocol", "--no-sort-samples")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "doc.idx" in proc.stderr and "MISMATCH" in proc.stderr
    failed = json.loads((tmp_path / "protocol.FAILED.json").read_text())
    assert any(m["field"] == "doc.idx" for m in failed["mismatches"])
    assert not (tmp_path / "protocol").exists()  # no evidence was installed


def test_missing_cache_fails_clearly(tmp_path):
    proc = run_cli("run.py", "--cache", tmp_path / "nope", "--out", tmp_path / "o", "--smoke")
    assert proc.returncode == 2
    assert "prepare.py" in proc.stderr and proc.stderr.count("\n") == 1


# ---- the independent path's own assertions (real tokenizer) ------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from adapter import load_tokenizer
    return load_tokenizer(model_dir)


PROMPT = "A warm, funny film.\nQuestion: Is this sentence positive or negative?\nAnswer:"


def test_wrong_candidate_boundary_is_caught(tokenizer):
    ctx_ids, cand_ids = scoring.encode_pair(tokenizer, PROMPT, " positive")
    scoring.check_boundary(tokenizer, PROMPT, " positive", ctx_ids, cand_ids)  # the true one passes
    with pytest.raises(scoring.ScoringError, match="boundary mismatch"):
        scoring.check_boundary(tokenizer, PROMPT, " positive", ctx_ids[:-1], ctx_ids[-1:] + cand_ids)
    with pytest.raises(scoring.ScoringError, match="boundary mismatch"):
        scoring.check_boundary(tokenizer, PROMPT, " positive", ctx_ids, [3524])


def test_prompt_with_extra_space_is_caught(tokenizer):
    with pytest.raises(scoring.ScoringError, match="ends with whitespace"):
        scoring.encode_pair(tokenizer, PROMPT + " ", " positive")


def test_non_prefix_tokenisation_is_caught(tokenizer):
    # "Answer" + "ing" merges across the boundary, so the context tokens are not a prefix of the whole.
    ctx = "It was fine\nAnswer"
    with pytest.raises(scoring.ScoringError, match="not a prefix"):
        scoring.encode_pair(tokenizer, ctx, "ing")


def test_600_token_input_fails_clearly(tokenizer):
    long_sentence = " ".join(["wonderful"] * 600)
    prompt = CONFIG["sst2_prompt"].format(sentence=long_sentence)
    ctx_ids, cand_ids = scoring.encode_pair(tokenizer, prompt, " positive")
    with pytest.raises(scoring.ScoringError, match=r"over the limit of 512; refusing to truncate"):
        scoring.check_length(len(ctx_ids) + len(cand_ids), CONFIG["max_input_tokens"], "idx 7")


def test_argmax_first_index_wins_ties():
    assert scoring.argmax_first([-1.0, -1.0]) == 0
    assert scoring.argmax_first([-2.0, -1.0, -1.0]) == 1
    assert scoring.argmax_first([-0.5, -3.0]) == 0


def test_selection_rule_is_fixed_and_disjoint():
    dev = selection.select("dev", "s", 300, 64, 128, 2)
    confirm = selection.select("confirm", "s", 300, 64, 128, 2)
    smoke = selection.select("smoke", "s", 300, 64, 128, 2)
    assert len(dev) == 64 and len(confirm) == 128 and smoke == dev[:2]
    assert not set(dev) & set(confirm)
    assert dev == selection.select("dev", "s", 300, 64, 128, 2)
    assert dev != selection.select("dev", "t", 300, 64, 128, 2)
    with pytest.raises(ValueError, match="needs 192"):
        selection.select("confirm", "s", 100, 64, 128, 2)


def test_confirm_split_is_only_scored_on_request_and_says_so(tiny_cache, tmp_path):
    """Plumbing on a tiny random model: --split confirm scores exactly the 128 held-back items and labels them."""
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", tmp_path, "--model", "tiny-random-llama",
                   "--split", "confirm", "--experiment", "protocol")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CONFIRMATION SPLIT" in proc.stdout
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    records = read_records(tmp_path)
    assert [r["idx"] for r in records] == ranked[64:192]
    for name in ("summary.json", "config.json"):
        doc = json.loads((tmp_path / "protocol" / name).read_text())
        assert doc["split"] == "confirm" and doc["confirmation_items_scored"] is True
    summary = json.loads((tmp_path / "protocol" / "summary.json").read_text())
    assert summary["agreement"]["max_abs_diff"] == 0.0  # bit-exact holds for any weights, not just the real ones


def test_tampered_cache_file_is_refused_by_run(tiny_cache, tmp_path):
    import shutil
    cache = tmp_path / "cache"
    shutil.copytree(tiny_cache, cache)
    parquet = cache / "data" / "fixture-sentiment" / "validation.parquet"
    data = bytearray(parquet.read_bytes())
    data[len(data) // 2] ^= 1
    parquet.write_bytes(bytes(data))
    proc = run_cli("run.py", "--cache", cache, "--out", tmp_path / "o", "--model", "tiny-random-llama", "--smoke",
                   "--experiment", "protocol")
    assert proc.returncode == 2
    assert "validation.parquet: bytes changed" in proc.stderr
