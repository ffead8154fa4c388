"""Optuna searches that survive: the study in the sweep folder, pruning, the objective in config.

Beside the core, which never imports it: `hydra/sweeper=optuna_study` names the sweeper (through
`hydra_plugins/repro/study_sweeper.py`, where Hydra looks for sweepers), which adds the
`trial.ReportToStudy` callback to every job it launches. Reference: docs/sweeps.md.
"""
