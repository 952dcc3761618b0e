"""Data imports: the MC-TACO authors' file format recognised by content, the hub's parquet
export with ClassLabel ints, and a user's own data under --name (CACHE/user.lock.json). Every bad file is one
line, exit 2; the pinned resources.lock.json is never edited by a --name import."""
import io
import json
import shutil

import pytest

import resources
from conftest import REPO, link_or_copy, run_cli

FIXTURE = REPO / "fixtures" / "mctaco_dev.tsv"


def lines():
    return FIXTURE.read_text(encoding="utf-8").split("\n")[:-1]


def write(path, rows, end="\n"):
    path.write_text("".join(r + end for r in rows), encoding="utf-8", newline="")
    return path


def prepare(*args, **kw):
    return run_cli("prepare.py", *args, **kw)


def one_line_refusal(p):
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    return err[0]


# ---- the fixture is in the authors' exact format, and its canonical hash is pinned ---------------------------

def test_fixture_is_in_the_authors_exact_format_and_pinned():
    raw = FIXTURE.read_bytes()
    assert b"\r" not in raw and raw.endswith(b"\n")
    first = raw.split(b"\n")[0].split(b"\t")
    assert len(first) == 5 and first[3] in (b"yes", b"no")          # no header: line 1 is a row
    assert all(len(ln.split("\t")) == 5 and ln.split("\t")[3] in ("yes", "no") for ln in lines())
    rows = resources.read_mctaco_tsv(FIXTURE)
    entry = resources.load_lock()["data"]["fixture-mctaco"]
    text = "".join(f"{i}\t{ln}\n" for i, ln in enumerate(lines()))   # the canonical rendering, by hand
    assert resources.sha256_bytes(text.encode()) == resources.content_sha256(rows, resources.MCTACO) == \
        entry["content_sha256"]
    assert entry["row_sha256_16"] == [resources.row_hash16(r, resources.MCTACO) for r in rows]


def test_real_splits_are_pinned_with_the_facts_of_the_authors_files():
    data = resources.load_lock()["data"]
    assert (data["mc-taco"]["split"], data["mc-taco"]["rows"], data["mc-taco"]["n_questions"]) == \
        ("validation", 3783, 561)
    assert data["mc-taco"]["label_counts"] == {"no": 2554, "yes": 1229}
    assert data["mc-taco"]["content_sha256"] == "36a3ccdae1d011dc18ce6178aeb4226626743986f70b53b6949fdecf1322e77e"
    assert (data["mc-taco-test"]["split"], data["mc-taco-test"]["rows"], data["mc-taco-test"]["n_questions"]) == \
        ("test", 9442, 1332)
    assert data["mc-taco-test"]["label_counts"] == {"no": 6244, "yes": 3198}
    assert data["mc-taco-test"]["content_sha256"] == "4efeaec1ae9a1616a8b17eb78d47071e31191ea9f38ded29b48645e8e13b22b1"


def test_authors_file_is_recognised_by_content(tmp_path):
    copy = shutil.copy(FIXTURE, tmp_path / "dev.tsv")
    p = prepare("--cache", tmp_path / "c", "--data-file", copy)
    assert p.returncode == 0 and "recognised dev.tsv by content as fixture-mctaco" in p.stdout, p.stdout + p.stderr
    m = resources.load_manifest(tmp_path / "c")["resources"]["fixture-mctaco"]
    assert m["imported_from"]["format"] == "mctaco-authors-tsv" and m["split"] == "validation"
    assert resources.read_mctaco_parquet(tmp_path / "c" / "data" / "fixture-mctaco" / "validation.parquet") == \
        resources.read_mctaco_tsv(FIXTURE)


def fake_real_lock(tmp_path, split_id):
    """The real lock with one real split's pins replaced by the fixture's facts: recognition is by content, so the
    fixture then stands for that split exactly as the authors' file would."""
    lock = resources.load_lock()
    facts = resources.content_facts(resources.read_mctaco_tsv(FIXTURE), resources.MCTACO)
    del lock["data"]["fixture-mctaco"]
    lock["data"][split_id].update(facts)
    path = tmp_path / "lock.json"
    resources.atomic_write_json(path, lock)
    return path


@pytest.mark.parametrize("split_id,split", [("mc-taco", "validation"), ("mc-taco-test", "test")])
def test_recognition_picks_the_pinned_split(tmp_path, split_id, split):
    lock = fake_real_lock(tmp_path, split_id)
    p = prepare("--cache", tmp_path / "c", "--lock", lock, "--data-file", FIXTURE)
    assert p.returncode == 0 and f"as {split_id} ({split} split)" in p.stdout, p.stdout + p.stderr
    assert (tmp_path / "c" / "data" / split_id / f"{split}.parquet").is_file()
    # pinned by a --lock other than the repository's: the manifest names it, so run.py checks against that lock
    assert resources.load_manifest(tmp_path / "c")["resources"][split_id]["lock"] == str(lock.resolve())


def test_a_file_matching_neither_pin_is_refused(tmp_path):
    p = prepare("--cache", tmp_path / "c", "--data-file", write(tmp_path / "x.tsv", lines()[:20]))
    line = one_line_refusal(p)
    assert "matches no pinned mctaco data" in line and "mc-taco (validation: 3783 rows" in line
    assert "mc-taco-test (test: 9442 rows" in line and "--name NAME" in line
    assert not (tmp_path / "c" / "manifest.json").exists() or \
        resources.load_manifest(tmp_path / "c")["resources"] == {}


def mutate(k, fn):
    out = lines()
    out[k] = fn(out[k])
    return out


BAD_AUTHORS_FILES = {
    "one character": (lambda: mutate(9, lambda s: s.replace("e", "E", 1)), "first differing row: idx 9"),
    "one character in an answer": (lambda: mutate(30, lambda s: "\t".join(
        f[:-1] + "Z" if i == 2 else f for i, f in enumerate(s.split("\t")))), "first differing row: idx 30"),
    "missing field": (lambda: mutate(9, lambda s: "\t".join(s.split("\t")[:2] + s.split("\t")[3:])),
                      ":10: expected 5 TAB-separated fields"),
    "wrong label word": (lambda: mutate(4, lambda s: s.replace("\tyes\t", "\tYes\t").replace("\tno\t", "\tNo\t")),
                         ":5: field 4 (label): expected 'yes' or 'no'"),
    "header line": (lambda: ["sentence\tquestion\tanswer\tlabel\tcategory"] + lines(), ":1: a header line"),
    "empty answer": (lambda: mutate(2, lambda s: "\t".join("" if i == 2 else f for i, f in enumerate(s.split("\t")))),
                     ":3: field answer: expected a non-empty string"),
    "unknown category": (lambda: mutate(6, lambda s: s.rsplit("\t", 1)[0] + "\tDuration"),
                         ":7: field category"),
}


@pytest.mark.parametrize("case", sorted(BAD_AUTHORS_FILES))
def test_bad_authors_files_are_refused_on_one_line(tmp_path, case):
    make, expected = BAD_AUTHORS_FILES[case]
    p = prepare("--cache", tmp_path / "c", "--data-file", write(tmp_path / "bad.tsv", make()))
    assert expected in one_line_refusal(p)
    assert not (tmp_path / "c" / "data" / "fixture-mctaco").exists()


def test_crlf_and_bad_encoding_are_refused_on_one_line(tmp_path):
    p = prepare("--cache", tmp_path / "c", "--data-file", write(tmp_path / "crlf.tsv", lines(), end="\r\n"))
    assert "crlf.tsv:1: line ends with CR (CRLF line endings)" in one_line_refusal(p)
    bad = tmp_path / "enc.tsv"
    bad.write_bytes(FIXTURE.read_bytes().replace(b"\n", b"\xff\n", 4)[:-1])
    assert "enc.tsv:1: not valid UTF-8" in one_line_refusal(prepare("--cache", tmp_path / "c", "--data-file", bad))


# ---- the hub's parquet export (ClassLabel ints) ------------------------------------------------------------------

def hub_parquet(path, with_names):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = resources.read_mctaco_tsv(FIXTURE)
    table = pa.table({"sentence": [r["sentence"] for r in rows], "question": [r["question"] for r in rows],
                      "answer": [r["answer"] for r in rows], "label": pa.array([r["label"] for r in rows], pa.int64()),
                      "category": pa.array([resources.MCTACO_CATEGORIES.index(r["category"]) for r in rows],
                                           pa.int64())})
    if with_names:
        feats = {"label": {"_type": "ClassLabel", "names": list(resources.MCTACO_LABELS)},
                 "category": {"_type": "ClassLabel", "names": list(resources.MCTACO_CATEGORIES)}}
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": feats}})})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("with_names", [True, False])
def test_hub_parquet_classlabel_ints_are_mapped_and_said(tmp_path, with_names):
    f = hub_parquet(tmp_path / "validation.parquet", with_names)
    p = prepare("--cache", tmp_path / "c", "--data-file", f)
    assert p.returncode == 0 and "as fixture-mctaco" in p.stdout, p.stdout + p.stderr
    said = "the file's own ClassLabel names" if with_names else "known names (the file carries none)"
    assert f"category: int64 codes mapped with" in p.stdout and said in p.stdout
    mapping = resources.load_manifest(tmp_path / "c")["resources"]["fixture-mctaco"]["imported_from"]["mapping"]
    assert said in mapping["category"] and said in mapping["label"]


# ---- --name: the user's own data ---------------------------------------------------------------------------------

SST2_GOOD = ["sentence\tlabel", "a warm and funny film\t1", "a dull , empty two hours\t0", "the cast is superb\t1"]


def test_name_import_tsv_and_parquet_pin_into_the_user_lock_only(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lock_before = resources.sha256_file(resources.LOCK_PATH)
    cache = tmp_path / "c"
    p = prepare("--cache", cache, "--data-file", write(tmp_path / "mine.tsv", SST2_GOOD), "--name", "mine")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = resources.read_glue_tsv(tmp_path / "mine.tsv")
    user = resources.load_user_lock(cache)["data"]["mine"]
    assert user["content_sha256"] == resources.content_sha256(rows) and user["rows"] == 3
    assert user["row_sha256_16"] == [resources.row_hash16(r) for r in rows] and user["label_counts"] == {"0": 1, "1": 2}
    parquet, entry = resources.verified_data(cache, "mine")
    assert resources.read_parquet_rows(parquet) == rows and entry["content_sha256"] == user["content_sha256"]
    pq.write_table(pa.table({"sentence": [r["sentence"] for r in rows], "label": [r["label"] for r in rows]}),
                   tmp_path / "mine.parquet")
    p = prepare("--cache", cache, "--data-file", tmp_path / "mine.parquet", "--name", "mine-pq")
    assert p.returncode == 0, p.stdout + p.stderr
    assert resources.load_user_lock(cache)["data"]["mine-pq"]["content_sha256"] == user["content_sha256"]
    p = prepare("--cache", cache, "--data-file", tmp_path / "mine.parquet", "--name", "mine")   # same content: ok
    assert p.returncode == 0, p.stdout + p.stderr
    assert resources.sha256_file(resources.LOCK_PATH) == lock_before
    v = prepare("--cache", cache, "--verify")
    assert v.returncode == 0 and "verified: mine (1 files)" in v.stdout, v.stdout + v.stderr


def bad_parquet(path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sentence": ["fine", "also fine"], "label": [1, 7]}), path)
    return path


BAD_USER_FILES = {
    "bad label": (lambda t: write(t / "f.tsv", SST2_GOOD[:2] + ["so so\tmaybe"]), "f.tsv:3: field 2 (label)"),
    "empty sentence": (lambda t: write(t / "f.tsv", SST2_GOOD[:2] + ["\t0"]), "f.tsv:3: field 1 (sentence): empty"),
    "column count": (lambda t: write(t / "f.tsv", SST2_GOOD[:2] + ["a\tb\t0"]), "f.tsv:3: expected 2 TAB-separated"),
    "duplicate": (lambda t: write(t / "f.tsv", SST2_GOOD + [SST2_GOOD[1]]), "idx 3: field sentence duplicates idx 0"),
    "crlf": (lambda t: write(t / "f.tsv", SST2_GOOD, end="\r\n"), "f.tsv:1: line ends with CR"),
    "no header": (lambda t: write(t / "f.tsv", SST2_GOOD[1:]), "f.tsv:1: neither a GLUE SST-2 dev.tsv"),
    "parquet label": (lambda t: bad_parquet(t / "f.parquet"), "row 1 (idx 1): field label: expected 0 or 1, found 7"),
    "not parquet": (lambda t: write(t / "f.parquet", ["hello"]), "not a readable parquet file"),
}


@pytest.mark.parametrize("case", sorted(BAD_USER_FILES))
def test_bad_user_files_are_refused_on_one_line_and_leave_nothing(tmp_path, case):
    make, expected = BAD_USER_FILES[case]
    cache = tmp_path / "c"
    p = prepare("--cache", cache, "--data-file", make(tmp_path), "--name", "mine")
    assert expected in one_line_refusal(p)
    assert not resources.user_lock_path(cache).exists() and not (cache / "data" / "mine").exists()


def test_bad_encoding_in_a_user_file_names_the_line(tmp_path):
    f = tmp_path / "f.tsv"
    f.write_bytes(("\n".join(SST2_GOOD[:3]) + "\n").encode().replace(b"funny", b"fu\xe9nny"))
    assert "f.tsv:2: not valid UTF-8" in one_line_refusal(prepare("--cache", tmp_path / "c", "--data-file", f,
                                                                  "--name", "mine"))


def test_name_refusals(tmp_path):
    f = write(tmp_path / "mine.tsv", SST2_GOOD)
    cache = tmp_path / "c"
    for name, expected in (("glue-sst2", "is a pinned data id"), ("mc-taco", "is a pinned data id"),
                           ("Bad Name", "expected lower-case letters")):
        assert expected in one_line_refusal(prepare("--cache", cache, "--data-file", f, "--name", name))
    assert prepare("--cache", cache, "--data-file", f, "--name", "mine").returncode == 0
    other = write(tmp_path / "other.tsv", SST2_GOOD[:3])
    assert "already records it with content sha256" in one_line_refusal(
        prepare("--cache", cache, "--data-file", other, "--name", "mine"))
    p = prepare("--cache", cache, "--data-file", f, "--name", "x", "--pin")
    assert p.returncode == 2 and "--name NAME needs --data-file" in p.stderr


def test_mctaco_name_import_as_test_split(tmp_path):
    cache = tmp_path / "c"
    p = prepare("--cache", cache, "--data-file", FIXTURE, "--name", "my-mct", "--as-split", "test")
    assert p.returncode == 0, p.stdout + p.stderr
    parquet, entry = resources.verified_data(cache, "my-mct")
    assert parquet == cache / "data" / "my-mct" / "test.parquet" and entry["schema"] == "mctaco"
    assert resources.read_mctaco_parquet(parquet) == resources.read_mctaco_tsv(FIXTURE)


def test_verified_data_refuses_content_the_user_lock_does_not_pin(tmp_path):
    cache = tmp_path / "c"
    assert prepare("--cache", cache, "--data-file", write(tmp_path / "m.tsv", SST2_GOOD), "--name", "m").returncode == 0
    user = resources.load_user_lock(cache)
    user["data"]["m"]["content_sha256"] = "0" * 64
    resources.atomic_write_json(resources.user_lock_path(cache), user)
    with pytest.raises(resources.ResourceError, match="the user lock pins 0000"):
        resources.verified_data(cache, "m")


# ---- the synthetic generator for timing --------------------------------------------------------------------------

@pytest.mark.parametrize("split", ["validation", "test"])
def test_synthetic_split_has_the_real_shape_and_is_deterministic(tmp_path, split):
    import synth_mctaco

    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    synth_mctaco.main(["--split", split, "--out", str(a)])
    synth_mctaco.main(["--split", split, "--out", str(b)])
    assert a.read_bytes() == b.read_bytes()
    rows = resources.read_mctaco_tsv(a)
    pinned = resources.load_lock()["data"]["mc-taco" if split == "validation" else "mc-taco-test"]
    facts = resources.content_facts(rows, resources.MCTACO)
    assert (facts["rows"], facts["n_questions"], facts["label_counts"]) == \
        (pinned["rows"], pinned["n_questions"], pinned["label_counts"])
    assert facts["content_sha256"] != pinned["content_sha256"]
    assert {r["category"] for r in rows} == set(resources.MCTACO_CATEGORIES)


# ---- run.py: --data routed by schema -----------------------------------------------------------------------------

@pytest.mark.slow  # a run.py subprocess: imports torch, transformers and lm-eval before refusing
def test_run_refuses_data_of_the_other_schema_on_one_line(tmp_path):
    cache = tmp_path / "c"
    assert prepare("--cache", cache, "--data-file", FIXTURE, "--name", "my-mct").returncode == 0
    s_tsv = write(tmp_path / "s.tsv", SST2_GOOD)
    assert prepare("--cache", cache, "--data-file", s_tsv, "--name", "mine").returncode == 0
    for args, expected in ((("--experiment", "protocol", "--data", "my-mct"),
                            "--data my-mct is MC-TACO-shaped data; experiment(s) protocol score SST-2-shaped data"),
                           (("--experiment", "mctaco", "--data", "mine"),
                            "--data mine is SST-2-shaped data; experiment(s) mctaco score MC-TACO-shaped data"),
                           (("--data", "my-mct"), "experiment(s) protocol, options, extraction score SST-2")):
        p = run_cli("run.py", "--cache", cache, "--out", tmp_path / "o", "--smoke", *args)
        assert expected in one_line_refusal(p)
        assert not (tmp_path / "o").exists()


def cache_with_model(prepared_cache, dest):
    """A new cache holding the prepared model (files via conftest.link_or_copy) and no data: user imports then go
    into `dest`, never into the shared prepared cache."""
    manifest = resources.load_manifest(prepared_cache)
    model = {rid: e for rid, e in manifest["resources"].items() if e["kind"] == "model"}
    for entry in model.values():
        for rel in entry["files"]:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(prepared_cache / rel, dest / rel)
    resources.save_manifest(dest, {"resources": model})
    return dest


@pytest.mark.slow
def test_protocol_smoke_on_a_name_import_passes_and_audits(prepared_cache, tmp_path):
    cache = cache_with_model(prepared_cache, tmp_path / "c")
    src = resources.read_glue_tsv(REPO / "fixtures" / "sentiment_dev.tsv")[:40]
    f = write(tmp_path / "mine.tsv", ["sentence\tlabel"] + [f"{r['sentence']}\t{r['label']}" for r in src])
    assert prepare("--cache", cache, "--data-file", f, "--name", "mine").returncode == 0
    out = tmp_path / "o"
    p = run_cli("run.py", "--cache", cache, "--out", out, "--experiment", "protocol", "--data", "mine", "--smoke")
    assert p.returncode == 0, p.stdout + p.stderr
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    assert cfg["config"]["data"] == "mine"
    ident = json.loads((out / "protocol" / "identity.json").read_text())
    assert ident["data_content_sha256"] == resources.load_user_lock(cache)["data"]["mine"]["content_sha256"]
    a = run_cli("audit.py", out, "--cache", cache, "--tokens")
    assert a.returncode == 0 and "RESULT: PASS" in a.stdout, a.stdout + a.stderr


@pytest.mark.slow
def test_mctaco_smoke_on_a_test_split_import_follows_the_stock_choice_and_audits(prepared_cache, tmp_path):
    cache = cache_with_model(prepared_cache, tmp_path / "c")
    p = prepare("--cache", cache, "--data-file", FIXTURE, "--name", "my-mct", "--as-split", "test")
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "o"
    p = run_cli("run.py", "--cache", cache, "--out", out, "--experiment", "mctaco", "--data", "my-mct", "--smoke")
    assert p.returncode == 0, p.stdout + p.stderr
    cfg = json.loads((out / "mctaco" / "config.json").read_text())
    assert cfg["data"] == "my-mct" and cfg["config"]["mctaco_data"] == "my-mct"
    assert cfg["data_split"] == "test" and cfg["split_choice"]["stock_choice"] == "followed"
    assert cfg["official"]["dumped_task_config"]["test_split"] == "test"
    assert cfg["data_parquet"] == "data/my-mct/test.parquet" and cfg["data_routing"].startswith("run.py --data")
    a = run_cli("audit.py", out, "--cache", cache, "--tokens")
    assert a.returncode == 0 and "RESULT: PASS" in a.stdout, a.stdout + a.stderr


def test_pin_records_row_hashes_of_a_recognised_copy_then_names_the_row(tmp_path):
    lock = fake_real_lock(tmp_path, "mc-taco")
    data = json.loads(lock.read_text())
    data["data"]["mc-taco"]["row_sha256_16"] = None                 # as in the real lock before a verified import
    resources.atomic_write_json(lock, data)
    bad = write(tmp_path / "bad.tsv", mutate(40, lambda s: s.replace(" ", "  ", 1)))
    line = one_line_refusal(prepare("--cache", tmp_path / "c", "--lock", lock, "--data-file", bad))
    assert "the differing idx cannot be named" in line
    p = prepare("--cache", tmp_path / "c", "--lock", lock, "--data-file", FIXTURE, "--pin")
    assert p.returncode == 0 and "per-row hash prefixes" in p.stdout, p.stdout + p.stderr
    assert json.loads(lock.read_text())["data"]["mc-taco"]["row_sha256_16"] == \
        [resources.row_hash16(r, resources.MCTACO) for r in resources.read_mctaco_tsv(FIXTURE)]
    line = one_line_refusal(prepare("--cache", tmp_path / "c", "--lock", lock, "--data-file", bad))
    assert "first differing row: idx 40" in line
