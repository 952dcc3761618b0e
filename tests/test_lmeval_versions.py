"""evidence_audit/lmeval/versions.py against real output of every lm-eval release it names.

Unit tier: reads only tests/fixtures/lmeval_versions/ (made by tools/make_lmeval_fixtures.py: the same tiny model,
tasks and documents for every release). Each test takes a claim of KNOWN_VERSIONS and checks that the release's
files show it: a key said to be absent is absent, a name pattern matches, a definition recomputes the logged value.
Claims the fixtures cannot show (acc_bytes, acc_mutual_info, an --output_path ending in .json, a model without a
name, a one-value stderr) are checked only for having a cited source line (test_every_fact_cites_its_source)."""
import hashlib
import json
import math
import re
from pathlib import Path

import pytest

from evidence_audit.lmeval.versions import KNOWN_VERSIONS

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lmeval_versions"
MODEL_DIR = "tiny-llama"                         # model_name_sanitized of pretrained=tiny-llama
TASKS = ("versions_mc", "versions_gen")
FILTERS = {"versions_mc": "none", "versions_gen": "first"}
SELECTION = [4, 1, 3]                            # the --samples list of the samples/ runs, unsorted on purpose
DATE_ID = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?"
ALL_VERSIONS = sorted(KNOWN_VERSIONS, key=lambda v: tuple(int(x) for x in v.split(".")))
# Releases whose sources were read (their KNOWN_VERSIONS facts cite file and line) but whose outputs are not made
# yet (tools/make_lmeval_fixtures.py --versions ...): their claims are not checked against real output, and the
# audit does not accept their runs. The test below keeps this list exact.
NOT_YET_MADE = ("0.4.8", "0.4.9", "0.4.9.1", "0.4.10", "0.4.11", "0.4.12")
VERSIONS = [v for v in ALL_VERSIONS if v not in NOT_YET_MADE]


def test_the_releases_without_fixtures_are_exactly_the_declared_ones():
    made = {v for v in ALL_VERSIONS if (FIXTURES / v / "run").is_dir()}
    assert set(ALL_VERSIONS) - made == set(NOT_YET_MADE), sorted(set(ALL_VERSIONS) - made)


def sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def pattern(name, **parts):
    """A KNOWN_VERSIONS file name ("results_{date_id}.json") as a regex with named groups."""
    out = re.escape(name)
    for key, rx in parts.items():
        out = out.replace(re.escape("{" + key + "}"), f"(?P<{key}>{rx})")
    return re.compile(out)


def run_files(version, run="run"):
    """(results dict, {task: [sample dicts]}, date_id) of one fixture run, its names checked against the claims."""
    facts = KNOWN_VERSIONS[version]
    d = FIXTURES / version / run / MODEL_DIR
    names = sorted(p.name for p in d.iterdir())
    results_re = pattern(facts["results_name"], date_id=DATE_ID)
    results = [n for n in names if results_re.fullmatch(n)]
    assert len(results) == 1, f"{d}: {names}"
    date_id = results_re.fullmatch(results[0]).group("date_id")
    samples_re = pattern(facts["samples_name"], task=r".+", date_id=re.escape(date_id))
    samples = {samples_re.fullmatch(n).group("task"): d / n for n in names if samples_re.fullmatch(n)}
    assert len(names) == 1 + len(samples), f"{d}: files other than the claimed names: {names}"
    lines = {t: [json.loads(ln) for ln in p.read_text(encoding="utf-8").splitlines()] for t, p in samples.items()}
    return json.loads((d / results[0]).read_text(encoding="utf-8")), lines, date_id


def metric_names(results, task):
    return {k.split(",")[0] for k in results["results"][task] if "," in k and "_stderr," not in k}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_has_its_fixtures(version):
    assert (FIXTURES / version / "run" / MODEL_DIR).is_dir(), f"run tools/make_lmeval_fixtures.py --versions {version}"
    assert (FIXTURES / version / "samples").is_dir() == KNOWN_VERSIONS[version]["samples_option"]
    results, samples, _ = run_files(version)
    assert sorted(samples) == sorted(TASKS)


def test_every_fact_cites_its_source():
    facts = set(KNOWN_VERSIONS["0.4.9.2"])
    for version, entry in KNOWN_VERSIONS.items():
        assert set(entry) == facts, version
        cited = set(entry["where"])
        assert cited == facts - {"where"}, f"{version}: facts without a source line: {facts - cited - {'where'}}"
        for where in entry["where"].values():
            for part in where.split(", "):
                assert re.fullmatch(r"[\w/]+\.py(:\d+(-\d+)?)?", part), f"{version}: {part!r}"


@pytest.mark.parametrize("version", VERSIONS)
def test_results_keys_and_version_field(version):
    facts = KNOWN_VERSIONS[version]
    results, _, _ = run_files(version)
    assert set(results) == set(facts["results_keys"])
    assert ("lm_eval_version" in results) == facts["lm_eval_version_key"]
    if facts["lm_eval_version_key"]:
        assert results["lm_eval_version"] == version
    assert results["model_name_sanitized"] == MODEL_DIR
    for task in TASKS:
        other = {k for k in results["results"][task] if "," not in k}
        assert other == set(facts["task_result_keys"]), task


@pytest.mark.parametrize("version", VERSIONS)
def test_sample_keys_filter_and_metrics(version):
    facts = KNOWN_VERSIONS[version]
    results, samples, _ = run_files(version)
    for task, lines in samples.items():
        metrics = metric_names(results, task)
        assert len(lines) == 6, task
        for s in lines:
            assert set(s) - metrics == set(facts["sample_keys"]), (task, sorted(set(s) - metrics))
            assert metrics <= set(s)
            if "filter" in facts["sample_keys"]:
                assert s["filter"] == FILTERS[task] and set(s["metrics"]) == metrics


@pytest.mark.parametrize("version", VERSIONS)
def test_arguments_and_resps_shapes(version):
    assert KNOWN_VERSIONS[version]["arguments"] == "gen_args"
    assert KNOWN_VERSIONS[version]["resps"] == "sanitize_list"
    _, samples, _ = run_files(version)
    for task, lines in samples.items():
        for s in lines:
            args = s["arguments"]
            assert list(args) == [f"gen_args_{i}" for i in range(len(args))]
            assert all(list(a) == ["arg_0", "arg_1"] and isinstance(a["arg_0"], str) for a in args.values())
            assert isinstance(s["target"], str)
            if task == "versions_mc":
                assert len(args) == len(s["doc"]["choices"])
                assert all(a["arg_1"] == " " + c for a, c in zip(args.values(), s["doc"]["choices"]))
                assert all(len(r) == 1 and len(r[0]) == 2 and r[0][1] in ("True", "False") for r in s["resps"])
                assert [r[0] for r in s["resps"]] == s["filtered_resps"]
            else:
                assert isinstance(args["gen_args_0"]["arg_1"], dict)
                assert len(s["resps"]) == 1 and all(isinstance(x, str) for x in s["resps"][0])
                assert s["filtered_resps"] == [s["resps"][0][0]]


@pytest.mark.parametrize("version", VERSIONS)
def test_hashes_and_task_hashes_recompute(version):
    assert KNOWN_VERSIONS[version]["hashes"] and KNOWN_VERSIONS[version]["task_hashes"]
    results, samples, _ = run_files(version)
    for task, lines in samples.items():
        for s in lines:
            assert s["doc_hash"] == sha(json.dumps(s["doc"], indent=2, ensure_ascii=False))
            assert s["prompt_hash"] == sha(s["arguments"]["gen_args_0"]["arg_0"])
            assert s["target_hash"] == sha(s["target"])
        joined = "".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in lines)
        assert results["task_hashes"][task] == sha(joined)


@pytest.mark.parametrize("version", VERSIONS)
def test_acc_and_acc_norm_recompute(version):
    assert KNOWN_VERSIONS[version]["acc_norm"] == "characters"
    results, samples, _ = run_files(version)
    lines = samples["versions_mc"]
    for s in lines:
        lls = [float(r[0]) for r in s["filtered_resps"]]
        norm = [ll / len(c) for ll, c in zip(lls, s["doc"]["choices"])]
        gold = int(s["target"])
        assert s["acc"] == float(lls.index(max(lls)) == gold)
        assert s["acc_norm"] == float(norm.index(max(norm)) == gold)
    for metric in ("acc", "acc_norm"):
        values = [s[metric] for s in lines]
        assert math.isclose(results["results"]["versions_mc"][f"{metric},none"], sum(values) / len(values))


@pytest.mark.parametrize("version", VERSIONS)
def test_n_samples_of_a_whole_run(version):
    results, _, _ = run_files(version)
    for task in TASKS:
        assert results["n-samples"][task] == {"original": 6, "effective": 6}


@pytest.mark.parametrize("version", [v for v in VERSIONS if KNOWN_VERSIONS[v]["samples_option"]])
def test_unsorted_samples_selection(version):
    """doc_id "position": the k-th document in dataset order is logged as SELECTION[k]; n-samples.effective is the
    whole split ("limit") or the documents scored ("scored")."""
    facts = KNOWN_VERSIONS[version]
    _, whole, _ = run_files(version)
    docs = {s["doc_id"]: s["doc"] for s in whole["versions_mc"]}
    results, samples, _ = run_files(version, "samples")
    lines = samples["versions_mc"]
    assert facts["samples_doc_id"] == "position"
    assert [s["doc_id"] for s in lines] == SELECTION
    assert [s["doc"] for s in lines] == [docs[i] for i in sorted(SELECTION)]
    effective = {"limit": 6, "scored": len(SELECTION)}[facts["n_samples_effective"]]
    assert results["n-samples"]["versions_mc"] == {"original": 6, "effective": effective}
