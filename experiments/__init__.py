"""One module per study (protocol, options, harness, mctaco, extraction), each satisfying the contract in
context.py, and the modules they share: two_paths (both paths' models, the identity join, the comparison),
official (the only lm_eval importer), scoring and fast_scoring (the independent path), selection (rows and the
item hash rule), evidence (files, stages, environment), result_cache, runlog (library chatter -> O/run.log).
EXPERIMENTS lists the studies' names in the order `run.py --smoke` runs them: a view of registry.py, where each
experiment is declared once."""
import registry

EXPERIMENTS = list(registry.NAMES)
