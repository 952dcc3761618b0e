"""The audit on real evidence that ANOTHER machine produced (tests/fixtures/cross_machine/README.md): an AMD EPYC
with AVX2 and no AVX-512, torch 2.13.0+cpu, transformers 4.57.6, lm-eval 0.4.9.2, the shipped model and the
repository's sentiment fixture.

- lm-eval-0.4.9.2/{b1,b4,bf16-b4}: three lm_eval CLI runs (float32 at batch 1 and 4, bfloat16 at batch 4, sdpa).
- run.py-smoke: `run.py --smoke` evidence from a clone in /srv/evals.

What the tests prove (each audit runs audit.py as a user does, on a copy in tmp_path; the fixtures stay untouched):
- test_honest_lm_eval_run_passes: each honest run PASSES every requested level (arithmetic, identity, forward) and
  the forward row names its mode: where this machine is not the run's kind of CPU (kernels.reproduces), the tolerance
  mode with a reason naming both CPUs; where it is, the equality mode (so the test is right on either machine).
- test_swapped_clear_margin_forgery_fails: the document with the largest gap between its two logged loglikelihoods
  gets them swapped, its acc/acc_norm and the aggregates (and their stderr) recomputed so that the arithmetic and
  identity levels still PASS: the forward level FAILs naming that doc_id (b4 and bf16-b4).
- test_shift_forgery_fails: every loglikelihood moved by the same amount (argmax and the per-sample metrics unchanged,
  so only the forward level can see it) FAILs on the shift row, also when the run is relabelled bfloat16 (whose
  tolerance is large) or a recorded field (transformers_version) is edited to force the tolerance mode.
- test_one_ulp_edit: one loglikelihood of b4 moved by one float32 ulp. Across CPUs the re-score differs from the
  logged scores by up to ~3e-5 anyway (measured noise), so a one-ulp edit (~5e-7) is inside the tolerance and must
  NOT fail, the row saying "tolerance"; on the run's kind of CPU the equality mode must FAIL it.
- test_smoke_evidence: the smoke evidence PASSES `audit.py O --tokens --forward --cache C`; one protocol score edited
  (official and independent, +0.01) makes it exit 1.
"""
import json
import shutil
from importlib.metadata import version as installed
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from evidence_audit import kernels
from evidence_audit.lmeval import metrics, rescore

# the real model; whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = [pytest.mark.slow, pytest.mark.kernels]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cross_machine"
LMEVAL = FIXTURES / "lm-eval-0.4.9.2"
SMOKE = FIXTURES / "run.py-smoke"
TASK = "sentiment_local"
LEVELS = ("arithmetic", "identity", "forward")
FORWARD_ROWS = (rescore.RESCORED, rescore.ARGMAX, rescore.GREEDY, rescore.SHIFT, rescore.AGGREGATES)


# ---- helpers ------------------------------------------------------------------------------------------------------

def copy_of(src, tmp_path, name="run"):
    """A writable copy of a fixture directory in tmp_path (the audit writes audit.json into it)."""
    dst = tmp_path / name
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def results_path(run):
    return next(run.glob("results_*.json"))


def samples_path(run):
    return next(run.glob(f"samples_{TASK}_*.jsonl"))


def read_results(run):
    return json.loads(results_path(run).read_text(encoding="utf-8"))


def read_samples(run):
    return [json.loads(line) for line in samples_path(run).read_text(encoding="utf-8").splitlines()]


def write_results(run, results):
    """As lm-eval writes it (json.dumps indent 2, ensure_ascii=False: the fixtures round-trip byte for byte)."""
    results_path(run).write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")


def write_samples(run, rows):
    samples_path(run).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def lls(row):
    """The logged loglikelihoods of one sample, in request order, as floats."""
    return [float(r[0][0]) for r in row["resps"]]


def set_ll(row, i, value):
    """Request i's logged loglikelihood, in resps and filtered_resps, as the string lm-eval writes (str(float))."""
    row["resps"][i][0][0] = row["filtered_resps"][i][0] = str(float(value))


def audit_lm_eval(run, cache):
    """`audit.py --lm-eval RUN --data --model --tokens --forward`: (CompletedProcess, RUN/audit.json)."""
    proc = run_cli("audit.py", "--lm-eval", run, "--data",
                   cache / "data" / "fixture-sentiment" / "validation.parquet",
                   "--model", cache / "models" / "smollm2-135m-instruct-q4_1", "--tokens", "--forward")
    report = run / "audit.json"
    return proc, json.loads(report.read_text()) if report.exists() else None


def rows_of(report, level=None):
    return [r for r in report["checks"] if level is None or r["level"] == level]


def forward_row(report, check):
    found = [r for r in rows_of(report, "forward") if r["experiment"] == TASK and r["check"] == check]
    assert len(found) == 1, [r["check"] for r in rows_of(report, "forward")]
    return found[0]


def failing(report):
    """The FAIL rows, as the audit prints them: "level check: first failure"."""
    return [f"{r['level']} {r['check']}: {r['first_failure']}" for r in report["checks"] if r["status"] == "FAIL"]


def where_is_this(results):
    """(same kind of machine as the run's: equality expected, the reason) as the audit's choose_mode decides it
    from the run's record: the run's transformers, then its CPU and torch (kernels.reproduces)."""
    if results["transformers_version"] != installed("transformers"):
        return False, f"the run's transformers {results['transformers_version']} is not the audit's"
    return kernels.reproduces(kernels.from_pretty_env_info(results["pretty_env_info"]), kernels.this_machine())


def assert_mode_named(report, results):
    """The forward row names the mode: equality on the run's kind of machine, else tolerance with the reason (both
    CPUs named when the CPUs are what differs)."""
    fig = report["details"][TASK]["forward"]
    mode = fig["mode"]
    assert mode in forward_row(report, rescore.RESCORED)["note"]
    same, why = where_is_this(results)
    if same:
        assert fig["equality"] is True and "equality expected" in mode and fig["max_abs_diff"] == 0.0, mode
        return mode
    assert fig["equality"] is False and "tolerance" in mode and why in mode, (mode, why)
    run_cpu, here = kernels.from_pretty_env_info(results["pretty_env_info"]), kernels.this_machine()
    identity = lambda c: (c.vendor, c.family, c.model, c.name, c.flags)        # noqa: E731
    if (identity(run_cpu) != identity(here) and run_cpu.torch == here.torch
            and results["transformers_version"] == installed("transformers")):          # the CPUs are the reason
        assert run_cpu.describe() in mode and here.describe() in mode, mode
        assert "AMD EPYC" in mode and "AVX2 (no AVX-512)" in mode, mode
    return mode


def shift_every_ll(rows, by):
    for row in rows:
        for i, ll in enumerate(lls(row)):
            set_ll(row, i, ll + by)


# ---- a. the honest runs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["b1", "b4", "bf16-b4"])
def test_honest_lm_eval_run_passes(name, prepared_cache, tmp_path):
    run = copy_of(LMEVAL / name, tmp_path)
    proc, report = audit_lm_eval(run, prepared_cache)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert failing(report) == [] and report["n_skipped_requested"] == 0
    for level in LEVELS:
        assert [r for r in rows_of(report, level) if r["status"] == "PASS"], f"no {level} row"
    for check in FORWARD_ROWS:
        assert forward_row(report, check)["status"] == "PASS"
    assert report["details"][TASK]["forward"]["requests"] == 80
    assert_mode_named(report, read_results(run))


# ---- b. a clear-margin argmax forgery -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,which", [("b4", "widest"), ("bf16-b4", "widest"), ("bf16-b4", "past-margin")])
def test_swapped_clear_margin_forgery_fails(name, which, prepared_cache, tmp_path):
    """A document's two logged loglikelihoods swapped: its prediction flips. Its acc/acc_norm and the results'
    aggregates and stderr are recomputed as lm-eval would, the task hashes (doc, prompt, target) are untouched: only
    the forward level can see it, and it must FAIL naming that doc_id. The document is chosen from the logged scores
    before any audit: "widest", the largest gap; "past-margin", the smallest gap past twice bfloat16's margin
    tolerance (0.25) — each score then moves by less than the score tolerance (1.0), so only the margin catches
    it (an honest cross-CPU re-score moved a bfloat16 margin by at most 0.125)."""
    run = copy_of(LMEVAL / name, tmp_path)
    rows, results = read_samples(run), read_results(run)
    gap = lambda r: abs(lls(r)[0] - lls(r)[1])                                               # noqa: E731
    if which == "widest":
        row = max(rows, key=lambda r: (gap(r), -r["doc_id"]))
    else:
        row = min((r for r in rows if gap(r) > 2 * rescore.forward.MARGIN_TOLERANCE["bfloat16"]),
                  key=lambda r: (gap(r), r["doc_id"]))
        assert gap(row) < rescore.forward.TOLERANCE["bfloat16"], gap(row)
    doc, (a, b) = row["doc_id"], lls(row)
    assert abs(a - b) > 2 * rescore.forward.MARGIN_TOLERANCE["bfloat16"]
    set_ll(row, 0, b)
    set_ll(row, 1, a)
    choices = results["configs"][TASK]["doc_to_choice"]
    gold = int(row["target"])
    new = lls(row)
    row["acc"] = 1.0 if int(np.argmax(new)) == gold else 0.0
    row["acc_norm"] = 1.0 if int(np.argmax([ll / len(c) for ll, c in zip(new, choices)])) == gold else 0.0
    assert row["acc"] != (1.0 if int(np.argmax([a, b])) == gold else 0.0)           # the prediction did flip
    for metric in ("acc", "acc_norm"):
        values = [r[metric] for r in rows]
        value, stderr = metrics.mean(values), metrics.mean_stderr(values)
        results["results"][TASK][f"{metric},none"] = value
        results["results"][TASK][f"{metric}_stderr,none"] = stderr
    write_samples(run, rows)
    write_results(run, results)

    proc, report = audit_lm_eval(run, prepared_cache)
    assert proc.returncode == 1 and "RESULT: FAIL" in proc.stdout, proc.stdout[-4000:]
    assert [r for r in rows_of(report) if r["status"] == "FAIL" and r["level"] != "forward"] == [], failing(report)
    caught = [forward_row(report, c) for c in (rescore.RESCORED, rescore.ARGMAX)]
    caught = [r for r in caught if r["status"] == "FAIL"]
    assert caught, failing(report)
    assert all(r["first_failure"].startswith(f"doc_id {doc} ") for r in caught), failing(report)
    assert doc in report["details"][TASK]["forward"]["moved"] + report["details"][TASK]["forward"]["argmax_flips"]
    if which == "past-margin":          # every score within the tolerance: the flipped prediction alone catches it
        assert forward_row(report, rescore.ARGMAX)["status"] == "FAIL", failing(report)


# ---- c. shift forgeries -------------------------------------------------------------------------------------------

def relabel_bfloat16(results):
    results["config"]["model_dtype"] = "torch.bfloat16"
    results["config"]["model_args"] = results["config"]["model_args"].replace("dtype=float32", "dtype=bfloat16")
    results["configs"][TASK]["metadata"]["dtype"] = "bfloat16"       # where lm-eval copies model_args too


def older_transformers(results):
    results["transformers_version"] = "4.57.5"


@pytest.mark.parametrize("name,by,edit,forced", [
    ("bf16-b4", 0.7, None, None),
    ("bf16-b4", 0.5, None, None),
    ("b4", 0.2, relabel_bfloat16, None),                 # float32 scores said to be bfloat16's (tolerance 1.0)
    ("bf16-b4", 0.7, older_transformers, "4.57.5"),      # one recorded field forces the tolerance mode anywhere
], ids=["bf16+0.7", "bf16+0.5", "b4-relabelled-bf16+0.2", "bf16-transformers-4.57.5+0.7"])
def test_shift_forgery_fails(name, by, edit, forced, prepared_cache, tmp_path):
    """Every logged loglikelihood moved by `by` nats (argmax unchanged: the per-sample metrics and aggregates stay
    right, so arithmetic and identity PASS): the shift row FAILs."""
    run = copy_of(LMEVAL / name, tmp_path)
    rows = read_samples(run)
    shift_every_ll(rows, by)
    write_samples(run, rows)
    if edit:
        results = read_results(run)
        edit(results)
        write_results(run, results)

    proc, report = audit_lm_eval(run, prepared_cache)
    assert proc.returncode == 1 and "RESULT: FAIL" in proc.stdout, proc.stdout[-4000:]
    assert [r for r in rows_of(report) if r["status"] == "FAIL" and r["level"] != "forward"] == [], failing(report)
    shift = forward_row(report, rescore.SHIFT)
    assert shift["status"] == "FAIL", (shift["note"], failing(report))
    assert "shifted, not noisy" in shift["first_failure"], shift["first_failure"]
    fig = report["details"][TASK]["forward"]
    assert fig["mean_signed_diff"] > by / 2, fig["mean_signed_diff"]
    if edit is relabel_bfloat16:
        assert fig["dtype"] == "bfloat16"
    if forced:
        assert "tolerance" in fig["mode"] and f"the run's transformers {forced} is not the audit's" in fig["mode"]


# ---- d. one ulp ---------------------------------------------------------------------------------------------------

def test_one_ulp_edit(prepared_cache, tmp_path):
    """One loglikelihood of b4 (doc 0, request 0) moved up by one float32 ulp (numpy.nextafter in float32, written
    as lm-eval writes a float: str of the Python float). On another kind of CPU the honest re-score differs from the
    logged scores by up to ~3e-5 anyway (measured here on these runs: AVX2 AMD vs AVX-512 Intel), so a one-ulp edit
    (~5e-7) is inside that noise and the float32 tolerance: the audit must NOT fail, and the row says tolerance. On
    the run's kind of CPU the re-score is bit for bit (equality mode) and the same edit must FAIL, naming doc 0."""
    run = copy_of(LMEVAL / "b4", tmp_path)
    rows, results = read_samples(run), read_results(run)
    old = np.float32(lls(rows[0])[0])
    assert float(old) == lls(rows[0])[0]                       # the logged value is a float32 value
    new = np.nextafter(old, np.float32(np.inf))
    set_ll(rows[0], 0, new)
    assert 0 < float(new) - float(old) < 1e-6 and rows[0]["resps"][0][0][0] != str(float(old))
    write_samples(run, rows)

    proc, report = audit_lm_eval(run, prepared_cache)
    fig, row = report["details"][TASK]["forward"], forward_row(report, rescore.RESCORED)
    if where_is_this(results)[0]:
        assert proc.returncode == 1 and fig["equality"] is True and "equality expected" in fig["mode"], \
            proc.stdout[-4000:]
        assert row["status"] == "FAIL" and row["first_failure"].startswith(f"doc_id {rows[0]['doc_id']} "), row
        assert fig["moved"] == [rows[0]["doc_id"]]
    else:
        assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout[-4000:] + "\n".join(
            failing(report))
        assert_mode_named(report, results)              # "tolerance", the reason named
        ulp = float(new) - float(old)
        assert row["status"] == "PASS" and ulp < fig.get("allowance", fig["tolerance"]) and ulp < fig["max_abs_diff"]


# ---- e. run.py --smoke evidence -----------------------------------------------------------------------------------

def test_smoke_evidence(prepared_cache, tmp_path):
    """The other machine's `run.py --smoke` evidence (config paths of /srv/evals: --cache says where the model and
    data are here) PASSES every level; one protocol score of one candidate edited (official and independent both
    +0.01) makes the audit exit 1."""
    out = copy_of(SMOKE, tmp_path, "smoke")
    proc = run_cli("audit.py", out, "--tokens", "--forward", "--cache", prepared_cache)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]

    forged = copy_of(SMOKE, tmp_path, "forged")
    path = forged / "protocol" / "records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for side in ("official", "independent"):
        records[0][side]["scores"][0] += 0.01
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = run_cli("audit.py", forged, "--tokens", "--forward", "--cache", prepared_cache)
    assert proc.returncode == 1 and "RESULT: FAIL" in proc.stdout, proc.stdout[-4000:]
    report = json.loads((forged / "audit.json").read_text())
    assert [r for r in report["checks"] if r["status"] == "FAIL" and r["experiment"] == "protocol"], failing(report)
