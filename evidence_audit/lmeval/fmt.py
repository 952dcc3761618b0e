"""The format check: the results_*.json and samples_<task>_*.jsonl of every lm-eval release in
versions.KNOWN_VERSIONS (0.4.5 to 0.4.13), read strictly, or refused.

Which release wrote a run: the results' `lm_eval_version` (written from 0.4.9 on), else its shape. A results file
without that field is read as one of the releases that write none (0.4.5, 0.4.7, 0.4.8) only when it holds every
key those releases write and no other; its samples' keys then tell 0.4.5 (no `filter`, no `metrics`) from 0.4.7 /
0.4.8 (whose facts are the same). Releases before 0.4.5 were not read: one whose files had the same shape would be
read as 0.4.5 (a limit of reading by shape, stated here). Any other version string, or a key the release named
never writes (e.g. `start_time` in a file that says 0.4.10), is refused with one line naming the file, the field
and the releases read (Unreadable, exit 2): an audit that guessed at an unknown format would check something else
than what lm-eval wrote.

What the rest of the audit reads is one view of every release (the 0.4.9.2 shape): results.<task> without the
non-metric keys 0.4.12 on adds (`name`, `sample_len`; kept in `extras` for the count check), and every sample with
`filter` and `metrics`. 0.4.5 logs neither: `metrics` is then the keys beside its sample keys, and `filter` the
filter whose block the line is in (0.4.5 evaluator.py:528-559 logs every document of the first filter, then every
document of the next, in the order the task applies its filter_list; Sample.inferred names them). What differs in
meaning between releases (n-samples.effective, doc_id labelling with --samples, acc_bytes, acc_mutual_info) is
carried by Release.facts for the checks that depend on it.

What each sample line holds (0.4.9.2's evaluator.py and loggers/evaluation_tracker.py; versions.py for the rest):
  doc_id, doc (the document as the task iterated it), target (str(doc_to_target(doc))), arguments
  ({"gen_args_<i>": {"arg_<j>": ...}} per request: (context, continuation) or (context, generation kwargs); a
  loglikelihood_rolling task's one request has its text alone, {"gen_args_0": {"arg_0": doc_to_target(doc)}}:
  lm-eval 0.4.9.2 lm_eval/api/task.py:1455-1456, read here as (text, None); a release without `filter` logged
  (0.4.5) is not read for such a task: no rolling output of it was checked),
  resps and filtered_resps (every leaf turned into a string by sanitize_list: a loglikelihood response is
  ["<float repr>", "True"|"False"]), filter (the filter name: one line per document and filter), metrics (the
  metric names), doc_hash, prompt_hash, target_hash, and one key per metric with its per-sample value.
"""
from dataclasses import dataclass, field

from evidence_audit.definitions import is_int
from evidence_audit.lmeval.versions import KNOWN_VERSIONS
from evidence_audit.reading import Unreadable, read_json, read_jsonl


def version_key(v):
    return tuple(int(x) for x in v.split("."))


READ = tuple(sorted(KNOWN_VERSIONS, key=version_key))            # the releases this audit reads
UNVERSIONED = tuple(v for v in READ if not KNOWN_VERSIONS[v]["lm_eval_version_key"])
RESULTS_KEYS = {"results": dict, "configs": dict, "versions": dict, "n-shot": dict, "n-samples": dict,
                "config": dict, "task_hashes": dict}
SAMPLE_KEYS = {"doc_id": int, "doc": dict, "target": str, "arguments": dict, "resps": list, "filtered_resps": list,
               "filter": str, "metrics": list, "doc_hash": str, "prompt_hash": str, "target_hash": str}
INFERRED = ("filter", "metrics")      # the keys a release may not log, supplied by read_samples
ROLLING = "loglikelihood_rolling"     # the output type whose request is the text alone


def releases_read():
    return ", ".join(READ)


@dataclass
class Release:
    """The release(s) one file was read as: one, or the releases without a version field whose files look alike
    (their facts agree on everything the checks read; read_samples narrows by the sample keys)."""
    versions: tuple

    @property
    def name(self):
        return " or ".join(self.versions)

    def fact(self, key):
        """A fact of versions.KNOWN_VERSIONS all the candidate releases share (an error in this module if not)."""
        values = {repr(KNOWN_VERSIONS[v][key]) for v in self.versions}
        if len(values) != 1:
            raise AssertionError(f"lm-eval {self.name} differ in {key}: narrow first")
        return KNOWN_VERSIONS[self.versions[0]][key]


@dataclass
class Sample:
    """One parsed sample line: `line` (1-based), the raw dict, and `requests`: [(context, second argument)];
    `inferred`: the keys of raw the release did not log (INFERRED), supplied by read_samples."""
    line: int
    raw: dict
    requests: list
    inferred: tuple = field(default=())

    @property
    def doc_id(self):
        return self.raw["doc_id"]

    @property
    def where(self):
        return f"doc_id {self.raw['doc_id']} (line {self.line}, filter {self.raw['filter']})"


def release_of(path, r):
    """The Release of a results dict, or Unreadable naming the field and the releases read."""
    if "lm_eval_version" in r:
        version = r["lm_eval_version"]
        if not isinstance(version, str) or version not in KNOWN_VERSIONS \
                or not KNOWN_VERSIONS[version]["lm_eval_version_key"]:
            raise Unreadable(f"{path}: field 'lm_eval_version': {version!r}; this audit reads lm-eval "
                             f"{releases_read()} output only (docs/lm-eval-audit.md: versions) — refused")
        return Release((version,))
    shape = set(KNOWN_VERSIONS[UNVERSIONED[0]]["results_keys"])
    assert all(set(KNOWN_VERSIONS[v]["results_keys"]) == shape for v in UNVERSIONED)
    missing = sorted(shape - set(r))
    if missing:
        raise Unreadable(f"{path}: field 'lm_eval_version': absent, and field {missing[0]!r} too, which lm-eval "
                         f"{', '.join(UNVERSIONED)} (the releases read that write no version) always write; this audit "
                         f"reads lm-eval {releases_read()} output only — refused")
    return Release(UNVERSIONED)


def read_results(path):
    """results_*.json as (the results dict in the one view, its Release, {task: extras}); refused unless it is the
    output of a release read (see the module docstring) with RESULTS_KEYS of their types."""
    r = read_json(path)
    if not isinstance(r, dict):
        raise Unreadable(f"{path}: line 1: expected a JSON object (lm-eval's results), found {type(r).__name__}")
    release = release_of(path, r)
    written = set(release.fact("results_keys")) | {"groups"}        # a task group adds "groups"
    other = sorted(set(r) - written)
    if other:
        raise Unreadable(f"{path}: field {other[0]!r}: lm-eval {release.name} never writes it (another release's "
                         f"results?); this audit reads lm-eval {releases_read()} output only — refused")
    for key, kind in RESULTS_KEYS.items():
        if not isinstance(r.get(key), kind):
            raise Unreadable(f"{path}: field {key!r}: expected {kind.__name__} in lm-eval {release.name}'s results, "
                             f"found {type(r.get(key)).__name__}")
    for task, ns in r["n-samples"].items():
        if not (isinstance(ns, dict) and is_int(ns.get("original")) and is_int(ns.get("effective"))):
            raise Unreadable(f"{path}: field 'n-samples.{task}': expected {{original: int, effective: int}}")
    extras, moved = {}, set(release.fact("task_result_keys")) - {"alias"}
    # a key some release writes beside a task's metrics, but not this one: the file is another release's
    foreign = {k for v in KNOWN_VERSIONS.values() for k in v["task_result_keys"]} - set(release.fact("task_result_keys"))
    for task, entry in r["results"].items():
        other = sorted(foreign & set(entry)) if isinstance(entry, dict) else []
        if other:
            raise Unreadable(f"{path}: field 'results.{task}.{other[0]}': lm-eval {release.name} never writes it "
                             f"(another release's results?); this audit reads lm-eval {releases_read()} output only "
                             "— refused")
    for task, entry in r["results"].items():
        if isinstance(entry, dict) and moved & set(entry):
            extras[task] = {k: entry[k] for k in moved if k in entry}
            r["results"][task] = {k: v for k, v in entry.items() if k not in moved}
    return r, release, extras


def requests_of(path, n, arguments, release, rolling=False):
    """The request tuples of a sample's `arguments` ({"gen_args_<i>": {"arg_<j>": v}}), in index order; for a
    loglikelihood_rolling task (`rolling`) exactly {"gen_args_0": {"arg_0": text}}, read as [(text, None)]."""
    if rolling:
        req = arguments.get("gen_args_0")
        if len(arguments) != 1 or not isinstance(req, dict) or set(req) != {"arg_0"} \
                or not isinstance(req["arg_0"], str):
            raise Unreadable(f"{path}: line {n}: field 'arguments': expected {{gen_args_0: {{arg_0: text}}}} (one "
                             f"{ROLLING} request, lm-eval {release.name})")
        return [(req["arg_0"], None)]
    out = []
    for i in range(len(arguments)):
        req = arguments.get(f"gen_args_{i}")
        if not isinstance(req, dict) or len(req) != 2 or not isinstance(req.get("arg_0"), str) or "arg_1" not in req:
            raise Unreadable(f"{path}: line {n}: field 'arguments.gen_args_{i}': expected {{arg_0: context, arg_1: "
                             f"continuation or generation kwargs}} (lm-eval {release.name})")
        out.append((req["arg_0"], req["arg_1"]))
    if not out:
        raise Unreadable(f"{path}: line {n}: field 'arguments': no request")
    return out


def filter_names(config):
    """The filter names of a task config, in the order lm-eval applies them ("none" without a filter_list)."""
    fl = config.get("filter_list") if isinstance(config, dict) else None
    if not isinstance(fl, list):
        return ["none"]
    return [f.get("name") if isinstance(f, dict) else None for f in fl]


def narrow(path, release, lines):
    """The release(s) among `release`'s whose sample keys the first line has (0.4.5 logs no filter/metrics)."""
    if not lines or not isinstance(lines[0], dict):
        return release
    logs = "filter" in lines[0] or "metrics" in lines[0]
    fits = tuple(v for v in release.versions if ("filter" in KNOWN_VERSIONS[v]["sample_keys"]) == logs)
    if not fits:
        raise Unreadable(f"{path}: line 1: field 'filter': {'present' if logs else 'absent'}, which lm-eval "
                         f"{release.name} {'never logs' if logs else 'always logs'} — refused")
    return Release(fits)


def read_samples(path, release, config):
    """samples_<task>_*.jsonl as ([Sample], the Release narrowed by its keys), refused unless every line has the
    release's sample keys with their types. `config`: the task's dumped config (its filter names, for a release
    that does not log them)."""
    lines = read_jsonl(path)
    if not lines:
        return [], release          # nothing to read; the count checks name the missing samples
    release = narrow(path, release, lines)
    logged = release.fact("sample_keys")
    inferred = tuple(k for k in INFERRED if k not in logged)
    rolling = isinstance(config, dict) and config.get("output_type") == ROLLING
    if rolling and inferred:
        raise Unreadable(f"{path}: a {ROLLING} task of lm-eval {release.name} (no `filter` logged): not read by this "
                         "audit")
    names = filter_names(config)
    block = len(lines) // len(names) if names and len(lines) % len(names) == 0 else None
    if inferred and block is None:
        raise Unreadable(f"{path}: {len(lines)} lines for the {len(names)} filters {names} of the task config: "
                         f"lm-eval {release.name} logs one line per document and filter, filter by filter")
    samples = []
    for n, raw in enumerate(lines, start=1):
        if not isinstance(raw, dict):
            raise Unreadable(f"{path}: line {n}: expected a JSON object (one logged sample), found "
                             f"{type(raw).__name__}")
        if inferred:
            for key in inferred:
                if key in raw:
                    raise Unreadable(f"{path}: line {n}: field {key!r}: lm-eval {release.name} never logs it — "
                                     "refused")
            # metrics: every key beside the release's sample keys, in the order logged (example.update(metrics))
            raw = dict(raw, filter=names[(n - 1) // block], metrics=[k for k in raw if k not in logged])
        for key, kind in SAMPLE_KEYS.items():
            ok = is_int(raw.get(key)) if kind is int else isinstance(raw.get(key), kind)
            if not ok:
                raise Unreadable(f"{path}: line {n}: field {key!r}: expected {kind.__name__} (lm-eval {release.name} "
                                 f"sample format), found {type(raw.get(key)).__name__}")
        missing = [m for m in raw["metrics"] if not isinstance(m, str) or m not in raw]
        if missing:
            raise Unreadable(f"{path}: line {n}: field 'metrics': {missing!r} listed but no per-sample value")
        other = [k for k in raw if k not in SAMPLE_KEYS and k not in raw["metrics"]]
        if other:
            raise Unreadable(f"{path}: line {n}: field {other[0]!r}: neither a sample key of lm-eval {release.name} "
                             "nor a metric the line lists — refused")
        samples.append(Sample(n, raw, requests_of(path, n, raw["arguments"], release, rolling), inferred))
    return samples, release


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
