"""A small LM evaluation harness. Read in this order:

    tasks.py        task files (one JSONL per task), the loader and its errors
    metrics.py      the five metrics
    sandbox.py      running untrusted code (code_exec), with jail.py, the child side
    adapters.py     ModelAdapter: toy, wrong, SmolLM2 (through the repository's adapter.py)
    runner.py       batches, timeouts, per-task scores
    leaderboard.py  leaderboard.json and diff
    cli.py          python -m harness run | diff

Swap the adapter and the leaderboard changes; swap the tasks and it changes; nothing else should.
"""
