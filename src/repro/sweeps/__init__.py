"""Seed sweeps: collect the jobs of a multirun, compute statistics per group, write the report."""

ERROR_FILE = "error.txt"  # a job that failed writes its error line here (see repro.train)
