"""The extraction experiment: the three scorers on hand-written outputs, official (lm-eval) vs independent regex
agreement, the pre-registered audit sample, the real model (the session's smoke run, and every row of conftest's
24-row SMALL_DATA split, generated once per session), audit.py's recomputation and its --review import."""
import inspect
import json
import random
import re
import shutil
import sys

import pytest

import config
from conftest import SMALL_DATA, SMALL_N, run_cli
from evidence_audit.checks import first_failure
from evidence_audit.driver import audit
from evidence_audit.rules import extraction as audit_ext
from experiments import extraction_scorers
from experiments import scoring, selection
from experiments.extraction_sample import choose_audit_sample, class_weights
from experiments.scoring import sha256_text

CONFIG = config.effective(("shared", "extraction"))    # experiments.extraction.CONFIG_SECTIONS
LABELS = CONFIG["extraction_labels"]


# ---- exact -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, label, want", [
    ('{"sentiment": "positive"}', "positive", 1),
    ('  {"sentiment": "negative"}\n', "negative", 1),          # strip() at both ends
    ('{"sentiment":"positive"}', "positive", 0),               # no space after the colon
    ('{"sentiment": "positive"}', "negative", 0),
    ('{ "sentiment": "positive" }', "positive", 0),
    ('```json\n{"sentiment": "positive"}\n```', "positive", 0),
    ('', "positive", 0),
])
def test_exact(text, label, want):
    assert extraction_scorers.canonical_answer("positive") == '{"sentiment": "positive"}'
    assert extraction_scorers.exact_correct(text, label) == want


# ---- strict JSON ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, label, reason", [
    ('{"sentiment": "positive"}', "positive", None),
    ('{"sentiment":"negative"}', "negative", None),                       # strict parses; exact would not
    ('\n {"sentiment": "positive"} \n', "positive", None),                # JSON's own whitespace is allowed
    ('{"sentiment": "positive"}', "negative", "wrong_label"),
    ('```json\n{"sentiment": "positive"}\n```', "positive", "code_fence"),
    ('{"sentiment": "positive", "rating": 4}', "positive", "extra_keys"),
    ('{"sentiment": "positive", "sentiment": "positive"}', "positive", "duplicate_key"),
    ('{"sentiment": {"a": 1, "a": 2}}', "positive", "duplicate_key"),     # a duplicate anywhere
    ('{"sentiment": "Positive"}', "positive", "bad_value"),               # uppercase value
    ('{"sentiment": "POSITIVE"}', "positive", "bad_value"),
    ('{"sentiment": "neutral"}', "positive", "bad_value"),
    ('{"sentiment": 1}', "positive", "bad_value"),
    ('{"label": "positive"}', "positive", "missing_key"),
    ('["positive"]', "positive", "not_object"),
    ('"positive"', "positive", "not_object"),
    ('The sentiment is positive.', "positive", "not_json"),
    ('{"sentiment": "positive"} Hope this helps!', "positive", "not_json"),
    ('{"sentiment": NaN}', "positive", "not_json"),                       # not standard JSON
    ('{"sentiment": "positive"', "positive", "not_json"),                 # cut off by the length limit
    ('', "positive", "empty"),
    (' \n\t', "positive", "empty"),
])
def test_strict(text, label, reason):
    assert extraction_scorers.strict_reason(text, label) == reason
    sc = extraction_scorers.strict_scores(text, label)
    assert sc == {"reason": reason, "format_ok": int(reason in (None, "wrong_label")), "correct": int(reason is None)}
    # audit.py's own re-implementation says the same
    assert audit_ext.ext_strict_reason(text, label, LABELS) == reason


# ---- regex ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, label, extracted, n, correct", [
    ('{"sentiment": "positive"}', "positive", "positive", 1, 1),
    ("The review is not positive.", "negative", "positive", 1, 0),   # wrong on purpose: the rule ignores negation
    ("Negative. Definitely not positive.", "negative", "Negative", 2, 1),
    ("POSITIVE", "positive", "POSITIVE", 1, 1),                      # case-insensitive; prediction lowercased
    ("positively brilliant", "positive", "[invalid]", 0, 0),         # whole words only
    ("non-positive", "negative", "positive", 1, 0),                  # '-' is a word boundary
    ("positive_review", "positive", "[invalid]", 0, 0),              # '_' is a word character
    ('"sentiment": "positive" or "negative"', "positive", "positive", 2, 1),
    ("", "negative", "[invalid]", 0, 0),
    ("I cannot tell.", "negative", "[invalid]", 0, 0),
])
def test_regex(text, label, extracted, n, correct):
    assert extraction_scorers.regex_extract(text) == extracted
    assert len(extraction_scorers.regex_matches(text)) == n
    assert int(extraction_scorers.regex_prediction(extracted) == label) == correct
    assert len(re.findall(CONFIG["extraction_regex"], text)) == n


def test_categories():
    c = extraction_scorers.categories('The sentiment is "positive" or "negative".', "eos", "not_json")
    assert c == {"no_match": 0, "several_matches": 1, "conflicting_matches": 1, "format_failure": 1, "length_stop": 0}
    c = extraction_scorers.categories('{"sentiment": "positive"}', "eos", None)
    assert c == {"no_match": 0, "several_matches": 0, "conflicting_matches": 0, "format_failure": 0, "length_stop": 0}
    c = extraction_scorers.categories("Hmm", "length", "not_json")
    assert c["no_match"] == 1 and c["length_stop"] == 1
    assert extraction_scorers.categories('{"sentiment": "negative"}', "eos", "wrong_label")["format_failure"] == 0


def test_case_equivalents_and_word_chars_are_pythons():
    """The independent scan's two definitions equal Python re's, checked over every code point."""
    chars = [chr(c) for c in range(sys.maxunicode + 1)]
    for letter in set("".join(extraction_scorers.REGEX_WORDS)):
        pat = re.compile("(?i)" + letter)
        assert {c for c in chars if pat.fullmatch(c)} == extraction_scorers._CASE_EQUIVALENTS[letter], letter
    word = re.compile(r"\w")
    assert all(bool(word.fullmatch(c)) == extraction_scorers._is_word_char(c) for c in chars)


def random_strings(n, seed=20261010):
    rng = random.Random(seed)
    pieces = ["positive", "negative", "Positive", "NEGATIVE", "pOsItIvE", "posit", "ive", "negativ", "neg",
              "po\u017fitive", "pos\u0131tive", "pos\u0130tive", "n\u00e9gative", "positives", "unpositive",
              " ", "  ", "\n", "\t", "_", "-", ".", ",", '"', "'", ":", "{", "}", "```", "0", "7", "\u00e9",
              "\u00df", "\u2014", "\u00a0", "not ", "json", "sentiment", "\u4e2d", "\u0661", "x"]
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))))
    return out + ["positive", "xpositive", "positivex", "_positive", "positive_", "1positive", "positive1",
                  "\u00e9positive", "positive\u00e9", "(positive)", "negative!positive", ""]


def test_official_and_independent_regex_agree_on_generated_strings():
    from experiments.extraction import lm_eval_extract

    texts = random_strings(400)
    official = lm_eval_extract(CONFIG, texts)
    independent = [extraction_scorers.regex_extract(t) for t in texts]
    assert official == independent
    # audit.py's third implementation (Python re) agrees too, on the extraction and the match count
    for t, o in zip(texts, official):
        a = audit_ext.ext_scores_from_text(t, "positive", "eos", LABELS, CONFIG["extraction_regex_fallback"])
        assert a["regex"]["official"] == o and a["regex"]["n_matches"] == len(extraction_scorers.regex_matches(t))
    assert sum(o != "[invalid]" for o in official) > 100 and official.count("[invalid]") > 50


# ---- the pre-registered audit sample ------------------------------------------------------------------------------

def test_audit_sample_depends_only_on_idx_labels_salt():
    assert list(inspect.signature(choose_audit_sample).parameters) == ["idx_labels", "salt", "per_class"]
    idx = selection.ranked_indices(CONFIG["selection_salt"], 200)[:64]
    labels = {i: (i * 7) % 2 for i in idx}
    pairs = [(i, labels[i]) for i in idx]
    s = choose_audit_sample(pairs, "salt-a", 8)
    assert len(s) == 16 and [x["label"] for x in s] == [0, 1] * 8              # interleaved, lowest label first
    assert s == choose_audit_sample(list(reversed(pairs)), "salt-a", 8)        # input order does not matter
    assert s != choose_audit_sample(pairs, "salt-b", 8)
    for c in (0, 1):
        ranked = sorted((i for i in idx if labels[i] == c), key=lambda i: sha256_text(f"salt-a:{i}"))
        assert [x["idx"] for x in s if x["label"] == c] == ranked[:8]
    assert [{k: x[k] for k in ("position", "idx", "label", "rank_key")} for x in s] == \
        audit_ext.ext_sample(pairs, "salt-a", 8)                                    # audit.py's own code agrees
    w = class_weights(pairs, s)
    n0 = sum(1 for i in idx if labels[i] == 0)
    assert w["0"] == {"population": n0, "sampled": 8, "weight": f"{n0}/8", "weight_float": n0 / 8}


@pytest.mark.slow
def test_audit_sample_is_written_before_the_tokenizer_or_model_is_loaded(prepared_cache, model_dir, tmp_path,
                                                                          monkeypatch):
    """Run the experiment with a loader that stops it: the sample file must already exist at that point."""
    import adapter
    from experiments import extraction
    from experiments.context import Context, Data, Inputs, Options
    from experiments.evidence import Stages

    class Stop(Exception):
        pass

    seen = {}

    def stop(*_a, **_k):
        seen["prereg"] = (tmp_path / extraction.PREREGISTRATION_FILE).read_text()
        raise Stop

    monkeypatch.setattr(adapter, "load_tokenizer", stop)
    monkeypatch.setattr(adapter, "load_model", stop)
    data = Data(id="fixture-sentiment", schema="sst2", content_sha256="x" * 64, split="validation",
                parquet_path=prepared_cache / "data" / "fixture-sentiment" / "validation.parquet")
    inputs = Inputs(cache=prepared_cache, model_dir=model_dir, model_identity={}, data={data.id: data})
    ctx = Context(name="extraction", split="dev", config=config.effective(extraction.CONFIG_SECTIONS),
                  inputs=inputs, options=Options(out=tmp_path), stages=Stages(), data=data)
    with pytest.raises(Stop):
        extraction.run(ctx)
    prereg = json.loads(seen["prereg"])
    assert len(prereg["items"]) == 16 and prereg["salt"] == CONFIG["extraction_audit_salt"]
    assert [s["name"] for s in ctx.stages.stages] == ["selection", "audit_sample_preregistration"]


@pytest.mark.slow
def test_input_over_the_limit_is_an_error(model_dir):
    from adapter import load_tokenizer
    from experiments.extraction import build_items

    tok = load_tokenizer(model_dir)
    rows = [{"idx": 0, "label": 1, "sentence": "word " * 600}]
    with pytest.raises(scoring.ScoringError, match="over the limit of 512"):
        build_items(rows, [0], CONFIG, tok)


# ---- the real model: the session's smoke run, and every row of a small split generated once per session ---------

@pytest.fixture(scope="session")
def extraction_smoke(smoke_run):
    """conftest's `run.py --smoke` (every experiment, extraction among them): no extra run."""
    return smoke_run


@pytest.fixture(scope="session")
def extraction_all(small_split_all_run):
    """Every row of SMALL_DATA (24 rows, 12 per label) on the real model (conftest's session run of it, with the
    protocol and options before it in one process): the pre-registered sample is 8 per class of them, as of the
    64 development items (which cost 2.7 times as much to generate)."""
    return small_split_all_run


def load(out):
    d = out / "extraction"
    recs = [json.loads(l) for l in (d / "records.jsonl").read_text().splitlines()]
    gens = [json.loads(l) for l in (out / "private" / "extraction" / "generations.jsonl").read_text().splitlines()]
    return (json.loads((d / "config.json").read_text()), recs, json.loads((d / "summary.json").read_text()), gens,
            json.loads((d / "stages.json").read_text()))


def check_run(out, n):
    cfg, recs, summ, gens, stages = load(out)
    order = list(range(n)) if cfg["split"] == "all" else selection.ranked_indices(CONFIG["selection_salt"],
                                                                                  cfg["n_rows"])[:n]
    assert [r["idx"] for r in recs] == order == [g["idx"] for g in gens]
    assert summ["n_items"] == n and summ["regex_agreement"] == {"n_items": n, "n_mismatches": 0}
    for r, g in zip(recs, gens):
        assert r["regex"]["official"] == r["regex"]["independent"]
        assert r["generation_sha256"] == sha256_text(g["generation"])
        assert g["prompt"].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        assert g["prompt"].endswith("<|im_start|>assistant\n") and g["user_message"] in g["prompt"]
        assert "<|im_start|>assistant" not in g["generation"]                     # only the new tokens
        assert r["finish_reason"] in ("eos", "length") and r["input_tokens"] <= 512
        assert (r["generated_tokens"] == 32) if r["finish_reason"] == "length" else (g["generated_ids"][-1] == 2)
        assert g["sentence"] not in json.dumps(r) and g["generation"] not in json.dumps(r)  # texts stay private
    assert summ["human_review"]["disagreement_rate"] is None and summ["human_review"]["false_positives"] is None
    names = [s["name"] for s in stages["stages"]]
    assert names.index("audit_sample_preregistration") < names.index("prompts") < names.index("model_load")
    assert (out / "extraction.preregistration.json").exists()
    assert sha256_text((out / "extraction.preregistration.json").read_text()) == \
        cfg["audit_sample"]["preregistration_sha256"] == summ["audit_sample"]["preregistration_sha256"]
    page = (out / "private" / "extraction" / "review.html").read_text()
    assert "review-data" in page and "http://" not in page and "https://" not in page
    return cfg, recs, summ, gens


@pytest.mark.slow
def test_smoke(extraction_smoke):
    out, proc = extraction_smoke
    cfg, recs, summ, _ = check_run(out, 2)
    assert "lm-eval generate_until identical on" in proc.stdout
    assert summ["lm_eval_generate_until"]["ran"] is True


@pytest.mark.slow
def test_every_row_of_a_small_split(extraction_all):
    out, proc = extraction_all
    cfg, recs, summ, gens = check_run(out, SMALL_N)
    sc = summ["scorers"]
    # one set of generations, three scorers: exact <= strict <= regex item by item (a strictly correct answer's
    # only sentiment word is its value)
    for r in recs:
        assert r["exact"]["correct"] <= r["strict"]["correct"] <= r["regex"]["correct"]
    assert sc["exact"]["correct"] <= sc["strict"]["correct"] <= sc["regex"]["correct"]
    assert sum(p["n"] for p in summ["patterns"].values()) == SMALL_N
    assert summ["finish_reasons"]["eos"] + summ["finish_reasons"]["length"] == SMALL_N
    g = summ["lm_eval_generate_until"]
    assert g["ran"] and g["n_compared"] == SMALL_N
    assert g["n_input_ids_identical"] == SMALL_N
    prereg = cfg["audit_sample"]["preregistration"]
    counts = summ["label_counts"]
    assert len(prereg["items"]) == 16 and summ["audit_sample"]["per_class"] == {"0": 8, "1": 8}
    assert prereg["class_weights"]["0"]["weight"] == f"{counts['0']}/8"
    assert prereg["class_weights"]["1"]["weight"] == f"{counts['1']}/8"
    # the same sample as the rule computes from idx and labels alone
    assert [s["idx"] for s in prereg["items"]] == [s["idx"] for s in choose_audit_sample(
        [(r["idx"], r["label"]) for r in recs], CONFIG["extraction_audit_salt"], 8)]
    print(f"\nextraction {SMALL_DATA}: exact {sc['exact']['correct']}/{SMALL_N}, strict {sc['strict']['correct']}/"
          f"{SMALL_N}, regex {sc['regex']['correct']}/{SMALL_N}; strict reasons {sc['strict']['reasons']}; failures "
          f"{summ['match_failures']['all']}; lm-eval generate_until identical {g['n_identical']}/{SMALL_N}")


@pytest.mark.slow
def test_audit_recomputes_every_row_run(small_split_all_audit):
    """conftest's session audit of the run (--strict --tokens --forward, every experiment in it)."""
    proc, report = small_split_all_audit
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout.replace("RESULT: PASS", "")
    checks = {(c["level"], c["check"].split(" (")[0]): c["status"] for c in report["checks"]
              if c["experiment"] == "extraction"}
    assert checks[("arithmetic", "scores recomputed from the private generations")] == "PASS"
    assert checks[("identity", "tokenisation")] == "PASS"
    assert checks[("forward", "greedy tokens")] == "PASS"
    assert report["details"]["extraction"]["human_review"]["disagreement_rate"] is None


@pytest.mark.slow
def test_audit_public_records_only(extraction_all, tmp_path):
    """Without the private generations the counts and paired tables still recompute; the text-level check is
    reported as SKIPPED, never as passed."""
    out, _ = extraction_all
    pub = tmp_path / "public"
    shutil.copytree(out, pub, ignore=shutil.ignore_patterns("private", "audit*.json"))
    report = audit(pub, ("arithmetic",), None, ["extraction"], public_only=True)  # published without O/private/
    assert report["exit_code"] == 0, first_failure(report)
    st = {c["check"].split(" (")[0]: c["status"] for c in report["checks"] if c["experiment"] == "extraction"}
    assert st["scores recomputed from the private generations"] == "SKIPPED"
    assert st["summary.json values"] == "PASS"


def tamper(out, tmp_path, fn):
    d = tmp_path / "copy"
    shutil.copytree(out, d, ignore=shutil.ignore_patterns("audit*.json"))
    fn(d)
    report = audit(d, ("arithmetic",), None, ["extraction"])
    shutil.rmtree(d)
    return report


def edit_jsonl(path, fn):
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    fn(rows)
    path.write_text("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows))


def edit_json(path, fn):
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def _flip_regex(rows):
    rows[0]["regex"]["correct"] = 1 - rows[0]["regex"]["correct"]


def _private_text(rows):
    rows[0]["generation"] = rows[0]["generation"] + " negative"


def _consistent_score_lie(d):
    """One record's strict-JSON failure reason swapped for another format failure, summary.json rebuilt to match:
    every public figure stays consistent, only the recomputation from the private text can catch it."""
    def fix(rows):
        r = next(r for r in rows if r["strict"]["reason"] in ("not_json", "code_fence"))
        r["strict"]["reason"] = "code_fence" if r["strict"]["reason"] == "not_json" else "not_json"
    edit_jsonl(d / "extraction" / "records.jsonl", fix)
    rows = [json.loads(l) for l in (d / "extraction" / "records.jsonl").read_text().splitlines()]
    old = json.loads((d / "extraction" / "summary.json").read_text())
    prereg = json.loads((d / "extraction.preregistration.json").read_text())
    summ = audit_ext.ext_expected_summary("extraction", "dev", rows, LABELS, True,
                                      old["audit_sample"]["preregistration_sha256"], prereg["items"],
                                      old["human_review"]["note"])
    summ["evidence_format"] = old["evidence_format"]        # a forger keeps the file's format
    (d / "extraction" / "summary.json").write_text(json.dumps(summ, indent=1, sort_keys=True))


def _resample(d):
    def fix(p):
        p["items"][0]["idx"], p["items"][1]["idx"] = p["items"][1]["idx"], p["items"][0]["idx"]
    edit_json(d / "extraction.preregistration.json", fix)


def _late_prereg(d):
    edit_json(d / "extraction.preregistration.json", lambda p: p.update(created_at_utc="2999-01-01T00:00:00+00:00"))


def _claim_review(d):
    edit_json(d / "extraction" / "summary.json", lambda s: s["human_review"].update(disagreement_rate=0.05))


def _paired(d):
    edit_json(d / "extraction" / "summary.json",
              lambda s: s["paired"]["exact_vs_regex"].update(only_b=s["paired"]["exact_vs_regex"]["only_b"] + 1))


@pytest.mark.parametrize("kind, fn, check", [
    ("flip regex correct", lambda d: edit_jsonl(d / "extraction" / "records.jsonl", _flip_regex), "per-item"),
    ("edit private generation", lambda d: edit_jsonl(d / "private" / "extraction" / "generations.jsonl",
                                                     _private_text), "scores recomputed"),
    ("consistent score lie", _consistent_score_lie, "scores recomputed"),
    ("re-chosen audit sample", _resample, "audit sample"),
    ("sample written after generation", _late_prereg, "audit sample"),
    ("claimed human figure", _claim_review, "summary.json"),
    ("paired table", _paired, "summary.json"),
])
@pytest.mark.slow
def test_audit_catches_tampering(extraction_all, tmp_path, kind, fn, check):
    out, _ = extraction_all
    report = tamper(out, tmp_path, fn)
    failed = [c["check"] for c in report["checks"] if c["status"] == "FAIL"]
    assert report["exit_code"] == 1 and any(c.startswith(check) for c in failed), (kind, failed)


def sheet_for(out, fill):
    """A review sheet for the run's pre-registered sample; fill(position, record) -> item fields or None."""
    cfg, recs, _, _, _ = load(out)
    by = {r["idx"]: r for r in recs}
    items = []
    for s in cfg["audit_sample"]["preregistration"]["items"]:
        r = by[s["idx"]]
        fields = fill(s["position"], r) or {"final_stance": None, "content_correct": None, "format_compliant": None,
                                            "reference_disputed": None, "reason": ""}
        items.append({"position": s["position"], "idx": s["idx"], "label_name": r["label_name"],
                      "sentence_sha256": r["sentence_sha256"], "answer_sha256": r["generation_sha256"], **fields})
    return {"sheet_format": "extraction-review-sheet/v1", "experiment": "extraction", "split": cfg["split"],
            "preregistration_sha256": cfg["audit_sample"]["preregistration_sha256"],
            "sample_idx": [i["idx"] for i in items], "reviewer": {"name": "", "time": ""},
            "exported_at": "2026-10-10T10:00:00Z", "items": items}


@pytest.mark.slow
def test_review_cli_refuses_blank_sheet_and_computes_complete_one(extraction_all, tmp_path):
    out, _ = extraction_all
    blank = tmp_path / "blank.json"
    blank.write_text(json.dumps(sheet_for(out, lambda p, r: None)))
    proc = run_cli("audit.py", out, "--experiment", "extraction", "--review", blank,
                   "--report", tmp_path / "a1.json")
    assert proc.returncode == 1 and "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert "reviewer.name: blank" in proc.stdout and "position 16 (idx" in proc.stdout
    listed = [l for l in proc.stdout.splitlines() if l.startswith("  - ")]
    assert len(listed) == 2 + 16 * 5 and all(l.endswith(": blank") for l in listed)
    hr = json.loads((tmp_path / "a1.json").read_text())["details"]["extraction"]["human_review"]
    assert hr["refused"] and hr["disagreement_rate"] is None and hr["weighted_disagreement_rate"] is None

    # a complete sheet in which the human agrees with the regex extractor everywhere except one item per class
    flipped = {1, 2}

    def fill(pos, r):
        h = r["regex"]["correct"] ^ (pos in flipped)
        stance = r["label_name"] if h else LABELS[1 - LABELS.index(r["label_name"])]
        return {"final_stance": stance, "content_correct": bool(h), "format_compliant": bool(r["strict"]["format_ok"]),
                "reference_disputed": False, "reason": "test"}
    sheet = sheet_for(out, fill)
    sheet["reviewer"] = {"name": "pytest", "time": "2026-10-10T10:00:00+00:00"}
    full = tmp_path / "full.json"
    full.write_text(json.dumps(sheet))
    proc = run_cli("audit.py", out, "--experiment", "extraction", "--review", full, "--report", tmp_path / "a2.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hr = json.loads((tmp_path / "a2.json").read_text())["details"]["extraction"]["human_review"]
    assert hr["refused"] is False and hr["n_reviewed"] == 16 and hr["n_decidable_undisputed"] == 16
    assert hr["disagreements"] == 2 and hr["disagreement_rate"] == 2 / 16
    assert hr["false_positives"] + hr["false_negatives"] == 2
    _, recs, summ, _, _ = load(out)
    n0, n1 = summ["label_counts"]["0"], summ["label_counts"]["1"]
    est = hr["weighted_estimate"]
    assert est["weights"] == {"0": f"{n0}/8", "1": f"{n1}/8"}
    assert est["disagreements"] == pytest.approx(n0 / 8 + n1 / 8)    # positions 1, 2 = one item of each class
    assert hr["weighted_disagreement_rate"] == pytest.approx((n0 / 8 + n1 / 8) / SMALL_N)
    assert "regex extractor vs human: disagreement 2/16" in proc.stdout


@pytest.mark.slow
def test_tiny_model_generates_differently_but_the_sample_is_the_same(extraction_all, tiny_split_all_run):
    """Different generations (a random tiny model; conftest's tiny --split all run), the identical pre-registered
    sample."""
    (out_real, _), (out_tiny, _) = extraction_all, tiny_split_all_run
    real, tiny = load(out_real), load(out_tiny)
    assert [r["generation_sha256"] for r in real[1]] != [r["generation_sha256"] for r in tiny[1]]
    p_real = json.loads((out_real / "extraction.preregistration.json").read_text())
    p_tiny = json.loads((out_tiny / "extraction.preregistration.json").read_text())
    assert p_real["items"] == p_tiny["items"]
    assert {k: v for k, v in p_real.items() if k != "created_at_utc"} == \
        {k: v for k, v in p_tiny.items() if k != "created_at_utc"}
