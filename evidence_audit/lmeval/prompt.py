"""The audit's own rendering of a task's texts from its dumped config, as lm-eval 0.4.9.2 renders them (api/task.py
ConfigurableTask.doc_to_text / doc_to_target / doc_to_choice / doc_to_prefix / fewshot_context, api/samplers.py
ContextSampler.get_context), written again here: nothing imports lm_eval.

A context without a chat template is

    [system_instruction + fewshot_delimiter] + [description] + examples + doc_to_text(doc)
        + [target_delimiter + gen_prefix]

(the system instruction alone or the description alone when only one is set), where examples are num_fewshot
documents of the few-shot split, each doc_to_text + target_delimiter + [gen_prefix + " "] + its target +
fewshot_delimiter. The documents are drawn by random.Random(fewshot_seed).sample over the whole few-shot split, one
draw per evaluated document in dataset order, all from one generator per task; num_fewshot + 1 are drawn when the
config's fewshot_split equals its test_split (both unset counts), the evaluated document is removed, the first
num_fewshot kept. random.sample's choice depends only on the population's size, so the audit draws indices.

What is not implemented raises Unrenderable naming it; the caller reports it as INCOMPLETE, never as a pass."""
import ast
import random

_ENV, _TEMPLATES = [], {}

MAX_TEMPLATE_CHARS = 1 << 16     # a task template is a few hundred characters
MAX_REPEAT = 1 << 16             # the largest string/list `*` and the largest `**` exponent a template may compute
SAMPLERS = ("default", "first_n")


class Unrenderable(Exception):
    """The audit cannot render this context: the message names the feature it does not implement."""


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


def apply(spec, doc):
    """utils.apply_template: the Jinja template `spec` rendered on the document's fields."""
    return template(spec).render(**doc)


def doc_to_text(spec, doc, has_choices):
    """ConfigurableTask.doc_to_text for a config value: an int as it is, a field by name, else a template (a
    rendered number becomes an int when the task has doc_to_choice)."""
    if isinstance(spec, int):
        return spec
    if not isinstance(spec, str):
        raise Unrenderable(f"doc_to_text is a {type(spec).__name__}, not a template")
    if spec in doc:
        return doc[spec]
    text = apply(spec, doc)
    return ast.literal_eval(text) if text.isdigit() and has_choices else text


def doc_to_target(spec, doc, has_choices):
    """ConfigurableTask.doc_to_target: as doc_to_text, and a rendered "[...]" is read as a Python literal when it
    parses (a list of gold answers); a list in the config is returned as it is."""
    if isinstance(spec, (int, list)):
        return spec
    if not isinstance(spec, str):
        raise Unrenderable(f"doc_to_target is a {type(spec).__name__}, not a template")
    if spec in doc:
        return doc[spec]
    text = apply(spec, doc)
    if text.isdigit() and has_choices:
        return ast.literal_eval(text)
    if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
        try:
            return ast.literal_eval(text)
        except (SyntaxError, ValueError):
            return text
    return text


def doc_to_choice(spec, doc):
    """ConfigurableTask.doc_to_choice: a field by name, a template read as a Python literal, a list, a dict's
    values."""
    if isinstance(spec, str):
        return doc[spec] if spec in doc else ast.literal_eval(apply(spec, doc))
    if isinstance(spec, list):
        return spec
    if isinstance(spec, dict):
        return list(spec.values())
    raise Unrenderable(f"doc_to_choice is a {type(spec).__name__}")


def target_of(cfg, doc):
    """The logged target: str(doc_to_target(doc)) (the tracker writes str of it)."""
    return str(doc_to_target(cfg.get("doc_to_target"), doc, cfg.get("doc_to_choice") is not None))


def gen_prefix(cfg, doc):
    """ConfigurableTask.doc_to_prefix: None, a field by name, or the template rendered."""
    spec = cfg.get("gen_prefix")
    if spec is None:
        return None
    return doc[spec] if spec in doc else apply(spec, doc)


def fewshot_source(cfg):
    """Where lm-eval 0.4.9.2 takes few-shot documents from: ("split", name), or ("samples", [docs]) for a list
    in fewshot_config; Unrenderable for what the audit cannot read (code, process_docs)."""
    fc = cfg.get("fewshot_config") or {}
    if not isinstance(fc, dict):
        raise Unrenderable(f"fewshot_config is a {type(fc).__name__}")
    if cfg.get("process_docs") is not None:
        raise Unrenderable("process_docs is set (code the audit does not run) and lm-eval applies it to the few-shot "
                           "documents")
    if cfg.get("fewshot_split") is not None:
        return "split", cfg["fewshot_split"]
    if fc.get("samples") is not None:
        if isinstance(fc["samples"], list) and all(isinstance(d, dict) for d in fc["samples"]):
            return "samples", fc["samples"]
        raise Unrenderable("fewshot_config.samples is not a list of documents (a function the audit does not run)")
    for key in ("training_split", "validation_split", "test_split"):
        if cfg.get(key) is not None:
            return "split", cfg[key]
    raise Unrenderable("the config names no split to draw few-shot documents from")


def eval_split(cfg):
    """The split lm-eval evaluated: test_split when set, else validation_split."""
    return cfg.get("test_split") if cfg.get("test_split") is not None else cfg.get("validation_split")


class Renderer:
    """Contexts of one task, in lm-eval's order: call context(doc) once per evaluated document in dataset order
    (the few-shot generator advances with each call, as lm-eval's does)."""

    def __init__(self, cfg, top, run_config, fewshot_docs):
        self.cfg, self.fc = cfg, cfg.get("fewshot_config") or {}
        self.k = cfg.get("num_fewshot") or 0
        self.system = top.get("system_instruction")
        self.docs = fewshot_docs
        self.has_choices = cfg.get("doc_to_choice") is not None
        self.td, self.fd = cfg.get("target_delimiter", " "), cfg.get("fewshot_delimiter", "\n\n")
        if not isinstance(self.k, int) or self.k < 0:
            raise Unrenderable(f"num_fewshot {self.k!r} is not a count")
        if self.k:
            self.sampler = self.fc.get("sampler", "default")
            if self.sampler not in SAMPLERS:
                raise Unrenderable(f"fewshot_config.sampler {self.sampler!r}: only {', '.join(SAMPLERS)} are "
                                   "implemented")
            seed = run_config.get("fewshot_seed")
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise Unrenderable(f"fewshot_seed {seed!r}: lm-eval drew the examples from a generator the audit "
                                   "cannot replay")
            self.rnd = random.Random(seed)

    def spec(self, key):
        """A few-shot example's doc_to_* spec: fewshot_config's when it sets one, else the task's."""
        return self.fc[key] if self.fc.get(key) is not None else self.cfg.get(key)

    def draw(self, doc):
        """ContextSampler.get_context's choice of examples for `doc` (advances the generator)."""
        n = self.k + 1 if self.cfg.get("fewshot_split") == self.cfg.get("test_split") else self.k
        if n > len(self.docs):
            raise Unrenderable(f"{n} few-shot documents to draw from {len(self.docs)}")
        picked = self.docs[:n] if self.sampler == "first_n" else [self.docs[i] for i in
                                                                   self.rnd.sample(range(len(self.docs)), n)]
        return [d for d in picked if d != doc][:self.k]

    def example(self, d, prefix):
        """One labelled example: its text, then (unless its target is "") delimiter, prefix, target, fewshot
        delimiter; fewshot_config's doc_to_* replace the task's."""
        text = doc_to_text(self.spec("doc_to_text"), d, self.has_choices)
        target = doc_to_target(self.spec("doc_to_target"), d, self.has_choices)
        choices = lambda: doc_to_choice(self.spec("doc_to_choice"), d)  # noqa: E731
        out = text if not self.has_choices or isinstance(text, str) else choices()[text]
        if target == "":
            return out
        if isinstance(target, list):
            shown = str(target[0])
        elif not self.has_choices or isinstance(target, str):
            shown = target
        else:
            shown = str(choices()[target])
        return out + self.td + prefix + shown + self.fd

    def context(self, doc):
        """fewshot_context(doc) without a chat template: the context string every request of `doc` carries."""
        desc = apply(self.cfg["description"], doc) if self.cfg.get("description") else ""
        if self.system is not None and desc:
            out = self.system + self.fd + desc
        else:
            out = self.system if self.system is not None else desc
        prefix = gen_prefix(self.cfg, doc)
        if self.k > 0:
            out += "".join(self.example(d, prefix + " " if prefix else "") for d in self.draw(doc))
        text = doc_to_text(self.cfg.get("doc_to_text"), doc, self.has_choices)
        if isinstance(text, int):
            text = doc_to_choice(self.cfg.get("doc_to_choice"), doc)[text] if self.has_choices else str(text)
        if not isinstance(text, str):
            raise Unrenderable(f"doc_to_text renders a {type(text).__name__} (one context per choice, "
                               "multiple_input): not implemented")
        return out + text + (self.td + prefix if prefix is not None else "")


def not_implemented(cfg, top):
    """Why the audit cannot render this task's contexts at all (a chat template, a promptsource prompt), or None."""
    if top.get("chat_template") or top.get("fewshot_as_multiturn"):
        return "the run applied a chat template (chat_template / fewshot_as_multiturn in the results): rendering " \
               "through a chat template is not implemented"
    if cfg.get("use_prompt") is not None:
        return f"use_prompt {cfg['use_prompt']!r} (a promptsource prompt): not implemented"
    return None
