"""Identity level (--tokens): does each logged sample belong to the document it names, and is its prompt the one
the task config renders?

With --data FILE: each logged doc against the dataset row at its doc_id (names every mislabelled sample), the
doc_hash recomputed from that row, and a limit that cuts a (sentence, question) group named. From the run's own
dumped config: doc_to_target and doc_to_text (plus description) re-rendered in a sandboxed Jinja environment and
compared with the logged target and each request's context; multiple_choice continuations from doc_to_choice.
With --model DIR: the continuation token boundaries (tokens.py)."""
import ast

from evidence_audit.checks import IDENTITY, expect, short
from evidence_audit.lmeval.data import load_rows, same_row
from evidence_audit.lmeval.docs import doc_hash
from evidence_audit.lmeval.task import group_of

_ENV, _TEMPLATES = [], {}


MAX_TEMPLATE_CHARS = 1 << 16     # a task template is a few hundred characters
MAX_REPEAT = 1 << 16             # the largest string/list `*` and the largest `**` exponent a template may compute


def jinja():
    """jinja2's ImmutableSandboxedEnvironment with lm-eval's settings (StrictUndefined, keep_trailing_newline) and
    its regex_replace filter: a template from an untrusted run cannot reach Python objects, and `*` / `**` are
    bounded (a template cannot build a huge string). Not bounded: a long loop (jinja's sandbox caps one range() at
    100000 items) makes the audit slow."""
    if not _ENV:
        import re

        from jinja2 import StrictUndefined
        from jinja2.exceptions import SecurityError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Bounded(ImmutableSandboxedEnvironment):
            intercepted_binops = frozenset(["*", "**"])

            def call_binop(self, context, operator, left, right):
                sizes = [len(x) for x in (left, right) if isinstance(x, (str, list, tuple))]
                counts = [abs(x) for x in (left, right) if isinstance(x, int)]
                if operator == "**" and counts and abs(right if isinstance(right, int) else 0) > 64 \
                        or operator == "*" and sizes and max(sizes) * max(counts or [0]) > MAX_REPEAT:
                    raise SecurityError(f"template computes {operator} over the audit's bound")
                return super().call_binop(context, operator, left, right)

        env = Bounded(undefined=StrictUndefined, keep_trailing_newline=True)
        env.filters["regex_replace"] = lambda s, pattern, repl, count=0: re.sub(pattern, repl, s, count=count)
        _ENV.append(env)
    return _ENV[0]


def template(spec):
    """A compiled template (cached), refusing one over MAX_TEMPLATE_CHARS."""
    if len(spec) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"template of {len(spec)} characters, over the audit's bound of {MAX_TEMPLATE_CHARS}")
    if spec not in _TEMPLATES:
        _TEMPLATES[spec] = jinja().from_string(spec)
    return _TEMPLATES[spec]


def render(spec, doc, has_choices):
    """api/task.py doc_to_text / doc_to_target for a config value `spec`: an int as it is, a document field by
    name, else a Jinja template (a rendered number becomes an int when the task has doc_to_choice)."""
    if isinstance(spec, int):
        return spec
    if spec in doc:
        return doc[spec]
    text = template(spec).render(**doc)
    return ast.literal_eval(text) if text.isdigit() and has_choices else text


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
    C.add(t.label, IDENTITY, "each logged doc == the data row at its doc_id (and its doc_hash)", len(t.samples), bad,
          note=str(data_path))
    check = "limit vs question groups (data)"
    if not t.grouped():
        C.skip(t.label, IDENTITY, check, "documents are not parts of (sentence, question) groups", requested=False)
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


def prompt_rows(C, t):
    """Rows "target re-rendered" and "prompt re-rendered": SKIPPED, naming why, for few-shot, chat template,
    system instruction or gen_prefix runs (their context is not description + doc_to_text)."""
    cfg = t.config
    why = [k for k, on in (("num_fewshot", cfg.get("num_fewshot") not in (0, None)),
                           ("gen_prefix", cfg.get("gen_prefix")),
                           ("doc_to_text", not isinstance(cfg.get("doc_to_text"), str)),
                           ("doc_to_target", not isinstance(cfg.get("doc_to_target"), (str, int))),
                           ("chat_template / system_instruction", t.chat)) if on]
    if why:
        for check in ("target re-rendered from doc_to_target", "prompt re-rendered from doc_to_text"):
            C.skip(t.label, IDENTITY, check,
                   f"config {', '.join(why)}: re-rendering not implemented for it; NOT checked")
        return
    has_choices = cfg.get("doc_to_choice") is not None
    bad_t, bad_p = [], []
    for s in t.samples:
        doc = s.raw["doc"]
        try:
            target = render(cfg["doc_to_target"], doc, has_choices)
            text = render(cfg["doc_to_text"], doc, has_choices)
            desc = template(cfg["description"]).render(**doc) if cfg.get("description") else ""
        except Exception as e:      # a template error is a finding about this sample, not a crash of the audit
            bad_p.append(f"{s.where} doc_to_text/doc_to_target: cannot render ({type(e).__name__}: {str(e)[:80]})")
            continue
        expect(bad_t, s.where, "target", s.raw["target"], str(target), "doc_to_target rendered on the logged doc")
        if not isinstance(text, str):
            bad_p.append(f"{s.where} doc_to_text: renders {short(text)}, not a string; NOT re-rendered")
            continue
        for i, (ctx, _) in enumerate(s.requests):
            expect(bad_p, s.where, f"arguments.gen_args_{i}.arg_0", ctx, desc + text,
                   "description + doc_to_text rendered on the logged doc")
    C.add(t.label, IDENTITY, "target re-rendered from doc_to_target", len(t.samples), bad_t)
    C.add(t.label, IDENTITY, "prompt re-rendered from doc_to_text (sandboxed Jinja)", len(t.samples), bad_p)


def identity_rows(C, t, data, loaded):
    """The identity level of one task, without the tokenizer (rescore.boundary_rows adds that). `loaded`: this
    audit's {--data path: (rows, typed)} (one file may serve several tasks)."""
    if data is None:
        C.skip(t.label, IDENTITY, "each logged doc == the data row at its doc_id (and its doc_hash)",
               "needs --data FILE (a local copy of the evaluated split): mislabelled samples NOT checked")
    else:
        if data not in loaded:
            loaded[data] = load_rows(data)
        data_rows(C, t, *loaded[data], data)
    prompt_rows(C, t)
