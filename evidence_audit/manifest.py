"""The manifest level, run first: O/MANIFEST.json (written last by run.py) against the files actually under O.

What it catches, and what it cannot: a file added (dot-files and dot-directories included), removed, or changed in
size or content after the run; a symlink or special file anywhere under O (O/private included); an experiment the
manifest lists that is gone or renamed; a run id that differs between MANIFEST.json, environment.json, any
identity.json and any O/private/<exp>/run.json; private files that differ from the manifest's digest of them. A
forger who edits the evidence AND rewrites MANIFEST.json to match passes this level by construction: the manifest
is a seal, not a proof. Such a forgery is caught only by the deeper levels — arithmetic (every claim must
recompute from the records: an inconsistent edit), identity (--tokens: the private texts, the tokenizer and the
data must reproduce every hash and token id) and forward (--forward: the model's own numbers must reproduce every
score). Cite the evidence digest (sha256 of MANIFEST.json's bytes) next to the commit so a reader can tell a
rewritten manifest from the one published. With --allowed-signers FILE the last row verifies O/MANIFEST.json.sig
(run.py --sign), the author's signature of that digest (signature.py): a forger who reseals cannot sign as the author.
"""
import hashlib
import json
import os
import re
from pathlib import Path

from evidence_audit.checks import MANIFEST_LEVEL, short
from evidence_audit.reading import Unreadable, evidence_object, read_json, sha256_file
from evidence_audit.signature import SIGNATURE, signature_row

MANIFEST = "MANIFEST.json"
FORMAT = "evidence-manifest/v1"
# written into O by audit.py after the run (audit.json, audit.mutations.json, a partial audit's audit.<what>.json):
# outputs, not evidence, so outside the manifest's files and never read as evidence
AUDIT_OUTPUT = re.compile(r"audit(\.[A-Za-z0-9_+-]+)?\.json")


def is_audit_output(rel):
    """True for a top-level audit report of audit.py (rel: a path relative to O)."""
    return AUDIT_OUTPUT.fullmatch(rel) is not None


def outside_manifest(rel):
    """True for the files of O that MANIFEST.json never lists: itself, its signature, an audit report."""
    return rel in (MANIFEST, SIGNATURE) or is_audit_output(rel)
KEYS = ("format", "run_id", "experiments", "failed", "files", "private")
RUN_ID = re.compile(r"[0-9a-f]{32}")
SHA = re.compile(r"[0-9a-f]{64}")
LEVELS_NOTE = ("a forger who rewrites MANIFEST.json too passes this level; the deeper levels still catch an "
               "inconsistent edit (arithmetic), edited texts (--tokens) and edited scores (--forward)")


def is_run_id(v):
    return isinstance(v, str) and RUN_ID.fullmatch(v) is not None


# ---- what is under O ----------------------------------------------------------------------------------------------

def walk(root):
    """(files, dirs, odd): posix paths relative to root of every regular file and every directory under root
    (dot-entries included, symlinks never followed; iterative, so any depth of directories is fine), and
    (path, what) for every symlink or special file."""
    files, dirs, odd, stack = [], [], [], [""]
    while stack:
        rel_top = stack.pop()
        try:
            entries = sorted(os.scandir(os.path.join(root, rel_top)), key=lambda e: e.name)
        except OSError as e:
            raise Unreadable(f"{Path(root) / rel_top}: cannot list ({e.strerror})")
        for entry in entries:
            rel = f"{rel_top}/{entry.name}" if rel_top else entry.name
            if entry.is_symlink():
                odd.append((rel, f"a symlink to {short(os.readlink(entry.path), 80)} (it can point outside O)"))
            elif entry.is_dir(follow_symlinks=False):
                dirs.append(rel)
                stack.append(rel)
            elif entry.is_file(follow_symlinks=False):
                files.append(rel)
            else:
                odd.append((rel, "not a regular file (device, pipe or socket)"))
    return sorted(files), sorted(dirs), odd


def private_digest(root):
    """(n_files, sha256 of the sorted "relpath<TAB>sha256<LF>" lines) of the regular files under root, relpath
    relative to root: the manifest's digest of one experiment's private files."""
    files, _, _ = walk(root)
    lines = sorted(f"{rel}\t{sha256_file(root / rel, cached=False)}\n" for rel in files)
    return len(files), hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


# ---- the checks -----------------------------------------------------------------------------------------------------

def manifest_check(C, out, public_only=False, allowed_signers=None):
    """Every manifest row, in order, the signature row last (`allowed_signers`: --allowed-signers FILE, checked).
    Returns {"run_id", "private_absent": [exp...], "manifest", "signature"} (run_id None when the manifest is
    missing or has none; signature: signature.signature_row's, for the report) for the later checks and the
    headline."""
    out = Path(out)
    info = {"run_id": None, "private_absent": [], "manifest": None}
    manifest_rows(C, out, public_only, info)
    path = out / MANIFEST
    digest = sha256_file(path, cached=False) if path.is_file() and not path.is_symlink() else None
    info["signature"] = signature_row(C, MANIFEST_LEVEL, out / SIGNATURE, SIGNATURE, digest, allowed_signers, MANIFEST)
    return info


def manifest_rows(C, out, public_only, info):
    """manifest_check's rows but the signature's."""
    files, dirs, odd = walk(out)
    C.add("-", MANIFEST_LEVEL, "no symlinks or special files under O", len(files) + len(dirs) + len(odd),
          [f"{rel}: {what}; run.py writes regular files and directories only" for rel, what in odd])
    man = read_json(out / MANIFEST) if (out / MANIFEST).is_file() and not (out / MANIFEST).is_symlink() else None
    if isinstance(man, dict):       # its evidence_format (checked before any level ran) is no field of the shape
        man = evidence_object(out / MANIFEST, man)
    shape = manifest_shape_problems(man) if man is not None else \
        [f"{MANIFEST}: missing (run.py writes it last; without it nothing says which files the run wrote)"]
    C.add("-", MANIFEST_LEVEL, f"{MANIFEST} present and well formed", 1, shape, note=LEVELS_NOTE)
    if shape:
        for check in ("public files match MANIFEST.json (size, sha256)", "experiments listed in MANIFEST.json",
                      "run id (MANIFEST.json, environment.json, identity.json, private run.json)",
                      "private files match MANIFEST.json (count, sha256)"):
            C.skip("-", MANIFEST_LEVEL, check, f"{MANIFEST} missing or malformed (named above)")
        return info
    info.update(run_id=man["run_id"], manifest=man)
    public = [f for f in files if not outside_manifest(f) and not f.startswith("private/")]
    C.add("-", MANIFEST_LEVEL, "public files match MANIFEST.json (size, sha256)", len(man["files"]),
          public_files_problems(out, man, public, [d for d in dirs if d != "private" and
                                                   not d.startswith("private/")]))
    C.add("-", MANIFEST_LEVEL, "experiments listed in MANIFEST.json", len(man["experiments"]) + len(man["failed"]),
          experiments_problems(out, man))
    C.add("-", MANIFEST_LEVEL, "run id (MANIFEST.json, environment.json, identity.json, private run.json)",
          1 + len(man["experiments"]), run_id_problems(out, man))
    private_check(C, out, man, info, public_only)
    return info


def manifest_shape_problems(man):
    """MANIFEST.json's shape: exactly KEYS, the format tag, a run id, lists of names,
    files with an integer size and a sha256, private digests with a file count and a sha256."""
    if not isinstance(man, dict):
        return [f"{MANIFEST}: expected a JSON object, found {type(man).__name__}"]
    bad = [f"{MANIFEST} {k}: missing" for k in KEYS if k not in man]
    bad += [f"{MANIFEST} {k}: a field audit.py has no rule for" for k in man if k not in KEYS]
    if bad:
        return bad
    if man["format"] != FORMAT:
        bad.append(f"{MANIFEST} format: {short(man['format'])}, expected {FORMAT!r}")
    if not is_run_id(man["run_id"]):
        bad.append(f"{MANIFEST} run_id: {short(man['run_id'])} is not 32 lowercase hex digits")
    for k in ("experiments", "failed"):
        v = man[k]
        if not (isinstance(v, list) and all(isinstance(x, str) and x and "/" not in x and not x.startswith(".")
                                            for x in v) and len(set(v)) == len(v)):
            bad.append(f"{MANIFEST} {k}: {short(v)} is not a list of distinct experiment names")
    bad += entries_problems(man, "files", "size") + entries_problems(man, "private", "n_files")
    return bad


def entries_problems(man, key, count):
    """MANIFEST.json's `key` is an object of {count: non-negative int, "sha256": hex} entries."""
    entries = man[key]
    if not isinstance(entries, dict):
        return [f"{MANIFEST} {key}: not an object"]
    return [f"{MANIFEST} {key}.{name}: {short(e)} is not {{{count!r}: int, 'sha256': hex}}"
            for name, e in entries.items()
            if not (isinstance(e, dict) and set(e) == {count, "sha256"} and type(e[count]) is int and e[count] >= 0
                    and isinstance(e["sha256"], str) and SHA.fullmatch(e["sha256"]))]


def public_files_problems(out, man, public, dirs):
    """Each listed file is there with its size and sha256; each file and directory under O (outside O/private)
    is listed or holds a listed file."""
    listed = man["files"]
    bad = [f"{rel}: listed in {MANIFEST} but missing" for rel in sorted(listed) if rel not in public]
    bad += [f"{rel}: not listed in {MANIFEST} (added after the run{', a dot-file' if '/.' in '/' + rel else ''})"
            for rel in public if rel not in listed]
    for rel in public:
        if rel not in listed:
            continue
        size = (out / rel).stat().st_size
        if size != listed[rel]["size"]:
            bad.append(f"{rel}: {size} bytes, {MANIFEST} says {listed[rel]['size']} (changed after the run)")
        elif sha256_file(out / rel, cached=False) != listed[rel]["sha256"]:
            bad.append(f"{rel}: sha256 differs from {MANIFEST} (changed after the run)")
    holding = {p.as_posix() for rel in listed for p in Path(rel).parents if p.as_posix() != "."}
    bad += [f"{d}/: directory not in {MANIFEST} (holds no listed file)" for d in dirs if d not in holding]
    return bad


def experiments_problems(out, man):
    """Each listed experiment has its directory; each top-level directory is a listed experiment (or private/);
    each failed experiment has its FAILED.json and each FAILED.json is listed."""
    bad = [f"{exp}/: experiment listed in {MANIFEST} but its directory is gone (deleted or renamed)"
           for exp in man["experiments"] if not (out / exp).is_dir()]
    tops = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.is_symlink() and p.name != "private")
    bad += [f"{d}/: a directory {MANIFEST} does not list as an experiment" for d in tops
            if d not in man["experiments"]]
    bad += [f"{n}.FAILED.json: {MANIFEST} lists {n} as failed but the file is gone" for n in man["failed"]
            if not (out / f"{n}.FAILED.json").is_file()]
    bad += [f"{p.name}: a failure record {MANIFEST} does not list" for p in sorted(out.glob("*.FAILED.json"))
            if p.name[:-len(".FAILED.json")] not in man["failed"]]
    bad += [f"{n}: listed both as installed and as failed" for n in man["experiments"] if n in man["failed"]]
    return bad


def run_id_problems(out, man):
    """The run id of MANIFEST.json is environment.json's, every listed experiment's identity.json's, and every
    O/private/<exp>/run.json's (which also names its experiment)."""
    rid, bad = man["run_id"], []
    # run.py writes environment.json only when at least one experiment installed evidence
    sources = [("environment.json", out / "environment.json", None)] \
        if man["experiments"] or (out / "environment.json").exists() else []
    sources += [(f"{exp}/identity.json", out / exp / "identity.json", None) for exp in man["experiments"]]
    if (out / "private").is_dir():
        sources += [(f"private/{p.name}/run.json", p / "run.json", p.name)
                    for p in sorted((out / "private").iterdir()) if p.is_dir() and not p.is_symlink()]
    for label, path, exp in sources:
        if not path.is_file():
            bad.append(f"{label}: missing (it carries the run id)")
            continue
        obj = read_json(path)
        got = obj.get("run_id") if isinstance(obj, dict) else None
        if got != rid:
            bad.append(f"{label} run_id: {short(got)}, {MANIFEST} says {rid!r} (evidence of another run)")
        if exp is not None and (not isinstance(obj, dict) or obj.get("experiment") != exp):
            bad.append(f"{label} experiment: {short(obj.get('experiment') if isinstance(obj, dict) else obj)}, "
                       f"expected {exp!r}")
    return bad


def private_check(C, out, man, info, public_only):
    """Row "private files match MANIFEST.json": O/private/ absent while the manifest lists private evidence is
    recorded for the headline (INCOMPLETE, or --public-only); present, every experiment's private files must
    reproduce the manifest's count and digest, and nothing else may be in O/private/."""
    check = "private files match MANIFEST.json (count, sha256)"
    priv, root = man["private"], out / "private"
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        C.add("-", MANIFEST_LEVEL, check, len(priv), ["private: not a directory (run.py makes O/private/ a directory)"])
        return
    if not root.exists():
        info["private_absent"] = sorted(priv)
        if priv:
            C.skip("-", MANIFEST_LEVEL, check, "O/private/ absent" + (" (--public-only)" if public_only else ""),
                   requested=not public_only)
        else:
            C.add("-", MANIFEST_LEVEL, check, 0, [])
        return
    bad = [f"private/{exp}/: listed in {MANIFEST} but missing" for exp in sorted(priv)
           if not (root / exp).is_dir()]
    for p in sorted(root.iterdir()):
        if p.is_symlink() or not p.is_dir():
            bad.append(f"private/{p.name}: not an experiment directory (leftover or added after the run)")
        elif p.name not in priv:
            bad.append(f"private/{p.name}/: not listed in {MANIFEST} (a leftover or added after the run)")
        else:
            n, digest = private_digest(p)
            if n != priv[p.name]["n_files"]:
                bad.append(f"private/{p.name}/: {n} files, {MANIFEST} says {priv[p.name]['n_files']}")
            elif digest != priv[p.name]["sha256"]:
                bad.append(f"private/{p.name}/: contents differ from {MANIFEST}'s digest (a file changed)")
    C.add("-", MANIFEST_LEVEL, check, len(priv), bad)


# ---- the forger's tool ----------------------------------------------------------------------------------------------

def reseal(out):
    """Rewrite O/MANIFEST.json to match the files now under O, keeping its run id and experiment lists: what a
    forger who rewrites the manifest too would do. The mutation self-test and the tests use it to show what the
    deeper levels catch on their own; run.py never calls it (the audit imports nothing from the runner, nor the
    runner from the audit)."""
    out = Path(out)
    man = read_json(out / MANIFEST)
    files, _, _ = walk(out)
    man["files"] = {rel: {"size": (out / rel).stat().st_size, "sha256": sha256_file(out / rel, cached=False)}
                    for rel in files if not outside_manifest(rel) and not rel.startswith("private/")}
    if (out / "private").is_dir():
        man["private"] = {p.name: dict(zip(("n_files", "sha256"), private_digest(p)))
                          for p in sorted((out / "private").iterdir()) if p.is_dir() and not p.is_symlink()}
    tmp = out / f".{MANIFEST}.reseal-tmp"
    tmp.write_text(json.dumps(man, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, out / MANIFEST)
    return man
