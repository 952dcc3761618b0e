"""Discovery: the runs under an lm-eval `--output_path` directory.

Every release read (0.4.5 to 0.4.13, versions.py) has its EvaluationTracker write, per run,
`<OUT>/<model_name_sanitized>/results_<date_id>.json` and one `samples_<task>_<date_id>.jsonl` per task beside it
(date_id: datetime.isoformat() with ':' replaced by '-'). With an empty model name (a model object passed without
model_args) the files are in <OUT> itself up to 0.4.9.2 and in a random 8-character subdirectory from 0.4.10
(versions.py unnamed_model_dir: a subdirectory like any other here). From 0.4.9 an --output_path ending in ".json"
names the results file `<stem>_<date_id>.json` beside it, the samples files in the same directory (versions.py
json_output_path): such a name is taken as a results file too (RESULTS_RE), and the driver refuses it for a release
that never writes it. Several runs may share one output path: each results file is one run, paired with the samples
files of the same date_id in its directory.
"""
import re
from dataclasses import dataclass, field
from pathlib import Path

from evidence_audit.reading import Unreadable

DATE_ID = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?"
RESULTS_RE = re.compile(rf"(.+)_({DATE_ID})\.json")         # "results", or the stem of a .json --output_path
SAMPLES_RE = re.compile(rf"samples_(.+)_({DATE_ID})\.jsonl")
MAX_RUN_FILES = 10000           # files looked at under RUN_DIR (an output path is a few files per run)


@dataclass
class Run:
    """One lm-eval run: its results file, its date_id and its samples files by task name."""
    results: Path
    date_id: str
    samples: dict = field(default_factory=dict)

    @property
    def json_named(self):
        """True when the results file is named after an --output_path ending in .json, not results_<date>.json."""
        return not self.results.name.startswith(f"results_{self.date_id}")


def candidate_dirs(run_dir):
    """RUN_DIR and its direct subdirectories (the model-named one), never following a symlink."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink():
        raise Unreadable(f"{run_dir}: a symlink; audit the output directory itself, not a link to it")
    if not run_dir.is_dir():
        raise Unreadable(f"{run_dir}: no such directory; expected what `lm_eval ... --log_samples --output_path "
                         f"{run_dir}` wrote")
    subdirs = sorted(p for p in run_dir.iterdir() if p.is_dir() and not p.is_symlink())
    return [run_dir] + subdirs


def discover(run_dir):
    """Every run under RUN_DIR (see the module docstring), in path order. Raises Unreadable when there is none, or
    when a results/samples file is a symlink (never evidence)."""
    runs, seen = [], 0
    for d in candidate_dirs(run_dir):
        names = sorted(p.name for p in d.iterdir())
        seen += len(names)
        if seen > MAX_RUN_FILES:
            raise Unreadable(f"{run_dir}: over {MAX_RUN_FILES} files; pass the directory of one lm-eval output path")
        for name in names:
            if (RESULTS_RE.fullmatch(name) or SAMPLES_RE.fullmatch(name)) and (d / name).is_symlink():
                raise Unreadable(f"{d / name}: a symlink (an lm-eval output file is a regular file)")
        for name in names:
            m = RESULTS_RE.fullmatch(name)
            if m:
                runs.append(Run(d / name, m.group(2)))
        for run in [r for r in runs if r.results.parent == d]:
            for name in names:
                m = SAMPLES_RE.fullmatch(name)
                if m and m.group(2) == run.date_id:
                    run.samples[m.group(1)] = d / name
    if not runs:
        deeper = output_paths_below(run_dir)
        hint = (f"; one level further down are the output paths {', '.join(deeper[:5])}: pass one of them"
                if deeper else "")
        raise Unreadable(f"{run_dir}: no results_<date>.json in it or in a subdirectory; expected the output of "
                         f"`lm_eval ... --log_samples --output_path DIR` (lm-eval 0.4.5 to 0.4.13){hint}")
    return runs


def output_paths_below(run_dir, most=MAX_RUN_FILES):
    """The subdirectories of RUN_DIR that are lm-eval output paths themselves (a results file in their model
    subdirectory): RUN_DIR is then a directory of runs, e.g. runs/ holding runs/sst2/<model>/. Bounded, no symlink."""
    found, seen = [], 0
    for d in candidate_dirs(run_dir)[1:]:
        for sub in sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink()):
            names = [p.name for _, p in zip(range(most), sub.iterdir())]
            seen += len(names)
            if seen > most:
                return found
            if any(RESULTS_RE.fullmatch(n) for n in names):
                found.append(str(d))
                break
    return found


def orphan_samples(run_dir, runs):
    """samples_*.jsonl files under RUN_DIR that belong to no results file (their date_id has none)."""
    claimed = {p for r in runs for p in r.samples.values()}
    out = []
    for d in candidate_dirs(run_dir):
        out += [d / n for n in sorted(p.name for p in d.iterdir()) if SAMPLES_RE.fullmatch(n) and d / n not in claimed]
    return out
