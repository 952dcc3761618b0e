"""Every default that can change a score, in one place. run.py dumps the effective values into each experiment's
config.json; change them here (or with a CLI flag where one exists), never inside the scoring code."""

CONFIG = {
    # model and numerics: both scoring paths load the model with exactly these settings
    "model": "smollm2-135m-instruct-q4_1",
    "dtype": "float32",
    "attn_implementation": "eager",
    "threads": 2,                  # torch.set_num_threads; the machines here have 2 vCPU
    "device": "cpu",
    "batch_size": 1,               # parity mode: one sequence per forward pass, no padding anywhere
    "max_input_tokens": 512,       # longer inputs are an error, never truncated
    "seed": 1234,                  # passed to lm-eval's seeds; loglikelihood scoring itself draws no randomness

    # data and item selection (DESIGN.md, "Item selection")
    "data": "fixture-sentiment",
    "selection_salt": "llm-eval-evidence/sst2-selection/v1",
    "selection_rule": "rank validation rows by sha256(f'{salt}:{idx}') ascending; first 64 = dev, next 128 = confirm",
    "n_dev": 64,
    "n_confirm": 128,
    "n_smoke": 2,                  # --smoke takes the first 2 development items

    # the official SST-2 protocol (lm-eval 0.4.9.2 glue/sst2/default.yaml; these are checked against the dumped
    # task config at run time, not used to build the official requests)
    "sst2_prompt": "{sentence}\nQuestion: Is this sentence positive or negative?\nAnswer:",
    "sst2_choices": ["negative", "positive"],
    "target_delimiter": " ",
    "num_fewshot": 0,
    "tie_rule": "first index wins (argmax over candidates in listed order)",
}
