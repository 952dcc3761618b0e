"""Group aggregates at the arithmetic level: every metric and stderr of a group in results_*.json recomputed from
its subtasks' recorded results (those are checked against the samples by aggregate.py, task by task).

How lm-eval 0.4.9.2 forms them (evaluator_utils.py consolidate_group_results, 375-531; api/metrics.py:580-639):
- a group (a results entry with no task config) aggregates over its leaf tasks: a nested group's leaves join its
  parent's list in member order (task_aggregation_list), so a parent is computed from the leaves, never from the
  nested group's figures. `group_subtasks` in the results file lists each group's direct members in that order.
- the group's keys are the "metric,filter" pairs of its aggregate_metric_list found in some leaf; for each, over
  the leaves that record it: value = sum(metric * size) / sum(size), size the leaf's sample count, or 1 for every
  leaf with weight_by_size false (aggregate_subtask_metrics); stderr = "N/A" if a leaf's is "N/A", else
  sqrt(sum((size - 1) * stderr ** 2 * size) / (sum(size) - k) / sum(size)) over the k leaves (pooled_sample_stderr),
  whatever weight_by_size says. A group with no aggregate_metric_list records only {" ": " "} (and its alias).
- "groups" repeats, for display, the entries of the groups that aggregate.

Limits: lm-eval 0.4.9.2 does not write a group's config (aggregate_metric_list, weight_by_size) into the results
file. The audit therefore recomputes both weightings and accepts the recorded value only when it equals one of
them; the row's note says which (a value that equals neither FAILs naming the group and metric). A metric dropped
from a group's aggregate_metric_list cannot be seen from the run alone. The leaf sizes are the samples logged per
filter (what lm-eval counts), so a leaf without its samples file FAILs the group's row.
"""
import math

from evidence_audit.checks import ARITHMETIC, short
from evidence_audit.lmeval.bootstrap import python_summation
from evidence_audit.lmeval.metrics import builtin_sum

MAX_DEPTH = 32          # nesting followed in group_subtasks before calling it a cycle
MAX_LEAVES = 10_000     # leaf tasks of one group (lm-eval's largest groups have a few hundred)


def leaves(name, subtasks, configs, path=()):
    """The leaf tasks of group `name` in lm-eval's order; raises ValueError naming a cycle or an unknown member."""
    if len(path) > MAX_DEPTH or name in path:
        raise ValueError(f"group_subtasks: {' -> '.join(path + (name,))} is a cycle")
    out = []
    for m in subtasks[name]:
        if not isinstance(m, str):
            raise ValueError(f"group_subtasks.{name}: member {short(m)} is not a task name")
        if m in configs:
            out.append(m)
        elif isinstance(subtasks.get(m), list):
            out += leaves(m, subtasks, configs, path + (name,))
        else:
            raise ValueError(f"group_subtasks.{name}: member {m!r} is neither a task with a config nor a group")
        if len(out) > MAX_LEAVES:      # a hostile file could nest one group many times over
            raise ValueError(f"group_subtasks.{name}: over {MAX_LEAVES} leaf tasks")
    return out


def subtask_mean(values, sizes, weight_by_size, comp):
    """aggregate_subtask_metrics: sum(metric * size) / sum(size), sizes all 1 without weight_by_size."""
    if not weight_by_size:
        sizes = [1] * len(sizes)
    return builtin_sum([m * s for m, s in zip(values, sizes)], comp) / builtin_sum(sizes, comp)


def pooled_stderr(stderrs, sizes, comp):
    """pooled_sample_stderr (np.sqrt of a double is math.sqrt's correctly rounded value)."""
    var = builtin_sum([(n - 1) * se ** 2 * n for n, se in zip(sizes, stderrs)], comp) / \
        (builtin_sum(sizes, comp) - len(sizes))
    return math.sqrt(var / builtin_sum(sizes, comp))


def is_value(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def leaf_size(tasks, leaf, metric, filt):
    """The sample count lm-eval used for `leaf` (its logged samples of that filter listing the metric), or None."""
    t = tasks.get(leaf)
    if t is None:
        return None
    return sum(1 for s in t.by_filter().get(filt, []) if metric in s.raw["metrics"])


def group_rows(C, res, tasks, label, only=None):
    """Rows per group of one results file: "group aggregates recomputed" and "group stderr recomputed".
    `tasks`: {name: TaskRun} of that run; `label(name)`: the report's experiment column."""
    top, where = res.data, res.name
    results, configs = top["results"], top["configs"]
    groups = [g for g in results if g not in configs]
    subtasks = top.get("group_subtasks")
    sums = python_summation(top)
    shown = top.get("groups")
    if groups and not (isinstance(subtasks, dict) and all(isinstance(v, list) for v in subtasks.values())):
        for g in groups:
            C.add(label(g), ARITHMETIC, "group aggregates recomputed from its subtasks", 0,
                  [f"{where} group_subtasks: missing or not {{group: [members]}}; group {g}'s members are unknown"])
        return
    for g in groups:
        if only and g not in only:
            C.skip(label(g), "-", "(whole group)", "not selected (--task)", requested=False)
            continue
        group_row(C, g, label(g), where, results, configs, subtasks, tasks, sums, shown)
    if isinstance(shown, dict):
        extra = sorted(set(shown) - set(groups))
        if extra:
            C.add("-", ARITHMETIC, "groups table", 0, [f"{where} groups: {extra} are not groups of results"])


def group_row(C, g, lab, where, results, configs, subtasks, tasks, sums, shown):
    """The two rows of group `g` (see group_rows)."""
    check = "group aggregates recomputed from its subtasks (aggregate_subtask_metrics)"
    entry, w = results[g], f"{where} results.{g}"
    if not isinstance(entry, dict) or g not in subtasks:
        C.add(lab, ARITHMETIC, check, 0, [f"{w}: not an object" if not isinstance(entry, dict) else
                                          f"{w}: a results entry with no task config and no group_subtasks entry "
                                          "(neither task nor group)"])
        return
    try:
        members = leaves(g, subtasks, configs)
    except ValueError as e:
        C.add(lab, ARITHMETIC, check, 0, [f"{where} {e}"])
        return
    keys = [k for k in entry if k not in ("alias", " ")]
    if " " in entry:                     # no aggregate_metric_list: lm-eval writes {" ": " "} and nothing else
        bad = [f"{w}.{k}: a group without aggregate_metric_list (\" \" key) records no metric" for k in keys]
        if entry[" "] != " ":
            bad.append(f"{w}[\" \"]: recorded {short(entry[' '])}, lm-eval writes \" \"")
        C.add(lab, ARITHMETIC, check, 0, bad, note="no aggregate_metric_list: nothing aggregated")
        return
    a = GroupAudit(w, entry, members, results, tasks, sums)
    for key in sorted(k for k in keys if "_stderr," not in k):
        a.metric(key)
    a.bad += [f"{w}.{k}: a stderr without its aggregate" for k in keys
              if "_stderr," in k and k.replace("_stderr,", ",", 1) not in entry]
    a.bad += table_mismatches(where, g, entry, keys, shown)
    C.add(lab, ARITHMETIC, check, a.n, a.bad, note="; ".join(a.notes + [
        f"leaves {', '.join(members)}", "weight_by_size is not in the results file: inferred from the value"]))
    C.add(lab, ARITHMETIC, "group stderr recomputed (pooled_sample_stderr of the subtasks')", a.n_se, a.bad_se)


class GroupAudit:
    """One group's metrics checked in turn: failures (aggregates, stderrs), counts and notes."""

    def __init__(self, w, entry, members, results, tasks, sums):
        self.w, self.entry, self.members, self.results, self.tasks, self.sums = w, entry, members, results, tasks, sums
        self.bad, self.bad_se, self.notes, self.n, self.n_se = [], [], [], 0, 0

    def metric(self, key):
        """One "metric,filter" of the group: its value from the leaves that record it, then its stderr."""
        w, entry, results = self.w, self.entry, self.results
        metric, _, filt = key.partition(",")
        having = [leaf for leaf in self.members if key in results.get(leaf, {})]
        if not having:
            self.bad.append(f"{w}.{key}: no subtask ({', '.join(self.members)}) records {key}")
            return
        values = [results[leaf][key] for leaf in having]
        sizes = [leaf_size(self.tasks, leaf, metric, filt) for leaf in having]
        lost = [leaf for leaf, n in zip(having, sizes) if n is None]
        if lost:
            self.bad.append(f"{w}.{key}: subtask(s) {', '.join(lost)} have no samples file here (or were left out "
                            "by --task): their sizes, and so the group's aggregate, cannot be recomputed")
            return
        if not all(is_value(v) for v in values):
            self.bad.append(f"{w}.{key}: a subtask's {key} is not a number ({short(values)})")
            return
        self.n += 1
        found = {wbs for c in self.sums for wbs in (True, False)
                 if is_value(entry[key]) and subtask_mean(values, sizes, wbs, c) == entry[key]}
        if not found:
            both = {wbs: subtask_mean(values, sizes, wbs, self.sums[0]) for wbs in (True, False)}
            parts = ", ".join(f"{leaf}={v!r} (n={n})" for leaf, v, n in zip(having, values, sizes))
            self.bad.append(f"{w}.{key}: recorded {short(entry[key])}, recomputed {both[True]!r} (weight_by_size "
                            f"true) or {both[False]!r} (false) from {parts}")
        else:
            self.notes.append(f"{key}: " + ("both weightings agree" if len(found) == 2 else
                                            f"weight_by_size {'true' if True in found else 'false'}"))
        self.stderr(f"{metric}_stderr,{filt}", having, sizes)

    def stderr(self, se_key, having, sizes):
        w, entry = self.w, self.entry
        stderrs = [self.results[leaf][se_key] for leaf in having if se_key in self.results[leaf]]
        if se_key not in entry:
            self.bad_se.append(f"{w}.{se_key}: missing (lm-eval records the pooled stderr or \"N/A\")")
            return
        self.n_se += 1
        if "N/A" in stderrs:
            if entry[se_key] != "N/A":
                self.bad_se.append(f"{w}.{se_key}: recorded {short(entry[se_key])}, recomputed 'N/A' (a subtask's "
                                   "stderr is N/A)")
        elif len(stderrs) != len(having) or not all(is_value(s) for s in stderrs):
            self.bad_se.append(f"{w}.{se_key}: the subtasks' {se_key} are {short(stderrs)}: lm-eval's pooling would "
                               "have failed")
        elif not any(is_value(entry[se_key]) and pooled_stderr(stderrs, sizes, c) == entry[se_key]
                     for c in self.sums):
            self.bad_se.append(f"{w}.{se_key}: recorded {short(entry[se_key])}, recomputed "
                               f"{pooled_stderr(stderrs, sizes, self.sums[0])!r} (pooled_sample_stderr of "
                               f"{short(stderrs)}, sizes {sizes})")


def table_mismatches(where, g, entry, keys, shown):
    """The "groups" table against results.<g>: lm-eval copies every aggregating group's entry there."""
    if not keys:
        return []
    if not isinstance(shown, dict):
        return [f"{where} groups: missing, but group {g} aggregates (lm-eval writes the groups table then)"]
    mirror = shown.get(g)
    if not isinstance(mirror, dict):
        return [f"{where} groups.{g}: missing (lm-eval repeats every aggregating group there)"]
    differ = [k for k in sorted(set(keys) | (set(mirror) - {"alias"}))
              if mirror.get(k, "<absent>") != entry.get(k, "<absent>")]
    return [f"{where} groups.{g}.{k}: {short(mirror.get(k, '<absent>'))}, results.{g}.{k}: "
            f"{short(entry.get(k, '<absent>'))} (the two are one value)" for k in differ]
