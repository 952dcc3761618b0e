"""Untrusted templates and fields cannot exhaust the audit (issue 39, item 11): a task template of an lm-eval run or
the chat template of a --model directory is rendered in a worker process under RLIMIT_AS / RLIMIT_CPU and a
wall-clock budget (evidence_audit/templates.py), and a run's bootstrap_iters is bounded by a stated budget
(evidence_audit/lmeval/bootstrap.py). Each hostile input gives its row INCOMPLETE (or SKIPPED) with one line naming
the bound, the audit returns in seconds, and the worker's limits are the ones applied."""
import json
import shutil
import time

import pytest

from conftest import run_cli
from evidence_audit import templates
from evidence_audit.lmeval import bootstrap
from evidence_audit.reading import sha256_text
from test_lmeval_audit import DATE, audit, toy_samples, write_run
from test_lmeval_chat import MODEL, SPLITS, copy_run, rewrite

LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
REDOS = "{{ ('a' * 40 + '!') | regex_replace('(a+)+$', '') }}"
CENTER = '{{ "x" | center(3000000000) }}'
OUTPUT = "{% for i in range(100000) %}{{ 'x' * 65536 }}{% endfor %}"      # 6.5 GB of text, 64 KiB at a time
SAYS = {LOOPS: "over the audit's time budget", REDOS: "over the audit's time budget",
        CENTER: f"over the audit's memory bound of {templates.RENDER_MEMORY >> 20} MiB (templates.RENDER_MEMORY)",
        OUTPUT: f"a rendered text of over {templates.MAX_RENDER_CHARS} characters (templates.MAX_RENDER_CHARS)"}
# the audit's wall clock on a hostile template: the budget, the worker's start, the audit around it (a loaded CI box)
PROMPT = templates.RENDER_SECONDS + 20


# the process's own peak resident memory in kB (VmHWM: ru_maxrss would keep the pytest worker's across the exec)
HWM_CODE = ("def HWM():\n"
            "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1])\n")


def identity_row(report, check_start):
    row, = [r for r in report["checks"] if r["level"] == "identity" and r["check"].startswith(check_start)]
    return row


def undecided(row, says):
    """The row FAILs as INCOMPLETE on one line that names the bound, and says nothing else."""
    return (row["status"] == "FAIL" and row["n_failures"] == 1 and "\n" not in row["first_failure"]
            and row["first_failure"].startswith("INCOMPLETE: rendering the templates of ") and says in
            row["first_failure"] and row["first_failure"].endswith("; NOT checked"))


def hostile_run(tmp_path, doc_to_text):
    d = write_run(tmp_path / "run", toy_samples())
    p = d / f"results_{DATE}.json"
    r = json.loads(p.read_text())
    r["configs"]["toy"]["doc_to_text"] = doc_to_text
    p.write_text(json.dumps(r))
    return tmp_path / "run"


@pytest.mark.parametrize("spec", [LOOPS, REDOS, CENTER, OUTPUT], ids=["loops", "redos", "center", "output"])
def test_a_hostile_doc_to_text_is_incomplete_on_one_line_and_the_audit_returns(tmp_path, spec):
    start = time.monotonic()
    code, report = audit(tmp_path, hostile_run(tmp_path, spec + "{{ q }}"), "--tokens")
    took = time.monotonic() - start
    assert code == 1 and report["result"].startswith("INCOMPLETE"), report["result"]
    assert undecided(identity_row(report, "prompt re-rendered"), SAYS[spec]), identity_row(report, "prompt")
    assert identity_row(report, "target re-rendered")["status"] == "PASS"     # doc_to_target is a field: rendered
    assert took < PROMPT, took
    if spec in (CENTER, OUTPUT):        # no waiting: the worker's limit refuses the allocation, the cap the text
        assert took < 10, took


def test_a_hostile_doc_to_target_stops_the_task_at_the_first_bound(tmp_path):
    """Every render of the task after the bound raises at once: one INCOMPLETE line per row, no wait per sample."""
    d = write_run(tmp_path / "run", toy_samples())
    p = d / f"results_{DATE}.json"
    r = json.loads(p.read_text())
    r["configs"]["toy"]["doc_to_target"] = LOOPS + "{{ label }}"
    p.write_text(json.dumps(r))
    start = time.monotonic()
    code, report = audit(tmp_path, tmp_path / "run", "--tokens")
    assert time.monotonic() - start < PROMPT
    assert undecided(identity_row(report, "target re-rendered"), SAYS[LOOPS])
    assert undecided(identity_row(report, "prompt re-rendered"), SAYS[LOOPS])      # the same bound, at once
    assert code == 1 and report["result"].startswith("INCOMPLETE")


def test_a_huge_rendered_literal_is_not_parsed_by_the_audit(tmp_path):
    """doc_to_choice renders 8 Mi characters of "[0,0,...]": parsing it would take the audit 21 s and 3.7 GB; it is
    refused at prompt.MAX_LITERAL_CHARS, the row INCOMPLETE (the doc_to_choice of a multiple_choice prompt is read
    only for few-shot examples: here drawn from a fewshot_config list)."""
    from evidence_audit.lmeval.prompt import MAX_LITERAL_CHARS

    d = write_run(tmp_path / "run", toy_samples())
    p = d / f"results_{DATE}.json"
    r = json.loads(p.read_text())
    r["configs"]["toy"].update(doc_to_choice="[{% for i in range(100000) %}{{ '0,' * 40 }}{% endfor %}0]",
                               num_fewshot=1, fewshot_config={"samples": [{"q": 7, "label": 0}, {"q": 8, "label": 1}]})
    p.write_text(json.dumps(r))
    start = time.monotonic()
    code, report = audit(tmp_path, tmp_path / "run", "--tokens")
    row = identity_row(report, "prompt re-rendered")
    assert time.monotonic() - start < PROMPT and code == 1 and report["result"].startswith("INCOMPLETE")
    assert row["status"] == "FAIL" and row["n_failures"] == 1 and row["first_failure"] == (
        f"INCOMPLETE: a rendered literal of 8000003 characters, over the audit's bound of {MAX_LITERAL_CHARS} "
        "(prompt.MAX_LITERAL_CHARS); NOT checked")


def hostile_model(tmp_path, chat_template):
    """The chat fixture's model directory with `chat_template` as tokenizer_config.json's chat_template."""
    d = tmp_path / "model"
    shutil.copytree(MODEL, d)
    (d / "chat_template.jinja").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": chat_template}))
    return d


@pytest.mark.parametrize("spec", [LOOPS, CENTER], ids=["loops", "center"])
def test_a_hostile_chat_template_of_the_model_directory_is_incomplete(tmp_path, spec):
    """A real chat run whose results log the hostile template (and its sha256), audited with the --model directory
    whose tokenizer_config.json holds it: the chat row passes (the same template), the contexts are INCOMPLETE."""
    chat = spec + "{% for m in messages %}{{ m.content }}{% endfor %}"
    copy, samples, results = copy_run("chat", tmp_path)
    rewrite(samples, results, edit_results=lambda r: r.update(chat_template=chat, chat_template_sha=sha256_text(chat)))
    start = time.monotonic()
    code, report = audit(tmp_path, copy, "--tokens", "--model", hostile_model(tmp_path, chat), *SPLITS)
    took = time.monotonic() - start
    rows = [r for r in report["checks"] if r["check"].startswith("prompt re-rendered")]
    assert len(rows) == 2 and all(undecided(r, SAYS[spec]) for r in rows), rows
    assert {r["status"] for r in report["checks"] if r["check"].startswith("chat template and system")} == {"PASS"}
    assert code == 1 and report["result"].startswith("INCOMPLETE")
    assert took < 2 * PROMPT, took      # two tasks, one budget each


def test_the_worker_runs_under_the_stated_limits_and_the_audit_stays_small(tmp_path):
    """The limits are the worker's own (its /proc limits while it renders), and a hostile allocation happens there:
    an audit of center(3000000000) in a fresh process peaks at a fraction of the 2.96 GB it asks for, and so does
    its worker (the children's peak, which starts at the audit's size when it forks)."""
    with templates.bounded("limits") as scope:
        assert templates.template("{{ x }}").render(x="ok") == "ok"
        limits = {line[:26].strip(): line[26:].split() for line in
                  open(f"/proc/{scope.pid}/limits").read().splitlines()[1:]}
    assert limits["Max address space"][0] == str(templates.RENDER_MEMORY)
    assert limits["Max core file size"][0] == "0"
    assert limits["Max cpu time"][0] != "unlimited" and int(limits["Max cpu time"][0]) <= templates.RENDER_SECONDS + 2
    assert scope.proc is None       # stopped on leaving the scope
    run = hostile_run(tmp_path, CENTER)
    code = (HWM_CODE + "import json, resource, sys\n"
            "from evidence_audit.cli import main\n"
            f"code = main(['--lm-eval', {str(run)!r}, '--tokens', '--report', {str(tmp_path / 'r.json')!r}])\n"
            "print(json.dumps([code, [HWM(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]]))\n")
    proc = run_cli("-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    exit_code, (audit_kb, worker_kb) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert exit_code == 1 and audit_kb < 400 * 1024 and worker_kb < 400 * 1024, (audit_kb, worker_kb)


def test_errors_come_back_with_their_name_and_kind():
    from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError

    with pytest.raises(TemplateSyntaxError):
        templates.template("{% if %}")
    with pytest.raises(UndefinedError, match="'y' is undefined"):
        templates.template("{{ y }}").render()
    with pytest.raises(SecurityError, match="__class__"):
        templates.template("{{ ''.__class__ }}").render()
    with pytest.raises(ZeroDivisionError):
        templates.template("{{ 1 / 0 }}").render()
    with pytest.raises(TemplateError, match="boom"):        # lm-eval retries without the system turn on it
        templates.template("{{ raise_exception('boom') }}", chat=True).render()
    with pytest.raises(templates.Unrenderable, match="strftime_now"):
        templates.template("{{ strftime_now('%d') }}", chat=True).render()
    with pytest.raises(ValueError, match="surrogates"):     # lm-eval could not have written such a context
        templates.template("{{ x }}").render(x="\ud800")
    text = "é\u2028\n\x00😀" * 1000
    assert templates.template("{{ x }}|{{ y }}").render(x=text, y=[1, (2, 3)]) == f"{text}|[1, (2, 3)]"


# ---- bootstrap_iters ----------------------------------------------------------------------------------------------

def test_a_huge_bootstrap_iters_is_skipped_naming_the_bound_and_returns_small(tmp_path):
    """bootstrap_iters just under the old bound of 1e9 draws on the fixture's 11 samples (90909090 replicates: more
    than 600 s and 7.1 GB before): every bootstrapped stderr SKIPPED naming bootstrap.MAX_ITERS, INCOMPLETE, at once
    and in little memory (the audit's own peak, in a fresh process)."""
    from test_lmeval_groups import copy_run as copy_groups

    run = copy_groups(tmp_path, lambda r: r["config"].update(bootstrap_iters=10 ** 9 // 11))
    code = (HWM_CODE + "import json\n"
            "from evidence_audit.cli import main\n"
            f"code = main(['--lm-eval', {str(run)!r}, '--report', {str(tmp_path / 'r.json')!r}])\n"
            "print(json.dumps([code, HWM()]))\n")
    start = time.monotonic()
    proc = run_cli("-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    exit_code, peak_kb = json.loads(proc.stdout.strip().splitlines()[-1])
    assert time.monotonic() - start < 60 and peak_kb < 400 * 1024, peak_kb
    report = json.loads((tmp_path / "r.json").read_text())
    undone = [r for r in report["checks"] if r["status"] == "SKIPPED" and r["check"].startswith("stderr ")]
    assert exit_code == 1 and report["result"].startswith("INCOMPLETE") and len(undone) == 4    # f1, 2 mcc, ppl
    assert all("bootstrap_iters 90909090 over the 1e+06 replicates the audit recomputes (bootstrap.MAX_ITERS"
               in r["check"] for r in undone), undone


def test_the_bootstrap_budget_refuses_before_drawing():
    pairs = [(i % 2, (i // 2) % 2) for i in range(1001)]
    with pytest.raises(bootstrap.NotReproduced, match=r"bootstrap.MAX_DRAWS"):
        bootstrap.bootstrap_stderr("f1", pairs, bootstrap.MAX_ITERS)          # 1.001e9 draws
    budget = bootstrap.Budget(3000 * 10)
    bootstrap.bootstrap_stderr("f1", pairs[:10], 2000, budget=budget)           # 2e4 of the 3e4
    with pytest.raises(bootstrap.NotReproduced, match=r"bootstrap.MAX_TASK_DRAWS"):
        bootstrap.bootstrap_stderr("f1", pairs[:10], 2000, budget=budget)
    assert budget.left == 10000
