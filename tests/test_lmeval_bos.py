"""Each release's tokenising rule (versions.py tok_encode; evidence_audit/lmeval/rescore.py encoder,
empty_context_pair) on real lm-eval CLI runs with a tokenizer that ADDS a BOS token by default (as Llama, Mistral and
Gemma tokenizers do).

tests/fixtures/lmeval_versions/<version>/bos/ (tools/make_lmeval_fixtures.py --bos): versions_mc and versions_mi
(acc_mutual_info: empty-context requests) at --batch_size 4, eager, on the committed tiny Llama's weights with a
tokenizer whose post-processor prepends <s>; default/ with the release's defaults, and for 0.4.8 and 0.4.9.1
add_bos_token/ with add_bos_token=True in model_args; token_ids.json: the ids the release's own HFLM gave every
request. 0.4.8 and 0.4.9.1 add special tokens only with add_bos_token (their default/ runs have no BOS; their
add_bos_token/ runs put a second one at the start of an empty context's continuation), 0.4.9.2 by the tokenizer's
default. The audit must tokenise each as its release did: the same ids as token_ids.json, the token boundaries row
PASS, the forward re-score equal (0.4.9.2, run with the audit's transformers, in lm-eval's batches) or within the
tolerance (0.4.8, read as "0.4.7 or 0.4.8": no version field; 0.4.9.1). Relabelled as 0.4.9.2's, the 0.4.9.1 run is
re-scored on a BOS it never had and FAILs at the forward level (the token boundaries row cannot see it: lm-eval
logs no token ids). Each audit runs audit.py's main in-process on the tiny model (well under a second)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from evidence_audit import forward, tokens
from evidence_audit.cli import main
from evidence_audit.lmeval import rescore
from evidence_audit.lmeval.versions import KNOWN_VERSIONS, TOK_ADD_BOS, TOK_DEFAULT
from lmeval_runs import made_here, tampered

# whose outcome depends on the kernels: .ci/run runs this tier again under the AVX2 restriction
pytestmark = pytest.mark.kernels

pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lmeval_versions"
RUNS = [("0.4.8", "default"), ("0.4.8", "add_bos_token"), ("0.4.9.1", "default"), ("0.4.9.1", "add_bos_token"),
        ("0.4.9.2", "default")]
READ_AS = {"0.4.8": "0.4.7 or 0.4.8"}                  # no version field: the releases whose files look alike
TASKS = {"versions_mc": 18, "versions_mi": 36}          # requests: 6 documents x 3 choices (x 2: unconditional too)
BOS = 1                                                 # "<s>" in the fixtures' word list


def results_of(run):
    found = sorted(run.glob("tiny-llama/results_*.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def tokenizer(version):
    return tokens.load_tokenizer(FIXTURES / version / "bos" / "tiny-llama" / "tokenizer.json")


def audit_ids(version, run, rule=None):
    """{task: [[doc_id, i, context ids, continuation ids]]} as the audit tokenises the run's logged requests, under
    `rule` (default: the run's release's)."""
    top = results_of(run)
    encode = rescore.encoder(tokenizer(version), top["config"], top, rule or KNOWN_VERSIONS[version]["tok_encode"],
                             rescore.model_type(FIXTURES / version / "bos" / "tiny-llama"))
    out = {}
    for path in sorted(run.glob("tiny-llama/samples_*.jsonl")):
        task = path.name[len("samples_"):].rsplit("_", 1)[0]
        out[task] = []
        for line in path.read_text().splitlines():
            s = json.loads(line)
            for i, a in enumerate(s["arguments"].values()):
                ctx, cont = a["arg_0"], a["arg_1"]
                c, k = rescore.encode_pair(encode, ctx, cont)[:2] if ctx else rescore.empty_context_pair(encode, cont)
                out[task].append([s["doc_id"], i, c, k])
    return out


def audit(tmp_path, run, version, *more):
    """audit.py --lm-eval RUN --tokens --forward against the release's BOS model and the data: (exit code, report)."""
    report = tmp_path / "report.json"
    if report.exists():
        report.unlink()
    code = main(["--lm-eval", str(run), "--tokens", "--forward", "--model",
                 str(FIXTURES / version / "bos" / "tiny-llama"), "--data",
                 str(FIXTURES / version / "data" / "docs.jsonl"), "--report", str(report), *more])
    return code, json.loads(report.read_text())


def rows(report, task, level):
    return {r["check"]: r for r in report["checks"] if r["level"] == level and r["experiment"] == task}


# ---- the rule -----------------------------------------------------------------------------------------------------

def test_the_rule_per_release():
    rules = {v: KNOWN_VERSIONS[v]["tok_encode"] for v in KNOWN_VERSIONS}
    assert rules == {**{v: TOK_ADD_BOS for v in ("0.4.5", "0.4.7", "0.4.8", "0.4.9", "0.4.9.1")},
                     **{v: TOK_DEFAULT for v in ("0.4.9.2", "0.4.10", "0.4.11", "0.4.12", "0.4.13")}}


def test_gemma_and_add_bos_token_under_each_rule():
    """0.4.5-0.4.9.1 add a BOS for add_bos_token=True or a Gemma model_type, none otherwise; 0.4.9.2 on: the
    tokenizer's default (none for a text starting with <s>), add_bos_token when given, no Gemma case."""
    tok, top = tokenizer("0.4.9.1"), results_of(FIXTURES / "0.4.9.1" / "bos" / "default")
    text = "Q: what colour is snow ?"
    for rule, args, kind, first in ((TOK_ADD_BOS, "", "llama", 4), (TOK_ADD_BOS, "", "gemma2", BOS),
                                    (TOK_ADD_BOS, "add_bos_token=True", "llama", BOS),
                                    (TOK_ADD_BOS, "add_bos_token=False", "gemma", BOS),
                                    (TOK_DEFAULT, "", "llama", BOS), (TOK_DEFAULT, "", "gemma", BOS),
                                    (TOK_DEFAULT, "add_bos_token=False", "gemma", 4)):
        encode = rescore.encoder(tok, {"model_args": args}, top, rule, kind)
        assert encode(text)[0] == first, (rule, args, kind)
    assert rescore.encoder(tok, {}, top, TOK_DEFAULT)("<s> " + text)[:2] == [BOS, 4]        # no second BOS


def test_the_rolling_windows_follow_the_rule():
    """A loglikelihood_rolling document: the first window predicts the text's tokens after the prefix token, with
    the BOS the release's tok_encode adds (0.4.9.2) or without it (0.4.9.1 by default)."""
    tok, top = tokenizer("0.4.9.1"), results_of(FIXTURES / "0.4.9.1" / "bos" / "default")
    old, new = (rescore.encoder(tok, {}, top, rule) for rule in (TOK_ADD_BOS, TOK_DEFAULT))
    text = "what colour is the sky ?"
    assert rescore.rolling_windows(old(text), old.prefix_id, 4) == [([BOS], [8, 9, 10, 11]), ([9, 10, 11], [12, 28])]
    assert rescore.rolling_windows(new(text), new.prefix_id, 4)[0] == ([BOS], [BOS, 8, 9, 10])


def test_candidate_releases_that_tokenise_otherwise_are_not_guessed():
    """A run without a version field may be several releases; where their rules differ the audit says so."""
    one = SimpleNamespace(release=SimpleNamespace(versions=("0.4.7", "0.4.8")))
    assert rescore.tokenising_rule(one, {}) == (TOK_ADD_BOS, None)
    both = SimpleNamespace(release=SimpleNamespace(versions=("0.4.8", "0.4.9.2")))
    rule, why = rescore.tokenising_rule(both, {})
    assert rule is None and why.startswith("the run may have been written by lm-eval 0.4.8 or 0.4.9.2, which "
                                           "tokenise requests otherwise"), why


@pytest.mark.parametrize("version,kind", RUNS)
def test_the_audits_ids_are_the_releases_own(version, kind):
    run = FIXTURES / version / "bos" / kind
    logged = json.loads((FIXTURES / version / "bos" / "token_ids.json").read_text())[kind]
    assert audit_ids(version, run) == logged
    assert {t: len(v) for t, v in logged.items()} == TASKS


def test_the_runs_differ_where_the_rules_do():
    """What the fixtures show: 0.4.9.1 ran without a BOS by default (0.4.9.2 with one); with add_bos_token=True the
    contexts got one and an empty context's continuation a second; 0.4.9.2's rule would have other ids."""
    ids = {(v, k): json.loads((FIXTURES / v / "bos" / "token_ids.json").read_text())[k] for v, k in RUNS}
    assert ids[("0.4.9.2", "default")]["versions_mc"][0][2][0] == BOS
    for old in ("0.4.8", "0.4.9.1"):
        assert ids[(old, "default")]["versions_mc"][0][2][0] == 4
        assert ids[(old, "add_bos_token")]["versions_mc"] == ids[("0.4.9.2", "default")]["versions_mc"]
        empty = [r for r in ids[(old, "add_bos_token")]["versions_mi"] if r[2] == [BOS]]
        assert len(empty) == 18 and all(r[3][0] == BOS for r in empty)
        for kind in ("default", "add_bos_token"):
            assert audit_ids(old, FIXTURES / old / "bos" / kind, TOK_DEFAULT) != ids[(old, kind)]


# ---- the audit on the real runs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("version,kind", RUNS)
def test_each_release_passes_tokens_and_forward(version, kind, tmp_path):
    code, report = audit(tmp_path, FIXTURES / version / "bos" / kind, version)
    assert code == 0, [r for r in report["checks"] if r["status"] == "FAIL"]
    for task, n in TASKS.items():
        ident, fwd = rows(report, task, "identity"), rows(report, task, "forward")
        assert ident[rescore.BOUNDARIES]["status"] == "PASS" and ident[rescore.BOUNDARIES]["items"] == n
        assert f"tokenised as lm-eval {READ_AS.get(version, version)} does (versions.py tok_encode" in \
            ident[rescore.BOUNDARIES]["note"]
        assert fwd[rescore.RESCORED]["status"] == "PASS"
        fig = report["details"][task]["forward"]
        if version == "0.4.9.2" and made_here(FIXTURES / version / "bos" / kind):   # the audit's transformers, 0.4.9.2's batches, this kind of CPU
            assert fig["batch_size"] == 4 and fig["tolerance"] == 0.0 and fig["max_abs_diff"] == 0.0, fig["mode"]
        elif version == "0.4.9.2":               # made on another CPU: its kernels are not reproduced here
            assert fig["batch_size"] == 4 and fig["max_abs_diff"] <= forward.TOLERANCE["float32"], fig["mode"]
            assert "another CPU's kernels are not reproduced here" in fig["mode"], fig["mode"]
        else:                                    # another batching or transformers: the tolerance
            assert fig["max_abs_diff"] <= forward.TOLERANCE["float32"], fig["mode"]
            if version == "0.4.9.1":             # batches as 0.4.9.2 does: lm-eval's batches, another transformers
                assert fig["batch_size"] == 4 and "the run's transformers 4.55.4 is not the audit's" in fig["mode"]
            else:
                assert fig["batch_size"] is None, fig["mode"]
                assert f"lm-eval {READ_AS.get(version, version)}'s batching differs" in fig["mode"]


def test_an_old_run_read_by_0492s_rule_fails(tmp_path):
    """The 0.4.9.1 run (no BOS) relabelled as 0.4.9.2's: re-tokenised with the BOS the tokenizer adds by default,
    re-scored on other tokens than it ran: FAIL. The same relabelling with add_bos_token=True in model_args (the
    BOS it ran with) still differs where a context was empty (0.4.9.1 scored a second BOS there)."""
    def relabel(r):
        r["lm_eval_version"] = "0.4.9.2"
    run = tampered(FIXTURES / "0.4.9.1" / "bos" / "default", tmp_path, "versions_mc", edit_results=relabel)
    code, report = audit(tmp_path, run, "0.4.9.1")
    assert code == 1
    for task in TASKS:      # every request with a context (an empty one is the same under both rules here)
        fwd = rows(report, task, "forward")[rescore.RESCORED]
        assert fwd["status"] == "FAIL" and fwd["n_failures"] == 18, fwd
    run = tampered(FIXTURES / "0.4.9.1" / "bos" / "add_bos_token", tmp_path / "b", "versions_mc", edit_results=relabel)
    code, report = audit(tmp_path, run, "0.4.9.1")
    assert rows(report, "versions_mc", "forward")[rescore.RESCORED]["status"] == "PASS"
    failed = rows(report, "versions_mi", "forward")[rescore.RESCORED]
    assert code == 1 and failed["status"] == "FAIL" and failed["n_failures"] == 18, failed
    assert all(" resps[3]" in f or " resps[4]" in f or " resps[5]" in f for f in failed["failures"])   # unconditional
