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

With a chat template (the results' chat_template is not null: lm-eval ran with --apply_chat_template), the context
is the chat history rendered by the tokenizer's template (api/task.py fewshot_context, append_target_question,
api/samplers.py get_chat_context, models/huggingface.py apply_chat_template):

    [system: system_instruction + fewshot_delimiter + description (either alone)]
    fewshot_as_multiturn: per example  user: doc_to_text   assistant: [gen_prefix + " "] + target
                          (no target_delimiter, no fewshot_delimiter, a "" target still shown)
    else:                 user: the examples string of the plain context (target_delimiter, fewshot_delimiter),
                          drawn twice: get_chat_context draws, then calls get_context, which draws again and
                          shows its own draw (the generator advances twice per document)
    the question: a new user turn (multiturn, or after the system turn or nothing), else appended to that user turn
    [assistant: gen_prefix]

rendered with add_generation_prompt = no gen_prefix and continue_final_message = the opposite (the rendered text cut
right after the gen_prefix turn's content); when the template raises a jinja2 TemplateError lm-eval drops the
system turn and renders again, and so does the audit. A multiple_choice continuation then has no target_delimiter.

The template is the one transformers' tokenizer would use, read from the --model directory, not from the results
(which the chat row compares with it): chat_template.jinja (the "default" of additional_chat_templates/*.jinja), else
tokenizer_config.json's chat_template (a string, or a list of {name, template}: its "default"). HFLM passes no
template name to the tokenizer, so a run with --apply_chat_template NAME logs NAME's template but renders the
default; the chat row names that case. The template is rendered here with jinja2 alone (transformers is not
imported): the bounded ImmutableSandboxedEnvironment of evidence_audit/templates.py with transformers' settings
(trim_blocks, lstrip_blocks, loopcontrols, the {% generation %} tag, its tojson filter and raise_exception) and the
variables messages, add_generation_prompt, tools=None, documents=None, the special tokens tokenizer_config.json and
special_tokens_map.json declare (a missing pad_token as lm-eval's configure_pad_token sets it: unk, else eos, else
"<|pad|>") and enable_thinking from model_args. Limits: a template calling strftime_now raises Unrenderable (the date
lm-eval rendered is not recorded); a special token that only a tokenizer class's defaults supply, not the files,
renders empty here, which can only make a context differ (FAIL), never PASS.

What is not implemented raises Unrenderable naming it; the caller reports it as INCOMPLETE, never as a pass."""
import ast
import random
from pathlib import Path

from evidence_audit.lmeval.task_code import is_code
from evidence_audit.reading import read_json, read_text
from evidence_audit.templates import MAX_CHAT_TEMPLATE_BYTES, OverBound, Unrenderable, template

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "    # transformers 4.57's continue_final_message marker (chat_template_utils)
SAMPLERS = ("default", "first_n")
# A rendered choice list or list of gold answers is parsed as a Python literal in the audit's own process: 200 K
# characters of "[0,0,...]" take 0.5 s and 100 MB, 8 Mi (the longest rendered text) 21 s and 3.7 GB. The fixtures'
# are under 100 characters; a list of long answers is a few KB.
MAX_LITERAL_CHARS = 1 << 16


def literal(text):
    """ast.literal_eval(text), refusing (OverBound: undecided) a text over MAX_LITERAL_CHARS."""
    if len(text) > MAX_LITERAL_CHARS:
        raise OverBound(f"a rendered literal of {len(text)} characters, over the audit's bound of {MAX_LITERAL_CHARS} "
                        "(prompt.MAX_LITERAL_CHARS)")
    return ast.literal_eval(text)


def apply(spec, doc):
    """utils.apply_template: the Jinja template `spec` rendered on the document's fields."""
    return template(spec).render(**doc)


def doc_to_text(spec, doc, has_choices):
    """ConfigurableTask.doc_to_text for a config value: an int as it is, a field by name, else a template (a
    rendered number becomes an int when the task has doc_to_choice); a function (the task's own code, bound by
    task_code.bound to what it gave in the sandbox) called on the document, its value as it is."""
    if callable(spec):
        return spec(doc)
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
    parses (a list of gold answers); a list in the config is returned as it is; a function as in doc_to_text."""
    if callable(spec):
        return spec(doc)
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
            return literal(text)
        except (SyntaxError, ValueError):
            return text
    return text


def doc_to_choice(spec, doc):
    """ConfigurableTask.doc_to_choice: a field by name, a template read as a Python literal, a list, a dict's
    values; a function as in doc_to_text."""
    if callable(spec):
        return spec(doc)
    if isinstance(spec, str):
        return doc[spec] if spec in doc else literal(apply(spec, doc))
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
    in fewshot_config (lm-eval applies process_docs to a split's documents, not to such a list); Unrenderable for
    what the audit cannot read (a function giving the samples)."""
    fc = cfg.get("fewshot_config") or {}
    if not isinstance(fc, dict):
        raise Unrenderable(f"fewshot_config is a {type(fc).__name__}")
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


def model_arg(model_args, key):
    """The value lm-eval's simple_parse_args_string gives `key` in a model_args string ("true"/"false" in any case a
    bool, digits an int, else the text), or in a dict; None when absent."""
    if isinstance(model_args, dict):
        return model_args.get(key)
    if not isinstance(model_args, str):
        return None
    for part in model_args.split(","):
        k, _, v = part.partition("=")
        if k.strip() == key:
            v = v.strip()
            return {"true": True, "false": False}.get(v.lower(), int(v) if v.isdigit() else v)
    return None


class ChatTemplate:
    """The chat template transformers' tokenizer of `model_dir` applies when HFLM calls apply_chat_template, and
    the variables it renders with (module docstring). Unrenderable for what the audit does not reproduce; Unreadable
    (from reading.py) for a file over its bound or not UTF-8."""

    def __init__(self, model_dir, model_args):
        self.dir = Path(model_dir)
        self.text, self.source = self.select()
        self.kwargs = self.special_tokens()
        thinking, extra = model_arg(model_args, "enable_thinking"), model_arg(model_args, "chat_template_args")
        if thinking is not None:        # HFLM.__init__: chat_template_args only when enable_thinking is given
            if extra:
                raise Unrenderable("model_args set chat_template_args: not implemented")
            self.kwargs["enable_thinking"] = thinking

    def read(self, path):
        return read_text(path, limit=MAX_CHAT_TEMPLATE_BYTES)

    def config(self, name):
        path = self.dir / name
        obj = read_json(path) if path.is_file() else {}
        if not isinstance(obj, dict):
            raise Unrenderable(f"{path}: not a JSON object")
        return obj

    def select(self):
        """(template text, where it came from): template files take priority over tokenizer_config.json's entry,
        and of several templates the tokenizer applies "default" (transformers 4.57 tokenization_utils_base.py
        from_pretrained and get_chat_template)."""
        files = {}
        if (self.dir / "chat_template.jinja").is_file():
            files["default"] = self.dir / "chat_template.jinja"
        extra = self.dir / "additional_chat_templates"
        for f in sorted(extra.glob("*.jinja")) if extra.is_dir() else []:
            files[f.stem] = f
        if files:
            if "default" not in files:
                raise Unrenderable(f"{extra}: named chat templates and no default one (the tokenizer refuses to "
                                   "pick one when HFLM passes no name)")
            return self.read(files["default"]), str(files["default"])
        ct = self.config("tokenizer_config.json").get("chat_template")
        if isinstance(ct, str):
            return ct, f"{self.dir / 'tokenizer_config.json'} chat_template"
        if isinstance(ct, list) and all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                        and isinstance(x.get("template"), str) for x in ct):
            named = {x["name"]: x["template"] for x in ct}
            if "default" in named:
                return named["default"], f"{self.dir / 'tokenizer_config.json'} chat_template 'default'"
            raise Unrenderable("tokenizer_config.json names chat templates and no default one")
        if ct is None:
            raise Unrenderable(f"{self.dir} has no chat template (chat_template.jinja or tokenizer_config.json's "
                               "chat_template) and lm-eval ran with one")
        raise Unrenderable(f"tokenizer_config.json chat_template is a {type(ct).__name__}")

    def special_tokens(self):
        """{bos_token: text, ...} as tokenizer.special_tokens_map gives them to the template: tokenizer_config.json's
        entries, overridden by special_tokens_map.json's unless tokenizer_config.json has added_tokens_decoder;
        then pad_token as lm-eval's configure_pad_token sets a missing one (lm-eval 0.4.9.2
        lm_eval/models/utils.py:631: unk, else eos, else "<|pad|>"; its Qwen and RWKV cases need code the model
        directory check refuses)."""
        def text(v):
            return v.get("content") if isinstance(v, dict) else v

        cfg = self.config("tokenizer_config.json")
        merged = dict(cfg)
        if "added_tokens_decoder" not in cfg:
            merged.update(self.config("special_tokens_map.json"))
        out = {k: text(merged.get(k)) for k in SPECIAL_TOKENS if isinstance(text(merged.get(k)), str)}
        out = {k: v for k, v in out.items() if v}
        listed = merged.get("additional_special_tokens")
        extra = [text(v) for v in listed if isinstance(text(v), str)] if isinstance(listed, list) else []
        if extra:
            out["additional_special_tokens"] = extra
        if "pad_token" not in out:      # configure_pad_token adds "<|pad|>" when there is no unk or eos either
            out["pad_token"] = out.get("unk_token") or out.get("eos_token") or "<|pad|>"
        return out

    def render(self, messages, add_generation_prompt):
        """HFLM.apply_chat_template: the template on `messages`; on a jinja2 TemplateError, again without the
        system turns (lm-eval 0.4.9.2 lm_eval/models/huggingface.py:1523)."""
        from jinja2.exceptions import TemplateError

        try:
            return self.render_once(messages, add_generation_prompt)
        except TemplateError:
            return self.render_once([m for m in messages if m["role"] != "system"], add_generation_prompt)

    def render_once(self, messages, add_generation_prompt):
        """tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=a,
        continue_final_message=not a): with continue_final_message the text is cut right after the last message's
        content, found by a marker appended to it (transformers 4.57 chat_template_utils.render_jinja_template)."""
        messages = [dict(m) for m in messages]
        cont = not add_generation_prompt
        if cont:
            final = messages[-1]["content"]
            messages[-1]["content"] = final + CONTINUE_TAG
        out = template(self.text, chat=True).render(messages=messages, tools=None, documents=None,
                                                    add_generation_prompt=add_generation_prompt, **self.kwargs)
        if cont:
            if final.strip() not in out or CONTINUE_TAG.strip() not in out:
                raise ValueError("the chat template drops the final message (transformers refuses to continue it)")
            at = out.rindex(CONTINUE_TAG.strip())
            out = out[:at] if out[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else out[:at].rstrip()
        return out


class Renderer:
    """Contexts of one task, in lm-eval's order: call context(doc) once per evaluated document in dataset order
    (the few-shot generator advances with each call, as lm-eval's does). `chat`: a ChatTemplate when the run applied
    one (top's fewshot_as_multiturn then matters), else None."""

    def __init__(self, cfg, top, run_config, fewshot_docs, chat=None):
        self.cfg, self.fc = cfg, cfg.get("fewshot_config") or {}
        self.k = cfg.get("num_fewshot") or 0
        self.system = top.get("system_instruction")
        self.chat, self.multiturn = chat, top.get("fewshot_as_multiturn") is True
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
        """A few-shot example's doc_to_* spec: fewshot_config's when it sets one (not code: Unrenderable), else the
        task's."""
        if self.fc.get(key) is None:
            return self.cfg.get(key)
        if is_code(self.fc[key]):
            raise Unrenderable(f"fewshot_config.{key} is task code: not implemented")
        return self.fc[key]

    def draw(self, doc):
        """ContextSampler.get_context's choice of examples for `doc` (advances the generator)."""
        n = self.k + 1 if self.cfg.get("fewshot_split") == self.cfg.get("test_split") else self.k
        if n > len(self.docs):
            raise Unrenderable(f"{n} few-shot documents to draw from {len(self.docs)}")
        picked = self.docs[:n] if self.sampler == "first_n" else [self.docs[i] for i in
                                                                   self.rnd.sample(range(len(self.docs)), n)]
        return [d for d in picked if d != doc][:self.k]

    def shown(self, d):
        """An example's (text, target) as shown: a choice index as that choice, a list of targets as its first."""
        text = doc_to_text(self.spec("doc_to_text"), d, self.has_choices)
        target = doc_to_target(self.spec("doc_to_target"), d, self.has_choices)
        choices = lambda: doc_to_choice(self.spec("doc_to_choice"), d)  # noqa: E731
        out = text if not self.has_choices or isinstance(text, str) else choices()[text]
        if isinstance(target, list):
            return out, str(target[0])
        return out, target if not self.has_choices or isinstance(target, str) else str(choices()[target])

    def example(self, d, prefix):
        """One labelled example of the plain context: its text, then (unless its target is "") delimiter, prefix,
        target, fewshot delimiter; fewshot_config's doc_to_* replace the task's."""
        target = doc_to_target(self.spec("doc_to_target"), d, self.has_choices)
        out, shown = self.shown(d)
        return out if target == "" else out + self.td + prefix + shown + self.fd

    def system_prompt(self, doc):
        """system_instruction and the rendered description, joined by fewshot_delimiter when both are set."""
        desc = apply(self.cfg["description"], doc) if self.cfg.get("description") else ""
        if self.system is not None and desc:
            return self.system + self.fd + desc
        return self.system if self.system is not None else desc

    def question(self, doc):
        """doc_to_text(doc) as the context ends with it."""
        text = doc_to_text(self.cfg.get("doc_to_text"), doc, self.has_choices)
        if isinstance(text, int) and self.has_choices:
            raise Unrenderable("doc_to_text renders a choice index (one context per choice, multiple_input): not "
                               "implemented")
        if isinstance(text, int):
            return str(text)
        if not isinstance(text, str):
            raise Unrenderable(f"doc_to_text renders a {type(text).__name__} (one context per choice, "
                               "multiple_input): not implemented")
        return text

    def context(self, doc):
        """fewshot_context(doc): the context string every request of `doc` carries."""
        if self.chat is not None:
            return self.chat_context(doc)
        out, prefix = self.system_prompt(doc), gen_prefix(self.cfg, doc)
        if self.k > 0:
            out += "".join(self.example(d, prefix + " " if prefix else "") for d in self.draw(doc))
        return out + self.question(doc) + (self.td + prefix if prefix is not None else "")

    def chat_context(self, doc):
        """fewshot_context(doc, apply_chat_template=True): the chat history (module docstring), rendered."""
        system, prefix = self.system_prompt(doc), gen_prefix(self.cfg, doc)
        chat = [{"role": "system", "content": system}] if system else []
        if self.k > 0:
            drawn = self.draw(doc)      # get_chat_context draws once ...
            if self.multiturn:
                for d in drawn:
                    text, target = self.shown(d)
                    chat += [{"role": "user", "content": text},
                             {"role": "assistant", "content": (prefix + " " if prefix else "") + target}]
            else:                       # ... and get_context, which it calls for one user turn, draws again
                examples = "".join(self.example(d, prefix + " " if prefix else "") for d in self.draw(doc))
                chat.append({"role": "user", "content": examples})
        text = self.question(doc)
        if self.multiturn or not chat or chat[-1]["role"] == "system":
            chat.append({"role": "user", "content": text})
        else:
            chat[-1]["content"] += text
        if prefix:
            chat.append({"role": "assistant", "content": prefix})
        return self.chat.render(chat, add_generation_prompt=not prefix)


def not_implemented(cfg, top):
    """Why the audit cannot render this task's contexts at all (a promptsource prompt, a chat template applied by
    the model itself), or None."""
    if top.get("chat_template") == "":
        return "the results' chat_template is empty (a model type without a tokenizer renders its chats itself): " \
               "not implemented"
    if cfg.get("use_prompt") is not None:
        return f"use_prompt {cfg['use_prompt']!r} (a promptsource prompt): not implemented"
    return None
