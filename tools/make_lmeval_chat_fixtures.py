"""Make tests/fixtures/lmeval_chat/: real lm-eval 0.4.9.2 output of chat-template runs, for tests/test_lmeval_chat.py.

    .venv/bin/python tools/make_lmeval_chat_fixtures.py          (from the repository root, offline, about 2 minutes)

Writes, replacing what was there:
  model/   a tiny randomly initialised Llama (save_pretrained, safetensors) with a byte-level tokenizer (every byte
           one token, <unk> <s> </s> special) and a chat template written here (CHAT_TEMPLATE), saved by
           transformers' save_pretrained (chat_template.jinja)
  task/    four local tasks on invented questions, their train and validation splits as JSONL: toy_chat and
           toy_prefix (a Jinja description, a gen_prefix, another fewshot_delimiter), both with target_delimiter "";
           toy_space (the default target_delimiter " ", acc and acc_mutual_info) and toy_space_prefix (the same
           with a gen_prefix), whose multiple_choice continuations a chat run builds without the delimiter (lm-eval
           0.4.9.2 lm_eval/api/task.py:1460-1461)
  runs/<name>/   one `lm_eval` CLI run each (through tools/lmeval_offline_run.py: the CLI itself, offline, with the
           --include_path fix), tasks and flags in RUNS

    .venv/bin/python tools/make_lmeval_chat_fixtures.py --runs chat_spaced    (remakes these runs only and keeps
                                                                               the model; task/ is rewritten)
Every path the runs record is relative to the repository root, so the files do not depend on this machine (but for
the results' environment fields: pretty_env_info, dates, timings)."""
import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = Path("tests/fixtures/lmeval_chat")             # relative: what the runs record
SYSTEM = "Answer with one word."

# Written for these fixtures: a system turn as a rules line, every other turn as "### Role: text</s>", the
# generation prompt "### Assistant:"; trim_blocks/lstrip_blocks (transformers' settings) shape the newlines.
CHAT_TEMPLATE = """{{ bos_token }}
{%- for message in messages %}
{%- if message['role'] == 'system' %}
Rules: {{ message['content'] | trim }}
{% else %}
### {{ message['role'] | capitalize }}: {{ message['content'] | trim }}{% if not loop.last or add_generation_prompt %}{{ eos_token }}{% endif %}

{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
### Assistant:{% endif %}"""

VALIDATION = [("kettle", "sing", 0), ("pebble", "swim", 1), ("lantern", "glow", 0), ("teaspoon", "fly", 1),
              ("river", "bend", 0), ("brick", "laugh", 1)]
TRAIN = [("candle", "melt", 0), ("mountain", "whisper", 1), ("door", "creak", 0), ("cloud", "knit", 1),
         ("bell", "ring", 0)]

DATASET = f"""dataset_path: json
dataset_kwargs:
  data_files:
    train: {FIX}/task/train.jsonl
    validation: {FIX}/task/validation.jsonl
training_split: train
validation_split: validation
output_type: multiple_choice
doc_to_target: answer
doc_to_choice: ["yes", "no"]
"""
NO_DELIMITER = 'target_delimiter: ""\n'
ACC = "metric_list:\n  - metric: acc\n"
TASKS = {
    "toy_chat": 'task: toy_chat\ndoc_to_text: "Can a {{thing}} {{verb}}?"\n' + DATASET + NO_DELIMITER + ACC,
    "toy_prefix": ('task: toy_prefix\ndoc_to_text: "Could a {{thing}} {{verb}}, really?"\n'
                   'description: "Questions about things like a {{thing}}."\ngen_prefix: "Reply:"\n'
                   'fewshot_delimiter: "\\n--\\n"\n' + DATASET + NO_DELIMITER + ACC),
    # the default target_delimiter " ": a chat run's multiple_choice continuations drop it
    "toy_space": ('task: toy_space\ndoc_to_text: "Is a {{thing}} able to {{verb}}?"\n' + DATASET + ACC
                  + "  - metric: acc_mutual_info\n"),
    "toy_space_prefix": ('task: toy_space_prefix\ndoc_to_text: "Is a {{thing}} able to {{verb}}?"\n'
                         'gen_prefix: "Reply:"\n' + DATASET + ACC),
}

PAIR, SPACED = ("toy_chat", "toy_prefix"), ("toy_space", "toy_space_prefix")
RUNS = {
    "chat": (PAIR, ["--apply_chat_template"]),
    "chat_system": (PAIR, ["--apply_chat_template", "--system_instruction", SYSTEM]),
    "chat_fewshot": (PAIR, ["--apply_chat_template", "--num_fewshot", "2"]),
    "chat_multiturn": (PAIR, ["--apply_chat_template", "--num_fewshot", "2", "--fewshot_as_multiturn"]),
    "chat_spaced": (SPACED, ["--apply_chat_template"]),
}


def make_model(out):
    """The byte-level tokenizer with CHAT_TEMPLATE and a 1-layer Llama of hidden size 16 (seed 0)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(out)


def make_task(out):
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("validation", VALIDATION), ("train", TRAIN)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps({"thing": t, "verb": v, "answer": a}) + "\n"
                                                   for t, v, a in rows), encoding="utf-8")
    for name, text in TASKS.items():
        (out / f"{name}.yaml").write_text(text, encoding="utf-8")


def run(name, tasks, flags):
    cmd = [sys.executable, "tools/lmeval_offline_run.py", "--model", "hf", "--model_args",
           f"pretrained={FIX}/model,dtype=float32", "--include_path", f"{FIX}/task", "--tasks", ",".join(tasks),
           "--device", "cpu", "--batch_size", "1", "--log_samples", "--output_path", f"{FIX}/runs/{name}", *flags]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", choices=sorted(RUNS), help="remake only these runs (the model is kept)")
    only = ap.parse_args(argv).runs
    fix = ROOT / FIX
    shutil.rmtree(fix / "task", ignore_errors=True)
    if only is None:
        for sub in ("model", "runs"):
            shutil.rmtree(fix / sub, ignore_errors=True)
        make_model(fix / "model")
    make_task(fix / "task")
    for name, (tasks, flags) in RUNS.items():
        if only is None or name in only:
            shutil.rmtree(fix / "runs" / name, ignore_errors=True)
            run(name, tasks, flags)
    size = sum(p.stat().st_size for p in fix.rglob("*") if p.is_file())
    print(f"{fix}: {size} bytes")


if __name__ == "__main__":
    main()
