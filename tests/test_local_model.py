"""run.py --model PATH: a local Hugging Face causal-LM directory, and --device/--threads/--dtype.

Tiny random models of two architectures with different tokenizers are built here from a config and saved with
safetensors: a Llama with a Llama-style tokenizer that prepends a BOS (a BPE trained on the fixture sentences,
LlamaTokenizerFast, add_bos_token=True) and a GPT-2 with a GPT-2-style byte-level BPE (no BOS). Each runs the real
protocol (real lm-eval, real forward passes) on the smoke items; the refusals are checked on the local_model
module (fast) and through run.py (one line, exit 2, no traceback).
"""
import json
import shutil
from pathlib import Path

import pytest

import conftest
from conftest import run_cli

FIXTURE = conftest.REPO / "fixtures" / "sentiment_dev.tsv"
PROMPT_WORDS = "Question: Is this sentence positive or negative?\nAnswer: negative positive"


def corpus():
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines] + [PROMPT_WORDS] * 20


def llama_tokenizer():
    """A Llama-style tokenizer: Metaspace BPE trained on the fixture sentences, <s> prepended (add_bos_token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"]))
    return LlamaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                              add_bos_token=True, add_eos_token=False)


def gpt2_tokenizer():
    """A GPT-2-style tokenizer: byte-level BPE trained on the fixture sentences, <|endoftext|> only, no BOS added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return GPT2TokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                             unk_token="<|endoftext|>")


def build(kind, out):
    """Save a tiny random `kind` ("llama" or "gpt2") model and its tokenizer into `out` (safetensors)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = llama_tokenizer() if kind == "llama" else gpt2_tokenizer()
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, tie_word_embeddings=False))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=512,
                                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return Path(out)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("local_models")
    return {kind: build(kind, root / kind) for kind in ("llama", "gpt2")}


@pytest.fixture(scope="module")
def data_cache(prepared_cache, tmp_path_factory):
    """A cache that holds the fixture data only (its manifest entry and parquet): no model in it at all."""
    cache = tmp_path_factory.mktemp("data_only_cache")
    shutil.copytree(prepared_cache / "data" / "fixture-sentiment", cache / "data" / "fixture-sentiment")
    manifest = json.loads((prepared_cache / "manifest.json").read_text())
    entry = manifest["resources"]["fixture-sentiment"]
    (cache / "manifest.json").write_text(json.dumps({"resources": {"fixture-sentiment": entry}}))
    return cache


# ---- fast: the local_model module -------------------------------------------------------------------------------

def test_identity_hashes_every_file_and_derives_model_and_tokenizer_hashes(tiny_dirs):
    import local_model
    import resources

    ident = local_model.local_identity(tiny_dirs["gpt2"])
    files = sorted(p.name for p in tiny_dirs["gpt2"].iterdir())
    assert sorted(ident["files"]) == files and ident["source"] == "local"
    for rel, meta in ident["files"].items():
        assert meta["sha256"] == resources.sha256_file(tiny_dirs["gpt2"] / rel)
    assert ident["model_sha256"] == local_model.listing_sha256(ident["files"])
    assert ident["tokenizer_sha256"] == local_model.listing_sha256(
        {r: m for r, m in ident["files"].items() if r in local_model.TOKENIZER_FILES})
    assert ident["architectures"] == ["GPT2LMHeadModel"]


def test_two_directories_differing_in_one_byte_have_different_identities(tiny_dirs, tmp_path):
    """The result cache keys on model_sha256: a directory that differs in any file (here only the config) never
    shares a cached score with another."""
    import local_model

    copy = tmp_path / "copy"
    shutil.copytree(tiny_dirs["gpt2"], copy)
    assert local_model.local_identity(copy)["model_sha256"] == local_model.local_identity(tiny_dirs["gpt2"])[
        "model_sha256"]
    cfg = json.loads((copy / "config.json").read_text())
    cfg["layer_norm_epsilon"] = 2e-5
    (copy / "config.json").write_text(json.dumps(cfg))
    assert local_model.local_identity(copy)["model_sha256"] != local_model.local_identity(tiny_dirs["gpt2"])[
        "model_sha256"]


def refused_dirs(tiny_dirs, root):
    """{case: directory} that must each be refused, built from the tiny GPT-2 directory."""
    cases = {}
    for case in ("pickled_only", "no_tokenizer", "not_causal", "symlink_out", "custom_code"):
        d = root / case
        shutil.copytree(tiny_dirs["gpt2"], d)
        cases[case] = d
    (cases["pickled_only"] / "model.safetensors").rename(cases["pickled_only"] / "pytorch_model.bin")
    (cases["no_tokenizer"] / "tokenizer.json").unlink()
    cfg = json.loads((cases["not_causal"] / "config.json").read_text())
    (cases["not_causal"] / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertModel"],
                                                                "model_type": "bert"}))
    (cases["symlink_out"] / "extra.txt").symlink_to(root / "outside.txt")
    (root / "outside.txt").write_text("not the model's")
    cfg = json.loads((cases["custom_code"] / "config.json").read_text())
    (cases["custom_code"] / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "x.Y"}}))
    return cases


REFUSALS = {"pickled_only": "only pickled weights", "no_tokenizer": "tokenizer.json: missing",
            "not_causal": "is not a causal language model", "symlink_out": "outside the model directory",
            "custom_code": "auto_map"}


def test_refused_directories_raise_one_line(tiny_dirs, tmp_path):
    import local_model
    from resources import ResourceError

    for case, d in refused_dirs(tiny_dirs, tmp_path).items():
        with pytest.raises(ResourceError) as e:
            local_model.local_identity(d)
        assert REFUSALS[case] in str(e.value) and "\n" not in str(e.value), (case, str(e.value))


def test_a_config_without_architectures_is_judged_by_its_model_type(tiny_dirs, tmp_path):
    """prepare.py's materialised SmolLM2 config has no `architectures` (AutoModelForCausalLM reads model_type): a
    causal model_type is accepted, a non-causal one (t5) is refused on one line."""
    import local_model
    from resources import ResourceError

    for model_type, ok in (("gpt2", True), ("t5", False)):
        d = tmp_path / model_type
        shutil.copytree(tiny_dirs["gpt2"], d)
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("architectures")
        (d / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
        if ok:
            assert local_model.local_identity(d)["architectures"] is None
        else:
            with pytest.raises(ResourceError) as e:
                local_model.local_identity(d)
            assert "no architectures, and model_type 't5'" in str(e.value) and "\n" not in str(e.value)


def test_too_many_files_are_refused(tiny_dirs, tmp_path, monkeypatch):
    import local_model
    from resources import ResourceError

    d = tmp_path / "many"
    shutil.copytree(tiny_dirs["gpt2"], d)
    monkeypatch.setattr(local_model, "MAX_FILES", 3)
    with pytest.raises(ResourceError, match="more than 3 files"):
        local_model.local_identity(d)


def test_special_tokens_are_derived_from_each_tokenizer(tiny_dirs):
    """The independent path's tokenisation prepends what the tokenizer's own configuration adds: <s> for the Llama
    tokenizer, nothing for the GPT-2 one; and it equals lm-eval HFLM's tok_encode for the same text (checked on
    the real HFLM in the slow runs below through the identity join)."""
    from transformers import AutoTokenizer

    from experiments import scoring

    llama = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    gpt2 = AutoTokenizer.from_pretrained(tiny_dirs["gpt2"])
    sl, sg = scoring.special_tokens(llama), scoring.special_tokens(gpt2)
    assert sl["prefix_ids"] == [llama.bos_token_id] and sl["add_bos"] is True
    assert sg["prefix_ids"] == [] and sg["add_bos"] is False
    ctx, cand = scoring.encode_pair(llama, "a fine film\nAnswer:", " positive")
    assert ctx[0] == llama.bos_token_id and ctx == llama("a fine film\nAnswer:")["input_ids"]
    assert scoring.encode_text(llama, "<s>already") == llama("<s>already", add_special_tokens=False)["input_ids"]


def test_device_problems_name_what_is_wrong():
    import torch

    import adapter

    assert adapter.device_problem("cpu") is None
    assert "expected cpu, cuda or cuda:N" in adapter.device_problem("tpu")
    if not torch.cuda.is_available():
        assert "no CUDA device" in adapter.device_problem("cuda")


# ---- slow: the real protocol on each tiny directory -------------------------------------------------------------

def run_protocol(data_cache, model, out, *extra):
    return run_cli("run.py", "--cache", data_cache, "--out", out, "--experiment", "protocol", "--smoke",
                   "--model", model, "--threads", "1", *extra)


def audit(out, data_cache):
    return run_cli("audit.py", out, "--tokens", "--forward", "--cache", data_cache)


def audit_rows(out):
    rows = json.loads((out / "audit.json").read_text())
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_protocol_on_a_local_directory_agrees_exactly_and_audits(kind, tiny_dirs, data_cache, tmp_path):
    out = tmp_path / "o"
    proc = run_protocol(data_cache, tiny_dirs[kind], out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    assert summary["agreement"]["max_abs_diff"] == 0.0 and summary["agreement"]["n_prediction_mismatches"] == 0
    assert summary["agreement_claim"] == {"device": "cpu", "dtype": "float32", "claim": "exact", "tolerance": 0.0,
                                          "max_abs_diff": 0.0, "passed": True}
    ident = json.loads((out / "protocol" / "identity.json").read_text())
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    assert ident["model_source"] == "local" and ident["model_files"] == cfg["model"]["files"]
    assert cfg["config"]["model"] == f"<model:{tiny_dirs[kind].resolve().name}>" and cfg["config"]["threads"] == 1
    special = cfg["independent"]["special_tokens"]
    records = [json.loads(line) for line in (out / "protocol" / "records.jsonl").read_text().splitlines()]
    if kind == "llama":
        assert special["add_bos"] is True and cfg["official"]["special_tokens"]["tok_encode_prefix_ids"] == [
            special["bos_token_id"]]
    else:
        assert special["prefix_ids"] == [] and cfg["official"]["special_tokens"]["tok_encode_prefix_ids"] == []
    assert all(r["candidates"][0]["start"] == r["context_tokens"] for r in records)
    proc = audit(out, data_cache)
    report = proc.stdout
    forward_rows = [line for line in report.splitlines() if "candidate scores vs both paths" in line]
    assert forward_rows, report
    assert proc.returncode == 0, report + proc.stderr
    # the row names the implementation that re-scored: the audit's own for Llama, transformers' class otherwise
    implementation = {"llama": "audit.py's own Llama forward",
                      "gpt2": "transformers' GPT2LMHeadModel, not the audit's own"}[kind]
    assert all("PASS" in line and implementation in line for line in forward_rows), report
    for line in report.splitlines():
        if "tokenisation" in line or "model files" in line:
            assert "PASS" in line, line


@pytest.mark.slow
def test_refused_directories_stop_run_py_with_one_line(tiny_dirs, data_cache, tmp_path):
    """Through run.py, the refusal that matters most (a pickle is never loaded): one line, exit 2. Every other
    refusal is the same ResourceError from local_identity (test_refused_directories_raise_one_line)."""
    for case, d in refused_dirs(tiny_dirs, tmp_path / "dirs").items():
        if case != "pickled_only":
            continue
        proc = run_protocol(data_cache, d, tmp_path / f"o-{case}")
        assert proc.returncode == 2, (case, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and REFUSALS[case] in lines[0] and "Traceback" not in proc.stderr, (case, lines)


@pytest.mark.slow
def test_cuda_is_refused_on_one_line_where_there_is_none(tiny_dirs, data_cache, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal does not apply")
    proc = run_protocol(data_cache, tiny_dirs["gpt2"], tmp_path / "o", "--device", "cuda")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "no CUDA device" in lines[0], proc.stderr


@pytest.mark.slow
def test_bfloat16_on_the_cpu_claims_exact_agreement_and_holds_it(tiny_dirs, data_cache, tmp_path):
    """--dtype bfloat16 on CPU: both paths in bfloat16, on the same batches, so the claim is exact (tolerance 0,
    max abs diff 0), as in float32; the audit recomputes that claim, and its forward level re-scores in bfloat16 in
    lm-eval's batches and finds the very same scores."""
    out = tmp_path / "o"
    proc = run_protocol(data_cache, tiny_dirs["llama"], out, "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    claim = summary["agreement_claim"]
    assert (claim["claim"], claim["dtype"], claim["tolerance"], claim["passed"]) == ("exact", "bfloat16", 0.0, True)
    assert claim["max_abs_diff"] == summary["agreement"]["max_abs_diff"] == 0.0
    cfg = json.loads((out / "protocol" / "config.json").read_text())
    assert cfg["official"]["model_dtype"] == cfg["independent"]["model_dtype"] == "torch.bfloat16"
    proc = audit(out, data_cache)
    forward_rows = [line for line in proc.stdout.splitlines() if "candidate scores vs both paths" in line]
    assert forward_rows and all("PASS" in line and "bfloat16" in line and "|recomputed - official| max 0," in line
                                for line in forward_rows), proc.stdout
    assert not any("FAIL" in line for line in proc.stdout.splitlines()), proc.stdout


@pytest.mark.slow
def test_cuda_float32_both_paths_on_the_gpu(tiny_dirs, data_cache, tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False): the CUDA path cannot run")
    out = tmp_path / "o"
    proc = run_protocol(data_cache, tiny_dirs["llama"], out, "--device", "cuda")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    claim = json.loads((out / "protocol" / "summary.json").read_text())["agreement_claim"]
    assert claim["device"] == "cuda" and claim["claim"] == "within tolerance" and claim["passed"] is True


def test_identity_join_catches_a_bos_disagreement(tiny_dirs):
    """The real HFLM told add_bos_token=False on the Llama directory (whose tokenizer prepends <s>) encodes the
    context without the BOS; the independent path keeps the tokenizer's own BOS: the identity join stops on the
    boundary and on the special-token prefix of every candidate."""
    from transformers import AutoTokenizer

    import config
    from experiments import official, scoring, two_paths
    from experiments.evidence import IdentityMismatch

    conf = config.effective(["shared"], {"threads": 1})
    lm = official.make_hflm({**official.hflm_args(tiny_dirs["llama"], conf), "add_bos_token": False})
    tok = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    item = {"idx": 7, "prompt": "a fine film\nQuestion: Is this sentence positive or negative?\nAnswer:",
            "candidates": [" negative", " positive"]}
    independent = {7: [{"start": len(c), "token_ids": t} for c, t in
                       (scoring.encode_pair(tok, item["prompt"], cand) for cand in item["candidates"])]}
    sample = {"doc_id": 7, "arguments": [(item["prompt"], c) for c in item["candidates"]]}
    boundaries = two_paths.official_boundaries(lm, [item])
    with pytest.raises(IdentityMismatch) as e:
        two_paths.join_samples([item], [sample], boundaries, independent, two_paths.LoggedTask(),
                               scoring.special_tokens(tok)["prefix_ids"])
    fields = {row[1] for row in e.value.rows}
    assert fields == {"boundary ' negative'", "boundary ' positive'", "special-token prefix ' negative'",
                      "special-token prefix ' positive'"}
    lm_default = official.make_hflm(official.hflm_args(tiny_dirs["llama"], conf))
    assert two_paths.join_samples([item], [sample], two_paths.official_boundaries(lm_default, [item]), independent,
                                  two_paths.LoggedTask(), scoring.special_tokens(tok)["prefix_ids"])


def test_a_directory_without_chat_template_is_refused_for_chat_experiments(tiny_dirs, tmp_path):
    """extraction and harness render chat prompts (NEEDS_CHAT_TEMPLATE): run.py refuses a local directory without
    a chat template for them on one line, and lets protocol/options/mctaco run; a template makes it acceptable."""
    import importlib

    import local_model
    import run as run_py
    from experiments.context import Inputs
    from resources import ResourceError

    modules = {n: importlib.import_module(f"experiments.{n}") for n in ("protocol", "options", "harness", "extraction")}
    inputs = Inputs(cache=tmp_path, model_dir=tiny_dirs["gpt2"], model_identity={"source": "local"})
    with pytest.raises(ResourceError, match="no chat template .* harness, extraction need") as e:
        run_py.check_model_fits(modules, inputs)
    assert "\n" not in str(e.value)
    run_py.check_model_fits({n: modules[n] for n in ("protocol", "options")}, inputs)
    with_template = tmp_path / "t"
    shutil.copytree(tiny_dirs["gpt2"], with_template)
    (with_template / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert local_model.has_chat_template(with_template) and not local_model.has_chat_template(tiny_dirs["gpt2"])
    run_py.check_model_fits(modules, Inputs(**{**inputs.__dict__, "model_dir": with_template}))


def test_the_result_cache_never_serves_one_local_directory_to_another(tiny_dirs, tmp_path):
    """A score stored under one local directory's identity misses under another's (they differ in one config
    byte), and hits under the same directory's identity recomputed from its files."""
    import config
    import local_model
    from experiments import result_cache

    copy = tmp_path / "copy"
    shutil.copytree(tiny_dirs["gpt2"], copy)
    (copy / "generation_config.json").write_text((copy / "generation_config.json").read_text() + " ")
    conf = config.effective(["shared", "protocol"], {"threads": 1})

    def cache_for(directory):
        ident = local_model.local_identity(directory)
        run = result_cache.run_identity(
            model_sha256=ident["model_sha256"], tokenizer_sha256=ident["tokenizer_sha256"], data_content_sha256="d",
            prompt_template_sha256="p", config={**conf, "model": ident["id"]}, scorer="independent-parity",
            code_sha256="c", versions={}, platform={})
        return result_cache.ResultCache(tmp_path / "results.sqlite", run)

    item = {"idx": 1, "candidate": " positive"}
    first = cache_for(tiny_dirs["gpt2"])
    with first.batch():
        first.put(item, -1.5)
    assert cache_for(tiny_dirs["gpt2"]).get(item) == -1.5
    assert cache_for(copy).get(item) is None
    assert first.run["model_sha256"] != cache_for(copy).run["model_sha256"]


@pytest.mark.slow
def test_exact_only_experiments_are_refused_off_the_cpu_on_one_line(tiny_dirs, data_cache, tmp_path):
    """options, mctaco and extraction claim exact agreement only, which is shown on the cpu: with --device cuda
    run.py refuses them before anything loads (one line, exit 2), naming them; protocol, which states a tolerance
    off the cpu, is not refused. (On the cpu every dtype is exact: test_kernel_paths runs them in bfloat16.)"""
    out = tmp_path / "o"
    proc = run_cli("run.py", "--cache", data_cache, "--out", out, "--model", tiny_dirs["llama"], "--device", "cuda",
                   *[a for name in ("protocol", "options", "mctaco", "extraction") for a in ("--experiment", name)])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "experiment(s) options, mctaco, extraction claim exact agreement only" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and (not out.exists() or not any(out.iterdir()))


@pytest.mark.slow
def test_the_real_model_as_a_local_directory_runs_extraction_and_audits_at_every_level(model_dir, data_cache,
                                                                                         tmp_path):
    """The prepared SmolLM2 directory given by path (source local, every file hashed): the chat experiment runs and
    the audit's forward level re-hashes every local file before its greedy check (model_sha256 of a local
    directory is derived from all files, not the weights file's own hash)."""
    local = tmp_path / "smollm2"
    shutil.copytree(model_dir, local)
    out = tmp_path / "o"
    proc = run_cli("run.py", "--cache", data_cache, "--out", out, "--experiment", "extraction", "--smoke", "--model",
                   local, "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ident = json.loads((out / "extraction" / "identity.json").read_text())
    assert ident["model_source"] == "local" and "model.safetensors" in ident["model_files"]
    proc = run_cli("audit.py", out, "--strict", "--tokens", "--forward", "--cache", data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert any("greedy tokens" in l and "PASS" in l for l in proc.stdout.splitlines()), proc.stdout[-3000:]


def test_an_hflm_that_cannot_load_is_one_resource_error(tmp_path):
    """lm-eval's HFLM refusing a directory (here: a config.json of an unknown model type) is a ResourceError naming
    the directory, which run.py prints as one line (exit 2), not a NameError traceback."""
    from experiments import official
    from resources import ResourceError

    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ResourceError, match="lm-eval's HFLM could not load it"):
        official.make_hflm({"pretrained": str(tmp_path), "device": "cpu", "dtype": "float32", "batch_size": 1})
