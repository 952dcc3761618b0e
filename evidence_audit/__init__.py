"""Recompute every claim in an evidence directory written by run.py, from the evidence alone (audit.py is its CLI).

    python audit.py O                              # arithmetic level (stdlib only, no model, no private files)
    python audit.py O --tokens                     # + identity level: private texts, tokenizer, data parquet
    python audit.py O --tokens --forward           # + forward level: audit.py's own Llama forward pass
    python audit.py O --mutations                  # self-test: tamper with copies of O, each must be caught
    python audit.py O --review SHEET               # + import a filled extraction review sheet (human audit)
    python audit.py --lm-eval RUN_DIR ...          # audit an lm-eval 0.4.5, 0.4.7-0.4.13 --log_samples --output_path
                                                   # directory (evidence_audit/lmeval/: its levels and flags)

Options: --cache C (prepared cache) and --model DIR (a local model directory the run read): where the identity and
forward levels find the tokenizer, the weights and the data; default: the cache and model directory
O/private/<exp>/paths.json names (evidence format 3, whose public files name them <cache>/models/<id> and
<model:NAME>), or for format 2 the path config.json's model.dir records. --experiment NAME (audit
only NAME; repeatable; an unknown name is a usage error, exit 2), --report PATH (default: cli.py's docstring says
where each kind of audit writes), --threads N (torch threads for --forward, default 1), --strict (kept for old
scripts: a requested check that had to be skipped always gives INCOMPLETE, exit 1), --public-only (the reader holds published evidence without O/private/, and says so),
--allowed-signers FILE (verify O/MANIFEST.json.sig, the signature run.py --sign KEY made of the evidence digest, with
ssh-keygen -Y verify against this OpenSSH allowed-signers file, and name the signer; docs/citing.md).
The report on stdout has one line per check group; the JSON report holds every check and every failure message.

Levels (each reported separately, per experiment and per check group, with the number of items checked):
  manifest    (always, first) O/MANIFEST.json, which run.py writes last, against the files under O: a file added
              (dot-files and dot-directories too), removed or changed (size, sha256); a symlink or special file
              anywhere under O, O/private included; an experiment listed but gone or renamed; one run id in
              MANIFEST.json, environment.json, every identity.json and every O/private/<exp>/run.json; each
              experiment's private files against the manifest's digest of them. A forger who rewrites
              MANIFEST.json too passes this level: the deeper levels still catch an inconsistent edit
              (arithmetic), edited texts (identity) and edited scores (forward). Cite the evidence digest (the
              sha256 of MANIFEST.json, printed by run.py) next to the commit so a rewritten manifest shows.
              report.html (derived from the evidence) is checked at the arithmetic level: its run id, and every
              number cell's data-value equal to the evidence value its data-src names, shown as a rounding of it.
  arithmetic  recomputes predictions (first index wins ties), correctness, accuracies, counts, the constant-class
              baseline, agreement figures, lm-eval's per-item acc, the item-selection rule, token counts and every
              value in summary.json from records.jsonl + config.json. Needs nothing but O.
  identity    (--tokens) re-hashes the private sentences and prompts, rebuilds each prompt from the template in
              config.json, re-tokenises context and context+candidate with the cached tokenizer.json (no special
              tokens) and checks candidate ids, start boundaries and the context-prefix property; recomputes
              lm-eval's doc_hash; when the data parquet is in the cache, checks row count, content hash, and each
              item's sentence and label against it.
  forward     (--forward, implies --tokens) recomputes every candidate score with the minimal Llama forward pass
              in evidence_audit/forward.py (torch + safetensors only) and compares with both recorded paths.

What this does not prove (limits, stated honestly):
  - audit.py is independent code, not an independent measurement: the forward level re-runs the same weights from
    the cache, and passes if they reproduce the recorded scores within FORWARD_TOL. It cannot tell whether those
    weights are the right ones beyond comparing their sha256 with the one identity.json records.
  - Wall times and peak RSS in stages.json are measurements; they are sanity-checked (non-negative, RSS
    non-decreasing, the experiment's stage times adding up to no more than its total), not recomputed. The commit,
    dirty flag, code hash and library versions in identity.json are compared with environment.json, not recomputed.
  - Without private texts the sentence/prompt hashes are only checked for internal consistency; an edit of a score
    that keeps every derived figure consistent (e.g. swapping the score lists of two items with the same
    prediction) is only caught by the forward level. Skipped checks are reported as SKIPPED with the reason,
    never as passed.
  - lm-eval's doc_hash is recomputed with lm-eval 0.4.9.2's definition (sha256 of json.dumps(doc, indent=2,
    ensure_ascii=False)) and the GLUE SST-2 column order (sentence, label, idx), duplicated here on purpose.
  - config.json n_rows only matters to the arithmetic level through the selection it produces: a value that leaves
    the selected idx unchanged is caught only by the identity level's data check (the parquet's row count).
  - Experiments with no rule in evidence_audit.rules.RULES are reported as FAIL ("no audit rule"), never passed.
  - The mutation self-test reuses forward results across its copies (keyed by model file and exact token ids; a
    forward pass is a pure function of both), otherwise it would re-run the model once per mutation.

The audit (audit.py and this package) imports nothing from the rest of the repository (run, experiments, harness,
report, bench, resources, config, adapter) and nothing from lm_eval: every rule it checks is written out again in
this package, on purpose. It reads registry.py (plain data importing only the standard library): which experiments
exist, the config sections each declares, and the name of each one's rule, which it imports only from
evidence_audit.rules. The arithmetic level uses only the standard
library; torch, tokenizers, safetensors and pyarrow are imported inside the deeper levels only.

Exit codes: 0 every claim recomputes; 1 a check failed (the message names the item idx and the field), or a
requested check could not run here (INCOMPLETE); 2 the evidence is unreadable (missing O, unparseable or non-strict
JSON: the message names the file and line; no report is written) or the command line is wrong. The experiments a
run must have written come from the command line environment.json records (not from MANIFEST.json), each with its
public files (a whitelist) and its private half: when O/private/ is absent the verdict is "INCOMPLETE: O/private/
absent ...", exit 1, never a bare PASS, whatever the manifest lists; with --public-only it is "PASS (public evidence only; identity and forward levels not run)".

Strict reading (every evidence file, the manifest, report.html's data-value, review sheets): strict UTF-8 (no BOM,
no lone surrogates, not even from \\u escapes), no duplicate key, no NaN/Infinity or overflowing number, integers of
at most 100 digits, nesting at most 64 deep, lines of at most 64 MiB, files of at most 1 GiB, regular files only.
A violation is one line naming the file, line and field, exit 2.

Evidence format: run.py stamps every JSON evidence file with "evidence_format" (a JSONL file has the format its
MANIFEST.json declares). Before any level runs, every JSON evidence file of O is read and its format checked against
reading.READS_EVIDENCE_FORMATS; another version, or none (evidence written before the format was versioned), is one
line naming the file, the version found and the range read, exit 2. --lm-eval reads lm-eval's files: no format.

Modules (reading order): reading (strict evidence reading), manifest (the manifest level), report_page
(report.html against the evidence), checks (the check/result model and the report),
definitions (rules written again on purpose), shared (check groups every experiment runs), tokens (identity
level), forward (forward level), fast_mode (run.py --fast figures), rules/ (one module per experiment),
driver (audit one directory), mutations (the self-test), cli (argparse), lmeval/ (audit.py --lm-eval).
"""
