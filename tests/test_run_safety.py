"""run.py's output directory: one run id everywhere, one run per O (--replace keeps the old one aside),
leftovers of a killed run swept, an unusable --out refused before anything is loaded, environment.json only after
evidence was installed, MANIFEST.json last with the evidence digest, a disk that fills mid-run stops with one line.

Fast: fake experiments (the experiments/context.py contract without a model), run.py's run_all/main in-process.
Read-only and full-disk --out use small tmpfs mounts (root only; skipped elsewhere): root bypasses permission
bits, so "read-only" is a tmpfs remounted ro, not chmod."""
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

import run as run_py
from experiments.context import Data, Inputs, Result
from experiments.evidence import IdentityMismatch
from experiments.runlog import LibraryChatter


def fake_experiment(name, records=None, fail=False, private=True):
    import types

    module = types.ModuleType(f"fake_{name}")
    module.NAME, module.CONFIG_SECTIONS = name, ("shared", "protocol")
    module.data_label = lambda ctx: "fake-data"

    def run(ctx):
        if fail:
            raise IdentityMismatch(f"{name}: a planted mismatch", [(0, "prompt_sha256", "a", "b")])
        return Result(config={"experiment": name}, records=records or [{"idx": 0, "score": 0.25}],
                      summary={"experiment": name, "n_items": 1, "accuracy": 0.5}, headline=f"{name} finished",
                      token_stats={}, prompt_template_sha256="p" * 64,
                      private={"texts.jsonl": '{"idx": 0, "text": "t"}\n'} if private else {})
    module.run = run
    return module


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """run(argv, modules) -> (exit code, stdout, stderr) through run.main with fake experiments and inputs."""
    loaded = []

    def go(argv, modules, capsys):
        def imports(names, chatter):
            loaded.append(names)
            return {n: modules[n] for n in names if n in modules}, 0.1
        monkeypatch.setattr(run_py, "import_experiments", imports)
        monkeypatch.setattr(run_py, "verified_inputs", lambda args, modules, routed=None: Inputs(
            cache=tmp_path / "cache", model_dir=tmp_path, model_identity={"id": "m", "model_sha256": "m" * 64,
                                                                          "tokenizer_sha256": "t" * 64},
            data={"fixture-sentiment": Data(id="fixture-sentiment", schema="sst2",
                                        parquet_path=tmp_path / "p.parquet", content_sha256="d" * 64,
                                        split="validation")}))
        names = [a for n in modules for a in ("--experiment", n)]
        code = run_py.main(["--cache", str(tmp_path / "cache"), "--smoke", *names, *argv])
        out = capsys.readouterr()
        return code, out.out, out.err
    go.loaded = loaded
    return go


def two(fail_second=False):
    return {"protocol": fake_experiment("protocol"), "options": fake_experiment("options", fail=fail_second)}


def read(path):
    return json.loads(Path(path).read_text())


def one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_run_id_is_everywhere_and_the_manifest_is_last(fake_run, tmp_path, capsys):
    """One run id (32 hex) in every identity.json, environment.json, MANIFEST.json, private run.json and the
    report's meta; the manifest lists every public file with its size and sha256 (run.log and report.html too, not
    private/), the private halves by digest; the digest printed is sha256 of MANIFEST.json; no dot-file is left."""
    out = tmp_path / "o"
    code, stdout, _ = fake_run(["--out", str(out)], two(), capsys)
    assert code == 0
    manifest_bytes = (out / "MANIFEST.json").read_bytes()
    manifest = json.loads(manifest_bytes)
    rid = manifest["run_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    assert set(manifest) == {"format", "run_id", "experiments", "failed", "files", "private", "evidence_format"}
    assert manifest["format"] == "evidence-manifest/v1" and manifest["evidence_format"] == 3
    assert manifest["experiments"] == ["protocol", "options"] and manifest["failed"] == []
    assert read(out / "environment.json")["run_id"] == rid
    env = read(out / "environment.json")
    for name in ("protocol", "options"):
        ident = read(out / name / "identity.json")
        assert ident["run_id"] == rid
        assert {k: ident[k] for k in ("git_commit", "git_dirty", "code_sha256")} == \
            {k: env[k] for k in ("git_commit", "git_dirty", "code_sha256")}
        assert read(out / "private" / name / "run.json") == {"experiment": name, "run_id": rid, "evidence_format": 3}
        assert read(out / "private" / name / "paths.json")["paths"]["<out>"] == str(out)
    assert f'<meta name="evidence-run-id" content="{rid}">' in (out / "report.html").read_text()
    public = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
                    and p.relative_to(out).parts[0] != "private" and p.name != "MANIFEST.json")
    assert sorted(manifest["files"]) == public and "run.log" in public and "report.html" in public
    for rel, meta in manifest["files"].items():
        data = (out / rel).read_bytes()
        assert meta == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    lines = "".join(sorted(f"{rel}\t{hashlib.sha256((out / 'private/protocol' / rel).read_bytes()).hexdigest()}\n"
                           for rel in ("paths.json", "run.json", "texts.jsonl")))
    assert manifest["private"]["protocol"] == {"n_files": 3, "sha256": hashlib.sha256(lines.encode()).hexdigest()}
    assert f"evidence digest: sha256:{hashlib.sha256(manifest_bytes).hexdigest()}" in stdout
    assert not [p for p in out.rglob(".*")], "a successful run leaves no dot-file or dot-dir in O"


def test_a_rerun_is_refused_and_replace_keeps_the_old_evidence_aside(fake_run, tmp_path, capsys):
    out = tmp_path / "o"
    assert fake_run(["--out", str(out)], two(), capsys)[0] == 0
    old_id = read(out / "MANIFEST.json")["run_id"]
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    n_loaded = len(fake_run.loaded)
    code, _, err = fake_run(["--out", str(out)], two(), capsys)
    assert code == 2 and "already holds the evidence of an earlier run" in one_error_line(err)
    assert len(fake_run.loaded) == n_loaded, "refused before the experiments (and the models) were loaded"
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    code, stdout, _ = fake_run(["--out", str(out), "--replace"], two(), capsys)
    aside = tmp_path / f"o.replaced-{old_id}"
    assert code == 0 and f"moved to {aside}" in stdout
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == before
    assert read(out / "MANIFEST.json")["run_id"] != old_id


@pytest.mark.parametrize("held", ["environment.json", "MANIFEST.json", "protocol", "options.FAILED.json",
                                  "private/protocol"])
def test_any_piece_of_earlier_evidence_makes_the_out_refused(fake_run, tmp_path, capsys, held):
    out = tmp_path / "o"
    target = out / held
    target.parent.mkdir(parents=True)
    if "." in held:
        target.write_text("{}")
    else:
        target.mkdir()
    code, _, err = fake_run(["--out", str(out)], two(), capsys)
    assert code == 2 and held.split("/")[0] in one_error_line(err)


# A run.py process with the fake protocol experiment that writes its pre-registration and is then SIGKILLed: in the
# experiment ("experiment"), or with its evidence written into its temp directories, before the rename ("install").
KILLED_RUN = r"""
import os, signal, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
import resources
import run as run_py
from experiments.context import Data, Inputs
from test_run_safety import fake_experiment

out, where = Path(sys.argv[2]), sys.argv[3]
module = fake_experiment("protocol")
inner = module.run


def run(ctx):
    resources.atomic_write_text(out / "protocol.preregistration.json", "{}")
    if where == "experiment":
        os.kill(os.getpid(), signal.SIGKILL)
    return inner(ctx)


module.run = run
if where == "install":
    run_py.install = lambda tmp, final, run_id: os.kill(os.getpid(), signal.SIGKILL)
run_py.import_experiments = lambda names, chatter: ({"protocol": module}, 0.1)
run_py.verified_inputs = lambda args, modules, routed=None: Inputs(
    cache=out.parent / "cache", model_dir=out.parent,
    model_identity={"id": "m", "model_sha256": "m" * 64, "tokenizer_sha256": "t" * 64},
    data={"fixture-sentiment": Data(id="fixture-sentiment", schema="sst2", parquet_path=out.parent / "p.parquet",
                                    content_sha256="d" * 64, split="validation")})
sys.exit(run_py.main(["--cache", str(out.parent / "cache"), "--out", str(out), "--smoke", "--experiment", "protocol"]))
"""


def killed_run(out, where):
    """Run KILLED_RUN into `out`; the run id its marker names."""
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(repo), str(out), where], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    return read(out / ".run-in-progress")["run_id"]


def test_leftovers_of_a_killed_run_are_swept_with_one_line(fake_run, tmp_path, capsys):
    """A run killed with its evidence in its temp directories leaves them (named with its run id), its log, its
    pre-registration and its O/.run-in-progress: the next run removes exactly those, on one line naming the run."""
    out = tmp_path / "o"
    rid = killed_run(out, "install")
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.parent in (out, out / "private"))
    assert left == sorted([".run-in-progress", f".tmp-protocol-{rid}", "private", f"private/.tmp-protocol-{rid}",
                           "protocol.preregistration.json", "run.log"]), left
    code, stdout, _ = fake_run(["--out", str(out)], two(), capsys)
    assert code == 0
    swept = [line for line in stdout.splitlines() if line.startswith("removed")]
    assert len(swept) == 1 and f"run {rid}" in swept[0], stdout
    for name in (f".tmp-protocol-{rid}", "private", "protocol.preregistration.json", "run.log"):
        assert name in swept[0]
    assert not [p for p in out.rglob(".*")]
    assert read(out / "MANIFEST.json")["run_id"] != rid


def test_out_that_is_a_file_is_refused_before_anything_loads(fake_run, tmp_path, capsys):
    out = tmp_path / "o"
    out.write_text("not a directory")
    code, _, err = fake_run(["--out", str(out)], two(), capsys)
    assert code == 2 and "exists and is not a directory" in one_error_line(err)
    assert fake_run.loaded == [] and out.read_text() == "not a directory"


def fill(directory):
    """Fill the file system of `directory` to the last byte (a file named filler)."""
    fd = os.open(Path(directory) / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size, ro=False) -> a fresh tmpfs directory (root only), unmounted afterwards."""
    mounts = []

    def mount(size, ro=False):
        d = tmp_path / f"mnt{len(mounts)}"
        d.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                                               capture_output=True).returncode != 0:
            pytest.skip("needs root and tmpfs mounts")
        mounts.append(d)
        (d / "o").mkdir()               # an existing, empty --out inside it
        if ro:
            subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        return d
    yield mount
    for d in reversed(mounts):
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.mark.parametrize("where", ["read-only", "full", "small"])
def test_unusable_out_disk_is_refused_before_anything_loads(fake_run, tmpfs, capsys, where):
    """read-only: a tmpfs remounted ro (root ignores chmod); full: a 64 KiB tmpfs filled to the last byte; small: an
    empty 64 KiB tmpfs (the probe asks for 1 MiB). A new O inside it and an existing empty O are both refused."""
    mnt = tmpfs("64k", ro=(where == "read-only"))
    if where == "full":
        fill(mnt)
    for out in (mnt / "new" / "o", mnt / "o"):
        code, _, err = fake_run(["--out", str(out)], two(), capsys)
        line = one_error_line(err)
        assert code == 2 and str(mnt) in line
        assert ("read-only" in line) if where == "read-only" else ("disk is full" in line)
    assert fake_run.loaded == [] and not (mnt / "new").exists()
    assert not [p for p in mnt.rglob(".*")], "the probe file is removed"


def test_disk_full_while_writing_evidence_stops_with_one_line_and_keeps_what_was_installed(fake_run, tmpfs,
                                                                                             capsys):
    """O on a 2 MiB tmpfs: the first experiment's evidence fits, the second's 3 MB of records do not. Exit 2, one
    error line, no temp directory left, the first experiment's evidence installed, manifested and intact."""
    mnt = tmpfs("2m")
    big = [{"idx": i, "pad": "x" * 1000} for i in range(3000)]
    modules = {"protocol": fake_experiment("protocol"), "options": fake_experiment("options", records=big)}
    code, stdout, err = fake_run(["--out", str(mnt / "o")], modules, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "could not write evidence" in errors[0] and "Traceback" not in err
    out = mnt / "o"
    assert not (out / "options").exists() and not [p for p in out.rglob(".tmp-*")]
    assert (out / "protocol" / "records.jsonl").read_text() == '{"idx": 0, "score": 0.25}\n'
    manifest = read(out / "MANIFEST.json")
    assert manifest["experiments"] == ["protocol"]
    assert read(out / "environment.json")["run_id"] == manifest["run_id"]


def test_a_failed_run_writes_no_environment_and_manifests_the_failure(fake_run, tmp_path, capsys):
    out = tmp_path / "o"
    modules = {"protocol": fake_experiment("protocol", fail=True)}
    code, stdout, _ = fake_run(["--out", str(out)], modules, capsys)
    assert code == 1
    assert not (out / "environment.json").exists() and not (out / "protocol").exists()
    manifest = read(out / "MANIFEST.json")
    assert manifest["experiments"] == [] and manifest["failed"] == ["protocol"]
    assert "protocol.FAILED.json" in manifest["files"]
    # the other experiment of a mixed run installs; environment.json is then written, after all experiments
    out2 = tmp_path / "o2"
    code, _, _ = fake_run(["--out", str(out2)], two(fail_second=True), capsys)
    assert code == 1 and read(out2 / "MANIFEST.json")["failed"] == ["options"]
    assert read(out2 / "environment.json")["run_id"] == read(out2 / "protocol" / "identity.json")["run_id"]


def test_environment_json_is_written_after_the_experiments(fake_run, tmp_path, capsys, monkeypatch):
    """A run killed during its experiments leaves no environment.json next to evidence it did not make."""
    out = tmp_path / "o"
    seen = {}
    module = fake_experiment("protocol")
    inner = module.run

    def run(ctx):
        seen["environment_during_run"] = (out / "environment.json").exists()
        time.sleep(0.01)
        return inner(ctx)
    module.run = run
    assert fake_run(["--out", str(out)], {"protocol": module}, capsys)[0] == 0
    assert seen == {"environment_during_run": False} and (out / "environment.json").exists()


def test_an_out_holding_other_files_is_refused(fake_run, tmp_path, capsys):
    """Every file in O becomes part of the evidence (MANIFEST.json lists it): a directory holding files no run
    writes (somebody's home, a source tree) is refused, untouched."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = fake_run(["--out", str(out)], two(), capsys)
    assert code == 2 and "notes.txt" in one_error_line(err) and "no run writes" in err
    assert fake_run.loaded == [] and sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_what_a_run_that_installed_nothing_left_is_swept(fake_run, tmp_path, capsys):
    """A run stopped by bad input after O was made leaves its run.log, a pre-registration and its marker, but no
    evidence: the next run into O removes them, saying which run left them and why they are its own, and starts a
    fresh log."""
    from resources import ResourceError

    out = tmp_path / "o"
    module = fake_experiment("protocol")

    def run(ctx):
        (ctx.options.out / "protocol.preregistration.json").write_text("{}")
        raise ResourceError("a planted bad input")
    module.run = run
    code, _, err = fake_run(["--out", str(out)], {"protocol": module}, capsys)
    assert code == 2 and "a planted bad input" in one_error_line(err)
    rid = read(out / ".run-in-progress")["run_id"]
    assert sorted(p.name for p in out.iterdir()) == [".run-in-progress", "protocol.preregistration.json", "run.log"]
    code, stdout, _ = fake_run(["--out", str(out)], two(), capsys)
    assert code == 0
    swept = [line for line in stdout.splitlines() if line.startswith("removed")]
    assert len(swept) == 1 and f"run {rid}" in swept[0] and "it ended (stopped by an error (exit 2); no evidence installed) without a manifest" in swept[0], stdout
    assert "run.log" in swept[0] and "protocol.preregistration.json" in swept[0] and "claimed" in swept[0]
    assert not (out / "protocol.preregistration.json").exists() and rid not in (out / "run.log").read_text()


def test_temp_dirs_live_inside_the_area_they_become(fake_run, tmp_path, capsys, monkeypatch):
    """Public evidence is written in O/.tmp-<exp>-*, private texts in O/private/.tmp-<exp>-* (never outside
    O/private/, which is what a publisher leaves out); both are renamed into place."""
    moves = []
    real_install = run_py.install

    def install(tmp, final, run_id):
        moves.append((Path(tmp), Path(final), sorted(p.name for p in Path(tmp).iterdir())))
        real_install(tmp, final, run_id)
    monkeypatch.setattr(run_py, "install", install)
    out = tmp_path / "o"
    assert fake_run(["--out", str(out)], {"protocol": fake_experiment("protocol")}, capsys)[0] == 0
    (pub_tmp, pub, pub_files), (priv_tmp, priv, priv_files) = moves
    assert pub_tmp.parent == out and pub_tmp.name.startswith(".tmp-protocol-") and pub == out / "protocol"
    assert priv_tmp.parent == out / "private" and priv_tmp.name.startswith(".tmp-protocol-")
    assert priv == out / "private" / "protocol" and priv_files == ["paths.json", "run.json", "texts.jsonl"]
    assert "texts.jsonl" not in pub_files


def test_a_disk_that_refuses_the_manifest_makes_the_run_exit_2(fake_run, tmp_path, capsys, monkeypatch):
    """Fault injection: writing MANIFEST.json fails (ENOSPC): one error line, exit 2 (not 0), the experiments'
    evidence stays installed, no temp file is left."""
    import errno

    import run as run_py

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(run_py, "write_manifest", full)      # what run.py calls to write MANIFEST.json
    out = tmp_path / "o"
    code, _, err = fake_run(["--out", str(out)], two(), capsys)
    assert code == 2 and "could not be written (No space left on device)" in one_error_line(err)
    assert (out / "protocol" / "records.jsonl").exists() and not (out / "MANIFEST.json").exists()
    assert not [p for p in out.rglob(".*")]


def test_stages_never_nest():
    """A stage opened inside another raises: the audit adds the stages up to the wall time, so a nested one (a
    model load timed inside the scoring stage that triggered it) would be counted twice."""
    from experiments.evidence import Stages

    stages = Stages()
    with stages.stage("load"):
        pass
    with pytest.raises(RuntimeError, match="'load' opened inside stage 'score'"):
        with stages.stage("score"):
            with stages.stage("load"):
                pass
    with stages.stage("write"):
        pass
    assert [s["name"] for s in stages.stages] == ["load", "write"]
