"""audit.py --lm-eval RUN_DIR: audit what `lm_eval ... --log_samples --output_path RUN_DIR` wrote (any lm-eval release
from 0.4.5 to 0.4.13, each read by its own rules: versions.py), from its files alone, with the audit's own
definitions (nothing here imports lm_eval).

    python audit.py --lm-eval RUN_DIR                                   # arithmetic level
    python audit.py --lm-eval RUN_DIR --tokens --data FILE [--model DIR] # + identity level
                    [--fewshot-data FILE]                               #   few-shot split, when not --data's
                    [--samples FILE|JSON]                               #   the selection of a --samples run
                    [--task-code DIR]                                   #   a task's own code (process_docs, ...)
    python audit.py --lm-eval RUN_DIR --forward --model DIR [--sample N] # + forward level (implies --tokens)

Levels, as for run.py's evidence (a level that cannot run is SKIPPED with its reason, never PASS):
  arithmetic  doc_ids (duplicates, range, logging order: unsorted --samples mislabels), counts vs n-samples and
              limit (or the --samples selection given), doc/prompt/target hashes and the results' task_hashes,
              per-sample metrics from resps / filtered_resps and target (loglikelihood_rolling's [ll, count] pairs
              too), aggregates and stderrs exactly (the bootstrap ones of f1, mcc and perplexity with lm-eval's own
              draws), group aggregates and their pooled stderrs, a limit on question groups (SKIPPED: the run alone
              cannot see past the cut).
  identity    (--tokens) each doc against the --data row at its doc_id, targets (always) and every request's context
              re-rendered from the dumped config (sandboxed Jinja; few-shot examples drawn as lm-eval draws them;
              a chat run through --model's chat template; what cannot be rendered, e.g. a chat run without --model,
              FAILs as INCOMPLETE: a results file never switches a check off), question groups cut by the limit
              (--data), token boundaries (--model).
  forward     (--forward, --model) every loglikelihood request re-scored with evidence_audit/forward.py, and every
              loglikelihood_rolling document in lm-eval's rolling windows (rescore.py).

Modules: versions (what differs between releases, with each release's file:line), files (discovery), fmt (which
release wrote the run, format check, strict reading, one view of every release), task (one task of a run), metrics
(lm-eval's definitions written again), docs (doc_ids, counts, hashes, groups), persample (per-sample metrics),
rolling (loglikelihood_rolling's per-sample values), aggregate (aggregates, stderr), bootstrap (lm-eval's bootstrap
stderr reproduced), groups (task groups' aggregates and stderrs), data (--data), prompt (targets and contexts
rendered again, few-shot and chat templates included), identity (identity level), rescore (token boundaries,
forward level), driver (one RUN_DIR), command (the flags), task_files (which releases shipped a task file's bytes),
task_code (a task's own code, identified by task_files and run in harness/sandbox.py; task_code_child is its
sandboxed side, sent as text).
"""
