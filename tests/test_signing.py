"""The evidence digest signed with OpenSSH (run.py --sign KEY, audit.py --lm-eval RUN --sign KEY) and verified
(audit.py --allowed-signers FILE): real ssh-keygen, real ed25519 keys made here, real run.py evidence (the tiny
model, --smoke, one experiment) and real lm-eval output (the 0.4.9.2 fixture run). The forgers: one who reseals an
edit without the author's key (the signature is over the old digest), one who signs with their own key (unknown
key), one who removes the signature; and the refusals, each one line: no ssh-keygen, a key that cannot sign, a
public key given as the allowed-signers file."""
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from evidence_audit import signature
from evidence_audit.lmeval import digest as lmeval_digest
from evidence_audit.mutations import tools
from experiments import signing

NS = signature.NAMESPACE
LMEVAL_RUN = REPO / "tests" / "fixtures" / "lmeval_versions" / "0.4.9.2" / "run"
AUTHOR = "author@example.org"
NO_AGENT = ("SSH_AUTH_SOCK", "SSH_AGENT_PID")


def keygen(*args, stdin=None):
    return subprocess.run(["ssh-keygen", *args], input=stdin, capture_output=True, timeout=60)


def fingerprint(pub):
    """SHA256:... of a public key file, as ssh-keygen -l prints it."""
    return re.search(r"SHA256:\S+", keygen("-l", "-f", str(pub)).stdout.decode()).group(0)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Real ed25519 keys made with ssh-keygen (no passphrase; and one with), and the reader's allowed-signers file,
    which names the author's key only."""
    d = tmp_path_factory.mktemp("keys")
    for name, pw in (("author", ""), ("forger", ""), ("locked", "a passphrase")):
        proc = keygen("-q", "-t", "ed25519", "-N", pw, "-C", name, "-f", str(d / name))
        assert proc.returncode == 0, proc.stderr
    kind, b64 = (d / "author.pub").read_text().split()[:2]
    (d / "allowed_signers").write_text(f"{AUTHOR} {kind} {b64}\n")
    return d


def audit(*args, unset=NO_AGENT, env=None):
    return run_cli("audit.py", *map(str, args), timeout=900, unset=unset, env=env)


def report(path):
    return json.loads(Path(path).read_text())


def row(rep, check):
    rows = [r for r in rep["checks"] if r["check"] == check]
    assert len(rows) == 1, [r["check"] for r in rep["checks"]]
    return rows[0]


def result_line(proc):
    return next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT:"))


def test_one_namespace_and_one_signed_message_for_the_runner_and_the_audit():
    """The runner signs what the audit verifies: the same namespace constant, the same file name, and the signed
    bytes are exactly the digest string run.py prints, "sha256:" + 64 hex, 71 ASCII bytes, no newline."""
    assert signing.NAMESPACE == signature.NAMESPACE == "evidence-digest@item-level-evidence"
    assert signing.SIGNATURE_NAME == signature.SIGNATURE == "MANIFEST.json.sig"
    d = hashlib.sha256(b"x").hexdigest()
    assert signing.message(d) == signature.message(d) == f"sha256:{d}".encode("ascii")
    assert len(signing.message(d)) == 71
    with pytest.raises(ValueError):
        signature.message("SHA256:" + d)


# ---- run.py evidence -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def signed_run(tiny_cache, keys, tmp_path_factory):
    """run.py --sign on the tiny model, one experiment, --smoke: (O, the digest run.py printed)."""
    out = tmp_path_factory.mktemp("signed") / "O"
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", out, "--model", "tiny-random-llama", "--experiment",
                   "protocol", "--smoke", "--no-cache", "--sign", keys / "author", unset=NO_AGENT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = re.search(r"^evidence digest: sha256:([0-9a-f]{64})$", proc.stdout, re.M).group(1)
    said = re.search(r"^evidence signature: (\S+) \(.*ED25519 key (SHA256:\S+)\)$", proc.stdout, re.M)
    assert said and said.groups() == (f"{out}/MANIFEST.json.sig", fingerprint(keys / "author.pub")), proc.stdout
    return out, printed


@pytest.fixture
def copy(signed_run, tmp_path):
    dst = tmp_path / "O"
    shutil.copytree(signed_run[0], dst)
    return dst


def reseal(out):
    """The resealing forger (the mutation self-test's resealed form): report.html rebuilt by report.py from the
    edited evidence, then MANIFEST.json rewritten to match every file; the evidence digest changes with it."""
    assert tools.rebuild_page(out) is None
    tools.seal(out, "manifest")
    return hashlib.sha256((out / "MANIFEST.json").read_bytes()).hexdigest()


def flip_first_label(out):
    p = out / "protocol" / "records.jsonl"
    recs = [json.loads(line) for line in p.read_text().splitlines()]
    recs[0]["label"] = 1 - recs[0]["label"]
    p.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))


@pytest.mark.slow
def test_an_honest_signed_run_verifies_and_names_the_signer(signed_run, keys, tmp_path):
    out, printed = signed_run
    assert hashlib.sha256((out / "MANIFEST.json").read_bytes()).hexdigest() == printed
    # a reader without this repository: the cited digest string, ssh-keygen -Y verify, nothing else
    msg = f"sha256:{printed}".encode("ascii")
    proc = keygen("-Y", "verify", "-f", str(keys / "allowed_signers"), "-I", AUTHOR, "-n", NS, "-s",
                  str(out / "MANIFEST.json.sig"), stdin=msg)
    assert proc.returncode == 0, proc.stderr
    assert keygen("-Y", "verify", "-f", str(keys / "allowed_signers"), "-I", AUTHOR, "-n", NS, "-s",
                  str(out / "MANIFEST.json.sig"), stdin=msg + b"\n").returncode != 0     # exactly those bytes
    proc = audit(out, "--allowed-signers", keys / "allowed_signers", "--report", tmp_path / "a.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"signed by {AUTHOR}, ED25519 key {fingerprint(keys / 'author.pub')}" in result_line(proc)
    rep = report(tmp_path / "a.json")
    assert row(rep, signature.CHECK)["status"] == "PASS" and row(rep, signature.CHECK)["level"] == "manifest"
    assert rep["signature"]["signer"] == AUTHOR and rep["signature"]["status"] == "verified"
    assert rep["signature"]["signed_bytes"] == f"sha256:{printed}"
    # without --allowed-signers the signature is there but not verified: SKIPPED, not requested, never PASS
    proc = audit(out, "--report", tmp_path / "b.json")
    assert proc.returncode == 0 and "signed by" not in result_line(proc)
    skipped = row(report(tmp_path / "b.json"), signature.CHECK)
    assert skipped["status"] == "SKIPPED" and skipped["requested"] is False and "--allowed-signers" in skipped["note"]


@pytest.mark.slow
def test_the_resealing_forger_without_the_key_leaves_a_signature_over_the_old_digest(copy, signed_run, keys):
    flip_first_label(copy)
    new = reseal(copy)
    assert new != signed_run[1]
    proc = audit(copy, "--allowed-signers", keys / "allowed_signers")
    assert proc.returncode == 1
    sig = row(report(copy / "audit.json"), signature.CHECK)
    assert sig["status"] == "FAIL" and "signed by" not in result_line(proc)
    assert sig["first_failure"].startswith(f"MANIFEST.json.sig: a signature by {AUTHOR}")
    assert f"not over sha256:{new}" in sig["first_failure"]


@pytest.mark.slow
def test_a_reseal_no_level_sees_is_caught_by_the_signature_alone(copy, keys):
    """run.log is the file a resealing forger may edit unseen (docs/tampering.md): once resealed every row passes
    but the signature's, which is what a signature adds."""
    with open(copy / "run.log", "a", encoding="utf-8") as f:
        f.write("a line the forger added\n")
    reseal(copy)
    assert audit(copy).returncode == 0
    proc = audit(copy, "--allowed-signers", keys / "allowed_signers")
    assert proc.returncode == 1
    failed = [r["check"] for r in report(copy / "audit.json")["checks"] if r["status"] == "FAIL"]
    assert failed == [signature.CHECK]


@pytest.mark.slow
def test_the_forger_signing_with_their_own_key_is_an_unknown_key_named(copy, keys):
    flip_first_label(copy)
    new = reseal(copy)
    (copy / "MANIFEST.json.sig").write_bytes(signing.sign_bytes(keys / "forger", signing.message(new)))
    proc = audit(copy, "--allowed-signers", keys / "allowed_signers")
    assert proc.returncode == 1
    rep = report(copy / "audit.json")
    sig = row(rep, signature.CHECK)
    assert sig["status"] == "FAIL" and "unknown key" in sig["first_failure"]
    assert f"ED25519 key {fingerprint(keys / 'forger.pub')}" in sig["first_failure"]
    assert rep["signature"]["signer"] is None and rep["signature"]["key"].endswith(fingerprint(keys / "forger.pub"))
    # the same evidence is self-consistent for a reader who accepts the forger's key: the signature says who signed
    kind, b64 = (keys / "forger.pub").read_text().split()[:2]
    (copy.parent / "forger_allowed").write_text(f"forger@example.org {kind} {b64}\n")
    proc = audit(copy, "--allowed-signers", copy.parent / "forger_allowed", "--report", copy.parent / "f.json")
    assert row(report(copy.parent / "f.json"), signature.CHECK)["status"] == "PASS"
    assert "signed by forger@example.org" in result_line(proc)


@pytest.mark.slow
def test_a_removed_signature_fails_when_the_reader_asks_for_one(copy, keys, tmp_path):
    (copy / "MANIFEST.json.sig").unlink()
    proc = audit(copy, "--allowed-signers", keys / "allowed_signers")
    assert proc.returncode == 1
    sig = row(report(copy / "audit.json"), signature.CHECK)
    assert sig["status"] == "FAIL" and sig["first_failure"].startswith("MANIFEST.json.sig: missing")
    proc = audit(copy, "--report", tmp_path / "r.json")       # not asked: no signature row at all
    assert proc.returncode == 0
    assert not [r for r in report(tmp_path / "r.json")["checks"] if r["check"] == signature.CHECK]


@pytest.mark.slow
@pytest.mark.parametrize("forged, expect", [
    (b"-----BEGIN SSH SIGNATURE-----\nnot base64\n-----END SSH SIGNATURE-----\n", "not an SSH signature"),
    (b"x" * (signature.MAX_SIGNATURE_BYTES + 1), f"bytes; expected an SSH signature"),
    ("git namespace", "for another namespace"),
])
def test_a_malformed_or_foreign_signature_fails_at_the_manifest_level(copy, keys, forged, expect):
    if forged == "git namespace":        # the author's key, the right digest, but signed for git
        msg = signing.message(hashlib.sha256((copy / "MANIFEST.json").read_bytes()).hexdigest())
        (copy / "m").write_bytes(msg)
        assert keygen("-Y", "sign", "-f", str(keys / "author"), "-n", "git", str(copy / "m")).returncode == 0
        forged = (copy / "m.sig").read_bytes()
        (copy / "m").unlink()
        (copy / "m.sig").unlink()
    (copy / "MANIFEST.json.sig").write_bytes(forged)
    proc = audit(copy, "--allowed-signers", keys / "allowed_signers")
    assert proc.returncode == 1
    sig = row(report(copy / "audit.json"), signature.CHECK)
    assert sig["status"] == "FAIL" and sig["level"] == "manifest" and expect in sig["first_failure"], sig


# ---- one line, exit 2: no ssh-keygen, a key that cannot sign, a wrong allowed-signers file ----------------------

def without_ssh_keygen(tmp_path):
    """A PATH with git and nothing of OpenSSH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if shutil.which("git"):
        os.symlink(shutil.which("git"), bin_dir / "git")
    return {"PATH": str(bin_dir)}


@pytest.mark.slow
def test_run_py_refuses_before_anything_loads_without_ssh_keygen_or_with_a_key_that_cannot_sign(keys, tmp_path):
    """No cache is prepared here: the signing check comes before the cache, the model and the scoring."""
    def run(key, env=None):
        out = tmp_path / f"O-{key.name}"
        proc = run_cli("run.py", "--cache", tmp_path / "no-cache", "--out", out, "--smoke", "--sign", key, env=env,
                       unset=NO_AGENT, timeout=120)
        assert proc.returncode == 2 and not out.exists(), proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        return lines[0]

    assert run(keys / "author", without_ssh_keygen(tmp_path)).startswith("error: ssh-keygen not found on PATH")
    assert "protected by a passphrase and no ssh-agent holds it" in run(keys / "locked")
    assert "no such file" in run(keys / "absent")
    assert "not an OpenSSH key ssh-keygen can load" in run(keys / "allowed_signers")


def test_the_runner_names_what_is_wrong_with_a_key(keys, tmp_path, monkeypatch):
    for var in NO_AGENT:
        monkeypatch.delenv(var, raising=False)
    assert signing.check_key(keys / "author").endswith(fingerprint(keys / "author.pub"))
    assert signing.check_key(keys / "author.pub")      # the private key beside it
    lonely = tmp_path / "lonely.pub"
    shutil.copy(keys / "author.pub", lonely)
    with pytest.raises(signing.ResourceError, match="neither beside it nor in ssh-agent"):
        signing.check_key(lonely)
    with pytest.raises(signing.ResourceError, match="not a regular file"):
        signing.check_key(tmp_path)
    with pytest.raises(signing.ResourceError, match="passphrase"):
        signing.check_key(keys / "locked")


def test_the_audit_refuses_on_one_line(keys, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LMEVAL_RUN, run)
    cases = [
        (["--allowed-signers", keys / "author.pub"], "line 1: a bare public key"),
        (["--allowed-signers", tmp_path / "absent"], "no such file"),
        (["--sign", keys / "author"], None),      # audit.py OUT --sign: run.py signs its own evidence
    ]
    for extra, expect in cases:
        target = [tmp_path] if expect is None else ["--lm-eval", run]
        proc = audit(*target, *extra)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert expect is None or expect in proc.stderr, proc.stderr
    proc = audit("--lm-eval", run, "--allowed-signers", keys / "allowed_signers", env=without_ssh_keygen(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: ssh-keygen not found on PATH")
    proc = audit("--lm-eval", run, "--sign", keys / "locked")
    assert proc.returncode == 2 and "passphrase" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run / lmeval_digest.DIGEST_FILE).exists()


# ---- lm-eval runs ------------------------------------------------------------------------------------------------

def lm_files(run):
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_an_lm_eval_run_signed_verifies_and_an_edited_samples_file_fails_named(keys, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LMEVAL_RUN, run)
    before = lm_files(run)
    proc = audit("--lm-eval", run, "--sign", keys / "author", "--allowed-signers", keys / "allowed_signers",
                 "--report", tmp_path / "a.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"signed by {AUTHOR}" in result_line(proc)
    after = lm_files(run)
    assert {k: v for k, v in after.items() if k in before} == before      # lm-eval's files untouched
    assert set(after) - set(before) == {lmeval_digest.DIGEST_FILE, lmeval_digest.SIGNATURE_FILE}
    # anyone can recompute the digest: sha256sum's lines of the results and samples files, sorted, then sha256sum
    shell = ("find . -maxdepth 2 -type f \\( -name 'results_*.json' -o -name 'samples_*.jsonl' \\) | sed 's|^\\./||' "
             "| LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum")
    recomputed = subprocess.run(["bash", "-c", shell], cwd=run, capture_output=True, text=True).stdout.split()[0]
    printed = re.search(r"^evidence digest: sha256:([0-9a-f]{64}) ", proc.stdout, re.M).group(1)
    recorded = json.loads((run / lmeval_digest.DIGEST_FILE).read_text())
    assert recomputed == printed and recorded["digest"] == f"sha256:{printed}" and len(recorded["files"]) == 4
    assert keygen("-Y", "verify", "-f", str(keys / "allowed_signers"), "-I", AUTHOR, "-n", NS, "-s",
                  str(run / lmeval_digest.SIGNATURE_FILE), stdin=f"sha256:{printed}".encode()).returncode == 0
    # one samples file edited after signing
    samples = sorted(run.rglob("samples_versions_mc_*.jsonl"))[0]
    lines = samples.read_text().splitlines(keepends=True)
    samples.write_text(lines[0].replace('"doc_id": 0', '"doc_id": 0 ', 1) + "".join(lines[1:]))
    proc = audit("--lm-eval", run, "--allowed-signers", keys / "allowed_signers", "--report", tmp_path / "b.json")
    assert proc.returncode == 1
    rep = report(tmp_path / "b.json")
    files = row(rep, lmeval_digest.FILES_CHECK)
    assert files["status"] == "FAIL" and files["first_failure"].startswith(samples.relative_to(run).as_posix())
    assert row(rep, signature.CHECK)["status"] == "FAIL" and "signed by" not in result_line(proc)


def test_an_lm_eval_forger_who_rewrites_the_digest_file_cannot_sign_it(keys, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LMEVAL_RUN, run)
    assert audit("--lm-eval", run, "--sign", keys / "author").returncode == 0
    samples = sorted(run.rglob("samples_versions_mi_*.jsonl"))[0]
    samples.write_text(samples.read_text().replace('"doc_id": 1', '"doc_id": 1 ', 1))
    # the forger writes evidence-digest.json again for the edited files, with the same code the author used
    files = lmeval_digest.covered_files(run)
    record = json.loads((run / lmeval_digest.DIGEST_FILE).read_text())
    record.update(files=files, digest=f"sha256:{lmeval_digest.digest_of(files)}")
    (run / lmeval_digest.DIGEST_FILE).write_text(json.dumps(record))
    proc = audit("--lm-eval", run, "--allowed-signers", keys / "allowed_signers", "--report", tmp_path / "r.json")
    rep = report(tmp_path / "r.json")
    assert proc.returncode == 1 and row(rep, lmeval_digest.FILES_CHECK)["status"] == "PASS"
    assert f"a signature by {AUTHOR}" in row(rep, signature.CHECK)["first_failure"]
    # ... and signs it with their own key
    (run / lmeval_digest.SIGNATURE_FILE).write_bytes(signature.sign_digest(keys / "forger", lmeval_digest.digest_of(files))[0])
    proc = audit("--lm-eval", run, "--allowed-signers", keys / "allowed_signers", "--report", tmp_path / "r.json")
    failure = row(report(tmp_path / "r.json"), signature.CHECK)["first_failure"]
    assert proc.returncode == 1 and "unknown key" in failure and fingerprint(keys / "forger.pub") in failure
    (run / lmeval_digest.SIGNATURE_FILE).unlink()
    proc = audit("--lm-eval", run, "--allowed-signers", keys / "allowed_signers", "--report", tmp_path / "r.json")
    assert proc.returncode == 1
    assert row(report(tmp_path / "r.json"), signature.CHECK)["first_failure"].startswith(
        f"{lmeval_digest.SIGNATURE_FILE}: missing")
