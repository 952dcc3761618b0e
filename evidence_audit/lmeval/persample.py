"""Arithmetic level: every per-sample metric recomputed from the sample's own resps / filtered_resps and target,
with lm-eval 0.4.9.2's process_results (metrics.py). What is not implemented is a SKIPPED row naming it."""
from evidence_audit.checks import ARITHMETIC, expect, same
from evidence_audit.lmeval import fmt
from evidence_audit.lmeval.metrics import EXACT_MATCH_ARGS, apply_filters, exact_match, multiple_choice, \
    unsupported_filters

LOGLIKELIHOOD = ("multiple_choice", "loglikelihood")     # the output types whose requests are loglikelihood
MC_METRICS = ("acc", "acc_norm", "acc_bytes", "exact_match", "f1", "mcc")


def choices_of(t, s, bad):
    """A multiple_choice sample's choices: each continuation minus the config's target_delimiter (checked against
    the config's doc_to_choice when that is a list). None (and a message) when they do not fit."""
    delim = t.config.get("target_delimiter", " ")
    conts = [c for _, c in s.requests]
    if not all(isinstance(c, str) and c.startswith(delim) for c in conts):
        bad.append(f"{s.where} arguments: a continuation does not start with target_delimiter {delim!r}")
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


def mc_variant(s):
    """The name of a multiple_choice variant not implemented here, or None: unconditional requests (acc_mutual_info),
    one context per choice (multiple_input), a list of gold answers (multiple_target)."""
    contexts = {ctx for ctx, _ in s.requests}
    if "" in contexts or "acc_mutual_info" in s.raw["metrics"]:
        return "multiple_choice with unconditional requests (acc_mutual_info)"
    if len(contexts) > 1:
        return "multiple_choice with one context per choice (multiple_input)"
    if s.raw["target"].startswith("["):
        return "multiple_choice with several gold answers (multiple_target)"
    return None


def mc_sample(t, s, bad, skipped):
    """One multiple_choice sample: filtered_resps from resps (take_first), then every metric it lists."""
    r = s.raw
    if len(r["resps"]) != len(s.requests) or len(r["filtered_resps"]) != len(s.requests):
        bad.append(f"{s.where} resps: {len(r['resps'])} responses for {len(s.requests)} requests")
        return
    for i, (resp, fil) in enumerate(zip(r["resps"], r["filtered_resps"])):
        if not (isinstance(resp, list) and resp and same(resp[0], fil)):
            bad.append(f"{s.where} filtered_resps[{i}]: recorded {str(fil)[:60]}, recomputed take_first of resps[{i}]")
    parsed = [fmt.loglikelihood(t.path, s, v, f"filtered_resps[{i}]") for i, v in enumerate(r["filtered_resps"])]
    unusual = mc_variant(s)
    if unusual:
        skipped.add(unusual)
        return
    choices = choices_of(t, s, bad)
    if choices is None:
        return
    gold = gold_of(r["target"], choices)
    if gold is None:
        bad.append(f"{s.where} target: {r['target']!r} is neither a choice index nor a choice")
        return
    values = multiple_choice([ll for ll, _ in parsed], [g for _, g in parsed], choices, gold)
    for m in r["metrics"]:
        if m in MC_METRICS:
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
        bad.append(f"{s.where} filtered_resps[0]: recorded {str(r['filtered_resps'][0])[:60]}, recomputed take_first "
                   "of resps[0]")
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
    r, steps = s.raw, t.filters().get(s.raw["filter"])
    if steps is None or unsupported_filters(steps):
        skipped.add(f"filter {r['filter']} ({', '.join(unsupported_filters(steps or [{}]))})")
        return
    texts = r["resps"][0] if len(r["resps"]) == 1 else None
    if not isinstance(texts, list) or not all(isinstance(x, str) for x in texts):
        bad.append(f"{s.where} resps: expected one request's list of generated strings")
        return
    filtered = apply_filters(steps, r["resps"][0])
    expect(bad, s.where, "filtered_resps", r["filtered_resps"], [filtered], f"filter {r['filter']} applied to resps")
    for m in r["metrics"]:
        entry = t.metric_entries().get(m, {})
        kwargs = {k: v for k, v in entry.items() if k not in ("metric", "aggregation", "higher_is_better")}
        if m != "exact_match" or not set(kwargs) <= EXACT_MATCH_ARGS or not isinstance(filtered, str) \
                or t.config.get("doc_to_choice") is not None:
            skipped.add(m + (f"({', '.join(sorted(kwargs))})" if kwargs else ""))
            continue
        expect(bad, s.where, m, r[m], exact_match(filtered, r["target"], **kwargs),
               f"exact_match({filtered!r}, target {r['target']!r}, {kwargs})")


def persample_rows(C, t):
    """Row "per-sample metrics recomputed", plus one SKIPPED row per metric/filter not implemented here."""
    bad, skipped = [], set()
    kind = {"multiple_choice": mc_sample, "generate_until": generate_sample,
            "loglikelihood": loglikelihood_sample}.get(t.output_type)
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
