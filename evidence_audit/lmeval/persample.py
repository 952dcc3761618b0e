"""Arithmetic level: every per-sample metric recomputed from the sample's own resps / filtered_resps and target,
with lm-eval's process_results (metrics.py), the same in every release read (0.4.5 to 0.4.13: versions.py acc_norm
"characters"), except what a release does not have: acc_bytes before 0.4.9.2 (a sample of such a release that logs
it FAILs), and acc_mutual_info, which each release reads by its own rule (versions.py mutual_info): every release
logs a document's k conditional requests and then its k unconditional ones ("" as context); 0.4.9 on reads them
back so ("appended": conditional lls[:k], unconditional lls[k:], the unconditional continuation with the target
delimiter), releases to 0.4.8 read them "strided" (conditional lls[::2], unconditional lls[1::2], the continuation
without the delimiter), so that their acc, acc_norm and acc_mutual_info of such a task mix the two halves: the
audit recomputes what the release computed, not what it meant. In both, is_greedy is not split (exact_match reads
the gold index of all 2k). With a chat template (the results' chat_template not null) every release from 0.4.7
builds the continuations without the target delimiter, 0.4.10 on keeps it after a gen_prefix that does not end
with whitespace, 0.4.5 always keeps it (versions.py CHAT_DELIMITER): the continuations are read by that rule.
What is not implemented is a SKIPPED row naming it."""
from evidence_audit.checks import ARITHMETIC, expect, same, short
from evidence_audit.definitions import argmax_first
from evidence_audit.lmeval import fmt
from evidence_audit.lmeval.metrics import EXACT_MATCH_ARGS, apply_filters, exact_match, multiple_choice, \
    unsupported_filters
from evidence_audit.lmeval.task_code import is_code
from evidence_audit.lmeval.versions import CHAT_DELIMITER

LOGLIKELIHOOD = ("multiple_choice", "loglikelihood")     # the output types whose requests are loglikelihood
MC_METRICS = ("acc", "acc_norm", "acc_bytes", "exact_match", "f1", "mcc", "acc_mutual_info")


def target_delimiter(t, top):
    """(the delimiter lm-eval put before each multiple_choice continuation of this task, how it follows): the
    config's target_delimiter (" " by default), or with a chat template (`top`, the results: chat_template not null)
    the release's rule (versions.CHAT_DELIMITER)."""
    delim = t.config.get("target_delimiter", " ")
    if top.get("chat_template") is None:
        return delim, "the config's target_delimiter"
    versions = t.release.versions if t.release is not None else ("0.4.9.2",)
    rules = {CHAT_DELIMITER[v][0] for v in versions}
    if len(rules) != 1:
        raise AssertionError(f"lm-eval {' or '.join(versions)} differ in CHAT_DELIMITER: narrow first")
    rule, name = rules.pop(), " or ".join(versions)
    prefix = t.config.get("gen_prefix")
    if rule == "config" or rule == "empty-unless-gen-prefix" and isinstance(prefix, str) and prefix \
            and not prefix[-1].isspace():
        return delim, f"the config's target_delimiter (lm-eval {name} with a chat template" + \
            (")" if rule == "config" else f" after gen_prefix {prefix!r})")
    return "", f"no target_delimiter (lm-eval {name} with a chat template)"


def choices_of(t, s, bad, delim, requests=None):
    """A multiple_choice sample's choices: each continuation (of `requests`, by default all) minus `delim`
    (target_delimiter's (delimiter, why)), checked against the config's doc_to_choice when that is a list. None (and
    a message) when they do not fit."""
    delim, why = delim
    conts = [c for _, c in (s.requests if requests is None else requests)]
    if not all(isinstance(c, str) and c.startswith(delim) for c in conts):
        bad.append(f"{s.where} arguments: a continuation does not start with {delim!r}, {why}")
        return None
    choices = [c[len(delim):] for c in conts]
    listed = t.config.get("doc_to_choice")
    if isinstance(listed, list) and listed != choices:
        bad.append(f"{s.where} arguments: continuations {choices!r} are not the config's doc_to_choice {listed!r}")
    return choices


def gold_of(target, choices):
    """doc_to_target's value as logged (str(target)): an index, or a choice's text; None when neither."""
    if target.isdigit() and int(target) < len(choices):
        return int(target)
    return choices.index(target) if target in choices else None


def mutual_info_split(t, s, bad, delim):
    """A sample that lists acc_mutual_info: (its k conditional requests, the positions the release reads as
    conditional, those it reads as unconditional), or None (and a message) when the requests are not the k
    conditional then k unconditional ones the release makes (api/task.py construct_requests; versions.py
    mutual_info cites both halves). `delim`: target_delimiter's (delimiter, why). In every release the requests
    are laid out so: the unconditional ones are requests[k:]."""
    n, delim, rule = len(s.requests), delim[0], t.fact("mutual_info")
    k = n // 2
    cond, unc = s.requests[:k], s.requests[k:]
    lead = delim if rule == "appended" else ""      # to 0.4.8 the unconditional continuation has no delimiter
    want = [lead + c[len(delim):] if isinstance(c, str) and c.startswith(delim) else None for _, c in cond]
    if n % 2 or any(ctx == "" for ctx, _ in cond) or any(ctx != "" for ctx, _ in unc) \
            or want != [c for _, c in unc]:
        bad.append(f"{s.where} arguments: acc_mutual_info, but not {k} conditional requests followed by their "
                   f"{k} unconditional ones ('' context, continuation {lead!r} + choice) as lm-eval "
                   f"{t.release.name if t.release else '0.4.9.2'} makes them")
        return None
    if rule == "appended":
        return cond, list(range(k)), list(range(k, n))
    return cond, list(range(0, n, 2)), list(range(1, n, 2))


def mc_variant(t, s, requests):
    """The name of a multiple_choice variant not implemented here, or None: unconditional requests without
    acc_mutual_info, one context per choice (multiple_input), a list of gold answers (multiple_target).
    `requests`: the sample's conditional requests."""
    contexts = {ctx for ctx, _ in requests}
    if "" in contexts:
        return "multiple_choice with unconditional requests but no acc_mutual_info"
    if len(contexts) > 1:
        return "multiple_choice with one context per choice (multiple_input)"
    if s.raw["target"].startswith("["):
        return "multiple_choice with several gold answers (multiple_target)"
    return None


def mc_sample(t, s, bad, skipped, delim):
    """One multiple_choice sample: filtered_resps from resps (take_first), then every metric it lists. `delim`:
    target_delimiter's (delimiter, why)."""
    r = s.raw
    if len(r["resps"]) != len(s.requests) or len(r["filtered_resps"]) != len(s.requests):
        bad.append(f"{s.where} resps: {len(r['resps'])} responses for {len(s.requests)} requests")
        return
    for i, (resp, fil) in enumerate(zip(r["resps"], r["filtered_resps"])):
        if not (isinstance(resp, list) and resp and same(resp[0], fil)):
            took = str(resp[0])[:60] if isinstance(resp, list) and resp else f"nothing (resps[{i}] is empty)"
            bad.append(f"{s.where} filtered_resps[{i}]: recorded {str(fil)[:60]}, recomputed {took} (take_first of "
                       f"resps[{i}])")
    parsed = [fmt.loglikelihood(t.path, s, v, f"filtered_resps[{i}]") for i, v in enumerate(r["filtered_resps"])]
    requests, at_cond, at_unc = s.requests, list(range(len(s.requests))), None
    if "acc_mutual_info" in r["metrics"]:
        split = mutual_info_split(t, s, bad, delim)
        if split is None:
            return
        requests, at_cond, at_unc = split
    unusual = mc_variant(t, s, requests)
    if unusual:
        skipped.add(unusual)
        return
    choices = choices_of(t, s, bad, delim, requests)
    if choices is None:
        return
    gold = gold_of(r["target"], choices)
    if gold is None:
        bad.append(f"{s.where} target: {r['target']!r} is neither a choice index nor a choice")
        return
    lls = [parsed[i][0] for i in at_cond]
    values = multiple_choice(lls, [g for _, g in parsed], choices, gold)      # is_greedy: all 2k, never split
    if at_unc is not None:
        mi = argmax_first([ll - parsed[u][0] for ll, u in zip(lls, at_unc)])
        values["acc_mutual_info"] = 1.0 if mi == gold else 0.0
    for m in r["metrics"]:
        if m == "acc_bytes" and not t.fact("acc_bytes"):
            bad.append(f"{s.where} acc_bytes: lm-eval {t.release.name} has no such metric (it came with 0.4.9.2): "
                       "not this release's output")
        elif m in MC_METRICS:
            expect(bad, s.where, m, r[m], values[m], f"from filtered_resps and target {r['target']!r}")
        else:
            skipped.add(m)


def loglikelihood_sample(t, s, bad, skipped):
    """One loglikelihood sample (one request): acc = is_greedy, perplexity = the log-likelihood itself."""
    r = s.raw
    if len(s.requests) != 1 or len(r["resps"]) != 1 or len(r["filtered_resps"]) != 1:
        bad.append(f"{s.where} resps: expected one request and one response")
        return
    if not (isinstance(r["resps"][0], list) and r["resps"][0] and same(r["resps"][0][0], r["filtered_resps"][0])):
        took = str(r["resps"][0][0])[:60] if isinstance(r["resps"][0], list) and r["resps"][0] else "nothing"
        bad.append(f"{s.where} filtered_resps[0]: recorded {str(r['filtered_resps'][0])[:60]}, recomputed {took} "
                   "(take_first of resps[0])")
    ll, greedy = fmt.loglikelihood(t.path, s, r["filtered_resps"][0], "filtered_resps[0]")
    expect(bad, s.where, "arguments.gen_args_0.arg_1", s.requests[0][1], r["target"], "the request's continuation is "
                                                                                      "the target")
    for m in r["metrics"]:
        if m in ("acc", "perplexity"):
            expect(bad, s.where, m, r[m], int(greedy) if m == "acc" else ll, "from filtered_resps")
        else:
            skipped.add(m)


def generate_sample(t, s, bad, skipped):
    """One generate_until sample: filtered_resps from resps with the config's filter steps, then exact_match with
    the metric_list entry's options."""
    r = s.raw
    texts = r["resps"][0] if len(r["resps"]) == 1 else None
    if not isinstance(texts, list) or not all(isinstance(x, str) for x in texts):
        bad.append(f"{s.where} resps: expected one request's list of generated strings")
        return
    got = generation_scores(t, s, texts, skipped)
    if got is None:
        return
    filtered, values = got
    expect(bad, s.where, "filtered_resps", r["filtered_resps"], [filtered], f"filter {r['filter']} applied to resps")
    for m, (value, how) in values.items():
        expect(bad, s.where, m, r[m], value, how)


def generation_scores(t, s, texts, skipped):
    """(filtered, {metric: (value, how)}) of one generate_until sample line had the model generated `texts` (the
    repeats of its one request): its filter's steps, then each metric this module computes (exact_match with its
    metric_list options); the rest named in `skipped`. None when the line's filter is not implemented."""
    r, steps = s.raw, t.filters().get(s.raw["filter"])
    if steps is None or unsupported_filters(steps):
        skipped.add(f"filter {r['filter']} ({', '.join(unsupported_filters(steps or [{}]))})")
        return None
    filtered, values = apply_filters(steps, texts), {}
    for m in r["metrics"]:
        entry = t.metric_entries().get(m, {})
        kwargs = {k: v for k, v in entry.items() if k not in ("metric", "aggregation", "higher_is_better")}
        if m != "exact_match" or not set(kwargs) <= EXACT_MATCH_ARGS or not isinstance(filtered, str) \
                or t.config.get("doc_to_choice") is not None:
            skipped.add(m + (f"({', '.join(sorted(kwargs))})" if kwargs else ""))
            continue
        values[m] = (exact_match(filtered, r["target"], **kwargs),
                     f"exact_match({filtered!r}, target {r['target']!r}, {kwargs})")
    return filtered, values


def persample_rows(C, t, top, identity=False):
    """Row "per-sample metrics recomputed", plus one SKIPPED row per metric/filter not implemented here. `top`: the
    results file (its chat_template decides the multiple_choice continuations' delimiter). A task whose
    process_results is code is left to the identity level (`identity`: it was asked for), which runs that code."""
    bad, skipped = [], set()
    delim = target_delimiter(t, top) if t.output_type == "multiple_choice" else None
    kind = {"multiple_choice": lambda *a: mc_sample(*a, delim), "generate_until": generate_sample,
            "loglikelihood": loglikelihood_sample}.get(t.output_type)
    if is_code(t.config.get("process_results")):
        C.skip(t.label, ARITHMETIC, "per-sample metrics recomputed",
               f"process_results is task code ({short(t.config['process_results'], 50)}): the per-sample metrics are "
               "what it returns, not the built-in definitions; " +
               ("the identity level runs it (see its process_results row)" if identity else
                "pass --tokens --task-code DIR --data FILE to run it; NOT checked"), requested=not identity)
        return
    if kind is None:
        C.skip(t.label, ARITHMETIC, "per-sample metrics recomputed",
               f"output_type {t.output_type!r}: not implemented here (multiple_choice, loglikelihood, "
               "generate_until are)")
        return
    if t.output_type in LOGLIKELIHOOD and set(t.filters()) != {"none"}:
        C.skip(t.label, ARITHMETIC, "per-sample metrics recomputed",
               f"{t.output_type} with filters {sorted(t.filters())}: only the default take_first is implemented")
        return
    for s in t.samples:
        kind(t, s, bad, skipped)
    C.add(t.label, ARITHMETIC, "per-sample metrics recomputed from resps/filtered_resps and target", len(t.samples),
          bad)
    for name in sorted(skipped):
        C.skip(t.label, ARITHMETIC, f"per-sample {name}", "not implemented in the audit: NOT checked")
