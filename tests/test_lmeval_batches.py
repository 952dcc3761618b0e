"""The forward level in lm-eval's own batches for every release that batches as 0.4.9.2 does
(evidence_audit/lmeval/rescore.py choose_mode; versions.py loglikelihood_batches), on real lm-eval CLI output.

tests/fixtures/lmeval_versions/<version>/batched/ (tools/make_lmeval_fixtures.py --batched): versions_mc and
versions_mi scored together at --batch_size 4 with eager attention, by each release in its own environment with the
audit's transformers, against the release's committed tiny-llama/. On a machine of the kind that made them (their
pretty_env_info: an AMD EPYC with AVX-512; evidence_audit/kernels.py) the re-score must EQUAL every logged
loglikelihood (max |diff| exactly 0), and a loglikelihood moved by one ulp must FAIL; on any other CPU the audit
cannot reproduce their kernels and says so, re-scoring them in lm-eval's batches within the float32 tolerance
(on an Intel Xeon with AVX-512: one score of 18 one float32 ulp off, the rest bit-identical). The equality mode and
the one-ulp failure on every machine: tests/test_lmeval_forward.py, on runs made on this machine during the test. A run that a release batching
otherwise wrote, or that another transformers ran, is re-scored one unpadded sequence per pass within the dtype's
tolerance, the reason named in the row. The equality is the batches' own: re-scored one unpadded sequence per pass,
versions_mi of these runs differed from the logged scores by up to 9.5e-7 on the machine that made them. Each audit
runs audit.py's main in-process on the tiny model (well under a second each once torch is imported)."""
import json
import math
import shutil
from importlib.metadata import version as installed
from pathlib import Path
from types import SimpleNamespace

import pytest

from evidence_audit import forward, hflm, kernels, tokens
from evidence_audit.cli import main
from evidence_audit.lmeval import rescore
from evidence_audit.lmeval.fmt import Release
from evidence_audit.lmeval.versions import KNOWN_VERSIONS
from lmeval_runs import env_info, made_here, tampered

# whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = pytest.mark.kernels

pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lmeval_versions"
# the releases whose batching is 0.4.9.2's (versions.py) and whose batched run was made with the audit's transformers
BATCHED = ("0.4.9.2", "0.4.10", "0.4.11", "0.4.12")
SAME = ("0.4.9", "0.4.9.1", "0.4.9.2", "0.4.10", "0.4.11", "0.4.12", "0.4.13")
BATCH = 4
TASKS = {"versions_mc": 18, "versions_mi": 36}          # requests: 6 documents x 3 choices (x 2: unconditional too)
EQUAL = "equality expected"
OTHER_CPU = "another CPU's kernels are not reproduced here"


def audit(tmp_path, run, version, *more):
    """audit.py --lm-eval RUN --forward against the release's committed model and data, in-process: (exit code,
    report)."""
    report = tmp_path / "report.json"
    if report.exists():
        report.unlink()
    d = FIXTURES / version
    code = main(["--lm-eval", str(run), "--forward", "--model", str(d / "tiny-llama"), "--data",
                 str(d / "data" / "docs.jsonl"), "--report", str(report), *more])
    return code, json.loads(report.read_text())


def rows(report, task):
    return {r["check"]: r for r in report["checks"] if r["level"] == "forward" and r["experiment"] == task}


def results_of(run):
    found = sorted(run.glob("tiny-llama/results_*.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def padded_batches(version):
    """The batches lm-eval formed over the batched run's requests (both tasks: one loglikelihood call), as lists of
    row lengths, rebuilt with the audit's own encoder and lm_eval_groups."""
    run = FIXTURES / version / "batched"
    top = results_of(run)
    encode = rescore.encoder(tokens.load_tokenizer(FIXTURES / version / "tiny-llama" / "tokenizer.json"),
                             top["config"], top)
    requests = []
    for path in sorted(run.glob("tiny-llama/samples_*.jsonl")):
        for line in path.read_text().splitlines():
            for arg in json.loads(line)["arguments"].values():
                ctx, cont = arg["arg_0"], arg["arg_1"]
                pair = rescore.encode_pair(encode, ctx, cont)[:2] if ctx else rescore.empty_context_pair(encode, cont)
                requests.append(pair)
    order = hflm.lm_eval_groups(requests)
    lengths = [len(requests[rep][0] + requests[rep][1]) - 1 for rep, _ in order]
    return [lengths[i:i + BATCH] for i in range(0, len(lengths), BATCH)]


# ---- the rule -----------------------------------------------------------------------------------------------------

def test_the_releases_batching_as_0_4_9_2_are_the_ones_read_so():
    same = tuple(v for v in KNOWN_VERSIONS if KNOWN_VERSIONS[v]["loglikelihood_batches"] == "same")
    assert same == SAME
    assert set(BATCHED) <= set(SAME)


def task(version, bs=BATCH, args="pretrained=m,dtype=float32,attn_implementation=eager"):
    return SimpleNamespace(run_config={"model_args": args, "batch_size": bs, "device": "cpu"},
                           release=Release(version if isinstance(version, tuple) else (version,)))


def test_choose_mode_names_the_release_the_transformers_and_the_rest():
    here = installed("transformers")
    cpu = kernels.this_machine()
    top = {"transformers_version": here, "pretty_env_info": env_info(cpu)}
    for v in SAME:
        plan = rescore.choose_mode(task(v), top, "cpu", None, environ={})
        assert (plan.batch_size, plan.equality, plan.attention) == (BATCH, True, "eager"), (v, plan.why)
        assert plan.threads[0] == cpu.cores and 1 in plan.threads
    plan = rescore.choose_mode(task(("0.4.7", "0.4.8")), top, "cpu", None)       # a run without a version field
    assert plan.batch_size is None and not plan.equality and plan.why.startswith(
        "lm-eval 0.4.7 or 0.4.8's batching differs from 0.4.9.2's: a context group's scores are read from its first "
        "request's rows"), plan.why
    plan = rescore.choose_mode(task("0.4.12"), {**top, "transformers_version": "4.45.2"}, "cpu", None)
    assert (plan.batch_size, plan.equality, plan.why) == (
        BATCH, False, f"the run's transformers 4.45.2 is not the audit's {here}: the same tensors are not guaranteed")
    plan = rescore.choose_mode(task("0.4.12"), {"pretty_env_info": top["pretty_env_info"]}, "cpu", None)
    assert not plan.equality and plan.why.startswith("the run records no transformers_version"), plan.why
    assert "'auto'" in rescore.choose_mode(task("0.4.10", "auto"), top, "cpu", None).why
    sdpa = rescore.choose_mode(task("0.4.10", args="pretrained=m"), top, "cpu", None, environ={})
    assert (sdpa.attention, sdpa.equality) == ("sdpa", True)             # transformers' default, reproduced
    flash = rescore.choose_mode(task("0.4.10", args="pretrained=m,attn_implementation=flash_attention_2"), top,
                                "cpu", None)
    assert not flash.equality and flash.attention == "eager" and "flash_attention_2" in flash.why
    assert "--sample" in rescore.choose_mode(task("0.4.10"), top, "cpu", 5).why
    for v in ("0.4.8", "0.4.5"):       # a wrong release is named before anything else
        assert "batching differs" in rescore.choose_mode(task(v, "auto"), {}, "cpu", None).why
    # the machine: another CPU, a kernel variable of the audit's own, no record
    restricted = rescore.choose_mode(task("0.4.12"), top, "cpu", None, environ={"MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert not restricted.equality and "MKL_ENABLE_INSTRUCTIONS=AVX2" in restricted.why
    other = kernels.CPU("AuthenticAMD", 25, 1, "AMD EPYC", {"avx", "avx2", "fma"}, 2, cpu.torch)
    elsewhere = rescore.choose_mode(task("0.4.12"), {**top, "pretty_env_info": env_info(other)}, "cpu", None)
    assert not elsewhere.equality and elsewhere.batch_size == BATCH and OTHER_CPU in elsewhere.why
    assert "AMD EPYC (AuthenticAMD, AVX2 (no AVX-512))" in elsewhere.why, elsewhere.why
    unrecorded = rescore.choose_mode(task("0.4.12"), {"transformers_version": here}, "cpu", None)
    assert not unrecorded.equality and "records no CPU" in unrecorded.why
    assert plan.env is None                                       # this machine's own kind: in this process


def test_a_run_of_this_cpu_kind_without_avx512_is_re_scored_held_to_avx2():
    """This machine's CPU kind with the AVX-512 family hidden (a virtual machine's guest): equality, in a child
    process held to AVX2; any other flag missing, or the audit's own kernel variable, or another model name: no."""
    cpu = kernels.this_machine()
    wide = {f for f in cpu.flags if f.startswith(kernels.WIDER_THAN_AVX2)}
    if not wide or not {"avx2", "fma"} <= cpu.flags:
        pytest.skip("this CPU has no AVX-512 to hide (or no AVX2)")
    top = {"transformers_version": installed("transformers")}

    def as_run(**changes):
        fields = {"vendor": cpu.vendor, "family": cpu.family, "model": cpu.model, "name": cpu.name,
                  "flags": cpu.flags - wide, "cores": cpu.cores, "torch": cpu.torch, **changes}
        return {**top, "pretty_env_info": env_info(kernels.CPU(**fields))}
    plan = rescore.choose_mode(task("0.4.12"), as_run(), "cpu", None, environ={})
    assert plan.equality and plan.env == kernels.AVX2_ONLY and "without AVX-512" in plan.why, plan.why
    for run in (as_run(flags=cpu.flags - wide - {"avx2"} | {"avx"}), as_run(flags=cpu.flags - {"sse4_2"}),
                as_run(name="another CPU")):
        assert not rescore.choose_mode(task("0.4.12"), run, "cpu", None, environ={}).equality
    held = rescore.choose_mode(task("0.4.12"), as_run(), "cpu", None, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert not held.equality, held.why          # the audit's own variable: not the run's default kernels


# ---- real output of every release that qualifies: equality --------------------------------------------------------

@pytest.mark.parametrize("version", BATCHED)
def test_the_batched_fixture_is_what_it_says(version):
    """Made by that release with the audit's transformers, at batch 4, eager, float32; its batches pad (rows of
    unequal length share a batch) and there is more than one of them."""
    top = results_of(FIXTURES / version / "batched")
    assert top["lm_eval_version"] == version and top["transformers_version"] == installed("transformers")
    assert top["config"]["batch_size"] in (BATCH, str(BATCH))
    args = rescore.model_args(top["config"])           # a "k=v,..." string to 0.4.9.2, a dict from 0.4.10 on
    assert args["attn_implementation"] == "eager" and args["dtype"] == "float32" and "mixed_precision_dtype" not in args
    batches = padded_batches(version)
    assert len(batches) > 2 and any(len(set(b)) > 1 for b in batches), batches


@pytest.mark.parametrize("version", BATCHED)
def test_every_release_that_batches_as_0_4_9_2_equals_lm_eval_in_its_batches(version, tmp_path):
    code, report = audit(tmp_path, FIXTURES / version / "batched", version)
    assert code == 0, [r["first_failure"] or r["note"] for r in report["checks"] if r["status"] == "FAIL"]
    for name, n in TASKS.items():
        fwd = rows(report, name)
        checks = (rescore.RESCORED, rescore.ARGMAX, rescore.GREEDY, rescore.SHIFT)
        assert [fwd[c]["status"] for c in checks] == ["PASS"] * 4, fwd
        fig = report["details"][name]["forward"]
        assert fig["batch_size"] == BATCH and fig["requests"] == n and fig["moved"] == []
        if made_here(FIXTURES / version / "batched"):
            assert EQUAL in fig["mode"] and fig["tolerance"] == 0.0 and fig["max_abs_diff"] == 0.0, fig["mode"]
        else:
            assert OTHER_CPU in fig["mode"] and fig["tolerance"] == forward.TOLERANCE["float32"], fig["mode"]
            assert fig["max_abs_diff"] <= 1e-6, fig["spread"]


@pytest.mark.parametrize("version", BATCHED)
def test_a_loglikelihood_moved_by_one_ulp_fails_in_lm_evals_batches(version, tmp_path):
    """One ulp (the next float up) on one logged loglikelihood, no prediction moved: on the kind of machine that
    made the run, FAIL naming the document in lm-eval's batches; the same edit passes one unpadded sequence per pass
    (--sample), where the tolerance hides it. On another CPU the edit is inside the cross-CPU noise: PASS, the row
    saying why equality is not expected."""
    moved = {}

    def nudge(lines):
        ll = float(lines[2]["resps"][1][0][0])
        new = math.nextafter(ll, math.inf)
        lines[2]["resps"][1][0][0] = lines[2]["filtered_resps"][1][0] = repr(new)
        moved.update(doc=lines[2]["doc_id"], by=new - ll)
    run = tampered(FIXTURES / version / "batched", tmp_path, "versions_mc", nudge)
    assert 0 < moved["by"] < 1e-15
    code, report = audit(tmp_path, run, version, "--task", "versions_mc")
    fwd = rows(report, "versions_mc")
    bad = fwd[rescore.RESCORED]
    if not made_here(FIXTURES / version / "batched"):
        assert code == 0 and OTHER_CPU in bad["note"] and "tolerance" in bad["note"], bad
        return
    assert code == 1 and bad["status"] == "FAIL" and len(bad["failures"]) == 1, bad
    assert bad["first_failure"].startswith(f"doc_id {moved['doc']} (line 3") and "equality expected" in \
        bad["first_failure"]
    assert fwd[rescore.ARGMAX]["status"] == "PASS"
    assert report["details"]["versions_mc"]["forward"]["moved"] == [moved["doc"]]
    code, report = audit(tmp_path, run, version, "--task", "versions_mc", "--sample", "100")
    assert code == 0 and rows(report, "versions_mc")[rescore.RESCORED]["status"] == "PASS"


# ---- runs the rule keeps out: the tolerance, the reason named -----------------------------------------------------

def tolerance_row(report, name="versions_mc"):
    fwd, fig = rows(report, name), report["details"][name]["forward"]
    assert fwd[rescore.RESCORED]["status"] == "PASS", fwd
    assert fig["tolerance"] == forward.TOLERANCE["float32"] and not fig["equality"]
    assert ", tolerance 0.0001 (" in fig["mode"], fig["mode"]
    return fig["mode"]


@pytest.mark.parametrize("version,run,says", [
    ("0.4.5", "run", "lm-eval 0.4.5's batching differs from 0.4.9.2's: a context group's scores are read from its "
                     "first request's rows, not its longest continuation's;"),
    ("0.4.9.1", "run", "the run's transformers 4.55.4 is not the audit's "),
    ("0.4.13", "run", "the run's transformers 5.24.0 is not the audit's "),
    # batch 4, eager, batching as 0.4.9.2 does: the transformers alone keeps it out
    ("0.4.13", "batched", "the run's transformers 5.24.0 is not the audit's "),
])
def test_real_runs_of_releases_that_do_not_qualify_name_the_reason(version, run, says, tmp_path):
    code, report = audit(tmp_path, FIXTURES / version / run, version)
    # a run holding a generate task: re-generated too (generate.py), so nothing requested is left unrun
    assert code == 0 and report["n_fail"] == 0 and report["n_skipped_requested"] == 0, report["result"]
    for name in TASKS:
        assert says in tolerance_row(report, name)


def test_a_batched_run_relabelled_as_another_release_or_transformers_leaves_lm_evals_batches(tmp_path):
    """The real 0.4.9.2 batched run said to be another transformers': the same scores, re-scored unpadded within the
    tolerance, the reason named."""
    for edit, says in ((lambda r: r.update(transformers_version="4.45.2"), "the run's transformers 4.45.2 is not"),):
        run = tampered(FIXTURES / "0.4.9.2" / "batched", tmp_path, "versions_mc", edit_results=edit)
        code, report = audit(tmp_path, run, "0.4.9.2", "--task", "versions_mc")
        assert code == 0 and says in tolerance_row(report)
        shutil.rmtree(run)


@pytest.mark.parametrize("run", ["default", "add_bos_token"])
def test_a_0_4_9_1_run_in_its_batches_equals_the_logged_scores_given_the_audits_transformers(run, tmp_path):
    """0.4.9.1 batches as 0.4.9.2 does on its own token ids (versions.py): its real batch-4 runs (the bos/ fixtures:
    a tokenizer that adds BOS, which 0.4.9.1 leaves out unless add_bos_token) were made with transformers 4.55.4,
    so the audit expects no equality; with transformers_version set to the audit's, lm-eval's batches reproduce
    every logged score exactly on the kind of machine that made them (within 1e-6 elsewhere)."""
    d = FIXTURES / "0.4.9.1" / "bos"
    here = installed("transformers")
    out = tampered(d / run, tmp_path, "versions_mc", edit_results=lambda r: r.update(transformers_version=here))
    report = tmp_path / "report.json"
    code = main(["--lm-eval", str(out), "--forward", "--model", str(d / "tiny-llama"), "--data",
                 str(FIXTURES / "0.4.9.1" / "data" / "docs.jsonl"), "--report", str(report)])
    got = json.loads(report.read_text())
    assert code == 0, [r["first_failure"] or r["note"] for r in got["checks"] if r["status"] == "FAIL"]
    for name in TASKS:
        fig = got["details"][name]["forward"]
        assert fig["batch_size"] == BATCH and fig["moved"] == [], fig
        if made_here(d / run):
            assert EQUAL in fig["mode"] and fig["max_abs_diff"] == 0.0, fig
        else:
            assert OTHER_CPU in fig["mode"] and fig["max_abs_diff"] <= 1e-6, fig
