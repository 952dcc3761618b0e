"""What differs, between lm-eval releases 0.4.5 and 0.4.13, in the files `lm_eval ... --log_samples --output_path`
writes, read from each release's own source (the PyPI wheel `lm_eval-<version>-py3-none-any.whl`).

Plain data, standard library only. The audit reads the output of exactly these releases: fmt.py tells which one
wrote a run and refuses any other; the checks that depend on a fact read it from here (fmt, docs, persample).
`KNOWN_VERSIONS[version]` holds the facts a reader of that release's output depends on, and `where`: for each fact,
the file (under `lm_eval/` of that release) and the lines where the release does it. The facts:

  lm_eval_version_key   the results JSON names the release (`lm_eval_version`, added by add_env_info)
  results_keys          the top-level keys of results_<date_id>.json as the CLI writes it with --log_samples, for
                        tasks outside any group (a task group adds "groups"; the CLI pops "samples" before writing)
  results_name          the results file's name inside <output_path>/<model_name_sanitized>/
  json_output_path      an --output_path ending in ".json" names the results file "<stem>_<date_id>.json" beside it,
                        and the samples files go into its parent directory, with no model subdirectory
  unnamed_model_dir     the subdirectory when model_args name no model: "" (the files are in <output_path> itself)
                        or "random" (a random 8-character id)
  task_result_keys      the keys of results.<task> besides "<metric>,<filter>" and "<metric>_stderr,<filter>"
  samples_name          a task's samples file, beside the results file, with the same date_id
  sample_keys           the keys every sample line has besides one key per metric
  arguments             "gen_args": {"gen_args_<i>": {"arg_<j>": value}}, one entry per request, in request order
  resps                 "sanitize_list": every leaf of resps and filtered_resps turned into a string (a
                        loglikelihood response is ["<float repr>", "True"|"False"]); target turned into a string
  hashes                doc_hash = sha256(json.dumps(doc, indent=2, ensure_ascii=False)), prompt_hash = sha256 of the
                        first request's context, target_hash = sha256(str(target))
  task_hashes           results "task_hashes": sha256 of every line's doc_hash + prompt_hash + target_hash, in order
  acc_norm              multiple_choice acc_norm = argmax(loglikelihood / len(choice string)), first index wins
  acc_bytes             the multiple_choice metric acc_bytes (loglikelihood / UTF-8 byte length) exists (it is
                        logged only when the task's metric_list asks for it)
  mutual_info           acc_mutual_info: "strided" reads the unconditional log-likelihoods at odd positions while
                        the requests put them after the conditional ones (and without the target delimiter);
                        "appended" reads them where the requests put them
  samples_option        --samples exists (and `samples` of simple_evaluate)
  samples_doc_id        with --samples, the logged doc_id: "position" = samples[k] for the k-th document in dataset
                        order, so an unsorted list labels documents with other documents' ids
  n_samples_effective   "limit": n-samples.<task>.effective = min(limit or all, all), whatever --samples selected;
                        "scored-last" (0.4.12) / "scored-max" (0.4.13): the number of values of the task's metrics
                        (the last (metric, filter) aggregated / the largest count), i.e. the documents scored, a
                        --samples selection included
  stderr                "N/A" for a metric with one value or without a closed-form or bootstrap stderr
  loglikelihood_batches how HFLM turns a run's loglikelihood requests into padded batches and scores them
                        (TemplateLM.loglikelihood and _encode_pair, HFLM.tok_encode, _loglikelihood_tokens,
                        _model_call, the Collator, pad_and_concat), against 0.4.9.2's: "same" = identical in effect
                        (the same padded tensors of the release's token ids, tok_encode below, read the same way),
                        else what differs
                        (BATCHES_DIFFER); rescore.py reproduces the batches of the "same" releases only
  tok_encode            how HFLM tokenises a loglikelihood request (TOK_ENCODE; rescore.py's encoder follows it):
                        "add_bos_token" = special tokens (a BOS the tokenizer's post-processor adds) only when the
                        model_args add_bos_token is true (default False), forced true for a model whose config
                        model_type contains "gemma"; an empty context is the prefix token before the continuation's
                        tok_encode tokens (with add_bos_token=True: a BOS of their own). "tokenizer-default" = the
                        tokenizer's default unless model_args add_bos_token is given, none for a text starting with
                        the prefix token's text, no Gemma case; an empty context is the continuation without special
                        tokens, its leading prefix token taken as the context, else the prefix token. The same rule
                        gives a loglikelihood_rolling document's tokens (the first window's prefix token is
                        prefix_token_id in every release)

The tests (tests/test_lmeval_versions.py) check these claims against real output of every release, made by
tools/make_lmeval_fixtures.py into tests/fixtures/lmeval_versions/<version>/.
"""

# The keys evaluate() puts in its result, simple_evaluate() adds, add_env_info / add_tokenizer_info add, and the
# EvaluationTracker adds (task_hashes and asdict(GeneralConfigTracker)) before writing.
_EVALUATE_KEYS = ("results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples")
_SIMPLE_EVALUATE_KEYS = ("config", "git_hash", "date")
_ENV_KEYS = ("pretty_env_info", "transformers_version", "upper_git_hash")
_TOKENIZER_KEYS = ("tokenizer_pad_token", "tokenizer_eos_token", "tokenizer_bos_token", "eot_token_id", "max_length")
_TRACKER_KEYS = ("task_hashes", "model_source", "model_name", "model_name_sanitized", "system_instruction",
                 "system_instruction_sha", "fewshot_as_multiturn", "chat_template", "chat_template_sha",
                 "total_evaluation_time_seconds")
_TIMES = ("start_time", "end_time")

RESULTS_KEYS_0_4_5 = frozenset(_EVALUATE_KEYS + _SIMPLE_EVALUATE_KEYS + _ENV_KEYS + _TOKENIZER_KEYS + _TRACKER_KEYS
                               + _TIMES)
RESULTS_KEYS_0_4_9 = RESULTS_KEYS_0_4_5 | {"lm_eval_version"}
RESULTS_KEYS_0_4_10 = RESULTS_KEYS_0_4_9 - set(_TIMES)

SAMPLE_KEYS_0_4_5 = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "doc_hash", "prompt_hash",
                     "target_hash")
SAMPLE_KEYS_0_4_7 = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics",
                     "doc_hash", "prompt_hash", "target_hash")

_SAME = {"results_name": "results_{date_id}.json", "samples_name": "samples_{task}_{date_id}.jsonl",
         "arguments": "gen_args", "resps": "sanitize_list", "hashes": True, "task_hashes": True,
         "acc_norm": "characters", "stderr": "N/A"}


def _version(**facts):
    """One release's entry: the facts shared by every release (_SAME) updated with its own; `where` is required."""
    out = dict(_SAME)
    out.update(facts)
    return out


# loglikelihood_batches, read side by side with 0.4.9.2's functions (the `where` lines of each release):
# - 0.4.10, 0.4.11 (byte-identical files): _loglikelihood_tokens differs by annotations, two asserts that the
#   padded length is set, and zip(strict=True) over lists of one length (huggingface.py:1279, 1285, 1308);
#   _model_call by an assert commented out (huggingface.py:965-968); the Collator by annotations and zip(strict=True)
#   (utils.py:236-512); pad_and_concat moved unchanged to models/utils_hf.py:8-56; tok_encode, _select_cont_toks,
#   _encode_pair and loglikelihood are the same text. "same".
# - 0.4.12: as 0.4.10, plus batch sizes detected earlier are forgotten when the batch size is "auto"
#   (huggingface.py:1388-1394: only under batch_fn, i.e. batch_size auto) and a progress bar while tokenising
#   (api/model.py:425-429). "same".
# - 0.4.13: those functions are the same text as 0.4.12's; only HFLM.max_length moved to resolve_max_length
#   (models/utils.py:551-592: a nested text_config first), and the audit reads max_length from the results. "same".
# - 0.4.9.1: _loglikelihood_tokens (huggingface.py:1115-1349), _model_call (:909-988), _select_cont_toks and the
#   Collator (utils.py:355-560) are the same text but for type annotations and docstrings. Its token ids differ
#   (tok_encode below), and rescore.py's encoder follows that fact, so the batches are 0.4.9.2's. "same".
#   Measured: its real batch-4 runs (bos/ fixtures, transformers 4.55.4) put through score_requests gave max |diff| 0.
# - 0.4.9: as 0.4.9.1 (huggingface.py:1049-1283), and _model_call has no autocast (huggingface.py:870-925): it
#   differs only under mixed_precision_dtype, which sends any run to the tolerance mode. "same".
# - 0.4.5, 0.4.7, 0.4.8: the Collator runs a context group's FIRST request (0.4.5 and 0.4.7 utils.py:427-433, 0.4.8
#   utils.py:429-435; 0.4.9.2 runs the one with the longest continuation), is_greedy compares all of its rows with a
#   member's continuation (0.4.5 huggingface.py:1156, 0.4.7 :1203, 0.4.8 :1232; 0.4.9.2 the trailing ones), log_softmax
#   has no softmax_dtype (0.4.5 huggingface.py:1118-1120, 0.4.7 :1165-1167, 0.4.8 :1194-1196), and tok_encode and an
#   empty context are as 0.4.9.1's. "first-member".
# pad_and_concat (right padding with 0) is the same in every release.
BATCHES_SAME = "same"
BATCHES_DIFFER = {
    "first-member": "a context group's scores are read from its first request's rows, not its longest "
                    "continuation's; is_greedy compares all those rows; no softmax_dtype",
}

# tok_encode: the rules (see the module docstring); the `where` lines of each release are its add_bos_token default
# and Gemma case (0.4.5-0.4.9.1), HFLM.tok_encode, has_bos_prefix / _add_special_kwargs (0.4.9.2 on) and
# TemplateLM.loglikelihood's empty context.
TOK_ADD_BOS = "add_bos_token"
TOK_DEFAULT = "tokenizer-default"
TOK_ENCODE = {
    TOK_ADD_BOS: "special tokens only with model_args add_bos_token=True (default False; forced on for a Gemma "
                 "model_type); an empty context: the prefix token, then the continuation's tok_encode tokens",
    TOK_DEFAULT: "the tokenizer's default special tokens unless model_args add_bos_token is given, none for a text "
                 "starting with the prefix token; an empty context: a leading prefix token of the continuation's "
                 "tokens (no special tokens), else the prefix token",
}

KNOWN_VERSIONS = {
    "0.4.5": _version(
        lm_eval_version_key=False, results_keys=RESULTS_KEYS_0_4_5, json_output_path=False, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_5, acc_bytes=False, mutual_info="strided", samples_option=False,
        samples_doc_id=None, n_samples_effective="limit",
        loglikelihood_batches="first-member",
        tok_encode=TOK_ADD_BOS,
        task_result_keys=("alias",),
        where={
            "lm_eval_version_key": "loggers/utils.py:98-112",
            "results_keys": "evaluator.py:325-353, evaluator.py:642-666, loggers/utils.py:98-143, "
                            "loggers/evaluation_tracker.py:48-58, loggers/evaluation_tracker.py:209-220",
            "results_name": "loggers/evaluation_tracker.py:229-233",
            "json_output_path": "loggers/evaluation_tracker.py:229-233",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:64-91",
            "task_result_keys": "evaluator_utils.py:340-344",
            "samples_name": "loggers/evaluation_tracker.py:289-295",
            "sample_keys": "evaluator.py:539-558",
            "arguments": "loggers/evaluation_tracker.py:301-309",
            "resps": "loggers/evaluation_tracker.py:307-310, utils.py:84-93",
            "hashes": "evaluator.py:548-557, utils.py:35-36",
            "task_hashes": "loggers/evaluation_tracker.py:209-219",
            "acc_norm": "api/task.py:1413-1414, api/task.py:1428-1429",
            "acc_bytes": "api/task.py:1409-1475",
            "mutual_info": "api/task.py:1324-1333, api/task.py:1416-1426",
            "samples_option": "evaluator.py:47-77",
            "samples_doc_id": "evaluator.py:528-534",
            "n_samples_effective": "evaluator.py:654-663",
            "stderr": "evaluator_utils.py:110-115",
            "loglikelihood_batches": "models/utils.py:427-433, models/huggingface.py:1118-1120, "
                                     "models/huggingface.py:1156, models/huggingface.py:748-772, "
                                     "api/model.py:362-378",
            "tok_encode": "models/huggingface.py:78, models/huggingface.py:209-211, "
                          "models/huggingface.py:748-772, api/model.py:362-378",
        }),
    "0.4.7": _version(
        lm_eval_version_key=False, results_keys=RESULTS_KEYS_0_4_5, json_output_path=False, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="strided", samples_option=False,
        samples_doc_id=None, n_samples_effective="limit",
        loglikelihood_batches="first-member",
        tok_encode=TOK_ADD_BOS,
        task_result_keys=("alias",),
        where={
            "lm_eval_version_key": "loggers/utils.py:98-112",
            "results_keys": "evaluator.py:327-355, evaluator.py:651-675, loggers/utils.py:98-143, "
                            "loggers/evaluation_tracker.py:48-58, loggers/evaluation_tracker.py:209-220",
            "results_name": "loggers/evaluation_tracker.py:229-233",
            "json_output_path": "loggers/evaluation_tracker.py:229-233",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:64-91",
            "task_result_keys": "evaluator_utils.py:340-344",
            "samples_name": "loggers/evaluation_tracker.py:289-295",
            "sample_keys": "evaluator.py:546-567",
            "arguments": "loggers/evaluation_tracker.py:301-309",
            "resps": "loggers/evaluation_tracker.py:307-310, utils.py:84-93",
            "hashes": "evaluator.py:557-566, utils.py:35-36",
            "task_hashes": "loggers/evaluation_tracker.py:209-219",
            "acc_norm": "api/task.py:1418-1419, api/task.py:1433-1434",
            "acc_bytes": "api/task.py:1414-1480",
            "mutual_info": "api/task.py:1329-1338, api/task.py:1421-1431",
            "samples_option": "evaluator.py:47-77",
            "samples_doc_id": "evaluator.py:534-541",
            "n_samples_effective": "evaluator.py:663-672",
            "stderr": "evaluator_utils.py:110-115",
            "loglikelihood_batches": "models/utils.py:427-433, models/huggingface.py:1165-1167, "
                                     "models/huggingface.py:1203, models/huggingface.py:772-796, "
                                     "api/model.py:362-378",
            "tok_encode": "models/huggingface.py:80, models/huggingface.py:213-215, "
                          "models/huggingface.py:772-796, api/model.py:362-378",
        }),
    "0.4.8": _version(
        lm_eval_version_key=False, results_keys=RESULTS_KEYS_0_4_5, json_output_path=False, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="strided", samples_option=False,
        samples_doc_id=None, n_samples_effective="limit",
        loglikelihood_batches="first-member",
        tok_encode=TOK_ADD_BOS,
        task_result_keys=("alias",),
        where={
            "lm_eval_version_key": "loggers/utils.py:98-112",
            "results_keys": "evaluator.py:335-363, evaluator.py:672-696, loggers/utils.py:98-143, "
                            "loggers/evaluation_tracker.py:51-61, loggers/evaluation_tracker.py:212-223",
            "results_name": "loggers/evaluation_tracker.py:232-236",
            "json_output_path": "loggers/evaluation_tracker.py:232-236",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:67-94",
            "task_result_keys": "evaluator_utils.py:350-354",
            "samples_name": "loggers/evaluation_tracker.py:292-298",
            "sample_keys": "evaluator.py:567-588",
            "arguments": "loggers/evaluation_tracker.py:304-312",
            "resps": "loggers/evaluation_tracker.py:310-313, utils.py:104-113",
            "hashes": "evaluator.py:578-587, utils.py:55-56",
            "task_hashes": "loggers/evaluation_tracker.py:212-222",
            "acc_norm": "api/task.py:1486-1487, api/task.py:1501-1502",
            "acc_bytes": "api/task.py:1482-1548",
            "mutual_info": "api/task.py:1397-1406, api/task.py:1489-1499",
            "samples_option": "evaluator.py:48-79",
            "samples_doc_id": "evaluator.py:555-562",
            "n_samples_effective": "evaluator.py:684-693",
            "stderr": "evaluator_utils.py:119-125",
            "loglikelihood_batches": "models/utils.py:429-435, models/huggingface.py:1194-1196, "
                                     "models/huggingface.py:1232, models/huggingface.py:788-812, "
                                     "api/model.py:366-382",
            "tok_encode": "models/huggingface.py:81, models/huggingface.py:220-222, "
                          "models/huggingface.py:788-812, api/model.py:366-382",
        }),
    "0.4.9": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_9, json_output_path=True, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="appended", samples_option=True,
        samples_doc_id="position", n_samples_effective="limit",
        loglikelihood_batches="same",
        tok_encode=TOK_ADD_BOS,
        task_result_keys=("alias",),
        where={
            "lm_eval_version_key": "loggers/utils.py:99-118",
            "results_keys": "evaluator.py:370-398, evaluator.py:726-750, loggers/utils.py:99-149, "
                            "loggers/evaluation_tracker.py:51-61, loggers/evaluation_tracker.py:212-223",
            "results_name": "loggers/evaluation_tracker.py:231-245",
            "json_output_path": "loggers/evaluation_tracker.py:233-237, loggers/evaluation_tracker.py:301-306",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:67-94",
            "task_result_keys": "evaluator_utils.py:350-354",
            "samples_name": "loggers/evaluation_tracker.py:300-312",
            "sample_keys": "evaluator.py:621-642",
            "arguments": "loggers/evaluation_tracker.py:317-325",
            "resps": "loggers/evaluation_tracker.py:323-326, utils.py:119-128",
            "hashes": "evaluator.py:632-641, utils.py:70-71",
            "task_hashes": "loggers/evaluation_tracker.py:212-222",
            "acc_norm": "api/task.py:1577-1578, api/task.py:1593-1594",
            "acc_bytes": "api/task.py:1573-1640",
            "mutual_info": "api/task.py:1474-1487, api/task.py:1580-1591",
            "samples_option": "__main__.py:150, evaluator.py:60, api/task.py:696-726",
            "samples_doc_id": "evaluator.py:598-614, api/task.py:696-726",
            "n_samples_effective": "evaluator.py:738-747",
            "stderr": "evaluator_utils.py:119-125",
            "loglikelihood_batches": "models/huggingface.py:1049-1283, models/huggingface.py:870-925, "
                                     "models/utils.py:355-560, models/utils.py:151-199",
            "tok_encode": "models/huggingface.py:82, models/huggingface.py:223-225, "
                          "models/huggingface.py:804-828, api/model.py:366-382",
        }),
    "0.4.9.1": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_9, json_output_path=True, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="appended", samples_option=True,
        samples_doc_id="position", n_samples_effective="limit",
        loglikelihood_batches="same",
        tok_encode=TOK_ADD_BOS,
        task_result_keys=("alias",),
        where={
            "lm_eval_version_key": "loggers/utils.py:99-118",
            "results_keys": "evaluator.py:385-413, evaluator.py:741-772, loggers/utils.py:99-149, "
                            "loggers/evaluation_tracker.py:51-61, loggers/evaluation_tracker.py:212-223",
            "results_name": "loggers/evaluation_tracker.py:231-245",
            "json_output_path": "loggers/evaluation_tracker.py:233-237, loggers/evaluation_tracker.py:301-306",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:67-94",
            "task_result_keys": "evaluator_utils.py:350-354",
            "samples_name": "loggers/evaluation_tracker.py:300-312",
            "sample_keys": "evaluator.py:636-657",
            "arguments": "loggers/evaluation_tracker.py:317-325",
            "resps": "loggers/evaluation_tracker.py:323-326, utils.py:136-145",
            "hashes": "evaluator.py:647-656, utils.py:87-88",
            "task_hashes": "loggers/evaluation_tracker.py:212-222",
            "acc_norm": "api/task.py:1583-1584, api/task.py:1599-1600",
            "acc_bytes": "api/task.py:1579-1646",
            "mutual_info": "api/task.py:1480-1493, api/task.py:1586-1597",
            "samples_option": "__main__.py:140, evaluator.py:63, api/task.py:698-728",
            "samples_doc_id": "evaluator.py:613-629, api/task.py:698-728",
            "n_samples_effective": "evaluator.py:753-762",
            "stderr": "evaluator_utils.py:119-125",
            "loglikelihood_batches": "models/huggingface.py:1115-1349, models/huggingface.py:909-988, "
                                     "models/utils.py:355-560, models/utils.py:151-199",
            "tok_encode": "models/huggingface.py:87, models/huggingface.py:251-253, "
                          "models/huggingface.py:840-867, api/model.py:375-391",
        }),
    "0.4.9.2": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_9, json_output_path=True, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended", samples_option=True,
        samples_doc_id="position", n_samples_effective="limit",
        loglikelihood_batches="same",
        tok_encode=TOK_DEFAULT,
        task_result_keys=("alias",),
        where={
            "lm_eval_version_key": "loggers/utils.py:99-118",
            "results_keys": "evaluator.py:385-413, evaluator.py:741-772, loggers/utils.py:99-149, "
                            "loggers/evaluation_tracker.py:51-61, loggers/evaluation_tracker.py:212-223",
            "results_name": "loggers/evaluation_tracker.py:231-245",
            "json_output_path": "loggers/evaluation_tracker.py:233-237, loggers/evaluation_tracker.py:301-306",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:67-94",
            "task_result_keys": "evaluator_utils.py:350-354",
            "samples_name": "loggers/evaluation_tracker.py:300-312",
            "sample_keys": "evaluator.py:636-657",
            "arguments": "loggers/evaluation_tracker.py:317-325",
            "resps": "loggers/evaluation_tracker.py:323-326, utils.py:138-147",
            "hashes": "evaluator.py:647-656, utils.py:89-90",
            "task_hashes": "loggers/evaluation_tracker.py:212-222",
            "acc_norm": "api/task.py:1584-1585, api/task.py:1601-1602",
            "acc_bytes": "api/task.py:1586, api/task.py:1603, api/task.py:1651",
            "mutual_info": "api/task.py:1481-1494, api/task.py:1588-1599",
            "samples_option": "__main__.py:140, evaluator.py:63, api/task.py:698-728",
            "samples_doc_id": "evaluator.py:613-629, api/task.py:698-728",
            "n_samples_effective": "evaluator.py:753-762",
            "stderr": "evaluator_utils.py:119-125",
            "loglikelihood_batches": "models/huggingface.py:1131-1364, models/huggingface.py:925-965, "
                                     "models/huggingface.py:855-878, models/utils.py:355-628, "
                                     "models/utils.py:151-199, api/model.py:358-453",
            "tok_encode": "models/huggingface.py:855-878, models/utils.py:886-900, api/model.py:407-453",
        }),
    "0.4.10": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="limit",
        loglikelihood_batches="same",
        tok_encode=TOK_DEFAULT,
        task_result_keys=("alias",),
        where={
            "lm_eval_version_key": "loggers/utils.py:97-128",
            "results_keys": "evaluator.py:394-422, evaluator.py:750-781, loggers/utils.py:97-159, "
                            "loggers/evaluation_tracker.py:60-72, loggers/evaluation_tracker.py:250-261",
            "results_name": "loggers/evaluation_tracker.py:269-279",
            "json_output_path": "loggers/evaluation_tracker.py:271-275, loggers/evaluation_tracker.py:337-341",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:105-108, utils.py:890-895",
            "task_result_keys": "evaluator_utils.py:349-353",
            "samples_name": "loggers/evaluation_tracker.py:336-347",
            "sample_keys": "evaluator.py:643-664",
            "arguments": "loggers/evaluation_tracker.py:353-362",
            "resps": "loggers/evaluation_tracker.py:359-364, utils.py:178-187",
            "hashes": "evaluator.py:654-663, utils.py:129-130",
            "task_hashes": "loggers/evaluation_tracker.py:250-260",
            "acc_norm": "api/task.py:1488-1489, api/task.py:1505-1506",
            "acc_bytes": "api/task.py:1490, api/task.py:1507, api/task.py:1555",
            "mutual_info": "api/task.py:1385-1398, api/task.py:1492-1503",
            "samples_option": "_cli/run.py:186, evaluator.py:66, api/task.py:575-605",
            "samples_doc_id": "evaluator.py:622-638, api/task.py:575-605",
            "n_samples_effective": "evaluator.py:762-771",
            "stderr": "evaluator_utils.py:118-124",
            "loglikelihood_batches": "models/huggingface.py:1135-1370, models/huggingface.py:929-969, "
                                     "models/huggingface.py:858-881, models/utils.py:236-512, "
                                     "models/utils_hf.py:8-56, api/model.py:357-452",
            "tok_encode": "models/huggingface.py:858-881, models/utils.py:939-953, api/model.py:406-452",
        }),
    "0.4.11": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="limit",
        loglikelihood_batches="same",
        tok_encode=TOK_DEFAULT,
        task_result_keys=("alias",),
        where={   # the files read here are byte-identical to 0.4.10's
            "lm_eval_version_key": "loggers/utils.py:97-128",
            "results_keys": "evaluator.py:394-422, evaluator.py:750-781, loggers/utils.py:97-159, "
                            "loggers/evaluation_tracker.py:60-72, loggers/evaluation_tracker.py:250-261",
            "results_name": "loggers/evaluation_tracker.py:269-279",
            "json_output_path": "loggers/evaluation_tracker.py:271-275, loggers/evaluation_tracker.py:337-341",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:105-108, utils.py:890-895",
            "task_result_keys": "evaluator_utils.py:349-353",
            "samples_name": "loggers/evaluation_tracker.py:336-347",
            "sample_keys": "evaluator.py:643-664",
            "arguments": "loggers/evaluation_tracker.py:353-362",
            "resps": "loggers/evaluation_tracker.py:359-364, utils.py:178-187",
            "hashes": "evaluator.py:654-663, utils.py:129-130",
            "task_hashes": "loggers/evaluation_tracker.py:250-260",
            "acc_norm": "api/task.py:1488-1489, api/task.py:1505-1506",
            "acc_bytes": "api/task.py:1490, api/task.py:1507, api/task.py:1555",
            "mutual_info": "api/task.py:1385-1398, api/task.py:1492-1503",
            "samples_option": "_cli/run.py:186, evaluator.py:66, api/task.py:575-605",
            "samples_doc_id": "evaluator.py:622-638, api/task.py:575-605",
            "n_samples_effective": "evaluator.py:762-771",
            "stderr": "evaluator_utils.py:118-124",
            "loglikelihood_batches": "models/huggingface.py:1135-1370, models/huggingface.py:929-969, "
                                     "models/huggingface.py:858-881, models/utils.py:236-512, "
                                     "models/utils_hf.py:8-56, api/model.py:357-452",
            "tok_encode": "models/huggingface.py:858-881, models/utils.py:939-953, api/model.py:406-452",
        }),
    "0.4.12": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="scored-last",
        loglikelihood_batches="same",
        tok_encode=TOK_DEFAULT,
        task_result_keys=("name", "alias", "sample_len"),
        where={
            "lm_eval_version_key": "loggers/utils.py:97-128",
            "results_keys": "evaluator.py:389-417, evaluator_utils.py:157-168, loggers/utils.py:97-162, "
                            "loggers/evaluation_tracker.py:60-72, loggers/evaluation_tracker.py:250-261, "
                            "result_schema.py",
            "results_name": "loggers/evaluation_tracker.py:269-279",
            "json_output_path": "loggers/evaluation_tracker.py:271-275, loggers/evaluation_tracker.py:337-341",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:105-108, utils.py:917-922",
            "task_result_keys": "evaluator_utils.py:254-258",
            "samples_name": "loggers/evaluation_tracker.py:336-347",
            "sample_keys": "evaluator.py:640-661",
            "arguments": "loggers/evaluation_tracker.py:353-362",
            "resps": "loggers/evaluation_tracker.py:359-364, utils.py:208-217",
            "hashes": "evaluator.py:651-660, utils.py:129-130",
            "task_hashes": "loggers/evaluation_tracker.py:250-260",
            "acc_norm": "api/task.py:1493-1494, api/task.py:1510-1511",
            "acc_bytes": "api/task.py:1495, api/task.py:1512, api/task.py:1560",
            "mutual_info": "api/task.py:1390-1403, api/task.py:1497-1508",
            "samples_option": "_cli/run.py:186, api/task.py:576-606",
            "samples_doc_id": "evaluator.py:624-635, api/task.py:576-606",
            "n_samples_effective": "evaluator_utils.py:190-219, evaluator_utils.py:266-270",
            "stderr": "evaluator_utils.py:210-217",
            "loglikelihood_batches": "models/huggingface.py:1332-1575, models/huggingface.py:1114-1154, "
                                     "models/huggingface.py:1043-1066, models/utils.py:232-497, "
                                     "models/utils_hf.py:8-56, api/model.py:368-446",
            "tok_encode": "models/huggingface.py:1043-1066, models/utils.py:923-937, api/model.py:408-446",
        }),
    "0.4.13": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="scored-max",
        loglikelihood_batches="same",
        tok_encode=TOK_DEFAULT,
        task_result_keys=("name", "alias", "sample_len"),
        where={
            "lm_eval_version_key": "loggers/utils.py:101-132",
            "results_keys": "evaluator.py:394-422, evaluator_utils.py:157-168, loggers/utils.py:101-166, "
                            "loggers/evaluation_tracker.py:60-72, loggers/evaluation_tracker.py:250-261, "
                            "result_schema.py",
            "results_name": "loggers/evaluation_tracker.py:269-279",
            "json_output_path": "loggers/evaluation_tracker.py:271-275, loggers/evaluation_tracker.py:337-341",
            "unnamed_model_dir": "loggers/evaluation_tracker.py:105-108, utils.py:922-927",
            "task_result_keys": "evaluator_utils.py:280-284",
            "samples_name": "loggers/evaluation_tracker.py:336-347",
            "sample_keys": "evaluator.py:644-665",
            "arguments": "loggers/evaluation_tracker.py:353-362",
            "resps": "loggers/evaluation_tracker.py:359-364, utils.py:212-221",
            "hashes": "evaluator.py:655-664, utils.py:129-130",
            "task_hashes": "loggers/evaluation_tracker.py:250-260",
            "acc_norm": "api/task.py:1493-1494, api/task.py:1510-1511",
            "acc_bytes": "api/task.py:1495, api/task.py:1512, api/task.py:1560",
            "mutual_info": "api/task.py:1390-1403, api/task.py:1497-1508",
            "samples_option": "_cli/run.py:186, api/task.py:576-606",
            "samples_doc_id": "evaluator.py:628-639, api/task.py:576-606",
            "n_samples_effective": "evaluator_utils.py:189-245, evaluator_utils.py:292-296",
            "stderr": "evaluator_utils.py:215-225",
            "loglikelihood_batches": "models/huggingface.py:1329-1572, models/huggingface.py:1111-1151, "
                                     "models/huggingface.py:1040-1063, models/utils.py:238-503, "
                                     "models/utils_hf.py:8-56, api/model.py:393-471, models/utils.py:551-592",
            "tok_encode": "models/huggingface.py:1040-1063, models/utils.py:973-987, api/model.py:433-471",
        }),
}

# The target_delimiter a multiple_choice continuation starts with when the run applied a chat template (the results'
# chat_template not null: construct_requests gets apply_chat_template): "config" = the config's target_delimiter
# (the release ignores the flag there), "empty" = "", "empty-unless-gen-prefix" = the config's when the config's
# gen_prefix is set and does not end with whitespace, else "". The unconditional requests of acc_mutual_info use the
# same delimiter in the "appended" releases. A table beside KNOWN_VERSIONS, not a fact in it: SOURCE_MAP.md's
# generated section (tests/test_lmeval_versions.py source_map_section) lists every fact of KNOWN_VERSIONS and is not
# this module's file to change; fold it in when that section is regenerated.
CHAT_DELIMITER = {
    "0.4.5": ("config", "api/task.py:1301-1321"),
    "0.4.7": ("empty", "api/task.py:1315-1317"),
    "0.4.8": ("empty", "api/task.py:1372-1374"),
    "0.4.9": ("empty", "api/task.py:1452-1454"),
    "0.4.9.1": ("empty", "api/task.py:1458-1460"),
    "0.4.9.2": ("empty", "api/task.py:1459-1461"),
    "0.4.10": ("empty-unless-gen-prefix", "api/task.py:1371-1378, api/utils.py:27-29"),
    "0.4.11": ("empty-unless-gen-prefix", "api/task.py:1371-1378, api/utils.py:27-29"),
    "0.4.12": ("empty-unless-gen-prefix", "api/task.py:1376-1383, api/utils.py:27-29"),
    "0.4.13": ("empty-unless-gen-prefix", "api/task.py:1376-1383, api/utils.py:27-29"),
}
