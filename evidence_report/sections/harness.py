"""harness: the mini harness's leaderboard, its settings and the sandbox it ran code replies in."""
from evidence_report.cells import Num, esc, rate
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


def render(exp_dir, summary):
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
                  "latency s (mean)", "examples in file", "shipped fixture"], rows, "harness-leaderboard", "headline")
    iso = board.get("sandbox_isolation") or {}
    st = board.get("settings", {})
    info = kv_table([("adapter", board.get("adapter")), ("schema", board.get("schema")),
                     ("examples scored", summary.get("n_examples")), ("split", st.get("split")),
                     ("decoding", st.get("decoding")), ("chat template", st.get("chat_template")),
                     ("max new tokens", st.get("max_new_tokens")), ("timeout s", st.get("timeout_s")),
                     ("batch size", st.get("batch_size")),
                     ("sandbox mode / network", f"{iso.get('mode')} / {iso.get('network')}" if iso else
                      "not run (no code reply)"),
                     ("sandbox layers", ", ".join(iso.get("layers", [])) if iso else None),
                     ("sandbox limits", st.get("sandbox"))], "harness-settings")
    if summary.get("split_note"):
        info += note(summary["split_note"])
    info += note("There is no second implementation here: audit.py recomputes every task score and the overall score "
                 "from O/private/harness/leaderboard.json and the task files.")
    return headline + head + info + plots(leaderboard_plot(board))
