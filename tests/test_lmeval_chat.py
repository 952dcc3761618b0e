"""audit.py --lm-eval on REAL chat-template runs of lm-eval 0.4.9.2 (tests/fixtures/lmeval_chat/, made by
tools/make_lmeval_chat_fixtures.py with the lm_eval CLI: a tiny random Llama, a byte-level tokenizer and a chat
template written for it, two local tasks): every request's context is rendered again through the --model
directory's chat template by the audit's own code (evidence_audit/lmeval/prompt.py, jinja2, no lm_eval, no
transformers) and must equal lm-eval's; a forged context, chat template, its sha256, system instruction or
multiturn flag never PASS, nor a chat run audited without --model.

The second half checks the renderer against lm-eval's own fewshot_context and HFLM.apply_chat_template on a
transformers tokenizer (no model), for settings and templates the fixtures do not cover."""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from evidence_audit.cli import main
from evidence_audit.reading import sha256_text

FIX = Path(__file__).parent / "fixtures" / "lmeval_chat"
MODEL, TASK = FIX / "model", FIX / "task"
RUNS = ("chat", "chat_system", "chat_fewshot", "chat_multiturn")
TASKS = ("toy_chat", "toy_prefix")
SPACED = ("toy_space", "toy_space_prefix")     # run chat_spaced: the default target_delimiter " "
SPLITS = ["--data", TASK / "validation.jsonl", "--fewshot-data", TASK / "train.jsonl"]


def audit(tmp_path, run, *args):
    report = tmp_path / "report.json"
    code = main(["--lm-eval", str(run), *map(str, args), "--report", str(report)])
    return code, json.loads(report.read_text())


def rows(report, check_start, level="identity"):
    return [r for r in report["checks"] if r["check"].startswith(check_start) and r["level"] == level]


def levels_failed(report):
    return {r["level"] for r in report["checks"] if r["status"] == "FAIL"}


def copy_run(run, tmp_path, tasks=TASKS):
    """A copy of the fixture run: (its directory, its samples files by task, its results file)."""
    copy = tmp_path / "run"
    shutil.copytree(FIX / "runs" / run, copy)
    sub = next(p for p in copy.iterdir() if p.is_dir())
    return copy, {t: next(sub.glob(f"samples_{t}_2*.jsonl")) for t in tasks}, next(sub.glob("results_*.json"))


def rewrite(samples, results, edit_rows=None, edit_results=None):
    """Edit the copy as a forger would: the lines and/or the results, then prompt_hash and task_hashes again."""
    r = json.loads(results.read_text(encoding="utf-8"))
    for task, path in samples.items():
        lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
        if edit_rows:
            edit_rows(task, lines)
        for x in lines:
            x["prompt_hash"] = sha256_text(x["arguments"]["gen_args_0"]["arg_0"])
        r["task_hashes"][task] = sha256_text("".join(x["doc_hash"] + x["prompt_hash"] + x["target_hash"]
                                                     for x in lines))
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    if edit_results:
        edit_results(r)
    results.write_text(json.dumps(r, indent=2, ensure_ascii=False), encoding="utf-8")


def test_the_fixtures_are_chat_runs_as_their_names_say():
    for run in RUNS:
        sub = next((FIX / "runs" / run).iterdir())
        r = json.loads(next(sub.glob("results_*.json")).read_text())
        assert r["chat_template"] == (MODEL / "chat_template.jinja").read_text()
        assert r["fewshot_as_multiturn"] is (run == "chat_multiturn")
        assert (r["system_instruction"] is not None) is (run == "chat_system")
        for task in TASKS:
            first = json.loads(next(sub.glob(f"samples_{task}_*.jsonl")).read_text().splitlines()[0])
            ctx = first["arguments"]["gen_args_0"]["arg_0"]
            assert ctx.startswith("<s>") and ctx.count("### User:") == (3 if run == "chat_multiturn" else 1)
            assert ctx.endswith("### Assistant: Reply:" if task == "toy_prefix" else "### Assistant:")


@pytest.mark.parametrize("run", RUNS)
def test_every_context_of_a_real_chat_run_is_rendered_again(run, tmp_path):
    code, report = audit(tmp_path, FIX / "runs" / run, "--tokens", "--model", MODEL, *SPLITS)
    assert code == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    prompt_rows = rows(report, "prompt re-rendered")
    assert [(r["experiment"], r["status"], r["items"]) for r in prompt_rows] == [(t, "PASS", 6) for t in TASKS]
    assert all("chat template" in r["note"] for r in prompt_rows)
    assert all("(few-shot as multiturn)" in r["note"] for r in prompt_rows) is (run == "chat_multiturn")
    chat_rows = rows(report, "chat template and system instruction")
    assert [r["status"] for r in chat_rows] == ["PASS", "PASS"]
    assert chat_rows[0]["note"].endswith("chat_template.jinja")


def test_a_chat_run_builds_its_continuations_without_the_target_delimiter(tmp_path):
    """lm-eval 0.4.9.2 with a chat template drops target_delimiter from multiple_choice continuations, the
    unconditional ones of acc_mutual_info too (api/task.py:1459-1461, 1492-1494): the real run of two tasks with the
    default " " logs "yes"/"no", and the audit recomputes every value and context from that."""
    sub = next((FIX / "runs" / "chat_spaced").iterdir())
    r = json.loads(next(sub.glob("results_*.json")).read_text())
    assert r["chat_template"] is not None
    for task in SPACED:
        assert r["configs"][task]["target_delimiter"] == " "
        for line in next(sub.glob(f"samples_{task}_2*.jsonl")).read_text().splitlines():
            assert {a["arg_1"] for a in json.loads(line)["arguments"].values()} == {"yes", "no"}
    assert "acc_mutual_info,none" in r["results"]["toy_space"]
    code, report = audit(tmp_path, FIX / "runs" / "chat_spaced", "--tokens", "--model", MODEL, *SPLITS)
    assert code == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    for check, level in (("per-sample metrics recomputed", "arithmetic"), ("prompt re-rendered", "identity")):
        assert [(r["experiment"], r["status"]) for r in rows(report, check, level)] == [(t, "PASS") for t in SPACED]


@pytest.mark.parametrize("version, fails", [
    ("0.4.10", {"toy_space_prefix": "a continuation does not start with ' ', the config's target_delimiter (lm-eval "
                                    "0.4.10 with a chat template after gen_prefix 'Reply:')"}),
    ("0.4.5", {"toy_space": "arguments: acc_mutual_info, but not 2 conditional requests followed by their 2 "
                            "unconditional ones ('' context, continuation '' + choice) as lm-eval 0.4.5 makes them",
               "toy_space_prefix": "a continuation does not start with ' ', the config's target_delimiter (lm-eval "
                                   "0.4.5 with a chat template)"}),
    ("no chat", {"toy_space": "arguments: acc_mutual_info, but not 2 conditional requests followed by their 2 "
                              "unconditional ones ('' context, continuation ' ' + choice) as lm-eval 0.4.9.2 makes "
                              "them",
                 "toy_space_prefix": "a continuation does not start with ' ', the config's target_delimiter"}),
])
def test_the_continuations_delimiter_follows_each_releases_chat_rule(version, fails, tmp_path):
    """The real 0.4.9.2 chat run relabelled (its files edited as that release writes them): 0.4.10 on keeps the
    delimiter after a gen_prefix that does not end with whitespace, 0.4.5 keeps it always (versions.CHAT_DELIMITER),
    and without a chat template it is the config's: where that release would have logged " yes", the audit names the
    sample (the files' hashes are rewritten as a forger would)."""
    copy, samples, results = copy_run("chat_spaced", tmp_path, SPACED)

    def relabel(r):
        if version == "no chat":
            r.update(chat_template=None, chat_template_sha=None)
        elif version == "0.4.5":
            r.pop("lm_eval_version")
        else:
            r["lm_eval_version"] = version
            r.pop("start_time"), r.pop("end_time")

    def unlogged(task, lines):      # 0.4.5 logs no `filter` and no `metrics`
        for x in lines if version == "0.4.5" else []:
            x.pop("filter"), x.pop("metrics")
    rewrite(samples, results, unlogged, relabel)
    code, report = audit(tmp_path, copy)
    failed = {r["experiment"]: r["first_failure"] for r in rows(report, "per-sample metrics", "arithmetic")
              if r["status"] == "FAIL"}
    assert code == 1 and set(failed) == set(fails), failed
    for task, says in fails.items():
        assert failed[task].startswith("doc_id 0 (line 1, filter none) ") and failed[task].endswith(says), failed


@pytest.mark.slow
def test_the_forward_level_rescores_a_chat_run(tmp_path):
    code, report = audit(tmp_path, FIX / "runs" / "chat_multiturn", "--forward", "--model", MODEL, *SPLITS)
    assert code == 0, [r["first_failure"] for r in report["checks"] if r["status"] == "FAIL"]
    assert [r["status"] for r in rows(report, "loglikelihoods re-scored", "forward")] == ["PASS", "PASS"]


def test_a_chat_run_without_model_is_incomplete_never_pass(tmp_path, capsys):
    code, report = audit(tmp_path, FIX / "runs" / "chat", "--tokens", *SPLITS)
    assert code == 1 and report["result"].startswith("INCOMPLETE")
    # the RESULT line counts those rows as undecided, not as failures of the run
    result = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("RESULT: "))
    assert f", 0 failed, {report['n_incomplete']} undecided (INCOMPLETE rows)," in result, result
    for r in rows(report, "prompt re-rendered") + rows(report, "chat template and system"):
        assert r["status"] == "FAIL" and r["first_failure"].startswith(
            "INCOMPLETE: the run applied a chat template (the results' chat_template): pass --model DIR")


def test_a_forged_word_in_one_context_fails_at_the_identity_level(tmp_path):
    copy, samples, results = copy_run("chat_multiturn", tmp_path)

    def one_word(task, lines):
        if task == "toy_chat":
            for a in lines[3]["arguments"].values():      # both requests of doc 3 carry the context
                a["arg_0"] = a["arg_0"].replace("### User: Can a", "### User: Could a", 1)
    rewrite(samples, results, one_word)
    code, report = audit(tmp_path, copy, "--tokens", "--model", MODEL, *SPLITS)
    assert code == 1 and levels_failed(report) == {"identity"}
    bad = [f for r in rows(report, "prompt re-rendered") for f in r["failures"]]
    assert len(bad) == 2 and all(f.startswith("doc_id 3 (line 4, filter none) arguments.gen_args_") for f in bad)


def test_a_forged_chat_template_sha_fails(tmp_path):
    copy, samples, results = copy_run("chat", tmp_path)
    rewrite(samples, results, edit_results=lambda r: r.update(chat_template_sha=sha256_text("another template")))
    code, report = audit(tmp_path, copy, "--tokens", "--model", MODEL, *SPLITS)
    assert code == 1 and levels_failed(report) == {"identity"}
    bad = [f for r in rows(report, "chat template and system") for f in r["failures"]]
    assert len(bad) == 2 and all(f.startswith("results chat_template_sha: recorded '") for f in bad)
    assert {r["status"] for r in rows(report, "prompt re-rendered")} == {"PASS"}      # the contexts are lm-eval's


def test_a_logged_template_other_than_the_tokenizers_fails_even_with_its_sha(tmp_path):
    copy, samples, results = copy_run("chat", tmp_path)

    def other(r):
        r["chat_template"] = r["chat_template"].replace("### ", "## ")
        r["chat_template_sha"] = sha256_text(r["chat_template"])
    rewrite(samples, results, edit_results=other)
    code, report = audit(tmp_path, copy, "--tokens", "--model", MODEL, *SPLITS)
    bad = [f for r in rows(report, "chat template and system") for f in r["failures"]]
    assert code == 1 and len(bad) == 2 and all(f.startswith("results chat_template: logged ") for f in bad)


@pytest.mark.parametrize("run, forge, check", [
    ("chat_system", {"system_instruction": "Answer with two words.",
                     "system_instruction_sha": sha256_text("Answer with two words.")}, "prompt re-rendered"),
    ("chat_system", {"system_instruction_sha": sha256_text("Answer with two words.")}, "chat template and system"),
    ("chat_multiturn", {"fewshot_as_multiturn": False}, "prompt re-rendered"),
    ("chat_fewshot", {"fewshot_as_multiturn": True}, "prompt re-rendered"),
    ("chat", {"chat_template": None, "chat_template_sha": None}, "prompt re-rendered"),
])
def test_a_forged_chat_setting_fails(run, forge, check, tmp_path):
    copy, samples, results = copy_run(run, tmp_path)
    rewrite(samples, results, edit_results=lambda r: r.update(forge))
    code, report = audit(tmp_path, copy, "--tokens", "--model", MODEL, *SPLITS)
    assert code == 1 and levels_failed(report) == {"identity"} and report["result"].startswith("FAIL")
    assert {r["status"] for r in rows(report, check)} == {"FAIL"}
    assert not [f for r in rows(report, check) for f in r["failures"] if f.startswith("INCOMPLETE")]


# ---- the renderer against lm-eval's own fewshot_context and HFLM.apply_chat_template, no model ----------------

DOCS = [{"text": f"item {i}", "label": i % 2, "golds": [f"g{i}", "x"]} for i in range(10)]
BASE = {"task": "toy_chat_unit", "output_type": "multiple_choice", "doc_to_text": "{{text}}?",
        "doc_to_target": "label", "doc_to_choice": ["no", "yes"], "target_delimiter": "",
        "metric_list": [{"metric": "acc"}]}
# Templates written here, each with a feature of transformers' rendering: trim_blocks/lstrip_blocks, a system turn
# refused with raise_exception (lm-eval then drops it), tojson, loop controls, the {% generation %} tag and the pad
# token lm-eval sets.
TEMPLATES = {
    "plain": (MODEL / "chat_template.jinja").read_text(),
    "no_system": "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system turn') }}{% endif %}"
                 "<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}{% if add_generation_prompt %}<assistant>"
                 "{% endif %}",
    "json": "{% for m in messages %}{% if loop.index > 40 %}{% break %}{% endif %}{{ m | tojson }}\n"
            "{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endif %}"
            "{% endfor %}{{ eos_token if add_generation_prompt else pad_token }}",
}


def tokenizer_dir(tmp_path, template, where):
    """The fixture's tokenizer files with `template` as chat_template.jinja, tokenizer_config.json's string, or
    tokenizer_config.json's list of named templates (its "default")."""
    d = tmp_path / f"tok-{where}"
    d.mkdir()
    for name in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copy(MODEL / name, d / name)
    cfg = json.loads((MODEL / "tokenizer_config.json").read_text())
    if where == "jinja":
        (d / "chat_template.jinja").write_text(template)
    elif where == "config":
        cfg["chat_template"] = template
    else:
        cfg["chat_template"] = [{"name": "other", "template": "{{ 1 / 0 }}"}, {"name": "default", "template": template}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def lm_eval_contexts(cfg, splits, tok, system=None, multiturn=False, seed=1234):
    """Every evaluated document's context as lm-eval 0.4.9.2 builds it with apply_chat_template: its own task
    class and its own HFLM.apply_chat_template, bound to a transformers tokenizer (the only part of HFLM it uses)
    that has been through configure_pad_token as HFLM.__init__ puts it."""
    import datasets
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.utils import configure_pad_token

    lm = SimpleNamespace(tokenizer=configure_pad_token(tok), chat_template_args={})
    served = datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()})
    task = ConfigurableTask(config={**cfg, "custom_dataset": lambda **_: served})
    task.set_fewshot_seed(seed)
    out = [task.fewshot_context(doc, cfg.get("num_fewshot", 0), system_instruction=system, apply_chat_template=True,
                                fewshot_as_multiturn=multiturn, gen_prefix=task.doc_to_prefix(doc),
                                chat_template=lambda chat, add_generation_prompt=True:
                                HFLM.apply_chat_template(lm, chat, add_generation_prompt))
           for doc in task.eval_docs]
    return out, json.loads(json.dumps(task.dump_config(), default=str))


@pytest.mark.slow          # imports and runs lm-eval's task code (no model): about 25 s for all 36
@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("where", ["jinja", "config", "config-list"])
@pytest.mark.parametrize("cfg, splits, system, multiturn", [
    ({**BASE, "training_split": "train", "validation_split": "validation", "num_fewshot": 3,
      "description": "About {{ text }}.", "gen_prefix": "So:"},
     {"train": DOCS[:6], "validation": DOCS[6:]}, "Be brief.", False),
    ({**BASE, "training_split": "train", "validation_split": "validation", "num_fewshot": 2},
     {"train": DOCS[:6], "validation": DOCS[6:]}, None, True),
    ({**BASE, "test_split": "test", "fewshot_split": "test", "num_fewshot": 2, "gen_prefix": "A{{ '' }}",
      "doc_to_target": "golds", "doc_to_choice": None, "output_type": "generate_until",
      "metric_list": [{"metric": "exact_match"}], "fewshot_config": {"sampler": "first_n"}},
     {"test": DOCS}, "Hi.", True),
    ({**BASE, "validation_split": "validation", "num_fewshot": 0}, {"validation": DOCS[:4]}, None, False),
])
def test_chat_contexts_equal_lm_evals_own(template, where, cfg, splits, system, multiturn, tmp_path):
    from transformers import PreTrainedTokenizerFast

    from evidence_audit.lmeval import prompt

    d = tokenizer_dir(tmp_path, TEMPLATES[template], where)
    want, dumped = lm_eval_contexts(cfg, splits, PreTrainedTokenizerFast.from_pretrained(d), system, multiturn)
    kind, source = prompt.fewshot_source(dumped)
    render = prompt.Renderer(dumped, {"system_instruction": system, "fewshot_as_multiturn": multiturn},
                             {"fewshot_seed": 1234}, splits[source] if dumped.get("num_fewshot") else [],
                             prompt.ChatTemplate(d, "pretrained=x"))
    assert [render.context(doc) for doc in splits[prompt.eval_split(dumped)]] == want


def test_a_template_calling_strftime_now_is_unrenderable(tmp_path):
    from evidence_audit.lmeval import prompt

    chat = prompt.ChatTemplate(tokenizer_dir(tmp_path, "{{ strftime_now('%d %b') }}", "jinja"), None)
    with pytest.raises(prompt.Unrenderable, match="strftime_now"):
        chat.render([{"role": "user", "content": "hi"}], True)


def test_enable_thinking_reaches_the_template_as_lm_eval_passes_it(tmp_path):
    from evidence_audit.lmeval import prompt

    d = tokenizer_dir(tmp_path, "{{ enable_thinking is defined and enable_thinking }}", "jinja")
    say = lambda args: prompt.ChatTemplate(d, args).render([{"role": "user", "content": "x"}], True)  # noqa: E731
    assert [say("pretrained=m"), say("pretrained=m,enable_thinking=True"), say("enable_thinking=false")] == \
        ["False", "True", "False"]


def test_the_template_is_the_one_the_tokenizer_would_pick(tmp_path):
    from evidence_audit.lmeval import prompt

    d = tokenizer_dir(tmp_path, "from the file", "jinja")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": "from the config"}))
    assert prompt.ChatTemplate(d, None).text == "from the file"        # a template file wins over the config entry
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "tools.jinja").write_text("named")
    assert prompt.ChatTemplate(d, None).text == "from the file"        # ... and is the default of several
    (d / "chat_template.jinja").unlink()
    with pytest.raises(prompt.Unrenderable, match="no default"):
        prompt.ChatTemplate(d, None)
    shutil.rmtree(d / "additional_chat_templates")
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": [{"name": "a", "template": "x"}]}))
    with pytest.raises(prompt.Unrenderable, match="no default"):
        prompt.ChatTemplate(d, None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(prompt.Unrenderable, match="has no chat template"):
        prompt.ChatTemplate(d, None)
