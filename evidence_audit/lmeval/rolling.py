"""loglikelihood_rolling tasks (word_perplexity, byte_perplexity, bits_per_byte) at the arithmetic level:
recomputing each sample's logged values (fmt.read_samples reads their files, as every task's); the aggregates
(weighted_perplexity, bits_per_byte) and their "N/A" stderrs are aggregate.py's; the request's text against
doc_to_target(doc) is identity.py's (--tokens).

What lm-eval 0.4.9.2 logs per document (api/task.py:1455-1456, 1559-1577; evaluator.py:636-660): one request whose
only argument is doc_to_target(doc) (`arguments`: {"gen_args_0": {"arg_0": text}}), `target` the same text,
`resps` [["<ll>"]] and `filtered_resps` ["<ll>"] (the summed log-likelihood over the rolling windows, as a string),
and per metric the pair [ll, count]: count_words(text) = len(re.split(r"\\s+", text)) for word_perplexity,
count_bytes(text) = UTF-8 bytes for byte_perplexity and bits_per_byte. All of it follows from the samples file
alone (the counts from the logged target, which --tokens --data ties to the document); the ll itself is re-scored
at the forward level (rescore.py), not here.
"""
from evidence_audit.checks import ARITHMETIC, expect
from evidence_audit.definitions import is_int, is_num
from evidence_audit.lmeval.fmt import ROLLING
from evidence_audit.lmeval.metrics import count_bytes, count_words

COUNTS = {"word_perplexity": "words", "byte_perplexity": "bytes", "bits_per_byte": "bytes"}


def loglikelihood_of(t, s, bad):
    """The sample's log-likelihood: filtered_resps ["<float>"] = take_first of resps [["<float>"]]."""
    r = s.raw
    if not (len(r["resps"]) == 1 and isinstance(r["resps"][0], list) and len(r["resps"][0]) == 1
            and len(r["filtered_resps"]) == 1 and isinstance(r["filtered_resps"][0], str)):
        bad.append(f"{s.where} resps: expected [[\"<ll>\"]] and filtered_resps [\"<ll>\"] (one rolling request)")
        return None
    if r["resps"][0][0] != r["filtered_resps"][0]:
        bad.append(f"{s.where} filtered_resps[0]: recorded {r['filtered_resps'][0]!r}, recomputed take_first of "
                   f"resps[0]: {r['resps'][0][0]!r}")
    try:
        ll = float(r["filtered_resps"][0])
    except ValueError:
        ll = None
    if ll is None or ll != ll or ll in (float("inf"), float("-inf")):
        bad.append(f"{s.where} filtered_resps[0]: {r['filtered_resps'][0][:60]!r} is not a finite float")
        return None
    return ll


def persample_rows(C, t):
    """Row "per-sample rolling values recomputed": each metric's [ll, count] from filtered_resps and the target;
    SKIPPED rows for metrics or filters not implemented."""
    check = "per-sample rolling values recomputed ([ll, words or bytes] from filtered_resps and target)"
    if set(t.filters()) != {"none"}:
        C.skip(t.label, ARITHMETIC, check, f"{ROLLING} with filters {sorted(t.filters())}: only the default "
                                           "take_first is implemented")
        return
    bad, skipped = [], set()
    for s in t.samples:
        r = s.raw
        expect(bad, s.where, "arguments.gen_args_0.arg_0", s.requests[0][0], r["target"],
               "a rolling request's only argument is the target text")
        ll = loglikelihood_of(t, s, bad)
        if ll is None:
            continue
        counts = {"words": count_words(r["target"]), "bytes": count_bytes(r["target"])}
        for m in r["metrics"]:
            if m not in COUNTS:
                skipped.add(m)
                continue
            v = r[m]
            if not (isinstance(v, list) and len(v) == 2 and is_num(v[0]) and is_int(v[1])):
                bad.append(f"{s.where} {m}: recorded {str(v)[:60]}, expected [ll, {COUNTS[m]}]")
                continue
            expect(bad, s.where, m, v, [ll, counts[COUNTS[m]]],
                   f"[filtered_resps ll, count_{COUNTS[m]}(target)]")
    C.add(t.label, ARITHMETIC, check, len(t.samples), bad)
    for name in sorted(skipped):
        C.skip(t.label, ARITHMETIC, f"per-sample {name}", "not implemented in the audit: NOT checked")

