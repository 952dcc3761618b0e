"""The `--lm-eval RUN_DIR` flags of audit.py and their main: parse, audit, print, write the JSON report.

The JSON report goes to --report PATH, by default RUN_DIR/audit.json (as audit.py O writes O/audit.json); the path
is printed. lm-eval never reads that name (it globs results_*.json and samples_*.jsonl), and this audit ignores it
too. Pass --report elsewhere for a run directory that must stay untouched (or is read-only)."""
import sys
from pathlib import Path

from evidence_audit.checks import ARITHMETIC, FORWARD, IDENTITY, AuditOptions, print_report, short, write_report
from evidence_audit.definitions import is_int
from evidence_audit import sampling
from evidence_audit.lmeval import rescore
from evidence_audit.lmeval.driver import audit_lmeval
from evidence_audit.lmeval.digest import before_audit
from evidence_audit.reading import Unreadable, parse_strict, read_json

LEVELS_SAY = ("levels: arithmetic = per-sample metrics, aggregates, groups, stderrs, hashes and doc_ids from the run "
              "alone; identity (--tokens) = each sample's doc against --data, targets and prompts (few-shot and chat "
              "too) re-rendered, a task's own code run in the sandbox (--task-code), token boundaries (--model); "
              "forward (--forward) = every loglikelihood (and rolling window) re-scored in "
              "the run's dtype (audit.py's own Llama, or transformers' class for other architectures), in lm-eval's "
              "batches when reproducible (--model)")


def lmeval_args(ap):
    g = ap.add_argument_group("lm-eval runs (python audit.py --lm-eval RUN_DIR ...)")
    g.add_argument("--lm-eval", type=Path, metavar="RUN_DIR",
                   help="audit what `lm_eval ... --log_samples --output_path RUN_DIR` wrote (lm-eval 0.4.5 to 0.4.13)")
    g.add_argument("--data", action="append", default=[], metavar="[TASK=]FILE",
                   help="identity level: local copy of the evaluated split (.parquet, .jsonl, .tsv); TASK=FILE for one "
                        "task of several (repeatable)")
    g.add_argument("--fewshot-data", action="append", default=[], metavar="[TASK=]FILE",
                   help="identity level of a few-shot run: local copy (.parquet, .jsonl) of the split lm-eval drew "
                        "the examples from (fewshot_split, else training_split, ...), when it is not the --data split")
    g.add_argument("--task-code", action="append", default=[], metavar="[TASK=]DIR",
                   help="identity level of a task whose config holds code (process_docs, doc_to_text, ... as "
                        "`!function`): the task's folder or an lm_eval/tasks tree; the .py file holding the logged "
                        "source is run in the code sandbox only if an lm-eval release ships it (task_files.tsv)")
    g.add_argument("--model", type=Path, metavar="DIR",
                   help="model directory (tokenizer.json, config.json, model.safetensors) for token boundaries and "
                        "the forward level")
    g.add_argument("--device", metavar="cpu|cuda",
                   help="forward level: where to re-score (default cpu); lm-eval's batches are reproduced only on "
                        "the kind of device the run recorded")
    g.add_argument("--task", action="append", metavar="NAME", help="audit only this task (repeatable)")
    g.add_argument("--samples", metavar="FILE|JSON",
                   help="the selection the run was made with (lm-eval's --samples: a JSON file or the JSON itself, "
                        "{task: [doc ids]}); lm-eval does not record it, so without it a --samples run FAILs its "
                        "sample count")


def read_selection(arg):
    """--samples as lm-eval's __main__ reads it: the path of a JSON file when one exists, else the JSON text;
    {task: [doc ids]}. Unreadable with one line otherwise."""
    path = Path(arg)
    try:
        is_file = path.is_file()
    except OSError:         # JSON text too long for a file name
        is_file = False
    try:
        special = not is_file and path.exists() and not path.is_dir()
    except OSError:
        special = False
    if special:             # a device or a pipe: never read (/dev/zero has no end)
        raise Unreadable(f"--samples {arg}: not a regular file; expected a JSON file or the JSON itself")
    where = str(path) if is_file else "--samples"
    obj = read_json(path) if is_file else parse_strict(arg, where)
    ok = isinstance(obj, dict) and all(isinstance(v, list) and all(is_int(i) for i in v) for v in obj.values())
    if not ok:
        raise Unreadable(f"{where}: expected {{task: [doc_id, ...]}} (lm-eval's --samples), found {short(obj, 80)}")
    return obj


def lmeval_main(args):
    """audit.py --lm-eval: exit 0 every claim recomputes, 1 a check failed (or --strict and a requested check was
    skipped), 2 unreadable or unknown format (one line, no report written)."""
    if args.mutations or args.review or args.public_only or args.experiment or args.cache:
        print("error: --lm-eval takes --data, --fewshot-data, --task-code, --model, --sample, --task, --samples, "
              "--tokens, --forward, --report, --threads, --device, --strict; not --mutations, --review, "
              "--public-only, --experiment or --cache", file=sys.stderr)
        return 2
    sample = sampling.from_args(args.sample, args.sample_seed, args.forward)
    if isinstance(sample, str):
        print(f"error: {sample}", file=sys.stderr)
        return 2
    levels = (ARITHMETIC,) + ((IDENTITY,) if args.tokens or args.forward else ()) \
        + ((FORWARD,) if args.forward else ())
    problem = before_audit(args)     # --allowed-signers FILE checked, --sign KEY's signed digest written
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        selection = read_selection(args.samples) if args.samples is not None else None
        rescore.check_device(args.device)
        report = audit_lmeval(args.lm_eval, levels, args.data, args.model, args.sample, args.task,
                              options=AuditOptions(threads=args.threads, device=args.device or "cpu", sample=sample),
                              fewshot=args.fewshot_data,
                              selection=selection, task_code=args.task_code,
                              allowed_signers=args.allowed_signers)
    except Unreadable as e:
        print(f"error: {e}", file=sys.stderr)       # the message names the file: run, --samples or --model
        return 2
    if args.strict and report["n_skipped_requested"] and report["exit_code"] == 0:
        report["exit_code"], report["result"] = 1, "FAIL"
    print_report(report, levels_say=LEVELS_SAY)
    path = args.report or args.lm_eval / "audit.json"
    try:
        write_report(path, report)
    except OSError as e:
        print(f"warning: could not write the JSON report {path} ({e.strerror}); pass --report PATH elsewhere",
              file=sys.stderr)
        return report["exit_code"]
    print(f"report: {path}")
    return report["exit_code"]
