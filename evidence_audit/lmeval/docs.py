"""Arithmetic-level checks of which documents were logged: doc_ids, counts, hashes, question groups.

Every release read (0.4.5 to 0.4.13) iterates a task's documents in dataset order. From 0.4.9 on, with
`--samples`, it labels the k-th document iterated with the k-th doc_id of the list as given (versions.py
samples_doc_id "position": evaluator.py doc_id_true = indices[doc_id], while task.doc_iterator keeps dataset
order). A samples file whose doc_ids are not increasing within a filter therefore holds mislabelled samples: the
line at position k holds the document of the k-th smallest logged doc_id. This follows from the run alone; the
identity level (--data) confirms each by content. Releases before 0.4.9 have no --samples: out-of-order doc_ids
there are not lm-eval's output at all.

n-samples.effective differs in meaning (versions.py n_samples_effective): "limit" releases (to 0.4.11) record
min(limit, original) whatever --samples selected; "scored-last" / "scored-max" releases (0.4.12 on) record the
number of values the task's metrics had, i.e. the documents scored (0.4.12: the last (metric, filter) aggregated;
0.4.13: the largest), and write the same number as results.<task>.sample_len. The count rows check each
release's own rule.
"""
import json

from evidence_audit.checks import ARITHMETIC, expect
from evidence_audit.lmeval.task import group_of
from evidence_audit.reading import Unreadable, sha256_text


def doc_id_rows(C, t):
    """Rows: doc_ids (duplicates, out of range, one line per document and filter), doc_id order (mislabelling),
    sample count vs n-samples and the recorded limit."""
    bad, order_bad, n_orig = [], [], t.n_samples["original"]
    filters = t.by_filter()
    ids_by_filter = {f: [s.doc_id for s in ss] for f, ss in filters.items()}
    # what the position says, and what it may mean: only --data (the identity level) shows whose document it is
    why = ("lm-eval iterates documents in dataset order: with unsorted --samples this line holds that document "
           "mislabelled, else the lines were moved; --data tells which") \
        if t.fact("samples_doc_id") == "position" else \
        f"lm-eval {t.release.name if t.release else '0.4.9.2'} has no --samples and logs documents in dataset order"
    for f, ss in filters.items():
        seen = set()
        for s in ss:
            if s.doc_id in seen:
                bad.append(f"{s.where} doc_id: duplicated")
            seen.add(s.doc_id)
            if not 0 <= s.doc_id < n_orig:
                bad.append(f"{s.where} doc_id: out of range (n-samples.original {n_orig})")
        ids = ids_by_filter[f]
        order_bad += [f"{s.where} doc_id: out of lm-eval's logging order, which puts doc_id {true} here ({why})"
                      for s, true in zip(ss, sorted(ids)) if s.doc_id != true]
    first = next(iter(ids_by_filter.values()), [])
    for f, ids in ids_by_filter.items():
        if sorted(ids) != sorted(first):
            bad.append(f"filter {f}: logs doc_ids {short_set(set(ids) ^ set(first))} that another filter does not")
    C.add(t.label, ARITHMETIC, "doc_ids: no duplicate, in range, same documents under every filter", len(t.samples),
          bad)
    C.add(t.label, ARITHMETIC, "doc_ids in lm-eval's logging order (unsorted --samples mislabels samples)",
          len(t.samples), order_bad)
    count_row(C, t, first)


def short_set(ids):
    ids = sorted(ids)
    return str(ids[:10])[:-1] + (", …]" if len(ids) > 10 else "]")


def scored_count(t):
    """n-samples.effective as a "scored-last" / "scored-max" release computes it from what it logged: the number of
    values of each (metric, filter) in the order lm-eval first aggregates them (filter by filter, each document's
    metrics in order); 0.4.12 keeps the last one's count, 0.4.13 the largest (versions.py n_samples_effective)."""
    counts = {}
    for s in t.samples:
        for m in s.raw["metrics"]:
            counts[(m, s.raw["filter"])] = counts.get((m, s.raw["filter"]), 0) + 1
    if not counts:
        return 0
    return list(counts.values())[-1] if t.fact("n_samples_effective") == "scored-last" else max(counts.values())


def effective_rule(t, whole):
    """(the n-samples.effective this release records, why): `whole` = what a "limit" release records."""
    if t.fact("n_samples_effective").startswith("scored"):
        return scored_count(t), f"the documents scored (lm-eval {t.release.name}: the metrics' count of values)"
    return whole, None


def sample_len_row(C, t):
    """0.4.12 on: results.<task>.sample_len is the count n-samples.effective holds (evaluator_utils.py)."""
    if "sample_len" not in (t.extras or {}):
        return []
    bad = []
    expect(bad, f"results.{t.name}", "sample_len", t.extras["sample_len"], t.n_samples["effective"],
           "n-samples.effective: the same count")
    if t.extras.get("name", t.name) != t.name:
        bad.append(f"results.{t.name}.name: {t.extras['name']!r}, expected the task's name {t.name!r}")
    return bad


def selection_row(C, t, ids):
    """The count row of a run made with `--samples` (the selection the user passed, t.selection): lm-eval 0.4.9 on
    iterates the selected documents that exist (0 <= id < original), each once, in dataset order, labels the k-th
    with the k-th id of the list as given, and records n-samples.effective as the whole split (to 0.4.11) or as
    the documents scored (0.4.12 on)."""
    bad, ns, sel = [], t.n_samples, t.selection
    iterated = sorted({i for i in sel if 0 <= i < ns["original"]})
    labels = sel[:len(iterated)]
    if t.fact("n_samples_effective").startswith("scored"):
        expect(bad, "n-samples", "effective", ns["effective"], len(iterated),
               f"lm-eval {t.release.name} records the documents scored: the selection's")
    else:
        expect(bad, "n-samples", "effective", ns["effective"], ns["original"],
               "a --samples run records the whole split as effective")
    bad += sample_len_row(C, t)
    if len(iterated) < len(sel):
        bad.append(f"--samples {t.name}: {len(sel) - len(iterated)} id(s) repeated or outside 0..{ns['original'] - 1}: "
                   "lm-eval logs the other documents under shifted ids")
    for f, ss in t.by_filter().items():
        if len(ss) != len(iterated):
            bad.append(f"filter {f}: {len(ss)} samples logged, the --samples selection has {len(iterated)} documents")
    missing, extra = sorted(set(labels) - set(ids)), sorted(set(ids) - set(labels))
    if missing:
        bad.append(f"doc_ids {short_set(missing)}: selected by --samples, not logged")
    if extra:
        bad.append(f"doc_ids {short_set(extra)}: logged, not selected by --samples")
    C.add(t.label, ARITHMETIC, "sample count vs the --samples selection", len(ids), bad,
          note=f"{len(iterated)} selected documents")


def count_row(C, t, ids):
    """Samples per filter against n-samples.effective (= min(limit, original); in a "scored" release also the
    documents scored) and the recorded limit; without a limit, against 0..effective-1. A run made with --samples
    logs fewer and no release records the selection: given the selection (audit.py --samples), selection_row checks
    against it instead; without it this row FAILs naming the likely cause. A selection given for a release without
    --samples (before 0.4.9) is refused (Unreadable)."""
    if t.selection is not None:
        if not t.fact("samples_option"):
            raise Unreadable(f"--samples {t.name}: lm-eval {t.release.name} has no --samples option (it came with "
                             f"0.4.9), so {t.path.name} is not a --samples run; audit it without --samples")
        selection_row(C, t, ids)
        return
    bad, ns, limit = [], t.n_samples, t.limit
    expected_eff = min(int(limit), ns["original"]) if isinstance(limit, (int, float)) and limit else ns["original"]
    if isinstance(limit, float) and 0 < limit < 1:
        expected_eff = None                       # a fractional limit: lm-eval takes ceil(limit * n) — not checked
    if expected_eff is not None:
        expect(bad, "n-samples", "effective", ns["effective"], expected_eff, f"min(limit {limit}, original)"
               + ("; a --samples run records fewer: pass its selection to audit.py --samples"
                  if t.fact("n_samples_effective").startswith("scored") and ns["effective"] < expected_eff else ""))
    scored, why_scored = effective_rule(t, ns["effective"])
    if why_scored:
        expect(bad, "n-samples", "effective", ns["effective"], scored, why_scored)
    bad += sample_len_row(C, t)
    name = t.release.name if t.release else "0.4.9.2"
    for f, ss in t.by_filter().items():
        if len(ss) != ns["effective"]:
            why = f"a sample deleted, or a --samples run, which {name} does not record: pass its selection to " \
                  "audit.py --samples" \
                if len(ss) < ns["effective"] and t.fact("samples_option") else \
                "a sample deleted" if len(ss) < ns["effective"] else "extra samples"
            bad.append(f"filter {f}: {len(ss)} samples logged, n-samples.effective {ns['effective']} ({why})")
    if limit:
        missing = sorted(set(range(ns["effective"])) - set(ids))
        if missing:
            bad.append(f"doc_ids {short_set(missing)}: missing (a limit logs the first {ns['effective']} documents)")
    C.add(t.label, ARITHMETIC, "sample count vs n-samples and limit", len(ids), bad)


def doc_hash(doc):
    """evaluator.py: hash_string(json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False)),
    hash_string being the sha256 hex digest of the UTF-8 bytes."""
    return sha256_text(json.dumps(doc, indent=2, ensure_ascii=False))


def hash_rows(C, t, results):
    """Rows: each sample's doc_hash, prompt_hash (the first request's context) and target_hash (its target
    string) recomputed; the results file's task_hashes entry (sha256 of every sample's three hashes concatenated,
    in file order) recomputed."""
    bad = []
    for s in t.samples:
        r = s.raw
        expect(bad, s.where, "doc_hash", r["doc_hash"], doc_hash(r["doc"]), "sha256 of json.dumps(doc, indent=2)")
        expect(bad, s.where, "prompt_hash", r["prompt_hash"], sha256_text(s.requests[0][0]), "sha256 of the context")
        expect(bad, s.where, "target_hash", r["target_hash"], sha256_text(r["target"]), "sha256 of the target")
    C.add(t.label, ARITHMETIC, "doc_hash, prompt_hash, target_hash recomputed", len(t.samples), bad)
    bad = []
    whole = sha256_text("".join(s.raw["doc_hash"] + s.raw["prompt_hash"] + s.raw["target_hash"] for s in t.samples))
    expect(bad, results.name, f"task_hashes.{t.name}", results.data["task_hashes"].get(t.name), whole,
           "sha256 of every sample's doc/prompt/target hashes in file order: a sample deleted, added or moved")
    C.add(t.label, ARITHMETIC, "task_hashes (results) recomputed from the samples", len(t.samples), bad)


def group_row(C, t):
    """Row "limit vs question groups (run alone)": for documents that are parts of (sentence, question) groups, a
    limit below the split's size may cut the last group; the run alone cannot see the document after the cut, so
    the row is SKIPPED naming the group, and the identity level (--data) decides."""
    check = "limit vs question groups (run alone)"
    if not t.grouped():
        C.skip(t.label, ARITHMETIC, check, "documents are not parts of (sentence, question) groups", requested=False)
        return
    ns = t.n_samples
    if not t.limit or ns["effective"] >= ns["original"]:
        C.add(t.label, ARITHMETIC, check, len(t.samples), [], note="no limit below the split's size: no group cut")
        return
    last = max(t.samples, key=lambda s: s.doc_id)
    C.skip(t.label, ARITHMETIC, check, f"limit {t.limit} < {ns['original']} documents: the last logged group "
                                       f"({group_of(last.raw['doc'])[1]}) may continue after the cut; "
                                       "--tokens --data FILE decides", requested=False)     # the identity row's
