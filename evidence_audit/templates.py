"""The audit's one Jinja: a bounded jinja2 sandbox for the templates it renders again, lm-eval task templates
(lm-eval's settings) and chat templates (transformers' settings), both read from untrusted evidence or model
directories. The run.py evidence rules (extraction, harness: the prompt each generation was given) and `audit.py
--lm-eval` (lmeval/prompt.py: contexts, ChatTemplate) compile every template here.

Every template is compiled and rendered in a worker process, never in the audit's own: `python -m
evidence_audit.templates`, started once per scope (`bounded(label)`: one lm-eval task's identity level; outside any,
one worker for the process, which the run.py evidence rules use) and kept for every render of that scope, so an
honest run pays one process start per task, not one per render. The worker runs under RLIMIT_AS (RENDER_MEMORY)
and RLIMIT_CPU, set by itself before it reads a byte of a job (the CPU limit again before each request, to the
time the audit still waits); the audit waits on it with wall-clock deadlines (START_SECONDS, COMPILE_SECONDS...,
RENDER_SECONDS...: the constants below say how they were chosen) and kills it on expiry. It reads the template and
its variables (pickled by the audit) and answers with one JSON line, read with reading.parse_strict, followed for a
rendered text by its bytes (at most MAX_RENDER_CHARS characters, counted as the template streams them), read as
strict UTF-8. A loop that does not finish (two nested range(100000)), a regular expression that backtracks for ever
(regex_replace), a string of gigabytes (center(3000000000)) raise OverBound, an Unrenderable naming the bound: the
caller reports it as INCOMPLETE, and every later render of that scope raises it at once (one line, no wait per
document). Errors the template raises come back as exceptions of the same name and kind (a jinja2 TemplateError
stays one: lm-eval's retry without the system turn depends on it).

jinja2 is imported inside the functions and the worker: the arithmetic level never imports it. What is not
implemented raises Unrenderable naming it; the caller reports it as INCOMPLETE, never as a pass.
"""
import atexit
import builtins
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from evidence_audit.reading import Unreadable, parse_strict

_ENV, _TEMPLATES = {}, {}     # the two environments (in the worker), and the templates asked for (in the audit)

MAX_TEMPLATE_CHARS = 1 << 16     # a task template is a few hundred characters
MAX_REPEAT = 1 << 16             # the largest string/list `*` and the largest `**` exponent a template may compute
MAX_CHAT_TEMPLATE_BYTES = 1 << 20   # a chat template is a few KB (the largest published ones are under 100 KB)

# The worker's bounds, from measurements of honest renders (docs/lm-eval-audit.md, "Bounds"; this machine, a shared
# 2-vCPU EPYC, Python 3.11, jinja2 3.1.6):
# - memory: the worker with jinja2 imported maps 24 MB; rendering the largest context allowed below (MAX_RENDER_CHARS
#   of 4-byte characters, the pickled request, the joined text and its UTF-8) peaks at 223 MB. 1 GiB is over 4x
#   that and refuses center(3000000000) (2.96 GB) at once.
RENDER_MEMORY = 1 << 30
# - time, wall clock, at a load of 4 on the 2 vCPUs (and of 11-12, while the test suite ran): the worker starts in
#   0.06-0.14 s (0.5-0.9 s); jinja2 compiles 0.01 s per KB of template (0.06 s; published chat templates are 1-20
#   KB); an honest render takes 0.1-0.3 ms through the worker, 0.01-0.07 ms in-process (a 5-shot chat context of
#   ~1500 characters), and 3-60 ms per MiB of a long context. Each bound is over 10x the loaded figure it covers
#   (the compile's 4x), so only a template that does not finish reaches them; what a hostile template can cost is
#   the start, its compile and the renders' budget, proportional to the run's size.
START_SECONDS = 10.0
COMPILE_SECONDS = 2.0
COMPILE_SECONDS_PER_KB = 0.25
RENDER_SECONDS = 5.0
RENDER_SECONDS_PER_CALL = 0.01
RENDER_SECONDS_PER_MB = 1.0
# - output: a context of 8 Mi characters is about 2 M tokens, twice the longest context window a model lm-eval
#   evaluates has.
MAX_RENDER_CHARS = 1 << 23
MAX_ANSWER_BYTES = 4 * MAX_RENDER_CHARS      # the UTF-8 bytes of the longest text
MEMO_CHARS = 1 << 25             # texts and requests a scope remembers (its few-shot examples): at most ~100 MB
REPO = Path(__file__).resolve().parents[1]


class Unrenderable(Exception):
    """The audit cannot render this template or context: the message names the feature it does not implement."""


class OverBound(Unrenderable):
    """A render went past one of the worker's bounds (time, memory, output length): the audit cannot decide what
    the template renders, so it is reported as INCOMPLETE (never a FAIL: lm-eval on a larger machine might have
    rendered it)."""


def jinja(chat=False):
    """jinja2's ImmutableSandboxedEnvironment with lm-eval's settings (StrictUndefined, keep_trailing_newline) and
    its regex_replace filter, or (chat=True) with transformers' chat-template settings (trim_blocks, lstrip_blocks,
    loopcontrols, the {% generation %} tag, its tojson filter, raise_exception; strftime_now refused): a
    template from an untrusted run or model cannot reach Python objects, and `*` / `**` are bounded (a template
    cannot build a huge string). Only the worker builds it: its process bounds loops, regular expressions and
    memory."""
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


class Template:
    """A template compiled in the worker of the current scope: render(**variables) -> the text, as jinja2's
    Template.render gives it, or the exception the template raised (OverBound past a bound)."""

    def __init__(self, spec, chat):
        self.spec, self.chat = spec, chat

    def render(self, *args, **kwargs):
        return _scope().render(self, dict(*args, **kwargs))


def template(spec, chat=False):
    """A compiled template, refusing one over MAX_TEMPLATE_CHARS (a task's) or MAX_CHAT_TEMPLATE_BYTES; its syntax
    errors raise here, as jinja2's from_string raises them."""
    bound = MAX_CHAT_TEMPLATE_BYTES if chat else MAX_TEMPLATE_CHARS
    if len(spec) > bound:
        raise ValueError(f"template of {len(spec)} characters, over the audit's bound of {bound}")
    if (chat, spec) not in _TEMPLATES:
        _TEMPLATES[(chat, spec)] = Template(spec, chat)
    _scope().compile(_TEMPLATES[(chat, spec)])
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


# ---- the scope: one worker and one time budget ---------------------------------------------------------------------

_SCOPES = []         # the scopes open, innermost last; a default scope serves renders outside any
_DEFAULT = []


@contextmanager
def bounded(label):
    """Every render inside shares one worker and one time budget (`label` names them in the message, e.g. the
    task); the worker is stopped on leaving."""
    scope = Scope(label)
    _SCOPES.append(scope)
    try:
        yield scope
    finally:
        _SCOPES.remove(scope)
        scope.stop()


def _scope():
    if _SCOPES:
        return _SCOPES[-1]
    if not _DEFAULT or _DEFAULT[-1].over:
        _DEFAULT.append(Scope("templates"))
        atexit.register(_DEFAULT[-1].stop)
    return _DEFAULT[-1]


class Scope:
    """One worker process and the wall-clock time the audit waits on it: START_SECONDS for its start, for each
    compile COMPILE_SECONDS + COMPILE_SECONDS_PER_KB per KB of the template, and for the renders one shared budget,
    RENDER_SECONDS and per request RENDER_SECONDS_PER_CALL + RENDER_SECONDS_PER_MB per MiB of it, earned when it is
    sent (the time spent is what the audit waited). A scope whose bound was hit raises the same OverBound at every
    later call."""

    def __init__(self, label):
        self.label, self.allowance, self.spent = label, RENDER_SECONDS, 0.0
        self.proc, self.pid, self.over = None, None, None
        self.known, self.memo, self.memo_chars, self.buffer = {}, {}, 0, bytearray()

    def budget(self):
        return (f"over the audit's time budget for them ({self.allowance:.3g} s: templates.RENDER_SECONDS + "
                "RENDER_SECONDS_PER_CALL per render + RENDER_SECONDS_PER_MB per MiB rendered from): a loop or regular "
                "expression that does not finish")

    def fail(self, why):
        """Stop the worker and raise OverBound(why), for this call and every later one."""
        self.stop()
        self.over = f"rendering the templates of {self.label}: {why}"
        raise OverBound(self.over)

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                f.close()
            self.proc = None
            self.known, self.memo, self.memo_chars, self.buffer = {}, {}, 0, bytearray()

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "evidence_audit.templates"], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        ready = self.answer(START_SECONDS, lambda: f"the worker did not start within {START_SECONDS:g} s "
                                                   "(templates.START_SECONDS)")
        if ready.get("import_error"):
            self.stop()
            raise ImportError(f"the template worker cannot import jinja2 ({ready['import_error'][:120]})")

    def call(self, data, seconds=None, why=None):
        """Send one pickled request to the worker (started when there is none) and return its answer. `seconds`
        and `why`: this request's own time limit and what its expiry says (a compile); else the renders' budget."""
        if self.over:
            raise OverBound(self.over)
        if self.proc is None:
            self.start()
        shared = seconds is None
        if shared:
            self.allowance += RENDER_SECONDS_PER_CALL + RENDER_SECONDS_PER_MB * len(data) / (1 << 20)
            seconds, why = self.allowance - self.spent, self.budget
        try:
            self.proc.stdin.write(struct.pack("<Qd", len(data), seconds) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.died()
        return self.answer(seconds, why, shared)

    def answer(self, seconds, why, shared=False):
        """The worker's next answer, waited for at most `seconds` (then why() is the OverBound): one JSON line read
        with reading.parse_strict, and for a rendered text the `text_bytes` bytes of strict UTF-8 that follow it.
        `shared`: the time waited is spent from the renders' budget."""
        start = time.monotonic()
        try:
            line = self.receive(lambda buf: buf.find(b"\n") + 1, 1 << 16, start + seconds, why)
            try:
                got = parse_strict(line.decode("utf-8"), f"the template worker of {self.label}")
            except (Unreadable, UnicodeDecodeError) as e:
                self.fail(f"the worker's answer is unreadable ({str(e)[:120]})")
            if not isinstance(got, dict):
                self.fail("the worker's answer is not a JSON object")
            if got.get("bound") == "memory":
                self.fail(f"over the audit's memory bound of {RENDER_MEMORY >> 20} MiB (templates.RENDER_MEMORY)")
            if got.get("bound") == "output":
                self.fail(f"a rendered text of over {MAX_RENDER_CHARS} characters (templates.MAX_RENDER_CHARS)")
            n = got.get("text_bytes")
            if n is not None:
                if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_ANSWER_BYTES:
                    self.fail(f"the worker announced a text of {str(n)[:40]} bytes (the bound: {MAX_ANSWER_BYTES})")
                try:
                    got["text"] = self.receive(lambda buf: n if len(buf) >= n else 0, n, start + seconds,
                                               why).decode("utf-8")
                except UnicodeDecodeError as e:     # strict: a lone surrogate is refused too
                    self.fail(f"the worker's text is not UTF-8 ({e.reason})")
            return got
        finally:
            if shared:
                self.spent += time.monotonic() - start

    def receive(self, complete, most, deadline, why):
        """Bytes from the worker up to where complete(buffer) says (a positive end), at most `most` of them; past
        the deadline the worker is killed and OverBound(why()) raised."""
        fd = self.proc.stdout.fileno()
        while not complete(self.buffer):
            if len(self.buffer) > most:
                self.fail(f"the worker's answer is over the audit's bound of {most} bytes")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.fail(why())
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self.died()
            self.buffer += chunk
        end = complete(self.buffer)
        out = bytes(self.buffer[:end])
        del self.buffer[:end]
        return out

    def died(self):
        code = self.proc.wait()
        if code == -signal.SIGXCPU:
            self.fail("over the CPU time the audit allows it (RLIMIT_CPU, the time it still waits): a loop or "
                      "regular expression that does not finish")
        if code == -signal.SIGKILL:     # the kernel's answer to memory it could not map, or a kill from outside
            self.fail("the worker was killed (SIGKILL): memory over the machine's or the audit's bound")
        self.fail(f"the worker exited with code {code}")

    def compile(self, tpl):
        """Compile `tpl` in this scope's worker (once per worker); raises its syntax error as from_string does."""
        key = (tpl.chat, tpl.spec)
        if key not in self.known:
            number = len(self.known)
            seconds = COMPILE_SECONDS + COMPILE_SECONDS_PER_KB * len(tpl.spec) / 1024
            got = self.call(pickle.dumps(("compile", number, tpl.chat, tpl.spec, None)), seconds,
                            lambda: f"compiling a template of {len(tpl.spec)} characters took over {seconds:.3g} s "
                                    "(templates.COMPILE_SECONDS + COMPILE_SECONDS_PER_KB per KB)")
            self.known[key] = (number, got.get("error"))
        error = self.known[key][1]
        if error:
            raise remote_error(error)

    def render(self, tpl, variables):
        """The text `tpl` renders on `variables`: from this scope's memo when the same template was rendered on the
        same variables (a few-shot example is rendered once per context that shows it), else from the worker."""
        self.compile(tpl)
        number = self.known[(tpl.chat, tpl.spec)][0]
        data = pickle.dumps(("render", number, None, None, variables), protocol=pickle.HIGHEST_PROTOCOL)
        if (number, data) in self.memo:
            return self.memo[(number, data)]
        got = self.call(data)
        if "error" in got:
            raise remote_error(got["error"])
        text = got.get("text")
        if not isinstance(text, str):
            self.fail("the worker's answer holds no text")
        if self.memo_chars + len(data) + len(text) <= MEMO_CHARS:
            self.memo[(number, data)] = text
            self.memo_chars += len(data) + len(text)
        return text


_REMOTE = {}


def remote_error(error):
    """The exception the worker reported, as an instance of a class of the same name and kind: a subclass of
    Unrenderable, of jinja2's exception of that name, of the builtin exception of that name, or of Exception; its
    str() is the worker's."""
    from jinja2 import exceptions

    if not (isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)
            and isinstance(error.get("kind"), str)):
        return Unrenderable("the template worker reported an error it did not describe")
    name = error["type"] if error["type"].isidentifier() and len(error["type"]) <= 80 else "Exception"
    kind = error["kind"]
    base = Unrenderable if kind == "unrenderable" else getattr(exceptions, name, None) if kind == "jinja2" else \
        getattr(builtins, name, None) if kind == "builtin" else None
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    if (name, base) not in _REMOTE:
        _REMOTE[(name, base)] = type(name, (base,), {"__init__": lambda self, m: Exception.__init__(self, m),
                                                     "__str__": lambda self: self.args[0],
                                                     "__module__": base.__module__})
    return _REMOTE[(name, base)](error["message"][:2000])


# ---- the worker ----------------------------------------------------------------------------------------------------

def serve():
    """The worker: its limits first, then jinja2, then one answer per request on stdin until EOF. Each request
    comes with the wall-clock seconds the audit still waits; the CPU time limit is set to that before it runs."""
    import resource

    def limit(kind, soft):      # the soft limit, under a hard one set from outside (never raised: it cannot be)
        hard = resource.getrlimit(kind)[1]
        resource.setrlimit(kind, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))

    limit(resource.RLIMIT_AS, RENDER_MEMORY)
    limit(resource.RLIMIT_CPU, int(START_SECONDS) + 1)
    limit(resource.RLIMIT_CORE, 0)
    out, stdin = sys.stdout.buffer, sys.stdin.buffer
    say = lambda obj: (out.write(json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"), out.flush())  # noqa
    try:
        import jinja2  # noqa: F401
    except ImportError as e:
        say({"import_error": str(e)})
        return
    say({"ready": True})
    compiled = {}
    while True:
        head = stdin.read(16)
        if len(head) < 16:
            return
        size, seconds = struct.unpack("<Qd", head)
        op, key, chat, spec, variables = pickle.loads(stdin.read(size))
        used = resource.getrusage(resource.RUSAGE_SELF)
        limit(resource.RLIMIT_CPU, int(used.ru_utime + used.ru_stime + max(0.0, seconds)) + 1)
        try:
            if op == "compile":
                compiled[key] = jinja(chat).from_string(spec)
                say({"compiled": key})
                continue
            text, size = [], 0
            for piece in compiled[key].generate(**variables):
                size += len(piece)
                if size > MAX_RENDER_CHARS:
                    say({"bound": "output"})
                    break
                text.append(piece)
            else:
                data = "".join(text).encode("utf-8")    # a lone surrogate: ValueError (lm-eval could not write it)
                out.write(json.dumps({"text_bytes": len(data)}).encode("utf-8") + b"\n" + data)
                out.flush()
        except MemoryError:
            say({"bound": "memory"})
        except Exception as e:      # the template's error, returned by name: the audit raises it there
            kind = "unrenderable" if isinstance(e, Unrenderable) else "jinja2" if type(e).__module__.startswith(
                "jinja2") else "builtin" if getattr(builtins, type(e).__name__, None) is type(e) else "other"
            message = str(e)
            say({"error": {"type": type(e).__name__, "kind": kind,
                           "message": message if _utf8(message) else repr(message)}})


def _utf8(text):
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


if __name__ == "__main__":
    serve()
