"""The audit's one Jinja: a bounded jinja2 sandbox for the templates it renders again, lm-eval task templates
(lm-eval's settings) and chat templates (transformers' settings), both read from untrusted evidence or model
directories. The run.py evidence rules (extraction, harness: the prompt each generation was given) and `audit.py
--lm-eval` (lmeval/prompt.py: contexts, ChatTemplate) compile every template here.

jinja2 is imported inside the functions: the arithmetic level never imports it. What is not implemented raises
Unrenderable naming it; the caller reports it as INCOMPLETE, never as a pass.
"""
import json

_ENV, _TEMPLATES = {}, {}     # the two environments, and the templates compiled in them

MAX_TEMPLATE_CHARS = 1 << 16     # a task template is a few hundred characters
MAX_REPEAT = 1 << 16             # the largest string/list `*` and the largest `**` exponent a template may compute
MAX_CHAT_TEMPLATE_BYTES = 1 << 20   # a chat template is a few KB (the largest published ones are under 100 KB)


class Unrenderable(Exception):
    """The audit cannot render this template or context: the message names the feature it does not implement."""


def jinja(chat=False):
    """jinja2's ImmutableSandboxedEnvironment with lm-eval's settings (StrictUndefined, keep_trailing_newline) and
    its regex_replace filter, or (chat=True) with transformers' chat-template settings (trim_blocks, lstrip_blocks,
    loopcontrols, the {% generation %} tag, its tojson filter, raise_exception; strftime_now refused): a
    template from an untrusted run or model cannot reach Python objects, and `*` / `**` are bounded (a template
    cannot build a huge string). Not bounded: a long loop (jinja's sandbox caps one range() at 100000 items) makes
    the audit slow."""
    if chat not in _ENV:
        import re

        from jinja2 import StrictUndefined, nodes
        from jinja2.exceptions import SecurityError, TemplateError
        from jinja2.ext import Extension, loopcontrols
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

        if not chat:
            env = Bounded(undefined=StrictUndefined, keep_trailing_newline=True)
            env.filters["regex_replace"] = lambda s, pattern, repl, count=0: re.sub(pattern, repl, s, count=count)
        else:
            class Generation(Extension):
                """{% generation %}...{% endgeneration %}: transformers marks assistant text with it; the body
                renders as it is (the marks matter only for assistant masks, never for the text)."""
                tags = {"generation"}

                def parse(self, parser):
                    lineno = next(parser.stream).lineno
                    body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
                    return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

                def _body(self, caller):
                    return caller()

            def raise_exception(message):
                raise TemplateError(message)

            def strftime_now(_format):
                raise Unrenderable("the chat template calls strftime_now: the date lm-eval rendered is not recorded")

            env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
            env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
                json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
            env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        _ENV[chat] = env
    return _ENV[chat]


def template(spec, chat=False):
    """A compiled template (cached), refusing one over MAX_TEMPLATE_CHARS (a task's) or MAX_CHAT_TEMPLATE_BYTES."""
    bound = MAX_CHAT_TEMPLATE_BYTES if chat else MAX_TEMPLATE_CHARS
    if len(spec) > bound:
        raise ValueError(f"template of {len(spec)} characters, over the audit's bound of {bound}")
    if (chat, spec) not in _TEMPLATES:
        _TEMPLATES[(chat, spec)] = jinja(chat).from_string(spec)
    return _TEMPLATES[(chat, spec)]


def chat_renderer(text):
    """The chat template `text` compiled as transformers renders it (jinja(chat=True)), or None without jinja2, a
    template, or for one over MAX_CHAT_TEMPLATE_BYTES (the caller then says the prompt was NOT re-rendered)."""
    if text is None:
        return None
    try:
        return template(text, chat=True)
    except (ImportError, ValueError):
        return None
