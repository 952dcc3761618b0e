"""A signed digest of an lm-eval run's own files: `audit.py --lm-eval RUN --sign KEY` writes it for the run's author,
`audit.py --lm-eval RUN --allowed-signers FILE` verifies it (signature.py: ssh-keygen -Y).

The digest, which anyone can recompute without this repository (coreutils; GNU find and xargs):

    cd RUN && find . -maxdepth 2 -type f \\( -name 'results_*.json' -o -name 'samples_*.jsonl' \\) | sed 's|^\\./||' \\
        | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum

that is: the sha256 of the lines "<sha256 of the file, 64 lowercase hex>  <path>\\n" (sha256sum's own format: two
spaces, the path relative to RUN with "/", no "./"), one for each regular file named results_*.json or
samples_*.jsonl in RUN and in its direct subdirectories (where lm-eval writes them), sorted by path (bytewise). It is
cited, and signed, as the string "sha256:<64 hex>" (71 ASCII bytes, no newline), in the namespace signature.NAMESPACE.

Two files are written into RUN, beside lm-eval's (which are not touched): DIGEST_FILE, the list of files with their
sha256 and the digest (so a FAIL can name the file that changed), and SIGNATURE_FILE, ssh-keygen's signature of the
digest string. Verifying recomputes the digest from the files present, never trusting DIGEST_FILE: the signature
row checks the signature over that recomputed digest; the files row names every file that differs from the list.
A results file this audit reads but the digest does not cover (an --output_path ending in .json names it
<stem>_<date>.json) fails the files row, and --sign refuses such a run: a PASS never vouches for an unsigned file."""
import fnmatch
import hashlib
import json

from evidence_audit.checks import MANIFEST_LEVEL, atomic_write_bytes, short
from evidence_audit.lmeval.files import candidate_dirs, discover
from evidence_audit.reading import Unreadable, read_json, sha256_file
from evidence_audit.signature import (DIGEST, NAMESPACE, SignatureError, check_allowed_signers, key_path, sign_digest,
                                      signature_row)

DIGEST_FILE = "evidence-digest.json"
SIGNATURE_FILE = "evidence-digest.json.sig"
FORMAT = "lm-eval-evidence-digest/v1"
PATTERNS = ("results_*.json", "samples_*.jsonl")
RULE = ("sha256 of the lines '<sha256>  <path>\\n' (sha256sum's format) of every regular file named results_*.json or "
        "samples_*.jsonl in the run directory and its direct subdirectories, paths relative to it, sorted bytewise; "
        "signed as the ASCII string 'sha256:<hex>' (ssh-keygen -Y sign -n " + NAMESPACE + ")")
KEYS = {"format", "rule", "namespace", "files", "digest", "signature"}
MAX_DIGEST_FILE_BYTES = 16 << 20
FILES_CHECK = f"{DIGEST_FILE}: the run's results and samples files (sha256)"


def covered_files(run_dir):
    """{relative path: sha256} of the files the digest covers (see the module docstring). Unreadable for a symlink
    or a name sha256sum would escape (a newline or a backslash)."""
    found = {}
    for d in candidate_dirs(run_dir):
        for p in sorted(d.iterdir()):
            if not any(fnmatch.fnmatchcase(p.name, pat) for pat in PATTERNS):
                continue
            rel = p.relative_to(run_dir).as_posix()
            if p.is_symlink():
                raise Unreadable(f"{p}: a symlink (an lm-eval output file is a regular file)")
            if not p.is_file():
                continue
            if "\n" in rel or "\\" in rel:
                raise Unreadable(f"{p}: a file name with a newline or backslash (the digest's lines are sha256sum's)")
            found[rel] = sha256_file(p, cached=False)
    return found


def digest_of(files):
    """The digest of {path: sha256}: sha256 of the sorted sha256sum lines (64 lowercase hex)."""
    lines = "".join(f"{files[rel]}  {rel}\n" for rel in sorted(files, key=lambda r: r.encode("utf-8")))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def uncovered(run_dir, runs):
    """The results and samples files discovery reads (files.discover's runs) that the digest does not cover."""
    read = [r.results for r in runs] + [p for r in runs for p in r.samples.values()]
    return sorted(p.relative_to(run_dir).as_posix() for p in read
                  if not any(fnmatch.fnmatchcase(p.name, pat) for pat in PATTERNS))


# ---- the author: --sign KEY --------------------------------------------------------------------------------------

def write_signed(run_dir, key, runs):
    """Hash the run's files, sign the digest with KEY, write DIGEST_FILE and SIGNATURE_FILE into RUN (atomically,
    the signature last). Returns (digest hex, number of files, the key's "<TYPE> key SHA256:..."). SignatureError
    or Unreadable: one line."""
    key_path(key)
    left_out = uncovered(run_dir, runs)
    if left_out:
        raise SignatureError(f"{run_dir / left_out[0]}: a results file not named results_*.json (an --output_path "
                             "ending in .json); the signed digest covers results_*.json and samples_*.jsonl only, so "
                             "this run cannot be signed as it is")
    files = covered_files(run_dir)
    digest = digest_of(files)
    signature, described = sign_digest(key, digest)
    record = {"format": FORMAT, "rule": RULE, "namespace": NAMESPACE, "files": files, "digest": f"sha256:{digest}",
              "signature": SIGNATURE_FILE}
    atomic_write_bytes(run_dir / DIGEST_FILE, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    atomic_write_bytes(run_dir / SIGNATURE_FILE, signature)
    return digest, len(files), described


def before_audit(args):
    """--allowed-signers checked and --sign KEY's signed digest written, before the audit runs; the error line, or
    None (the lines --sign prints are printed here)."""
    try:
        if args.allowed_signers is not None:
            check_allowed_signers(args.allowed_signers)
        if args.sign is not None:
            digest, n, described = write_signed(args.lm_eval, args.sign, discover(args.lm_eval))
            print(f"evidence digest: sha256:{digest} ({n} results and samples files; {args.lm_eval / DIGEST_FILE})")
            print(f"evidence signature: {args.lm_eval / SIGNATURE_FILE} (ssh-keygen -Y sign -n {NAMESPACE} of the "
                  f"digest string above, {described})")
    except (SignatureError, Unreadable, OSError) as e:
        return str(e) if not isinstance(e, OSError) else f"{args.lm_eval}: cannot write the signed digest ({e})"
    return None


# ---- the reader: the rows ----------------------------------------------------------------------------------------

def record_problems(record):
    """DIGEST_FILE's shape: exactly KEYS, the format, {path: sha256 hex} files, a "sha256:<hex>" digest."""
    if not isinstance(record, dict):
        return [f"{DIGEST_FILE}: expected a JSON object, found {type(record).__name__}"]
    bad = [f"{DIGEST_FILE} {k}: missing" for k in sorted(KEYS - set(record))]
    bad += [f"{DIGEST_FILE} {k}: a field audit.py has no rule for" for k in sorted(set(record) - KEYS)]
    if bad:
        return bad
    if record["format"] != FORMAT:
        bad.append(f"{DIGEST_FILE} format: {short(record['format'])}, expected {FORMAT!r}")
    files = record["files"]
    if not (isinstance(files, dict) and all(isinstance(v, str) and DIGEST.fullmatch(v) for v in files.values())):
        bad.append(f"{DIGEST_FILE} files: {short(files)} is not {{path: sha256 hex}}")
    digest = record["digest"]
    if not (isinstance(digest, str) and digest.startswith("sha256:") and DIGEST.fullmatch(digest[7:])):
        bad.append(f"{DIGEST_FILE} digest: {short(digest)} is not 'sha256:<64 hex>'")
    return bad


def files_problems(record, now, left_out):
    """Every file that differs between DIGEST_FILE's list and the run directory, and the recorded digest."""
    listed = record["files"]
    bad = [f"{rel}: sha256 {now[rel][:16]}..., {DIGEST_FILE} lists {listed[rel][:16]}... (changed after the digest "
           "was written)" for rel in sorted(now) if rel in listed and now[rel] != listed[rel]]
    bad += [f"{rel}: not in {DIGEST_FILE} (added after the digest was written)" for rel in sorted(now)
            if rel not in listed]
    bad += [f"{rel}: listed in {DIGEST_FILE}, missing from the run directory" for rel in sorted(listed)
            if rel not in now]
    bad += [f"{rel}: a results file this audit reads that the digest does not cover (not named results_*.json)"
            for rel in left_out]
    if record["digest"] != f"sha256:{digest_of(listed)}":
        bad.append(f"{DIGEST_FILE} digest: {record['digest']}, its own list of files gives sha256:{digest_of(listed)}")
    return bad


def digest_rows(C, run_dir, runs, allowed):
    """The files row (when DIGEST_FILE is present) and the signature row (signature.signature_row, over the digest
    of the files present); report["signature"] (None when neither file is there and no --allowed-signers)."""
    now = covered_files(run_dir)
    path = run_dir / DIGEST_FILE
    if path.is_file() and not path.is_symlink():
        record = read_json(path, limit=MAX_DIGEST_FILE_BYTES)
        shape = record_problems(record)
        C.add("-", MANIFEST_LEVEL, FILES_CHECK, len(now),
              shape or files_problems(record, now, uncovered(run_dir, runs)))
    elif path.exists() or path.is_symlink():
        C.add("-", MANIFEST_LEVEL, FILES_CHECK, len(now), [f"{DIGEST_FILE}: not a regular file"])
    return signature_row(C, MANIFEST_LEVEL, run_dir / SIGNATURE_FILE, SIGNATURE_FILE, digest_of(now), allowed,
                         "the run's results and samples files")
