"""Audit one lm-eval output directory: discover its runs, read them strictly, run the levels per task, and build
the report dict in the form evidence_audit.driver builds it (same checks, counts, checks.headline, exit code)."""
from pathlib import Path

from evidence_audit import sampling
from evidence_audit.checks import ARITHMETIC, AUDIT_FORMAT, FORWARD, IDENTITY, Checks, headline, short
from evidence_audit.lmeval import aggregate, digest, docs, generate, groups, identity, persample, rescore, rolling
from evidence_audit.lmeval.files import discover, orphan_samples
from evidence_audit.lmeval.fmt import read_results, read_samples
from evidence_audit.lmeval.task import TaskRun
from evidence_audit.reading import Unreadable
from evidence_audit.templates import bounded


class Results:
    """A parsed results file and the name messages use for it."""

    def __init__(self, path):
        self.path, self.name = path, path.name
        self.data, self.release, self.extras = read_results(path)


def data_for(data_args, task):
    """--data FILE (every task) or --data TASK=FILE (that task) -> the file for `task`, or None (also
    --fewshot-data and --task-code, whose value is a directory)."""
    plain = [d for d in data_args if "=" not in d]
    named = dict(d.split("=", 1) for d in data_args if "=" in d)
    return Path(named[task]) if task in named else (Path(plain[-1]) if plain else None)


def tasks_of(run, res, several, C, only, selection=None):
    """The TaskRuns of one run (results configs x samples files; `selection`: audit.py --samples, {task: ids});
    rows for a task without samples and samples without a task (a results entry with no config is a group:
    groups.group_rows)."""
    out, top = [], res.data
    label = lambda name: f"{name}@{run.date_id[:19]}" if several else name      # noqa: E731
    for name in top["configs"]:
        if only and name not in only:
            C.skip(label(name), "-", "(whole task)", "not selected (--task)", requested=False)
            continue
        if name not in run.samples:
            C.add(label(name), ARITHMETIC, "samples file", 0,
                  [f"{res.name}: task {name} has no samples_{name}_{run.date_id}.jsonl beside it (run lm_eval with "
                   "--log_samples)"])
            continue
        if not isinstance(top["results"].get(name), dict) or not isinstance(top["n-samples"].get(name), dict):
            raise Unreadable(f"{res.path}: field 'results.{name}' or 'n-samples.{name}': missing for a configured task")
        samples, release = read_samples(run.samples[name], res.release, top["configs"][name])
        out.append(TaskRun(name, label(name), top["configs"][name], top["results"][name], top["n-samples"][name],
                           top["config"], samples, run.samples[name], (selection or {}).get(name), release,
                           res.extras.get(name, {})))
    for name in sorted(set(run.samples) - set(top["configs"])):
        C.add(label(name), ARITHMETIC, "samples file", 0,
              [f"{run.samples[name].name}: no config for task {name} in {res.name}"])
    return out


def audit_task(C, t, res, levels, opts):
    """Every level's rows for one task; returns its forward figures (or None)."""
    docs.doc_id_rows(C, t)
    docs.hash_rows(C, t, res)
    docs.group_row(C, t)
    if t.output_type == rolling.ROLLING and t.config.get("process_results") is not None:
        # lm-eval computes every per-sample metric of such a task with the task's own code (0.4.9.2
        # api/task.py:1546-1548: ConfigurableTask.process_results calls config.process_results instead of its built-in
        # metrics): recomputing them by the built-in definitions would accuse an honest run (wikitext's word counts);
        # other output types: persample.persample_rows leaves them to the identity level, which runs the code
        C.skip(t.label, ARITHMETIC, "per-sample metrics recomputed",
               f"process_results is set ({short(t.config['process_results'], 60)}: task code the audit does not run "
               "for a rolling task): every per-sample metric is its output; NOT checked")
    elif t.output_type == rolling.ROLLING:
        rolling.persample_rows(C, t)
    else:
        persample.persample_rows(C, t, res.data, IDENTITY in levels)
    aggregate.aggregate_rows(C, t, res.name, res.data)
    ids = None
    if IDENTITY in levels:
        with bounded(t.label):      # every template of the task in one worker, under one budget
            identity.identity_rows(C, t, res.data, data_for(opts["data"], t.name), data_for(opts["fewshot"], t.name),
                                   opts["loaded"], opts["model"], data_for(opts["task_code"], t.name))
        ids = rescore.boundary_rows(C, t, opts["model"], res.data)
    if FORWARD in levels and t.output_type == generate.GENERATE_UNTIL:
        return generate.generate_rows(C, t, opts["model"], res.data, opts["sample"])
    if FORWARD in levels:
        return rescore.forward_rows(C, t, opts["model"], res.data, ids, opts["sample"])
    return None


def verdict(report, rows):
    """headline's verdict, then INCOMPLETE instead of FAIL when every failure is a check the audit could not do
    (the exit code stays 1: such a run never PASSes)."""
    headline(report)
    failed = [r for r in rows if r["status"] == "FAIL"]
    if failed and all(f.startswith("INCOMPLETE: ") for r in failed for f in r["failures"]):
        report["result"] = f"INCOMPLETE: {len(failed)} requested check(s) could not run (see their rows)"
        report["n_incomplete"] = len(failed)
    return report


def audit_lmeval(run_dir, levels=(ARITHMETIC,), data=(), model=None, sample=None, only=None, options=None,
                 fewshot=(), selection=None, task_code=(), allowed_signers=None):
    """The report dict of `audit.py --lm-eval RUN_DIR` (options: checks.AuditOptions, e.g. --threads; fewshot:
    the --fewshot-data arguments; selection: --samples, {task: doc ids}; task_code: the --task-code arguments;
    allowed_signers: --allowed-signers FILE, checked, for the signed digest: lmeval/digest.py). Raises Unreadable
    (exit 2) for an unreadable or unknown format."""
    C, details, tasks = Checks(options), {}, []
    opts = {"data": data, "fewshot": fewshot, "model": model, "sample": sample, "loaded": {}, "task_code": task_code}
    runs = discover(run_dir)
    for run in runs:
        res = Results(run.results)
        if run.json_named and not res.release.fact("json_output_path"):
            raise Unreadable(f"{run.results}: named after an --output_path ending in .json, which lm-eval "
                             f"{res.release.name} never does (it writes results_<date>.json) — refused")
        run_tasks = tasks_of(run, res, len(runs) > 1, C, only, selection)
        for t in run_tasks:
            tasks.append(t.label)
            figures = audit_task(C, t, res, levels, opts)
            if figures:
                details[t.label] = {"forward": figures}
        groups.group_rows(C, res, {t.name: t for t in run_tasks},
                          lambda name, r=run: f"{name}@{r.date_id[:19]}" if len(runs) > 1 else name, only)
    for p in orphan_samples(run_dir, runs):
        C.add("-", ARITHMETIC, "samples file", 0, [f"{p}: a samples file with no results file of its date"])
    for name in only or []:
        if name not in tasks:
            C.add(name, ARITHMETIC, "task", 0, [f"--task {name}: no such task in {run_dir}"])
    for name in selection or {}:
        if not any(t == name or t.startswith(f"{name}@") for t in tasks) and (not only or name in only):
            C.add(name, ARITHMETIC, "task", 0, [f"--samples {name}: no such task in {run_dir}"])
    signed = digest.digest_rows(C, run_dir, runs, allowed_signers)
    status = [r["status"] for r in C.rows]
    report = {"signature": signed, "audit_format": AUDIT_FORMAT, "evidence": str(run_dir), "kind": "lm-eval output", "levels": list(levels),
              "cache": None, "experiments": tasks, "checks": C.rows, "n_pass": status.count("PASS"),
              "n_fail": status.count("FAIL"), "n_skipped": status.count("SKIPPED"),
              "n_skipped_requested": sum(1 for r in C.rows if r["status"] == "SKIPPED" and r.get("requested", True)),
              "details": details, "run_id": None, "public_only": False, "private_absent": [],
              "results_files": [str(r.results) for r in runs], "exit_code": 1 if "FAIL" in status else 0,
              "sample": sampling.report_entry(C.options.sample, FORWARD in levels)}
    return verdict(report, C.rows)
