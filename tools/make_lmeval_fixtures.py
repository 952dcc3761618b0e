"""Make real lm-eval output, one directory per lm-eval release, for tests/fixtures/lmeval_versions/.

For each version this script makes (or reuses) a virtual environment of its own under --venvs (torch==2.13.0, the
CPU build; `lm-eval==<version>` with a transformers pin that release accepts), then runs, inside that environment,
the child part of this same file (`--child`): it builds a tiny randomly initialised Llama (fixed seed, safetensors)
with a word-level tokenizer made offline from a fixed word list, writes three local tasks (a multiple_choice task,
the same with acc_mutual_info, and a generate_until task, over a six-document JSONL file written here), and runs that
version's own `lm_eval` command line with --log_samples. What lm-eval wrote under its --output_path is copied,
unchanged, to tests/fixtures/lmeval_versions/<version>/run/, the model and the data file beside it (tiny-llama/,
data/). A release that has `--samples` (0.4.9 on) runs a second time on the multiple_choice task with an unsorted
selection, SELECTION, into <version>/samples/. tests/fixtures/lmeval_versions/README.md records the command, the
date and the versions of the packages that matter.

With --batched it makes only <version>/batched/: the two multiple_choice tasks scored together at --batch_size
BATCH with eager attention (so that lm-eval pads its batches, in the attention the audit's passes use), for the
forward level's equality in lm-eval's batches (tests/test_lmeval_batches.py). The model it builds must be
byte-identical to the committed <version>/tiny-llama/, which those runs are audited against; README.md gets a
section on these runs.

With --bos it makes only <version>/bos/: the same model with a tokenizer that ADDS a BOS token by default (a
post-processor prepending <s>, as Llama, Mistral and Gemma tokenizers do), the two multiple_choice tasks at --batch_size
BATCH with eager attention, into <version>/bos/default/, and for a release that adds special tokens only with
add_bos_token (versions.py tok_encode "add_bos_token": 0.4.5 to 0.4.9.1) the same with add_bos_token=True in
model_args, into <version>/bos/add_bos_token/; the model (tokenizer included) into <version>/bos/tiny-llama/ (its
weights must be byte-identical to <version>/tiny-llama/'s), and <version>/bos/token_ids.json: the token ids the
release's own HFLM gives every request of each run (its loglikelihood() with _loglikelihood_tokens replaced by a
recorder), for tests/test_lmeval_bos.py. README.md gets a section on these runs.

    python tools/make_lmeval_fixtures.py                      # every version in VERSIONS
    python tools/make_lmeval_fixtures.py --versions 0.4.9.2 0.4.13 --venvs /tmp/lmeval-venvs
    python tools/make_lmeval_fixtures.py --batched --versions 0.4.10 0.4.11 0.4.12
    python tools/make_lmeval_fixtures.py --bos --versions 0.4.9.1 0.4.9.2

The tasks, the data, the tokenizer and the model are the same for every version, so the fixtures differ only in
what each release writes. Nothing needs the network but the package installs (the runs set the Hugging Face
offline variables). The outputs hold what lm-eval records about the environment it ran in (pretty_env_info,
versions, timings): they are left as written.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "lmeval_versions"
TORCH = "torch==2.13.0"          # the CPU wheel; a bare `torch` would resolve to a multi-GB CUDA build

# version -> the extra requirements installed with it: a transformers (and datasets) release it accepts.
# Releases from 0.4.10 on install torch and transformers only through the "hf" extra.
VERSIONS = {
    "0.4.5": ("lm-eval==0.4.5", "transformers==4.45.2", "datasets<4"),
    "0.4.7": ("lm-eval==0.4.7", "transformers==4.47.1", "datasets<4"),
    "0.4.8": ("lm-eval==0.4.8", "transformers==4.49.0", "datasets<4"),
    "0.4.9": ("lm-eval==0.4.9", "transformers==4.52.4", "datasets<4"),
    "0.4.9.1": ("lm-eval==0.4.9.1", "transformers==4.55.4", "datasets<4"),
    "0.4.9.2": ("lm-eval==0.4.9.2", "transformers==4.57.6"),
    "0.4.10": ("lm-eval[hf]==0.4.10", "transformers==4.57.6"),
    "0.4.11": ("lm-eval[hf]==0.4.11", "transformers==4.57.6"),
    "0.4.12": ("lm-eval[hf]==0.4.12", "transformers==4.57.6"),
    "0.4.13": ("lm-eval[hf]==0.4.13", "transformers>=5,<6"),
}
FREEZE_NAMES = ("lm-eval", "lm_eval", "transformers", "torch", "datasets", "tokenizers", "accelerate", "numpy")

MODEL = "tiny-llama"             # relative to the run directory: the recorded model_args name no host path
WORDS = ["<pad>", "<s>", "</s>", "<unk>", "Q:", "A:", "Question:", "Answer:", "what", "colour", "is", "the", "sky",
         "grass", "snow", "coal", "a", "sun", "night", "blue", "green", "white", "black", "yellow", "dark", "red",
         "of", "at", "?", "pale", "very", "deep"]
DOCS = [
    {"question": "what colour is the sky ?", "choices": ["blue", "very deep green", "red"], "label": 0,
     "answer": "blue"},
    {"question": "what colour is grass ?", "choices": ["pale white", "green", "black"], "label": 1, "answer": "green"},
    {"question": "what colour is snow ?", "choices": ["white", "dark red", "very pale yellow"], "label": 0,
     "answer": "white"},
    {"question": "what colour is coal ?", "choices": ["blue", "yellow", "black"], "label": 2, "answer": "black"},
    {"question": "what colour is the sun ?", "choices": ["deep blue", "yellow", "green"], "label": 1,
     "answer": "yellow"},
    {"question": "what colour is the sky at night ?", "choices": ["white", "pale green", "dark"], "label": 2,
     "answer": "dark"},
]
CHOICE_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/docs.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: {second}
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
MC_TASK = CHOICE_TASK.format(name="versions_mc", second="acc_norm")
# the same documents scored with acc_mutual_info: each document also gets one unconditional request per choice,
# which releases to 0.4.8 read back "strided" and later ones "appended" (evidence_audit/lmeval/versions.py)
MI_TASK = CHOICE_TASK.format(name="versions_mi", second="acc_mutual_info")
GEN_TASK = """task: versions_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/docs.jsonl
test_split: test
output_type: generate_until
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{answer}}"
generation_kwargs:
  until:
    - "\\n"
  max_gen_toks: 3
  do_sample: false
filter_list:
  - name: first
    filter:
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
metadata:
  version: 1.0
"""
TASKS = "versions_mc,versions_gen,versions_mi"
# 0.4.9.2's task listing (get_task_dict's pretty_print_task, lm_eval/tasks/__init__.py:679-686) takes every task's
# YAML path relative to lm_eval/tasks/ and raises for a YAML outside it, so its CLI cannot run an --include_path task
# kept elsewhere: there the task YAMLs are written into <lm_eval>/tasks/versions_fixture/ of its own environment.
TASKS_INSIDE_PACKAGE = {"0.4.9.2"}
# unsorted on purpose: how each release labels such a selection (documents 0, 1, 3, 5 are scored in that order and
# logged as 5, 1, 3, 0: two mislabelled, two not)
SELECTION = {"versions_mc": [5, 1, 3, 0]}
SAMPLES_FROM = (0, 4, 9)                   # the first release with --samples (lm_eval/__main__.py of 0.4.9)
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


BATCH = 4                                  # the batched runs' --batch_size: 6 documents' requests pad in it
# kind of run -> (tasks, extra model_args, batch size, extra arguments); each writes into --output_path <kind>
RUNS = {
    "run": (TASKS, "", 1, []),
    "samples": ("versions_mc", "", 1, ["--samples", json.dumps(SELECTION, separators=(",", ":"))]),
    "batched": ("versions_mc,versions_mi", ",attn_implementation=eager", BATCH, []),
    "default": ("versions_mc,versions_mi", ",attn_implementation=eager", BATCH, []),                  # --bos
    "add_bos_token": ("versions_mc,versions_mi", ",attn_implementation=eager,add_bos_token=True", BATCH, []),
}
# --bos: the runs of a release, by its tokenising rule (evidence_audit/lmeval/versions.py tok_encode)
BOS_RUNS = {"add_bos_token": ["default", "add_bos_token"], "tokenizer-default": ["default"]}


def lm_eval_argv(venv, kind="run", tasks_dir="tasks"):
    """The lm_eval command line of one kind of run (RUNS; 0.4.10 on reads it as `lm_eval run ...`); `tasks_dir`:
    the directory of the task YAMLs."""
    tasks, args, batch, extra = RUNS[kind]
    return [str(Path(venv) / "bin" / "lm_eval"), "--model", "hf",
            "--model_args", f"pretrained={MODEL},dtype=float32{args}",
            "--tasks", tasks, "--include_path", str(tasks_dir), "--device", "cpu", "--batch_size", str(batch),
            "--log_samples", *extra, "--output_path", kind]


def has_samples_option(version):
    return tuple(int(x) for x in version.split(".")[:3]) >= SAMPLES_FROM


# ---- child: runs inside one version's environment ----

def build_model(out, words=WORDS, bos=False):
    """A word-level tokenizer over `words` and a tiny random Llama (seed 0, float32), saved into `out` (safetensors;
    tools/make_lmeval_group_fixtures.py builds its model with its own words here too). With `bos`, the tokenizer's
    post-processor prepends <s> when special tokens are added (the weights are the same)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", words.index("<s>"))])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    if int(transformers.__version__.split(".")[0]) < 5:     # 5 writes safetensors only and dropped the flag
        model.save_pretrained(out, safe_serialization=True)
    else:
        model.save_pretrained(out)


def bos_rule(version):
    """The release's tokenising rule (versions.py tok_encode), read from the checkout's versions.py."""
    sys.path.insert(0, str(REPO))
    from evidence_audit.lmeval.versions import KNOWN_VERSIONS
    return KNOWN_VERSIONS[version]["tok_encode"]


def recorded_token_ids(work, kind):
    """{task: [[doc_id, request index, context ids, continuation ids]]} as the installed release's HFLM tokenises
    the requests logged by run `kind` (its loglikelihood(), _loglikelihood_tokens replaced by a recorder)."""
    from types import SimpleNamespace

    from lm_eval.models.huggingface import HFLM
    _, args, _, _ = RUNS[kind]
    cwd = os.getcwd()
    os.chdir(work)
    try:
        lm = HFLM.create_from_arg_string(f"pretrained={MODEL},dtype=float32{args}",
                                                    {"batch_size": 1, "device": "cpu"})
    finally:
        os.chdir(cwd)
    out = {}
    for path in sorted((work / kind).glob(f"{MODEL}/samples_*.jsonl")):
        task = path.name[len("samples_"):].rsplit("_", 1)[0]
        keys, requests = [], []
        for line in path.read_text().splitlines():
            s = json.loads(line)
            for i, a in enumerate(s["arguments"].values()):
                keys.append((s["doc_id"], i))
                requests.append(SimpleNamespace(args=(a["arg_0"], a["arg_1"])))
        seen = []
        lm._loglikelihood_tokens = lambda reqs, disable_tqdm=False, **kw: (seen.extend(reqs)
                                                                           or [(0.0, False)] * len(reqs))
        lm.loglikelihood(requests)
        out[task] = [[d, i, list(r[1]), list(r[2])] for (d, i), r in zip(keys, seen)]
    return out


def child(version, venv, dest, batched=False, bos=False):
    """Build the model and tasks in a fresh directory, run lm_eval there, copy its --output_path(s), the model and
    the data into `dest` (<version>/); with `batched`, only the "batched" run, into <dest>/batched/, after checking
    that the model built is the committed <dest>/tiny-llama/; with `bos`, the BOS runs (module docstring) into
    <dest>/bos/."""
    import lm_eval
    from importlib.metadata import version as installed

    if installed("lm_eval") != version:
        raise SystemExit(f"{sys.executable}: lm_eval {installed('lm_eval')} installed, expected {version}")
    with tempfile.TemporaryDirectory(prefix=f"lmeval-{version}-") as work:
        work = Path(work)
        build_model(work / MODEL, bos=bos)
        (work / "data").mkdir()
        (work / "data" / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
        tasks_dir = work / "tasks"
        if version in TASKS_INSIDE_PACKAGE:
            tasks_dir = Path(lm_eval.__file__).parent / "tasks" / "versions_fixture"
            if tasks_dir.exists():
                shutil.rmtree(tasks_dir)
        tasks_dir.mkdir()
        (tasks_dir / "versions_mc.yaml").write_text(MC_TASK)
        (tasks_dir / "versions_gen.yaml").write_text(GEN_TASK)
        (tasks_dir / "versions_mi.yaml").write_text(MI_TASK)
        env = dict(os.environ, HF_HOME=str(work / "hf"), **OFFLINE)
        dest = Path(dest)
        runs = ["batched"] if batched else BOS_RUNS[bos_rule(version)] if bos else \
            ["run", "samples"] if has_samples_option(version) else ["run"]
        if batched or bos:
            weights = dest / MODEL / "model.safetensors"
            if not weights.is_file() or weights.read_bytes() != (work / MODEL / "model.safetensors").read_bytes():
                raise SystemExit(f"{version}: the model built is not the committed {weights}: make <version>/ first")
        for kind in runs:
            proc = subprocess.run(lm_eval_argv(venv, kind, tasks_dir), cwd=work, env=env, capture_output=True,
                                  text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
                raise SystemExit(f"lm_eval {version} exited {proc.returncode}")
        if bos:
            ids = {kind: recorded_token_ids(work, kind) for kind in runs}
            if (dest / "bos").exists():
                shutil.rmtree(dest / "bos")
            for name in runs + [MODEL]:
                shutil.copytree(work / name, dest / "bos" / name)
            (dest / "bos" / "token_ids.json").write_text(json.dumps(ids, separators=(",", ":")) + "\n")
            print(f"{version}: {lm_eval.__file__} -> {dest / 'bos'}")
            return
        # with the runs, the model and the data they read, so that the audit's identity level (--data, --model)
        # can run on the fixtures: a model of this release's transformers (its random init may differ between
        # releases). A batched run reads the committed ones. What an earlier call made of the other kind stays.
        for name in runs + ([] if batched else ["samples", MODEL, "data"]):
            if (dest / name).exists():
                shutil.rmtree(dest / name)
        dest.mkdir(parents=True, exist_ok=True)
        for name in runs + ([] if batched else [MODEL, "data"]):
            shutil.copytree(work / name, dest / name)
    print(f"{version}: {lm_eval.__file__} -> {dest}")


# ---- parent: environments, runs, README ----

def pip_freeze(venv):
    out = subprocess.run([str(Path(venv) / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True,
                         text=True, check=True).stdout
    return [ln for ln in out.splitlines()
            if ln.split("==")[0].split(" @ ")[0].lower().replace("_", "-") in {n.replace("_", "-") for n in FREEZE_NAMES}]


def site_packages(venv):
    found = sorted(Path(venv).glob("lib/python*/site-packages"))
    if len(found) != 1:
        raise SystemExit(f"{venv}: expected one lib/python*/site-packages, found {len(found)}")
    return found[0]


def ensure_venv(version, venv, seed=None):
    """Make `venv` with torch==2.13.0 and VERSIONS[version] unless it already holds that lm-eval. With `seed` (an
    environment of the same Python made by this script), its installed packages are hard-linked in first, so pip
    replaces only what this version needs otherwise (lm-eval, transformers, datasets, ...) instead of unpacking
    torch again; the result is checked the same way (pip resolves every requirement against what is there)."""
    py = Path(venv) / "bin" / "python"
    if py.exists():
        drop_stale_metadata(venv)
        probe = subprocess.run([str(py), "-c", "from importlib.metadata import version; print(version('lm_eval'))"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == version and \
                subprocess.run([str(py), "-m", "pip", "check"], capture_output=True).returncode == 0:
            return
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    if seed:
        src, dst = site_packages(seed), site_packages(venv)
        for item in sorted(src.iterdir()):
            if not (dst / item.name).exists():
                if item.is_dir():
                    shutil.copytree(item, dst / item.name, copy_function=os.link, symlinks=True)
                else:
                    os.link(item, dst / item.name)
    subprocess.run([str(py), "-m", "pip", "install", "-q", TORCH, *VERSIONS[version]], check=True)
    drop_stale_metadata(venv)
    subprocess.run([str(py), "-m", "pip", "check"], check=True)


def drop_stale_metadata(venv):
    """Remove *.dist-info directories without METADATA: what pip leaves of a seeded package it replaced (the
    hard-linked INSTALLER/REQUESTED files are not in the new RECORD), and importlib.metadata may then answer None
    for that package's version."""
    for d in site_packages(venv).glob("*.dist-info"):
        if d.is_dir() and not (d / "METADATA").exists():
            shutil.rmtree(d)


def write_readme(argv, done):
    lines = ["# Real lm-eval output, one directory per release", "",
             "Each directory holds what one lm-eval release wrote under its `--output_path` (unchanged: the model-named",
             "subdirectory, `results_<date>.json`, one `samples_<task>_<date>.jsonl` per task) for the same tiny random",
             "Llama (word-level tokenizer, 32 words, seed 0), the same three local tasks (`versions_mc`: multiple_choice,",
             "acc and acc_norm; `versions_gen`: generate_until, a `take_first` filter named `first`, exact_match;",
             "`versions_mi`: multiple_choice, acc and acc_mutual_info, whose unconditional requests the releases read",
             "back differently) and",
             "the same six documents, in `<version>/run/`; releases with `--samples` (0.4.9 on) also ran the",
             f"multiple_choice task on the unsorted selection {json.dumps(SELECTION)}, in `<version>/samples/`.",
             "Beside them, `<version>/tiny-llama/` (the model as that release's transformers saved it; the weights",
             "came out byte-identical in every release, which the tests check) and `<version>/data/docs.jsonl` (the",
             "documents) are what the runs read: `audit.py --lm-eval` can re-render and re-tokenise against them.",
             "`evidence_audit/lmeval/versions.py` says what differs between them and where each release's source does",
             "it; `tests/test_lmeval_versions.py` checks those claims against these files.",
             "", "Made by (each release's directory by a call that named it, or by one without --versions: all; the",
             "freeze lines of releases made by an earlier call are kept):", "",
             "```", "python tools/make_lmeval_fixtures.py [--versions VERSION ...]", "```", "",
             f"the last call `{' '.join(argv)}` on {datetime.date.today().isoformat()}; each release ran, in its own",
             "environment and a fresh directory",
             "holding the model (`tiny-llama/`), the tasks (`tasks/`) and the data (`data/docs.jsonl`):",
             "", "```", shown_argv("run"), shown_argv("samples"), "```", "",
             "(for " + ", ".join(sorted(TASKS_INSIDE_PACKAGE)) + " the task YAMLs were written into, and --include_path "
             "named, `<lm_eval>/tasks/versions_fixture/` of its environment: its CLI cannot list a task YAML kept "
             "outside lm_eval/tasks/)", "",
             "The packages that matter, per release (`pip freeze`):", ""]
    for version, freeze in done.items():
        lines.append(f"- {version}: " + ", ".join(f"`{f}`" for f in freeze))
    readme = FIXTURES / "README.md"
    previous = readme.read_text() if readme.exists() else ""
    kept = previous[previous.index("\n## ") + 1:] if "\n## " in previous else ""     # the later sections
    readme.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))


def shown_argv(kind):
    """The lm_eval command line of a kind of run as README.md shows it (the environment's lm_eval, the tasks under
    the run's directory, a --samples JSON quoted for a shell)."""
    argv = ["lm_eval"] + lm_eval_argv("VENV", kind, "$PWD/tasks")[1:]
    return " ".join(f"'{a}'" if a.startswith("{") else a for a in argv)


BATCHED_SECTION = "## Batched runs: `<version>/batched/`"
BOS_SECTION = "## A tokenizer that adds a BOS token: `<version>/bos/`"


def write_section(title, subdir, lines, done):
    """Write (or replace) README.md's section `title` (the sections after the first one, in the order written):
    `lines` its text, then `done` {version: pip freeze lines} of the releases made by this call, beside those an
    earlier call made (kept from the section when <version>/<subdir>/ exists)."""
    readme = FIXTURES / "README.md"
    head, *sections = readme.read_text().split("\n## ")
    sections = ["## " + x for x in sections]
    old = next((x for x in sections if x.startswith(title)), "")
    for ln in old.splitlines():
        v = ln[2:].split(": ", 1)[0] if ln.startswith("- ") else None
        if v in VERSIONS and v not in done and (FIXTURES / v / subdir).is_dir():
            done[v] = [x.strip("`") for x in ln.split(": ", 1)[1].split(", ")]
    new = "\n".join(lines + [f"- {v}: " + ", ".join(f"`{f}`" for f in done[v]) for v in VERSIONS if v in done])
    sections = [new if x is old else x.rstrip("\n") for x in sections] + ([] if old else [new])
    readme.write_text("\n\n".join([head.rstrip("\n")] + sections) + "\n")


def write_bos_section(argv, done):
    lines = [BOS_SECTION, "",
             "For the releases listed below, `<version>/bos/` holds runs of `versions_mc` and `versions_mi` at",
             f"`--batch_size {BATCH}` with eager attention on the same weights as `<version>/tiny-llama/`, but with a",
             "tokenizer whose post-processor prepends `<s>` when special tokens are added (as Llama, Mistral and",
             "Gemma tokenizers do): `<version>/bos/tiny-llama/`. `default/` ran with the release's defaults;",
             "`add_bos_token/` (releases that add special tokens only with that model_arg: versions.py tok_encode",
             "\"add_bos_token\") with `add_bos_token=True` in model_args. `token_ids.json` holds, per run and task,",
             "`[doc_id, request index, context ids, continuation ids]` as the release's own HFLM tokenised each",
             "logged request (its `loglikelihood()` with `_loglikelihood_tokens` replaced by a recorder, same",
             "model_args). `tests/test_lmeval_bos.py` audits them. Made by", "",
             "```", "python tools/make_lmeval_fixtures.py --bos --versions VERSION ...", "```", "",
             f"the last call `{' '.join(argv)}` on {datetime.date.today().isoformat()}; each release ran, in its own",
             "environment and a fresh directory as above:", "", "```", shown_argv("default"),
             shown_argv("add_bos_token"), "```", "",
             "The packages that matter, per release (`pip freeze`):", ""]
    write_section(BOS_SECTION, "bos", lines, done)


def write_batched_section(argv, done):
    """Write (or replace) README.md's section on the batched runs: `done` {version: pip freeze lines} of the
    releases made by this call, beside those an earlier call made (kept from the section)."""
    lines = [BATCHED_SECTION, "",
             "For the releases listed below, `<version>/batched/` holds what lm-eval wrote for `versions_mc` and",
             f"`versions_mi` scored together at `--batch_size {BATCH}` with eager attention: their requests are padded",
             "in lm-eval's batches, which the forward level reproduces when the release batches as 0.4.9.2 does and",
             "ran the audit's transformers (`evidence_audit/lmeval/versions.py`: loglikelihood_batches;",
             "`tests/test_lmeval_batches.py`), and which it leaves to the tolerance otherwise (a release that ran",
             "another transformers is here for that). The runs read the release's committed `tiny-llama/` (the",
             "script checks that the model it builds is byte-identical to it) and `data/docs.jsonl`. Made by",
             "", "```", "python tools/make_lmeval_fixtures.py --batched --versions VERSION ...", "```", "",
             f"the last call `{' '.join(argv)}` on {datetime.date.today().isoformat()}; each release ran, in its own",
             "environment and a fresh directory as above:", "", "```", shown_argv("batched"), "```", "",
             "The packages that matter, per release (`pip freeze`):", ""]
    write_section(BATCHED_SECTION, "batched", lines, done)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="+", default=list(VERSIONS), choices=list(VERSIONS))
    ap.add_argument("--venvs", default="/tmp/lmeval-venvs", help="one environment per version under it")
    ap.add_argument("--seed-from", metavar="VENV", help="hard-link the packages of this environment (made by this "
                    "script, same Python) into each new one before installing: far less to unpack")
    ap.add_argument("--readme-only", action="store_true", help="rewrite README.md for the fixtures already made "
                    "(from their environments under --venvs), running nothing")
    ap.add_argument("--batched", action="store_true", help=f"make only <version>/batched/ (the multiple_choice "
                    f"tasks at --batch_size {BATCH}, eager attention) of releases whose fixtures exist, and "
                    "README.md's section on them")
    ap.add_argument("--bos", action="store_true", help="make only <version>/bos/ (a tokenizer that adds a BOS "
                    "token; module docstring) of releases whose fixtures exist, and README.md's section on them")
    ap.add_argument("--child", nargs=3, metavar=("VERSION", "VENV", "DEST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child, batched=args.batched, bos=args.bos)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    done, failed = {}, []
    if args.readme_only:                 # the versions whose fixtures exist, with their environments' freeze lines
        args.versions = []
        done = {v: pip_freeze(Path(args.venvs) / v) for v in VERSIONS if (FIXTURES / v).is_dir()}
    for version in args.versions:
        venv = Path(args.venvs) / version
        try:
            ensure_venv(version, venv, args.seed_from)
            subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).resolve()), "--child", version,
                            str(venv), str(FIXTURES / version)] + (["--batched"] if args.batched else [])
                           + (["--bos"] if args.bos else []), check=True)
            done[version] = pip_freeze(venv)
        except subprocess.CalledProcessError as e:
            failed.append(version)
            print(f"{version}: failed ({e})", file=sys.stderr)
    argv = ["python", "tools/make_lmeval_fixtures.py"] + [a for i, a in enumerate(sys.argv[1:]) if not (
        a in ("--venvs", "--seed-from") or i and sys.argv[i] in ("--venvs", "--seed-from"))]   # no host paths
    if args.batched or args.bos:
        (write_bos_section if args.bos else write_batched_section)(argv, done)
        if failed:
            raise SystemExit(f"failed: {', '.join(failed)}")
        return
    readme = FIXTURES / "README.md"
    previous = (readme.read_text() if readme.exists() else "").partition("\n## ")[0]
    for version in VERSIONS:             # keep the freeze lines of versions made by an earlier call
        if version not in done and (FIXTURES / version).is_dir():
            for ln in previous.splitlines():
                if ln.startswith(f"- {version}: "):
                    done[version] = [x.strip("`") for x in ln.split(": ", 1)[1].split(", ")]
    write_readme(argv, {v: done[v] for v in VERSIONS if v in done})
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
