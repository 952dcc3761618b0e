"""The forward level of `audit.py --lm-eval RUN --forward --model DIR` on loglikelihood_rolling requests
(evidence_audit/lmeval/rescore.py rolling_rows): each document cut into lm-eval's rolling windows, each window
re-scored from the weights, summed, and compared with the logged log-likelihood.

The run is the committed REAL lm-eval 0.4.9.2 output tests/fixtures/lmeval_groups/ (fx_roll: 6 documents,
max_length 16, batch size 1, transformers' default attention); its tiny model is not committed but deterministic
(tools/make_lmeval_group_fixtures.py build_model: seed 0), so it is rebuilt once per session here."""
import importlib.util
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_lmeval_groups import FIXTURE, audit, copy_run, failures, load_results, load_samples, roll_data, rows
from evidence_audit import forward, kernels
from lmeval_runs import env_info, made_here
from evidence_audit.lmeval import rescore
from evidence_audit.lmeval.bootstrap import python_summation
from evidence_audit.lmeval.metrics import bits_per_byte, builtin_sum, weighted_perplexity

# whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = pytest.mark.kernels

TOOL = Path(__file__).resolve().parent.parent / "tools" / "make_lmeval_group_fixtures.py"
WINDOWS = {"0": 1, "1": 1, "2": 1, "3": 1, "4": 3, "5": 1}     # doc 4: 35 words -> 16 + 16 + 3 tokens


def tool():
    spec = importlib.util.spec_from_file_location("make_lmeval_group_fixtures", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """The fixture run's tiny model, rebuilt by the script that made the run. The results record no weights hash
    (model_sha ""), only model_num_parameters: checked here and by the audit's model row; the re-score itself is
    what ties the weights to the logged numbers."""
    out = tmp_path_factory.mktemp("roll-model") / "tiny-llama"
    tool().build_model(out)
    assert rescore.safetensors_parameters(out / "model.safetensors") == \
        load_results()["config"]["model_num_parameters"] == 3168
    return out


# ---- the windows ----------------------------------------------------------------------------------------------------

def test_every_token_is_predicted_once_after_at_most_max_length_tokens():
    """The properties of lm-eval's disjoint windows (lm_eval/utils.py:261-309), checked without lm-eval."""
    rng = random.Random(0)
    for _ in range(300):
        n, max_length = rng.randrange(0, 60), rng.randrange(1, 20)
        ids = [rng.randrange(3, 50) for _ in range(n)]
        windows = rescore.rolling_windows(ids, 1, max_length)
        assert len(windows) == -(-n // max_length)
        assert [t for _, k in windows for t in k] == ids                      # each token predicted once, in order
        start = 0
        for i, (c, k) in enumerate(windows):
            assert 1 <= len(k) <= max_length
            if i == 0:
                assert c == [1]                  # the first window: the prefix token alone as context
            else:                                # then the tokens just before, max_length + 1 in all
                assert len(c) + len(k) == max_length + 1 and c + k == ids[start - len(c):start + len(k)]
            start += len(k)


@pytest.mark.slow
def test_the_windows_are_lm_evals():
    """rolling_windows against lm-eval 0.4.9.2's own get_rolling_token_windows + make_disjoint_window (pure
    functions of lm_eval/utils.py, as HFLM.loglikelihood_rolling calls them: context_len 1)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    rng = random.Random(1)
    for _ in range(500):
        n, max_length = rng.randrange(0, 80), rng.randrange(1, 24)
        ids = [rng.randrange(3, 50) for _ in range(n)]
        theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(ids, 2, max_length, 1)]
        assert rescore.rolling_windows(ids, 2, max_length) == [tuple(w) for w in theirs]


def test_the_mode_is_equality_only_on_the_runs_own_tensors():
    def task(args, bs):
        return SimpleNamespace(run_config={"model_args": args, "batch_size": bs, "device": "cpu",
                                           "model_dtype": "torch.float32"})
    eager = "pretrained=m,attn_implementation=eager"
    here = kernels.this_machine()
    top = {"lm_eval_version": "0.4.9.2", "transformers_version": rescore.audit_transformers(),
           "pretty_env_info": env_info(here)}
    tol, mode, attention = rescore.rolling_mode(task(eager, 1), top, "cpu", environ={})
    assert (tol, attention) == (0.0, "eager") and mode.startswith(
        "one unpadded window per pass, as the run at batch size 1 (the same tensors and kernels: the run was made on "
        "this machine's kind of CPU") and mode.endswith("equality expected"), mode
    tol, mode, _ = rescore.rolling_mode(task(eager, 4), top, "cpu", environ={})
    assert tol == forward.TOLERANCE["float32"] and "the run padded its windows in chunks of 4" in mode
    tol, mode, attention = rescore.rolling_mode(task("pretrained=m", 1), top, "cpu", environ={})
    assert (tol, attention) == (0.0, "sdpa"), mode             # transformers' default attention, reproduced
    assert "no fixed batch size" in rescore.rolling_mode(task(eager, "auto"), top, "cpu")[1]
    tol, mode, _ = rescore.rolling_mode(task(eager, 1), top, "cpu", environ={"ATEN_CPU_CAPABILITY": "avx2"})
    assert tol == forward.TOLERANCE["float32"] and "ATEN_CPU_CAPABILITY=avx2" in mode
    # the loglikelihood mode's condition on the code (rescore.other_code): the release and the transformers
    for edit, says in (({"transformers_version": "4.45.2"}, "the run's transformers 4.45.2 is not the audit's"),
                       ({"transformers_version": None}, "the run records no transformers_version"),
                       ({"lm_eval_version": "0.4.8"}, "lm-eval 0.4.8's batching differs from 0.4.9.2's"),
                       ({"pretty_env_info": None}, "the run records no CPU")):
        tol, mode, _ = rescore.rolling_mode(task(eager, 1), {**top, **edit}, "cpu")
        assert tol == forward.TOLERANCE["float32"] and says in mode, mode


# ---- the real run -------------------------------------------------------------------------------------------------

def forward_audit(tmp_path, run, model):
    code, report = audit(tmp_path, run, "--forward", "--model", model, "--data", roll_data(tmp_path), "--task",
                         "fx_roll")
    roll, = rows(report, "fx_roll", rescore.ROLLING_RESCORED)
    return code, report, roll, report["details"]["fx_roll"]["forward"]


@pytest.mark.slow
def test_the_real_rolling_run_is_re_scored_window_by_window(tmp_path, model):
    code, report, roll, fig = forward_audit(tmp_path, FIXTURE, model)
    assert code == 0 and roll["status"] == "PASS" and roll["items"] == 6, roll
    assert not [r for r in report["checks"] if r["status"] == "FAIL"]
    assert rows(report, "fx_roll", "model (parameters")[0]["status"] == "PASS"
    assert fig["max_length"] == 16 and fig["windows_per_document"] == WINDOWS and fig["windows"] == 8
    # the run (transformers' default sdpa attention, batch size 1) on an AMD EPYC: equality on that kind of CPU only
    if made_here(FIXTURE):
        assert fig["mode"].endswith("equality expected"), fig["mode"]
    else:
        assert fig["mode"].startswith("one unpadded window per pass, tolerance 0.0001 per window (the run was made "
                                      "on "), fig["mode"]
    assert fig["max_abs_diff"] <= 1e-4 and fig["moved"] == []
    print(f"fx_roll: |sum of windows - logged| {forward.spread_text(fig['spread'])}")


@pytest.mark.slow
def test_hflm_at_batch_size_1_with_eager_attention_equals_the_audits_windows(model):
    """The equality the mode claims at batch size 1: HFLM.loglikelihood_rolling itself (eager, float32,
    max_length 16) on fx_roll's texts == the audit's windows scored by its own Llama pass and summed."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from evidence_audit import tokens

    texts = [r["target"] for r in load_samples("fx_roll")]
    lm = HFLM(pretrained=str(model), device="cpu", dtype="float32", batch_size=1, attn_implementation="eager",
              max_length=16)
    theirs = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)],
                                      disable_tqdm=True)
    top = load_results()
    encode = rescore.encoder(tokens.load_tokenizer(model / "tokenizer.json"), top["config"], top)
    scorer, _ = forward.load_scorer(model, "float32")
    docs = {i: (None, rescore.rolling_windows(encode(t), encode.prefix_id, 16), "") for i, t in enumerate(texts)}
    got = rescore.rolling_sums(scorer, docs, 16, None, "cpu")
    ours = [builtin_sum(got[i], python_summation(top)[0]) for i in range(len(texts))]
    assert ours == theirs


@pytest.mark.slow
def test_a_moved_rolling_loglikelihood_with_its_perplexities_recomputed_fails_naming_the_document(tmp_path, model):
    """A forger moves doc 4's log-likelihood by 0.5 and rewrites everything the arithmetic level ties to it (resps,
    filtered_resps, the [ll, count] pairs, the three aggregates): only the re-score can catch it."""
    edited = {}

    def edit_samples(rows_):
        new = float(rows_[4]["resps"][0][0]) + 0.5
        rows_[4]["resps"], rows_[4]["filtered_resps"] = [[str(new)]], [str(new)]
        for m in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
            rows_[4][m][0] = new
        edited["rows"] = rows_

    def edit_results(r):
        comp = python_summation(r)[0]
        pairs = {m: [tuple(x[m]) for x in edited["rows"]] for m in ("word_perplexity", "byte_perplexity",
                                                                    "bits_per_byte")}
        res = r["results"]["fx_roll"]
        res["word_perplexity,none"] = weighted_perplexity(pairs["word_perplexity"], comp)
        res["byte_perplexity,none"] = weighted_perplexity(pairs["byte_perplexity"], comp)
        res["bits_per_byte,none"] = bits_per_byte(pairs["bits_per_byte"], comp)

    run = copy_run(tmp_path, edit_results, samples={"fx_roll": edit_samples})
    code, report, roll, fig = forward_audit(tmp_path, run, model)
    assert not failures(report, "fx_roll", "per-sample rolling") and not failures(report, "fx_roll", "aggregates")
    bad = failures(report, "fx_roll", rescore.ROLLING_RESCORED)
    assert code == 1 and len(bad) == 1 and fig["moved"] == [4], bad
    assert bad[0].startswith("doc_id 4 (line 5, filter none) resps[0][0]: logged ") and "over 3 window(s)" in bad[0]
    assert 0.5 - 1e-4 <= fig["max_abs_diff"] <= 0.5 + 1e-4


@pytest.mark.slow
def test_a_run_without_max_length_is_skipped_naming_it(tmp_path, model):
    """Without the results' max_length the window size is unknown: SKIPPED, never PASS."""
    run = copy_run(tmp_path, lambda r: r.pop("max_length"))
    code, report = audit(tmp_path, run, "--forward", "--model", model, "--task", "fx_roll")
    roll, = rows(report, "fx_roll", rescore.ROLLING_RESCORED)
    assert roll["status"] == "SKIPPED" and "max_length is None: lm-eval's window size is unknown" in roll["note"]
