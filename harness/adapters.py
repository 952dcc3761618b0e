"""Model adapters: the seam between the harness and a model. Anything with a `name` and
`generate(prompts) -> list[str]` (one reply per prompt, same order) is an adapter.

- ToyAdapter: a deterministic pattern matcher written against the shipped fixture tasks (it never reads
  targets). It scores 1.0 on them and proves the plumbing, not any ability; on other tasks it says "I don't know".
- WrongAdapter: always answers "∅", which no metric accepts: 0.0 everywhere.
- SmolLM2Adapter: a loaded Hugging Face causal LM and its tokenizer, passed in (this module loads no model:
  experiments/harness.py passes the model loaded by the repository's adapter.py, `python -m harness` one loaded
  by harness/hf_model.py, which adapter.py's loader calls too: the same model either way). Chat template with the
  user turn, greedy decoding, at most `max_new_tokens` new tokens, one prompt per forward pass (no padding, so a
  reply does not depend on which batch it landed in). It implements the optional `cancel()`, which the runner
  calls when a call runs out of time. It keeps, per prompt, what an audit needs to re-check the generation with
  its own forward pass (`generations`: the chat-rendered prompt, its token ids, the generated token ids including
  a final eos, and the finish reason: eos, length, or cancelled).
"""
import re
import threading
from typing import List, Protocol, Sequence


class ModelAdapter(Protocol):
    name: str

    def generate(self, prompts: Sequence[str]) -> List[str]: ...


DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december"]
CODE = {  # phrase in the prompt -> a solution
    "returns x doubled": "return 2 * x",
    "returns it reversed": "return x[::-1]",
    "returns the sum of the list": "return sum(x)",
    "if the integer x is even": "return x % 2 == 0",
    "returns the largest number": "return max(x)",
    "number of vowels": "return sum(ch in 'aeiou' for ch in x)",
    "returns the factorial": "import math\n    return math.factorial(x)",
    "returns x squared": "return x ** 2",
}
MC_RULES = {  # question -> how to pick an option from the option texts
    "largest": lambda opts: max(opts, key=lambda o: int(o[1])),
    "smallest": lambda opts: min(opts, key=lambda o: int(o[1])),
    "longest": lambda opts: max(opts, key=lambda o: len(o[1])),
    "shortest": lambda opts: min(opts, key=lambda o: len(o[1])),
    "alphabetical": lambda opts: min(opts, key=lambda o: o[1]),
    "even": lambda opts: next(o for o in opts if int(o[1]) % 2 == 0),
    "odd": lambda opts: next(o for o in opts if int(o[1]) % 2 == 1),
}


class ToyAdapter:
    name = "toy"

    def answer(self, prompt):
        if m := re.search(r"What is (-?\d+) ([-+*]) (-?\d+)\?", prompt):
            a, op, b = int(m[1]), m[2], int(m[3])
            return str(a + b if op == "+" else a - b if op == "-" else a * b)
        if m := re.search(r"Write the word '(\w+)' backwards", prompt):
            return f"Backwards it is {m[1][::-1]}."
        if m := re.search(r"comes right after (\w+)\?", prompt):
            seq = DAYS if m[1].lower() in DAYS else MONTHS
            return seq[(seq.index(m[1].lower()) + 1) % len(seq)].capitalize()
        if "days of the weekend" in prompt:
            return "Saturday"
        if options := re.findall(r"^([A-D])\) (.+)$", prompt, re.M):
            rule = next(r for key, r in MC_RULES.items() if key in prompt.split("\n")[0])
            return rule(options)[0]
        if m := re.search(r"in one sentence\.\n\n(.+)", prompt, re.S):
            return m[1].split(". ")[0] + "."
        for phrase, body in CODE.items():
            if phrase in prompt:
                return f"```python\ndef f(x):\n    {body}\n```"
        return "I don't know."

    def generate(self, prompts):
        return [self.answer(p) for p in prompts]


class WrongAdapter:
    name = "wrong"

    def generate(self, prompts):
        return ["\u2205" for _ in prompts]


class SmolLM2Adapter:
    def __init__(self, model, tokenizer, name, max_new_tokens, max_input_tokens):
        """model: a transformers causal LM in eval mode; name: the model's, shown in the leaderboard (its lock id
        or its local directory's name: this adapter serves any chat model, so it is named by the model);
        a prompt longer than max_input_tokens after the chat template is an error, never truncated."""
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.max_new_tokens, self.max_input_tokens = max_new_tokens, max_input_tokens
        self.tokens = {"prompt": 0, "generated": 0, "calls": 0}
        self.generations = {}   # prompt -> {"prompt", "prompt_ids", "generated_ids", "finish_reason"}
        self._cancel = threading.Event()

    def cancel(self):
        """Called by the runner (from another thread) when the current call ran out of time: generation stops
        after the next token and the remaining prompts of the batch are skipped."""
        self._cancel.set()

    def render(self, prompt):
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)

    def generate(self, prompts):
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        cancel = self._cancel
        cancel.clear()

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool)

        tok, replies = self.tokenizer, []
        for prompt in prompts:
            if cancel.is_set():
                replies.append("")
                continue
            rendered = self.render(prompt)
            enc = tok(rendered, return_tensors="pt", add_special_tokens=False)
            n = enc["input_ids"].shape[1]
            if n > self.max_input_tokens:
                raise ValueError(f"prompt of {n} tokens exceeds max_input_tokens={self.max_input_tokens}")
            with torch.no_grad():
                out = self.model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                          do_sample=False, max_new_tokens=self.max_new_tokens,
                                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                          stopping_criteria=StoppingCriteriaList([Cancelled()]),
                                          temperature=None, top_p=None, top_k=None)
            new = out[0, n:]
            self.tokens["prompt"] += n
            self.tokens["generated"] += int(new.shape[0])
            self.tokens["calls"] += 1
            self.generations[prompt] = self.trace(rendered, enc["input_ids"][0].tolist(), new.tolist())
            replies.append(tok.decode(new, skip_special_tokens=True))
        return replies

    def trace(self, rendered, prompt_ids, generated_ids):
        """One generation as the audit re-checks it: stopped by eos (the last id), by the length cap, or cancelled."""
        eos = self.tokenizer.eos_token_id
        finish = "eos" if generated_ids and generated_ids[-1] == eos else \
            "length" if len(generated_ids) == self.max_new_tokens else "cancelled"
        return {"prompt": rendered, "prompt_ids": prompt_ids, "generated_ids": generated_ids,
                "finish_reason": finish}


def make_adapter(name, load_model=None, model_name=None, max_new_tokens=None, max_input_tokens=None):
    """The adapter called `name`; for smollm2, `load_model()` returns (model, tokenizer) and the adapter is named
    `model_name` (the model's name, e.g. smollm2-135m-instruct-q4_1 or a local directory's name)."""
    if name == "toy":
        return ToyAdapter()
    if name == "wrong":
        return WrongAdapter()
    if name == "smollm2":
        model, tokenizer = load_model()
        return SmolLM2Adapter(model, tokenizer, model_name, max_new_tokens, max_input_tokens)
    raise ValueError(f"unknown adapter {name!r} (toy, wrong, smollm2)")
