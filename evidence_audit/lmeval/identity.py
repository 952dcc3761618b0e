"""Identity level (--tokens): does each logged sample belong to the document it names, and is its prompt the one
the task config renders?

With --data FILE: each logged doc against the dataset row at its doc_id (names every mislabelled sample), the
doc_hash recomputed from that row, and a limit that cuts a (sentence, question) group named. From the run's own
dumped config (prompt.py, sandboxed Jinja): every logged target re-rendered (always: a target depends on its
document alone), and every request's context re-rendered, few-shot examples included (drawn from --data or
--fewshot-data as lm-eval draws them; through the --model directory's chat template when the run applied one). A
context the audit cannot render (a chat run without --model, a few-shot split it was not given) FAILs as
INCOMPLETE: what a results file declares never switches a check off. Not every request carries that context: the
unconditional half of an acc_mutual_info sample has "" (persample.mutual_info_split: k conditional requests, then
the k unconditional ones, in every release read), and a loglikelihood_rolling request's only argument is
doc_to_target(doc), not a context (lm-eval 0.4.9.2 lm_eval/api/task.py:1455-1456; the same in every release read).
Chat settings: the results' system_instruction_sha and chat_template_sha recomputed, and its chat_template against
the template the --model directory's tokenizer applies.
A task whose config holds code (process_docs, doc_to_text / doc_to_target / doc_to_choice functions, which lm-eval
logs as their source): with --task-code DIR the code is identified and run in the code sandbox (task_code.py), each
logged doc is compared with process_docs(data)[doc_id] and the targets and contexts are rendered on the processed
documents through the task's own functions; without it (or when the file is not one an lm-eval release ships) the
rows that need the code are SKIPPED naming why, never FAILed, never PASSed.
With --model DIR: the continuation token boundaries (tokens.py)."""
from evidence_audit.checks import IDENTITY, cut, expect, short
from evidence_audit.lmeval import persample, prompt, task_code
from evidence_audit.lmeval.data import load_rows, same_row
from evidence_audit.lmeval.docs import doc_hash
from evidence_audit.lmeval.rolling import ROLLING
from evidence_audit.lmeval.task import group_of
from evidence_audit.model_files import check_model_dir
from evidence_audit.reading import sha256_text
from evidence_audit.templates import OverBound

DOCS_CHECK = "each logged doc == the data row at its doc_id (and its doc_hash)"
PROCESSED_CHECK = "each logged doc == the task's process_docs(data rows) at its doc_id (and its doc_hash)"
TARGET_CHECK = "target re-rendered from doc_to_target"
RESULTS_CHECK = "per-sample metrics from the task's process_results (its code, on the processed doc and filtered_resps)"
PROMPT_CHECK = "prompt re-rendered from the config (description, few-shot examples, doc_to_text; sandboxed Jinja)"
CHAT_CHECK = "chat template and system instruction (results vs --model's tokenizer; their sha256)"


def data_rows(C, t, rows, typed, data_path):
    """Rows "docs vs data at doc_id" and "limit vs question groups (data)"."""
    bad = []
    for s in t.samples:
        if not 0 <= s.doc_id < len(rows):
            bad.append(f"{s.where} doc_id: no row {s.doc_id} in {data_path} ({len(rows)} rows)")
            continue
        for field, logged, data in same_row(s.raw["doc"], rows[s.doc_id], typed):
            bad.append(f"{s.where} doc.{field}: logged {short(logged, 60)}, data row {s.doc_id} has {short(data, 60)}")
        if typed:
            expect(bad, s.where, "doc_hash", s.raw["doc_hash"], doc_hash(rows[s.doc_id]),
                   f"recomputed from data row {s.doc_id}")
    # n-samples.original is the split's size as lm-eval loaded it: a --limit run relabelled as the whole split
    # (limit null, original = the count logged) is caught here, where the split's rows are known
    expect(bad, "n-samples", "original", t.n_samples["original"], len(rows),
           f"the rows of {data_path.name}: the split the run says it evaluated")
    C.add(t.label, IDENTITY, DOCS_CHECK, len(t.samples), bad, note=str(data_path))
    group_rows(C, t, rows)


def group_rows(C, t, rows):
    """Row "limit vs question groups (data)": the (sentence, question) groups a limit or selection cuts, counted in
    the data rows (None: not checked for a process_docs task, whose groups are of processed documents)."""
    check = "limit vs question groups (data)"
    if not t.grouped():
        C.skip(t.label, IDENTITY, check, "documents are not parts of (sentence, question) groups", requested=False)
        return
    if rows is None:
        C.skip(t.label, IDENTITY, check, "process_docs task: its groups are not counted in the data rows; NOT checked")
        return
    in_data, logged = {}, {}
    for row in rows:
        in_data[group_of(row)[0]] = in_data.get(group_of(row)[0], 0) + 1
    for s in t.by_filter().get(t.samples[0].raw["filter"], []):
        key, name = group_of(s.raw["doc"])
        logged.setdefault(key, [name, 0])[1] += 1
    bad = [f"group {name}: {n} of its {in_data.get(key, 0)} documents logged (the limit or selection cuts it; "
           "a per-question figure on it is wrong)" for key, (name, n) in logged.items() if n != in_data.get(key, 0)]
    C.add(t.label, IDENTITY, check, len(logged), bad)


def processed_rows(C, t, code, data_path):
    """Row DOCS_CHECK of a process_docs task whose code ran: each logged doc against process_docs(split)[doc_id]
    (lm-eval's doc_id is the position in the processed split), its doc_hash, and n-samples.original against the
    processed split's size."""
    split, bad = code.splits["eval"], []
    for s in t.samples:
        doc = split.docs.get(s.doc_id)
        if doc is None:
            bad.append(f"{s.where} doc_id: no document {s.doc_id} among the {split.n} process_docs makes of "
                       f"{data_path.name}")
            continue
        for field, logged, want in same_row(s.raw["doc"], doc, True):
            bad.append(f"{s.where} doc.{field}: logged {short(logged, 60)}, process_docs(data) document {s.doc_id} "
                       f"has {short(want, 60)}")
        expect(bad, s.where, "doc_hash", s.raw["doc_hash"], doc_hash(doc),
               f"recomputed from process_docs(data) document {s.doc_id}")
    expect(bad, "n-samples", "original", t.n_samples["original"], split.n,
           f"the documents process_docs makes of {data_path.name}: the split the run says it evaluated")
    C.add(t.label, IDENTITY, PROCESSED_CHECK, len(t.samples), bad, note=f"{data_path}; {code.note}")
    group_rows(C, t, None)


def docs_rows(C, t, data, code, loaded):
    """Row DOCS_CHECK (and the question groups'): the data rows, or for a process_docs task the documents its code
    makes of them (task_code.py; SKIPPED naming why when it did not run)."""
    if data is None:
        C.skip(t.label, IDENTITY, DOCS_CHECK,
               "needs --data FILE (a local copy of the evaluated split): mislabelled samples NOT checked")
    elif t.config.get("process_docs") is not None:
        if isinstance(code, task_code.Ran) and "process_docs" in code.fields:
            processed_rows(C, t, code, data)
            return
        # lm-eval logs process_docs(split)[doc_id], task code: a raw row cannot decide it
        why = str(code) if isinstance(code, task_code.NotRun) else \
            f"process_docs ({short(t.config['process_docs'], 60)}) is not a function's source lm-eval logs"
        C.skip(t.label, IDENTITY, PROCESSED_CHECK,
               f"{why}; each logged doc is process_docs' document, not a data row: mislabelled samples NOT checked")
    else:
        if data not in loaded:
            loaded[data] = load_rows(data)
        data_rows(C, t, *loaded[data], data)


def doc_of(code, s):
    """The document lm-eval rendered sample `s` from: with the task's code run, its processed document at the
    sample's doc_id (LookupError when there is none); else the logged doc."""
    if not isinstance(code, task_code.Ran):
        return s.raw["doc"]
    split = code.splits["eval"]
    if s.doc_id not in split.docs:
        raise LookupError(f"no document {s.doc_id} among the {split.n} of the task's processed split")
    return split.docs[s.doc_id]


def incomplete(why):
    """The one failure of a check the audit was asked for and cannot do: FAIL, never PASS (the report's verdict
    says INCOMPLETE when nothing else failed)."""
    return [f"INCOMPLETE: {why}; NOT checked"]


def target_rows(C, t, code):
    """Row TARGET_CHECK: every logged target against str(doc_to_target(doc)). A target is rendered from its own
    document alone, whatever few-shot or chat settings the run declares, so this row runs unless doc_to_target is
    task code that did not run (SKIPPED naming why). With the task's code run, the document is the processed one."""
    why = task_code.missing(t.config, code, ("doc_to_target",))
    if why:
        C.skip(t.label, IDENTITY, TARGET_CHECK, f"{why}; targets NOT checked")
        return
    bad, cfg = [], task_code.bound(t.config, code)
    on = "the processed doc" if isinstance(code, task_code.Ran) else "the logged doc"
    for s in t.samples:
        try:
            target = prompt.target_of(cfg, doc_of(code, s))
        except OverBound as e:      # past the worker's bounds: undecided, and so is every later render of the task
            C.add(t.label, IDENTITY, TARGET_CHECK, len(t.samples), incomplete(str(e)))
            return
        except Exception as e:      # a template error is a finding about this sample, not a crash of the audit
            bad.append(f"{s.where} doc_to_target: cannot render ({type(e).__name__}: {str(e)[:80]})")
            continue
        expect(bad, s.where, "target", s.raw["target"], target, f"doc_to_target rendered on {on}")
    C.add(t.label, IDENTITY, TARGET_CHECK, len(t.samples), bad,
          note=f"on the documents the task's code made: {code.note}" if isinstance(code, task_code.Ran) else "")


def results_rows(C, t, code):
    """Row RESULTS_CHECK of a task whose process_results is code: each logged sample's metrics against what the
    task's own process_results returns in the sandbox for it (persample.py leaves such a task's per-sample row to
    this one). SKIPPED naming why when the code did not run, or raised on a sample."""
    if not task_code.is_code(t.config.get("process_results")):
        return
    why = str(code) if isinstance(code, task_code.NotRun) else None
    split = code.splits["eval"] if isinstance(code, task_code.Ran) else None
    if why is None and (split is None or split.metrics is None):
        why = f"output_type {t.output_type!r}: its logged responses are not handed back to process_results " \
              f"(only {', '.join(task_code.RESULT_TYPES)})"
    errors = split.errors.get("process_results", {}) if split is not None else {}
    if why is None and errors:
        k = min(errors)
        why = f"the task's process_results raised on {t.samples[k].where} in the sandbox ({cut(errors[k], 160)})"
    if why:
        C.skip(t.label, IDENTITY, RESULTS_CHECK, f"{why}; per-sample metrics NOT checked")
        return
    bad = []
    for s, got in zip(t.samples, split.metrics):
        if list(got) != s.raw["metrics"]:
            bad.append(f"{s.where} metrics: logged {short(s.raw['metrics'], 60)}, process_results returns "
                       f"{short(list(got), 60)}")
        for m in s.raw["metrics"]:
            if m in got:
                expect(bad, s.where, m, s.raw.get(m), got[m], "the task's process_results")
    C.add(t.label, IDENTITY, RESULTS_CHECK, len(t.samples), bad, note="see the target row for the code run")


def fewshot_file(t, data, fewshot):
    """The file of the split a few-shot run draws from (--fewshot-data, or --data when it is the evaluated split),
    or None (a zero-shot run, a list of samples, a split not given)."""
    if not t.config.get("num_fewshot"):
        return None
    try:
        kind, value = prompt.fewshot_source(t.config)
    except prompt.Unrenderable:
        return None
    return None if kind == "samples" else fewshot if fewshot is not None else \
        data if value == prompt.eval_split(t.config) else None


def fewshot_docs(t, data, fewshot, loaded, code=None):
    """The documents lm-eval drew few-shot examples from: fewshot_config's list, --fewshot-data, or --data when
    the few-shot split is the evaluated one; with the task's code run, that split's documents as it made them
    (process_docs applied, as lm-eval applies it to a few-shot split). Unrenderable naming the missing file
    otherwise."""
    kind, value = prompt.fewshot_source(t.config)
    if kind == "samples":
        if isinstance(code, task_code.Ran) and set(code.fields) & set(task_code.DOC_FIELDS):
            raise prompt.Unrenderable("few-shot samples listed in fewshot_config with doc_to_* task code: not "
                                      "implemented")
        return value
    path = fewshot if fewshot is not None else data if value == prompt.eval_split(t.config) else None
    if isinstance(code, task_code.Ran) and path is not None:
        split = code.splits.get("fewshot")
        if split is None:
            raise prompt.Unrenderable("the task's code ran without the few-shot split")
        return [split.docs[i] for i in range(split.n)]
    if t.config.get("process_docs") is not None and path is not None:
        raise prompt.Unrenderable("process_docs is set, lm-eval applies it to the few-shot split, and it did not run")
    if path is None:
        raise prompt.Unrenderable(f"num_fewshot {t.config.get('num_fewshot')} draws from split {value!r}: pass "
                                  f"--fewshot-data {t.name}=FILE (a local copy of that split)"
                                  + ("" if value != prompt.eval_split(t.config) else " or --data"))
    if path not in loaded:
        loaded[path] = load_rows(path)
    rows, typed = loaded[path]
    if not typed:
        raise prompt.Unrenderable(f"{path}: a .tsv has no types and lm-eval compares and renders typed documents; "
                                  "pass .parquet or .jsonl")
    return rows


def render_each(render, doc):
    """One document's context, or the template error (a finding about that sample, not a crash of the audit)."""
    try:
        return render.context(doc)
    except prompt.Unrenderable:
        raise
    except Exception as e:
        return e


def chat_template(t, top, model, loaded):
    """The ChatTemplate of --model when the run applied a chat template (the results' chat_template is not null),
    else None; Unrenderable without --model. One per model directory and model_args, kept in `loaded`."""
    if top.get("chat_template") is None:
        return None
    if model is None:
        raise prompt.Unrenderable("the run applied a chat template (the results' chat_template): pass --model DIR, "
                                  "whose tokenizer's template the audit renders with")
    key = ("chat template", str(model), str(t.run_config.get("model_args")))
    if key not in loaded:
        check_model_dir(model)      # a hostile directory: one line, exit 2, before a file of it is read
        loaded[key] = prompt.ChatTemplate(model, t.run_config.get("model_args"))
    return loaded[key]


def chat_rows(C, t, top, model, loaded):
    """Row CHAT_CHECK: system_instruction_sha and chat_template_sha against the sha256 lm-eval's tracker takes of
    the logged texts (null for an empty or absent one), and the logged chat_template against the one the --model
    directory's tokenizer applies. A run without system instruction or chat template has nothing to compare: the
    row is SKIPPED, not requested."""
    system, chat = top.get("system_instruction"), top.get("chat_template")
    if system is None and chat is None and top.get("system_instruction_sha") is None \
            and top.get("chat_template_sha") is None:
        C.skip(t.label, IDENTITY, CHAT_CHECK, "no system instruction and no chat template in the results",
               requested=False)
        return
    bad = []
    for key, text in (("system_instruction_sha", system), ("chat_template_sha", chat)):
        if text is not None and not isinstance(text, str):
            bad.append(f"results {key[:-4]}: a {type(text).__name__}, not a text")
            continue
        expect(bad, "results", key, top.get(key), sha256_text(text) if text else None,
               f"sha256 of the results' {key[:-4]}; lm-eval's tracker writes null for an empty or absent one")
    note = None
    if isinstance(chat, str):
        try:
            tpl = chat_template(t, top, model, loaded)
        except prompt.Unrenderable as e:
            bad += incomplete(str(e))
        else:
            note = tpl.source
            if chat != tpl.text:
                theirs, ours = sha256_text(chat)[:12], sha256_text(tpl.text)[:12]
                bad.append(f"results chat_template: logged {short(chat, 60)} (sha256 {theirs}), the tokenizer applies "
                           f"{short(tpl.text, 60)} (sha256 {ours}, {tpl.source}); a named template of several is "
                           "logged but lm-eval renders the tokenizer's default")
    C.add(t.label, IDENTITY, CHAT_CHECK, 1, bad, note=note)


def render_sample(render, code, s):
    """render_each on the document of sample `s` (doc_of), or the LookupError of a doc_id with no document."""
    try:
        doc = doc_of(code, s)
    except LookupError as e:
        return e
    return render_each(render, doc)


def contexts(t, top, data, fewshot, loaded, model=None, code=None):
    """{doc_id: the context lm-eval 0.4.9.2 gives every request of that document, or the template error},
    rendered in lm-eval's order (the logged doc_ids of one filter, ascending: dataset order), on the processed
    documents when the task's code ran. Unrenderable for what is not implemented; task_code.NotRun when task code
    the context needs did not run."""
    why = prompt.not_implemented(t.config, top)
    if why:
        raise prompt.Unrenderable(why)
    k = t.config.get("num_fewshot") or 0
    why = task_code.missing(t.config, code, ("doc_to_text",) + (("doc_to_target", "doc_to_choice", "process_docs")
                                                                  if k else ()))
    if why:
        raise task_code.NotRun(why)
    chat = chat_template(t, top, model, loaded)
    docs = fewshot_docs(t, data, fewshot, loaded, code) if k else []
    render = prompt.Renderer(task_code.bound(t.config, code), top, t.run_config, docs, chat)
    first = t.by_filter().get(t.samples[0].raw["filter"], []) if t.samples else []
    return {s.doc_id: render_sample(render, code, s) for s in sorted(first, key=lambda s: s.doc_id)}


def rolling_prompt_rows(C, t, code):
    """Row PROMPT_CHECK of a loglikelihood_rolling task: each request's only argument is doc_to_target(doc) itself
    (construct_requests gives it no context, whatever few-shot or chat settings the run declares)."""
    why = task_code.missing(t.config, code, ("doc_to_target",))
    if why:
        C.skip(t.label, IDENTITY, PROMPT_CHECK, f"{why}; requests NOT checked")
        return
    bad, cfg = [], task_code.bound(t.config, code)
    for s in t.samples:
        try:
            text = prompt.doc_to_target(cfg.get("doc_to_target"), doc_of(code, s),
                                        t.config.get("doc_to_choice") is not None)
        except OverBound as e:
            C.add(t.label, IDENTITY, PROMPT_CHECK, len(t.samples), incomplete(str(e)))
            return
        except Exception as e:      # a template error is a finding about this sample, not a crash of the audit
            bad.append(f"{s.where} doc_to_target: cannot render ({type(e).__name__}: {str(e)[:80]})")
            continue
        expect(bad, s.where, "arguments.gen_args_0.arg_0", s.requests[0][0], text,
               f"doc_to_target rendered on the logged doc: a {ROLLING} request's only argument")
    C.add(t.label, IDENTITY, PROMPT_CHECK, len(t.samples), bad,
          note=f"{ROLLING}: the request is doc_to_target(doc), no context")


def expected_args(t, top, s, ctx, bad):
    """Each request's expected first argument: the rendered context, but "" for the unconditional half of an
    acc_mutual_info sample; None (and a message) when its requests are not laid out as the release makes them."""
    if t.output_type != "multiple_choice" or "acc_mutual_info" not in s.raw["metrics"]:
        return [(ctx, "rendered from the config on the logged doc")] * len(s.requests)
    split = persample.mutual_info_split(t, s, bad, persample.target_delimiter(t, top))
    if split is None:
        return None
    k = len(split[0])
    return [(ctx, "rendered from the config on the logged doc")] * k + \
        [("", "the unconditional request of acc_mutual_info has no context")] * (len(s.requests) - k)


def prompt_rows(C, t, top, data, fewshot, loaded, model=None, code=None):
    """Row PROMPT_CHECK: every request's context against the context rendered from the config, the document,
    (few-shot) the few-shot split and (chat) the --model directory's chat template ("" for acc_mutual_info's
    unconditional requests; a rolling task's text: rolling_prompt_rows). What the audit cannot render FAILs as
    INCOMPLETE: a results file that declares few-shot or chat settings never switches the check off."""
    if t.output_type == ROLLING:
        rolling_prompt_rows(C, t, code)
        return
    try:
        want = contexts(t, top, data, fewshot, loaded, model, code)
    except prompt.Unrenderable as e:
        C.add(t.label, IDENTITY, PROMPT_CHECK, len(t.samples), incomplete(str(e)))
        return
    except task_code.NotRun as e:
        C.skip(t.label, IDENTITY, PROMPT_CHECK, f"{e}; contexts NOT checked")
        return
    bad = []
    for s in t.samples:
        ctx = want.get(s.doc_id)
        if isinstance(ctx, Exception):
            bad.append(f"{s.where} context: cannot render ({type(ctx).__name__}: {str(ctx)[:80]})")
            continue
        if ctx is None:
            bad.append(f"{s.where} doc_id: not logged under the first filter; context NOT rendered")
            continue
        args = expected_args(t, top, s, ctx, bad) or []
        for i, ((logged, _), (expected, why)) in enumerate(zip(s.requests, args)):
            expect(bad, s.where, f"arguments.gen_args_{i}.arg_0", logged, expected, why)
    k = t.config.get("num_fewshot") or 0
    chat = "" if top.get("chat_template") is None else \
        ", chat template" + (" (few-shot as multiturn)" if top.get("fewshot_as_multiturn") is True and k else "")
    C.add(t.label, IDENTITY, PROMPT_CHECK, len(t.samples), bad,
          note=f"num_fewshot {k}" + (f", fewshot_seed {t.run_config.get('fewshot_seed')}" if k else "") + chat
          + ("; on the documents the task's code made (see the target row)" if isinstance(code, task_code.Ran)
             else ""))


def identity_rows(C, t, top, data, fewshot, loaded, model=None, code_dir=None):
    """The identity level of one task, without the tokenizer (rescore.boundary_rows adds that). `top`: the results
    file; `data`, `fewshot`, `code_dir`: this task's --data, --fewshot-data and --task-code (or None); `loaded`: this
    audit's {path: (rows, typed)} (one file may serve several tasks), chat templates, task code scans and runs;
    `model`: --model DIR (or None), whose tokenizer's chat template renders a chat run's contexts."""
    key = ("task code", t.label)
    if key not in loaded:
        loaded[key] = task_code.prepare(t, code_dir, data, fewshot_file(t, data, fewshot),
                                        loaded.setdefault(("task code", "scans"), {}))
    code = loaded[key]
    docs_rows(C, t, data, code, loaded)
    target_rows(C, t, code)
    results_rows(C, t, code)
    chat_rows(C, t, top, model, loaded)
    prompt_rows(C, t, top, data, fewshot, loaded, model, code)
