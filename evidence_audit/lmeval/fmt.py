"""The format check: lm-eval 0.4.9.2's results_*.json and samples_<task>_*.jsonl, read strictly, or refused.

A file in any other shape (another lm_eval_version, a missing or mistyped field) is refused with one line naming
the file, the line and the field (Unreadable, exit 2): an audit that guessed at an unknown format would check
something else than what lm-eval wrote. What each sample line holds, as 0.4.9.2's evaluator.py and
loggers/evaluation_tracker.py write it:

  doc_id, doc (the document as the task iterated it), target (str(doc_to_target(doc))), arguments
  ({"gen_args_<i>": {"arg_<j>": ...}} per request: (context, continuation) or (context, generation kwargs)),
  resps and filtered_resps (every leaf turned into a string by sanitize_list: a loglikelihood response is
  ["<float repr>", "True"|"False"]), filter (the filter name: one line per document and filter), metrics (the
  metric names), doc_hash, prompt_hash, target_hash, and one key per metric with its per-sample value.
"""
from dataclasses import dataclass

from evidence_audit.definitions import is_int
from evidence_audit.reading import Unreadable, read_json, read_jsonl

KNOWN_VERSIONS = ("0.4.9.2",)
RESULTS_KEYS = {"results": dict, "configs": dict, "versions": dict, "n-shot": dict, "n-samples": dict,
                "config": dict, "task_hashes": dict, "lm_eval_version": str}
SAMPLE_KEYS = {"doc_id": int, "doc": dict, "target": str, "arguments": dict, "resps": list, "filtered_resps": list,
               "filter": str, "metrics": list, "doc_hash": str, "prompt_hash": str, "target_hash": str}


@dataclass
class Sample:
    """One parsed sample line: `line` (1-based), the raw dict, and `requests`: [(context, second argument)]."""
    line: int
    raw: dict
    requests: list

    @property
    def doc_id(self):
        return self.raw["doc_id"]

    @property
    def where(self):
        return f"doc_id {self.raw['doc_id']} (line {self.line}, filter {self.raw['filter']})"


def read_results(path):
    """results_*.json, refused unless it is lm-eval 0.4.9.2's format (KNOWN_VERSIONS and the RESULTS_KEYS)."""
    r = read_json(path)
    if not isinstance(r, dict):
        raise Unreadable(f"{path}: line 1: expected a JSON object (lm-eval's results), found {type(r).__name__}")
    version = r.get("lm_eval_version")
    if version not in KNOWN_VERSIONS:
        raise Unreadable(f"{path}: field 'lm_eval_version': {version!r}; this audit reads lm-eval "
                         f"{', '.join(KNOWN_VERSIONS)} output only (README: other 0.4.x formats) — refused")
    for key, kind in RESULTS_KEYS.items():
        if not isinstance(r.get(key), kind):
            raise Unreadable(f"{path}: field {key!r}: expected {kind.__name__} in lm-eval {version}'s results, found "
                             f"{type(r.get(key)).__name__}")
    for task, ns in r["n-samples"].items():
        if not (isinstance(ns, dict) and is_int(ns.get("original")) and is_int(ns.get("effective"))):
            raise Unreadable(f"{path}: field 'n-samples.{task}': expected {{original: int, effective: int}}")
    return r


def requests_of(path, n, arguments):
    """The request tuples of a sample's `arguments` ({"gen_args_<i>": {"arg_<j>": v}}), in index order."""
    out = []
    for i in range(len(arguments)):
        req = arguments.get(f"gen_args_{i}")
        if not isinstance(req, dict) or len(req) != 2 or not isinstance(req.get("arg_0"), str) or "arg_1" not in req:
            raise Unreadable(f"{path}: line {n}: field 'arguments.gen_args_{i}': expected {{arg_0: context, arg_1: "
                             "continuation or generation kwargs}} (lm-eval 0.4.9.2)")
        out.append((req["arg_0"], req["arg_1"]))
    if not out:
        raise Unreadable(f"{path}: line {n}: field 'arguments': no request")
    return out


def read_samples(path):
    """samples_<task>_*.jsonl as [Sample], refused unless every line has 0.4.9.2's SAMPLE_KEYS with their types."""
    samples = []
    for n, raw in enumerate(read_jsonl(path), start=1):
        if not isinstance(raw, dict):
            raise Unreadable(f"{path}: line {n}: expected a JSON object (one logged sample), found "
                             f"{type(raw).__name__}")
        for key, kind in SAMPLE_KEYS.items():
            ok = is_int(raw.get(key)) if kind is int else isinstance(raw.get(key), kind)
            if not ok:
                raise Unreadable(f"{path}: line {n}: field {key!r}: expected {kind.__name__} (lm-eval 0.4.9.2 sample "
                                 f"format), found {type(raw.get(key)).__name__}")
        missing = [m for m in raw["metrics"] if not isinstance(m, str) or m not in raw]
        if missing:
            raise Unreadable(f"{path}: line {n}: field 'metrics': {missing!r} listed but no per-sample value")
        samples.append(Sample(n, raw, requests_of(path, n, raw["arguments"])))
    return samples


def loglikelihood(path, s, value, field):
    """A sanitised loglikelihood response ["<float>", "True"|"False"] as (float, bool); Unreadable otherwise."""
    ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value) \
        and value[1] in ("True", "False")
    if ok:
        try:
            ll = float(value[0])
        except ValueError:
            ok = False
    if not ok or ll != ll or ll in (float("inf"), float("-inf")):
        raise Unreadable(f"{path}: line {s.line}: field {field!r}: expected [\"<finite float>\", \"True\"|\"False\"] "
                         f"(a loglikelihood response), found {str(value)[:80]}")
    return ll, value[1] == "True"
