"""prepare.py's hub path, unchanged, against a loopback server that speaks the hub's endpoints (tests/hub_server.py).

Only the network location is fake: huggingface_hub is pointed at the server with HF_ENDPOINT. The served data is
the sentiment fixture as a hub-style parquet (and the MC-TACO fixture with ClassLabel columns). What is served as
the model depends on the test: prepare.py never parses model files, so the tests of fetching, pinning, retrying
and refusing serve stand-in bytes and run in seconds; the end-to-end test (marked slow) serves a tiny randomly
initialised Llama with the real SmolLM2 tokenizer files, so the whole chain prepare (pin, verify) -> run -> audit
runs for real.
"""
import copy
import hashlib
import io
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import resources
from conftest import REPO, run_cli
from hub_server import HubServer, HubState, Repo

MODEL_ID, DATA_ID = "smollm2-135m-instruct", "glue-sst2"
MODEL_REPO, DATA_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct", "nyu-mll/glue"
MODEL_COMMIT, DATA_COMMIT, OTHER_COMMIT = "1" * 40, "2" * 40, "3" * 40
PARQUET = "sst2/validation-00000-of-00001.parquet"
MCTACO_ID, MCTACO_REPO, MCTACO_COMMIT = "mc-taco", "CogComp/mc_taco", "4" * 40
MCTACO_PARQUET = "data/validation-00000-of-00001.parquet"


def mctaco_rows():
    return resources.read_mctaco_tsv(REPO / "fixtures" / "mctaco_dev.tsv")


def mctaco_hub_parquet():
    """The MC-TACO fixture as the hub encodes it: label and category as ClassLabel ints, their names in the
    file's `huggingface` schema metadata."""
    rows, cats = mctaco_rows(), list(resources.MCTACO_CATEGORIES)
    table = pa.table({"sentence": [r["sentence"] for r in rows], "question": [r["question"] for r in rows],
                      "answer": [r["answer"] for r in rows], "label": pa.array([r["label"] for r in rows], pa.int64()),
                      "category": pa.array([cats.index(r["category"]) for r in rows], pa.int64())})
    features = {"label": {"_type": "ClassLabel", "names": list(resources.MCTACO_LABELS)},
                "category": {"_type": "ClassLabel", "names": cats}}
    table = table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}}).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def sst2_hub_parquet():
    """The sentiment fixture as the hub stores SST-2: a parquet with columns sentence, label, idx."""
    rows = resources.read_glue_tsv(REPO / "fixtures" / "sentiment_dev.tsv")
    table = pa.table({"sentence": [r["sentence"] for r in rows], "label": pa.array([r["label"] for r in rows], pa.int64()),
                      "idx": pa.array([r["idx"] for r in rows], pa.int32())})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return {PARQUET: buf.getvalue()}, rows


@pytest.fixture(scope="module")
def served_files():
    """Stand-in model files (prepare.py copies and hashes them, never parses them) and the dataset parquet.
    The LFS-sized ones (>= 1 KiB) are served with their sha256 as ETag, the small ones with a git blob id."""
    model = {"config.json": b'{"model_type": "llama", "num_hidden_layers": 2}\n',
             "generation_config.json": b'{"eos_token_id": 2}\n',
             "model.safetensors": bytes(range(256)) * 16,
             "special_tokens_map.json": b'{"eos_token": "<|im_end|>"}\n',
             "tokenizer.json": b'{"model": {"type": "BPE"}}' + b" " * 2048 + b"\n",
             "tokenizer_config.json": b'{"add_bos_token": false}\n'}
    data, rows = sst2_hub_parquet()
    return model, data, rows


@pytest.fixture(scope="module")
def served_real_files(model_dir, tmp_path_factory):
    """A tiny randomly initialised Llama with the real SmolLM2 tokenizer files, and the dataset parquet."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("hub_model")
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=2)).save_pretrained(d)
    model = {p.name: p.read_bytes() for p in d.iterdir()}
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        model[name] = (model_dir / name).read_bytes()
    data, rows = sst2_hub_parquet()
    return model, data, rows


def make_lock(path, model_files, rows, pins=None):
    """The real lock, with the hub entries pointed at the served repos (hashes null unless `pins` gives them)."""
    lock = resources.load_lock()
    m = lock["models"][MODEL_ID]["source"]
    m.update(revision=MODEL_COMMIT, files={f: (pins or {}).get(f) for f in sorted(model_files)})
    d = lock["data"][DATA_ID]
    d["source"].update(revision=DATA_COMMIT, files={PARQUET: (pins or {}).get(PARQUET)})
    d.update(rows=len(rows), content_sha256=resources.content_sha256(rows), row_sha256_16=None,
             label_counts={str(k): sum(r["label"] == k for r in rows) for k in (0, 1)})
    resources.atomic_write_json(path, lock)
    return path


def serve(files):
    model, data, _ = files
    state = HubState()
    state.add(Repo("model", MODEL_REPO, MODEL_COMMIT, model))
    state.add(Repo("dataset", DATA_REPO, DATA_COMMIT, data))
    state.add(Repo("dataset", MCTACO_REPO, MCTACO_COMMIT, {MCTACO_PARQUET: mctaco_hub_parquet()}))
    return state


@pytest.fixture
def hub(served_files):
    state = serve(served_files)
    with HubServer(state) as url:
        yield state, url


@pytest.fixture
def real_hub(served_real_files):
    state = serve(served_real_files)
    with HubServer(state) as url:
        yield state, url


def prepare(url, cache, lock, *args, offline=False):
    env = {"HF_ENDPOINT": url, "HF_HUB_OFFLINE": "1" if offline else "0", "HF_HOME": str(cache.parent / "hf_home"),
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    return run_cli("prepare.py", "--cache", cache, "--lock", lock, *args, env=env)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def manifest_files_verify(cache):
    m = resources.load_manifest(cache)
    for entry in m["resources"].values():
        for rel, meta in entry["files"].items():
            assert resources.sha256_file(cache / rel) == meta["sha256"], rel
    return m


@pytest.mark.slow
def test_happy_path_pin_prepare_run_audit(real_hub, served_real_files, tmp_path):
    state, url = real_hub
    model, data, rows = served_real_files
    lock = make_lock(tmp_path / "lock.json", model, rows)
    cache = tmp_path / "cache"
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub", "--pin")
    assert p.returncode == 0, p.stdout + p.stderr
    p = prepare(url, cache, lock, "--data", DATA_ID, "--source", "hub", "--pin")
    assert p.returncode == 0, p.stdout + p.stderr
    written = json.loads(lock.read_text())
    pins = written["models"][MODEL_ID]["source"]["files"]
    assert {f: v["sha256"] for f, v in pins.items()} == {f: sha(b) for f, b in model.items()}
    assert written["data"][DATA_ID]["source"]["files"][PARQUET]["sha256"] == sha(data[PARQUET])
    assert len(written["data"][DATA_ID]["row_sha256_16"]) == len(rows)
    for name, b in model.items():  # materialised exactly as served
        assert (cache / "models" / MODEL_ID / name).read_bytes() == b
    manifest_files_verify(cache)

    out = tmp_path / "out"
    r = run_cli("run.py", "--cache", cache, "--out", out, "--model", MODEL_ID, "--data", DATA_ID, "--smoke",
                "--experiment", "protocol")
    assert r.returncode == 0, r.stdout + r.stderr
    a = run_cli("audit.py", out)
    assert a.returncode == 0, a.stdout + a.stderr

    # a second run verifies and downloads nothing
    n_before = len(state.log)
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub")
    assert p.returncode == 0 and "nothing downloaded" in p.stdout, p.stdout + p.stderr
    assert len(state.log) == n_before

    # offline with a complete cache works
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub", offline=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_corrupted_file_is_refused_and_nothing_is_kept(hub, served_files, tmp_path):
    state, url = hub
    model, _, rows = served_files
    lock = make_lock(tmp_path / "lock.json", model, rows, pins={f: sha(b) for f, b in model.items()})
    state.corrupt.add((MODEL_REPO, "model.safetensors"))
    cache = tmp_path / "cache"
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub")
    assert p.returncode == 2
    assert "model.safetensors" in p.stderr and "sha256 mismatch" in p.stderr
    assert p.stderr.count("\n") == 1
    assert not (cache / "models" / MODEL_ID).exists()
    assert MODEL_ID not in resources.load_manifest(cache)["resources"]
    blobs = [b for b in (cache / "hub").rglob("blobs/*") if b.is_file()]
    assert all(sha(b.read_bytes()) in {sha(x) for x in model.values()} for b in blobs)  # no bad bytes kept

    # unpinned + --pin: the hub's own LFS sha256 catches the same corruption
    lock2 = make_lock(tmp_path / "lock2.json", model, rows)
    p = prepare(url, tmp_path / "cache2", lock2, "--model", MODEL_ID, "--source", "hub", "--pin")
    assert p.returncode == 2 and "LFS sha256" in p.stderr
    assert json.loads(lock2.read_text())["models"][MODEL_ID]["source"]["files"]["model.safetensors"] is None


def test_truncated_transfer_is_retried_and_ends_verified(hub, served_files, tmp_path):
    state, url = hub
    model, _, rows = served_files
    lock = make_lock(tmp_path / "lock.json", model, rows, pins={f: sha(b) for f, b in model.items()})
    state.truncate_once[(MODEL_REPO, "model.safetensors")] = 1000
    cache = tmp_path / "cache"
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "retrying" in p.stdout
    gets = [e for e in state.log if e[0] == "GET" and e[1].endswith("/model.safetensors")]
    assert len(gets) >= 2  # cut once, then resumed (Range) or restarted
    assert (cache / "models" / MODEL_ID / "model.safetensors").read_bytes() == model["model.safetensors"]
    manifest_files_verify(cache)


def test_revision_resolving_to_another_commit_is_refused(hub, served_files, tmp_path):
    state, url = hub
    model, _, rows = served_files
    other = copy.deepcopy(model)
    other["config.json"] = other["config.json"].replace(b'"num_hidden_layers": 2', b'"num_hidden_layers": 1')
    state.repos[("model", MODEL_REPO)].commits[OTHER_COMMIT] = other
    state.redirect_revision[(MODEL_REPO, MODEL_COMMIT)] = OTHER_COMMIT
    lock = make_lock(tmp_path / "lock.json", model, rows)
    cache = tmp_path / "cache"
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub", "--pin")
    assert p.returncode == 2
    assert f"resolved to commit {OTHER_COMMIT}" in p.stderr
    assert not (cache / "models" / MODEL_ID).exists()
    assert json.loads(lock.read_text())["models"][MODEL_ID]["source"]["files"]["config.json"] is None


def test_pin_writes_once_and_never_overwrites_silently(hub, served_files, tmp_path):
    state, url = hub
    model, _, rows = served_files
    lock = make_lock(tmp_path / "lock.json", model, rows)
    p = prepare(url, tmp_path / "c1", lock, "--model", MODEL_ID, "--source", "hub", "--pin")
    assert p.returncode == 0, p.stdout + p.stderr
    pinned_text = lock.read_text()
    # the server now serves other bytes under the same revision
    state.repos[("model", MODEL_REPO)].commits[MODEL_COMMIT]["config.json"] = model["config.json"] + b"\n"
    p = prepare(url, tmp_path / "c2", lock, "--model", MODEL_ID, "--source", "hub", "--pin")
    assert p.returncode == 2
    assert "config.json" in p.stderr and "sha256 mismatch" in p.stderr
    assert lock.read_text() == pinned_text


def test_offline_with_incomplete_cache_names_what_is_missing(hub, served_files, tmp_path):
    state, url = hub
    model, _, rows = served_files
    lock = make_lock(tmp_path / "lock.json", model, rows, pins={f: sha(b) for f, b in model.items()})
    cache = tmp_path / "cache"
    assert prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub").returncode == 0
    shutil.rmtree(cache / "models" / MODEL_ID)  # the verified copy is gone; only the hub download cache is left
    snapshot = next((cache / "hub").rglob(f"snapshots/{MODEL_COMMIT}"))
    (snapshot / "tokenizer.json").unlink()
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub", offline=True)
    assert p.returncode == 2
    assert "offline" in p.stderr and "missing tokenizer.json" in p.stderr
    # and with the file back in the download cache, offline preparation completes without the server
    n_before = len(state.log)
    (snapshot / "tokenizer.json").write_bytes(model["tokenizer.json"])
    p = prepare(url, cache, lock, "--model", MODEL_ID, "--source", "hub", offline=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(state.log) == n_before
    manifest_files_verify(cache)


# ---- data through the hub, every schema ------------------------------------------------------------------------

def test_sst2_data_pin_records_file_hash_and_row_hashes(hub, served_files, tmp_path):
    state, url = hub
    model, data, rows = served_files
    lock = make_lock(tmp_path / "lock.json", model, rows)
    cache = tmp_path / "cache"
    p = prepare(url, cache, lock, "--data", DATA_ID)
    assert p.returncode == 2 and "--pin" in p.stderr, p.stdout + p.stderr
    p = prepare(url, cache, lock, "--data", DATA_ID, "--pin")
    assert p.returncode == 0, p.stdout + p.stderr
    entry = json.loads(lock.read_text())["data"][DATA_ID]
    assert entry["source"]["files"][PARQUET]["sha256"] == sha(data[PARQUET])
    assert entry["row_sha256_16"] == [resources.row_hash16(r) for r in rows]
    manifest = manifest_files_verify(cache)["resources"][DATA_ID]
    assert manifest["content_sha256"] == resources.content_sha256(rows) and "schema" not in manifest
    assert resources.read_parquet_rows(cache / "data" / DATA_ID / "validation.parquet") == rows


def mctaco_lock(path, **facts):
    """The real lock with mc-taco pointed at the served repository (its content facts null unless given: the real
    split's pins would refuse the fixture the served repository holds)."""
    lock = resources.load_lock()
    entry = lock["data"][MCTACO_ID]
    entry["source"].update(revision=MCTACO_COMMIT, files={MCTACO_PARQUET: None})
    entry.update(dict.fromkeys(("content_sha256", "rows", "label_counts", "n_questions", "row_sha256_16")), **facts)
    resources.atomic_write_json(path, lock)
    return path


def test_mctaco_data_pin_records_every_content_fact(hub, tmp_path):
    state, url = hub
    lock = mctaco_lock(tmp_path / "lock.json")
    cache = tmp_path / "cache"
    p = prepare(url, cache, lock, "--data", MCTACO_ID)
    assert p.returncode == 2 and "no content_sha256 pinned" in p.stderr, p.stdout + p.stderr
    p = prepare(url, cache, lock, "--data", MCTACO_ID, "--pin")
    assert p.returncode == 0, p.stdout + p.stderr
    fixture = resources.load_lock()["data"]["fixture-mctaco"]
    entry = json.loads(lock.read_text())["data"][MCTACO_ID]
    facts = ("content_sha256", "rows", "label_counts", "n_questions", "row_sha256_16")
    assert {k: entry[k] for k in facts} == {k: fixture[k] for k in facts}  # names, not ClassLabel codes
    manifest = manifest_files_verify(cache)["resources"][MCTACO_ID]
    assert manifest["schema"] == "mctaco" and manifest["n_questions"] == 15
    cache_parquet = cache / "data" / MCTACO_ID / "validation.parquet"
    # normalised: the hub's ClassLabel encoding gives the very bytes the fixture's TSV gives
    assert cache_parquet.read_bytes() == resources.rows_to_parquet_bytes(mctaco_rows(), resources.MCTACO)
    # pinned now: a plain run verifies the prepared copy and downloads nothing
    n_before = len(state.log)
    p = prepare(url, cache, lock, "--data", MCTACO_ID)
    assert p.returncode == 0 and f"verified: {MCTACO_ID}" in p.stdout, p.stdout + p.stderr
    assert len(state.log) == n_before


def test_a_copy_that_contradicts_a_pinned_fact_pins_nothing(hub, tmp_path):
    state, url = hub
    lock = mctaco_lock(tmp_path / "lock.json", rows=61)
    before = lock.read_text()
    p = prepare(url, tmp_path / "cache", lock, "--data", MCTACO_ID, "--pin")
    assert p.returncode == 2 and "expected 61 rows, found 62" in p.stderr, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1
    assert lock.read_text() == before  # not even the (correct) file hash: the copy was refused as a whole
