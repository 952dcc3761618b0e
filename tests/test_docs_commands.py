"""Every command of README.md's and docs/*.md's ```bash blocks is checked against what it does: the table in
tests/docs_commands.py names each one and how. The guards (fast): every docs command is in the table and every table
entry is still in the docs; a COVERED command's test reads that page; a PARSED command's arguments pass its own
script's parser and every repository path it names exists. The slow tests run the RUN commands as written, with
`bash -c`, in a scratch directory laid out like a user's checkout (the repository's files symlinked, `./cache` a
hard-linked copy of the prepared cache), and assert the exit code and what the page says they print or write."""
import argparse
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import shutil
import sqlite3
import subprocess
import sys

import pytest

import docs_commands
from conftest import REPO, link_or_copy
from evidence_audit import kernels
from docs_commands import COVERED, FIXTURE, PARSED, RUN, SUITE, TABLE

HERE = sys.modules[__name__]


# ---- the guards --------------------------------------------------------------------------------------------------

def test_every_docs_command_is_in_the_table():
    listed = {(page, command) for page, command, _, _ in TABLE}
    missing = [f"{page}: {command}" for page, command in docs_commands.all_commands() if (page, command) not in listed]
    assert not missing, "docs commands tests/docs_commands.py does not list (add each, with how it is checked):\n" \
        + "\n".join(missing)


def test_every_table_entry_is_still_in_the_docs():
    on_pages = set(docs_commands.all_commands())
    stale = [f"{page}: {command}" for page, command, _, _ in TABLE if (page, command) not in on_pages]
    assert not stale, "table entries no docs page holds any more:\n" + "\n".join(stale)
    assert len({(p, c) for p, c, _, _ in TABLE}) == len(TABLE), "an entry is listed twice"
    assert {kind for _, _, kind, _ in TABLE} <= {RUN, FIXTURE, COVERED, PARSED}


def test_the_extraction_joins_continuations_and_loops_and_drops_comments():
    # a command split by a backslash is one command; a loop over several lines is one; a comment is not part of it
    readme = docs_commands.page_commands("README.md")
    assert any(c.startswith(".venv/bin/lm_eval --model hf") and c.endswith("--output_path runs/sst2") for c in readme)
    assert ".venv/bin/python audit.py smoke" in readme
    speed = docs_commands.page_commands("docs/speed.md")
    loops = [c for c in speed if c.startswith("for exp in")]
    assert len(loops) == 1 and loops[0].endswith("\ndone") and loops[0].count("\n") == 3
    assert docs_commands.strip_comment("a 'b # c' # d") == "a 'b # c'"


def test_each_run_entry_names_a_test_of_this_file():
    for page, command, kind, how in TABLE:
        if kind in (RUN, FIXTURE):
            assert how.startswith(SUITE) and callable(getattr(HERE, how[len(SUITE):], None)), (page, command, how)


def test_each_covered_entry_is_run_by_a_test_that_reads_its_page():
    for page, command, kind, how in TABLE:
        if kind != COVERED:
            continue
        source = (REPO / how).read_text(encoding="utf-8")
        # the named test takes the command from the page itself, so an edit of the page is what it runs
        assert re.search(rf'"{re.escape(page.split("/")[-1])}"', source) and "read_text" in source, (page, how)
        assert "@pytest.mark.slow" in source and "bash" in source, how


def test_each_parsed_entry_says_why():
    for page, command, kind, how in TABLE:
        if kind == PARSED:
            assert how and not how.startswith(SUITE), (page, command)


def page_text(page):
    return " ".join((REPO / page).read_text(encoding="utf-8").split())


def test_each_lmeval_recipe_says_which_forward_mode_a_run_made_as_documented_gets():
    # the hub recipe (README, lm-eval-audit.md) cannot be run here: its pages say what decides the mode, in the words
    # of the rows; lmeval-offline.md's recipe is run by tests/test_lmeval_recipe.py, which asserts the row the page
    # names
    for page in ("README.md", "docs/lm-eval-audit.md"):
        text = page_text(page)
        assert "`equality expected`" in text and "float32's tolerance (1e-4)" in text, page
        assert "lm-eval's default batch size 1" in text and "sdpa attention" in text, page
    offline = page_text("docs/lmeval-offline.md")
    row = "(sdpa attention), lm-eval's batches of 4"
    assert f"say `{row}` and `equality expected`" in offline
    recipe_test = (REPO / "tests" / "test_lmeval_recipe.py").read_text(encoding="utf-8")
    assert f'"{row}" in ln' in recipe_test and '"equality expected" in ln' in recipe_test
    assert "lm-eval's batches of 4, tolerance 0.0001" in (REPO / "tests" / "test_docs_commands.py").read_text()


# ---- parsing a command with its script's own parser --------------------------------------------------------------

class Parsed(Exception):
    """Raised by the patched parser once the outermost parse has succeeded: the script stops before doing anything."""


@contextlib.contextmanager
def parse_only():
    """argparse.ArgumentParser.parse_known_args, patched: the script's own parser parses (an unknown or removed flag,
    a bad value or a missing required one is its usual error, SystemExit 2), then Parsed stops the script."""
    original, depth = argparse.ArgumentParser.parse_known_args, [0]

    def patched(self, args=None, namespace=None):
        depth[0] += 1
        try:
            ns, extra = original(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise Parsed(ns, extra)
        return ns, extra

    argparse.ArgumentParser.parse_known_args = patched
    saved_argv, saved_env = sys.argv[:], dict(os.environ)
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv[:] = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)


def parse_with(run_script, argv):
    """Run the script's entry (run_script()) with sys.argv = argv under parse_only: '' when its parser accepts the
    arguments, else what it said."""
    err = io.StringIO()
    with parse_only(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        sys.argv[:] = argv
        try:
            run_script()
        except Parsed as done:
            _, extra = done.args
            return f"unrecognised arguments {extra}" if extra else ""
        except SystemExit as e:
            return f"exit {e.code}: {err.getvalue().strip()[-500:]}"
    return "the script never parsed its arguments"


def parse_python(argv):
    """`python ARGV` (a script, -m MODULE or -c CODE) through its own parser: '' or the complaint."""
    if argv[0] == "-c":
        compile(argv[1], "<-c>", "exec")
        return ""
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        if module == "pytest":
            missing = [a for a in rest if not a.startswith("-") and not (REPO / a).exists()]
            return f"no such test path {missing}" if missing else ""
        if module == "pip":
            from pip._internal.commands import create_command
            name, *args = rest
            try:
                create_command(name).parse_args(args)
            except SystemExit as e:
                return f"pip {name}: exit {e.code}"
            return ""
        return parse_with(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True), [module, *rest])
    script, rest = argv[0], argv[1:]
    if not (REPO / script).is_file():
        return f"no such script {script}"
    if script == "run.py":              # run.py's own checks after argparse (e.g. --shard K/N) are part of parsing
        import run
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                run.parse_args(rest)
            except SystemExit as e:
                return f"exit {e.code}: {err.getvalue().strip()[-500:]}"
        return ""
    return parse_with(lambda: runpy.run_path(str(REPO / script), run_name="__main__"), [script, *rest])


def simple_commands(command):
    """The simple commands of a command line: a loop's body with its variable at its first value, split at
    newlines, `;`, `&&` and `|`, each as its argument list (quotes removed)."""
    loop = re.match(r"for (\w+) in ([^;]+); do\n?(.*?)\s*;?\s*done$", command, re.S)
    if loop:
        command = loop.group(3).replace(f"${loop.group(1)}", loop.group(2).split()[0])
    parts = []
    for line in command.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words = []
        for token in [*lexer, ";"]:
            if token in (";", "&&", "|"):
                if words and words[0] == "nice":
                    words = words[3:]
                if words:
                    parts.append(words)
                words = []
            else:
                words.append(token)
    return parts


def check_arguments(words):
    """'' when the program's own parser accepts the arguments, else the complaint."""
    program, args = words[0], words[1:]
    if program == ".venv/bin/python":
        return parse_python(args)
    if program == ".venv/bin/torchrun":
        from torch.distributed.run import get_args_parser
        ns = get_args_parser().parse_args(args)
        return parse_python([ns.training_script, *ns.training_script_args])
    if program == ".venv/bin/accelerate":
        from accelerate.commands.launch import launch_command_parser
        assert args[0] == "launch"
        ns = launch_command_parser().parse_args(args[1:])
        return parse_python([ns.training_script, *ns.training_script_args])
    if program == ".venv/bin/lm_eval":
        from lm_eval.__main__ import setup_parser
        return parse_with(lambda: setup_parser().parse_args(args), ["lm_eval", *args])
    if program == "huggingface-cli":
        return "" if (REPO / ".venv" / "bin" / program).exists() and args[0] == "download" else f"no {program}"
    if program in ("cd", "find", "sed", "sort", "xargs", "sha256sum", "ssh-keygen", "printf", "mv", "echo", "mkdir",
                   "cut", "LC_ALL=C"):
        return ""
    return f"a program this test does not know how to check: {program}"


def repository_paths(words):
    """The arguments (and the parts of KEY=VALUE,... arguments) that name a path inside the repository: those whose
    first component is a top-level entry of the checkout."""
    top = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}
    found = []
    for word in words:
        for part in re.split(r"[=,]", word):
            if "/" in part and part.split("/")[0] in top or part.endswith(".py") and part in top:
                found.append(part)
    return found


@pytest.mark.parametrize("page,command", [(p, c) for p, c, kind, _ in TABLE if kind == PARSED],
                         ids=lambda v: v if v.endswith(".md") else v[:60])
def test_a_parsed_command_passes_its_own_parser_and_names_existing_paths(page, command):
    for words in simple_commands(command):
        complaint = check_arguments(words)
        assert complaint == "", f"{page}: {' '.join(words)}: {complaint}"
        missing = [p for p in repository_paths(words) if not (REPO / p).exists()]
        assert not missing, f"{page}: {' '.join(words)} names repository paths that do not exist: {missing}"


def test_the_parse_check_fails_a_renamed_flag_and_a_missing_path():
    assert check_arguments([".venv/bin/python", "run.py", "--cache", "c", "--out", "o", "--experment", "protocol"])
    assert check_arguments([".venv/bin/python", "audit.py", "O", "--strictly"])
    assert check_arguments([".venv/bin/python", "run.py", "--cache", "c", "--out", "o", "--shard", "3/2"])
    assert check_arguments([".venv/bin/python", "-m", "harness", "run", "--adaptor", "toy"])
    assert check_arguments([".venv/bin/python", "tools/measure_forward_sample.py", "--no-such-flag"])
    assert check_arguments([".venv/bin/lm_eval", "--modle", "hf"])
    assert check_arguments([".venv/bin/python", "tools/no_such_tool.py"])
    assert repository_paths(["--data-file", "fixtures/no_such.tsv", "pretrained=tests/x,dtype=float32"]) == \
        ["fixtures/no_such.tsv", "tests/x"]


# ---- running the commands as written -----------------------------------------------------------------------------

def make_checkout(where, prepared_cache):
    """A directory laid out like a user's fresh checkout: every top-level entry git tracks symlinked, and the venv
    (not what the user made in theirs: README command 1's smoke/ and cache/ are there in a clone the suite runs in),
    ./cache a hard-linked copy of the prepared cache (every cache write is a rename, so the original is never
    changed) whose result cache is a consistent snapshot of the prepared one's."""
    where.mkdir(parents=True)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in sorted({p.split("/", 1)[0] for p in tracked.decode().split("\0") if p} | {".venv"}):
        if (REPO / name).exists():
            (where / name).symlink_to(REPO / name)
    shutil.copytree(prepared_cache, where / "cache", copy_function=link_or_copy,
                    ignore=shutil.ignore_patterns("results.sqlite*", "*.lock"))
    results = prepared_cache / "results.sqlite"
    if results.exists():
        with sqlite3.connect(results) as src, sqlite3.connect(where / "cache" / "results.sqlite") as dst:
            src.backup(dst)
    return where


class Checkout:
    """Runs the table's RUN commands of one test in a checkout, in a HOME of its own; records which it ran (a command
    that several pages give byte for byte is run once, for all of them)."""

    def __init__(self, where, test):
        self.where, self.test, self.ran = where, test, set()
        self.home = where.parent / "home"
        self.home.mkdir(exist_ok=True)

    def run(self, command, stand_in=None, expect_rc=0, timeout=900):
        """bash -c COMMAND (after the stated stand-in, old -> new) in the checkout: the CompletedProcess."""
        pages = {(p, c) for p, c, _, _ in docs_commands.entries((RUN,), self.test) if c == command}
        assert pages, f"not a RUN entry of {self.test}: {command}"
        self.ran |= pages
        line = command.replace(*stand_in) if stand_in else command
        env = {**os.environ, "HOME": str(self.home), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
               "HF_HOME": str(self.home / "hf"), "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(["bash", "-c", line], cwd=self.where, env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        assert proc.returncode == expect_rc, f"{sorted(pages)}: {line}\n-> exit {proc.returncode}\n" \
            + proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    def fixture(self, command):
        """A FIXTURE entry of this test, checked by the caller: the page's words."""
        pages = {(p, c) for p, c, _, _ in docs_commands.entries((FIXTURE,), self.test) if c == command}
        assert pages, f"not a FIXTURE entry of {self.test}: {command}"
        self.ran |= pages
        return command.split()

    def done(self):
        expected = {(p, c) for p, c, _, _ in docs_commands.entries((RUN, FIXTURE), self.test)}
        assert self.ran == expected, f"entries of {self.test} not checked: {expected - self.ran}"


def forward_rows(report, experiment, check="candidate scores vs both paths"):
    return [r for r in report["checks"] if r["level"] == "forward" and r["experiment"] == experiment
            and r["check"] == check]


def copy_evidence(src, dst):
    """A copy of a session fixture's evidence directory that a test may write into (audit.json, report.html)."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.mark.slow
def test_readme_setup_smoke_audit_report_verify(prepared_cache, smoke_run, tmp_path):
    """README's first command from prepare.py on is what the session fixtures run (prepared_cache: `prepare.py
    --cache C`; smoke_run: `run.py --cache C --out O --smoke`; the venv creation and `pip install` before them are
    the environment this suite runs in): the page's flags are checked against the fixture's and its output
    asserted. Then, in a checkout whose `smoke` is a copy of that output: `audit.py smoke` (README, audit.md), the
    audit's forward level (audit.md), whose rows name the mode docs/models.md names, `report.py smoke` (report.md)
    and `prepare.py --verify` (offline-default.md)."""
    c = Checkout(make_checkout(tmp_path / "checkout", prepared_cache), "test_readme_setup_smoke_audit_report_verify")
    setup = " ".join(c.fixture(TABLE[0][1]))
    venv, prepare, run = setup.split(" && ", 1)[0], *setup.split(" && ")[2:]
    assert venv == "python3.11 -m venv .venv" and prepare == ".venv/bin/python prepare.py --cache ./cache"
    out, proc = smoke_run
    assert run.split()[1:] == [a if a not in (str(prepared_cache), str(out)) else
                               {str(prepared_cache): "./cache", str(out): "smoke"}[a] for a in proc.args[1:]]
    assert re.search(r"^evidence digest: sha256:[0-9a-f]{64}$", proc.stdout, re.M), proc.stdout[-2000:]
    smoke = copy_evidence(out, c.where / "smoke")
    assert (smoke / "MANIFEST.json").is_file() and (smoke / "report.html").is_file()

    proc = c.run(".venv/bin/python audit.py smoke")
    assert re.search(r"^RESULT: PASS", proc.stdout, re.M), proc.stdout[-2000:]
    proc = c.run(".venv/bin/python audit.py smoke --tokens --forward --strict")
    assert re.search(r"^RESULT: PASS", proc.stdout, re.M), proc.stdout[-2000:]
    report = json.loads((smoke / "audit.json").read_text())
    # docs/models.md names the mode the forward level re-scores float32 evidence of the default model in; the rows
    # of the smoke's audit must be in that mode
    models_page = " ".join((REPO / "docs" / "models.md").read_text(encoding="utf-8").split())
    mode = "one unpadded sequence per pass"
    assert f"float32 evidence of a model the audit's own Llama covers (the default model): {mode}" in models_page
    for experiment in ("protocol", "options", "mctaco"):
        rows = forward_rows(report, experiment)
        assert rows and all(r["status"] == "PASS" and f"float32, audit.py's own Llama forward, {mode}" in r["note"]
                            for r in rows), rows

    # docs/audit.md: the arithmetic level rebuilds report.html with report.py --check and compares it byte for byte
    rebuilt = [r for r in report["checks"] if r["check"].startswith("report.html rebuilt from the evidence")]
    assert 'row "report.html rebuilt from the evidence"' in page_text("docs/audit.md")
    assert [r["status"] for r in rebuilt] == ["PASS"], rebuilt
    before = (smoke / "report.html").read_bytes()
    (smoke / "report.html").unlink()
    c.run(".venv/bin/python report.py smoke")
    assert (smoke / "report.html").read_bytes() == before, "report.py wrote another page from the same evidence"
    proc = c.run(".venv/bin/python prepare.py --cache ./cache --verify")
    assert re.search(r"^verified: \d+ files in \d+ resource\(s\) under cache$", proc.stdout, re.M), proc.stdout
    c.done()


@pytest.mark.slow
def test_readme_protocol_run_and_its_audit_then_signing_it(prepared_cache, dev_run, tmp_path):
    """README's protocol run of the 64 development items is what the session fixture dev_run runs (the same flags
    and --no-cache, which only keeps the result cache from serving scores): the page's flags are checked against
    it; README's audit then runs on a copy of its output. Then citing.md's signing: a key made in a HOME of the
    test's own (empty: no ~/.ssh yet), a signed run, the digest signed again by hand with ssh-keygen, the
    allowed-signers line, the audit and ssh-keygen's own verification naming the signer."""
    c = Checkout(make_checkout(tmp_path / "checkout", prepared_cache),
                 "test_readme_protocol_run_and_its_audit_then_signing_it")
    page_words = c.fixture(".venv/bin/python run.py --cache ./cache --out out --experiment protocol")
    out, proc = dev_run
    fixture_words = [{str(prepared_cache): "./cache", str(out): "out"}.get(a, a) for a in proc.args[1:]]
    assert fixture_words == page_words[1:] + ["--no-cache"], fixture_words
    copy_evidence(out, c.where / "out")
    assert len((c.where / "out" / "protocol" / "records.jsonl").read_text().splitlines()) == 64
    proc = c.run(".venv/bin/python audit.py out --tokens --forward")
    assert re.search(r"^RESULT: PASS", proc.stdout, re.M), proc.stdout[-2000:]

    c.run("mkdir -p -m 700 ~/.ssh && ssh-keygen -t ed25519 -f ~/.ssh/id_ed25519")
    assert (c.home / ".ssh" / "id_ed25519").is_file() and (c.home / ".ssh" / "id_ed25519.pub").is_file()
    proc = c.run(".venv/bin/python run.py --cache ./cache --out O --experiment protocol --sign ~/.ssh/id_ed25519")
    assert re.search(r"^evidence signature: O/MANIFEST.json.sig \(ssh-keygen -Y sign -n "
                     r"evidence-digest@item-level-evidence .*ED25519 key SHA256:", proc.stdout, re.M), proc.stdout
    c.run("printf 'sha256:%s' \"$(sha256sum O/MANIFEST.json | cut -d' ' -f1)\" > digest.txt")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", (c.where / "digest.txt").read_text())
    (c.where / "O" / "MANIFEST.json.sig").unlink()       # the page's case: a run that finished unsigned
    c.run("ssh-keygen -Y sign -f ~/.ssh/id_ed25519 -n evidence-digest@item-level-evidence digest.txt")
    c.run("mv digest.txt.sig O/MANIFEST.json.sig")
    assert (c.where / "O" / "MANIFEST.json.sig").read_text().startswith("-----BEGIN SSH SIGNATURE-----")
    c.run("echo \"alice@example.org $(cut -d' ' -f1,2 ~/.ssh/id_ed25519.pub)\" > allowed_signers")
    assert re.fullmatch(r"alice@example.org ssh-ed25519 \S+\n", (c.where / "allowed_signers").read_text())
    proc = c.run(".venv/bin/python audit.py O --allowed-signers allowed_signers")
    assert re.search(r"^RESULT: PASS.*\(evidence digest signed by alice@example.org, ED25519 key SHA256:",
                     proc.stdout, re.M), proc.stdout[-2000:]
    proc = c.run("printf 'sha256:%s' \"$(sha256sum O/MANIFEST.json | cut -d' ' -f1)\" | ssh-keygen -Y verify -f "
                 "allowed_signers -I alice@example.org -n evidence-digest@item-level-evidence -s O/MANIFEST.json.sig")
    assert 'Good "evidence-digest@item-level-evidence" signature for alice@example.org' in proc.stdout + proc.stderr
    c.done()


@pytest.mark.slow
def test_own_model_run_and_audit(prepared_cache, tmp_path):
    """README's and docs/models.md's run on your own model directory and its audit (the same two lines on both
    pages). Stand-in: path/to/my-model is a copy (hard links) of the prepared model directory, a local Hugging Face
    directory like any other."""
    c = Checkout(make_checkout(tmp_path / "checkout", prepared_cache), "test_own_model_run_and_audit")
    mine = c.where / "path" / "to" / "my-model"
    shutil.copytree(prepared_cache / "models" / "smollm2-135m-instruct-q4_1", mine, copy_function=link_or_copy)
    c.run(".venv/bin/python run.py --cache ./cache --out out-mine --experiment protocol --model path/to/my-model")
    config = json.loads((c.where / "out-mine" / "protocol" / "config.json").read_text())
    assert config["model"]["id"] == "<model:my-model>", config["model"]
    proc = c.run(".venv/bin/python audit.py out-mine --tokens --forward --cache ./cache")
    assert re.search(r"^RESULT: PASS", proc.stdout, re.M), proc.stdout[-2000:]
    c.done()


@pytest.mark.slow
def test_own_data_import_and_run(prepared_cache, tmp_path):
    """README's and docs/data.md's import of your own data and the run on it (the same two lines on both pages);
    data.md's import of the 872-row review fixture. Stand-in: mine.tsv is 8 rows of fixtures/reviews_872_dev.tsv
    (header `sentence<TAB>label`, GLUE's layout)."""
    c = Checkout(make_checkout(tmp_path / "checkout", prepared_cache), "test_own_data_import_and_run")
    lines = (REPO / "fixtures" / "reviews_872_dev.tsv").read_text().splitlines(keepends=True)
    (c.where / "mine.tsv").write_text("".join(lines[:5] + lines[-4:]))
    c.run(".venv/bin/python prepare.py --cache ./cache --data-file mine.tsv --name mine")
    assert json.loads((c.where / "cache" / "user.lock.json").read_text())["data"]["mine"]["rows"] == 8
    c.run(".venv/bin/python run.py --cache ./cache --out out-mine --experiment protocol --data mine")
    assert len((c.where / "out-mine" / "protocol" / "records.jsonl").read_text().splitlines()) == 8
    c.run(".venv/bin/python prepare.py --cache ./cache --data-file fixtures/reviews_872_dev.tsv --name reviews-872")
    assert json.loads((c.where / "cache" / "user.lock.json").read_text())["data"]["reviews-872"]["rows"] == 872
    c.done()


@pytest.mark.slow
def test_harness_toy_run(prepared_cache, tmp_path):
    """docs/harness.md's toy adapter on the shipped fixture tasks: a leaderboard of 1.0 in toy.json."""
    c = Checkout(make_checkout(tmp_path / "checkout", prepared_cache), "test_harness_toy_run")
    proc = c.run(".venv/bin/python -m harness run --adapter toy --out toy.json")
    assert re.search(r"^overall\s+1\.0000\s+\(toy\) -> toy\.json$", proc.stdout, re.M), proc.stdout
    assert (c.where / "toy.json").is_file()
    c.done()


@pytest.mark.slow
def test_synthetic_mctaco_files_and_their_import(prepared_cache, tmp_path):
    """docs/mctaco.md's synthetic splits and their import (stand-in: a directory of the test's own for /tmp); the
    runs on them are PARSED (hours)."""
    c = Checkout(make_checkout(tmp_path / "checkout", prepared_cache), "test_synthetic_mctaco_files_and_their_import")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    into_scratch = ("/tmp/", f"{scratch}/")
    c.run(".venv/bin/python synth_mctaco.py --split validation --out /tmp/synth_dev_3783.tsv", stand_in=into_scratch)
    c.run(".venv/bin/python synth_mctaco.py --split test --out /tmp/synth_test_9442.tsv", stand_in=into_scratch)
    c.run(".venv/bin/python prepare.py --cache ./cache --data-file /tmp/synth_dev_3783.tsv --name synth-mctaco-dev",
          stand_in=into_scratch)
    c.run(".venv/bin/python prepare.py --cache ./cache --data-file /tmp/synth_test_9442.tsv --name "
          "synth-mctaco-test --as-split test", stand_in=into_scratch)
    lock = json.loads((c.where / "cache" / "user.lock.json").read_text())["data"]
    assert lock["synth-mctaco-dev"]["rows"] == 3783 and lock["synth-mctaco-test"]["rows"] == 9442, lock
    c.done()


@pytest.mark.slow
def test_lmeval_audit_of_a_run_dir(prepared_cache, tmp_path):
    """README's and lm-eval-audit.md's `audit.py --lm-eval runs/sst2`, lm-eval-audit.md's forward audit and
    citing.md's signing of an lm-eval run. Stand-ins (the hub run cannot be made here): runs/sst2 is a copy of a
    real lm-eval 0.4.9.2 run of the prepared model (tests/fixtures/cross_machine/lm-eval-0.4.9.2/b4: float32, batch
    size 4, made on an AMD EPYC), sst2.parquet the data it evaluated (the fixture's parquet), DIR the prepared model,
    ~/.ssh/id_ed25519 a key made for the test. Made on another CPU, its forward row must be the float32 tolerance
    with that reason, as lm-eval-audit.md says; a run made on this machine's kind of CPU gets equality
    (tests/test_lmeval_recipe.py asserts it for lmeval-offline.md's recipe)."""
    c = Checkout(make_checkout(tmp_path / "checkout", prepared_cache), "test_lmeval_audit_of_a_run_dir")
    shutil.copytree(REPO / "tests" / "fixtures" / "cross_machine" / "lm-eval-0.4.9.2" / "b4", c.where / "runs" / "sst2")
    shutil.copy(prepared_cache / "data" / "fixture-sentiment" / "validation.parquet", c.where / "sst2.parquet")
    model = prepared_cache / "models" / "smollm2-135m-instruct-q4_1"
    proc = c.run(".venv/bin/python audit.py --lm-eval runs/sst2")
    assert re.search(r"^RESULT: PASS", proc.stdout, re.M), proc.stdout[-2000:]
    proc = c.run(".venv/bin/python audit.py --lm-eval runs/sst2 --forward --data sst2.parquet --model DIR",
                 stand_in=("DIR", str(model)))
    assert re.search(r"^RESULT: PASS", proc.stdout, re.M), proc.stdout[-3000:]
    rescored = [ln for ln in proc.stdout.splitlines() if "loglikelihoods re-scored in the run's dtype" in ln]
    results = next((c.where / "runs" / "sst2").glob("results_*.json"))
    run_cpu = kernels.from_pretty_env_info(json.loads(results.read_text())["pretty_env_info"])
    if kernels.reproduces(run_cpu, kernels.this_machine(), "cpu", os.environ)[0]:      # the machine that made it
        assert rescored and all("equality expected" in ln for ln in rescored), rescored
    else:
        assert rescored and all("lm-eval's batches of 4, tolerance 0.0001 (the run was made on AMD EPYC" in ln
                                for ln in rescored), rescored

    (c.home / ".ssh").mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(c.home / ".ssh" / "id_ed25519")],
                   check=True, capture_output=True)
    pub = (c.home / ".ssh" / "id_ed25519.pub").read_text().split()
    (c.where / "allowed_signers").write_text(f"alice@example.org {pub[0]} {pub[1]}\n")
    proc = c.run(".venv/bin/python audit.py --lm-eval runs/sst2 --sign ~/.ssh/id_ed25519")
    assert re.search(r"^RESULT: PASS", proc.stdout, re.M), proc.stdout[-2000:]
    recorded = json.loads((c.where / "runs" / "sst2" / "evidence-digest.json").read_text())
    assert (c.where / "runs" / "sst2" / "evidence-digest.json.sig").is_file()
    proc = c.run(".venv/bin/python audit.py --lm-eval runs/sst2 --allowed-signers allowed_signers")
    assert re.search(r"^RESULT: PASS.*signed by alice@example.org", proc.stdout, re.M), proc.stdout[-2000:]
    proc = c.run("cd runs/sst2 && find . -maxdepth 2 -type f \\( -name 'results_*.json' -o -name 'samples_*.jsonl' "
                 "\\) | sed 's|^\\./||' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum")
    assert proc.stdout == f"{recorded['digest'].removeprefix('sha256:')}  -\n", (proc.stdout, recorded)
    c.done()
