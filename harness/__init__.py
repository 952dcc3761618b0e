"""A small LM evaluation harness. Read in this order:

    strict_json.py  bounded, strict JSON reading for every untrusted byte (task files, the result channel)
    tasks.py        task files (one JSONL per task), the loader and its errors
    metrics.py      the five metrics
    sandbox.py      running untrusted code (code_exec): bubblewrap or jail.py (the child side), proctree.py
                    (finding and killing every descendant)
    adapters.py     ModelAdapter: toy, wrong, SmolLM2 (a loaded model and tokenizer, passed in)
    hf_model.py     the repository's one model loader (adapter.py uses it too) and the CLI's check of a
                    prepared cache; a leaf: it imports no other module of harness/ or the repository
    runner.py       batches, timeouts, per-task scores
    leaderboard.py  leaderboard.json and diff
    cli.py          python -m harness run | diff

Swap the adapter and the leaderboard changes; swap the tasks and it changes; nothing else should.

The package stands on its own: it imports nothing from the repository around it (config, resources, adapter,
experiments, run, report, bench, audit; tests/test_harness.py checks this). What it needs is passed in:
settings as arguments, the model as a loaded object. run.py --experiment harness (experiments/harness.py)
composes it with the repository's config and a model loaded by adapter.py, whose loading is hf_model.py's: the
loader lives here, at the one place both can import without an import running upwards (harness/ may import
nothing of the repository; adapter.py may import a leaf that imports nothing of it).
"""
