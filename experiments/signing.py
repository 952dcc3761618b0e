"""run.py --sign KEY: the evidence digest signed with OpenSSH's `ssh-keygen -Y sign` (the mechanism git uses to sign
commits); no cryptography of this repository's own.

What is signed: exactly the evidence digest run.py prints and a reader cites, as ASCII bytes: "sha256:" followed by
the 64 lowercase hex digits of sha256(O/MANIFEST.json), 71 bytes, no newline (message()). The namespace is NAMESPACE
(ssh-keygen -n), so a signature made for git or for another tool never verifies as one of these. The signature
(ssh-keygen's armored SSHSIG) goes to O/MANIFEST.json.sig, beside and outside the manifest it signs (written
atomically, then read back and checked to be over the digest with ssh-keygen -Y check-novalidate).

The key and ssh-keygen are checked before any model loads (check_key): a trial signature of PROBE, a message that
can never be a digest. ssh-keygen runs in a new session without a terminal and with SSH_ASKPASS_REQUIRE=never, so it
never asks for a passphrase: a protected key signs through ssh-agent (ssh-add KEY first) or is refused on one line.
Every call is bounded in time (TIMEOUT_S) and output (MAX_OUTPUT).

audit.py verifies the signature with its own copy of these few lines (evidence_audit/signature.py: the audit imports
nothing of the runner); tests/test_signing.py keeps the two namespaces equal."""
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from experiments.evidence import MANIFEST_NAME, SIGNATURE_NAME
from resources import ResourceError, atomic_write_bytes

NAMESPACE = "evidence-digest@item-level-evidence"
PROBE = b"run.py --sign: a check that this key can sign; not an evidence digest\n"
TIMEOUT_S = 60              # a hardware key or an agent that asks for confirmation may take a while
MAX_OUTPUT = 64 * 1024      # what is read of ssh-keygen's stdout and stderr
MAX_KEY_BYTES = 64 * 1024   # an OpenSSH key file is a few KiB (RSA 16384: about 13 KiB)
MAX_SIGNATURE_BYTES = 64 * 1024
GOOD = re.compile(r'Good "[^"\n]*" signature (?:for [^\n]* )?with (\S+) key (SHA256:[A-Za-z0-9+/=]+)')


def message(digest_hex):
    """The bytes signed for an evidence digest: b"sha256:<64 lowercase hex>" (what run.py prints after
    "evidence digest: ")."""
    if not re.fullmatch(r"[0-9a-f]{64}", digest_hex):
        raise ValueError(f"not a sha256 hex digest: {digest_hex!r}")
    return f"sha256:{digest_hex}".encode("ascii")


def ssh_keygen(args, stdin_path=None, cwd=None):
    """(exit code, stdout, stderr) of `ssh-keygen ARGS`, stdin from stdin_path (else empty), no terminal, at most
    TIMEOUT_S seconds and MAX_OUTPUT bytes of each stream. ResourceError when ssh-keygen is missing or hangs."""
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise ResourceError("ssh-keygen not found on PATH: --sign signs the evidence digest with OpenSSH's "
                            "ssh-keygen -Y sign (Debian/Ubuntu: apt-get install openssh-client)")
    env = {**os.environ, "SSH_ASKPASS_REQUIRE": "never"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
        try:
            proc = subprocess.run([exe, *args], stdin=stdin, stdout=out, stderr=err, cwd=cwd, env=env,
                                  timeout=TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise ResourceError(f"ssh-keygen {' '.join(args[:2])} did not finish in {TIMEOUT_S} s (an agent or a "
                                "hardware key waiting for confirmation?)")
        except OSError as e:
            raise ResourceError(f"{exe}: could not start ({e.strerror or e})")
        finally:
            if stdin_path:
                stdin.close()
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read(MAX_OUTPUT).decode("utf-8", "replace"),
                err.read(MAX_OUTPUT).decode("utf-8", "replace"))


def key_path(key):
    """KEY as an absolute path (ssh-keygen runs in a temp directory), after the checks that need no ssh-keygen:
    a regular, readable file of at most MAX_KEY_BYTES."""
    path = Path(os.path.expanduser(str(key))).absolute()
    what = "an OpenSSH private key file (e.g. ~/.ssh/id_ed25519), or its .pub with the key in ssh-agent"
    if not path.exists():
        raise ResourceError(f"--sign {key}: no such file; expected {what}")
    if not path.is_file():
        raise ResourceError(f"--sign {key}: not a regular file; expected {what}")
    if path.stat().st_size > MAX_KEY_BYTES:
        raise ResourceError(f"--sign {key}: {path.stat().st_size} bytes; expected {what} (at most {MAX_KEY_BYTES})")
    if not os.access(path, os.R_OK):
        raise ResourceError(f"--sign {key}: cannot be read (permission denied); expected {what}")
    return path


def key_problem(key, rc, stderr):
    """The one line for a failed ssh-keygen -Y sign with KEY."""
    if "passphrase" in stderr:
        return (f"--sign {key}: the key is protected by a passphrase and no ssh-agent holds it; run.py never asks "
                f"for a passphrase: add it to the agent first (ssh-add {key})")
    too_open = re.search(r"Permissions (\d+) for .* are too open", stderr)
    if too_open:
        return (f"--sign {key}: ssh-keygen refuses a private key that others can read (permissions "
                f"{too_open.group(1)}): chmod 600 {key}")
    if "No private key found" in stderr:
        return f"--sign {key}: a public key whose private key is neither beside it nor in ssh-agent"
    if "Couldn't load public key" in stderr or "invalid format" in stderr:
        return f"--sign {key}: not an OpenSSH key ssh-keygen can load"
    last = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return f"--sign {key}: ssh-keygen -Y sign failed (exit {rc}{': ' + last[-1][:200] if last else ''})"


def sign_bytes(key, data):
    """ssh-keygen -Y sign's armored signature of `data` with KEY in NAMESPACE (ResourceError: one line)."""
    path = key_path(key)
    with tempfile.TemporaryDirectory(prefix="run-sign-") as tmp:
        target = Path(tmp) / "message"
        target.write_bytes(data)
        rc, _, err = ssh_keygen(["-Y", "sign", "-f", str(path), "-n", NAMESPACE, target.name], cwd=tmp)
        sig = target.with_name("message.sig")
        if rc != 0 or not sig.is_file():
            raise ResourceError(key_problem(key, rc, err))
        if sig.stat().st_size > MAX_SIGNATURE_BYTES:
            raise ResourceError(f"--sign {key}: ssh-keygen wrote a signature of {sig.stat().st_size} bytes")
        return sig.read_bytes()


def signer_key(signature, data):
    """"<TYPE> key SHA256:<fingerprint>" of a signature over `data` in NAMESPACE (ssh-keygen -Y check-novalidate:
    the signature is checked, the signer is not looked up), or None when it is not one."""
    with tempfile.TemporaryDirectory(prefix="run-sign-") as tmp:
        (Path(tmp) / "message").write_bytes(data)
        (Path(tmp) / "message.sig").write_bytes(signature)
        rc, out, err = ssh_keygen(["-Y", "check-novalidate", "-n", NAMESPACE, "-s", "message.sig"],
                                  stdin_path=Path(tmp) / "message", cwd=tmp)
    good = GOOD.search(out + err)
    return f"{good.group(1)} key {good.group(2)}" if rc == 0 and good else None


def check_key(key):
    """Before anything loads: ssh-keygen is there and KEY signs (a trial signature of PROBE). Returns the key's
    "<TYPE> key SHA256:..."; ResourceError (one line, exit 2) otherwise."""
    described = signer_key(sign_bytes(key, PROBE), PROBE)
    if described is None:
        raise ResourceError(f"--sign {key}: ssh-keygen -Y sign wrote a signature that ssh-keygen -Y check-novalidate "
                            "does not accept")
    return described


def sign_evidence(out, key, digest_hex):
    """Sign the evidence digest with KEY and write O/MANIFEST.json.sig atomically; return the signing key's
    "<TYPE> key SHA256:...". The file is read back and must be a signature over the digest."""
    data = message(digest_hex)
    path = Path(out) / SIGNATURE_NAME
    try:
        atomic_write_bytes(path, sign_bytes(key, data))
        written = path.read_bytes()[:MAX_SIGNATURE_BYTES + 1]
    except OSError as e:
        raise ResourceError(f"{path}: cannot write the signature ({e.strerror or e})")
    described = signer_key(written, data)
    if described is None:
        raise ResourceError(f"{path}: not the signature of {MANIFEST_NAME}'s digest this run wrote (something "
                            "replaced it)")
    return described
