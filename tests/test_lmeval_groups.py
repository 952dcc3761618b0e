"""audit.py --lm-eval at the arithmetic level on REAL lm-eval 0.4.9.2 output with task groups (nested, both
weightings), a loglikelihood_rolling task and bootstrapped stderrs (f1, mcc, perplexity): the committed fixture
tests/fixtures/lmeval_groups/ (made by tools/make_lmeval_group_fixtures.py). The clean run passes with every value
recomputed exactly; forged copies are caught naming the group or task and the key."""
import json
import random
import shutil
from pathlib import Path

import pytest

from evidence_audit.cli import main
from evidence_audit.lmeval import bootstrap, fmt, groups, metrics
from evidence_audit.reading import Unreadable, sha256_text

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lmeval_groups" / "run"
SUB = "tiny-llama"
NEW_CHECKS = ("group aggregates", "group stderr", "per-sample rolling", "aggregates recomputed", "stderr recomputed",
              "bootstrap stderr")


def results_path(run):
    return next((run / SUB).glob("results_*.json"))


def samples_path(run, task):
    return next((run / SUB).glob(f"samples_{task}_2*.jsonl"))


def load_results(run=FIXTURE):
    return json.loads(results_path(run).read_text(encoding="utf-8"))


def load_samples(task, run=FIXTURE):
    return [json.loads(line) for line in samples_path(run, task).read_text(encoding="utf-8").splitlines()]


def copy_run(tmp_path, edit_results=None, samples=None):
    """A copy of the fixture with the results dict edited in place and/or {task: edit(rows)} applied."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    for task, edit in (samples or {}).items():
        rows = load_samples(task, run)
        edit(rows)
        samples_path(run, task).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                           encoding="utf-8")
    if edit_results:
        r = load_results(run)
        edit_results(r)
        results_path(run).write_text(json.dumps(r, indent=2, ensure_ascii=False), encoding="utf-8")
    return run


def audit(tmp_path, run, *args):
    report = tmp_path / "report.json"
    code = main(["--lm-eval", str(run), *map(str, args), "--report", str(report)])
    return code, json.loads(report.read_text())


def rows(report, experiment, check_part):
    return [r for r in report["checks"] if r["experiment"] == experiment and check_part in r["check"]]


def failures(report, experiment, check_part):
    return [f for r in rows(report, experiment, check_part) if r["status"] == "FAIL" for f in r["failures"]]


def set_group(r, group, key, value):
    """What a forger edits: the group's value in results and in the groups table (they are one value)."""
    r["results"][group][key] = value
    r["groups"][group][key] = value


# ---- the clean fixture ------------------------------------------------------------------------------------------

def test_the_clean_fixture_passes_every_new_check_exactly(tmp_path):
    code, report = audit(tmp_path, FIXTURE)
    assert code == 0 and report["result"].startswith("PASS"), [r["first_failure"] for r in report["checks"]
                                                                if r["status"] == "FAIL"]
    skipped = [r for r in report["checks"] if r["status"] == "SKIPPED"]
    assert all("question groups" in r["check"] for r in skipped), skipped     # nothing of ours left unchecked
    for group, leaves in (("fx_outer", "fx_mc_c, fx_mc_a, fx_mc_b"), ("fx_inner", "fx_mc_a, fx_mc_b")):
        agg, = rows(report, group, "group aggregates")
        se, = rows(report, group, "group stderr")
        assert (agg["status"], agg["items"], se["status"], se["items"]) == ("PASS", 2, "PASS", 2)
        # the weightings the group YAMLs declare (tools/make_lmeval_group_fixtures.py), inferred from the values
        assert "acc,none: weight_by_size true" in agg["note"] and "acc_norm,none: weight_by_size false" in agg["note"]
        assert f"leaves {leaves}" in agg["note"]
    boot = {r["experiment"]: r["items"] for r in report["checks"] if r["check"].startswith("bootstrap stderr")
            and r["status"] == "PASS"}
    assert boot == {"fx_bin": 2, "fx_ll": 1, "fx_mc_a": 1}            # f1 and mcc; perplexity; 3-class mcc
    roll, = rows(report, "fx_roll", "aggregates recomputed")
    assert roll["status"] == "PASS" and roll["items"] == 3            # word/byte perplexity, bits_per_byte
    roll_se, = rows(report, "fx_roll", "stderr recomputed")
    assert roll_se["status"] == "PASS" and roll_se["items"] == 3      # "N/A": lm-eval has none for them
    persample, = rows(report, "fx_roll", "per-sample rolling")
    assert persample["status"] == "PASS" and persample["items"] == 6


# ---- forgeries ----------------------------------------------------------------------------------------------------

def test_a_forged_group_aggregate_fails_naming_the_group_and_metric(tmp_path):
    run = copy_run(tmp_path, lambda r: set_group(r, "fx_outer", "acc,none", 0.45))
    code, report = audit(tmp_path, run)
    bad = failures(report, "fx_outer", "group aggregates")
    assert code == 1 and len(bad) == 1 and "results.fx_outer.acc,none: recorded 0.45" in bad[0], bad
    assert "(weight_by_size true)" in bad[0] and "fx_mc_c=0.25 (n=4)" in bad[0]
    assert not failures(report, "fx_inner", "group") and not failures(report, "fx_mc_c", "aggregates")


def test_a_group_value_differing_from_its_groups_table_entry_fails(tmp_path):
    def edit(r):
        r["groups"]["fx_inner"]["acc_norm,none"] = 0.2
    code, report = audit(tmp_path, copy_run(tmp_path, edit))
    assert code == 1 and any("groups.fx_inner.acc_norm,none: 0.2" in f
                             for f in failures(report, "fx_inner", "group aggregates"))


def test_the_other_weighting_is_accepted_and_named_since_lm_eval_does_not_record_it(tmp_path):
    """The limit of the run alone: weight_by_size is not in the results file, so the unweighted mean of fx_inner's
    acc (what a YAML with weight_by_size false gives) is a value lm-eval could have written; the note names it."""
    def edit(r):
        values = [r["results"][t]["acc,none"] for t in ("fx_mc_a", "fx_mc_b")]
        set_group(r, "fx_inner", "acc,none", sum(values) / 2)
    code, report = audit(tmp_path, copy_run(tmp_path, edit))
    agg, = rows(report, "fx_inner", "group aggregates")
    assert agg["status"] == "PASS" and "acc,none: weight_by_size false" in agg["note"]
    assert "weight_by_size is not in the results file" in agg["note"]
    outer, = rows(report, "fx_outer", "group aggregates")      # the parent is computed from the leaves, not fx_inner
    assert outer["status"] == "PASS"


def test_a_forged_group_stderr_fails(tmp_path):
    run = copy_run(tmp_path, lambda r: set_group(r, "fx_inner", "acc_stderr,none", 0.19720265943665))
    code, report = audit(tmp_path, run)
    bad = failures(report, "fx_inner", "group stderr")
    assert code == 1 and len(bad) == 1 and "results.fx_inner.acc_stderr,none" in bad[0] and "pooled" in bad[0]


def test_a_group_whose_subtask_samples_file_is_missing_is_caught(tmp_path):
    run = copy_run(tmp_path)
    samples_path(run, "fx_mc_b").unlink()
    code, report = audit(tmp_path, run)
    assert code == 1 and failures(report, "fx_mc_b", "samples file")
    for group in ("fx_inner", "fx_outer"):
        bad = failures(report, group, "group aggregates")
        assert bad and all("fx_mc_b have no samples file" in f for f in bad), bad


def test_a_forged_subtask_result_is_caught_even_when_the_groups_follow_it(tmp_path):
    """A forger who raises fx_mc_b's acc and recomputes both groups from it: the groups agree, fx_mc_b does not
    follow from its samples."""
    def edit(r):
        r["results"]["fx_mc_b"]["acc,none"] = 1.0
        sizes = {"fx_mc_a": 5, "fx_mc_b": 3, "fx_mc_c": 4}
        for group, leaves in (("fx_inner", ["fx_mc_a", "fx_mc_b"]), ("fx_outer", ["fx_mc_c", "fx_mc_a", "fx_mc_b"])):
            set_group(r, group, "acc,none", sum(r["results"][t]["acc,none"] * sizes[t] for t in leaves)
                      / sum(sizes[t] for t in leaves))
    code, report = audit(tmp_path, copy_run(tmp_path, edit))
    assert code == 1 and not failures(report, "fx_inner", "group") and not failures(report, "fx_outer", "group")
    assert any("results.fx_mc_b acc,none: recorded 1.0" in f for f in failures(report, "fx_mc_b", "aggregates"))


def test_a_subtask_taken_out_of_group_subtasks_is_caught(tmp_path):
    def edit(r):
        r["group_subtasks"]["fx_inner"] = ["fx_mc_a"]
    code, report = audit(tmp_path, copy_run(tmp_path, edit))
    assert code == 1 and failures(report, "fx_inner", "group aggregates") and failures(report, "fx_inner", "stderr")


def test_a_cycle_in_group_subtasks_fails_on_one_line_without_a_traceback(tmp_path):
    def edit(r):
        r["group_subtasks"]["fx_inner"] = ["fx_mc_a", "fx_outer"]
    code, report = audit(tmp_path, copy_run(tmp_path, edit))
    bad = failures(report, "fx_inner", "group aggregates")
    assert code == 1 and bad == [f"{results_path(FIXTURE).name} group_subtasks: fx_inner -> fx_outer -> fx_inner "
                                 "is a cycle"], bad


def test_an_enormous_bootstrap_iters_is_named_not_checked_and_never_passes(tmp_path):
    code, report = audit(tmp_path, copy_run(tmp_path, lambda r: r["config"].update(bootstrap_iters=10 ** 12)))
    undone = [r for r in report["checks"] if r["status"] == "SKIPPED" and r["check"].startswith("stderr ")]
    assert code == 1 and report["result"].startswith("INCOMPLETE") and len(undone) == 4     # f1, 2 mcc, perplexity
    assert all("bootstrap_iters 1000000000000 over the 1e+06 replicates the audit recomputes" in r["check"]
               for r in undone), undone


def test_a_forged_rolling_perplexity_fails(tmp_path):
    def edit(r):
        r["results"]["fx_roll"]["word_perplexity,none"] *= 0.9
    code, report = audit(tmp_path, copy_run(tmp_path, edit))
    bad = failures(report, "fx_roll", "aggregates recomputed")
    assert code == 1 and len(bad) == 1 and "results.fx_roll word_perplexity,none: recorded" in bad[0], bad
    assert "weighted_perplexity of 6 per-sample values" in bad[0]


def test_a_forged_rolling_word_count_fails_per_sample(tmp_path):
    """Fewer words lower word_perplexity: the per-sample count no longer equals count_words(target)."""
    def edit(rows_):
        rows_[1]["word_perplexity"][1] += 2
    code, report = audit(tmp_path, copy_run(tmp_path, samples={"fx_roll": edit}))
    bad = failures(report, "fx_roll", "per-sample rolling")
    assert code == 1 and len(bad) == 1 and bad[0].startswith("doc_id 1 (line 2, filter none) word_perplexity")
    assert failures(report, "fx_roll", "aggregates recomputed")      # the results were not rewritten with it


def roll_data(tmp_path):
    """fx_roll's documents as tools/make_lmeval_group_fixtures.py wrote them for lm-eval (its DOCS, not the log)."""
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "tools" / "make_lmeval_group_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_lmeval_group_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = tmp_path / "fx_roll.jsonl"
    data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in module.DOCS["roll"]), encoding="utf-8")
    return data


def test_rolling_samples_are_read_by_the_one_reader():
    """fmt.read_samples reads a rolling task's lines (one request, its text alone) as every other task's."""
    r, release, _ = fmt.read_results(results_path(FIXTURE))
    samples, _ = fmt.read_samples(samples_path(FIXTURE, "fx_roll"), release, r["configs"]["fx_roll"])
    assert [s.requests for s in samples] == [[(x["target"], None)] for x in load_samples("fx_roll")]


def test_a_rolling_request_with_a_second_argument_is_refused_on_one_line(tmp_path, capsys):
    def edit(rows_):
        rows_[2]["arguments"]["gen_args_0"]["arg_1"] = " more"
    report = tmp_path / "report.json"
    code = main(["--lm-eval", str(copy_run(tmp_path, samples={"fx_roll": edit})), "--report", str(report)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "line 3: field 'arguments': expected {gen_args_0: {arg_0: text}}" in err[0]
    r, release, _ = fmt.read_results(results_path(FIXTURE))
    with pytest.raises(Unreadable):
        fmt.read_samples(samples_path(tmp_path / "run", "fx_roll"), release, r["configs"]["fx_roll"])


def test_the_rolling_task_passes_the_identity_level_with_its_data(tmp_path):
    """A rolling request's only argument is doc_to_target(doc) (lm-eval 0.4.9.2 api/task.py:1455-1456), not a
    rendered context: every sample of fx_roll passes the prompt row, its documents equal the data file's."""
    code, report = audit(tmp_path, FIXTURE, "--tokens", "--data", roll_data(tmp_path), "--task", "fx_roll")
    assert code == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    ran = {r["check"].split(" (")[0]: r["status"] for r in rows(report, "fx_roll", "") if r["level"] == "identity"}
    assert ran["prompt re-rendered from the config"] == ran["target re-rendered from doc_to_target"] == "PASS"
    assert ran["each logged doc == the data row at its doc_id"] == "PASS"


def test_a_forged_rolling_text_fails_at_the_identity_level(tmp_path):
    """Another text as the request of doc 4 (prompt_hash and task_hashes rewritten as a forger would): the prompt
    row names it (the arithmetic level, which ties it to the logged target, fails too)."""
    forged = "the owl walked slowly over the river ."

    def edit(rows_):
        rows_[4]["arguments"]["gen_args_0"]["arg_0"] = forged
        for x in rows_:
            x["prompt_hash"] = sha256_text(x["arguments"]["gen_args_0"]["arg_0"])

    def rehash(r):
        lines = load_samples("fx_roll", run)
        r["task_hashes"]["fx_roll"] = sha256_text("".join(x["doc_hash"] + x["prompt_hash"] + x["target_hash"]
                                                          for x in lines))
    run = copy_run(tmp_path, samples={"fx_roll": edit})
    copy_run_results(run, rehash)
    code, report = audit(tmp_path, run, "--tokens", "--data", roll_data(tmp_path), "--task", "fx_roll")
    bad = failures(report, "fx_roll", "prompt re-rendered")
    assert code == 1 and len(bad) == 1 and bad[0].startswith(
        f"doc_id 4 (line 5, filter none) arguments.gen_args_0.arg_0: recorded {forged!r}, recomputed "), bad
    assert not failures(report, "fx_roll", "hash")


def copy_run_results(run, edit):
    r = load_results(run)
    edit(r)
    results_path(run).write_text(json.dumps(r, indent=2, ensure_ascii=False), encoding="utf-8")


def test_a_forged_bootstrap_stderr_fails(tmp_path):
    def edit(r):
        r["results"]["fx_bin"]["mcc_stderr,none"] = 0.31
    code, report = audit(tmp_path, copy_run(tmp_path, edit))
    bad = failures(report, "fx_bin", "bootstrap stderr")
    assert code == 1 and len(bad) == 1 and "results.fx_bin mcc_stderr,none: recorded 0.31" in bad[0], bad
    assert "2500 iterations, seeds 0..1" in bad[0]


def test_a_changed_bootstrap_iters_is_caught_unless_lm_eval_would_draw_the_same_replicates(tmp_path):
    """2000 draws the same two seeded chunks of 1000 as 2500 (lm-eval drops the remainder): the stderrs stand.
    3000 draws a third chunk: they do not."""
    def iters(n):
        return lambda r: r["config"].update(bootstrap_iters=n)
    code, report = audit(tmp_path, copy_run(tmp_path, iters(2000)))
    assert code == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    shutil.rmtree(tmp_path / "run")
    code, report = audit(tmp_path, copy_run(tmp_path, iters(3000)))
    assert code == 1 and len(failures(report, "fx_bin", "bootstrap stderr")) == 2
    assert len(failures(report, "fx_ll", "bootstrap stderr")) == 1


def test_without_a_python_version_both_summations_are_tried_and_named(tmp_path):
    code, report = audit(tmp_path, copy_run(tmp_path, lambda r: r.pop("pretty_env_info")))
    agg, = rows(report, "fx_roll", "aggregates recomputed")
    assert code == 0 and "builtin sum() of Python <= 3.11" in agg["note"]


# ---- units: lm-eval's procedures ----------------------------------------------------------------------------------

def test_bootstrap_reproduces_the_stderrs_lm_eval_computed_in_the_fixture():
    top = load_results()
    assert top["config"]["bootstrap_iters"] == 2500
    bin_rows, ll_rows = load_samples("fx_bin"), load_samples("fx_ll")
    for metric, agg in (("f1", "f1"), ("mcc", "matthews_corrcoef")):
        items = [tuple(r[metric]) for r in bin_rows]
        assert bootstrap.bootstrap_stderr(agg, items, 2500) == top["results"]["fx_bin"][f"{metric}_stderr,none"]
    lls = [r["perplexity"] for r in ll_rows]
    assert bootstrap.bootstrap_stderr("perplexity", lls, 2500) == top["results"]["fx_ll"]["perplexity_stderr,none"]
    three = [tuple(r["mcc"]) for r in load_samples("fx_mc_a")]
    assert {g for g, _ in three} | {p for _, p in three} == {0, 1, 2}
    assert bootstrap.bootstrap_stderr("matthews_corrcoef", three, 2500) == \
        top["results"]["fx_mc_a"]["mcc_stderr,none"]


def test_bootstrap_without_numpy_gives_the_same_value(monkeypatch):
    """The vectorised replicates (numpy) against random.choices and metrics.py replicate by replicate, for both
    summations (Python <= 3.11 and >= 3.12) of the perplexity's per-replicate mean."""
    items = [tuple(r["mcc"]) for r in load_samples("fx_bin")]
    lls = [r["perplexity"] for r in load_samples("fx_ll")]
    cases = [("matthews_corrcoef", items, False), ("f1", items, True), ("perplexity", lls, False),
             ("perplexity", lls, True)]
    with_numpy = [bootstrap.bootstrap_stderr(agg, xs, 1500, comp) for agg, xs, comp in cases]
    monkeypatch.setattr(bootstrap, "numpy_or_none", lambda: None)
    assert [bootstrap.bootstrap_stderr(agg, xs, 1500, comp) for agg, xs, comp in cases] == with_numpy


def test_the_drawn_indices_are_random_choices_own():
    import numpy as np

    for n in (1, 7, 40):
        items = list(range(n))
        drawn = [row for seed, k in bootstrap.chunks(2100) for block in bootstrap.choice_indices(np, seed, k, n)
                 for row in block.tolist()]
        assert len(drawn) == 2000 and drawn == bootstrap.reference_choices(items, 2100)


def test_group_arithmetic_equals_lm_evals_formulas_on_the_fixture():
    r = load_results()["results"]
    values, sizes = [r["fx_mc_a"]["acc,none"], r["fx_mc_b"]["acc,none"]], [5, 3]
    assert groups.subtask_mean(values, sizes, True, False) == r["fx_inner"]["acc,none"]
    se = [r["fx_mc_a"]["acc_stderr,none"], r["fx_mc_b"]["acc_stderr,none"]]
    assert groups.pooled_stderr(se, sizes, False) == r["fx_inner"]["acc_stderr,none"]


def test_rolling_counts_follow_lm_evals_split_and_utf8():
    assert metrics.count_words("a b  c ") == 4 and metrics.count_bytes("naïve") == 6
    assert metrics.bits_per_byte([(-2.0, 4), (-6.0, 4)]) == 1.0 / metrics.math.log(2)


def test_builtin_sum_matches_this_python_and_the_compensated_rule():
    rnd = random.Random(3)
    for _ in range(200):
        xs = [rnd.uniform(-1, 1) * 10 ** rnd.randint(-8, 8) for _ in range(rnd.randint(0, 30))]
        assert metrics.builtin_sum(xs, False) == sum(xs) or xs == []
    assert metrics.builtin_sum([1e16, 1.0, -1e16], True) == 1.0       # Neumaier keeps the 1.0
    assert metrics.builtin_sum([1e16, 1.0, -1e16], False) == 0.0


@pytest.mark.slow
def test_builtin_sum_matches_python_3_12_and_3_13_when_installed():
    import subprocess
    import sys

    found = [p for p in (Path(f"/root/.pyenv/versions/{v}/bin/python") for v in ("3.12.1", "3.13.0")) if p.exists()]
    if not found:
        pytest.skip("no Python 3.12/3.13 interpreter here")
    rnd = random.Random(11)
    cases = [[rnd.choice([rnd.randint(-5, 5), rnd.uniform(-1e3, 1e3) * 10 ** rnd.randint(-8, 8), 1e16, -1e16])
              for _ in range(rnd.randint(0, 30))] for _ in range(200)]
    for py in found:
        out = subprocess.run([str(py), "-c", "import json, sys; print(json.dumps([repr(sum(c)) for c in "
                              "json.load(sys.stdin)]))"], input=json.dumps(cases), capture_output=True, text=True,
                             check=True).stdout
        assert json.loads(out) == [repr(metrics.builtin_sum(c, True)) for c in cases], (py, sys.version)


@pytest.mark.parametrize("level", ["run", "model"])
def test_lm_eval_output_audited_without_lm_eval_points_to_the_flag(capsys, level):
    """`audit.py RUN` on lm-eval output (no --lm-eval) says what the directory is and the command to run, on one
    line, exit 2; not "no evidence_format"."""
    run = FIXTURE if level == "run" else FIXTURE / "tiny-llama"
    assert main([str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lm-eval output (" in err[0] and f"audit.py --lm-eval {run}" in err[0], err


def test_a_requested_level_without_model_names_the_lm_eval_flags(tmp_path):
    """--lm-eval --tokens with no --model: the rows say no --model was given (not "found None") and the INCOMPLETE
    verdict names the first reason (here --data), not run.py's --cache."""
    code, report = audit(tmp_path, FIXTURE, "--tokens")
    assert code == 1
    notes = [r["note"] for r in report["checks"] if r["status"] == "SKIPPED" and r.get("requested", True)]
    assert notes and all("None" not in n for n in notes), notes
    assert any("no --model given" in n for n in notes), notes
    assert report["result"].startswith("INCOMPLETE") and "the first: fx_bin identity: needs --data FILE" in \
        report["result"], report["result"]
    assert "--cache" not in report["result"], report["result"]


def test_a_directory_of_output_paths_names_the_ones_to_pass(tmp_path, capsys):
    """runs/ holding runs/<name>/<model>/results_*.json is one level too high: the one-line refusal names each
    output path found below it."""
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURE, runs / "groups")
    assert main(["--lm-eval", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"one level further down are the output paths {runs / 'groups'}: pass one" in err[0], err
