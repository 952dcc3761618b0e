"""Local paths stay out of the public part of O (issue 39, item 1; evidence format 3).

The public files (everything but O/private/) name the cache, O, a local --model directory, the checkout, the
Python installation, the home and the temp directory by placeholder (<cache>, <out>, <model:NAME>, <repo>,
<python>, <home>, <tmp>, <shard:NAME>, <path:NAME>); O/private/<exp>/paths.json maps them back, and the audit finds
the model and the data through --cache / --model, else through that file.

Fast: the placeholder rules (experiments/evidence.LocalPaths), the recorded command line (run.public_command_line,
read back by the audit's run_command), run.log's scrubbing, a fake run's public files and FAILED.json, the audit's
resolution of a recorded path, and its row that fails a public file holding a local path. Slow: real runs of every
experiment on the tiny model, by lock id and from a local directory copy, searched byte by byte, then audited at
--tokens --forward with --cache / --model (and with neither, through paths.json), and --public-only on a copy
without O/private/.
"""
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import run as run_py
from conftest import REPO, link_or_copy, run_cli
from evidence_audit import driver
from evidence_audit.manifest import reseal
from evidence_audit.reading import local_paths, resolve_cache, resolve_path
from evidence_audit.run_command import command_line_limit, experiments_of_command
from experiments.context import Result
from experiments.evidence import IdentityMismatch, LocalPaths
from experiments.runlog import LibraryChatter
from test_run_safety import fake_experiment, fake_run  # noqa: F401  (fake_run is a fixture)

NAME_CHARS = rb"A-Za-z0-9._~+-"


def local_dirs(*dirs):
    """The absolute paths a public file must not hold: each directory as given and resolved, the checkout, the
    Python installation (sys.prefix and the interpreter's directory), the temp and the home directory."""
    found = {str(d) for d in dirs} | {os.path.realpath(d) for d in dirs}
    found |= {str(REPO), sys.prefix, os.path.dirname(sys.executable), tempfile.gettempdir(), os.path.expanduser("~")}
    return sorted(p for p in found if os.path.isabs(p) and p != "/")


def leaks(out, needles):
    """[(public file, path)] for every public file of O (all but O/private/) whose bytes hold one of `needles`: the
    path not followed by a character that would continue a file name ("/tmp" is not found in "/tmpx"); the page's
    base64 PNG images are left out (they may spell "/tmp/" by chance, and nobody reads them as text)."""
    found = []
    for p in sorted(Path(out).rglob("*")):
        rel = p.relative_to(out)
        if not p.is_file() or rel.parts[0] == "private":
            continue
        data = re.sub(rb"data:image/png;base64,[A-Za-z0-9+/=]+", b"", p.read_bytes())   # "/tmp/" by chance
        found += [(rel.as_posix(), n) for n in needles
                  if re.search(re.escape(n.encode()) + rb"(?![" + NAME_CHARS + rb"])", data)]
    return found


def row(report, check):
    return next(r for r in report["checks"] if r["check"] == check)


# ---- the placeholders ------------------------------------------------------------------------------------------------

def test_a_path_is_published_under_the_longest_root_that_holds_it(tmp_path):
    out, cache, model = tmp_path / "o", tmp_path / "cache", tmp_path / "cache" / "mine" / "my-model"
    for d in (out, cache, model):
        d.mkdir(parents=True, exist_ok=True)
    paths = LocalPaths.for_run(out, cache, model)
    assert paths.path(str(cache / "models" / "x")) == "<cache>/models/x"
    assert paths.path(str(cache / "results.sqlite")) == "<cache>/results.sqlite"
    assert paths.path(str(model)) == "<model:my-model>"                   # inside the cache, but its own root
    assert paths.path(str(out)) == "<out>" and paths.path(str(out) + "x") != "<out>x"     # another name
    assert paths.path(str(REPO / "fixtures" / "harness_tasks")) == "<repo>/fixtures/harness_tasks"
    assert paths.path(os.path.join(sys.prefix, "lib")) == "<python>/lib"
    assert paths.path("relative/dir") == "relative/dir" and paths.path("/") == "/"
    assert paths.paths["<out>"] == str(out) and paths.paths["<model:my-model>"] == str(model)


def test_a_symlinked_spelling_finds_its_root_and_an_unknown_existing_path_gets_its_own_placeholder(tmp_path):
    real = tmp_path / "real-cache"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    paths = LocalPaths.for_run(tmp_path / "o", tmp_path / "link")
    assert paths.path(str(real / "data")) == "<cache>/data"               # the resolved spelling
    assert paths.path(str(tmp_path / "link" / "data")) == "<cache>/data"  # the spelling given
    # an absolute path under no root that exists here (a configured harness_tasks_dir, say) gets <path:NAME>,
    # which paths.json maps back; a second directory of that name gets <path:NAME-2>
    tasks, other = tmp_path / "a" / "tasks", tmp_path / "b" / "tasks"
    tasks.mkdir(parents=True)
    other.mkdir(parents=True)
    lone = LocalPaths([("<out>", tmp_path / "o")])
    assert lone.path(str(tasks)) == "<path:tasks>" and lone.path(str(other)) == "<path:tasks-2>"
    assert lone.paths["<path:tasks>"] == str(tasks) and lone.paths["<path:tasks-2>"] == str(other)
    assert lone.path(str(tasks / "y.jsonl")) == "<path:tasks>/y.jsonl"
    assert lone.path("/no/such/dir/anywhere") == "/no/such/dir/anywhere"    # nothing here names it


def test_json_values_are_published_whole_and_free_text_by_its_paths(tmp_path):
    o, c = tmp_path / "o", tmp_path / "c"
    paths = LocalPaths([("<out>", o), ("<cache>", c)])
    value = {"dir": str(c / "models" / "m"), "n": 3, "list": [str(o), "x"], "text": f"see {c}/x", "regex": "/",
             "other": f"{c}x", "files": {"config.json": {"sha256": "a" * 64}}}
    assert paths.public(value) == {"dir": "<cache>/models/m", "n": 3, "list": ["<out>", "x"], "text": "see <cache>/x",
                                   "regex": "/", "other": f"{c}x", "files": {"config.json": {"sha256": "a" * 64}}}
    # free text: every root where it stands as a path, not where it begins another name
    assert paths.text(f"warning: {c}/x.py:3, '{o}' and {c}x, file://{o}/r") == \
        f"warning: <cache>/x.py:3, '<out>' and {c}x, file://<out>/r"
    assert paths.public_text({"error": f"{c}/x: bad", "rows": [{"value": f"{o}"}]}) == \
        {"error": "<cache>/x: bad", "rows": [{"value": "<out>"}]}


# ---- the recorded command line ---------------------------------------------------------------------------------------

def test_the_command_line_names_each_path_by_its_placeholder_however_it_was_typed(tmp_path, monkeypatch):
    for d in ("cache", "o", "m", "s1", "s2"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(tmp_path)
    paths = LocalPaths.for_run(tmp_path / "o", tmp_path / "cache", tmp_path / "m",
                               shards=(tmp_path / "s1", tmp_path / "s2"))
    argv = [str(REPO / "run.py"), "--cache", "cache", f"--out={tmp_path / 'o'}", "--mod", "./m", "--experiment",
            "protocol", "--lim", "3", "--smoke"]
    public = run_py.public_command_line(argv, paths)
    assert public == ["run.py", "--cache", "<cache>", "--out=<out>", "--mod", "<model:m>", "--experiment",
                      "protocol", "--lim", "3", "--smoke"]
    # the audit reads the same experiments and --limit from what the public files record
    assert experiments_of_command(public) == (["protocol"], None)
    assert command_line_limit({"command_line": public}) == (3, None)
    assert run_py.public_command_line(["run.py", "--model", "smollm2-135m-instruct-q4_1", "--out", "o"], paths) == \
        ["run.py", "--model", "smollm2-135m-instruct-q4_1", "--out", "<out>"]        # a lock id is no path
    merged = run_py.public_command_line(["run.py", "--cache", "cache", "--out", "o", "--merge", "s1", "s2",
                                         "--replace"], paths)
    assert merged == ["run.py", "--cache", "<cache>", "--out", "<out>", "--merge", "<shard:s1>", "<shard:s2>",
                      "--replace"]
    key = tmp_path / "keys" / "id_ed25519"
    key.parent.mkdir()
    key.write_text("not a key\n")
    signed = LocalPaths.for_run(tmp_path / "o", tmp_path / "cache", key=key)
    assert run_py.public_command_line(["run.py", "--out", "o", "--sign", str(key)], signed) == \
        ["run.py", "--out", "<out>", "--sign", "<key:id_ed25519>"]


def test_run_log_is_written_with_placeholders(tmp_path):
    paths = LocalPaths.for_run(tmp_path / "o", tmp_path / "cache")
    chatter = LibraryChatter()
    log = tmp_path / "run.log"
    chatter.to_file(log, "run.py --cache <cache> --out <out>", paths.text)
    chatter.buffer.handle(logging.makeLogRecord({
        "name": "lm_eval", "levelno": logging.WARNING, "levelname": "WARNING",
        "msg": f"{sys.prefix}/lib/x.py:1: FutureWarning: read {tmp_path / 'cache'}/data/y.parquet"}))
    chatter.close()
    text = log.read_text()
    assert "<python>/lib/x.py:1: FutureWarning: read <cache>/data/y.parquet" in text
    assert not leaks(tmp_path, local_dirs(tmp_path / "o", tmp_path / "cache")), text


def test_a_fake_run_publishes_no_local_path_and_keeps_them_in_private(fake_run, tmp_path, capsys):
    """Through run.main (fake experiments): config.json, identity.json, environment.json, run.log, report.html and
    MANIFEST.json hold no path of the run, a FAILED.json names a file by placeholder, and each
    O/private/<exp>/paths.json maps every placeholder back and keeps the command as typed."""
    seen = {}

    def run(ctx):
        seen["cache"] = ctx.inputs.cache
        return Result(config={"experiment": "protocol", "where": str(ctx.inputs.cache / "results.sqlite"),
                              "tasks_dir": str(REPO / "fixtures")},
                      records=[{"idx": 0, "score": 0.25}], summary={"experiment": "protocol"}, headline="done",
                      token_stats={}, prompt_template_sha256="p" * 64, private={"texts.jsonl": '{"idx": 0}\n'})

    def fail(ctx):
        raise IdentityMismatch(f"options: {ctx.inputs.cache / 'x.parquet'} does not match", [(0, "f", "a", "b")])

    modules = {"protocol": fake_experiment("protocol"), "options": fake_experiment("options")}
    modules["protocol"].run, modules["options"].run = run, fail
    out = tmp_path / "o"
    code, _, _ = fake_run(["--out", str(out)], modules, capsys)
    assert code == 1
    assert not leaks(out, local_dirs(out, tmp_path / "cache", tmp_path))
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    assert cfg["where"] == "<cache>/results.sqlite" and cfg["tasks_dir"] == "<repo>/fixtures"
    failed = json.loads((out / "options.FAILED.json").read_text())
    assert failed["error"] == "options: <cache>/x.parquet does not match"
    private = json.loads((out / "private" / "protocol" / "paths.json").read_text())
    assert set(private) == {"experiment", "paths", "command_line", "cwd", "evidence_format"}
    assert private["paths"]["<cache>"] == str(seen["cache"]) and private["paths"]["<out>"] == str(out)
    assert private["paths"]["<repo>"] == str(REPO) and private["cwd"] == os.getcwd()
    assert private["command_line"] == sys.argv      # the command as typed (here pytest's: main() was called)


# ---- the audit -------------------------------------------------------------------------------------------------------

def test_the_audit_resolves_a_recorded_path_by_its_shape():
    known = {"<cache>": "/c", "<model:m>": "/x/m"}
    assert resolve_path("<cache>/models/a", known) == Path("/c/models/a")
    assert resolve_path("<model:m>", known) == Path("/x/m")
    assert resolve_path("<out>", known) is None and resolve_path("<model:other>", known) is None
    assert resolve_path("/abs/models/a", {}) == Path("/abs/models/a")      # format 2 wrote the path itself
    assert resolve_path("models/a", known) is None and resolve_path(None, known) is None


def test_the_audit_finds_the_model_by_flag_then_by_paths_json(tmp_path):
    lock = {"data": "d", "model": {"id": "m", "dir": "<cache>/models/m"}}
    local = {"data": "d", "model": {"id": "<model:mine>", "dir": "<model:mine>", "source": "local"}}
    known = {"<cache>": "/run/cache", "<model:mine>": "/run/mine"}
    assert resolve_cache(lock, None, None, known) == (Path("/run/cache/models/m"),
                                                      Path("/run/cache/data/d/validation.parquet"))
    assert resolve_cache(lock, tmp_path, None, known) == (tmp_path / "models" / "m",
                                                          tmp_path / "data" / "d" / "validation.parquet")
    assert resolve_cache(lock, None, None, {}) == (None, None)             # published without O/private/
    assert resolve_cache(local, None, None, known) == (Path("/run/mine"), Path("/run/cache/data/d/validation.parquet"))
    assert resolve_cache(local, tmp_path, Path("/moved/mine"), known) == (
        Path("/moved/mine"), tmp_path / "data" / "d" / "validation.parquet")
    assert resolve_cache(local, None, None, {}) == (None, None)


def fake_evidence(fake_run, tmp_path, capsys):
    out = tmp_path / "o"
    assert fake_run(["--out", str(out)], {"protocol": fake_experiment("protocol")}, capsys)[0] == 0
    return out


def test_the_audit_fails_a_public_file_that_holds_a_local_path(fake_run, tmp_path, capsys):
    """The row needs O/private/ (the paths are named there); with it, a run.py run passes it and a path written
    into a public file (resealed: the manifest level alone would pass it) fails it, naming the file and the path."""
    out = fake_evidence(fake_run, tmp_path, capsys)
    assert local_paths(out, "protocol")["<out>"] == str(out)
    assert row(driver.audit(out), driver.LOCAL_PATHS)["status"] == "PASS"
    with open(out / "run.log", "a", encoding="utf-8") as f:
        f.write(f"a line naming {tmp_path / 'cache'}/data\n")
    reseal(out)
    failed = row(driver.audit(out), driver.LOCAL_PATHS)
    assert failed["status"] == "FAIL"
    assert failed["failures"] == [f"run.log: holds the local path {tmp_path / 'cache'} (run.py writes it as "
                                  "<cache>; the paths stay in O/private/)"]


def test_a_malformed_paths_json_fails_the_row_and_is_not_read(fake_run, tmp_path, capsys):
    out = fake_evidence(fake_run, tmp_path, capsys)
    path = out / "private" / "protocol" / "paths.json"
    doc = json.loads(path.read_text())
    doc["paths"]["<cache>"] = "relative/cache"
    path.write_text(json.dumps(doc))
    reseal(out)
    assert local_paths(out, "protocol") == {}
    failed = row(driver.audit(out), driver.LOCAL_PATHS)
    assert failed["status"] == "FAIL" and failed["failures"][0].startswith("private/protocol/paths.json paths:")


def test_format_2_evidence_records_its_paths_by_design_and_is_still_read(tmp_path):
    from test_audit import tiny_harness_evidence

    out = tiny_harness_evidence(tmp_path / "O")      # format 2, made by hand: no paths.json
    report = driver.audit(out)
    assert report["exit_code"] == 0, [r for r in report["checks"] if r["status"] == "FAIL"]
    skipped = row(report, driver.LOCAL_PATHS)
    assert skipped["status"] == "SKIPPED" and "evidence format 2" in skipped["note"]


def test_audit_py_refuses_a_model_or_cache_that_is_not_a_directory(fake_run, tmp_path, capsys):
    out = fake_evidence(fake_run, tmp_path, capsys)
    for flag in ("--model", "--cache"):
        proc = run_cli("audit.py", out, "--tokens", flag, tmp_path / "nowhere", timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"error: {flag} {tmp_path / 'nowhere'}: not a directory (--cache: the prepared cache; --model: the local "
            "model directory the run read)"]


# ---- real runs of every experiment -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def every_experiment_cache(tiny_cache, prepared_cache, tmp_path_factory):
    """tiny_cache (its files linked) with the MC-TACO fixture's manifest entry too, so that every experiment runs on
    the tiny random model (its data files are tiny_cache's copies of the prepared ones)."""
    import resources

    cache = tmp_path_factory.mktemp("paths") / "cache"
    shutil.copytree(tiny_cache, cache, copy_function=link_or_copy, ignore=shutil.ignore_patterns("results.sqlite*"))
    manifest = resources.load_manifest(cache)
    manifest["resources"]["fixture-mctaco"] = resources.load_manifest(prepared_cache)["resources"]["fixture-mctaco"]
    resources.save_manifest(cache, manifest)
    return cache


def smoke(cache, out, model):
    proc = run_cli("run.py", "--cache", cache, "--out", out, "--smoke", "--model", model, "--no-cache")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "private") == sorted(
        ("protocol", "options", "harness", "mctaco", "extraction"))


def audit(out, *args):
    proc = run_cli("audit.py", out, *args, "--report", out.parent / f"audit-{len(args)}.json", timeout=1800)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def published_copy(out, dest):
    """O as README says to publish it: without O/private/."""
    shutil.copytree(out, dest, ignore=lambda d, names: ["private"] if Path(d) == out else [])
    return dest


@pytest.mark.slow
def test_a_lock_model_run_publishes_no_local_path_and_audits(every_experiment_cache, tmp_path):
    cache, out = every_experiment_cache, tmp_path / "o"
    smoke(cache, out, "tiny-random-llama")
    needles = local_dirs(cache, out, tmp_path)
    assert not leaks(out, needles)
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    assert cfg["model"]["dir"] == cfg["official"]["hflm"]["pretrained"] == "<cache>/models/tiny-random-llama"
    assert json.loads((out / "harness" / "config.json").read_text())["tasks_dir"] == "<repo>/fixtures/harness_tasks"
    assert json.loads((out / "environment.json").read_text())["command_line"][:5] == [
        "run.py", "--cache", "<cache>", "--out", "<out>"]
    proc = audit(out, "--tokens", "--forward", "--cache", cache)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"no local path in the public part .* PASS", proc.stdout), proc.stdout[-3000:]
    proc = audit(published_copy(out, tmp_path / "published"), "--public-only")
    assert proc.returncode == 0 and "RESULT: PASS (public evidence only" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_a_local_model_run_publishes_no_local_path_and_audits_by_flags_or_paths_json(every_experiment_cache,
                                                                                     tmp_path):
    cache, out = every_experiment_cache, tmp_path / "o"
    model = tmp_path / "models" / "my-tiny-llama"
    shutil.copytree(cache / "models" / "tiny-random-llama", model)
    smoke(cache, out, model)
    assert not leaks(out, local_dirs(cache, out, model, tmp_path))
    for name in ("protocol", "harness"):
        cfg = json.loads((out / name / "config.json").read_text())
        assert cfg["model"]["dir"] == cfg["model"]["id"] == cfg["config"]["model"] == "<model:my-tiny-llama>"
        assert json.loads((out / "private" / name / "paths.json").read_text())["paths"]["<model:my-tiny-llama>"] \
            == str(model)
    board = json.loads((out / "harness" / "leaderboard.json").read_text())
    assert "my-tiny-llama" in json.dumps(board) and str(model) not in json.dumps(board)
    # without flags: O/private/<exp>/paths.json names the model and the cache
    proc = audit(out, "--tokens")
    assert proc.returncode == 0, proc.stdout[-3000:]
    # the model moved after the run: paths.json no longer finds it, --model does (and the cache by --cache)
    moved = tmp_path / "elsewhere" / "my-tiny-llama"
    moved.parent.mkdir()
    model.rename(moved)
    proc = audit(out, "--tokens")
    assert proc.returncode == 1 and "INCOMPLETE" in proc.stdout and "--model DIR" in proc.stdout, proc.stdout[-3000:]
    proc = audit(out, "--tokens", "--forward", "--cache", cache, "--model", moved)
    assert proc.returncode == 0, proc.stdout[-3000:]
    proc = audit(published_copy(out, tmp_path / "published"), "--public-only")
    assert proc.returncode == 0 and "RESULT: PASS (public evidence only" in proc.stdout, proc.stdout[-3000:]
