"""Seed sweeps: collect the jobs of a multirun, compute statistics per group, write the report."""

ERROR_FILE = "error.txt"  # a job that failed writes its error line here (see repro.train)
# The adaptive seed sweeper's answer (hydra_plugins/repro/adaptive_seeds.py), read by the report.
DECISION_FILE = "adaptive_seeds.json"
