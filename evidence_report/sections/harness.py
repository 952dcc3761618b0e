"""harness: the mini harness's leaderboard, its settings and the sandbox it ran code replies in."""
from evidence_report.cells import Derived, Num, esc, is_number, rate
from evidence_report.plots import BLUE, figure, plots, plt_fig
from evidence_report.tables import kv_table, note, ratio, table

NAME = "harness"


def leaderboard_plot(board):
    tasks = board.get("tasks", {})
    if not tasks:
        return ""
    fig, ax = plt_fig(5.0, 0.45 * len(tasks) + 1.2)
    names = list(tasks)
    ax.barh(range(len(names)), [tasks[t]["score"] for t in names], color=BLUE)
    if board.get("overall") is not None:
        ax.axvline(board["overall"], color="black", ls="--", lw=1, label=f"overall {board['overall']:.4f}")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{t} ({tasks[t].get('metric')})" for t in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("task score")
    ax.set_title("leaderboard", fontsize=9)
    return figure(fig, "leaderboard")


def task_set(tasks, shipped):
    """The tasks scored, in words, from summary.json's per-task claim that a file is the shipped fixture (which the
    audit checks against the repository's fixtures); a task with no claim counts as a user task."""
    plural = lambda n, w: f"{n} {w}{'' if n == 1 else 's'}"         # noqa: E731
    user = sorted(n for n in tasks if shipped.get(n) is not True)
    if not tasks:
        return "no tasks"
    if not user:
        return f"the shipped fixtures ({plural(len(tasks), 'task')})"
    rest = len(tasks) - len(user)
    also = f" and {plural(rest, 'shipped fixture task')}" if rest else ""
    return f"{plural(len(user), 'user task')} ({', '.join(user)}){also}, not the shipped fixtures"


def limit_label(summary):
    """The label of a run limited with --limit N, from summary.json's limit block ("" without one): N is per task,
    as lm-eval's limit is."""
    lim = summary.get("limit")
    if not isinstance(lim, dict):
        return ""
    return note(f"LIMITED RUN: first {lim.get('n')} examples of each task (--limit {lim.get('n')}), "
                f"{summary.get('n_examples')} of {lim.get('of')} examples; every figure of this section is of those "
                "examples only")


# The sandbox's limits as a reader names them (harness/sandbox.py's DEFAULT_LIMITS says what each bounds), in this
# order; a limit not listed here is shown under its own key, its unit read from the key's ending.
LIMITS = (("mode", "isolation mode asked for", ""), ("cpu_s", "CPU time", "s"),
          ("startup_s", "start-up time (spawn to ready)", "s"), ("wall_s", "wall time (ready to result)", "s"),
          ("memory_bytes", "memory (address space)", "bytes"), ("fsize_bytes", "largest file written", "bytes"),
          ("tmpfs_bytes", "scratch tmpfs (namespaces mode)", "bytes"),
          ("result_max_bytes", "result read back", "bytes"), ("nofile", "open files", "files"))
UNIT_OF_SUFFIX = (("_bytes", "bytes"), ("_s", "s"))


def limit_rows(limits):
    """The sandbox limits of summary.json's settings, one a row: (what it bounds, the value as the evidence holds it,
    its unit, the MiB of a byte count, derived); format 3's layout."""
    known = {key: (name, unit) for key, name, unit in LIMITS}
    keys = [k for k, _, _ in LIMITS if k in limits] + sorted(k for k in limits if k not in known)
    rows = []
    for key in keys:
        name, unit = known.get(key) or (key, next((u for s, u in UNIT_OF_SUFFIX if key.endswith(s)), ""))
        value = limits[key]
        mib = Derived(value, "MiB") if unit == "bytes" and is_number(value) else ""
        rows.append((name, value, unit, mib))
    return rows


def limits_part(settings, layout):
    """Format 3: the sandbox limits below the settings, a table of one limit a row; format 2 showed the JSON object
    in the settings table (settings_rows)."""
    limits = settings.get("sandbox")
    if layout.format2 or not isinstance(limits, dict) or not limits:
        return ""
    return table(["sandbox limit (per code reply)", "value", "unit", "(MiB, derived)"], limit_rows(limits),
                 "harness-sandbox-limits", "kv", layout=layout)


def render(exp_dir, summary, layout):
    board = summary["leaderboard"]
    tasks = board.get("tasks", {})
    shipped = summary.get("tasks_are_shipped_fixtures")
    shipped = shipped if isinstance(shipped, dict) else {}
    said = f"harness on {task_set(tasks, shipped)}"
    headline = f'<p class="note"><b>{esc(said)}</b></p>' + limit_label(summary)
    rows = [(name, t.get("metric"), rate(t.get("score")), ratio(t.get("correct"), t.get("total")), t.get("timeouts"),
             Num(t.get("latency_s"), "seconds"), Num(t.get("latency_s_mean"), "seconds"), t.get("n_examples_in_file"),
             shipped.get(name)) for name, t in tasks.items()]
    n = sum(t.get("total", 0) for t in tasks.values())
    rows.append(("overall (mean of task scores)", "", rate(board.get("overall")),
                 ratio(sum(t.get("correct", 0) for t in tasks.values()), n),
                 sum(t.get("timeouts", 0) for t in tasks.values()), None, None, None, None))
    head = table(["task", "metric", "score", "correct/total", "timeouts", "latency s (task total)",
                  "latency s (mean)", "examples in file", "shipped fixture"], rows, "harness-leaderboard", "headline",
                 layout=layout)
    iso = board.get("sandbox_isolation") or {}
    st = board.get("settings", {})
    limits = limits_part(st, layout)
    info = kv_table([("adapter", board.get("adapter")), ("schema", board.get("schema")),
                     ("examples scored", summary.get("n_examples")), ("split", st.get("split")),
                     ("decoding", st.get("decoding")), ("chat template", st.get("chat_template")),
                     ("max new tokens", st.get("max_new_tokens")), ("timeout s", st.get("timeout_s")),
                     ("batch size", st.get("batch_size")),
                     ("sandbox mode / network", f"{iso.get('mode')} / {iso.get('network')}" if iso else
                      "not run (no code reply)"),
                     ("sandbox layers", ", ".join(iso.get("layers", [])) if iso else None)]
                    + ([] if limits else [("sandbox limits", st.get("sandbox"))]),
                    "harness-settings", layout=layout) + limits
    if summary.get("split_note"):
        info += note(summary["split_note"])
    info += note("There is no second implementation here: audit.py recomputes every task score and the overall score "
                 "from O/private/harness/leaderboard.json and the task files.")
    return headline + head + info + plots(leaderboard_plot(board))
