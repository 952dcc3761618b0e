"""Hostile local model directories (run.py --model DIR, audit.py --lm-eval RUN --model DIR).

Every directory here is built from a tiny randomly initialised Llama saved with save_pretrained (safetensors) and a
small word-level fast tokenizer, then made hostile in one way: a weight map or a symlink that leaves the
directory, a pickle, custom code, an absurd config, a truncated tokenizer, a safetensors header that lies. Each must
be refused before anything loads: one line naming the directory or file, exit 2, never a traceback. The fast tier
checks local_model.local_identity, the loader and the audit in-process; run.py itself is a subprocess that imports
lm-eval (12 s or more each), so those runs (the cases named by the integrity review) are marked slow.
"""
import json
import shutil
import struct
from pathlib import Path

import pytest

from conftest import run_cli
from evidence_audit.cli import main as audit_main
from test_lmeval_audit import toy_samples, write_run

WORDS = ["<unk>", "<s>", "</s>", "Q0", "Q1", "Q2", "no", "yes", "good", "bad", "film", "Answer:"]


def tiny_tokenizer():
    """A word-level fast tokenizer over WORDS (what the audit's token boundaries need: Q0..Q2, no, yes)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def build_llama(out):
    """A tiny random Llama (float32, tied embeddings) and its tokenizer saved into `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tiny_tokenizer().save_pretrained(out)
    return Path(out)


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory):
    return build_llama(tmp_path_factory.mktemp("hostile") / "clean")


def sharded_copy(clean_dir, d):
    """A copy of the clean directory with its weights in two shards and an index naming them."""
    shutil.copytree(clean_dir, d)
    header, data = read_st(d / "model.safetensors")
    names = sorted(k for k in header if k != "__metadata__")
    half = len(names) // 2
    for part, chosen in (("a", names[:half]), ("b", names[half:])):
        sub, blob = {}, b""
        for name in chosen:
            begin, end = header[name]["data_offsets"]
            sub[name] = {**header[name], "data_offsets": [len(blob), len(blob) + end - begin]}
            blob += data[begin:end]
        write_st(d / f"model-{part}.safetensors", sub, blob)
    (d / "model.safetensors").unlink()
    weight_map = {n: "model-a.safetensors" if n in names[:half] else "model-b.safetensors" for n in names}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def read_st(path):
    """(header dict, data bytes) of a safetensors file."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def edit_header(d, edit):
    header, data = read_st(d / "model.safetensors")
    edit(header)
    write_st(d / "model.safetensors", header, data)


def edit_json(path, edit):
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def outside_index(d, outside):
    """model.safetensors moved to `outside` and named there by an index; a decoy .safetensors left inside."""
    header, _ = read_st(d / "model.safetensors")
    shutil.move(d / "model.safetensors", outside)
    (d / "sub").mkdir()
    write_st(d / "sub" / "decoy.safetensors", {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
             b"\0" * 4)
    weight_map = {name: str(outside) for name in header if name != "__metadata__"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def dotdot_index(d, outside):
    outside_index(d, outside)
    edit_json(d / "model.safetensors.index.json",
              lambda ix: ix["weight_map"].update({k: f"../{outside.name}" for k in ix["weight_map"]}))


def pickle_beside_nested_decoy(d, outside):
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    (d / "sub").mkdir()
    write_st(d / "sub" / "decoy.safetensors", {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
             b"\0" * 4)


def tensor_in_two_shards(d, outside):
    """Two shards, the second also holding a (changed) copy of model.norm.weight: which copy loads is the loader's
    choice, so the identity could not say which weights ran."""
    header, data = read_st(d / "model.safetensors")
    names = sorted(k for k in header if k != "__metadata__")
    half = len(names) // 2
    dup = "model.norm.weight"
    parts = {"a": names[:half], "b": [n for n in names[half:] if n != dup] + [dup]}
    parts["a"] = [n for n in parts["a"] if n != dup] + [dup]
    for part, chosen in parts.items():
        sub, blob = {}, b""
        for name in chosen:
            begin, end = header[name]["data_offsets"]
            sub[name] = {**header[name], "data_offsets": [len(blob), len(blob) + end - begin]}
            blob += data[begin:end] if part == "a" or name != dup else bytes(end - begin)
        write_st(d / f"model-{part}.safetensors", sub, blob)
    (d / "model.safetensors").unlink()
    weight_map = {n: "model-a.safetensors" if n in parts["a"] else "model-b.safetensors" for n in names}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def shape_lie(header):
    w = header["model.layers.0.mlp.up_proj.weight"]
    w["shape"] = w["shape"][::-1]            # same byte count, transposed


def dtype_lie(header):
    header["model.norm.weight"]["dtype"] = "F16"


def offsets_beyond(header):
    last = max((v for k, v in header.items() if k != "__metadata__"), key=lambda v: v["data_offsets"][1])
    last["data_offsets"][1] += 1 << 20
    last["shape"] = [last["shape"][0] + (1 << 18) // max(1, last["shape"][-1])] + last["shape"][1:]


def huge_header(d, outside):
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


HOSTILE = {
    # case: (make it hostile (dir, a path outside it), words the one-line refusal must hold)
    "weight_map_absolute": (outside_index, "leaves the model directory"),
    "weight_map_dotdot": (dotdot_index, "leaves the model directory"),
    "symlink_out": (lambda d, o: (shutil.move(d / "model.safetensors", o),
                                  (d / "model.safetensors").symlink_to(o)), "outside the model directory"),
    "pickle_beside_nested_decoy": (pickle_beside_nested_decoy, "pytorch_model.bin"),
    "pickle_beside_weights": (lambda d, o: (d / "training_args.bin").write_bytes(b"\x80\x04N."), "pickle"),
    "absurd_config": (lambda d, o: edit_json(d / "config.json", lambda c: c.update(
        hidden_size=1 << 20, intermediate_size=1 << 22, num_hidden_layers=1 << 12, vocab_size=1 << 24)),
        "bytes of parameters"),
    "negative_config": (lambda d, o: edit_json(d / "config.json", lambda c: c.update(num_hidden_layers=-1)),
                        "num_hidden_layers"),
    "truncated_tokenizer": (lambda d, o: truncate(d / "tokenizer.json"), "tokenizer.json"),
    "shape_lie": (lambda d, o: edit_header(d, shape_lie), "model.layers.0.mlp.up_proj.weight"),
    "tensor_in_two_shards": (tensor_in_two_shards, "'model.norm.weight' is also in model-a.safetensors"),
    "dtype_lie": (lambda d, o: edit_header(d, dtype_lie), "model.norm.weight"),
    "offsets_beyond_file": (lambda d, o: edit_header(d, offsets_beyond), "beyond"),
    "huge_header": (huge_header, "header"),
    "truncated_weights": (lambda d, o: truncate(d / "model.safetensors"), "model.safetensors"),
    "missing_tensor": (lambda d, o: edit_header(d, lambda h: h.pop("model.norm.weight")), "model.norm.weight"),
    "custom_code_file": (lambda d, o: (d / "modeling_evil.py").write_text("import os\n"), "modeling_evil.py"),
    "peft_adapter": (lambda d, o: (d / "adapter_config.json").write_text("{}"), "adapter_config.json"),
    "tokenizer_file_elsewhere": (lambda d, o: edit_json(d / "tokenizer_config.json", lambda c: c.update(
        tokenizer_file=str(o))), "tokenizer_file"),
    "tokenizer_custom_code": (lambda d, o: edit_json(d / "tokenizer_config.json", lambda c: c.update(
        auto_map={"AutoTokenizer": ["x.Y", None]})), "auto_map"),
    "unknown_top_level_file": (lambda d, o: (d / "generation_config_v2.json").write_text("{}"),
                               "generation_config_v2.json"),
    "nan_in_config": (lambda d, o: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN')), "NaN"),
}


def hostile_dir(clean_dir, root, case):
    d = root / case
    shutil.copytree(clean_dir, d, symlinks=True)
    outside = root / f"{case}-outside.safetensors"
    HOSTILE[case][0](d, outside)
    return d


def one_line(text):
    lines = text.strip().splitlines()
    return len(lines) == 1 and "Traceback" not in text


# ---- fast: local_model.local_identity -----------------------------------------------------------------------------

def test_the_clean_directory_is_accepted_and_hashes_what_the_loader_reads(clean_dir, tmp_path):
    import local_model

    ident = local_model.local_identity(clean_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(ident["files"])
    copy = tmp_path / "copy"
    shutil.copytree(clean_dir, copy)
    (copy / "README.md").write_text("# notes\n")         # documentation: never read by the loader, not the model
    assert local_model.local_identity(copy)["model_sha256"] == ident["model_sha256"]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_hostile_directory_is_refused_on_one_line(case, clean_dir, tmp_path):
    import local_model
    from resources import ResourceError

    d = hostile_dir(clean_dir, tmp_path, case)
    with pytest.raises(ResourceError) as e:
        local_model.local_identity(d)
    message = str(e.value)
    assert "\n" not in message and HOSTILE[case][1] in message and str(d) in message, message


def test_a_sharded_directory_inside_is_accepted_and_every_shard_is_in_the_identity(clean_dir, tmp_path):
    """The index's shards are what the loader reads: they are hashed, so a shard's byte changes the identity."""
    import local_model

    d = sharded_copy(clean_dir, tmp_path / "sharded")
    ident = local_model.local_identity(d)
    assert {"model-a.safetensors", "model-b.safetensors", "model.safetensors.index.json"} <= set(ident["files"])
    other = tmp_path / "other"
    shutil.copytree(d, other)
    header_b, data_b = read_st(other / "model-b.safetensors")
    write_st(other / "model-b.safetensors", header_b, bytes([data_b[0] ^ 1]) + data_b[1:])
    assert local_model.local_identity(other)["model_sha256"] != ident["model_sha256"]


def test_two_directories_differing_only_outside_cannot_share_a_model_sha256(clean_dir, tmp_path):
    """The forger's pair: the same directory bytes, weights outside that differ. Neither gets an identity."""
    import local_model
    from resources import ResourceError

    identities = []
    for k in range(2):
        d = tmp_path / f"pair{k}"
        shutil.copytree(clean_dir, d)
        outside = tmp_path / f"weights{k}.safetensors"
        outside_index(d, outside)
        header, data = read_st(outside)
        write_st(outside, header, bytes([data[0] ^ k]) + data[1:])
        try:
            identities.append(local_model.local_identity(d)["model_sha256"])
        except ResourceError as e:
            assert "leaves the model directory" in str(e)
    assert identities == []


# ---- fast: audit.py --lm-eval RUN --model DIR (a hand-written run) ------------------------------------------------

def audit_run(tmp_path):
    run = tmp_path / "run"
    if not run.exists():
        write_run(run, toy_samples())
    return run


def test_the_audit_accepts_the_clean_directory(clean_dir, tmp_path, capsys):
    code = audit_main(["--lm-eval", str(audit_run(tmp_path)), "--forward", "--model", str(clean_dir),
                       "--report", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert code in (0, 1), capsys.readouterr().err
    assert any(r["check"].startswith("continuation token boundaries") and r["status"] == "PASS"
               for r in report["checks"])


@pytest.mark.parametrize("case", sorted(set(HOSTILE) - {"symlink_out"}))
def test_the_audit_refuses_each_hostile_directory_on_one_line(case, clean_dir, tmp_path, capsys):
    d = hostile_dir(clean_dir, tmp_path, case)
    code = audit_main(["--lm-eval", str(audit_run(tmp_path)), "--forward", "--model", str(d),
                       "--report", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and one_line(err) and str(d) in err and HOSTILE[case][1] in err, err
    assert not (tmp_path / "r.json").exists()


def test_the_audit_reads_a_hugging_face_cache_snapshot_of_symlinks(clean_dir, tmp_path):
    """lm-eval users pass a hub cache snapshot, every file a symlink into ../../blobs: the audit pins no identity
    (lm-eval's output names none), so it checks and reads the files the links point at; run.py, which pins one,
    refuses links that leave the directory (symlink_out above)."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for p in clean_dir.iterdir():
        shutil.copy(p, blobs / p.name)
        (snap / p.name).symlink_to(Path("../..") / "blobs" / p.name)
    code = audit_main(["--lm-eval", str(audit_run(tmp_path)), "--tokens", "--model", str(snap),
                       "--report", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert code in (0, 1) and report["n_fail"] == 0      # 1: INCOMPLETE, no --data for the prompts
    assert any(r["check"].startswith("continuation token boundaries") and r["status"] == "PASS"
               for r in report["checks"])


@pytest.mark.parametrize("case", ["weight_map_absolute", "absurd_config", "shape_lie"])
def test_the_audit_cli_refuses_without_a_traceback(case, clean_dir, tmp_path):
    d = hostile_dir(clean_dir, tmp_path, case)
    proc = run_cli("audit.py", "--lm-eval", audit_run(tmp_path), "--tokens", "--model", d,
                   "--report", tmp_path / "r.json")
    assert proc.returncode == 2 and one_line(proc.stderr) and HOSTILE[case][1] in proc.stderr, proc.stderr


# ---- slow (run.py imports lm-eval in a subprocess): run.py --model DIR ----------------------------------------------

@pytest.fixture(scope="module")
def empty_cache(tmp_path_factory):
    """A cache with an empty manifest: the model directory is checked before any data is needed."""
    cache = tmp_path_factory.mktemp("empty_cache")
    (cache / "manifest.json").write_text(json.dumps({"resources": {}}))
    return cache


RUN_PY_CASES = ("weight_map_absolute", "pickle_beside_nested_decoy", "absurd_config", "truncated_tokenizer",
                "shape_lie", "dtype_lie", "offsets_beyond_file", "huge_header")    # the rest: same call, in-process


@pytest.mark.slow
@pytest.mark.parametrize("case", RUN_PY_CASES)
def test_run_py_refuses_each_hostile_directory_on_one_line(case, clean_dir, empty_cache, tmp_path):
    d = hostile_dir(clean_dir, tmp_path, case)
    proc = run_cli("run.py", "--cache", empty_cache, "--out", tmp_path / "out", "--model", d,
                   "--experiment", "protocol", "--smoke", "--threads", "1")
    assert proc.returncode == 2 and one_line(proc.stderr) and HOSTILE[case][1] in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_sharded_model_directory_reaches_the_forward_verdict(clean_dir, tiny_cache, tmp_path):
    """run.py accepts a sharded --model directory; the audit re-scores it from its shards (it used to look for
    model.safetensors alone and never reach a forward verdict)."""
    d = sharded_copy(clean_dir, tmp_path / "sharded")
    out = tmp_path / "out"
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", out, "--model", d, "--experiment", "protocol", "--smoke",
                   "--threads", "1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = run_cli("audit.py", out, "--tokens", "--forward", "--cache", tiny_cache)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout[-3000:]
    assert "model not found" not in proc.stdout


# ---- fast: what transformers itself refuses, found before any experiment loads -----------------------------------

LOADER_REFUSES = {
    # case: (edit of the clean directory that passes the byte-level checks, words of the refusal)
    "unknown_activation": (lambda d: edit_json(d / "config.json", lambda c: c.update(hidden_act="no_such_act")),
                           "no_such_act"),
    "unknown_tokenizer_class": (lambda d: edit_json(d / "tokenizer_config.json", lambda c: c.update(
        tokenizer_class="NoSuchTokenizerFast")), "NoSuchTokenizer"),
}


@pytest.mark.parametrize("case", sorted(LOADER_REFUSES))
def test_what_the_loader_would_refuse_is_refused_before_the_run_on_one_line(case, clean_dir, tmp_path):
    import local_model
    from resources import ResourceError

    d = tmp_path / case
    shutil.copytree(clean_dir, d)
    LOADER_REFUSES[case][0](d)
    with pytest.raises(ResourceError) as e:
        local_model.local_identity(d)
    assert "\n" not in str(e.value) and LOADER_REFUSES[case][1] in str(e.value) and str(d) in str(e.value)


@pytest.mark.parametrize("case, load", [("dtype_lie", "model"), ("truncated_tokenizer", "tokenizer")])
def test_the_loader_itself_fails_on_one_line_naming_the_directory(case, load, clean_dir, tmp_path):
    """harness/hf_model.py, called on a directory nothing checked: its failure is one line (ModelLoadError, an
    OSError) naming the directory, never a library traceback."""
    from harness import hf_model

    d = hostile_dir(clean_dir, tmp_path, case)
    with pytest.raises(hf_model.ModelLoadError) as e:
        if load == "model":
            hf_model.load_model(d, dtype="float32", attn_implementation="eager", threads=1, device="cpu")
        else:
            hf_model.load_tokenizer(d)
    assert "\n" not in str(e.value) and str(d) in str(e.value), str(e.value)
