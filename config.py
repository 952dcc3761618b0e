"""Every default that can change a score, in one place, in sections.

    CONFIG["shared"]      the model, numerics, item selection and speed settings every experiment reads
    CONFIG["protocol"]    the official SST-2 prompt and choices (also read by options and mctaco)
    CONFIG["options"], CONFIG["mctaco"], CONFIG["extraction"], CONFIG["harness"]   one section per experiment

Each experiment declares in registry.py the sections its scores depend on (e.g. options reads
("shared", "protocol", "options"); its module's CONFIG_SECTIONS is that declaration), and every section here is read
by some experiment (tests/test_registry.py). `effective(sections, overrides)` merges them into one flat dict: that
is what the experiment reads (ctx.config["sst2_prompt"]), what its config.json "config" block and identity.json
"scoring_config" hold, and what keys its cached scores. A setting of another experiment's section is not part of
that identity, so changing a harness setting does not invalidate cached protocol scores. Key names are unique
across sections. Change values here (or with a run.py flag where one exists), never inside the scoring code.
"""

import os

CONFIG = {
    "shared": {
        # model and numerics: every scoring path loads the model with exactly these settings
        "model": "smollm2-135m-instruct-q4_1",
        "dtype": "float32",            # run.py --dtype (float32, bfloat16, float16): on cpu every dtype is bit-exact
        "attn_implementation": "eager",
        # torch.set_num_threads for every path; the machines here have 2 vCPU. EVAL_TORCH_THREADS overrides it
        # (e.g. 1 on a busy shared machine, where 2 threads can run 30x slower), run.py --threads overrides both;
        # the effective value is in every config.json and identity.json.
        "threads": int(os.environ.get("EVAL_TORCH_THREADS", "2")),
        "device": "cpu",               # run.py --device (cuda / cuda:N where a GPU is present); both paths alike
        # The agreement claim between the official and the independent path (summary.json "agreement_claim"): on
        # cpu it is exact in every dtype (max abs diff 0, every argmax equal), by construction: the independent path
        # forms the batches lm-eval forms (official_batch_size) and runs the same operations on them, so the same
        # tensors meet the same kernels whatever the CPU, thread count or dtype. On cuda (not tested here: no GPU)
        # the run states the measured max abs diff and passes only if it is at most this tolerance (nats per
        # candidate score; bfloat16 keeps 8 bits of mantissa: a summed log-probability near -10 moves in steps of
        # 0.0625).
        "agreement_tolerance": {"float32": 1e-4, "bfloat16": 0.25, "float16": 0.05},
        "batch_size": 1,               # extraction's generate_until (both paths): one sequence per generation
        # lm-eval HFLM's batch size for loglikelihood requests (the official path of protocol, options, mctaco),
        # and so the independent path's too: it forms the same batches (experiments/scoring.py lm_eval_batches).
        # 16 is lm-eval's fastest here within 2 GB (32 peaked at 2.2 GB RSS); 1 runs one unpadded sequence per
        # forward pass on both paths. Either way every score is compared exactly and any difference stops the run.
        "official_batch_size": 16,
        "max_input_tokens": 512,       # longer inputs are an error, never truncated
        "seed": 1234,                  # passed to lm-eval's seeds; loglikelihood scoring itself draws no randomness

        # fast mode of the independent scorer (run.py --fast, experiments/fast_scoring.py): its own batches, output
        # layer only at scored positions. Parity mode (lm-eval's batches) stays the default and the bit-exact claim;
        # fast mode runs other shapes by design, so it must keep every argmax and stay within fast_tolerance of
        # parity mode, or the run stops (exit 1).
        "fast_batch_size": 16,         # sequences per forward pass (contexts sorted by length)
        "fast_max_batch_tokens": 2048, # and at most this many padded tokens per forward pass
        "fast_tolerance": 1e-4,        # max |fast - parity| per candidate score
        "fast_workers": None,          # batches run on this many threads x 1 torch thread each; None: `threads`
        # the identity-keyed result cache (experiments/result_cache.py): parity-mode scores only, one entry per
        # forward batch, keyed also on what chooses the CPU kernels; never the official path; run.py --no-cache
        # bypasses it
        "result_cache_file": "results.sqlite",  # inside --cache

        # data and item selection: decided by a hash rule before any output is seen, so anyone can recompute it
        "data": "fixture-sentiment",
        "selection_salt": "llm-eval-evidence/sst2-selection/v1",
        "selection_rule": "rank validation rows by sha256(f'{salt}:{idx}') ascending; first 64 = dev, next 128 = "
                          "confirm",
        "n_dev": 64,
        "n_confirm": 128,
        "n_smoke": 2,                  # --smoke takes the first 2 development items
    },

    "protocol": {
        # the official SST-2 protocol (lm-eval 0.4.9.2 glue/sst2/default.yaml; these are checked against the dumped
        # task config at run time, not used to build the official requests)
        "sst2_prompt": "{sentence}\nQuestion: Is this sentence positive or negative?\nAnswer:",
        "sst2_choices": ["negative", "positive"],
        "target_delimiter": " ",
        "num_fewshot": 0,
        "tie_rule": "first index wins (argmax over candidates in listed order)",
    },

    "options": {
        # the options experiment: the official prompt with an A/B options list added. The
        # letters stay in place and the option contents move; pi maps displayed position -> semantic label
        # (0 negative, 1 positive). The four list conditions score the same context string per item and order;
        # only the candidate strings (option texts or letters) differ. Zero-shot, no chat template.
        "options_list_prompt": "{sentence}\nQuestion: Is this sentence positive or negative?\nA. {option_A}\n"
                               "B. {option_B}\nAnswer:",
        "options_letters": ["A", "B"],
        "options_orders": {"fwd": [0, 1], "rev": [1, 0]},
        "options_conditions": [        # a list: the evidence's JSON sorts dict keys, the order must survive
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
        "options_tie_rule": "first displayed position wins (argmax over candidates in displayed order, as "
                            "np.argmax)",
    },

    "mctaco": {
        # the MC-TACO experiment: lm-eval 0.4.9.2 mc_taco/default.yaml on MC-TACO-shaped data.
        # The prompt and choices are checked against the dumped official task config at run time. Documents are
        # rows (question-candidate pairs) in dataset order; a question is sha256(f"{sentence}\t{question}").
        "mctaco_data": "fixture-mctaco",   # data resource id (its own, not --data: run.py's --data is SST-2-shaped)
        "mctaco_prompt": "{sentence}\nQuestion: {question}\nAnswer: {answer}\nPlausible:",
        "mctaco_choices": ["no", "yes"],
        "mctaco_smoke_questions": 2,       # --smoke: every document of the first 2 questions (never a cut group)
        "mctaco_limit_ns": [5, 10, 20],    # the --limit demonstration (plus a group boundary and a cut it derives)
    },

    "extraction": {
        # the extraction experiment: one set of greedy chat generations, three scorers, and a
        # human audit sample chosen before generation. The user message goes through the tokenizer's chat template
        # (SmolLM2's default system message); {sentence} is filled with str.replace.
        "extraction_user_prompt": "Classify the sentiment of this movie review.\n\nReview: {sentence}\n\nAnswer "
                                  "with a JSON object with a single key \"sentiment\" whose value is \"positive\" "
                                  "or \"negative\".",
        "extraction_labels": ["negative", "positive"],   # label index -> the sentiment value the answer should carry
        "extraction_max_new_tokens": 32,               # greedy; fp32; only the new tokens (eos removed) are scored
        "extraction_regex": r"(?i)\b(positive|negative)\b",  # lm-eval RegexFilter pattern: first whole-word match
        "extraction_regex_fallback": "[invalid]",      # RegexFilter's fallback when nothing matches
        "extraction_crosscheck_lm_eval": True,         # also generate with lm-eval's HFLM.generate_until, compare
        "extraction_audit_salt": "llm-eval-evidence/extraction-audit/v1",
        "extraction_audit_per_class": 8,               # pre-registered human audit: 8 items per class, interleaved
        "extraction_weighted_estimate_rule": "the class-weighted estimate (weights N_c/n_c) is computed only when "
                                             "every sampled item of every class is decidable (stance positive or "
                                             "negative) with an undisputed reference; otherwise it is null",
    },

    "harness": {
        # the mini harness (harness/, experiments/harness.py); run.py --experiment harness reads these
        # None: the shipped fixtures/harness_tasks, read in place (copies kept in O/private/harness/tasks/); a set
        # directory must exist (it is never created or seeded)
        "harness_tasks_dir": None,
        "harness_adapter": "smollm2",  # smollm2 (the prepared model) | toy | wrong (harness/adapters.py; no weights)
        "harness_batch_size": 4,       # prompts per adapter call (SmolLM2 still runs one sequence per forward pass)
        "harness_timeout_s": 120.0,    # per-example wall-clock budget for the adapter; a batch of n gets n times it
        "harness_max_new_tokens": 128, # greedy generation length cap for the SmolLM2 adapter
        "harness_smoke_examples": 1,   # --smoke: the first example of each task
        "harness_include_per_example": True,  # predictions in the (private) leaderboard
        "harness_sandbox": {           # code_exec limits (harness/sandbox.py); mode: auto | namespaces | landlock
            "cpu_s": 2, "startup_s": 30.0, "wall_s": 5.0, "memory_bytes": 256 * 2**20, "fsize_bytes": 2**20,
            "nofile": 32, "tmpfs_bytes": 4 * 2**20, "result_max_bytes": 2**20, "mode": "auto",
        },
    },
}


def effective(sections, overrides=None):
    """The flat config of one experiment: its sections merged in order, then `overrides` (e.g. run.py's --model and
    --data) applied to keys that exist in them. A fresh deep copy: the caller may change it freely."""
    import copy

    if isinstance(sections, str):
        raise TypeError(f"sections must be a sequence of section names, not the string {sections!r}")
    unknown = [s for s in sections if s not in CONFIG]
    if unknown:
        raise KeyError(f"unknown config section(s) {unknown}; config.py has {sorted(CONFIG)}")
    flat = {}
    for name in sections:
        flat.update(copy.deepcopy(CONFIG[name]))
    for key, value in (overrides or {}).items():
        if key not in flat:
            raise KeyError(f"override {key!r} is not a setting of the sections {list(sections)}")
        flat[key] = value
    return flat


def check_unique_keys():
    """Every key lives in exactly one section (the flat merge would otherwise depend on the section order)."""
    seen = {}
    for section, values in CONFIG.items():
        for key in values:
            if key in seen:
                raise ValueError(f"config.py: key {key!r} is in sections {seen[key]!r} and {section!r}")
            seen[key] = section


check_unique_keys()
