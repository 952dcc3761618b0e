"""One module per study. EXPERIMENTS lists them in the order `run.py --smoke` runs them."""
EXPERIMENTS = ["protocol", "options", "harness", "mctaco", "extraction"]
