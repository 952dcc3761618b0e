"""evidence_audit/lmeval/versions.py against real output of every lm-eval release it names, and `audit.py
--lm-eval` on that output.

Unit tier: reads only tests/fixtures/lmeval_versions/ (made by tools/make_lmeval_fixtures.py: the same tiny model,
tasks and documents for every release; each release's model and data file are saved beside its runs). Each fact
test takes a claim of KNOWN_VERSIONS and checks that the release's files show it: a key said to be absent is
absent, a name pattern matches, a definition recomputes the logged value (acc_mutual_info: by the release's rule,
which the fixture tells apart from the other). Claims the fixtures cannot show (acc_bytes, an --output_path ending
in .json as lm-eval writes it, a model without a name, a one-value stderr, metrics with unequal counts) are checked
for a cited source line (test_every_fact_cites_its_source), and some through the audit on real files edited or
moved here (each test says so). The audit tests run audit.py's main in-process (no model is run: the identity
level loads the saved tokenizer only) on every release's real output: it passes, a forged value fails, another
version is refused, and an unsorted --samples run is read by the release's own rules."""
import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from evidence_audit.checks import short
from evidence_audit.cli import main
from evidence_audit.lmeval.versions import CHAT_DELIMITER, KNOWN_VERSIONS

# whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = pytest.mark.kernels

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lmeval_versions"
MODEL_DIR = "tiny-llama"                         # model_name_sanitized of pretrained=tiny-llama
TASKS = ("versions_mc", "versions_gen", "versions_mi")
FILTERS = {"versions_mc": "none", "versions_gen": "first", "versions_mi": "none"}
SELECTION = [5, 1, 3, 0]                         # the --samples list of the samples/ runs, unsorted on purpose
DATE_ID = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?"
ALL_VERSIONS = sorted(KNOWN_VERSIONS, key=lambda v: tuple(int(x) for x in v.split(".")))
# Releases whose sources were read (their KNOWN_VERSIONS facts cite file and line) but whose outputs are not made
# yet (tools/make_lmeval_fixtures.py --versions ...): their claims are not checked against real output, and the
# audit does not accept their runs. The test below keeps this list exact.
NOT_YET_MADE = ()
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


def test_every_release_ran_the_same_model_and_data():
    """The fixtures differ only in what each release wrote: the saved weights and the data file are byte-identical
    (transformers 4.45 to 5.24 initialise the seeded tiny Llama alike)."""
    for name in (f"{MODEL_DIR}/model.safetensors", "data/docs.jsonl"):
        digests = {v: hashlib.sha256((FIXTURES / v / name).read_bytes()).hexdigest() for v in VERSIONS}
        assert len(set(digests.values())) == 1, (name, digests)


def test_every_fact_cites_its_source():
    facts = set(KNOWN_VERSIONS["0.4.9.2"])
    for version, entry in KNOWN_VERSIONS.items():
        assert set(entry) == facts, version
        cited = set(entry["where"])
        assert cited == facts - {"where"}, f"{version}: facts without a source line: {facts - cited - {'where'}}"
        for where in entry["where"].values():
            for part in where.split(", "):
                assert re.fullmatch(r"[\w/]+\.py(:\d+(-\d+)?)?", part), f"{version}: {part!r}"


def test_the_chat_delimiter_rule_covers_every_release_and_cites_its_source():
    """versions.CHAT_DELIMITER (beside KNOWN_VERSIONS: see its comment): one rule per release read, with file:line.
    tests/test_lmeval_chat.py checks the rules on the real 0.4.9.2 chat run, relabelled for the others."""
    assert set(CHAT_DELIMITER) == set(KNOWN_VERSIONS)
    for version, (rule, where) in CHAT_DELIMITER.items():
        assert rule in ("config", "empty", "empty-unless-gen-prefix"), version
        for part in where.split(", "):
            assert re.fullmatch(r"[\w/]+\.py:\d+(-\d+)?", part), f"{version}: {part!r}"


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
            if task == "versions_mi":         # k conditional requests, then k unconditional ones
                choices = s["doc"]["choices"]
                lead = " " if KNOWN_VERSIONS[version]["mutual_info"] == "appended" else ""
                assert [(a["arg_0"] == "", a["arg_1"]) for a in args.values()] == \
                    [(False, " " + c) for c in choices] + [(True, lead + c) for c in choices]
            if task in ("versions_mc", "versions_mi"):
                n = len(s["doc"]["choices"]) * (2 if task == "versions_mi" else 1)
                assert len(args) == n and all(a["arg_1"].endswith(c) for a, c in
                                              zip(args.values(), s["doc"]["choices"] * 2))
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
def test_acc_mutual_info_reads_the_unconditional_half_by_the_releases_rule(version):
    """"appended": conditional lls[:k], unconditional lls[k:]; "strided" (to 0.4.8): lls[::2] and lls[1::2], and
    acc then reads the mixed lls[::2] too."""
    def read(lls, gold, rule):
        k = len(lls) // 2
        cond, unc = (lls[:k], lls[k:]) if rule == "appended" else (lls[::2], lls[1::2])
        mi = [c - u for c, u in zip(cond, unc)]
        return float(cond.index(max(cond)) == gold), float(mi.index(max(mi)) == gold)
    rule = KNOWN_VERSIONS[version]["mutual_info"]
    other = {"appended": "strided", "strided": "appended"}[rule]
    _, samples, _ = run_files(version)
    differ = 0
    for s in samples["versions_mi"]:
        lls, gold = [float(r[0]) for r in s["filtered_resps"]], int(s["target"])
        assert (s["acc"], s["acc_mutual_info"]) == read(lls, gold, rule)
        differ += (s["acc"], s["acc_mutual_info"]) != read(lls, gold, other)
    assert differ, "the fixture cannot tell the two rules apart"      # it can: 3 of 6 documents differ


@pytest.mark.parametrize("version", VERSIONS)
def test_n_samples_of_a_whole_run(version):
    results, _, _ = run_files(version)
    for task in TASKS:
        assert results["n-samples"][task] == {"original": 6, "effective": 6}


@pytest.mark.parametrize("version", [v for v in VERSIONS if KNOWN_VERSIONS[v]["samples_option"]])
def test_unsorted_samples_selection(version):
    """doc_id "position": the k-th document in dataset order is logged as SELECTION[k]; n-samples.effective is the
    whole split ("limit") or the documents scored ("scored-last", "scored-max")."""
    facts = KNOWN_VERSIONS[version]
    _, whole, _ = run_files(version)
    docs = {s["doc_id"]: s["doc"] for s in whole["versions_mc"]}
    results, samples, _ = run_files(version, "samples")
    lines = samples["versions_mc"]
    assert facts["samples_doc_id"] == "position"
    assert [s["doc_id"] for s in lines] == SELECTION
    assert [s["doc"] for s in lines] == [docs[i] for i in sorted(SELECTION)]
    effective = 6 if facts["n_samples_effective"] == "limit" else len(SELECTION)
    assert results["n-samples"]["versions_mc"] == {"original": 6, "effective": effective}


# ---- audit.py --lm-eval on every release's output ---------------------------------------------------------------

def audit(tmp_path, run_dir, *args):
    """audit.py --lm-eval RUN_DIR ARGS in-process: (exit code, the JSON report or None)."""
    report = tmp_path / "report.json"
    if report.exists():
        report.unlink()
    code = main(["--lm-eval", str(run_dir), *map(str, args), "--report", str(report)])
    return code, (json.loads(report.read_text()) if report.exists() else None)


def identity_args(version, tasks=()):
    """The identity level against the release's own data file and saved model, on every task (or `tasks`)."""
    d = FIXTURES / version
    return ["--tokens", "--data", d / "data" / "docs.jsonl", "--model", d / MODEL_DIR] + \
        [x for t in tasks for x in ("--task", t)]


def failures(report, check_part, level=None):
    return [f for r in report["checks"] if check_part in r["check"] and r["status"] == "FAIL"
            and (level is None or r["level"] == level) for f in r["failures"]]


def copy_run(version, tmp_path, run="run"):
    dest = tmp_path / run
    shutil.copytree(FIXTURES / version / run, dest)
    return dest


def rewrite(path, edit):
    """Apply `edit` to a results dict (a .json) or to the list of sample dicts (a .jsonl), in place."""
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        edit(data)
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    else:
        lines = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines()]
        edit(lines)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")


def one(run_dir, glob):
    found = sorted((run_dir / MODEL_DIR).glob(glob))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_audit_passes_every_release_at_arithmetic_and_identity_level(version, tmp_path):
    """Exit 0 and PASS; every check that ran is PASS and no SKIPPED row stands for a requested check (the SKIPPED
    rows left are checks that do not apply, e.g. no question groups, no chat template, a generate task's token
    boundaries)."""
    for args in ([], identity_args(version)):
        code, report = audit(tmp_path, FIXTURES / version / "run", *args)
        assert code == 0 and report["result"].startswith("PASS"), [r for r in report["checks"] if r["status"] != "PASS"]
        assert report["n_fail"] == 0 and report["n_skipped_requested"] == 0
        assert sorted(report["experiments"]) == sorted(TASKS)
        hiding = [(r["check"], r["note"]) for r in report["checks"]
                  if r["status"] == "SKIPPED" and r.get("requested", True)]
        assert not hiding, hiding
        ran = {(r["experiment"], r["check"]) for r in report["checks"] if r["status"] == "PASS"}
        for task in report["experiments"]:
            assert (task, "per-sample metrics recomputed from resps/filtered_resps and target") in ran
            assert any(t == task and c.startswith("aggregates recomputed") for t, c in ran)
        if args:
            assert ("versions_mc", "each logged doc == the data row at its doc_id (and its doc_hash)") in ran
            assert any(t == "versions_mc" and c.startswith("continuation token boundaries") for t, c in ran)
            assert any(t == "versions_gen" and c.startswith("prompt re-rendered") for t, c in ran)
            # acc_mutual_info: the unconditional half's empty context is what the prompt row expects
            assert any(t == "versions_mi" and c.startswith("prompt re-rendered") for t, c in ran)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_forward_level_re_scores_every_release(version, tmp_path):
    """Every loglikelihood re-scored on the release's own saved model (0.4.13's config.json is transformers 5's, with
    the rotary base under rope_parameters): the scores within float32's tolerance of the logged ones; and the run's
    generate task re-generated with lm-eval's semantics (generate.py, written from 0.4.9.2 and read in 0.4.5, 0.4.8
    and 0.4.13): every generation of every release the logged text, nothing left unchecked."""
    code, report = audit(tmp_path, FIXTURES / version / "run", "--forward", *identity_args(version)[1:])
    assert code == 0 and report["result"].startswith("PASS"), [r for r in report["checks"] if r["status"] != "PASS"]
    assert report["n_fail"] == 0 and report["n_skipped_requested"] == 0
    regen = [r for r in report["checks"] if r["experiment"] == "versions_gen" and r["level"] == "forward"
             and r["check"].startswith("generations re-generated")]
    assert regen[0]["status"] == "PASS" and report["details"]["versions_gen"]["forward"]["identical"] == \
        regen[0]["items"] > 0, regen
    rescored = [r for r in report["checks"] if r["level"] == "forward" and r["check"].startswith("loglikelihoods")
                and r["experiment"] != "versions_gen"]                   # a generate task: nothing to re-score
    assert {r["experiment"] for r in rescored} == {"versions_mc", "versions_mi"}
    assert all(r["status"] == "PASS" and "audit.py's own Llama forward" in r["note"] for r in rescored), rescored


@pytest.mark.parametrize("version", VERSIONS)
def test_a_forged_mutual_info_context_fails_at_the_identity_level(version, tmp_path):
    """The prompt row expects the rendered context on the k conditional requests and "" on the k unconditional
    ones (the same layout in every release): the context copied into an unconditional request (prompt_hash, the
    first request's, unchanged) FAILs there naming the sample, and a word changed in a conditional one names that
    request."""
    run = copy_run(version, tmp_path)
    shown = {}

    def forge(lines):
        args = lines[1]["arguments"]
        shown["k"] = len(args) // 2
        args[f"gen_args_{shown['k']}"]["arg_0"] = args["gen_args_0"]["arg_0"]
        args = lines[2]["arguments"]
        shown["was"] = args["gen_args_1"]["arg_0"]
        args["gen_args_1"]["arg_0"] = shown["was"].replace("Q:", "Question:")
    rewrite(one(run, "samples_versions_mi_*.jsonl"), forge)
    code, report = audit(tmp_path, run, *identity_args(version, ("versions_mi",)))
    assert code == 1
    bad = failures(report, "prompt re-rendered", "identity")
    assert len(bad) == 2, bad
    assert bad[0].startswith(f"doc_id 1 (line 2, filter none) arguments: acc_mutual_info, but not {shown['k']} "
                             f"conditional requests followed by their {shown['k']} unconditional ones ('' context"), bad
    assert bad[1] == (f"doc_id 2 (line 3, filter none) arguments.gen_args_1.arg_0: recorded "
                      f"{short(shown['was'].replace('Q:', 'Question:'))}, recomputed {short(shown['was'])} (rendered "
                      "from the config on the logged doc)"), bad


@pytest.mark.parametrize("version", VERSIONS)
def test_a_forged_per_sample_value_fails_in_every_release(version, tmp_path):
    run = copy_run(version, tmp_path)
    path = one(run, "samples_versions_mc_*.jsonl")
    forged = {}

    def flip(lines):
        forged["was"] = lines[2]["acc"]
        lines[2]["acc"] = 1.0 - lines[2]["acc"]
    rewrite(path, flip)

    def flip_mi(lines):
        forged["mi"] = lines[1]["acc_mutual_info"]
        lines[1]["acc_mutual_info"] = 1.0 - lines[1]["acc_mutual_info"]
    rewrite(one(run, "samples_versions_mi_*.jsonl"), flip_mi)
    code, report = audit(tmp_path, run)
    assert code == 1 and report["result"].startswith("FAIL")
    rows = {r["experiment"]: r["failures"] for r in report["checks"]
            if r["status"] == "FAIL" and r["check"].startswith("per-sample metrics")}
    # the aggregates, recorded from the true values, no longer follow from the forged ones either
    assert {r["experiment"] for r in report["checks"] if r["status"] == "FAIL"
            and r["check"].startswith("aggregates recomputed")} == {"versions_mc", "versions_mi"}
    assert rows == {"versions_mc": [f"doc_id 2 (line 3, filter none) acc: recorded {1.0 - forged['was']}, recomputed "
                                    f"{forged['was']} (from filtered_resps and target '0')"],
                    "versions_mi": [f"doc_id 1 (line 2, filter none) acc_mutual_info: recorded {1.0 - forged['mi']}, "
                                    f"recomputed {forged['mi']} (from filtered_resps and target '1')"]}, rows


@pytest.mark.parametrize("version, edit, says", [
    ("0.4.13", lambda r: r.update(lm_eval_version="0.4.14"), "field 'lm_eval_version': '0.4.14'"),
    ("0.4.9.2", lambda r: r.update(lm_eval_version="0.4.4"), "field 'lm_eval_version': '0.4.4'"),
    ("0.4.9.2", lambda r: r.update(lm_eval_version=["0.4.9.2"]), "field 'lm_eval_version': ['0.4.9.2']"),
    ("0.4.8", lambda r: r.update(lm_eval_version="0.4.8"), "field 'lm_eval_version': '0.4.8'"),   # never writes it
    ("0.4.13", lambda r: r.update(start_time=1.0), "field 'start_time': lm-eval 0.4.13 never writes it"),
    ("0.4.5", lambda r: r.pop("start_time"), "field 'lm_eval_version': absent, and field 'start_time' too"),
])
def test_another_version_is_refused_on_one_line(version, edit, says, tmp_path, capsys):
    run = copy_run(version, tmp_path)
    path = one(run, "results_*.json")
    rewrite(path, edit)
    code, report = audit(tmp_path, run)
    err = capsys.readouterr().err
    assert code == 2 and report is None and len(err.strip().splitlines()) == 1, err
    assert says in err and path.name in err and "this audit reads lm-eval " + ", ".join(ALL_VERSIONS) in err


def test_a_samples_line_of_another_release_is_refused(tmp_path, capsys):
    """0.4.5's shape (no filter/metrics keys) under a results file that says 0.4.9.2: refused naming the field."""
    run = copy_run("0.4.9.2", tmp_path)
    rewrite(one(run, "samples_versions_mc_*.jsonl"),
            lambda lines: [x.pop(k) for x in lines for k in ("filter", "metrics")])
    code, _ = audit(tmp_path, run)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "line 1: field 'filter': absent, which lm-eval 0.4.9.2 always logs" in err


SAMPLES_VERSIONS = [v for v in VERSIONS if KNOWN_VERSIONS[v]["samples_option"]]
SELECTED = json.dumps({"versions_mc": SELECTION})


@pytest.mark.parametrize("version", SAMPLES_VERSIONS)
def test_an_unsorted_samples_run_names_each_mislabelled_document(version, tmp_path):
    """lm-eval scores documents 0, 1, 3, 5 (dataset order) and logs them as 5, 1, 3, 0: the audit names the two
    mislabelled lines (logged id, the document they hold) from the run alone and against --data, not the two
    that are right, and counts the samples against the --samples selection by the release's own n-samples rule."""
    code, report = audit(tmp_path, FIXTURES / version / "samples", "--samples", SELECTED,
                         *identity_args(version, ("versions_mc",)))
    assert code == 1
    why = ("lm-eval iterates documents in dataset order: with unsorted --samples this line holds that document "
           "mislabelled, else the lines were moved; --data tells which")
    assert failures(report, "logging order") == [
        f"doc_id 5 (line 1, filter none) doc_id: out of lm-eval's logging order, which puts doc_id 0 here ({why})",
        f"doc_id 0 (line 4, filter none) doc_id: out of lm-eval's logging order, which puts doc_id 5 here ({why})"]
    data = failures(report, "data row at its doc_id")
    assert [f.split(" doc")[0] for f in data if "doc.question" in f] == ["doc_id 5 (line 1, filter none)",
                                                                     "doc_id 0 (line 4, filter none)"]
    assert "logged 'what colour is the sky ?', data row 5 has 'what colour is the sky at night ?'" in data[0]
    count = [r for r in report["checks"] if r["check"] == "sample count vs the --samples selection"]
    assert [r["status"] for r in count] == ["PASS"], count
    # everything else about the run recomputes: the only failures are the mislabelled documents
    assert {r["check"] for r in report["checks"] if r["status"] == "FAIL"} == {
        "doc_ids in lm-eval's logging order (unsorted --samples mislabels samples)",
        "each logged doc == the data row at its doc_id (and its doc_hash)"}


@pytest.mark.parametrize("version", SAMPLES_VERSIONS)
def test_the_samples_count_follows_the_releases_n_samples_rule(version, tmp_path):
    """n-samples.effective: the whole split to 0.4.11, the documents scored from 0.4.12 (and sample_len with it);
    the value of the other rule is a failure, and so is a selection other than the one the run was made with."""
    run = copy_run(version, tmp_path, "samples")
    scored = KNOWN_VERSIONS[version]["n_samples_effective"].startswith("scored")
    code, report = audit(tmp_path, run)                 # the selection not given: the count cannot pass
    assert code == 1 and any("pass its selection to audit.py --samples" in f for f in failures(report, "sample count"))
    code, report = audit(tmp_path, run, "--samples", json.dumps({"versions_mc": [5, 1, 3]}))
    assert "doc_ids [0]: logged, not selected by --samples" in failures(report, "--samples selection")
    results = one(run, "results_*.json")
    rewrite(results, lambda r: r["n-samples"]["versions_mc"].update(effective=len(SELECTION) if not scored else 6))
    code, report = audit(tmp_path, run, "--samples", SELECTED)
    assert any("n-samples effective: recorded" in f for f in failures(report, "--samples selection"))
    if scored:
        rewrite(results, lambda r: (r["n-samples"]["versions_mc"].update(effective=4),
                                    r["results"]["versions_mc"].update(sample_len=6)))
        code, report = audit(tmp_path, run, "--samples", SELECTED)
        assert failures(report, "--samples selection") == [
            "results.versions_mc sample_len: recorded 6, recomputed 4 (n-samples.effective: the same count)"]


def test_a_samples_selection_is_refused_for_a_release_without_samples(tmp_path, capsys):
    code, _ = audit(tmp_path, FIXTURES / "0.4.8" / "run", "--samples", json.dumps({"versions_mc": [0, 1]}))
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "lm-eval 0.4.7 or 0.4.8 has no --samples option (it came with 0.4.9)" in err


def test_out_of_order_doc_ids_in_a_release_without_samples_are_not_its_output(tmp_path):
    run = copy_run("0.4.5", tmp_path)
    rewrite(one(run, "samples_versions_gen_*.jsonl"),
            lambda lines: (lines[0].update(doc_id=1), lines[1].update(doc_id=0)))
    code, report = audit(tmp_path, run)
    assert code == 1 and failures(report, "logging order")[0] == (
        "doc_id 1 (line 1, filter first) doc_id: out of lm-eval's logging order, which puts doc_id 0 here (lm-eval "
        "0.4.5 has no --samples and logs documents in dataset order)")


def test_output_named_by_a_json_output_path_is_read_only_for_releases_that_write_it(tmp_path, capsys):
    """--output_path x.json (0.4.9 on): results "x_<date>.json", the samples files beside it, no model directory.
    Made here by moving a real run's files into that layout."""
    for version, ok in (("0.4.13", True), ("0.4.8", False)):
        out = tmp_path / version
        out.mkdir()
        for p in (FIXTURES / version / "run" / MODEL_DIR).iterdir():
            shutil.copy(p, out / p.name.replace("results_", "out_"))
        code, report = audit(tmp_path, out)
        err = capsys.readouterr().err
        if ok:
            assert code == 0 and report["n_fail"] == 0, err
        else:
            assert code == 2 and len(err.strip().splitlines()) == 1
            assert "named after an --output_path ending in .json, which lm-eval 0.4.5 or 0.4.7 or 0.4.8 never " \
                   "does" in err


# ---- SOURCE_MAP.md's section on the releases, written from KNOWN_VERSIONS ---------------------------------------

SECTION = "## lm-eval releases the audit reads"


def source_map_section():
    """The SOURCE_MAP.md section: for every fact whose value differs between releases, one row per run of releases
    with the same value, with each release's file:line (versions.py's `where`); then the facts all releases share."""
    def shown(value):
        if isinstance(value, (frozenset, set)):
            return f"{len(value)} keys"
        if isinstance(value, tuple):
            return ", ".join(value)
        return '"" (OUT itself)' if value == "" else str(value)
    lines = [SECTION, "",
             "What `audit.py --lm-eval` depends on in the files of each lm-eval release it reads, read from that "
             "release's own", "source (`lm_eval/` of its PyPI wheel); `evidence_audit/lmeval/versions.py` holds the "
             "facts and the lines, and", "`tests/test_lmeval_versions.py` checks them against real output of every "
             "release and keeps this section equal to",
             "them (`source_map_section`). Facts whose value differs between releases:", "",
             "| fact | releases | value | where (per release, under `lm_eval/`) |", "|---|---|---|---|"]
    same = []
    for fact in KNOWN_VERSIONS[ALL_VERSIONS[0]]:
        if fact == "where":
            continue
        values = [shown(KNOWN_VERSIONS[v][fact]) for v in ALL_VERSIONS]
        if len(set(values)) == 1:
            same.append(f"`{fact}` ({values[0]})")
            continue
        runs = []
        for v, value in zip(ALL_VERSIONS, values):
            if runs and runs[-1][1] == value:
                runs[-1][0].append(v)
            else:
                runs.append(([v], value))
        for vs, value in runs:
            where = "; ".join(f"{v}: {KNOWN_VERSIONS[v]['where'][fact]}" for v in vs)
            lines.append(f"| `{fact}` | {', '.join(vs)} | {value} | {where} |")
    lines += ["", "The same in every release read: " + ", ".join(same) + ".", ""]
    return "\n".join(lines)


def test_source_map_lists_what_differs_between_releases():
    text = (Path(__file__).resolve().parent.parent / "SOURCE_MAP.md").read_text(encoding="utf-8")
    assert SECTION in text, "SOURCE_MAP.md has no section on the lm-eval releases"
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    assert text[start:end if end >= 0 else len(text)].rstrip() == source_map_section().rstrip(), \
        "SOURCE_MAP.md's section differs from versions.py: write source_map_section() into it"


@pytest.mark.parametrize("version", ["0.4.12", "0.4.13"])
def test_n_samples_of_metrics_with_unequal_counts_follows_the_release(version, tmp_path):
    """A document that logs acc but not acc_norm: 0.4.12 records the count of the last (metric, filter) it
    aggregated (acc_norm: 5), 0.4.13 the largest (acc: 6). The real run recorded 6 for both, so the audit fails the
    count of 0.4.12 only."""
    run = copy_run(version, tmp_path)

    def drop(lines):
        lines[3]["metrics"].remove("acc_norm")
        del lines[3]["acc_norm"]
    rewrite(one(run, "samples_versions_mc_*.jsonl"), drop)
    _, report = audit(tmp_path, run)
    count = [f for r in report["checks"] if r["experiment"] == "versions_mc" and r["check"].startswith("sample count")
             for f in r["failures"]]
    if version == "0.4.12":
        assert count == ["n-samples effective: recorded 6, recomputed 5 (the documents scored (lm-eval 0.4.12: the "
                         "metrics' count of values))"], count
    else:
        assert count == [], count


def test_acc_bytes_in_a_release_without_it_is_not_its_output(tmp_path):
    run = copy_run("0.4.9.1", tmp_path)

    def add(lines):
        lines[0]["metrics"].append("acc_bytes")
        lines[0]["acc_bytes"] = lines[0]["acc"]
    rewrite(one(run, "samples_versions_mc_*.jsonl"), add)
    _, report = audit(tmp_path, run)
    assert failures(report, "per-sample metrics") == [
        "doc_id 0 (line 1, filter none) acc_bytes: lm-eval 0.4.9.1 has no such metric (it came with 0.4.9.2): not "
        "this release's output"]


def test_a_task_with_process_docs_is_not_failed_for_logging_the_processed_doc(tmp_path):
    """lm-eval logs process_docs(row) (hellaswag adds a "query" field): without the task's code run, the docs-vs-data
    row is SKIPPED naming process_docs, and the requested identity level makes the verdict INCOMPLETE, never FAIL
    (an honest run) nor PASS (a check asked for did not run); with --task-code too, since lm-eval logged no source
    for this function (str of it). The run is made consistent the way lm-eval would have written it: doc_hash and
    task_hashes follow the processed docs."""
    from evidence_audit.lmeval.docs import doc_hash
    from evidence_audit.reading import sha256_text

    run = copy_run("0.4.9.2", tmp_path)
    samples_path = one(run, "samples_versions_mc_*.jsonl")

    def processed(lines):
        for s in lines:
            s["doc"]["query"] = f"Processed: {s['doc_id']}"
            s["doc_hash"] = doc_hash(s["doc"])
        processed.whole = sha256_text("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in lines))

    rewrite(samples_path, processed)

    def declared(results):
        results["configs"]["versions_mc"]["process_docs"] = "<function process_docs at 0x7f3a2c1e0d30>"
        results["task_hashes"]["versions_mc"] = processed.whole

    rewrite(one(run, "results_*.json"), declared)
    for more, says in (((), "process_docs is task code"), (("--task-code", tmp_path), "logged no source")):
        code, report = audit(tmp_path, run, *identity_args("0.4.9.2", ["versions_mc"]), *more)
        assert report["n_fail"] == 0, [r for r in report["checks"] if r["status"] == "FAIL"]
        assert code == 1 and report["result"].startswith("INCOMPLETE"), report["result"]
        row = next(r for r in report["checks"] if r["check"].startswith("each logged doc == the task's process_docs"))
        assert row["status"] == "SKIPPED" and row.get("requested", True) and says in row["note"], row


def test_a_part_of_a_split_presented_as_the_whole_split_fails_at_the_identity_level(tmp_path):
    """n-samples.original says the split had 6 documents and limit is null, but the split given with --data has a
    seventh: the run scored a part and calls it the whole split (a --limit run with its limit and original rewritten
    reads the same). The identity level, which holds the split, names n-samples.original and both counts."""
    data = tmp_path / "docs.jsonl"
    rows = (FIXTURES / "0.4.9.2" / "data" / "docs.jsonl").read_text(encoding="utf-8")
    data.write_text(rows + json.dumps({"question": "what colour is coal ?", "choices": ["black", "white", "red"],
                                       "label": 0, "answer": "black"}) + "\n", encoding="utf-8")
    args = ["--tokens", "--data", data, "--model", FIXTURES / "0.4.9.2" / MODEL_DIR, "--task", "versions_mc"]
    code, report = audit(tmp_path, FIXTURES / "0.4.9.2" / "run", *args)
    assert code == 1 and report["result"].startswith("FAIL"), report["result"]
    assert failures(report, "each logged doc == the data row", "identity") == [
        "n-samples original: recorded 6, recomputed 7 (the rows of docs.jsonl: the split the run says it evaluated)"]


def test_a_results_file_relabelled_as_an_earlier_release_is_refused_on_the_key_it_never_writes(tmp_path, capsys):
    """0.4.12's results.<task> holds name and sample_len beside the metrics; the same file saying 0.4.11 is refused
    on one line naming that key (it used to fail the aggregates on a metric called 'name')."""
    run = copy_run("0.4.12", tmp_path)
    rewrite(one(run, "results_*.json"), lambda r: r.update(lm_eval_version="0.4.11"))
    code, report = audit(tmp_path, run)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and report is None and len(err) == 1, err
    assert "field 'results.versions_" in err[0] and "lm-eval 0.4.11 never writes it" in err[0], err


@pytest.mark.parametrize("what", ["device", "fifo", "cut_short"])
def test_a_samples_argument_that_is_no_json_file_is_one_line(what, tmp_path, capsys):
    """--samples /dev/zero or a named pipe is never read (one line: not a regular file); a JSON file cut short says
    so, without advice to re-run run.py (the file is the user's, not run.py's)."""
    import os

    arg = {"device": "/dev/zero", "fifo": tmp_path / "pipe", "cut_short": tmp_path / "sel.json"}[what]
    if what == "fifo":
        os.mkfifo(arg)
    if what == "cut_short":
        arg.write_text('{"versions_mc": [0, 1')
    code, _ = audit(tmp_path, FIXTURES / "0.4.9.2" / "run", "--samples", arg)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "run.py" not in err[0], err
    assert ("not a regular file" if what != "cut_short" else "unparseable JSON") in err[0], err
