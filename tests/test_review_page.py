"""The extraction review page: self-contained, no scores, blank fields; export / import round trip in headless
Chromium (selenium + Debian's chromium and chromium-driver); audit.py refuses a partly blank sheet and computes the
figures from a complete one."""
import hashlib
import json
import re
import shutil
import time

import pytest

from evidence_audit.rules.extraction import EXT_REVIEW_KEYS, ext_review
from experiments.review_page import ITEM_KEYS, SHEET_FORMAT, build_review_page

PREREG_SHA = "ab" * 32
LABELS = ["negative", "positive"]


def sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


ITEMS = [
    # position, idx, label, sentence, answer, finish
    (1, 17, 0, "A tedious </script><b>mess</b> & a waste of time.", '{"sentiment": "negative"}', "eos"),
    (2, 4, 1, "Warm, funny and wise \u2014 caf\u00e9 society at its best.", "The sentiment is positive.", "eos"),
    (3, 9, 0, "Not positive at all.", "```json\n{\"sentiment\": \"positive\",\n  \"rating\": 3,\n  \"outcome\"",
     "length"),
]


def page_items():
    return [{"position": p, "idx": i, "label_name": LABELS[l], "sentence": s, "answer": a, "finish_reason": f,
             "generated_tokens": 32 if f == "length" else 9, "sentence_sha256": sha(s), "answer_sha256": sha(a)}
            for p, i, l, s, a, f in ITEMS]


def page_meta(split="dev"):
    return {"experiment": "extraction", "split": split, "preregistration_sha256": PREREG_SHA, "max_new_tokens": 32,
            "labels": LABELS}


def write_page(tmp_path, items=None):
    page = build_review_page(items or page_items(), page_meta())
    path = tmp_path / "review.html"
    path.write_text(page, encoding="utf-8")
    return path, page


def synthetic_evidence():
    """config.json / records.jsonl content that the page's items belong to (for the audit's ext_review)."""
    regex_correct = {17: 1, 4: 1, 9: 0}
    regex_pred = {17: "negative", 4: "positive", 9: "positive"}
    records = []
    for p, i, l, s, a, f in ITEMS:
        records.append({"idx": i, "label": l, "label_name": LABELS[l], "sentence_sha256": sha(s),
                        "generation_sha256": sha(a), "exact": {"correct": int(p == 1)},
                        "strict": {"correct": int(p == 1), "format_ok": int(p == 1)},
                        "regex": {"correct": regex_correct[i], "pred": regex_pred[i]}})
    sample = [{"position": p, "idx": i, "label": l} for p, i, l, *_ in ITEMS]
    cfg = {"config": {"extraction_labels": LABELS},
           "audit_sample": {"preregistration_sha256": PREREG_SHA, "preregistration": {"items": sample}}}
    return cfg, records


# ---- static properties -----------------------------------------------------------------------------------------

def test_page_is_self_contained_and_shows_no_scores(tmp_path):
    _, page = write_page(tmp_path)
    assert not re.search(r"(?i)\b(src|href)\s*=\s*['\"]?(https?:|//)", page)
    assert "http://" not in page and "https://" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    data = json.loads(re.search(r'<script type="application/json" id="review-data">(.*?)</script>', page,
                                re.S).group(1))
    assert [set(it) for it in data["items"]] == [set(ITEM_KEYS)] * 3        # no score, no prediction, no category
    assert data["items"][0]["sentence"] == ITEMS[0][3]                    # escaped on the way in, exact on the way out
    assert "</script><b>" not in page.split('id="review-data">', 1)[1].split("</script>", 1)[0]
    with pytest.raises(ValueError):
        build_review_page([{**page_items()[0], "regex_correct": 1}], {"experiment": "x", "split": "dev",
                          "preregistration_sha256": PREREG_SHA, "max_new_tokens": 32, "labels": LABELS})


def review_data(page):
    blocks = re.findall(r'<script type="application/json" id="review-data">(.*?)</script>', page, re.S)
    assert len(blocks) == 1
    return json.loads(blocks[0])


# Every placeholder the page has ever used, Jinja2 syntax, and HTML that would end the data block.
HOSTILE = ("__TITLE__ __DATA__ __STANCES__ {{ title }} {{ data_json }} {{ stances_json }} {% raw %} {# c #} "
           "{% endraw %} </script><script>alert(1)</script> <!-- <b>bold</b> &amp; &lt; \u2028 ${DATA}")


def test_answers_with_placeholders_and_html_stay_data(tmp_path):
    """The page is filled in one pass: what an answer or a review contains is never read as template text."""
    hostile = [{**it, "answer": HOSTILE + it["answer"], "sentence": HOSTILE, "answer_sha256": sha(HOSTILE)}
               for it in page_items()]
    _, plain_page = write_page(tmp_path)
    _, page = write_page(tmp_path, hostile)
    assert review_data(page)["items"] == hostile                        # the exact text, back out of the JSON
    data_block = re.compile(r'(id="review-data">).*?(</script>)', re.S)
    assert data_block.sub(r"\1\2", page) == data_block.sub(r"\1\2", plain_page)  # nothing else moved
    assert "<script>alert(1)" not in page and page.count("<script") == 3
    assert page.count("<title>Extraction review: 3 pre-registered items (dev)</title>") == 1


def test_title_is_html_escaped():
    page = build_review_page(page_items(), page_meta(split="<i>dev</i> & co"))
    assert "<title>Extraction review: 3 pre-registered items (&lt;i&gt;dev&lt;/i&gt; &amp; co)</title>" in page
    assert "<i>dev" not in page


# ---- the sheet in audit.py ---------------------------------------------------------------------------------------

def blank_sheet():
    return {"sheet_format": SHEET_FORMAT, "experiment": "extraction", "split": "dev",
            "preregistration_sha256": PREREG_SHA, "sample_idx": [i for _, i, *_ in ITEMS],
            "reviewer": {"name": "", "time": ""}, "exported_at": "2026-10-10T10:00:00Z",
            "items": [{"position": p, "idx": i, "label_name": LABELS[l], "sentence_sha256": sha(s),
                       "answer_sha256": sha(a), "final_stance": None, "content_correct": None,
                       "format_compliant": None, "reference_disputed": None, "reason": ""}
                      for p, i, l, s, a, f in ITEMS]}


def test_audit_refuses_blank_sheet_with_every_missing_field(tmp_path):
    cfg, records = synthetic_evidence()
    p = tmp_path / "sheet.json"
    p.write_text(json.dumps(blank_sheet()))
    figures, problems = ext_review(p, cfg, records)
    assert figures["refused"] is True
    assert all(figures[k] is None for k in EXT_REVIEW_KEYS if k != "sheet")
    assert len(problems) == 2 + 3 * 5                     # reviewer name + time, five fields per item
    assert "reviewer.name: blank" in problems
    assert "position 3 (idx 9) reason: blank" in problems
    assert "position 1 (idx 17) final_stance: blank" in problems


def test_audit_refuses_sheet_of_another_sample(tmp_path):
    cfg, records = synthetic_evidence()
    sheet = blank_sheet()
    sheet["preregistration_sha256"] = "cd" * 32
    sheet["items"][1]["answer_sha256"] = "0" * 64
    p = tmp_path / "sheet.json"
    p.write_text(json.dumps(sheet))
    figures, problems = ext_review(p, cfg, records)
    assert figures["refused"] and any("preregistration_sha256" in x for x in problems)
    assert any("position 2 (idx 4) answer_sha256" in x for x in problems)


# ---- the browser round trip ----------------------------------------------------------------------------------------

def chromium():
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        pytest.skip("chromium / chromedriver not installed (apt-get install -y chromium chromium-driver)")
    return browser, driver


@pytest.fixture
def browser(tmp_path):
    browser_bin, driver_bin = chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser_bin
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        opts.add_argument(flag)
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False,
                                           "profile.default_content_setting_values.automatic_downloads": 1})
    drv = webdriver.Chrome(service=Service(executable_path=driver_bin), options=opts)
    drv.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    try:
        yield drv, downloads
    finally:
        drv.quit()


def wait_for(cond, timeout=20.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def wait_download(downloads, dest):
    """The one exported file, moved out of the download directory to `dest` (Chrome overwrites a download of the
    same name, so each export is taken away before the next one)."""
    def ready():
        files = [p for p in downloads.iterdir() if p.suffix == ".json"]
        if len(files) != 1 or list(downloads.glob("*.crdownload")):
            return None
        try:
            return files[0], json.loads(files[0].read_text(encoding="utf-8"))
        except ValueError:
            return None                                         # still being written
    path, sheet = wait_for(ready, what=f"the exported sheet in {downloads}")
    assert path.name == f"extraction-review-sheet-{PREREG_SHA[:12]}.json"
    shutil.move(path, dest)
    return dest, sheet


def field_state(drv):
    """Every form value on the page: {item-id: value} for checked radios, text areas and reviewer inputs."""
    return drv.execute_script("""
        const out = {};
        for (const r of document.querySelectorAll('input[type=radio]')) if (r.checked) out[r.name] = r.value;
        for (const t of document.querySelectorAll('textarea')) out[t.id] = t.value;
        out['reviewer-name'] = document.getElementById('reviewer-name').value;
        out['reviewer-time'] = document.getElementById('reviewer-time').value;
        return out;""")


FILL = {1: {"final_stance": "negative", "content_correct": "yes", "format_compliant": "yes",
            "reference_disputed": "no", "reason": "Clear JSON answer, negative."},
        2: {"final_stance": "positive", "content_correct": "yes", "format_compliant": "no",
            "reference_disputed": "no", "reason": "Sentence, not JSON; says positive \u2014 \"clearly\"."}}


def fill_item(drv, pos, values):
    from selenium.webdriver.common.by import By

    for field in ("final_stance", "content_correct", "format_compliant", "reference_disputed"):
        drv.find_element(By.ID, f"item-{pos}-{field}-{values[field]}").click()
    drv.find_element(By.ID, f"item-{pos}-reason").send_keys(values["reason"])


@pytest.mark.slow
def test_review_page_round_trip_in_chromium(tmp_path, browser):
    from selenium.webdriver.common.by import By

    drv, downloads = browser
    path, _ = write_page(tmp_path)
    drv.get(path.as_uri())
    blank = {"item-1-reason": "", "item-2-reason": "", "item-3-reason": "", "reviewer-name": "", "reviewer-time": ""}
    assert field_state(drv) == blank                                           # every field starts blank
    body = drv.find_element(By.TAG_NAME, "body").text
    assert ITEMS[0][3] in body and "(idx 9)" in body and "length: stopped at the 32-token limit" in body
    assert drv.find_element(By.ID, "item-3-answer").text.startswith("```json")
    assert "Incomplete" in drv.find_element(By.ID, "progress").text

    fill_item(drv, 1, FILL[1])
    fill_item(drv, 2, FILL[2])
    drv.find_element(By.ID, "reviewer-name").send_keys("Test Reviewer")
    drv.find_element(By.ID, "reviewer-time-now").click()
    drv.find_element(By.ID, "export").click()
    first, sheet = wait_download(downloads, tmp_path / "sheet-1.json")
    assert "INCOMPLETE" in drv.find_element(By.ID, "status").text

    # the exported JSON: bound to the sample, two items filled exactly as entered, the third blank
    assert sheet["sheet_format"] == SHEET_FORMAT and sheet["preregistration_sha256"] == PREREG_SHA
    assert sheet["sample_idx"] == [17, 4, 9] and [it["idx"] for it in sheet["items"]] == [17, 4, 9]
    assert sheet["reviewer"]["name"] == "Test Reviewer"
    from datetime import datetime
    datetime.fromisoformat(sheet["reviewer"]["time"])
    for pos, values in FILL.items():
        it = sheet["items"][pos - 1]
        assert it["final_stance"] == values["final_stance"] and it["reason"] == values["reason"]
        assert it["content_correct"] is (values["content_correct"] == "yes")
        assert it["format_compliant"] is (values["format_compliant"] == "yes")
        assert it["reference_disputed"] is False
        assert it["answer_sha256"] == sha(ITEMS[pos - 1][4]) and it["sentence_sha256"] == sha(ITEMS[pos - 1][3])
    assert {k: sheet["items"][2][k] for k in ("final_stance", "content_correct", "format_compliant",
                                              "reference_disputed", "reason")} == {
        "final_stance": None, "content_correct": None, "format_compliant": None, "reference_disputed": None,
        "reason": ""}

    # audit.py refuses the partly blank sheet, naming exactly the missing fields of item 3
    cfg, records = synthetic_evidence()
    figures, problems = ext_review(first, cfg, records)
    assert figures["refused"] and figures["disagreement_rate"] is None
    assert problems == [f"position 3 (idx 9) {f}: blank" for f in ("final_stance", "content_correct",
                                                                   "format_compliant", "reference_disputed",
                                                                   "reason")]

    # a fresh page is blank again; importing the file restores every field
    drv.get(path.as_uri())
    assert field_state(drv) == blank
    drv.find_element(By.ID, "import-file").send_keys(str(first))
    wait_for(lambda: "Imported" in drv.find_element(By.ID, "status").text, what="the import")
    filled = field_state(drv)
    assert filled["item-1-final_stance"] == "negative" and filled["item-2-format_compliant"] == "no"
    assert filled["item-2-reason"] == FILL[2]["reason"] and filled["reviewer-name"] == "Test Reviewer"
    assert "item-3-final_stance" not in filled and filled["item-3-reason"] == ""

    # complete item 3 (a disputed reference, so it is excluded from the figures), export, audit computes
    fill_item(drv, 3, {"final_stance": "positive", "content_correct": "no", "format_compliant": "no",
                       "reference_disputed": "yes", "reason": "Cut off; 'Not positive at all' may be mislabelled."})
    wait_for(lambda: "Complete" in drv.find_element(By.ID, "progress").text, what="progress: complete")
    drv.find_element(By.ID, "export").click()
    second, sheet2 = wait_download(downloads, tmp_path / "sheet-2.json")
    assert sheet2["reviewer"] == sheet["reviewer"]
    assert sheet2["items"][:2] == sheet["items"][:2]                          # the round trip changed nothing
    figures, problems = ext_review(second, cfg, records)
    assert problems == [] and figures["refused"] is False
    assert figures["n_reviewed"] == 3 and figures["n_decidable_undisputed"] == 2
    assert figures["disagreement_rate"] == 0.0 and figures["false_positives"] == 0
    assert figures["excluded"] == [{"position": 3, "idx": 9, "why": "reference disputed"}]
    assert figures["weighted_disagreement_rate"] is None and "pre-registered rule" in figures["weighted_note"]

    # a sheet for another sample is refused by the page and leaves the form unchanged
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**sheet2, "preregistration_sha256": "cd" * 32}))
    before = field_state(drv)
    drv.find_element(By.ID, "import-file").send_keys(str(other))
    wait_for(lambda: "refused" in drv.find_element(By.ID, "status").text, what="the refusal")
    assert field_state(drv) == before


def progress_counts(text):
    """(fields, entries) the progress line announces, after checking that its list adds up to exactly that."""
    m = re.fullmatch(r"Incomplete: (\d+) missing fields? in (\d+) entr(?:y|ies)\. (.*)\.", text, re.S)
    assert m, text
    n_fields, n_entries, parts = int(m[1]), int(m[2]), m[3].split("; ")
    more_entries = more_fields = 0
    if parts[-1].startswith("and "):
        more = re.fullmatch(r"and (\d+) more entr(?:y|ies) \((\d+) fields?\)", parts.pop())
        more_entries, more_fields = int(more[1]), int(more[2])
    listed_fields = sum(len(p.split(": ", 1)[1].split(", ")) for p in parts)
    assert (listed_fields + more_fields, len(parts) + more_entries) == (n_fields, n_entries), text
    return n_fields, n_entries


@pytest.mark.slow
def test_progress_counts_what_it_lists(tmp_path, browser):
    from selenium.webdriver.common.by import By

    drv, downloads = browser
    path, _ = write_page(tmp_path)
    drv.get(path.as_uri())
    progress = lambda: drv.find_element(By.ID, "progress").text  # noqa: E731
    assert progress() == ("Incomplete: 17 missing fields in 4 entries. reviewer: name, time; "
                          + "; ".join(f"item {p} (idx {i}): final stance, content correct, format compliant, "
                                      "reference label disputed, reason" for p, i, *_ in ITEMS) + ".")
    assert progress_counts(progress()) == (17, 4)
    fill_item(drv, 1, FILL[1])
    drv.find_element(By.ID, "reviewer-name").send_keys("R")
    assert progress_counts(progress()) == (11, 3)
    drv.find_element(By.ID, "export").click()
    wait_download(downloads, tmp_path / "sheet.json")
    assert "INCOMPLETE sheet (11 missing fields in 3 entries)" in drv.find_element(By.ID, "status").text

    many = [{"position": p, "idx": 100 + p, "label_name": LABELS[p % 2], "sentence": f"s{p}", "answer": "a",
             "finish_reason": "eos", "generated_tokens": 2, "sentence_sha256": sha(f"s{p}"), "answer_sha256": sha("a")}
            for p in range(1, 9)]
    path, _ = write_page(tmp_path, many)
    drv.get(path.as_uri())
    assert progress_counts(progress()) == (42, 9)            # 2 reviewer fields + 8 items x 5, listed 6 + "3 more"
    assert progress().endswith("; and 3 more entries (15 fields).")
