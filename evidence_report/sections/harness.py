"""harness: the mini harness's leaderboard, its settings and the sandbox it ran code replies in."""
from evidence_report.cells import Num, rate
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


def render(exp_dir, summary):
    board = summary["leaderboard"]
    tasks = board.get("tasks", {})
    shipped = summary.get("tasks_are_shipped_fixtures", {})
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
    return head + info + plots(leaderboard_plot(board))
