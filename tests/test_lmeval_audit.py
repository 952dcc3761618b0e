"""audit.py --lm-eval RUN_DIR: fast unit tests of the recomputations and refusals (hand-written files), and slow
tests on REAL lm-eval 0.4.9.2 output made here (tests/lmeval_runs.py) on the prepared model and the fixtures:
clean runs pass every level, an unsorted --samples run and tampered copies are caught, naming sample and field."""
import json
import math
import os
import random
import shutil
import statistics

import pytest

from conftest import run_cli
from lmeval_runs import tampered
from evidence_audit.cli import main
from evidence_audit.lmeval import metrics
from evidence_audit.lmeval.docs import doc_hash
from evidence_audit import sampling
from evidence_audit.lmeval.rescore import chosen
from evidence_audit.reading import sha256_text

DATE = "2026-01-02T03-04-05.678901"


# ---- fast: the definitions against lm-eval's and scikit-learn's own code ----------------------------------------

def test_f1_and_mcc_equal_scikit_learn_on_random_labels():
    from sklearn.metrics import f1_score, matthews_corrcoef

    rnd = random.Random(7)
    for n in (1, 2, 5, 40):
        for _ in range(30):
            pairs = [(rnd.randint(0, 1), rnd.randint(0, 1)) for _ in range(n)]
            g, p = zip(*pairs)
            assert metrics.f1_binary(pairs) == pytest.approx(float(f1_score(g, p, zero_division=0.0)), abs=1e-12)
            assert metrics.mcc(pairs) == pytest.approx(float(matthews_corrcoef(g, p)), abs=1e-12)
    three = [(rnd.randint(0, 2), rnd.randint(0, 2)) for _ in range(50)]
    assert metrics.mcc(three) == pytest.approx(float(matthews_corrcoef(*zip(*three))), abs=1e-12)
    assert metrics.f1_binary(three) is None or all(g < 2 and p < 2 for g, p in three)


def test_mean_stderr_is_the_sample_stddev_over_sqrt_n():
    xs = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert metrics.mean_stderr(xs) == pytest.approx(statistics.stdev(xs) / math.sqrt(len(xs)), abs=1e-15)


def test_multiple_choice_first_index_wins_and_acc_norm_divides_by_characters():
    out = metrics.multiple_choice([-2.0, -2.0], [False, True], ["no", "yes"], 1)
    assert out["acc"] == 0.0 and out["exact_match"] == 1 and out["f1"] == [1, 0]
    # -3/3 = -1 beats -2.2/2 = -1.1: raw argmax says choice 1, acc_norm choice 0
    out = metrics.multiple_choice([-3.0, -2.2], [False, False], ["abc", "de"], 0)
    assert (out["acc"], out["acc_norm"]) == (0.0, 1.0)


def test_filters_and_exact_match_equal_lm_evals_own():
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter, WhitespaceFilter
    from lm_eval.filters.transformation import LowercaseFilter

    texts = [[" The answer is Positive.", "negative!"], ["nothing here"], ["(a) yes (b) no"], [" \tMixed Case \n"]]
    for kw in ({"regex_pattern": r"(?i)(positive|negative)"}, {"regex_pattern": r"\((a)\)|(no)", "group_select": 0},
               {"regex_pattern": r"(\w+)", "group_select": -1, "fallback": "X"}):
        assert [metrics.regex_filter(t, **kw) for t in texts] == RegexFilter(**kw).apply(texts, None)
    assert [metrics.FILTERS["lowercase"](t) for t in texts] == LowercaseFilter().apply(texts, None)
    assert [metrics.FILTERS["remove_whitespace"](t) for t in texts] == WhitespaceFilter().apply(texts, None)
    cases = [("Positive.", "positive"), ("pos itive", "positive"), ("a1b", "ab"), ("x-y", "xy"), ("A", "a")]
    for opts in ({}, {"ignore_case": True}, {"ignore_punctuation": True}, {"ignore_numbers": True},
                 {"regexes_to_ignore": [r"\s"], "ignore_case": True}):
        for pred, ref in cases:
            want = float(exact_match_hf_evaluate([pred], [ref], **opts)["exact_match"])
            assert metrics.exact_match(pred, ref, **opts) == want, (pred, ref, opts)


def test_doc_hash_equals_lm_evals_hash_string():
    from lm_eval.utils import hash_string

    doc = {"sentence": "Ça va — très «bien»", "label": 1, "idx": 3, "nested": {"a": [1.5, None]}}
    assert doc_hash(doc) == hash_string(json.dumps(doc, indent=2, ensure_ascii=False))


def test_forward_sample_is_drawn_from_the_audits_seed_alone():
    class S:
        def __init__(self, d):
            self.doc_id, self.requests = d, [("c", " a"), ("c", " b")]

    class T:
        name, samples = "t", [S(d) for d in range(20)]

    ranked = sorted(range(20), key=lambda d: sha256_text(f"{sampling.SALT}:s1:t:{d}"))
    assert chosen(T, sampling.Sample(3, "s1")) == set(ranked[:3])
    assert chosen(T, sampling.Sample(3, "s2")) != set(ranked[:3])       # another seed, another draw
    assert chosen(T, sampling.Sample(None)) == set(range(20))
    fresh = [sampling.Sample(3) for _ in range(2)]
    assert fresh[0].seed != fresh[1].seed and fresh[0].source == "fresh at audit time"


# ---- fast: hand-written runs in lm-eval 0.4.9.2's format, for refusals and doc_id rules ---------------------------

def sample(doc_id, doc, lls, target, filt="none"):
    """One multiple_choice sample line as lm-eval 0.4.9.2 writes it (choices no/yes, acc only)."""
    ctx = f"Q{doc['q']}"
    pred = max(range(len(lls)), key=lambda j: (lls[j], -j))
    return {"doc_id": doc_id, "doc": doc, "target": str(target),
            "arguments": {f"gen_args_{j}": {"arg_0": ctx, "arg_1": f" {c}"} for j, c in enumerate(["no", "yes"])},
            "resps": [[[repr(ll), "False"]] for ll in lls], "filtered_resps": [[repr(ll), "False"] for ll in lls],
            "filter": filt, "metrics": ["acc"], "doc_hash": doc_hash(doc), "prompt_hash": sha256_text(ctx),
            "target_hash": sha256_text(str(target)), "acc": 1.0 if pred == target else 0.0}


def write_run(root, samples, version="0.4.9.2", n_orig=3, limit=None, sub="org__model", date=DATE):
    d = root / sub if sub else root
    d.mkdir(parents=True, exist_ok=True)
    accs = [s["acc"] for s in samples]
    task_hash = sha256_text("".join(s["doc_hash"] + s.get("prompt_hash", "") + s["target_hash"] for s in samples))
    results = {"results": {"toy": {"alias": "toy", "acc,none": sum(accs) / len(accs), "acc_stderr,none": "N/A"}},
               "group_subtasks": {"toy": []},
               "configs": {"toy": {"task": "toy", "output_type": "multiple_choice", "doc_to_text": "Q{{q}}",
                                   "doc_to_target": "label", "doc_to_choice": ["no", "yes"], "target_delimiter": " ",
                                   "metric_list": [{"metric": "acc"}], "num_fewshot": 0}},
               "versions": {"toy": 1.0}, "n-shot": {"toy": 0}, "higher_is_better": {"toy": {"acc": True}},
               "n-samples": {"toy": {"original": n_orig, "effective": min(limit or n_orig, n_orig)}},
               "config": {"limit": limit, "bootstrap_iters": 0, "fewshot_seed": 1234}, "lm_eval_version": version,
               "task_hashes": {"toy": task_hash}, "chat_template": None, "system_instruction": None}
    (d / f"results_{date}.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (d / f"samples_toy_{date}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    return d


def toy_samples(order=(0, 1, 2)):
    docs = [{"q": i, "label": i % 2} for i in range(3)]
    return [sample(k, docs[k], [-1.0 - k, -1.5], docs[k]["label"]) for k in order]


def audit(tmp_path, *args):
    report = tmp_path / "report.json"
    code = main(["--lm-eval", *map(str, args), "--report", str(report)])
    return code, (json.loads(report.read_text()) if report.exists() else None)


def failures(report, check_part, level=None):
    return [f for r in report["checks"] if check_part in r["check"] and r["status"] == "FAIL"
            and (level is None or r["level"] == level) for f in r["failures"]]


def test_a_consistent_hand_written_run_passes_and_the_report_is_not_silent(tmp_path, capsys):
    write_run(tmp_path / "run", toy_samples())
    code, report = audit(tmp_path, tmp_path / "run")
    assert code == 0 and report["n_fail"] == 0 and report["experiments"] == ["toy"], capsys.readouterr().out
    assert f"report: {tmp_path / 'report.json'}" in capsys.readouterr().out


def test_default_report_goes_to_run_dir_audit_json_and_is_ignored_by_discovery(tmp_path, capsys):
    write_run(tmp_path, toy_samples(), sub="")
    assert main(["--lm-eval", str(tmp_path)]) == 0
    assert (tmp_path / "audit.json").exists() and f"report: {tmp_path / 'audit.json'}" in capsys.readouterr().out
    assert main(["--lm-eval", str(tmp_path)]) == 0         # the audit.json it wrote is not taken for lm-eval output


def test_a_tampered_resps_message_shows_the_recomputed_value(tmp_path):
    samples = toy_samples()
    samples[1]["resps"][0][0][0] = "-0.25"               # filtered_resps kept: take_first no longer gives it
    write_run(tmp_path / "run", samples)
    code, report = audit(tmp_path, tmp_path / "run")
    said = failures(report, "per-sample")
    assert code == 1 and any("filtered_resps[0]: recorded ['-2.0', 'False'], recomputed ['-0.25', 'False'] "
                             "(take_first of resps[0])" in f for f in said), said


def test_several_runs_in_one_output_path_and_unpaired_files_are_named(tmp_path):
    later = "2026-01-02T09-00-00.000001"
    d = write_run(tmp_path, toy_samples())
    write_run(tmp_path, toy_samples(), date=later)
    code, report = audit(tmp_path, tmp_path)
    assert code == 0 and report["experiments"] == [f"toy@{DATE[:19]}", f"toy@{later[:19]}"]
    (d / f"samples_toy_{later}.jsonl").rename(d / "samples_toy_2025-01-01T00-00-00.jsonl")
    code, report = audit(tmp_path, tmp_path)
    bad = failures(report, "samples file")
    assert code == 1 and len(bad) == 2
    assert f"task toy has no samples_toy_{later}.jsonl" in bad[0] and "with no results file of its date" in bad[1]


@pytest.mark.parametrize("edit, says", [
    (lambda d: json.loads(d.replace('"0.4.9.2"', '"0.4.3"')), "'lm_eval_version': '0.4.3'"),
    (lambda d: {k: v for k, v in json.loads(d).items() if k != "task_hashes"}, "'task_hashes': expected dict"),
    (lambda d: d.replace('"versions"', '"task_hashes": {}, "versions"', 1), "duplicate key 'task_hashes'"),
    (lambda d: d.replace('"bootstrap_iters": 0', '"bootstrap_iters": NaN'), "non-finite number NaN"),
])
def test_unknown_or_non_strict_results_are_refused_with_one_line(tmp_path, edit, says):
    d = write_run(tmp_path / "run", toy_samples())
    p = d / f"results_{DATE}.json"
    new = edit(p.read_text())
    p.write_text(new if isinstance(new, str) else json.dumps(new))
    proc = run_cli("audit.py", "--lm-eval", tmp_path / "run", "--report", tmp_path / "r.json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr and p.name in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_sample_line_in_another_format_is_refused_naming_line_and_field(tmp_path):
    s = toy_samples()
    del s[1]["prompt_hash"]
    write_run(tmp_path / "a", s)
    proc = run_cli("audit.py", "--lm-eval", tmp_path / "a", "--report", tmp_path / "r.json")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "line 2: field 'prompt_hash': expected str (lm-eval 0.4.9.2 sample format)" in proc.stderr
    s = toy_samples()
    s[2]["resps"][0][0][0] = s[2]["filtered_resps"][0][0] = "minus one"
    write_run(tmp_path / "b", s)
    code, report = audit(tmp_path, tmp_path / "b")
    assert code == 2 and report is None


def test_no_results_file_and_a_symlinked_run_dir_are_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    assert audit(tmp_path, tmp_path / "empty")[0] == 2
    write_run(tmp_path / "run", toy_samples())
    (tmp_path / "link").symlink_to(tmp_path / "run")
    assert audit(tmp_path, tmp_path / "link")[0] == 2


def test_unimplemented_multiple_choice_variants_are_skipped_by_name_never_passed(tmp_path):
    s = toy_samples()
    s[1] = sample(1, s[1]["doc"], [-1.0, -2.0], [0, 1])        # a list of gold answers (multiple_target)
    write_run(tmp_path, s)
    code, report = audit(tmp_path, tmp_path)
    skipped = [r for r in report["checks"] if r["status"] == "SKIPPED" and "multiple_target" in r["check"]]
    assert report["n_fail"] == 0 and len(skipped) == 1 and "NOT checked" in skipped[0]["note"]


def test_duplicate_out_of_range_and_unsorted_doc_ids_are_named(tmp_path):
    s = toy_samples()
    s[2]["doc_id"] = 0
    write_run(tmp_path / "dup", s)
    code, report = audit(tmp_path, tmp_path / "dup")
    assert code == 1 and any("doc_id 0 (line 3" in f and "duplicated" in f for f in failures(report, "no duplicate"))
    s = toy_samples()
    s[2]["doc_id"] = 7
    write_run(tmp_path / "range", s)
    assert any("out of range" in f for f in failures(audit(tmp_path, tmp_path / "range")[1], "in range"))
    s = toy_samples()
    s[0]["doc_id"], s[2]["doc_id"] = 2, 0          # lines in dataset order, labels swapped
    write_run(tmp_path / "order", s)
    bad = failures(audit(tmp_path, tmp_path / "order")[1], "logging order")
    assert len(bad) == 2 and "doc_id 2 (line 1" in bad[0] and "puts doc_id 0 here" in bad[0]


def test_identity_level_names_a_doc_that_is_not_its_data_row_and_renders_prompts(tmp_path):
    write_run(tmp_path / "run", toy_samples())
    data = tmp_path / "data.jsonl"
    rows = [{"q": i, "label": i % 2} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, report = audit(tmp_path, tmp_path / "run", "--tokens", "--data", data)
    assert report["n_fail"] == 0, [r for r in report["checks"] if r["status"] == "FAIL"]   # no --model: not PASS
    assert any(r["check"].startswith("prompt re-rendered") and r["status"] == "PASS" for r in report["checks"])
    rows[1]["q"] = 9
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = failures(audit(tmp_path, tmp_path / "run", "--tokens", "--data", data)[1], "data row")
    assert bad and bad[0].startswith("doc_id 1 (line 2, filter none) doc.q: logged 1, data row 1 has 9")
    tsv = tmp_path / "data.tsv"
    tsv.write_text("q\tlabel\n0\t0\n1\t1\n2\t0\n")
    assert audit(tmp_path, tmp_path / "run", "--tokens", "--data", tsv)[1]["n_fail"] == 0


def declare(run_dir, **config):
    """Set keys of the toy task's dumped config (and n-shot with num_fewshot), as a results file may declare them."""
    p = next(run_dir.glob("*/results_*.json"))
    r = json.loads(p.read_text())
    r["configs"]["toy"].update(config)
    r["n-shot"]["toy"] = config.get("num_fewshot", r["n-shot"]["toy"])
    p.write_text(json.dumps(r))


@pytest.mark.parametrize("setting, says", [
    ({"num_fewshot": 5}, "names no split to draw few-shot documents from"),
    ({"num_fewshot": 5, "fewshot_split": "train"}, "draws from split 'train': pass --fewshot-data toy=FILE"),
    ({"num_fewshot": 5, "validation_split": "dev"}, "6 few-shot documents to draw from 3"),   # --data: 3 rows
    ({"num_fewshot": 5, "validation_split": "dev", "fewshot_config": {"sampler": "odd"}}, "sampler 'odd'"),
])
def test_a_declared_few_shot_never_switches_the_prompt_check_off(tmp_path, capsys, setting, says):
    write_run(tmp_path / "run", toy_samples())
    declare(tmp_path / "run", **setting)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"q": i, "label": i % 2}) + "\n" for i in range(3)))
    code, report = audit(tmp_path, tmp_path / "run", "--tokens", "--data", data)
    rows = {r["check"].split(" ")[0]: r for r in report["checks"] if r["level"] == "identity"}
    assert code == 1 and rows["target"]["status"] == "PASS", capsys.readouterr().out
    assert rows["prompt"]["status"] == "FAIL" and rows["prompt"]["first_failure"].startswith("INCOMPLETE: ")
    assert says in rows["prompt"]["first_failure"]
    assert report["result"].startswith("INCOMPLETE") and "RESULT: PASS" not in capsys.readouterr().out


def test_declared_task_code_not_given_is_skipped_as_incomplete_never_passed(tmp_path, capsys):
    """process_docs is task code (lm-eval logs its source): without --task-code the rows that need it are SKIPPED
    naming the flag, and the requested identity level makes the verdict INCOMPLETE, never PASS."""
    write_run(tmp_path / "run", toy_samples())
    declare(tmp_path / "run", num_fewshot=1, validation_split="dev", process_docs="def f(ds):\n    return ds\n")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"q": i, "label": i % 2}) + "\n" for i in range(3)))
    code, report = audit(tmp_path, tmp_path / "run", "--tokens", "--data", data)
    rows = {r["check"].split(" ")[0]: r for r in report["checks"] if r["level"] == "identity"}
    assert code == 1 and report["n_fail"] == 0 and report["result"].startswith("INCOMPLETE")
    for name in ("prompt", "each"):
        assert rows[name]["status"] == "SKIPPED" and rows[name]["requested"], rows[name]
        assert "process_docs is task code" in rows[name]["note"] and "--task-code" in rows[name]["note"]
    assert rows["target"]["status"] == "PASS"        # a Jinja doc_to_target on the logged doc needs no code


def test_a_forged_target_is_caught_whatever_the_run_declares(tmp_path):
    s = toy_samples()
    s[1]["target"], s[1]["target_hash"] = "0", sha256_text("0")       # doc 1 has label 1
    s[1]["acc"] = 1.0 - s[1]["acc"]
    write_run(tmp_path / "run", s)
    declare(tmp_path / "run", num_fewshot=5)
    code, report = audit(tmp_path, tmp_path / "run", "--tokens")
    assert code == 1 and report["result"] == "FAIL"
    assert failures(report, "target re-rendered") == ["doc_id 1 (line 2, filter none) target: recorded '0', "
                                                      "recomputed '1' (doc_to_target rendered on the logged doc)"]


def test_a_declared_chat_template_without_model_fails_as_incomplete(tmp_path):
    """A chat template renders through the --model directory's template: without --model, INCOMPLETE, never PASS
    (lm-eval writes the template's sha beside it; tests/test_lmeval_chat.py renders real chat runs)."""
    s = toy_samples()
    for x in s:         # a chat run's continuations have no target_delimiter (lm-eval 0.4.9.2 api/task.py:1460-1461)
        for a in x["arguments"].values():
            a["arg_1"] = a["arg_1"][1:] if a["arg_1"].startswith(" ") else a["arg_1"]
    d = write_run(tmp_path / "run", s)
    p = d / f"results_{DATE}.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "chat_template": "{{ messages }}",
                             "chat_template_sha": sha256_text("{{ messages }}")}))
    code, report = audit(tmp_path, tmp_path / "run", "--tokens")
    assert code == 1 and report["result"].startswith("INCOMPLETE")
    assert any("chat template" in f and f.startswith("INCOMPLETE") for f in failures(report, "prompt re-rendered"))
    assert not failures(report, "target re-rendered")


def test_a_system_instruction_is_rendered_before_the_prompt(tmp_path):
    s = toy_samples()
    for x in s:        # without a chat template or a description, 0.4.9.2 puts no delimiter after it
        ctx = "Be brief." + x["arguments"]["gen_args_0"]["arg_0"]
        for a in x["arguments"].values():
            a["arg_0"] = ctx
        x["prompt_hash"] = sha256_text(ctx)
    d = write_run(tmp_path / "run", s)
    p = d / f"results_{DATE}.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "system_instruction": "Be brief.",
                             "system_instruction_sha": sha256_text("Be brief.")}))
    code, report = audit(tmp_path, tmp_path / "run", "--tokens")
    assert report["n_fail"] == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    p.write_text(json.dumps({**json.loads(p.read_text()), "system_instruction": "Be long."}))
    assert len(failures(audit(tmp_path, tmp_path / "run", "--tokens")[1], "prompt re-rendered")) == 6


def test_a_samples_run_is_counted_against_the_selection_passed(tmp_path):
    write_run(tmp_path / "run", [s for s in toy_samples() if s["doc_id"] != 1])        # lm-eval --samples '[0, 2]'
    count = lambda report: next(r for r in report["checks"] if r["check"].startswith("sample count"))  # noqa: E731
    code, report = audit(tmp_path, tmp_path / "run")
    assert code == 1 and "pass its selection to audit.py --samples" in count(report)["first_failure"]
    code, report = audit(tmp_path, tmp_path / "run", "--samples", '{"toy": [0, 2]}')
    assert code == 0 and count(report)["check"] == "sample count vs the --samples selection", report["result"]
    selection = tmp_path / "selection.json"
    selection.write_text('{"toy": [0, 1]}')
    code, report = audit(tmp_path, tmp_path / "run", "--samples", selection)
    assert code == 1 and failures(report, "--samples selection") == [
        "doc_ids [1]: selected by --samples, not logged", "doc_ids [2]: logged, not selected by --samples"]
    code, report = audit(tmp_path, tmp_path / "run", "--samples", '{"toy": [0, 2], "other": [1]}')
    assert code == 1 and failures(report, "task") == [f"--samples other: no such task in {tmp_path / 'run'}"]


@pytest.mark.parametrize("selection, says", [('{"toy": ["a"]}', "--samples: expected {task: [doc_id, ...]}"),
                                             ("[1, 2]", "found [1, 2]"), ("{toy", "--samples: line 1")])
def test_a_malformed_samples_selection_is_refused_with_one_line(tmp_path, selection, says):
    write_run(tmp_path / "run", toy_samples())
    proc = run_cli("audit.py", "--lm-eval", tmp_path / "run", "--samples", selection, "--report", tmp_path / "r.json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr


def test_a_hostile_template_cannot_reach_python(tmp_path):
    d = write_run(tmp_path / "run", toy_samples())
    p = d / f"results_{DATE}.json"
    r = json.loads(p.read_text())
    r["configs"]["toy"]["doc_to_text"] = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    p.write_text(json.dumps(r))
    code, report = audit(tmp_path, tmp_path / "run", "--tokens")
    assert code == 1
    assert any("cannot render (SecurityError" in f for f in failures(report, "prompt re-rendered"))
    r["configs"]["toy"]["doc_to_text"] = "{{ 'x' * 1000000000 }}{{ q }}"
    p.write_text(json.dumps(r))
    code, report = audit(tmp_path, tmp_path / "run", "--tokens")
    assert any("cannot render (SecurityError" in f and "bound" in f for f in failures(report, "prompt re-rendered"))


def test_the_arithmetic_level_runs_without_lm_eval_torch_jinja_or_pyarrow(tmp_path):
    """Importing any of them raises in the child; the audit of a hand-written run still passes."""
    write_run(tmp_path / "run", toy_samples())
    code = ("import sys\n"
            "for m in ('lm_eval', 'torch', 'jinja2', 'pyarrow', 'tokenizers', 'safetensors', 'numpy', 'sklearn'):\n"
            "    sys.modules[m] = None\n"
            "from evidence_audit.cli import main\n"
            f"sys.exit(main(['--lm-eval', {str(tmp_path / 'run')!r}, '--report', {str(tmp_path / 'r.json')!r}]))\n")
    proc = run_cli("-c", code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: PASS" in proc.stdout


# ---- slow: real lm-eval output ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def hflm(model_dir):
    import torch

    import lmeval_runs

    torch.set_num_threads(int(os.environ.get("EVAL_TORCH_THREADS", "1")))
    return lmeval_runs.make_lm(model_dir)


@pytest.fixture(scope="session")
def lmeval_data(prepared_cache):
    return {"sst2": prepared_cache / "data" / "fixture-sentiment" / "validation.parquet",
            "sst2_gen": prepared_cache / "data" / "fixture-sentiment" / "validation.parquet",
            "sst2_ll": prepared_cache / "data" / "fixture-sentiment" / "validation.parquet",
            "mc_taco": prepared_cache / "data" / "fixture-mctaco" / "validation.parquet"}


@pytest.fixture(scope="session")
def clean_run(hflm, model_dir, lmeval_data, tmp_path_factory):
    """sst2, mc_taco, sst2_ll and sst2_gen, the first 9 documents each (9 = two whole MC-TACO question groups)."""
    import lmeval_runs

    tasks = [lmeval_runs.sst2_task(lmeval_data["sst2"]), lmeval_runs.mctaco_task(lmeval_data["mc_taco"]),
             lmeval_runs.loglikelihood_task(lmeval_data["sst2"]), lmeval_runs.generate_task(lmeval_data["sst2"])]
    return lmeval_runs.lm_eval_run(hflm, model_dir, tmp_path_factory.mktemp("lmeval-clean"), tasks, limit=9)


@pytest.fixture(scope="session")
def unsorted_run(hflm, model_dir, lmeval_data, tmp_path_factory):
    import lmeval_runs

    return lmeval_runs.lm_eval_run(hflm, model_dir, tmp_path_factory.mktemp("lmeval-unsorted"),
                                   [lmeval_runs.sst2_task(lmeval_data["sst2"])], samples={"sst2": [6, 1, 4, 3]})


def data_args(data):
    return [a for task, p in data.items() for a in ("--data", f"{task}={p}")]


def all_levels(tmp_path, run, model_dir, data, *more):
    return audit(tmp_path, run, "--forward", "--model", model_dir, *data_args(data), *more)


def levels_failed(report):
    return {r["level"] for r in report["checks"] if r["status"] == "FAIL"}


def every_requested_check_passes(code, report):
    """Exit 0 and PASS: no FAIL and no requested check SKIPPED (the bootstrap stderrs of f1 and mcc included: they
    are recomputed, evidence_audit/lmeval/bootstrap.py)."""
    undone = [r for r in report["checks"] if r["status"] == "SKIPPED" and r.get("requested", True)]
    return code == 0 and not report["n_fail"] and not undone and report["result"].startswith("PASS")


@pytest.mark.slow
def test_clean_real_runs_pass_every_level(clean_run, model_dir, lmeval_data, tmp_path):
    code, report = all_levels(tmp_path, clean_run, model_dir, lmeval_data)
    assert every_requested_check_passes(code, report), [r["first_failure"] or r["note"] for r in report["checks"]
                                                         if r["status"] != "PASS" and r.get("requested", True)]
    assert sorted(report["experiments"]) == ["mc_taco", "sst2", "sst2_gen", "sst2_ll"]
    passed = {(r["experiment"], r["level"]) for r in report["checks"] if r["status"] == "PASS"}
    for task in ("sst2", "mc_taco", "sst2_ll"):
        assert {(task, "arithmetic"), (task, "identity"), (task, "forward")} <= passed
    assert {("sst2_gen", "arithmetic"), ("sst2_gen", "identity")} <= passed
    gen = [r for r in report["checks"] if r["experiment"] == "sst2_gen" and r["check"].startswith("per-sample")]
    assert gen[0]["status"] == "PASS" and gen[0]["items"] == 18        # 9 documents x 2 filters
    assert report["details"]["sst2"]["forward"]["requests"] == 18
    assert report["details"]["sst2"]["forward"]["max_abs_diff"] <= 1e-4
    assert report["details"]["sst2_ll"]["forward"]["requests"] == 9
    aggregates = next(r for r in report["checks"] if r["experiment"] == "sst2_ll" and r["check"].startswith("aggr"))
    assert aggregates["status"] == "PASS" and aggregates["items"] == 2          # acc (mean) and perplexity


@pytest.mark.slow
def test_unsorted_samples_run_names_every_mislabelled_doc_id(unsorted_run, model_dir, lmeval_data, tmp_path):
    code, report = audit(tmp_path, unsorted_run, "--tokens", "--data", lmeval_data["sst2"])
    assert code == 1
    order = failures(report, "logging order", "arithmetic")
    assert sorted(int(f.split()[1]) for f in order) == [1, 3, 6]            # doc_id 4 sits where it belongs
    data = failures(report, "data row", "identity")
    assert {int(f.split()[1]) for f in data} == {1, 3, 6} and any("doc_id 6" in f and "doc.idx: logged 1" in f
                                                                  for f in data)


def forge_targets(r_rows, results, task="sst2"):
    """What a forger does to a multiple_choice task: every wrong answer made the target, then target_hash, the
    per-sample acc, acc_norm, f1 and mcc, task_hashes, the aggregates (sklearn for f1 and mcc, as lm-eval's own
    aggregation calls it) and the stderrs recomputed. Returns the documents forged."""
    from sklearn.metrics import f1_score, matthews_corrcoef

    forged = []
    for r in r_rows:
        lls = [float(x[0]) for x in r["filtered_resps"]]
        conts = [a["arg_1"] for a in r["arguments"].values()]
        pred = max(range(len(lls)), key=lambda j: (lls[j], -j))
        norm = max(range(len(lls)), key=lambda j: (lls[j] / len(conts[j][1:]), -j))
        if pred != int(r["target"]):
            forged.append(r["doc_id"])
        r["target"] = str(pred)
        r["target_hash"] = sha256_text(r["target"])
        r.update(acc=1.0, acc_norm=1.0 if norm == pred else 0.0, f1=[pred, pred], mcc=[pred, pred])
    res = results["results"][task]
    for m in ("acc", "acc_norm"):
        xs = [r[m] for r in r_rows]
        res[f"{m},none"] = statistics.mean(xs)
        res[f"{m}_stderr,none"] = statistics.stdev(xs) / math.sqrt(len(xs))
    golds, preds = zip(*(r["f1"] for r in r_rows))
    res["f1,none"] = float(f1_score(golds, preds))
    res["mcc,none"] = float(matthews_corrcoef(golds, preds))
    # and their bootstrap stderrs, which the audit recomputes: lm-eval's own function, at the run's bootstrap_iters
    from lm_eval.api.metrics import f1_score as lm_f1, matthews_corrcoef as lm_mcc, stderr_for_metric
    for key, fn in (("f1", lm_f1), ("mcc", lm_mcc)):
        res[f"{key}_stderr,none"] = stderr_for_metric(fn, results["config"]["bootstrap_iters"])(
            [tuple(r[key]) for r in r_rows])
    results["task_hashes"][task] = sha256_text("".join(r["doc_hash"] + r["prompt_hash"] + r["target_hash"]
                                                       for r in r_rows))
    return forged


@pytest.mark.slow
def test_a_declared_few_shot_with_a_forged_target_does_not_pass(clean_run, model_dir, lmeval_data, tmp_path):
    """A zero-shot run whose results declare num_fewshot 5: the prompt check FAILs (INCOMPLETE without the
    few-shot split, a mismatch with it), never PASS; and a forged target is named by the target check."""
    def five_shot(r):
        r["configs"]["sst2"]["num_fewshot"], r["n-shot"]["sst2"] = 5, 5
    copy = tampered(clean_run, tmp_path, "sst2", edit_results=five_shot)
    code, report = audit(tmp_path, copy, "--tokens", "--task", "sst2", *data_args(lmeval_data))
    prompt_row = next(r for r in report["checks"] if r["check"].startswith("prompt re-rendered"))
    assert code == 1 and "PASS" not in report["result"] and prompt_row["status"] == "FAIL"
    assert prompt_row["first_failure"].startswith("INCOMPLETE: num_fewshot 5 draws from split 'train'")
    code, report = audit(tmp_path, copy, "--tokens", "--task", "sst2", *data_args(lmeval_data),
                         "--fewshot-data", f"sst2={lmeval_data['sst2']}")
    assert code == 1 and len(failures(report, "prompt re-rendered")) == 18       # a zero-shot context each request

    forged = []
    shutil.rmtree(copy)
    sub = next(p for p in shutil.copytree(clean_run, copy).iterdir() if p.is_dir())
    samples_path, results_path = next(sub.glob("samples_sst2_2*.jsonl")), next(sub.glob("results_*.json"))
    rows = [json.loads(line) for line in samples_path.read_text(encoding="utf-8").splitlines()]
    results = json.loads(results_path.read_text(encoding="utf-8"))
    five_shot(results)
    forged = forge_targets(rows, results)
    samples_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    results_path.write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")
    assert forged and results["results"]["sst2"]["acc,none"] == 1.0
    code, report = all_levels(tmp_path, copy, model_dir, lmeval_data, "--task", "sst2")
    assert code == 1 and levels_failed(report) == {"identity"}           # the forgery is consistent elsewhere
    named = sorted(int(f.split()[1]) for f in failures(report, "target re-rendered", "identity"))
    assert named == sorted(forged)


@pytest.fixture(scope="session")
def selected_run(hflm, model_dir, lmeval_data, tmp_path_factory):
    """An honest --samples run: the selection in dataset order."""
    import lmeval_runs

    return lmeval_runs.lm_eval_run(hflm, model_dir, tmp_path_factory.mktemp("lmeval-selected"),
                                   [lmeval_runs.sst2_task(lmeval_data["sst2"])], samples={"sst2": [1, 3, 4, 6]})


@pytest.mark.slow
def test_an_honest_samples_run_passes_given_its_selection(selected_run, model_dir, lmeval_data, tmp_path):
    code, report = audit(tmp_path, selected_run, "--tokens", "--model", model_dir, *data_args(lmeval_data))
    assert code == 1 and any("4 samples logged" in f for f in failures(report, "sample count"))
    code, report = audit(tmp_path, selected_run, "--tokens", "--model", model_dir, *data_args(lmeval_data),
                         "--samples", '{"sst2": [1, 3, 4, 6]}')
    assert report["n_fail"] == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    count = next(r for r in report["checks"] if r["check"].startswith("sample count"))
    assert count["check"] == "sample count vs the --samples selection" and count["status"] == "PASS"


@pytest.mark.slow
def test_an_unsorted_samples_run_given_its_selection_still_names_the_mislabelled(unsorted_run, lmeval_data, tmp_path):
    code, report = audit(tmp_path, unsorted_run, "--samples", '{"sst2": [6, 1, 4, 3]}')
    assert code == 1 and failures(report, "--samples selection") == []
    assert sorted(int(f.split()[1]) for f in failures(report, "logging order")) == [1, 3, 6]


@pytest.mark.slow
def test_a_flipped_per_sample_metric_is_caught_naming_sample_and_field(clean_run, tmp_path):
    def flip(rows):
        rows[3]["acc"] = 1.0 - rows[3]["acc"]
    code, report = audit(tmp_path, tampered(clean_run, tmp_path, "sst2", flip))
    assert code == 1
    assert any(f.startswith("doc_id 3 (line 4, filter none) acc: recorded") for f in failures(report, "per-sample"))


@pytest.mark.slow
def test_an_edited_aggregate_is_caught(clean_run, tmp_path):
    def edit(r):
        r["results"]["mc_taco"]["acc,none"] += 0.01
    code, report = audit(tmp_path, tampered(clean_run, tmp_path, "mc_taco", edit_results=edit))
    assert code == 1 and levels_failed(report) == {"arithmetic"}
    assert any("results.mc_taco acc,none: recorded" in f for f in failures(report, "aggregates"))


@pytest.mark.slow
def test_a_consistent_loglikelihood_edit_is_caught_by_the_forward_level_only(clean_run, model_dir, lmeval_data,
                                                                           tmp_path):
    def edit(rows):
        lls = [float(r[0][0]) for r in rows[5]["resps"]]
        loser = 1 - max(range(2), key=lambda j: (lls[j], -j))
        new = repr(lls[loser] - 0.25)            # lower the losing choice: acc, acc_norm, f1, mcc unchanged
        rows[5]["resps"][loser][0][0] = new
        rows[5]["filtered_resps"][loser][0] = new
    copy = tampered(clean_run, tmp_path, "sst2", edit)
    code, report = all_levels(tmp_path, copy, model_dir, lmeval_data)
    assert code == 1 and levels_failed(report) == {"forward"}
    moved = failures(report, "re-scored", "forward")
    assert len(moved) == 1 and moved[0].startswith("doc_id 5 (line 6, filter none) resps[")
    assert report["details"]["sst2"]["forward"]["moved"] == [5]


@pytest.mark.slow
def test_two_swapped_docs_are_caught_naming_both(clean_run, model_dir, lmeval_data, tmp_path):
    def swap(rows):
        rows[2]["doc_id"], rows[6]["doc_id"] = rows[6]["doc_id"], rows[2]["doc_id"]
    code, report = audit(tmp_path, tampered(clean_run, tmp_path, "sst2", swap), "--tokens",
                         *data_args(lmeval_data))
    assert code == 1
    assert failures(report, "task_hashes") == []            # file order unchanged: the hashes cannot see it
    for check, level in (("logging order", "arithmetic"), ("data row", "identity")):
        assert {int(f.split()[1]) for f in failures(report, check, level)} == {2, 6}


@pytest.mark.slow
def test_a_deleted_sample_is_caught(clean_run, tmp_path):
    code, report = audit(tmp_path, tampered(clean_run, tmp_path, "sst2", lambda rows: rows.pop(4)))
    assert code == 1 and levels_failed(report) == {"arithmetic"}
    assert any("8 samples logged, n-samples.effective 9" in f for f in failures(report, "sample count"))
    assert any(f.startswith("doc_ids [4]: missing") for f in failures(report, "sample count"))
    assert failures(report, "task_hashes") and failures(report, "aggregates")


@pytest.mark.slow
def test_a_limit_that_splits_a_question_group_is_named(hflm, model_dir, lmeval_data, tmp_path):
    import lmeval_runs

    run = lmeval_runs.lm_eval_run(hflm, model_dir, tmp_path / "cut", [lmeval_runs.mctaco_task(lmeval_data["mc_taco"])],
                                  limit=7)
    code, report = audit(tmp_path, run, "--tokens", "--data", lmeval_data["mc_taco"])
    assert code == 1 and levels_failed(report) == {"identity"}
    cut = failures(report, "question groups (data)")
    assert len(cut) == 1 and "2 of its 4 documents logged" in cut[0] and cut[0].startswith("group question '")
    alone = [r for r in report["checks"] if r["check"] == "limit vs question groups (run alone)"]
    assert alone[0]["status"] == "SKIPPED" and "limit 7 < 62" in alone[0]["note"]


@pytest.mark.slow
def test_forward_sample_says_it_is_a_sample(clean_run, model_dir, lmeval_data, tmp_path):
    code, report = all_levels(tmp_path, clean_run, model_dir, lmeval_data, "--sample", "4", "--task", "sst2",
                              "--sample-seed", "reader-challenge-1")
    assert every_requested_check_passes(code, report) and report["experiments"] == ["sst2"]
    row = next(r for r in report["checks"] if r["check"].startswith("loglikelihoods re-scored"))
    assert row["items"] == 8 and "a sample: 4 of 9 documents (seed reader-challenge-1, given with --sample-seed" \
        in row["note"] and "if at least " in row["note"], row["note"]
    assert report["sample"] == {"n": 4, "seed": "reader-challenge-1", "seed_source": "given with --sample-seed",
                                "salt": sampling.SALT}
    drawn = report["details"]["sst2"]["forward"]["sample"]
    assert drawn["population"] == 9 and drawn["drawn"] == 4 and drawn["k_for_p99"] == 5     # 1 - C(4,4)/C(9,4) >= .99


# ---- generate_until: the generations re-generated (evidence_audit/lmeval/generate.py) -----------------------------

def rows_of(report, task, check):
    return [r for r in report["checks"] if r["experiment"] == task and r["check"].startswith(check)]


@pytest.mark.slow
def test_an_honest_generate_until_run_is_re_generated_token_for_token(clean_run, model_dir, lmeval_data, tmp_path):
    code, report = all_levels(tmp_path, clean_run, model_dir, lmeval_data)
    regen = rows_of(report, "sst2_gen", "generations re-generated")
    assert regen[0]["status"] == "PASS" and regen[0]["items"] == 9, regen
    assert report["details"]["sst2_gen"]["forward"]["identical"] == 9        # batch size 1: the same tensors
    metrics = rows_of(report, "sst2_gen", "filters and metrics recomputed from the re-generated")
    assert metrics[0]["status"] == "PASS" and metrics[0]["items"] == 18, metrics


def edit_generation(rows, doc_id, new_text, exact=None):
    """Every filter's line of `doc_id`: resps replaced by new_text (filtered_resps and metrics kept, or set)."""
    for r in rows:
        if r["doc_id"] == doc_id:
            r["resps"] = [[new_text]]
            if exact is not None:
                r["filtered_resps"] = [exact[r["filter"]]]
                r["exact_match"] = float(exact[r["filter"]].lower().strip(".!") == r["target"].lower())


@pytest.mark.slow
def test_a_forged_generation_whose_filter_output_is_kept_fails_at_the_forward_level(clean_run, model_dir,
                                                                                    lmeval_data, tmp_path):
    rows = [json.loads(line) for line in next(next(p for p in clean_run.iterdir() if p.is_dir()).glob(
        "samples_sst2_gen_2*.jsonl")).read_text().splitlines()]
    logged = next(r for r in rows if r["doc_id"] == 4)["resps"][0][0]
    word = next(r for r in rows if r["doc_id"] == 4 and r["filter"] == "word")["filtered_resps"][0]
    assert word in ("positive", "negative"), logged     # a regex the forger keeps satisfied
    forged = f" {word}, surely {word}"
    copy = tampered(clean_run, tmp_path, "sst2_gen", lambda rs: edit_generation(rs, 4, forged, {
        "word": word, "plain": forged.lower().replace(" ", "")}))
    code, report = all_levels(tmp_path, copy, model_dir, lmeval_data)
    regen = rows_of(report, "sst2_gen", "generations re-generated")[0]
    assert code == 1 and regen["status"] == "FAIL", regen
    assert regen["first_failure"].startswith("doc_id 4: re-generated") and "top-2 margin there" in \
        regen["first_failure"], regen


@pytest.mark.slow
def test_a_consistently_forged_answer_passes_every_other_level_and_fails_re_generation(clean_run, model_dir,
                                                                                        lmeval_data, tmp_path):
    """The forger's whole job: a wrong answer made right in resps, filtered_resps, exact_match, the aggregate and
    its stderr, so that only generating again can tell."""
    sub = next(p for p in clean_run.iterdir() if p.is_dir())
    rows = [json.loads(line) for line in next(sub.glob("samples_sst2_gen_2*.jsonl")).read_text().splitlines()]
    doc = next(r["doc_id"] for r in rows if r["filter"] == "word" and r["exact_match"] == 0.0)
    target = next(r["target"] for r in rows if r["doc_id"] == doc)

    def forge(rs):
        edit_generation(rs, doc, f" {target}", {"word": target, "plain": target})

    def reseal(results):
        forged = [json.loads(line) for line in next(sub.glob("samples_sst2_gen_2*.jsonl")).read_text().splitlines()]
        forge(forged)
        for name in ("word", "plain"):
            xs = [r["exact_match"] for r in forged if r["filter"] == name]
            results["results"]["sst2_gen"][f"exact_match,{name}"] = statistics.mean(xs)
            results["results"]["sst2_gen"][f"exact_match_stderr,{name}"] = statistics.stdev(xs) / math.sqrt(len(xs))

    copy = tampered(clean_run, tmp_path, "sst2_gen", forge, reseal)
    code, report = audit(tmp_path, copy, *data_args(lmeval_data), "--tokens", "--model", model_dir)
    assert "sst2_gen" not in {r["experiment"] for r in report["checks"] if r["status"] == "FAIL"}, \
        [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    code, report = all_levels(tmp_path, copy, model_dir, lmeval_data)
    assert code == 1 and {(r["experiment"], r["level"]) for r in report["checks"] if r["status"] == "FAIL"} == \
        {("sst2_gen", "forward")}, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    assert rows_of(report, "sst2_gen", "generations re-generated")[0]["first_failure"].startswith(f"doc_id {doc}:")


@pytest.mark.slow
def test_a_sampled_generation_run_is_incomplete_at_the_forward_level_never_pass(clean_run, model_dir, lmeval_data,
                                                                             tmp_path):
    def sampled(rows):
        for r in rows:
            r["arguments"]["gen_args_0"]["arg_1"]["do_sample"] = True
            r["arguments"]["gen_args_0"]["arg_1"]["temperature"] = 0.8

    def config(results):
        results["configs"]["sst2_gen"]["generation_kwargs"].update(do_sample=True, temperature=0.8)

    copy = tampered(clean_run, tmp_path, "sst2_gen", sampled, config)
    code, report = all_levels(tmp_path, copy, model_dir, lmeval_data)
    regen = rows_of(report, "sst2_gen", "generations re-generated")[0]
    assert code == 1 and regen["status"] == "SKIPPED" and "sampled run" in regen["note"], regen
    assert report["result"].startswith("INCOMPLETE"), report["result"]


@pytest.mark.slow
def test_the_forger_of_the_published_ranking_fails_over_fresh_seeds(clean_run, model_dir, lmeval_data, tmp_path):
    """The hostile tester's forgery of the earlier published ranking: 2.0 nats added to the log-likelihood of every
    sst2_ll document outside its first 4 (5 of 9). Each audit draws 4 documents from a fresh seed; the bound says
    one in 126 draws misses all 5. Measured here over 8 fresh seeds: every one FAILs at the forward level."""
    import hashlib

    published = sorted(range(9), key=lambda d: hashlib.sha256(f"lmeval-forward-sample-v1:sst2_ll:{d}".encode())
                       .hexdigest())
    outside = set(published[4:])

    def forge(rows):
        for r in rows:
            if r["doc_id"] in outside:
                ll = float(r["resps"][0][0][0]) + 2.0
                r["resps"][0][0][0] = repr(ll)
                r["filtered_resps"][0][0] = repr(ll)
                r["perplexity"] = ll

    copy = tampered(clean_run, tmp_path, "sst2_ll", forge)
    seeds, failed = [], 0
    for _ in range(8):
        code, report = all_levels(tmp_path, copy, model_dir, lmeval_data, "--task", "sst2_ll", "--sample", "4")
        row = rows_of(report, "sst2_ll", "loglikelihoods re-scored")[0]
        seeds.append(report["sample"]["seed"])
        failed += row["status"] == "FAIL"
        assert report["sample"]["seed_source"] == "fresh at audit time"
    assert len(set(seeds)) == 8 and failed == 8, (failed, seeds)


@pytest.mark.slow
def test_a_forged_exact_match_fails_at_the_arithmetic_level(clean_run, model_dir, lmeval_data, tmp_path):
    def flip(rows):
        r = next(r for r in rows if r["doc_id"] == 2 and r["filter"] == "word")
        r["exact_match"] = 1.0 - r["exact_match"]

    copy = tampered(clean_run, tmp_path, "sst2_gen", flip)
    code, report = audit(tmp_path, copy, "--task", "sst2_gen")
    said = failures(report, "per-sample", "arithmetic")
    assert code == 1 and any(f.startswith("doc_id 2 (line") and " exact_match: recorded " in f for f in said), said
