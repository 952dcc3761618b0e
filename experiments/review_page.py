"""The human review page of the extraction experiment: one self-contained HTML file, opened from disk.

It shows, for each pre-registered audit item, the review text, the dataset label, the full model answer and the
finish reason. The automatic scores are not in the page at all (not hidden with CSS: absent), so a reviewer cannot
see them. Every field starts blank: final stance (positive / negative / uncertain / no conclusion), content
correct, format compliant, reference label disputed, reason; reviewer name and time. "Export sheet" downloads the
answers as a JSON sheet (SHEET_FORMAT); "Import sheet" reloads one into the form (only a sheet for the same
pre-registered sample: same pre-registration sha256, same idx at every position). No network: the page has no
external resource and a Content-Security-Policy that forbids any (default-src 'none').

audit.py --review SHEET reads the exported sheet (and refuses a blank or partly blank one).

The page is one Jinja2 template (PAGE) rendered in a single pass with autoescaping: an answer is data in a JSON
block, never template text, whatever it contains.
"""
import json

from jinja2 import Environment, StrictUndefined
from markupsafe import Markup

PAGE_FORMAT = "extraction-review-page/v1"
SHEET_FORMAT = "extraction-review-sheet/v1"
STANCES = [("positive", "positive"), ("negative", "negative"), ("uncertain", "uncertain"),
           ("no_conclusion", "no conclusion")]
ITEM_KEYS = ("position", "idx", "label_name", "sentence", "answer", "finish_reason", "generated_tokens",
             "sentence_sha256", "answer_sha256")


def _script_json(obj):
    """JSON safe inside <script type="application/json">: no '<', '>' or '&' survives literally."""
    return (json.dumps(obj, ensure_ascii=False, sort_keys=True)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def build_review_page(items, meta):
    """items: dicts with ITEM_KEYS (nothing else: no scores); meta: experiment, split, preregistration_sha256,
    max_new_tokens, labels. Returns the HTML text."""
    bad = [sorted(set(it) ^ set(ITEM_KEYS)) for it in items if set(it) != set(ITEM_KEYS)]
    if bad:
        raise ValueError(f"review items must carry exactly {ITEM_KEYS}; differing keys: {bad[0]}")
    data = {"page_format": PAGE_FORMAT, "sheet_format": SHEET_FORMAT, "experiment": meta["experiment"],
            "split": meta["split"], "preregistration_sha256": meta["preregistration_sha256"],
            "max_new_tokens": meta["max_new_tokens"], "labels": meta["labels"],
            "stances": [s for s, _ in STANCES], "items": items}
    title = f"Extraction review: {len(items)} pre-registered items ({meta['split']})"
    # one pass: values are inserted once and never read again as template text; the title is HTML-escaped by
    # autoescaping, the JSON blocks are marked safe because _script_json already made them inert in <script>
    return TEMPLATE.render(title=title, data_json=Markup(_script_json(data)),
                           stances_json=Markup(_script_json(STANCES)))


PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 60rem; padding: 1rem 1.5rem 4rem; color: #1d1d1d; }
  h1 { font-size: 1.35rem; margin-bottom: .2rem; }
  .muted { color: #666; font-size: .9rem; }
  .panel { border: 1px solid #c9c9c9; border-radius: 6px; padding: .8rem 1rem; margin: 1rem 0; background: #fafafa; }
  .item { border: 1px solid #bbb; border-radius: 6px; padding: .8rem 1rem; margin: 1.2rem 0; }
  .item.complete { border-left: 6px solid #3a8a3a; }
  .item.incomplete { border-left: 6px solid #c98a1a; }
  .label { font-weight: 600; }
  .text { white-space: pre-wrap; background: #fff; border: 1px solid #ddd; padding: .5rem; border-radius: 4px; }
  pre.answer { white-space: pre-wrap; word-break: break-word; background: #f3f3ff; border: 1px solid #ccd;
               padding: .5rem; border-radius: 4px; margin: .2rem 0; font: 14px/1.4 ui-monospace, monospace; }
  .empty { color: #a00; font-style: italic; }
  fieldset { border: 0; padding: .15rem 0; margin: 0; }
  legend { float: left; width: 13rem; font-weight: 600; padding: 0; }
  fieldset label { margin-right: 1rem; white-space: nowrap; }
  textarea { width: 100%; min-height: 3rem; font: inherit; box-sizing: border-box; }
  button { font: inherit; padding: .3rem .8rem; }
  #status { font-weight: 600; }
  .error { color: #a00; }
  .ok { color: #276127; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p class="muted">Read each review and the model's full answer, then record what the answer concludes and whether
that is right. The automatic scores are deliberately not shown. Choose <em>uncertain</em> when the answer takes
contradictory or unclear positions, <em>no conclusion</em> when it states none. Mark the dataset label as disputed
when you doubt the reference itself (the label is never changed). Every field is required; export the sheet when
done and keep the file. Nothing leaves this computer: the page makes no network request.</p>

<div class="panel" id="reviewer">
  <div><label class="label" for="reviewer-name">Reviewer name</label>
    <input id="reviewer-name" type="text" size="30" autocomplete="off"></div>
  <div style="margin-top:.4rem"><label class="label" for="reviewer-time">Review time (ISO 8601)</label>
    <input id="reviewer-time" type="text" size="30" placeholder="e.g. 2026-10-10T14:30:00+02:00" autocomplete="off">
    <button type="button" id="reviewer-time-now">now</button></div>
  <div class="muted" id="binding"></div>
</div>

<div id="items"></div>

<div class="panel">
  <div id="progress"></div>
  <div style="margin-top:.5rem">
    <button type="button" id="export">Export sheet (JSON)</button>
    <label style="margin-left:1.5rem">Import sheet: <input type="file" id="import-file" accept=".json,application/json"></label>
  </div>
  <div id="status" role="status"></div>
</div>

<script type="application/json" id="review-data">{{ data_json }}</script>
<script type="application/json" id="stance-names">{{ stances_json }}</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("review-data").textContent);
const STANCES = JSON.parse(document.getElementById("stance-names").textContent);
const BOOL_FIELDS = [["content_correct", "Content correct"], ["format_compliant", "Format compliant"],
                     ["reference_disputed", "Reference label disputed"]];
let dirty = false;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function radioGroup(pos, field, legend, options) {
  const fs = el("fieldset", {"data-field": field});
  fs.appendChild(el("legend", {}, legend));
  for (const [value, shown] of options) {
    const id = `item-${pos}-${field}-${value}`;
    const input = el("input", {type: "radio", name: `item-${pos}-${field}`, id: id, value: value});
    input.addEventListener("change", changed);
    const lab = el("label", {for: id});
    lab.appendChild(input);
    lab.appendChild(document.createTextNode(" " + shown));
    fs.appendChild(lab);
  }
  return fs;
}

function render() {
  document.getElementById("binding").textContent =
    `Experiment ${DATA.experiment}, split ${DATA.split}; pre-registered sample sha256 ${DATA.preregistration_sha256}`;
  const box = document.getElementById("items");
  for (const it of DATA.items) {
    const card = el("section", {class: "item", id: `item-${it.position}`});
    card.appendChild(el("h2", {style: "font-size:1.05rem;margin:.1rem 0 .5rem"},
                        `Item ${it.position} of ${DATA.items.length} (idx ${it.idx})`));
    card.appendChild(el("div", {class: "label"}, "Review text"));
    card.appendChild(el("div", {class: "text"}, it.sentence));
    const lab = el("div", {style: "margin:.4rem 0"});
    lab.appendChild(el("span", {class: "label"}, "Dataset label: "));
    lab.appendChild(el("span", {id: `item-${it.position}-dataset-label`}, it.label_name));
    card.appendChild(lab);
    card.appendChild(el("div", {class: "label"}, "Model answer (complete, as generated)"));
    if (it.answer === "") card.appendChild(el("pre", {class: "answer empty"}, "(empty answer)"));
    else card.appendChild(el("pre", {class: "answer", id: `item-${it.position}-answer`}, it.answer));
    const fin = it.finish_reason === "eos"
      ? `eos: the model ended its answer (${it.generated_tokens} tokens incl. the end token)`
      : `length: stopped at the ${DATA.max_new_tokens}-token limit; the answer may be cut off`;
    const f = el("div", {class: "muted", style: "margin-bottom:.5rem"});
    f.appendChild(el("span", {class: "label"}, "Finish reason: "));
    f.appendChild(el("span", {id: `item-${it.position}-finish`}, fin));
    card.appendChild(f);
    card.appendChild(radioGroup(it.position, "final_stance", "Final stance of the answer", STANCES));
    for (const [field, legend] of BOOL_FIELDS)
      card.appendChild(radioGroup(it.position, field, legend, [["yes", "yes"], ["no", "no"]]));
    const r = el("div", {style: "margin-top:.3rem"});
    r.appendChild(el("label", {class: "label", for: `item-${it.position}-reason`}, "Reason"));
    const ta = el("textarea", {id: `item-${it.position}-reason`});
    ta.addEventListener("input", changed);
    r.appendChild(ta);
    card.appendChild(r);
    box.appendChild(card);
  }
  for (const id of ["reviewer-name", "reviewer-time"])
    document.getElementById(id).addEventListener("input", changed);
  document.getElementById("reviewer-time-now").addEventListener("click", () => {
    document.getElementById("reviewer-time").value = new Date().toISOString();
    changed();
  });
  document.getElementById("export").addEventListener("click", exportSheet);
  document.getElementById("import-file").addEventListener("change", importSheet);
  window.addEventListener("beforeunload", (e) => { if (dirty) { e.preventDefault(); e.returnValue = ""; } });
  progress();
}

function radioValue(pos, field) {
  const c = document.querySelector(`input[name="item-${pos}-${field}"]:checked`);
  return c ? c.value : null;
}

function setRadio(pos, field, value) {
  for (const r of document.querySelectorAll(`input[name="item-${pos}-${field}"]`)) r.checked = (r.value === value);
}

function yesNo(v) { return v === null ? null : v === "yes"; }

function collect() {
  return {
    sheet_format: DATA.sheet_format, experiment: DATA.experiment, split: DATA.split,
    preregistration_sha256: DATA.preregistration_sha256,
    sample_idx: DATA.items.map((it) => it.idx),
    reviewer: {name: document.getElementById("reviewer-name").value,
               time: document.getElementById("reviewer-time").value},
    exported_at: new Date().toISOString(),
    items: DATA.items.map((it) => ({
      position: it.position, idx: it.idx, label_name: it.label_name,
      sentence_sha256: it.sentence_sha256, answer_sha256: it.answer_sha256,
      final_stance: radioValue(it.position, "final_stance"),
      content_correct: yesNo(radioValue(it.position, "content_correct")),
      format_compliant: yesNo(radioValue(it.position, "format_compliant")),
      reference_disputed: yesNo(radioValue(it.position, "reference_disputed")),
      reason: document.getElementById(`item-${it.position}-reason`).value,
    })),
  };
}

// One entry per place with blank fields: the reviewer, or an item. Counts and lists are both made from these
// entries, so what the page says is missing is exactly what it lists.
function missingEntries(sheet) {
  const miss = [];
  const reviewer = [];
  if (!sheet.reviewer.name.trim()) reviewer.push("name");
  if (!sheet.reviewer.time.trim()) reviewer.push("time");
  if (reviewer.length) miss.push({where: "reviewer", fields: reviewer});
  for (const it of sheet.items) {
    const m = [];
    if (it.final_stance === null) m.push("final stance");
    for (const [field, legend] of BOOL_FIELDS) if (it[field] === null) m.push(legend.toLowerCase());
    if (!it.reason.trim()) m.push("reason");
    const card = document.getElementById(`item-${it.position}`);
    card.className = "item " + (m.length ? "incomplete" : "complete");
    if (m.length) miss.push({where: `item ${it.position} (idx ${it.idx})`, fields: m});
  }
  return miss;
}

function plural(n, one, many) { return `${n} ${n === 1 ? one : many}`; }

function fieldCount(miss) { return miss.reduce((n, m) => n + m.fields.length, 0); }

function missingCount(miss) {
  const fields = plural(fieldCount(miss), "missing field", "missing fields");
  return `${fields} in ${plural(miss.length, "entry", "entries")}`;
}

const LISTED_ENTRIES = 6;

function progress() {
  const miss = missingEntries(collect());
  const p = document.getElementById("progress");
  const shown = miss.slice(0, LISTED_ENTRIES).map((m) => `${m.where}: ${m.fields.join(", ")}`);
  const rest = miss.slice(LISTED_ENTRIES);
  if (rest.length) {
    const fields = plural(fieldCount(rest), "field", "fields");
    shown.push(`and ${plural(rest.length, "more entry", "more entries")} (${fields})`);
  }
  p.textContent = miss.length
    ? `Incomplete: ${missingCount(miss)}. ` + shown.join("; ") + "."
    : `Complete: all ${DATA.items.length} items and the reviewer fields are filled.`;
  p.className = miss.length ? "" : "ok";
}

function changed() { dirty = true; progress(); }

function status(msg, ok) {
  const s = document.getElementById("status");
  s.textContent = msg;
  s.className = ok ? "ok" : "error";
}

function exportSheet() {
  const sheet = collect();
  const miss = missingEntries(sheet);
  const text = JSON.stringify(sheet, null, 2) + "\n";
  const url = URL.createObjectURL(new Blob([text], {type: "application/json"}));
  const a = el("a", {href: url, download: `extraction-review-sheet-${DATA.preregistration_sha256.slice(0, 12)}.json`});
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
  dirty = false;
  status(miss.length ? `Exported an INCOMPLETE sheet (${missingCount(miss)}); audit.py will refuse it.`
                     : "Exported a complete sheet.", miss.length === 0);
}

function applySheet(sheet) {
  if (!sheet || sheet.sheet_format !== DATA.sheet_format)
    throw new Error(`not a ${DATA.sheet_format} sheet`);
  if (sheet.preregistration_sha256 !== DATA.preregistration_sha256)
    throw new Error("the sheet belongs to another pre-registered sample (pre-registration sha256 differs)");
  if (!Array.isArray(sheet.items) || sheet.items.length !== DATA.items.length)
    throw new Error(`the sheet has ${Array.isArray(sheet.items) ? sheet.items.length : "no"} items, the page ${DATA.items.length}`);
  DATA.items.forEach((it, k) => {
    const s = sheet.items[k];
    if (!s || s.idx !== it.idx || s.position !== it.position)
      throw new Error(`item ${k + 1}: the sheet has idx ${s && s.idx}, the page idx ${it.idx}`);
  });
  const yn = (v) => (v === true ? "yes" : v === false ? "no" : null);
  document.getElementById("reviewer-name").value = (sheet.reviewer && sheet.reviewer.name) || "";
  document.getElementById("reviewer-time").value = (sheet.reviewer && sheet.reviewer.time) || "";
  DATA.items.forEach((it, k) => {
    const s = sheet.items[k];
    setRadio(it.position, "final_stance", s.final_stance);
    for (const [field] of BOOL_FIELDS) setRadio(it.position, field, yn(s[field]));
    document.getElementById(`item-${it.position}-reason`).value = typeof s.reason === "string" ? s.reason : "";
  });
}

function importSheet(ev) {
  const file = ev.target.files[0];
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    try {
      applySheet(JSON.parse(reader.result));
      dirty = false;
      progress();
      status(`Imported ${file.name}.`, true);
    } catch (e) {
      status(`Import refused: ${e.message}. The form was left unchanged.`, false);
    }
    ev.target.value = "";
  };
  reader.onerror = () => status(`Import failed: cannot read ${file.name}.`, false);
  reader.readAsText(file);
}

render();
</script>
</body>
</html>
"""

TEMPLATE = Environment(autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True).from_string(PAGE)
