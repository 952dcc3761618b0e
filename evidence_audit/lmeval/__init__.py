"""audit.py --lm-eval RUN_DIR: audit what `lm_eval ... --log_samples --output_path RUN_DIR` wrote (lm-eval 0.4.9.2),
from its files alone, with the audit's own definitions (nothing here imports lm_eval).

    python audit.py --lm-eval RUN_DIR                                   # arithmetic level
    python audit.py --lm-eval RUN_DIR --tokens --data FILE [--model DIR] # + identity level
                    [--fewshot-data FILE]                               #   few-shot split, when not --data's
                    [--samples FILE|JSON]                               #   the selection of a --samples run
    python audit.py --lm-eval RUN_DIR --forward --model DIR [--sample N] # + forward level (implies --tokens)

Levels, as for run.py's evidence (a level that cannot run is SKIPPED with its reason, never PASS):
  arithmetic  doc_ids (duplicates, range, logging order: unsorted --samples mislabels), counts vs n-samples and
              limit (or the --samples selection given), doc/prompt/target hashes and the results' task_hashes, per-sample metrics from resps /
              filtered_resps and target, aggregates and deterministic stderrs, a limit on question groups (SKIPPED:
              the run alone cannot see past the cut).
  identity    (--tokens) each doc against the --data row at its doc_id, targets (always) and every request's context
              re-rendered from the dumped config (sandboxed Jinja; few-shot examples drawn as lm-eval draws them;
              what cannot be rendered, e.g. a chat template, FAILs as INCOMPLETE: a results file never switches a
              check off), question groups cut by the limit (--data), token boundaries (--model).
  forward     (--forward, --model) every loglikelihood request re-scored with evidence_audit/forward.py.

Modules: files (discovery), fmt (format check, strict reading), task (one task of a run), metrics (lm-eval's
definitions written again), docs (doc_ids, counts, hashes, groups), persample (per-sample metrics), aggregate
(aggregates, stderr), data (--data), prompt (targets and contexts rendered again, few-shot included), identity
(identity level), rescore (token boundaries, forward level), driver (one RUN_DIR), command (the flags).
"""
