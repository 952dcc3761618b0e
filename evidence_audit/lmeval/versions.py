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


KNOWN_VERSIONS = {
    "0.4.5": _version(
        lm_eval_version_key=False, results_keys=RESULTS_KEYS_0_4_5, json_output_path=False, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_5, acc_bytes=False, mutual_info="strided", samples_option=False,
        samples_doc_id=None, n_samples_effective="limit",
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
        }),
    "0.4.7": _version(
        lm_eval_version_key=False, results_keys=RESULTS_KEYS_0_4_5, json_output_path=False, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="strided", samples_option=False,
        samples_doc_id=None, n_samples_effective="limit",
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
        }),
    "0.4.8": _version(
        lm_eval_version_key=False, results_keys=RESULTS_KEYS_0_4_5, json_output_path=False, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="strided", samples_option=False,
        samples_doc_id=None, n_samples_effective="limit",
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
        }),
    "0.4.9": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_9, json_output_path=True, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="appended", samples_option=True,
        samples_doc_id="position", n_samples_effective="limit",
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
        }),
    "0.4.9.1": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_9, json_output_path=True, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=False, mutual_info="appended", samples_option=True,
        samples_doc_id="position", n_samples_effective="limit",
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
        }),
    "0.4.9.2": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_9, json_output_path=True, unnamed_model_dir="",
        sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended", samples_option=True,
        samples_doc_id="position", n_samples_effective="limit",
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
        }),
    "0.4.10": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="limit",
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
        }),
    "0.4.11": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="limit",
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
        }),
    "0.4.12": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="scored-last",
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
        }),
    "0.4.13": _version(
        lm_eval_version_key=True, results_keys=RESULTS_KEYS_0_4_10, json_output_path=True,
        unnamed_model_dir="random", sample_keys=SAMPLE_KEYS_0_4_7, acc_bytes=True, mutual_info="appended",
        samples_option=True, samples_doc_id="position", n_samples_effective="scored-max",
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
