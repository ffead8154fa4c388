"""`python -m repro.verify`: does a result reproduce? `RUN_DIR` re-runs a recorded run and
compares it step by step (`command`); `--against REV` trains a short config at git revision REV
and at the working tree and compares them, to check a refactor bit for bit (`against`). A tool
beside the core, as `export` and `resume` are: the core never imports it."""
