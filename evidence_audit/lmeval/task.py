"""One task of one lm-eval run, as the audit sees it: its dumped config, its logged samples, its results entry,
and what follows from the config alone (metrics and their aggregation, filters, question groups)."""
from dataclasses import dataclass

from evidence_audit.lmeval.metrics import DEFAULT_AGGREGATION
from evidence_audit.lmeval.versions import KNOWN_VERSIONS

# Documents that are parts of a multi-document group (MC-TACO: one document per candidate answer of a question):
# a task whose docs carry all of these fields is grouped by (sentence, question).
GROUP_FIELDS = ("sentence", "question", "answer")
GROUP_KEY = ("sentence", "question")
DEFAULT_METRICS = {"multiple_choice": ["acc", "acc_norm"], "generate_until": ["exact_match"],
                   "loglikelihood": ["perplexity", "acc"]}


@dataclass
class TaskRun:
    name: str           # the task name (results' key, samples file name)
    label: str          # the report's experiment column (the task, @date when RUN_DIR holds several runs)
    config: dict        # results["configs"][name]: the task config lm-eval dumped
    results: dict       # results["results"][name]: "<metric>,<filter>" -> value
    n_samples: dict     # results["n-samples"][name]
    run_config: dict    # results["config"]: limit, bootstrap_iters, model_args, ...
    samples: list       # [fmt.Sample] in file order
    path: object        # the samples file
    selection: list = None      # the doc ids the user passed to lm-eval's --samples for this task (audit.py --samples)
    release: object = None      # fmt.Release: the lm-eval release(s) the files were read as, with their facts
    extras: dict = None         # results.<task>'s non-metric keys besides alias (0.4.12 on: name, sample_len)

    def fact(self, key):
        """A versions.KNOWN_VERSIONS fact of the release that wrote this task's files (0.4.9.2's without one)."""
        return KNOWN_VERSIONS["0.4.9.2"][key] if self.release is None else self.release.fact(key)

    @property
    def output_type(self):
        return self.config.get("output_type")

    @property
    def limit(self):
        return self.run_config.get("limit")

    def metric_entries(self):
        """{metric: its metric_list entry} (DEFAULT_METRICS for the output type when the config has none)."""
        entries = self.config.get("metric_list")
        if not isinstance(entries, list):
            entries = [{"metric": m} for m in DEFAULT_METRICS.get(self.output_type, [])]
        return {e["metric"]: e for e in entries if isinstance(e, dict) and isinstance(e.get("metric"), str)}

    def aggregation(self, metric):
        """The aggregation name lm-eval used for `metric`: the config's, else the metric's registered default,
        else "mean" (evaluator_utils.calculate_aggregate_metric's fallback for an unregistered metric)."""
        entry = self.metric_entries().get(metric, {})
        agg = entry.get("aggregation")
        return agg if isinstance(agg, str) else DEFAULT_AGGREGATION.get(metric, "mean")

    def filters(self):
        """{filter name: steps} from the config's filter_list; {"none": [take_first]} without one."""
        fl = self.config.get("filter_list")
        if not isinstance(fl, list):
            return {"none": [{"function": "take_first"}]}
        return {f.get("name"): f.get("filter") for f in fl if isinstance(f, dict)}

    def grouped(self):
        """True when the documents are parts of (sentence, question) groups (GROUP_FIELDS all present)."""
        return bool(self.samples) and all(all(k in s.raw["doc"] for k in GROUP_FIELDS) for s in self.samples)

    def by_filter(self):
        """{filter name: [samples]} in file order (lm-eval writes one line per document and filter)."""
        out = {}
        for s in self.samples:
            out.setdefault(s.raw["filter"], []).append(s)
        return out


def group_of(doc):
    """A document's (sentence, question) group key, and a short name for messages."""
    key = tuple(str(doc.get(k)) for k in GROUP_KEY)
    q = key[1] if len(key[1]) <= 60 else key[1][:59] + "…"
    return key, f"question {q!r}"
