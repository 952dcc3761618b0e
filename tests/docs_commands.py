"""Every command of the fenced ```bash blocks of README.md and docs/*.md, and how tests/test_docs_commands.py checks
each: RUN (executed as written in a scratch checkout, by the test named), FIXTURE (what a session fixture of
conftest.py runs, with the page's flags: the test named checks them and asserts on its output), COVERED (run as written by another test
that reads it from the page) or PARSED (not run, for the reason given: its arguments go through the script's own
parser and every repository path it names must exist)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))


def strip_comment(line):
    """The line without a trailing `#` comment (a `#` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def page_commands(page):
    """The commands of one page's ```bash blocks: backslash continuations joined, a `for ...; do` loop up to its
    `done` joined into one command, comments stripped, whitespace runs in a line as one space."""
    text = (REPO / page).read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            line = strip_comment(line)
            if not line.strip():
                continue
            line = " ".join(line.split())
            pending = f"{pending}\n{line}" if pending else line
            if pending.startswith("for ") and not re.search(r"(^|[;\s])done$", pending):
                continue                     # a loop is one command up to its `done`, its lines kept apart
            commands.append(pending)
            pending = ""
        assert not pending, f"{page}: an unterminated loop: {pending}"
    return commands


def all_commands():
    """[(page, command)] in page order; a command that repeats on one page is listed once."""
    seen = []
    for page in PAGES:
        for command in page_commands(page):
            if (page, command) not in seen:
                seen.append((page, command))
    return seen


RUN, FIXTURE, COVERED, PARSED = "run", "fixture", "covered", "parsed"
HUB = "needs the Hugging Face hub, which no machine here reaches"
SUITE = "test_docs_commands.py::"

# (page, command as extracted, kind, how): RUN names the test of test_docs_commands.py that runs it (stand-ins for the
# page's placeholders are in that test's docstring); FIXTURE names the test of test_docs_commands.py that checks the
# command's flags against what a session fixture of conftest.py runs and asserts on that fixture's output; COVERED
# names the test file that reads it from the page and runs it; PARSED gives the reason it is not run.
TABLE = [
    ("README.md", "python3.11 -m venv .venv && .venv/bin/pip install -r requirements.lock && .venv/bin/python "
     "prepare.py --cache ./cache && .venv/bin/python run.py --cache ./cache --out smoke --smoke",
     FIXTURE, SUITE + "test_readme_setup_smoke_audit_report_verify"),
    ("README.md", ".venv/bin/python -m pytest -q tests", PARSED,
     "the whole suite (about 20 min on 2 vCPUs, this table included); .ci/run runs it as written"),
    ("README.md", ".venv/bin/python audit.py smoke", RUN, SUITE + "test_readme_setup_smoke_audit_report_verify"),
    ("README.md", ".venv/bin/python run.py --cache ./cache --out out --experiment protocol", FIXTURE,
     SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("README.md", ".venv/bin/python audit.py out --tokens --forward", RUN,
     SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("README.md", ".venv/bin/python run.py --cache ./cache --out out-mine --experiment protocol --model "
     "path/to/my-model", RUN, SUITE + "test_own_model_run_and_audit"),
    ("README.md", ".venv/bin/python audit.py out-mine --tokens --forward --cache ./cache", RUN,
     SUITE + "test_own_model_run_and_audit"),
    ("README.md", ".venv/bin/python prepare.py --cache ./cache --data-file mine.tsv --name mine", RUN,
     SUITE + "test_own_data_import_and_run"),
    ("README.md", ".venv/bin/python run.py --cache ./cache --out out-mine --experiment protocol --data mine", RUN,
     SUITE + "test_own_data_import_and_run"),
    ("README.md", ".venv/bin/lm_eval --model hf --model_args pretrained=HuggingFaceTB/SmolLM2-135M-Instruct,dtype=float32 "
     "--tasks sst2 --limit 50 --log_samples --output_path runs/sst2", PARSED, HUB + " (the model and GLUE SST-2)"),
    ("README.md", ".venv/bin/python audit.py --lm-eval runs/sst2", RUN, SUITE + "test_lmeval_audit_of_a_run_dir"),
    ("docs/audit.md", ".venv/bin/python audit.py smoke", RUN, SUITE + "test_readme_setup_smoke_audit_report_verify"),
    ("docs/audit.md", ".venv/bin/python audit.py smoke --tokens --forward --strict", RUN,
     SUITE + "test_readme_setup_smoke_audit_report_verify"),
    ("docs/audit.md", ".venv/bin/python audit.py smoke --mutations", PARSED,
     "about 7 min of CPU here (99 tampered copies, each audited); tests/test_mutations.py runs the self-test"),
    ("docs/citing.md", "mkdir -p -m 700 ~/.ssh && ssh-keygen -t ed25519 -f ~/.ssh/id_ed25519", RUN,
     SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", ".venv/bin/python run.py --cache ./cache --out O --experiment protocol --sign "
     "~/.ssh/id_ed25519", RUN, SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", "printf 'sha256:%s' \"$(sha256sum O/MANIFEST.json | cut -d' ' -f1)\" > digest.txt", RUN,
     SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", "ssh-keygen -Y sign -f ~/.ssh/id_ed25519 -n evidence-digest@item-level-evidence digest.txt",
     RUN, SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", "mv digest.txt.sig O/MANIFEST.json.sig", RUN,
     SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", "echo \"alice@example.org $(cut -d' ' -f1,2 ~/.ssh/id_ed25519.pub)\" > allowed_signers",
     RUN, SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", ".venv/bin/python audit.py O --allowed-signers allowed_signers", RUN,
     SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", "printf 'sha256:%s' \"$(sha256sum O/MANIFEST.json | cut -d' ' -f1)\" | ssh-keygen -Y verify "
     "-f allowed_signers -I alice@example.org -n evidence-digest@item-level-evidence -s O/MANIFEST.json.sig", RUN,
     SUITE + "test_readme_protocol_run_and_its_audit_then_signing_it"),
    ("docs/citing.md", ".venv/bin/python audit.py --lm-eval runs/sst2 --sign ~/.ssh/id_ed25519", RUN,
     SUITE + "test_lmeval_audit_of_a_run_dir"),
    ("docs/citing.md", ".venv/bin/python audit.py --lm-eval runs/sst2 --allowed-signers allowed_signers", RUN,
     SUITE + "test_lmeval_audit_of_a_run_dir"),
    ("docs/citing.md", "cd runs/sst2 && find . -maxdepth 2 -type f \\( -name 'results_*.json' -o -name "
     "'samples_*.jsonl' \\) | sed 's|^\\./||' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum", RUN,
     SUITE + "test_lmeval_audit_of_a_run_dir"),
    ("docs/data-parallel.md", ".venv/bin/torchrun --nproc_per_node 2 run.py --cache ./cache --out O --experiment "
     "protocol --experiment options --experiment mctaco", PARSED,
     "two ranks of the real model over 64 + 64 x 5 + 62 items: minutes of CPU; tests/test_distributed.py runs "
     "torchrun on the smoke"),
    ("docs/data-parallel.md", ".venv/bin/accelerate launch --multi_gpu --num_processes 2 run.py --cache ./cache "
     "--out O --experiment protocol", PARSED, "accelerate's multi-GPU launcher; tests/test_distributed.py runs "
     "run.py under accelerate's environment"),
    ("docs/data-parallel.md", ".venv/bin/python run.py --cache ./cache --out S1 --experiment mctaco --shard 1/2",
     PARSED, "the shard, merge and audit chain costs about 80 s of CPU here, over this file's budget; "
     "tests/test_distributed.py runs --shard and --merge"),
    ("docs/data-parallel.md", ".venv/bin/python run.py --cache ./cache --out S2 --experiment mctaco --shard 2/2",
     PARSED, "as S1 above"),
    ("docs/data-parallel.md", ".venv/bin/python run.py --cache ./cache --out O --merge S1 S2", PARSED,
     "needs the shards S1 and S2 (above)"),
    ("docs/data-parallel.md", ".venv/bin/python audit.py O --strict --tokens --forward --cache ./cache", PARSED,
     "needs the merged O (above)"),
    ("docs/data-parallel.md", ".venv/bin/python bench.py --cache ./cache --scaling --out scaling.json", PARSED,
     "a benchmark: the protocol at 1 to N processes, minutes of CPU"),
    ("docs/data.md", ".venv/bin/python prepare.py --cache ./cache --data-file path/to/SST-2/dev.tsv", PARSED,
     "needs GLUE SST-2's dev.tsv, which is not shipped (licence unknown)"),
    ("docs/data.md", ".venv/bin/python prepare.py --cache ./cache --data glue-sst2 --source hub", PARSED, HUB),
    ("docs/data.md", ".venv/bin/python run.py --cache ./cache --out out-glue --experiment protocol --data glue-sst2",
     PARSED, "needs glue-sst2 prepared (above)"),
    ("docs/data.md", ".venv/bin/python prepare.py --cache ./cache --data-file mine.tsv --name mine", RUN,
     SUITE + "test_own_data_import_and_run"),
    ("docs/data.md", ".venv/bin/python run.py --cache ./cache --out out-mine --experiment protocol --data mine", RUN,
     SUITE + "test_own_data_import_and_run"),
    ("docs/data.md", ".venv/bin/python bench.py --cache ./cache --data mine", PARSED,
     "a benchmark: every method (lm-eval at two batch sizes, parity, fast, dual, options) on the rows, about 50 s "
     "of CPU for 8 rows here"),
    ("docs/data.md", ".venv/bin/python prepare.py --cache ./cache --data-file fixtures/reviews_872_dev.tsv --name "
     "reviews-872", RUN, SUITE + "test_own_data_import_and_run"),
    ("docs/data.md", ".venv/bin/python run.py --cache ./cache --out r872 --data reviews-872 --split all "
     "--experiment protocol", PARSED, "872 items on both paths: several minutes of CPU"),
    ("docs/extraction.md", ".venv/bin/python audit.py out --experiment extraction --review "
     "extraction-review-sheet-<sha>.json", PARSED, "needs a review sheet a person filled in (<sha> names it)"),
    ("docs/harness.md", ".venv/bin/python -m harness run --adapter toy --out toy.json", RUN,
     SUITE + "test_harness_toy_run"),
    ("docs/harness.md", ".venv/bin/python -m harness run --adapter smollm2 --cache ./cache --out smol.json", PARSED,
     "about 2.5 min of CPU here (greedy generation on the real model); tests/test_harness.py runs the adapter"),
    ("docs/harness.md", ".venv/bin/python -m harness diff toy.json smol.json", PARSED,
     "needs smol.json (above)"),
    ("docs/harness.md", ".venv/bin/python run.py --cache ./cache --out out-h --experiment harness", PARSED,
     "the same generations as smol.json, minutes of CPU; the smoke runs the harness experiment on 2 items"),
    ("docs/lm-eval-audit.md", ".venv/bin/lm_eval --model hf --model_args pretrained=HuggingFaceTB/SmolLM2-135M-Instruct,"
     "dtype=float32 --tasks sst2 --limit 50 --log_samples --output_path runs/sst2", PARSED,
     HUB + " (the model and GLUE SST-2)"),
    ("docs/lm-eval-audit.md", ".venv/bin/python audit.py --lm-eval runs/sst2", RUN,
     SUITE + "test_lmeval_audit_of_a_run_dir"),
    ("docs/lm-eval-audit.md", ".venv/bin/python -c \"import datasets; datasets.load_dataset('nyu-mll/glue', "
     "'sst2', split='validation').to_parquet('sst2.parquet')\"", PARSED, HUB),
    ("docs/lm-eval-audit.md", "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct", PARSED, HUB),
    ("docs/lm-eval-audit.md", ".venv/bin/python audit.py --lm-eval runs/sst2 --forward --data sst2.parquet "
     "--model DIR", RUN, SUITE + "test_lmeval_audit_of_a_run_dir"),
    ("docs/lm-eval-audit.md", "for v in 0.4.5 0.4.7 0.4.8 0.4.9 0.4.9.1 0.4.9.2 0.4.10 0.4.11 0.4.12 0.4.13; do\n"
     ".venv/bin/python -m pip download lm_eval==$v --no-deps --only-binary=:all: -d /tmp/lmeval-wheels; done",
     PARSED, "downloads ten wheels from PyPI"),
    ("docs/lm-eval-audit.md", ".venv/bin/python tools/make_task_file_table.py /tmp/lmeval-wheels", PARSED,
     "needs the ten wheels (above)"),
    ("docs/lm-eval-audit.md", ".venv/bin/python tools/stock_task_run.py --write-docs", PARSED,
     "rewrites docs/lm-eval-audit.md's coverage table; lm-eval on every stock task, minutes of CPU; "
     "tests/test_lmeval_coverage.py checks the table"),
    ("docs/lmeval-offline.md", ".venv/bin/python tools/lmeval_offline_run.py --model hf --model_args "
     "pretrained=tests/fixtures/lmeval_chat/model,dtype=float32 --include_path tests/fixtures/lmeval_chat/task "
     "--tasks toy_chat,toy_prefix --num_fewshot 2 --apply_chat_template --device cpu --batch_size 4 --log_samples "
     "--output_path runs/offline", COVERED, "tests/test_lmeval_recipe.py"),
    ("docs/lmeval-offline.md", ".venv/bin/python audit.py --lm-eval runs/offline --forward --model "
     "tests/fixtures/lmeval_chat/model --data tests/fixtures/lmeval_chat/task/validation.jsonl --fewshot-data "
     "tests/fixtures/lmeval_chat/task/train.jsonl", COVERED, "tests/test_lmeval_recipe.py"),
    ("docs/mctaco.md", ".venv/bin/python prepare.py --cache ./cache --data-file path/to/dev_3783.tsv", PARSED,
     "needs the MC-TACO authors' dev_3783.tsv, which is not shipped"),
    ("docs/mctaco.md", ".venv/bin/python prepare.py --cache ./cache --data-file path/to/dev_3783.tsv --pin", PARSED,
     "needs the MC-TACO authors' dev_3783.tsv, and --pin writes resources.lock.json"),
    ("docs/mctaco.md", ".venv/bin/python run.py --cache ./cache --out out-mct --experiment mctaco --data mc-taco",
     PARSED, "needs mc-taco prepared (above); 3,783 rows: hours of CPU"),
    ("docs/mctaco.md", ".venv/bin/python run.py --cache ./cache --out out-mct-t --experiment mctaco --data "
     "mc-taco-test", PARSED, "needs mc-taco-test prepared; 9,442 rows: hours of CPU"),
    ("docs/mctaco.md", ".venv/bin/python synth_mctaco.py --split validation --out /tmp/synth_dev_3783.tsv", RUN,
     SUITE + "test_synthetic_mctaco_files_and_their_import"),
    ("docs/mctaco.md", ".venv/bin/python synth_mctaco.py --split test --out /tmp/synth_test_9442.tsv", RUN,
     SUITE + "test_synthetic_mctaco_files_and_their_import"),
    ("docs/mctaco.md", ".venv/bin/python prepare.py --cache ./cache --data-file /tmp/synth_dev_3783.tsv --name "
     "synth-mctaco-dev", RUN, SUITE + "test_synthetic_mctaco_files_and_their_import"),
    ("docs/mctaco.md", ".venv/bin/python prepare.py --cache ./cache --data-file /tmp/synth_test_9442.tsv --name "
     "synth-mctaco-test --as-split test", RUN, SUITE + "test_synthetic_mctaco_files_and_their_import"),
    ("docs/mctaco.md", ".venv/bin/python run.py --cache ./cache --out /tmp/t-dev --experiment mctaco --data "
     "synth-mctaco-dev", PARSED, "3,783 rows: hours of CPU"),
    ("docs/mctaco.md", ".venv/bin/python run.py --cache ./cache --out /tmp/t-dev2 --experiment mctaco --data "
     "synth-mctaco-dev", PARSED, "needs /tmp/t-dev's scores in the result cache (above)"),
    ("docs/mctaco.md", ".venv/bin/python run.py --cache ./cache --out /tmp/t-test --experiment mctaco --data "
     "synth-mctaco-test", PARSED, "9,442 rows: hours of CPU"),
    ("docs/measurements.md", ".venv/bin/python prepare.py --cache /tmp/fs-work/cache --data-file "
     "fixtures/reviews_872_dev.tsv --name reviews-872", PARSED,
     "a dated record of a measurement (the forward-sample timing), not a recipe"),
    ("docs/measurements.md", ".venv/bin/python run.py --cache /tmp/fs-work/cache --out /tmp/fs-work/r872 "
     "--experiment protocol --data reviews-872 --split all --no-cache --threads 2", PARSED,
     "a dated record of a measurement; 872 items: minutes of CPU"),
    ("docs/measurements.md", ".venv/bin/python tools/measure_forward_sample.py --cache /work/main/cache --work "
     "/tmp/fs-work --parts evidence", PARSED, "a dated record of a measurement: hours of CPU"),
    ("docs/measurements.md", ".venv/bin/python tools/measure_forward_sample.py --cache /work/main/cache --work "
     "/tmp/fs-work --parts lmeval", PARSED, "a dated record of a measurement: hours of CPU"),
    ("docs/measurements.md", ".venv/bin/python tools/measure_forward_sample.py --project "
     "/tmp/fs-work/forward_sample.json", PARSED, "needs the measurement's forward_sample.json (above)"),
    ("docs/models.md", ".venv/bin/python run.py --cache ./cache --out out-mine --experiment protocol --model "
     "path/to/my-model", RUN, SUITE + "test_own_model_run_and_audit"),
    ("docs/models.md", ".venv/bin/python audit.py out-mine --tokens --forward --cache ./cache", RUN,
     SUITE + "test_own_model_run_and_audit"),
    ("docs/offline-default.md", ".venv/bin/python prepare.py --cache ./cache --verify", RUN,
     SUITE + "test_readme_setup_smoke_audit_report_verify"),
    ("docs/report.md", ".venv/bin/python report.py smoke", RUN, SUITE + "test_readme_setup_smoke_audit_report_verify"),
    ("docs/speed.md", ".venv/bin/python bench.py --cache ./cache --data reviews-872 --out bench.json", PARSED,
     "a benchmark over 872 items and every method: an hour of CPU"),
    ("docs/speed.md", ".venv/bin/python bench.py --cache ./cache --data-file fixtures/reviews_872_dev.tsv --n 200 "
     "--methods lm_eval_b16,parity", PARSED, "a benchmark: 200 items by two methods, minutes of CPU"),
    ("docs/speed.md", "for exp in protocol options extraction; do\n.venv/bin/python run.py --cache ./cache --out "
     "r872-$exp --data reviews-872 --split all --experiment $exp --threads 1\n.venv/bin/python audit.py r872-$exp "
     "--tokens --forward --strict\ndone", PARSED, "872 items through three experiments and their audits: hours of CPU"),
    ("docs/speed.md", "nice -n 5 .venv/bin/python tools/measure_forward_sample.py --cache ./cache --work "
     "/tmp/fs-work", PARSED, "a measurement: hours of CPU"),
    ("docs/speed.md", ".venv/bin/python tools/measure_forward_sample.py --project /tmp/fs-work/forward_sample.json",
     PARSED, "needs the measurement's forward_sample.json (above)"),
]


def entries(kinds, test):
    """The table's entries of these kinds that this file's test `test` checks."""
    return [e for e in TABLE if e[2] in kinds and e[3] == SUITE + test]
