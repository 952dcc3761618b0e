"""The evidence digest's signature, checked with OpenSSH's ssh-keygen -Y (the mechanism git uses to sign commits):
`-Y check-novalidate` (is it a signature over these bytes, and by which key), `-Y find-principals` (whom the reader's
allowed-signers file names for that key) and `-Y verify` (the signature, the principal and the namespace together).
No cryptography of this package's own. `audit.py --lm-eval RUN --sign KEY` also signs with `-Y sign` (sign_bytes).

What is signed: the digest string a reader cites, as ASCII bytes, "sha256:" and 64 lowercase hex digits, no newline
(message()): for run.py evidence the sha256 of O/MANIFEST.json's bytes, for an lm-eval run the digest of
lmeval/digest.py. The namespace is NAMESPACE (the same constant as experiments/signing.py, which run.py signs with:
the audit imports nothing of the runner, so these few lines that call ssh-keygen are its own copy).

What a verified signature says: the holder of a key the reader's allowed-signers file names signed this digest. A
forger who edits the evidence and reseals every hash cannot sign the new digest as the author without the author's
key; but a signature says who vouched for the files, not that their numbers are right (the levels say that).

ssh-keygen runs in a temp directory, in a new session without a terminal, at most TIMEOUT_S seconds, and at most
MAX_OUTPUT bytes of each stream are read; the signature file (evidence: anyone may have written it) and the
allowed-signers file are bounded in size before they are read."""
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from evidence_audit.checks import cut, short

NAMESPACE = "evidence-digest@item-level-evidence"
SIGNATURE = "MANIFEST.json.sig"     # beside O/MANIFEST.json, outside the manifest it signs
CHECK = f"signature (ssh-keygen -Y verify -n {NAMESPACE})"
TIMEOUT_S = 60
MAX_OUTPUT = 64 * 1024
MAX_SIGNATURE_BYTES = 64 * 1024     # an armored SSH signature is a few hundred bytes (RSA 16384: about 3 KiB)
MAX_ALLOWED_SIGNERS_BYTES = 1 << 20
MAX_KEY_BYTES = 64 * 1024
DIGEST = re.compile(r"[0-9a-f]{64}")
GOOD = re.compile(r'Good "[^"\n]*" signature (?:for [^\n]* )?with (\S+) key (SHA256:[A-Za-z0-9+/=]+)')
DOCS = "docs/citing.md"


class SignatureError(Exception):
    """A signature that cannot be made or checked here (no ssh-keygen, a key or an allowed-signers file that cannot
    be used): one line, exit 2 before the audit, INCOMPLETE inside it. Never a verdict on the evidence."""


def message(digest_hex):
    """The signed bytes for a digest: b"sha256:<64 lowercase hex>"."""
    if not (isinstance(digest_hex, str) and DIGEST.fullmatch(digest_hex)):
        raise ValueError(f"not a sha256 hex digest: {digest_hex!r}")
    return f"sha256:{digest_hex}".encode("ascii")


def ssh_keygen(args, stdin_path=None, cwd=None):
    """(exit code, stdout, stderr) of `ssh-keygen ARGS`: stdin from stdin_path (else empty), no terminal, no askpass,
    at most TIMEOUT_S seconds and MAX_OUTPUT bytes of each stream. SignatureError when it is missing or hangs."""
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise SignatureError("ssh-keygen not found on PATH: signatures are made and checked with OpenSSH's "
                             "ssh-keygen -Y (Debian/Ubuntu: apt-get install openssh-client)")
    env = {**os.environ, "SSH_ASKPASS_REQUIRE": "never"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
        try:
            proc = subprocess.run([exe, *args], stdin=stdin, stdout=out, stderr=err, cwd=cwd, env=env,
                                  timeout=TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise SignatureError(f"ssh-keygen {' '.join(args[:2])} did not finish in {TIMEOUT_S} s")
        except OSError as e:
            raise SignatureError(f"{exe}: could not start ({e.strerror or e})")
        finally:
            if stdin_path:
                stdin.close()
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read(MAX_OUTPUT).decode("utf-8", "replace"),
                err.read(MAX_OUTPUT).decode("utf-8", "replace"))


def last_line(text, what="no message"):
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return cut(lines[-1], 160) if lines else what


# ---- the reader's side: --allowed-signers FILE -------------------------------------------------------------------

def check_allowed_signers(path):
    """--allowed-signers FILE before the audit: ssh-keygen is on PATH, FILE is a regular file of at most
    MAX_ALLOWED_SIGNERS_BYTES in UTF-8 with at least one allowed-signers line and no bare public key line (the usual
    slip: the .pub file itself). Returns the absolute path; SignatureError (one line) otherwise."""
    if shutil.which("ssh-keygen") is None:
        ssh_keygen([])          # raises: the one line naming ssh-keygen
    given, path = path, Path(path).absolute()
    expected = f"expected an allowed-signers file: lines 'PRINCIPAL KEYTYPE BASE64KEY' ({DOCS})"
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise SignatureError(f"--allowed-signers {given}: not a regular file; {expected}")
        if st.st_size > MAX_ALLOWED_SIGNERS_BYTES:
            raise SignatureError(f"--allowed-signers {given}: {st.st_size} bytes, over {MAX_ALLOWED_SIGNERS_BYTES}; "
                                 f"{expected}")
        with open(path, "rb") as f:
            text = f.read(MAX_ALLOWED_SIGNERS_BYTES + 1).decode("utf-8")
    except FileNotFoundError:
        raise SignatureError(f"--allowed-signers {given}: no such file; {expected}")
    except OSError as e:
        raise SignatureError(f"--allowed-signers {given}: cannot read ({e.strerror}); {expected}")
    except UnicodeDecodeError:
        raise SignatureError(f"--allowed-signers {given}: not UTF-8 text; {expected}")
    entries = [(n, ln.split()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip() and
               not ln.lstrip().startswith("#")]
    for n, words in entries:
        if words[0].startswith(("ssh-", "ecdsa-", "sk-")):
            raise SignatureError(f"--allowed-signers {given}: line {n}: a bare public key ({short(words[0], 40)} ...); "
                                 f"{expected}, e.g. 'alice@example.org {words[0]} AAAA...'")
    if not entries:
        raise SignatureError(f"--allowed-signers {given}: no allowed-signers line; {expected}")
    return path


def read_signature(path, label):
    """(the signature's bytes, None) or (None, the failure): a regular file of at most MAX_SIGNATURE_BYTES."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{label}: not a regular file (a symlink, directory or device); expected an SSH signature"
        if st.st_size > MAX_SIGNATURE_BYTES:
            return None, (f"{label}: {st.st_size} bytes; expected an SSH signature (a few hundred bytes, at most "
                          f"{MAX_SIGNATURE_BYTES})")
        with open(path, "rb") as f:
            return f.read(MAX_SIGNATURE_BYTES + 1), None
    except OSError as e:
        return None, f"{label}: cannot read ({e.strerror}); expected an SSH signature"


def unverified_problem(label, err, principals, allowed, cited):
    """The failure of a signature ssh-keygen -Y check-novalidate refused over the cited digest."""
    who = (f"by {', '.join(principals)} ({allowed} names its key)" if principals
           else f"by a key {allowed} does not list")
    if "parse" in err or "armor" in err or "header" in err or "signature version" in err.lower():
        return f"{label}: not an SSH signature ssh-keygen can read (ssh-keygen: {last_line(err)})"
    if "namespace" in err:
        return (f"{label}: a signature {who} for another namespace than {NAMESPACE} (ssh-keygen: "
                f"{last_line(err)}); not a signature of an evidence digest")
    return (f"{label}: a signature {who}, but not over {cited} (ssh-keygen: {last_line(err)}): it signs other bytes; "
            "the evidence changed after it was signed, or the signature is another evidence's")


def verify(signature, allowed, digest_hex, label):
    """(principals, key, failure): whom FILE names for the key of `signature` (a valid signature over the digest
    string in NAMESPACE, checked by ssh-keygen -Y verify for one of them), the key ("ED25519 key SHA256:...", None
    when the signature is not one over the digest), and the failure (None when verified)."""
    cited, file = message(digest_hex).decode("ascii"), str(Path(allowed).absolute())     # ssh-keygen runs in tmp
    with tempfile.TemporaryDirectory(prefix="audit-signature-") as tmp:
        msg, sig = Path(tmp) / "message", Path(tmp) / "signature"
        msg.write_bytes(message(digest_hex))
        sig.write_bytes(signature)
        rc, out, err = ssh_keygen(["-Y", "check-novalidate", "-n", NAMESPACE, "-s", sig.name], msg, tmp)
        good = GOOD.search(out + err) if rc == 0 else None
        key = f"{good.group(1)} key {good.group(2)}" if good else None
        rc_p, out_p, err_p = ssh_keygen(["-Y", "find-principals", "-s", sig.name, "-f", file], None, tmp)
        principals = [ln.strip() for ln in out_p.splitlines() if ln.strip()] if rc_p == 0 else []
        if key is None:
            return principals, None, unverified_problem(label, err, principals, allowed, cited)
        if not principals:
            notes = [ln.strip() for ln in err_p.splitlines() if ln.strip() and "No principal matched" not in ln]
            return [], key, (f"{label}: signed by {key}, which {allowed} lists for no principal: an unknown key, not "
                             f"a signer this reader accepts" + (f" (ssh-keygen: {cut(notes[0], 120)})"
                                                                if notes else ""))
        refusals = []
        for principal in principals:
            rc_v, out_v, err_v = ssh_keygen(["-Y", "verify", "-f", file, "-I", principal, "-n", NAMESPACE,
                                             "-s", sig.name], msg, tmp)
            if rc_v == 0:
                return [principal], key, None
            refusals.append(last_line(err_v + out_v))
    return principals, key, (f"{label}: signed by {key}, which {allowed} names {', '.join(principals)}, but ssh-keygen "
                             f"-Y verify refuses it for them ({refusals[0]}; e.g. a namespaces= or valid-before= "
                             "restriction of that line)")


def signature_row(C, level, sig_path, label, digest_hex, allowed, against):
    """The signature row of one audit; returns report["signature"] (None when there is neither a signature nor
    --allowed-signers). `digest_hex`: the digest recomputed from the evidence here (None when it cannot be: the row
    is then SKIPPED); `against`: what it is the digest of, for the messages; `allowed`: --allowed-signers FILE
    (already checked) or None. Without it a present signature is SKIPPED, not requested: never passed unchecked."""
    present = os.path.lexists(sig_path)
    info = {"file": label, "namespace": NAMESPACE, "allowed_signers": str(allowed) if allowed else None,
            "signed_bytes": message(digest_hex).decode("ascii") if digest_hex else None,
            "status": None, "signer": None, "key": None}
    if allowed is None:
        if not present:
            return None
        C.skip("-", level, CHECK, f"{label} present but NOT verified: give --allowed-signers FILE (the signers you "
               f"accept; {DOCS})", requested=False)
        return {**info, "status": "not verified"}
    if digest_hex is None:
        C.skip("-", level, CHECK, f"{against} missing: no digest to check {label} against")
        return {**info, "status": "not verified"}
    if not present:
        C.add("-", level, CHECK, 1, [f"{label}: missing; --allowed-signers asks for a signature of "
                                     f"{info['signed_bytes']} (the digest of {against}) by a signer {allowed} names"])
        return {**info, "status": "missing"}
    signature, failure = read_signature(sig_path, label)
    principals, key = [], None
    if failure is None:
        try:
            principals, key, failure = verify(signature, allowed, digest_hex, label)
        except SignatureError as e:     # not a verdict on the evidence: the check could not run here
            C.skip("-", level, CHECK, f"{label}: {e}")
            return {**info, "status": "not verified"}
    C.add("-", level, CHECK, 1, [failure] if failure else [])
    return {**info, "status": "failed" if failure else "verified", "key": key,
            "signer": None if failure else ", ".join(principals)}


# ---- the author's side: audit.py --lm-eval RUN --sign KEY -------------------------------------------------------

def key_path(key):
    """KEY as an absolute path, after the checks that need no ssh-keygen (a readable regular file, bounded)."""
    path = Path(os.path.expanduser(str(key))).absolute()
    what = "an OpenSSH private key file (e.g. ~/.ssh/id_ed25519), or its .pub with the key in ssh-agent"
    try:
        st = path.stat()
    except OSError as e:
        raise SignatureError(f"--sign {key}: {'no such file' if not path.exists() else e.strerror}; expected {what}")
    if not stat.S_ISREG(st.st_mode):
        raise SignatureError(f"--sign {key}: not a regular file; expected {what}")
    if st.st_size > MAX_KEY_BYTES:
        raise SignatureError(f"--sign {key}: {st.st_size} bytes; expected {what} (at most {MAX_KEY_BYTES})")
    if not os.access(path, os.R_OK):
        raise SignatureError(f"--sign {key}: cannot be read (permission denied); expected {what}")
    return path


def key_problem(key, rc, err):
    """The one line for a failed ssh-keygen -Y sign with KEY."""
    too_open = re.search(r"Permissions (\d+) for .* are too open", err)
    if "passphrase" in err:
        return (f"--sign {key}: the key is protected by a passphrase and no ssh-agent holds it; audit.py never asks "
                f"for a passphrase: add it to the agent first (ssh-add {key})")
    if too_open:
        return f"--sign {key}: ssh-keygen refuses a private key others can read (permissions {too_open.group(1)})"
    if "No private key found" in err:
        return f"--sign {key}: a public key whose private key is neither beside it nor in ssh-agent"
    if "Couldn't load public key" in err or "invalid format" in err:
        return f"--sign {key}: not an OpenSSH key ssh-keygen can load"
    return f"--sign {key}: ssh-keygen -Y sign failed (exit {rc}: {last_line(err)})"


def sign_bytes(key, data):
    """ssh-keygen -Y sign's armored signature of `data` with KEY in NAMESPACE (SignatureError: one line)."""
    path = key_path(key)
    with tempfile.TemporaryDirectory(prefix="audit-sign-") as tmp:
        (Path(tmp) / "message").write_bytes(data)
        rc, _, err = ssh_keygen(["-Y", "sign", "-f", str(path), "-n", NAMESPACE, "message"], None, tmp)
        sig = Path(tmp) / "message.sig"
        if rc != 0 or not sig.is_file() or sig.stat().st_size > MAX_SIGNATURE_BYTES:
            raise SignatureError(key_problem(key, rc, err))
        return sig.read_bytes()


def signing_key(signature, data):
    """"<TYPE> key SHA256:..." of a valid signature over `data` in NAMESPACE (ssh-keygen -Y check-novalidate), or
    None."""
    with tempfile.TemporaryDirectory(prefix="audit-sign-") as tmp:
        (Path(tmp) / "message").write_bytes(data)
        (Path(tmp) / "message.sig").write_bytes(signature)
        rc, out, err = ssh_keygen(["-Y", "check-novalidate", "-n", NAMESPACE, "-s", "message.sig"],
                                  Path(tmp) / "message", tmp)
    good = GOOD.search(out + err)
    return f"{good.group(1)} key {good.group(2)}" if rc == 0 and good else None


def sign_digest(key, digest_hex):
    """(the signature of the digest string with KEY, the key's "<TYPE> key SHA256:...")."""
    signature = sign_bytes(key, message(digest_hex))
    described = signing_key(signature, message(digest_hex))
    if described is None:
        raise SignatureError(f"--sign {key}: ssh-keygen -Y check-novalidate does not accept the signature "
                             "ssh-keygen -Y sign just made")
    return signature, described
