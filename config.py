"""Every default that can change a score, in one place. run.py dumps the effective values into each experiment's
config.json; change them here (or with a CLI flag where one exists), never inside the scoring code."""

import os

CONFIG = {
    # model and numerics: both scoring paths load the model with exactly these settings
    "model": "smollm2-135m-instruct-q4_1",
    "dtype": "float32",
    "attn_implementation": "eager",
    # torch.set_num_threads for both paths; the machines here have 2 vCPU. EVAL_TORCH_THREADS overrides it (e.g. 1
    # on a busy shared machine, where 2 threads can run 30x slower); the effective value is in every config.json.
    "threads": int(os.environ.get("EVAL_TORCH_THREADS", "2")),
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

    # the options experiment (seed study 003): the official prompt with an A/B options list added. The letters
    # stay in place and the option contents move; pi maps displayed position -> semantic label (0 negative,
    # 1 positive). The four list conditions score the same context string per item and order; only the
    # candidate strings (option texts or letters) differ. Zero-shot, no chat template.
    "options_list_prompt": "{sentence}\nQuestion: Is this sentence positive or negative?\nA. {option_A}\n"
                           "B. {option_B}\nAnswer:",
    "options_letters": ["A", "B"],
    "options_orders": {"fwd": [0, 1], "rev": [1, 0]},
    "options_conditions": [        # a list: the evidence's JSON sorts dict keys, the condition order must survive
        {"name": "base_text", "prompt": "official", "space": "text", "order": "fwd"},
        {"name": "list_text_fwd", "prompt": "list", "space": "text", "order": "fwd"},
        {"name": "list_text_rev", "prompt": "list", "space": "text", "order": "rev"},
        {"name": "list_letter_fwd", "prompt": "list", "space": "letter", "order": "fwd"},
        {"name": "list_letter_rev", "prompt": "list", "space": "letter", "order": "rev"},
    ],
    # paired comparisons of semantic predictions (a, b): gains = a wrong -> b right, losses = a right -> b wrong
    "options_comparisons": [
        ["list_letter_fwd", "list_letter_rev"], ["list_text_fwd", "list_text_rev"],
        ["list_text_fwd", "list_letter_fwd"], ["list_text_rev", "list_letter_rev"],
        ["base_text", "list_text_fwd"], ["base_text", "list_text_rev"],
        ["base_text", "list_letter_fwd"], ["base_text", "list_letter_rev"],
    ],
    "options_tie_rule": "first displayed position wins (argmax over candidates in displayed order, as np.argmax)",

    # the mini harness (harness/, experiments/harness.py); run.py --experiment harness reads these
    "harness_tasks_dir": None,     # None: O/harness_tasks, seeded from fixtures/harness_tasks when it has no tasks
    "harness_batch_size": 4,       # prompts per adapter call (SmolLM2 still runs one sequence per forward pass)
    "harness_timeout_s": 60.0,     # per-example wall-clock budget for the adapter; a batch of n gets n times this
    "harness_max_new_tokens": 128, # greedy generation length cap for the SmolLM2 adapter
    "harness_smoke_examples": 1,   # --smoke: the first example of each task
    "harness_include_per_example": True,  # predictions in the (private) leaderboard
    "harness_sandbox": {           # code_exec limits (harness/sandbox.py); mode: auto | namespaces | landlock
        "cpu_s": 2, "wall_s": 5.0, "memory_bytes": 256 * 2**20, "fsize_bytes": 2**20, "nofile": 32,
        "tmpfs_bytes": 4 * 2**20, "result_max_bytes": 2**20, "mode": "auto",
    },
}
