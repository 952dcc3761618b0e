"""Write O/report.html: one self-contained page a person reads, built from the evidence under O alone.

    python report.py O          # run.py calls this too after its experiments

Per experiment: the headline table, the agreement figures (official vs independent), identity checks, stage times
and peak RSS, and plots where looking beats reading. Plots are PNGs embedded as data URIs (matplotlib, Agg), so
the page needs no network and no other file. Like audit.py it reads only the evidence files, never the code that
wrote them; unlike audit.py it checks nothing — it shows what the evidence says.
"""
import base64
import html
import io
import json
import sys
import time
from pathlib import Path

EXPERIMENT_ORDER = ["protocol", "options", "extraction", "mctaco", "harness"]


# ---- small helpers -------------------------------------------------------------------------------------------

def esc(x):
    return html.escape(str(x))


def fmt(x):
    if isinstance(x, float):
        return f"{x:.6g}"
    if x is None:
        return "—"
    return str(x)


def table(header, rows, cls=""):
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def figure(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def plt_fig(w=5.0, h=3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(w, h))


def read_json(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_jsonl(path):
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]


def flatten(d, prefix=""):
    """Nested summary -> (dotted key, value) rows, lists of scalars kept on one line."""
    rows = []
    for k, v in sorted(d.items()):
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            rows += flatten(v, key + ".")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            rows.append((key, f"[{len(v)} entries]"))
        else:
            rows.append((key, json.dumps(v) if isinstance(v, (list, bool)) else v))
    return rows


# ---- sections ------------------------------------------------------------------------------------------------

def stages_section(exp_dir):
    path = exp_dir / "stages.json"
    if not path.exists():
        return "<p>stages.json missing</p>"
    st = read_json(path)
    rows = [(s["name"], s["wall_s"], (s.get("peak_rss_bytes_at_end") or 0) / 2**20 or None) for s in st["stages"]]
    out = "<h3>Stages</h3>" + table(["stage", "wall s", "process peak RSS at end (MiB)"],
                                    [(a, b, round(c, 1) if c else None) for a, b, c in rows])
    tokens = st.get("tokens")
    if isinstance(tokens, dict):
        out += table(["token statistic", "value"], flatten(tokens))
    return out


def scatter_official_vs_independent(records, get_pairs, title):
    pairs = [p for r in records for p in get_pairs(r)]
    if not pairs:
        return ""
    fig, ax = plt_fig(4.2, 4.0)
    xs, ys = zip(*pairs)
    ax.scatter(xs, ys, s=12, alpha=0.7)
    lo, hi = min(xs + ys), max(xs + ys)
    ax.plot([lo, hi], [lo, hi], lw=0.8, color="grey")
    ax.set_xlabel("official (lm-eval) log-likelihood")
    ax.set_ylabel("independent log-likelihood")
    ax.set_title(title, fontsize=9)
    return figure(fig)


def accuracy_bars(names, correct, n, baselines, title):
    fig, ax = plt_fig(max(4.0, 1.1 * len(names) + 1.5), 3.2)
    ax.bar(range(len(names)), [c / n for c in correct], color="#4c72b0", label="accuracy")
    for label, value, style in baselines:
        ax.axhline(value / n, ls=style, lw=1, color="black", label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return figure(fig)


def protocol_section(exp_dir, summary):
    records = read_jsonl(exp_dir / "records.jsonl")
    n = summary["n_items"]
    ag = summary["agreement"]
    head = table(["path", "correct", "accuracy", "predicted negative", "predicted positive"], [
        ("official (lm-eval 0.4.9.2)", summary["official"]["correct"], summary["official"]["accuracy"],
         summary["official"]["pred_counts"]["0"], summary["official"]["pred_counts"]["1"]),
        ("independent", summary["independent"]["correct"], summary["independent"]["accuracy"],
         summary["independent"]["pred_counts"]["0"], summary["independent"]["pred_counts"]["1"]),
        ("constant class (label %s)" % summary["constant_class_baseline"]["label"],
         round(summary["constant_class_baseline"]["accuracy"] * n), summary["constant_class_baseline"]["accuracy"],
         None, None)], "headline")
    agree = table(["agreement", "value"], [
        ("candidates compared", summary["n_candidates"]), ("max |official − independent|", ag["max_abs_diff"]),
        ("candidate score mismatches", ag["n_candidate_score_mismatches"]),
        ("prediction mismatches", ag["n_prediction_mismatches"]),
        ("identity checks", "passed" if summary["identity_checks"]["passed"] else "FAILED"),
        ("fields joined per sample", ", ".join(summary["identity_checks"]["fields"]))])
    plot = scatter_official_vs_independent(
        records, lambda r: list(zip(r["official"]["scores"], r["independent"]["scores"])),
        f"{summary['n_candidates']} candidate scores; max abs diff {ag['max_abs_diff']}")
    labels = summary["label_counts"]
    bars = accuracy_bars(["official", "independent"], [summary["official"]["correct"],
                                                       summary["independent"]["correct"]], n,
                         [("all negative", labels["0"], "--"), ("all positive", labels["1"], ":")],
                         "accuracy with constant-class baselines")
    return head + agree + f'<div class="plots">{plot}{bars}</div>'


def generic_section(exp_dir, summary):
    return table(["summary field", "value"], flatten(summary))


SECTIONS = {"protocol": protocol_section}


def experiment_section(out, name):
    exp_dir = out / name
    summary = read_json(exp_dir / "summary.json")
    split = summary.get("split", "?")
    warn = ('<p class="warn">CONFIRMATION SPLIT: these are the held-back confirmation items.</p>'
            if summary.get("confirmation_items_scored") else "")
    body = SECTIONS.get(name, generic_section)(exp_dir, summary)
    return (f'<section id="{esc(name)}"><h2>{esc(name)} <small>split: {esc(split)}</small></h2>{warn}{body}'
            f"{stages_section(exp_dir)}</section>")


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f2f2f2}table.headline td{font-weight:600}.plots img{margin:4px;border:1px solid #eee}
.warn{color:#a00;font-weight:700}small{color:#666;font-weight:400}code{background:#f4f4f4}
"""


def build(out):
    out = Path(out)
    names = [n for n in EXPERIMENT_ORDER if (out / n / "summary.json").exists()]
    names += sorted(p.name for p in out.iterdir() if p.is_dir() and (p / "summary.json").exists() and p.name not in names)
    env = read_json(out / "environment.json") if (out / "environment.json").exists() else {}
    env_rows = [("git commit", env.get("git_commit")), ("git dirty", env.get("git_dirty")),
                ("code sha256", env.get("code_sha256")), ("python", env.get("python")),
                ("platform", env.get("platform")), ("cpu", env.get("cpu")), ("torch threads", env.get("torch_threads"))]
    env_rows += [(k, v) for k, v in sorted((env.get("versions") or {}).items())]
    sections = "".join(experiment_section(out, n) for n in names)
    toc = " · ".join(f'<a href="#{esc(n)}">{esc(n)}</a>' for n in names)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Evidence report: {esc(out.name)}</title>"
            f"<style>{CSS}</style></head><body><h1>Evidence report</h1>"
            f"<p>Built from <code>{esc(out)}</code> at {esc(time.strftime('%Y-%m-%d %H:%M:%S'))} by report.py. "
            "Agreement of two implementations shows a score was computed as declared; it does not show that the "
            "task or its labels are valid. A development subset of a fixture is not a benchmark result.</p>"
            f"<p>{toc}</p>{table(['environment', 'value'], env_rows)}{sections}</body></html>")


def write(out):
    text = build(out)
    path = Path(out) / "report.html"
    tmp = path.with_name(".report.html.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python report.py OUT_DIR")
    if not Path(sys.argv[1]).is_dir():
        print(f"error: {sys.argv[1]}: no such output directory; run run.py first", file=sys.stderr)
        sys.exit(2)
    print(write(sys.argv[1]))
