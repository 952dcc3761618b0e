"""The extraction experiment's human review (audit.py --review SHEET): import a review sheet exported by
O/private/extraction/review.html, refuse it with every blank field and every binding mismatch, else compute the
descriptive figures of the pre-registered sample.

The figures are computed over the decidable items (final stance positive/negative) with an undisputed reference:
disagreement = [regex correct (R) != human content_correct (H)]; false positive = R right, H wrong; false negative =
the reverse. The class-weighted estimate (weights N_c/n_c, population over sample per class) exists only when every
sampled item is decidable: otherwise it is null, by the pre-registered rule.
"""
import sys
from datetime import datetime

from evidence_audit.checks import ARITHMETIC, MISSING, expect, get
from evidence_audit.reading import read_json, sha256_file

EXT_SHEET_FORMAT = "extraction-review-sheet/v1"
EXT_STANCES = ("positive", "negative", "uncertain", "no_conclusion")
EXT_REVIEW_KEYS = ("sheet", "n_reviewed", "n_decidable_undisputed", "disagreement_rate", "false_positives",
                   "false_negatives", "weighted_disagreement_rate")
YES_NO_ANSWERS = ("content_correct", "format_compliant", "reference_disputed")
REVIEW_CHECK = "human review sheet (--review)"


def review_check(C, name, sheet, cfg, records):
    """Row "human review sheet (--review)...": SKIPPED without a sheet, FAIL when the evidence did not pass the
    arithmetic level (records None) or the sheet is refused. Returns the human_review figures for audit.json."""
    if sheet is None:
        C.skip(name, ARITHMETIC, REVIEW_CHECK, "no sheet given; human-review figures are null", requested=False)
        return {**{k: None for k in EXT_REVIEW_KEYS},
                "note": "no sheet given (--review SHEET): figures are null, not estimated"}
    if records is None:
        C.add(name, ARITHMETIC, REVIEW_CHECK, 0,
              [f"{sheet}: the evidence it refers to did not pass the arithmetic level"])
        return {**{k: None for k in EXT_REVIEW_KEYS}, "sheet": str(sheet), "refused": True}
    figures, problems = ext_review(sheet, cfg, records)
    C.add(name, ARITHMETIC, f"{REVIEW_CHECK}: complete and bound to this sample", figures.get("n_reviewed") or 0,
          [f"{sheet} refused: {p}" for p in problems])
    return figures


def ext_review(sheet_path, cfg, records):
    """Import a review sheet. Returns (figures, problems): problems lists every missing field or binding mismatch;
    figures are computed only when there are none (otherwise every figure is null)."""
    null = {**{k: None for k in EXT_REVIEW_KEYS}, "sheet": str(sheet_path)}
    sheet = read_json(sheet_path)
    if not isinstance(sheet, dict):
        return {**null, "refused": True}, [f"{sheet_path}: not a JSON object"]
    prereg = get(cfg, "audit_sample.preregistration")
    sample = prereg.get("items", []) if isinstance(prereg, dict) else []
    by_idx = {r["idx"]: r for r in records}
    problems, items = binding_problems(sheet, cfg, sample, by_idx)
    missing = reviewer_blanks(sheet) + answer_blanks(sample, items)
    if problems or missing:
        return {**null, "refused": True, "missing_fields": missing, "binding_problems": problems}, problems + missing
    return review_figures(sheet_path, sheet, get(cfg, "config.extraction_labels"), sample, items, records), []


def item_where(s):
    return f"position {s.get('position')} (idx {s.get('idx')})"


def binding_problems(sheet, cfg, sample, by_idx):
    """The sheet belongs to this pre-registered sample and run: format, pre-registration hash, one item per sampled
    item in order, and for each the sentence and the answer (generation) the reviewer saw. Returns (problems, the
    sheet's items; [] when their number is wrong)."""
    problems = []
    expect(problems, "sheet", "sheet_format", sheet.get("sheet_format", MISSING), EXT_SHEET_FORMAT)
    expect(problems, "sheet", "preregistration_sha256", sheet.get("preregistration_sha256", MISSING),
           get(cfg, "audit_sample.preregistration_sha256"), "the sheet must belong to this pre-registered sample")
    items = sheet.get("items")
    if not isinstance(items, list) or len(items) != len(sample):
        problems.append(f"sheet items: {len(items) if isinstance(items, list) else 'no'} items, the sample has "
                        f"{len(sample)}")
        return problems, []
    for s, it in zip(sample, items):
        w = item_where(s)
        if not isinstance(it, dict):
            problems.append(f"{w}: not a JSON object")
            continue
        expect(problems, w, "idx", it.get("idx", MISSING), s.get("idx"))
        expect(problems, w, "position", it.get("position", MISSING), s.get("position"))
        r = by_idx.get(s.get("idx"))
        if r is not None:
            expect(problems, w, "sentence_sha256", it.get("sentence_sha256", MISSING), r["sentence_sha256"])
            expect(problems, w, "answer_sha256", it.get("answer_sha256", MISSING), r["generation_sha256"],
                   "the answer the reviewer saw must be this run's generation")
    return problems, items


def reviewer_blanks(sheet):
    """The reviewer's name and an ISO 8601 review time."""
    missing = []
    rv = sheet.get("reviewer") if isinstance(sheet.get("reviewer"), dict) else {}
    if not (isinstance(rv.get("name"), str) and rv["name"].strip()):
        missing.append("reviewer.name: blank")
    t = rv.get("time")
    if not (isinstance(t, str) and t.strip()):
        missing.append("reviewer.time: blank")
    else:
        try:
            datetime.fromisoformat(t.strip())
        except ValueError:
            missing.append(f"reviewer.time: {t!r} is not an ISO 8601 date-time")
    return missing


def answer_blanks(sample, items):
    """Every answer of every item: a final stance, the three yes/no answers and a reason."""
    missing = []
    for s, it in zip(sample, items):
        if not isinstance(it, dict):
            continue            # named by binding_problems
        w = item_where(s)
        stance = it.get("final_stance")
        if stance not in EXT_STANCES:
            missing.append(f"{w} final_stance: " + ("blank" if stance in (None, "")
                                                    else f"{stance!r} is not one of {EXT_STANCES}"))
        for k in YES_NO_ANSWERS:
            if not isinstance(it.get(k), bool):
                missing.append(f"{w} {k}: " + ("blank" if it.get(k) is None else f"{it.get(k)!r} is not true/false"))
        if not (isinstance(it.get("reason"), str) and it["reason"].strip()):
            missing.append(f"{w} reason: blank")
    return missing


# ---- the figures of a complete sheet -------------------------------------------------------------------------------

def review_rows(sample, items, by_idx, labels):
    """One row per sampled item: the run's scores next to the reviewer's answers."""
    rows = []
    for s, it in zip(sample, items):
        r = by_idx[s["idx"]]
        rows.append({"position": s["position"], "idx": s["idx"], "label": r["label"], "label_name": r["label_name"],
                     "R": r["regex"]["correct"], "H": int(it["content_correct"]), "stance": it["final_stance"],
                     "regex_pred": r["regex"]["pred"], "exact": r["exact"]["correct"], "strict": r["strict"]["correct"],
                     "strict_format_ok": r["strict"]["format_ok"], "format_compliant": int(it["format_compliant"]),
                     "disputed": it["reference_disputed"],
                     "decidable": it["final_stance"] in labels and not it["reference_disputed"]})
    return rows


def class_table(rows, records):
    """Per class (label): population (scored items), sampled, decidable, and the decidable items' disagreements,
    false positives and false negatives."""
    pop = {}
    for r in records:
        pop[r["label"]] = pop.get(r["label"], 0) + 1
    table = {}
    for c in sorted({x["label"] for x in rows}):
        dc = [x for x in rows if x["label"] == c and x["decidable"]]
        table[str(c)] = {"population": pop.get(c, 0), "sampled": sum(x["label"] == c for x in rows),
                         "decidable": len(dc), "disagreements": sum(x["R"] != x["H"] for x in dc),
                         "false_positives": sum(x["R"] == 1 and x["H"] == 0 for x in dc),
                         "false_negatives": sum(x["R"] == 0 and x["H"] == 1 for x in dc)}
    return table


def weighted_estimate(per_class, n_decidable, n_undecidable, n_population):
    """(estimate, its disagreement rate, why null): the class-weighted counts over the population, only when every
    sampled item is decidable."""
    if not (n_decidable > 0 and all(v["decidable"] == v["sampled"] for v in per_class.values())):
        return None, None, (f"null by the pre-registered rule: {n_undecidable} sampled item(s) are undecidable or "
                            "have a disputed reference")
    w = {c: v["population"] / v["sampled"] for c, v in per_class.items()}
    est = {"weights": {c: f"{v['population']}/{v['sampled']}" for c, v in per_class.items()},
           **{k: sum(w[c] * v[k] for c, v in per_class.items())
              for k in ("disagreements", "false_positives", "false_negatives")},
           "population": n_population}
    est["disagreement_rate"] = est["disagreements"] / n_population
    return est, est["disagreement_rate"], None


def inconsistent_answers(rows, labels):
    """Items whose content_correct contradicts the reviewer's own stance against the reference label."""
    return [f"position {x['position']} (idx {x['idx']}): stance {x['stance']!r}, label {x['label_name']!r}, "
            f"content_correct {bool(x['H'])}" for x in rows
            if (x["stance"] in labels and x["H"] != int(x["stance"] == x["label_name"]))
            or (x["stance"] not in labels and x["H"] == 1)]


def review_figures(sheet_path, sheet, labels, sample, items, records):
    """The human-review figures of a complete, bound sheet (descriptive, on the pre-registered sample)."""
    rows = review_rows(sample, items, {r["idx"]: r for r in records}, labels)
    D = [x for x in rows if x["decidable"]]
    n_d = len(D)
    dis = [x for x in D if x["R"] != x["H"]]
    fp = [x for x in D if x["R"] == 1 and x["H"] == 0]
    fn = [x for x in D if x["R"] == 0 and x["H"] == 1]
    per_class = class_table(rows, records)
    est, weighted_rate, weighted_note = weighted_estimate(per_class, n_d, len(rows) - n_d, len(records))
    return {
        "sheet": str(sheet_path), "sheet_sha256": sha256_file(sheet_path), "refused": False,
        "reviewer": {"name": sheet["reviewer"]["name"], "time": sheet["reviewer"]["time"]},
        "n_reviewed": len(rows), "n_decidable_undisputed": n_d,
        "excluded": [{"position": x["position"], "idx": x["idx"],
                      "why": "reference disputed" if x["disputed"] else f"stance {x['stance']}"}
                     for x in rows if not x["decidable"]],
        "disagreement_rate": len(dis) / n_d if n_d else None, "disagreements": len(dis),
        "disagreement_idx": [x["idx"] for x in dis],
        "false_positives": len(fp), "false_positive_idx": [x["idx"] for x in fp],
        "false_negatives": len(fn), "false_negative_idx": [x["idx"] for x in fn],
        "stance_agreement": {"n": n_d, "regex_pred_equals_stance": sum(x["regex_pred"] == x["stance"] for x in D)},
        "per_class": per_class,
        "weighted_disagreement_rate": weighted_rate, "weighted_estimate": est, "weighted_note": weighted_note,
        "other_scorers_vs_human": {s: {"disagreements": sum(x[s] != x["H"] for x in D), "n": n_d}
                                   for s in ("exact", "strict")},
        "format_agreement": {"n": len(rows), "strict_format_ok_equals_human": sum(
            x["strict_format_ok"] == x["format_compliant"] for x in rows)},
        "inconsistent_content_correct": inconsistent_answers(rows, labels),
        "scope": "descriptive figures on the pre-registered sample; the extractor is the regex scorer (R), the "
                 "human judgement is content_correct (H)",
    }


# ---- the console ---------------------------------------------------------------------------------------------------

def print_review(report, sheet, stream=sys.stdout):
    """After the report: the human-review figures of --review SHEET, or every reason the sheet was refused."""
    hr = get(report, "details.extraction.human_review")
    if not isinstance(hr, dict):
        print(f"review: no extraction evidence audited here, so {sheet} was not read", file=stream)
        report["exit_code"] = 1
        return
    if hr.get("refused"):
        print(f"review: {sheet} REFUSED; human-review figures stay null. Missing or invalid:", file=stream)
        for p in hr.get("binding_problems", []) + hr.get("missing_fields", []):
            print(f"  - {p}", file=stream)
        return
    est = hr["weighted_estimate"]
    rate = "null (no decidable item)" if hr["disagreement_rate"] is None else \
        f"{hr['disagreements']}/{hr['n_decidable_undisputed']} = {hr['disagreement_rate']:.4f}"
    print(f"review: {hr['n_reviewed']} items reviewed by {hr['reviewer']['name']!r} ({hr['reviewer']['time']}); "
          f"{hr['n_decidable_undisputed']} decidable with an undisputed reference", file=stream)
    print(f"  regex extractor vs human: disagreement {rate}; false positives {hr['false_positives']}, false "
          f"negatives {hr['false_negatives']}", file=stream)
    print("  class-weighted estimate over the scored items: " + (
        f"{est['disagreements']:.3f} disagreements of {est['population']} (rate {est['disagreement_rate']:.4f}; "
        f"weights {est['weights']})" if est else hr["weighted_note"]), file=stream)
    if hr["inconsistent_content_correct"]:
        print(f"  note: content_correct inconsistent with stance vs label on {len(hr['inconsistent_content_correct'])}"
              " item(s): " + "; ".join(hr["inconsistent_content_correct"]), file=stream)
