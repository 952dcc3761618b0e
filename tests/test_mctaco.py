"""MC-TACO: corpus F1, question groups, the --limit refusal, and lm-eval's mc_taco task on the
real model over the repository's fixture (official vs independent, bit for bit; audit recomputes everything)."""
import io
import json
import shutil

import pytest

import resources
from conftest import REPO, run_cli, run_once
from evidence_audit.checks import first_failure
from evidence_audit.driver import audit
from evidence_audit.forward import FORWARD_TOL
from evidence_audit.manifest import reseal
from evidence_audit.rules.mctaco import mct_em, mct_f1
from experiments import mctaco

FIXTURE = REPO / "fixtures" / "mctaco_dev.tsv"


def load_out(out):
    d = out / "mctaco"
    recs = [json.loads(l) for l in (d / "records.jsonl").read_text().splitlines()]
    return (json.loads((d / "summary.json").read_text()), json.loads((d / "config.json").read_text()), recs)


# ---- metrics by hand -------------------------------------------------------------------------------------------

def test_corpus_f1_is_computed_once_not_averaged():
    # two questions of three candidates; 1 = "yes"
    golds = [1, 1, 0, 0, 1, 0]
    preds = [1, 0, 0, 1, 1, 1]
    # whole corpus: TP 2 (idx 0, 4), FP 2 (idx 3, 5), FN 1 (idx 1) -> F1 = 2*2 / (2*2 + 2 + 1) = 4/7
    assert mctaco.corpus_f1(golds, preds) == 4 / 7
    assert mct_f1(golds, preds) == (4 / 7, {"tp": 2, "fp": 2, "fn": 1, "tn": 1})
    from lm_eval.api.metrics import f1_score as lm_eval_f1  # the aggregation lm-eval's mc_taco reports as f1
    assert float(lm_eval_f1(list(zip(golds, preds)))) == 4 / 7
    # averaging per question gives another number: q1 TP1 FN1 -> 2/3; q2 TP1 FP2 -> 1/2; mean 7/12 != 4/7
    per_question = [mctaco.corpus_f1(golds[:3], preds[:3]), mctaco.corpus_f1(golds[3:], preds[3:])]
    assert per_question == [2 / 3, 1 / 2] and sum(per_question) / 2 == pytest.approx(7 / 12)
    assert abs(sum(per_question) / 2 - 4 / 7) > 0.01
    # no "yes" anywhere: 0.0 (sklearn's zero_division default, which lm-eval inherits), in both implementations
    assert mctaco.corpus_f1([0, 0], [0, 0]) == 0.0 == mct_f1([0, 0], [0, 0])[0]
    assert mctaco.accuracy(golds, preds) == 3 / 6


def test_exact_match_needs_every_candidate_of_a_complete_question():
    questions = [{"idx": [0, 1, 2]}, {"idx": [3, 4]}, {"idx": [5, 6, 7]}]
    correct = {0: 1, 1: 1, 2: 1, 3: 1, 4: 0, 5: 1, 6: 1, 7: 1}
    assert mctaco.exact_match(questions, correct) == {"em": 2 / 3, "n_correct_questions": 2,
                                                       "n_complete_questions": 3}
    assert mct_em([q["idx"] for q in questions], correct)["em"] == 2 / 3
    assert mctaco.exact_match([], correct)["em"] is None


# ---- the fixture and its groups --------------------------------------------------------------------------------

def test_fixture_is_mctaco_shaped_and_grouped():
    rows = resources.read_mctaco_tsv(FIXTURE)
    resources.check_rows_shape(rows, str(FIXTURE), resources.MCTACO)
    qs = resources.mctaco_questions(rows)
    assert len(qs) >= 12 and len(rows) == sum(len(q["idx"]) for q in qs)
    assert {q["category"] for q in qs} == set(resources.MCTACO_CATEGORIES)   # all five, "Typical Time" included
    for q in qs:
        assert 3 <= len(q["idx"]) <= 6
        assert q["idx"] == list(range(q["idx"][0], q["idx"][-1] + 1))       # a question's rows are adjacent
        labels = {rows[i]["label"] for i in q["idx"]}
        assert labels == {0, 1}                                              # every question mixes yes and no
        r = rows[q["idx"][0]]
        assert q["question_id"] == resources.sha256_bytes(f"{r['sentence']}\t{r['question']}".encode())
    # the first 10 documents cut the third question after one of its candidates
    complete, cut = mctaco.group_status(list(range(10)), qs)
    assert [q["question_rank"] for q in complete] == [0, 1]
    assert [(c["question_rank"], c["n_scored"], c["n_candidates"]) for c in cut] == [(2, 1, 4)]
    assert mctaco.group_status(list(range(5)), qs)[1] == []                   # 5 ends the first question


def hub_style_parquet(rows):
    """The rows as the hub stores MC-TACO: a parquet with label and category as ClassLabel ints (rewound)."""
    import datasets

    ds = datasets.Dataset.from_dict(
        {k: [r[k] for r in rows] if k != "category" else [resources.MCTACO_CATEGORIES.index(r[k]) for r in rows]
         for k in resources.MCTACO_COLUMNS},
        features=datasets.Features({"sentence": datasets.Value("string"), "question": datasets.Value("string"),
                                    "answer": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["no", "yes"]),
                                    "category": datasets.ClassLabel(names=list(resources.MCTACO_CATEGORIES))}))
    buf = io.BytesIO()
    ds.to_parquet(buf)
    buf.seek(0)
    return buf


def test_content_hash_is_format_independent_and_pinned():
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = resources.read_mctaco_tsv(FIXTURE)
    entry = resources.load_lock()["data"]["fixture-mctaco"]
    assert resources.content_sha256(rows, resources.MCTACO) == entry["content_sha256"]
    assert entry["source"]["sha256"] == resources.sha256_file(FIXTURE)
    # the cache's parquet and a hub-style parquet (label and category as ClassLabel ints) hold the same content
    cache_rows = resources.read_mctaco_parquet(io.BytesIO(resources.rows_to_parquet_bytes(rows, resources.MCTACO)))
    buf = hub_style_parquet(rows)
    assert pa.types.is_integer(pq.read_table(buf).schema.field("category").type)   # ints + ClassLabel names
    buf.seek(0)
    hub_rows = resources.read_mctaco_parquet(buf)
    assert resources.content_sha256(cache_rows, resources.MCTACO) == \
        resources.content_sha256(hub_rows, resources.MCTACO) == entry["content_sha256"]


@pytest.mark.slow
def test_prepare_default_prepares_the_mctaco_fixture(prepared_cache):
    manifest = json.loads((prepared_cache / "manifest.json").read_text())["resources"]
    entry = resources.load_lock()["data"]["fixture-mctaco"]
    assert manifest["fixture-mctaco"]["content_sha256"] == entry["content_sha256"]
    assert manifest["fixture-mctaco"]["schema"] == "mctaco"
    resources.verify_resource_files(prepared_cache, "fixture-mctaco")


def test_hub_entry_without_a_pinned_revision_is_refused(tmp_path):
    proc = run_cli("prepare.py", "--cache", tmp_path / "cache", "--data", "mc-taco")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no pinned revision" in proc.stderr and proc.stderr.count("\n") == 1
    assert "import a local copy of the authors' dev_3783.tsv: prepare.py --data-file PATH" in proc.stderr



@pytest.mark.slow
def test_hub_path_pins_then_verifies_an_mctaco_parquet(tmp_path):
    """The mc_taco hub path against the loopback hub (tests/hub_server.py): a hub-style parquet (ClassLabel ints)
    of the fixture at a pinned revision; --pin records the file sha256 (checked against the served LFS sha256) and
    the content facts; a second prepare verifies without --pin. Only the network location is fake."""
    from hub_server import HubServer, HubState, Repo

    rows = resources.read_mctaco_tsv(FIXTURE)
    buf = hub_style_parquet(rows)
    path, commit = "plain_text/validation-00000-of-00001.parquet", "4" * 40
    lock = resources.load_lock()
    lock["data"]["mc-taco"]["source"].update(revision=commit, files={path: None})
    lock["data"]["mc-taco"].update(dict.fromkeys(("content_sha256", "rows", "label_counts", "n_questions",
                                                  "row_sha256_16")))   # the real pins would refuse the fixture
    lock_path = tmp_path / "lock.json"
    resources.atomic_write_json(lock_path, lock)
    state = HubState()
    state.add(Repo("dataset", "CogComp/mc_taco", commit, {path: buf.getvalue()}))
    cache = tmp_path / "cache"
    with HubServer(state) as url:
        env = {"HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf_home"),
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        p = run_cli("prepare.py", "--cache", cache, "--lock", lock_path, "--data", "mc-taco", env=env)
        assert p.returncode == 2 and "--pin" in p.stderr, p.stdout + p.stderr      # nothing to verify against yet
        p = run_cli("prepare.py", "--cache", cache, "--lock", lock_path, "--data", "mc-taco", "--pin", env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        pinned = resources.load_lock(lock_path)["data"]["mc-taco"]
        assert pinned["source"]["files"][path]["sha256"] == resources.sha256_bytes(buf.getvalue())
        assert pinned["content_sha256"] == resources.load_lock()["data"]["fixture-mctaco"]["content_sha256"]
        assert pinned["rows"] == len(rows) and len(pinned["row_sha256_16"]) == len(rows)
        p = run_cli("prepare.py", "--cache", cache, "--lock", lock_path, "--data", "mc-taco", env=env)
        assert p.returncode == 0 and "verified: mc-taco" in p.stdout, p.stdout + p.stderr
    assert resources.read_mctaco_parquet(cache / "data" / "mc-taco" / "validation.parquet") == rows

# ---- --limit: refused, unless partial groups are accepted ---------------------------------------------------------

@pytest.mark.slow  # run.py subprocesses: import torch, transformers and lm-eval before refusing
@pytest.mark.parametrize("extra, phrase", [
    (["--experiment", "mctaco"], "add --allow-partial-groups"),
    ([], "add --allow-partial-groups"),
])
def test_limit_is_refused_on_grouped_documents(tmp_path, extra, phrase):
    proc = run_cli("run.py", "--cache", tmp_path / "no-cache", "--out", tmp_path / "o", "--limit", "5", *extra)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert phrase in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "o").exists()


def test_refusals_are_resource_errors_not_exits():
    """The experiment raises (run.py maps ResourceError to one line and exit 2); it never exits itself."""
    import types

    import config
    from experiments.context import Options

    rows = resources.read_mctaco_tsv(FIXTURE)
    qs = resources.mctaco_questions(rows)

    def ctx(split, **opts):
        return types.SimpleNamespace(config=config.effective(mctaco.CONFIG_SECTIONS), split=split,
                                     options=Options(out=REPO, **opts))
    with pytest.raises(resources.ResourceError, match="no held-back confirmation items"):
        mctaco.select_documents(ctx("confirm"), rows, qs)
    with pytest.raises(resources.ResourceError, match="add --allow-partial-groups"):
        mctaco.select_documents(ctx("dev", limit=5), rows, qs)
    with pytest.raises(resources.ResourceError, match="outside 1.."):
        mctaco.select_documents(ctx("dev", limit=10 ** 6, allow_partial_groups=True), rows, qs)
    docs, sel = mctaco.select_documents(ctx("dev", limit=7, allow_partial_groups=True), rows, qs)
    assert docs == list(range(7)) and sel["mode"] == "limit"


@pytest.mark.slow
def test_limit_with_allow_partial_groups_lists_cut_questions(prepared_cache, tmp_path):
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", tmp_path, "--experiment", "mctaco",
                   "--limit", "7", "--allow-partial-groups")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "INCOMPLETE SET" in proc.stdout
    summary, config, records = load_out(tmp_path)
    assert [r["idx"] for r in records] == list(range(7)) and config["official"]["lm_eval_limit"] == 7
    assert summary["incomplete_set"] is True
    assert [(c["question_rank"], c["n_scored"], c["n_candidates"]) for c in summary["cut_questions"]] == [(1, 2, 4)]
    for block in (summary["official"], summary["independent"], summary["independent"]["em"],
                  *summary["by_category"].values()):
        assert block["computed_on"].startswith("INCOMPLETE SET")
    assert summary["independent"]["em"]["n_complete_questions"] == 1     # only the first question is whole
    assert summary["agreement"]["max_abs_diff"] == 0.0
    report = audit(tmp_path, ("arithmetic",))
    assert report["exit_code"] == 0, first_failure(report)


# ---- the real model over the whole fixture, once per session -----------------------------------------------------

@pytest.fixture(scope="session")
def mctaco_run(prepared_cache, tmp_path_factory):
    """Every fixture document, both paths recomputed (no result cache), with fast mode reported beside parity."""
    return run_once(tmp_path_factory, "mctaco", prepared_cache, "--experiment", "mctaco", "--no-cache", "--fast")


@pytest.mark.slow
def test_full_fixture_bit_exact_and_metrics_match_lm_eval(mctaco_run):
    from sklearn.metrics import f1_score

    out, proc = mctaco_run
    summary, config, records = load_out(out)
    rows = resources.read_mctaco_tsv(FIXTURE)
    assert [r["idx"] for r in records] == list(range(len(rows)))          # every row, in dataset order
    assert summary["n_complete_questions"] == len(resources.mctaco_questions(rows))
    assert summary["incomplete_set"] is False and summary["cut_questions"] == []
    assert summary["agreement"]["max_abs_diff"] == 0.0
    assert summary["agreement"]["n_candidate_score_mismatches"] == 0
    for r in records:
        assert r["official"]["scores"] == r["independent"]["scores"]
        assert [c["text"] for c in r["candidates"]] == [" no", " yes"]
        assert "sentence" not in json.dumps(r).replace("sentence_sha256", "")  # no dataset text in public evidence
    labels = [r["label"] for r in records]
    preds = [r["independent"]["pred"] for r in records]
    reported = config["official"]["reported"]
    assert reported["f1"] == summary["independent"]["f1"] == float(f1_score(labels, preds))
    assert reported["acc"] == summary["independent"]["acc"] == sum(p == l for p, l in zip(preds, labels)) / len(labels)
    em = summary["independent"]["em"]
    assert em["n_complete_questions"] == 15 and 0 <= em["n_correct_questions"] <= 15
    # the official task: the installed YAML, only the data transport changed
    dumped = config["official"]["dumped_task_config"]
    assert dumped["doc_to_choice"] == ["no", "yes"] and dumped["doc_to_target"] == "label"
    assert dumped["metric_list"] == [{"metric": "acc"}, {"metric": "f1"}] and "test_split" not in dumped
    assert config["official"]["modifications"]["test_split"]["yaml"] == "test"
    # a validation-split resource: the stock choice of the test split is overridden, and said so
    assert config["data_split"] == "validation" and config["split_choice"]["stock_choice"] == "overridden"
    assert config["data_parquet"] == "data/fixture-mctaco/validation.parquet"
    assert config["data_routing"].startswith("config mctaco_data")       # no --data given
    assert config["independent"]["result_cache"]["enabled"] is False                 # --no-cache: all recomputed
    # --fast: fast mode beside parity mode, every argmax the same, within the tolerance (the audit recomputes it)
    fast = summary["fast"]
    assert fast["passed"] is True and fast["parity_source"].startswith("computed in this run")
    assert fast["vs_parity"]["n_argmax_changes"] == 0 and fast["vs_parity"]["n_scores"] == 2 * len(records)
    assert fast["vs_parity"]["max_abs_diff"] <= fast["tolerance"]
    assert all(r["fast"]["pred"] == r["independent"]["pred"] for r in records)
    assert "fast mode (batch 16): max |fast - parity|" in proc.stdout


@pytest.mark.slow
@pytest.mark.kernels
def test_limit_demonstration_and_no_shuffle(mctaco_run):
    """A limit run is a loglikelihood call with batches of its own: its scores equal the main run's on a CPU whose
    kernels round a row the same in any batch (this Xeon's default kernels), and differ in the last bits on others
    (1.1e-5 here under MKL_ENABLE_INSTRUCTIONS=AVX2): the figure is measured, bounded by the float32 tolerance."""
    out, _ = mctaco_run
    summary, _, records = load_out(out)
    demo = summary["limit_demo"]
    assert demo["shuffle_before_cut"]["documents_shuffled_before_limit"] is False
    assert all(s["found"] for s in demo["shuffle_before_cut"]["source"])
    rows = {r["limit"]: r for r in demo["rows"]}
    assert list(rows) == [5, 10, 20]
    for n, row in rows.items():
        assert row["doc_ids"] == list(range(n)) and row["max_abs_diff_vs_main_run"] <= FORWARD_TOL
        assert row["lm_eval"]["acc"] == row["recomputed"]["acc"]
        assert row["preds"] == [r["official"]["pred"] for r in records[:n]]
    assert rows[5]["cut_questions"] == []                                     # 5 ends the first question
    assert [(c["question_rank"], c["n_scored"]) for c in rows[10]["cut_questions"]] == [(2, 1)]
    assert [(c["question_rank"], c["n_scored"]) for c in rows[20]["cut_questions"]] == [(4, 2)]


@pytest.mark.slow
def test_audit_recomputes_the_full_run_at_every_level(mctaco_run, prepared_cache):
    out, _ = mctaco_run
    proc = run_cli("audit.py", out, "--experiment", "mctaco", "--forward", "--cache", prepared_cache,
                   "--report", out.parent / "audit.mctaco.json")  # outside O: O holds only what its manifest lists
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out.parent / "audit.mctaco.json").read_text())
    checks = [r for r in report["checks"] if r["experiment"] == "mctaco"]
    assert {r["level"] for r in checks if r["status"] == "PASS"} == {"arithmetic", "identity", "forward"}
    assert not [r for r in checks if r["status"] != "PASS"]


@pytest.mark.parametrize("what", ["f1", "em", "hide_cut", "limit_acc", "label", "fast"])
@pytest.mark.slow
def test_audit_catches_tampered_mctaco_evidence(mctaco_run, tmp_path, what):
    out, _ = mctaco_run
    d = tmp_path / "o"
    shutil.copytree(out, d)
    summary_path, rec_path = d / "mctaco" / "summary.json", d / "mctaco" / "records.jsonl"
    s = json.loads(summary_path.read_text())
    if what == "f1":        # F1 "averaged" differently: any other value must fail
        s["independent"]["f1"] += 0.01
    elif what == "em":
        s["independent"]["em"]["n_correct_questions"] += 1
    elif what == "hide_cut":  # claim the limit-10 row cut nothing
        next(r for r in s["limit_demo"]["rows"] if r["limit"] == 10)["cut_questions"] = []
    elif what == "limit_acc":
        next(r for r in s["limit_demo"]["rows"] if r["limit"] == 20)["lm_eval"]["acc"] = 0.99
    if what in ("label", "fast"):
        recs = [json.loads(l) for l in rec_path.read_text().splitlines()]
        if what == "label":   # a label flipped in the evidence: correctness and the f1 pair no longer recompute
            recs[3]["label"] = 1 - recs[3]["label"]
        else:                 # a fast-mode score moved: summary.fast's max abs diff no longer recomputes
            recs[3]["fast"]["scores"][0] -= 0.5
        rec_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    else:
        summary_path.write_text(json.dumps(s))
    reseal(d)  # a forger rewrites MANIFEST.json too: the arithmetic level must catch the edit by itself
    report = audit(d, ("arithmetic",), only=["mctaco"])
    assert report["exit_code"] == 1
    assert first_failure(report)["experiment"] == "mctaco"


@pytest.mark.slow
def test_smoke_run_of_the_experiment(smoke_run, prepared_cache):
    """The session's smoke run (conftest; every experiment)."""
    summary, config, records = load_out(smoke_run[0])
    qs = resources.mctaco_questions(resources.read_mctaco_tsv(FIXTURE))
    assert [r["idx"] for r in records] == qs[0]["idx"] + qs[1]["idx"]     # two whole questions
    assert summary["incomplete_set"] is False and summary["n_complete_questions"] == 2
    assert summary["agreement"]["max_abs_diff"] == 0.0
    assert config["official"]["documents_passed_as_samples"] == qs[0]["idx"] + qs[1]["idx"]
    report = audit(smoke_run[0], ("arithmetic", "identity"), cache=prepared_cache, only=["mctaco"])
    assert report["exit_code"] == 0, first_failure(report)
    assert config["independent"]["result_cache"]["enabled"] is True   # the smoke run reads and fills the cache


@pytest.mark.slow
def test_result_cache_serves_a_rerun_bit_for_bit(smoke_run, prepared_cache, tmp_path):
    """The session's smoke run stored every parity score in the cache's results.sqlite; the same command again is
    served from it (no independent forward pass), with records identical to the first run's, and still passes the
    identity join against lm-eval, which recomputes its scores in every run."""
    first_summary, _, first_records = load_out(smoke_run[0])
    proc = run_cli("run.py", "--cache", prepared_cache, "--out", tmp_path / "o", "--smoke", "--experiment", "mctaco")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary, config, records = load_out(tmp_path / "o")
    rc = config["independent"]["result_cache"]
    assert rc["from_cache"] == rc["candidate_scores"] == 2 * len(records) and rc["computed"] == 0
    assert rc["items_from_cache"] == len(records)
    assert records == first_records and summary == first_summary
    assert f"independent scores from the result cache: {rc['candidate_scores']}/{rc['candidate_scores']}" \
        in proc.stdout
    report = audit(tmp_path / "o", ("arithmetic", "identity"), cache=prepared_cache, only=["mctaco"])
    assert report["exit_code"] == 0, first_failure(report)
