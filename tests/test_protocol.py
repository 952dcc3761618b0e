"""The official SST-2 protocol on the real model: both paths, bit for bit, with identity checks that can fail;
run.py's contract around it (exit codes, stages.json, console headers, library chatter, --no-sort-samples)."""
import json
import time

import pytest

import config
from conftest import run_cli
from experiments import protocol, scoring, selection

CONFIG = config.effective(protocol.CONFIG_SECTIONS)

IDENTITY_FIELDS = {"idx", "rank", "label", "sentence_sha256", "prompt_sha256", "context_tokens", "candidates",
                   "official", "independent", "abs_diff"}


def read_records(out):
    return [json.loads(l) for l in (out / "protocol" / "records.jsonl").read_text().splitlines()]


def check_run(out, n_items):
    summary = json.loads((out / "protocol" / "summary.json").read_text())
    records = read_records(out)
    assert summary["n_items"] == n_items == len(records)
    assert summary["n_candidates"] == 2 * n_items
    assert summary["agreement"] == {"max_abs_diff": 0.0, "n_candidate_score_mismatches": 0,
                                    "n_prediction_mismatches": 0}
    assert summary["identity_checks"]["passed"] and summary["identity_checks"]["n_samples_joined"] == n_items
    assert summary["official"]["lm_eval_reported_acc"] == summary["official"]["accuracy"]
    for r in records:
        assert IDENTITY_FIELDS <= set(r), r.keys()
        assert r["official"]["scores"] == r["independent"]["scores"]
        assert r["official"]["doc_id"] == r["idx"]
        assert r["official"]["prompt_hash"] == r["prompt_sha256"]
        assert [c["token_ids"] for c in r["candidates"]] == [[3524], [2731]]
        assert all(c["start"] == r["context_tokens"] for c in r["candidates"])
        assert "sentence" not in json.dumps(r).replace("sentence_sha256", "")  # no dataset text in public evidence
    return summary, records


@pytest.mark.slow
def test_smoke_two_items_four_candidates(smoke_run):
    out, proc = smoke_run
    summary, records = check_run(out, 2)
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    assert [r["idx"] for r in records] == ranked[:2]
    assert "identity checks passed" in proc.stdout
    for name in ("environment.json",):
        assert (out / name).exists()
    for name in ("config.json", "identity.json", "records.jsonl", "summary.json", "stages.json"):
        assert (out / "protocol" / name).exists()
    texts = (out / "private" / "protocol" / "texts.jsonl").read_text().splitlines()
    assert len(texts) == 2


@pytest.mark.slow
def test_dev_64_items_bit_exact(dev_run):
    out, _ = dev_run
    summary, records = check_run(out, 64)
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    assert [r["idx"] for r in records] == ranked[:64]
    assert not set(r["idx"] for r in records) & set(ranked[64:192])  # confirmation items untouched
    assert summary["split"] == "dev" and summary["confirmation_items_scored"] is False
    config = json.loads((out / "protocol" / "config.json").read_text())
    assert config["selection"]["salt"] == CONFIG["selection_salt"]
    assert config["official"]["indices_sorted"] is True
    assert config["official"]["dumped_task_config"]["doc_to_text"].startswith("{{sentence}}")
    assert "api/task.py" in config["official"]["lm_eval_files_sha256"]
    stages = json.loads((out / "protocol" / "stages.json").read_text())
    names = [s["name"] for s in stages["stages"]]
    assert names == ["imports", "official_model_load", "official", "independent_model_load", "independent",
                     "compare", "write"]
    assert stages["tokens"]["context_tokens"]["total"] == sum(r["context_tokens"] for r in records)
    labels = [r["label"] for r in records]
    assert summary["label_counts"] == {"0": labels.count(0), "1": labels.count(1)}


@pytest.mark.slow
def test_unsorted_samples_defect_is_caught_on_the_smoke_items(tiny_cache, tmp_path):
    """lm-eval 0.4.9.2 logs doc_id in the caller's order but iterates docs in dataset order: exit 1, no evidence.

    The 2 smoke items are already in ascending order, so --no-sort-samples passes them reversed; the defect is in
    the bookkeeping, not the model, so the tiny random model shows it as well as the real one."""
    assert selection.select("smoke", CONFIG["selection_salt"], 200, 64, 128, 2) == sorted(
        selection.select("smoke", CONFIG["selection_salt"], 200, 64, 128, 2))       # the case of the old defect
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", tmp_path, "--model", "tiny-random-llama",
                   "--experiment", "protocol", "--smoke", "--no-sort-samples", "--no-cache")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "doc.idx" in proc.stderr and "MISMATCH" in proc.stderr and "reversed" in proc.stderr
    assert "identity checks passed" not in proc.stdout
    failed = json.loads((tmp_path / "protocol.FAILED.json").read_text())
    assert any(m["field"] == "doc.idx" for m in failed["mismatches"])
    smoke = selection.select("smoke", CONFIG["selection_salt"], 200, 64, 128, 2)
    assert failed["details"]["indices_passed_to_lm_eval"] == smoke[::-1]
    assert "reversed" in failed["details"]["indices_order"]
    assert not (tmp_path / "protocol").exists()  # no evidence was installed


def test_no_sort_samples_order_is_unsorted_for_any_selection_of_two_or_more():
    for indices in ([3, 9], [9, 3], [5, 1, 7], list(range(64)), [40]):
        passed, order = protocol.indices_for_lm_eval(indices, sort=True)
        assert passed == sorted(indices) and "sorted" in order
        passed, order = protocol.indices_for_lm_eval(indices, sort=False)
        assert sorted(passed) == sorted(indices)                                # the same items, reordered
        if len(indices) >= 2:
            assert passed != sorted(passed), indices                            # the defect can show
            assert ("reversed" in order) == (indices == sorted(indices)), order
        else:
            assert passed == indices and "nothing could be demonstrated" in order


@pytest.mark.slow  # a run.py subprocess: imports torch, transformers and lm-eval before refusing
def test_missing_cache_fails_clearly(tmp_path):
    proc = run_cli("run.py", "--cache", tmp_path / "nope", "--out", tmp_path / "o", "--smoke")
    assert proc.returncode == 2
    assert "prepare.py" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()                                        # nothing is created on refusal


# ---- the independent path's own assertions (real tokenizer) ------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from adapter import load_tokenizer
    return load_tokenizer(model_dir)


PROMPT = "A warm, funny film.\nQuestion: Is this sentence positive or negative?\nAnswer:"


@pytest.mark.slow  # the real tokenizer or model: needs the prepared cache
def test_wrong_candidate_boundary_is_caught(tokenizer):
    ctx_ids, cand_ids = scoring.encode_pair(tokenizer, PROMPT, " positive")
    scoring.check_boundary(tokenizer, PROMPT, " positive", ctx_ids, cand_ids)  # the true one passes
    with pytest.raises(scoring.ScoringError, match="boundary mismatch"):
        scoring.check_boundary(tokenizer, PROMPT, " positive", ctx_ids[:-1], ctx_ids[-1:] + cand_ids)
    with pytest.raises(scoring.ScoringError, match="boundary mismatch"):
        scoring.check_boundary(tokenizer, PROMPT, " positive", ctx_ids, [3524])


@pytest.mark.slow  # the real tokenizer or model: needs the prepared cache
def test_prompt_with_extra_space_is_caught(tokenizer):
    with pytest.raises(scoring.ScoringError, match="ends with whitespace"):
        scoring.encode_pair(tokenizer, PROMPT + " ", " positive")


@pytest.mark.slow  # the real tokenizer or model: needs the prepared cache
def test_non_prefix_tokenisation_is_caught(tokenizer):
    # "Answer" + "ing" merges across the boundary, so the context tokens are not a prefix of the whole.
    ctx = "It was fine\nAnswer"
    with pytest.raises(scoring.ScoringError, match="not a prefix"):
        scoring.encode_pair(tokenizer, ctx, "ing")


@pytest.mark.slow  # the real tokenizer or model: needs the prepared cache
def test_600_token_input_fails_clearly(tokenizer):
    long_sentence = " ".join(["wonderful"] * 600)
    prompt = CONFIG["sst2_prompt"].format(sentence=long_sentence)
    ctx_ids, cand_ids = scoring.encode_pair(tokenizer, prompt, " positive")
    with pytest.raises(scoring.ScoringError, match=r"over the limit of 512; refusing to truncate"):
        scoring.check_length(len(ctx_ids) + len(cand_ids), CONFIG["max_input_tokens"], "idx 7")


def test_argmax_first_index_wins_ties():
    assert scoring.argmax_first([-1.0, -1.0]) == 0
    assert scoring.argmax_first([-2.0, -1.0, -1.0]) == 1
    assert scoring.argmax_first([-0.5, -3.0]) == 0


def test_selection_rule_is_fixed_and_disjoint():
    dev = selection.select("dev", "s", 300, 64, 128, 2)
    confirm = selection.select("confirm", "s", 300, 64, 128, 2)
    smoke = selection.select("smoke", "s", 300, 64, 128, 2)
    assert len(dev) == 64 and len(confirm) == 128 and smoke == dev[:2]
    assert not set(dev) & set(confirm)
    assert dev == selection.select("dev", "s", 300, 64, 128, 2)
    assert dev != selection.select("dev", "t", 300, 64, 128, 2)
    with pytest.raises(ValueError, match="needs 192"):
        selection.select("confirm", "s", 100, 64, 128, 2)


@pytest.mark.slow
def test_confirm_split_is_only_scored_on_request_and_says_so(tiny_cache, tmp_path):
    """Plumbing on a tiny random model: --split confirm scores exactly the 128 held-back items and labels them."""
    proc = run_cli("run.py", "--cache", tiny_cache, "--out", tmp_path, "--model", "tiny-random-llama",
                   "--split", "confirm", "--experiment", "protocol")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CONFIRMATION SPLIT" in proc.stdout
    ranked = selection.ranked_indices(CONFIG["selection_salt"], 200)
    records = read_records(tmp_path)
    assert [r["idx"] for r in records] == ranked[64:192]
    for name in ("summary.json", "config.json"):
        doc = json.loads((tmp_path / "protocol" / name).read_text())
        assert doc["split"] == "confirm" and doc["confirmation_items_scored"] is True
    summary = json.loads((tmp_path / "protocol" / "summary.json").read_text())
    assert summary["agreement"]["max_abs_diff"] == 0.0  # bit-exact holds for any weights, not just the real ones


@pytest.mark.slow
def test_tampered_cache_file_is_refused_by_run(tiny_cache, tmp_path):
    import shutil
    cache = tmp_path / "cache"
    shutil.copytree(tiny_cache, cache)
    parquet = cache / "data" / "fixture-sentiment" / "validation.parquet"
    data = bytearray(parquet.read_bytes())
    data[len(data) // 2] ^= 1
    parquet.write_bytes(bytes(data))
    proc = run_cli("run.py", "--cache", cache, "--out", tmp_path / "o", "--model", "tiny-random-llama", "--smoke",
                   "--experiment", "protocol")
    assert proc.returncode == 2
    assert "validation.parquet: bytes changed" in proc.stderr


# ---- run.py's contract: stages.json, console headers, library chatter, no exits in experiments -------------------

def fake_experiment(name, sleep_s):
    """An experiment module that satisfies the contract (experiments/context.py) without a model."""
    import types

    from experiments.context import Result

    module = types.ModuleType(f"fake_{name}")
    module.NAME, module.CONFIG_SECTIONS = name, ("shared", "protocol")
    module.data_label = lambda ctx: f"data-scored-by-{name}"

    def run(ctx):
        with ctx.stages.stage("work"):
            time.sleep(sleep_s)
        return Result(config={"experiment": name}, records=[{"idx": 0}], summary={"experiment": name},
                      headline=f"{name} finished", token_stats={}, prompt_template_sha256="p" * 64,
                      private={"texts.jsonl": ""})        # the private file registry.py declares for it
    module.run = run
    return module


def test_stages_total_is_the_experiments_own_time_and_imports_appear_once(tmp_path, monkeypatch, capsys):
    """Two experiments in one run.py process: the first sleeps 0.5 s. Each stages.json's total_wall_s is that
    experiment's own time (the second's is far below the process time so far), covers its stages, and only the
    first carries the `imports` row. The console header names the data each experiment scores."""
    import run as run_py
    from experiments.context import Data, Inputs
    from experiments.runlog import LibraryChatter

    modules = {"protocol": fake_experiment("protocol", 0.5), "options": fake_experiment("options", 0.01)}
    monkeypatch.setattr(run_py, "import_experiments", lambda names, chatter: (modules, 0.25))
    monkeypatch.setattr(run_py, "verified_inputs", lambda args, modules, routed=None: Inputs(
        cache=tmp_path, model_dir=tmp_path, model_identity={"id": "m", "model_sha256": "m" * 64,
                                                            "tokenizer_sha256": "t" * 64},
        data={"fixture-sentiment": Data(id="fixture-sentiment", schema="sst2",
                                        parquet_path=tmp_path / "p.parquet", content_sha256="d" * 64,
                                        split="validation")}))
    monkeypatch.setattr(run_py, "write_report", lambda out, names: None)
    args = run_py.parse_args(["--cache", str(tmp_path), "--out", str(tmp_path / "o"), "--smoke", "--verbose",
                              "--experiment", "protocol", "--experiment", "options"])
    assert run_py.run_all(args, LibraryChatter(verbose=True)) == 0
    first, second = (json.loads((tmp_path / "o" / n / "stages.json").read_text()) for n in modules)
    assert [s["name"] for s in first["stages"]] == ["imports", "work", "write"]
    assert [s["name"] for s in second["stages"]] == ["work", "write"]
    assert first["stages"][0] == {"name": "imports", "wall_s": 0.25, "peak_rss_bytes_at_end": None}
    for st in (first, second):
        own = [s["wall_s"] for s in st["stages"] if s["name"] != "imports"]
        assert all(w >= 0 for w in own) and st["total_wall_s"] >= 0
        assert sum(own) <= st["total_wall_s"] + 0.01
    assert first["total_wall_s"] >= 0.5
    assert second["total_wall_s"] < 0.5            # not the process's time so far, which includes the first's
    out = capsys.readouterr().out
    assert "[protocol] split=smoke data=data-scored-by-protocol model=m" in out
    assert "[options] split=smoke data=data-scored-by-options model=m" in out
    identity = json.loads((tmp_path / "o" / "protocol" / "identity.json").read_text())
    assert identity["config_sections"] == ["shared", "protocol"]
    assert identity["scoring_config"] == config.effective(("shared", "protocol"), {"model": "smollm2-135m-instruct-q4_1",
                                                                                    "data": "fixture-sentiment"})


def test_each_experiment_names_the_data_it_scores(tmp_path):
    """run.py picks each experiment's data resource from its effective config (DATA_CONFIG_KEY) and hands it over
    verified as ctx.data; the harness reads none; data_label names what ctx.data is."""
    import types

    import run as run_py
    from experiments import extraction, harness, mctaco, options

    modules = {m.NAME: m for m in (protocol, options, extraction, mctaco, harness)}
    args = run_py.parse_args(["--cache", str(tmp_path), "--out", str(tmp_path / "o")])
    assert run_py.route_data(args, modules, named=False) == {}      # no --data: each its configured default
    want = {"protocol": "fixture-sentiment", "options": "fixture-sentiment", "extraction": "fixture-sentiment",
            "mctaco": "fixture-mctaco"}
    assert {n: run_py.data_id_of(m, args) for n, m in modules.items() if n in want} == want
    assert harness.DATA_SCHEMA is None
    for name, data_id in want.items():
        ctx = types.SimpleNamespace(config=config.effective(modules[name].CONFIG_SECTIONS),
                                    data=types.SimpleNamespace(id=data_id), options=types.SimpleNamespace(out=tmp_path))
        assert modules[name].data_label(ctx) == data_id, name


def test_run_verifies_each_data_resource_once_and_the_experiments_never(tmp_path, monkeypatch):
    """run.verified_inputs verifies the model and each data resource the experiments read exactly once (protocol,
    options and extraction share one); an experiment of the wrong schema is refused on one line; no experiment
    module calls a verifier of resources.py again (they read ctx.data)."""
    import ast

    import resources
    import run as run_py
    from conftest import REPO
    from experiments import extraction, harness, mctaco, options

    calls = []

    def rows(cache, data_id, manifest=None):
        calls.append(data_id)
        schema = "mctaco" if "mctaco" in data_id else "sst2"
        return tmp_path / f"{data_id}.parquet", {"schema": schema, "content_sha256": data_id[0] * 64}, None

    monkeypatch.setattr(resources, "prepared_manifest", lambda cache: {})
    monkeypatch.setattr(resources, "verified_model", lambda cache, model, manifest, local: (tmp_path, {"id": model}))
    monkeypatch.setattr(resources, "verified_rows", rows)
    modules = {m.NAME: m for m in (protocol, options, harness, mctaco, extraction)}
    args = run_py.parse_args(["--cache", str(tmp_path), "--out", str(tmp_path / "o")])
    run_py.route_data(args, modules, named=False)
    inputs = run_py.verified_inputs(args, modules)
    assert sorted(calls) == ["fixture-mctaco", "fixture-sentiment"]
    assert {d.id: (d.schema, d.content_sha256) for d in inputs.data.values()} == {
        "fixture-sentiment": ("sst2", "f" * 64), "fixture-mctaco": ("mctaco", "f" * 64)}
    ctx = run_py.context_for(mctaco, args, inputs, run_py.options_of(args), None)
    assert ctx.data.id == "fixture-mctaco" and run_py.context_for(harness, args, inputs, None, None).data is None
    args.data = "my-mctaco-data"            # an SST-2 experiment handed MC-TACO data: one line
    with pytest.raises(resources.ResourceError, match="is mctaco data; experiment protocol reads sst2 data") as e:
        run_py.verified_inputs(args, {"protocol": protocol})
    assert "\n" not in str(e.value)
    verifiers = {"verified_data", "verified_rows", "verified_inputs", "verify_rows", "verify_resource_files"}
    for path in sorted((REPO / "experiments").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "resources":
                assert node.attr not in verifiers, f"{path.name}:{node.lineno}: resources.{node.attr}"


def test_experiments_never_read_argparse_or_exit():
    """The contract: only run.py maps outcomes to exit codes; experiments raise, they do not exit or read args."""
    import ast

    from conftest import REPO

    for path in sorted((REPO / "experiments").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert not (isinstance(node.value, ast.Name) and (node.value.id, node.attr) in
                            {("sys", "exit"), ("resources", "fail"), ("ctx", "args")}), (path.name, node.lineno)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "argparse" not in names and "fail" not in names, (path.name, node.lineno)
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "ctx" \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                raise AssertionError(f"{path.name}:{node.lineno}: ctx['...'] (the context is typed: ctx.config ...)")


@pytest.mark.slow  # two subprocesses importing transformers
def test_library_chatter_goes_to_the_log_file_not_the_console(tmp_path):
    """lm-eval / transformers / datasets log records and Python warnings, before and after O exists, end up in
    O/run.log and not on the console; with verbose they stay on the console."""
    import subprocess
    import sys

    from conftest import REPO

    code = f"""
import logging, sys, warnings
sys.path.insert(0, {str(REPO)!r})
from experiments.runlog import LibraryChatter
chatter = LibraryChatter(verbose=sys.argv[1] == "verbose")
chatter.route()
logging.getLogger("lm_eval.api.task").warning("[Task: sst2] metric acc is defined, but aggregation is not")
import transformers
transformers.utils.logging.get_logger("transformers.modeling_utils").warning("transformers chatter")
chatter.to_file({str(tmp_path / 'run.log')!r})
logging.getLogger("datasets.builder").warning("datasets chatter")
warnings.warn("a library warning", FutureWarning)
print("progress and results")
chatter.close()
"""
    quiet = subprocess.run([sys.executable, "-c", code, "quiet"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "progress and results\n" and quiet.stderr == ""
    log = (tmp_path / "run.log").read_text()
    for text in ("aggregation is not", "transformers chatter", "datasets chatter", "a library warning"):
        assert text in log, text
    (tmp_path / "run.log").unlink()
    loud = subprocess.run([sys.executable, "-c", code, "verbose"], capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr
    for text in ("aggregation is not", "transformers chatter", "datasets chatter", "a library warning"):
        assert text in loud.stderr, text
    assert not (tmp_path / "run.log").exists()


@pytest.mark.slow
def test_smoke_console_names_the_scored_data_and_keeps_library_chatter_in_the_log(smoke_run):
    out, proc = smoke_run
    console = proc.stdout + proc.stderr
    assert "[protocol] split=smoke data=fixture-sentiment " in proc.stdout
    assert "[mctaco] split=smoke data=fixture-mctaco " in proc.stdout
    harness_header = next(l for l in proc.stdout.splitlines() if l.startswith("[harness] split="))
    assert "fixture-sentiment" not in harness_header and "arithmetic" in harness_header   # it names its tasks
    assert "aggregation is not" not in console and "--metadata" not in console
    log = (out / "run.log").read_text()
    assert "aggregation is not" in log and "--metadata" in log
    stages = {n: json.loads((out / n / "stages.json").read_text())
              for n in ("protocol", "options", "harness", "mctaco", "extraction")}
    assert [n for n, st in stages.items() if st["stages"][0]["name"] == "imports"] == ["protocol"]
    for st in stages.values():
        assert sum(s["wall_s"] for s in st["stages"] if s["name"] != "imports") <= st["total_wall_s"] + 0.01


def test_official_py_is_the_only_runner_module_that_imports_lm_eval():
    """What official.py's docstring claims: every lm-eval call of the runner goes through it."""
    import ast

    from conftest import REPO

    importers = []
    for path in [REPO / "run.py", *sorted((REPO / "experiments").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(m == "lm_eval" or m.startswith("lm_eval.") for m in mods):
                importers.append(path.name)
    assert set(importers) == {"official.py"}, importers


def test_a_disagreement_message_names_kernels_threads_dtype_batches_and_what_to_try(monkeypatch):
    from experiments import two_paths

    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    independent = {7: [{"text": " negative", "token_ids": [1], "start": 3, "score": -1.0, "batch": [2, 5, 16, 31]}],
                   9: [{"text": " negative", "token_ids": [1], "start": 3, "score": -1.0, "batch": [0, 1, 16, 40]}]}
    message = two_paths.score_disagreement([7], independent, CONFIG)
    assert "\n" not in message and message.startswith("1 items differ")
    for part in ("MKL_ENABLE_INSTRUCTIONS=AVX2", "thread(s)", "float32", "batch size 16", "batch(es) 2 (16 rows x 31",
                 "Try --threads 1", "MKL_CBWR=COMPATIBLE", "environment.json"):
        assert part in message, part


@pytest.mark.slow
def test_a_disagreement_stops_the_run_with_that_line_and_installs_nothing(tiny_cache, tmp_path, monkeypatch,
                                                                          capsys):
    """A kernel that rounds one tensor differently in the two calls, simulated by moving the independent path's
    scores by one part in 10^7: exit 1, the one-line message first on stderr, the rows in protocol.FAILED.json,
    no evidence installed."""
    import run as run_py
    from experiments import scoring as scoring_module
    from experiments.runlog import LibraryChatter

    real = scoring_module.read_score
    monkeypatch.setattr(scoring_module, "read_score", lambda *a: real(*a) * (1 + 1e-7))
    args = run_py.parse_args(["--cache", str(tiny_cache), "--out", str(tmp_path / "o"), "--smoke", "--no-cache",
                              "--model", "tiny-random-llama", "--experiment", "protocol"])
    assert run_py.run_all(args, LibraryChatter(verbose=False)) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    first = next(line for line in err if "MISMATCH" in line)
    assert "2 items differ" in first and "batch(es) 0 (2 rows x " in first and "Try --threads 1" in first
    failed = json.loads((tmp_path / "o" / "protocol.FAILED.json").read_text())
    assert [m["field"] for m in failed["mismatches"]] == ["scores", "scores"]
    assert not (tmp_path / "o" / "protocol").exists()
