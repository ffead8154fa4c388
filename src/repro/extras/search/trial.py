"""The job's side of an Optuna study: each evaluation reported to the job's trial, and a trial
the study's pruner prunes stopped the way early stopping stops a run.

The study sweeper adds this callback to every job it launches; job N is trial N, and the study
(storage, name, pruner, objective) is the sweeper's config, which every job's Hydra config holds.
A pruned run ends like one stopped by `trainer.patience`: checkpointed, `completed`, and rerun
as it is, already complete; its summary.json says `pruned: true` (the sweep report lists it as
pruned, the sweeper tells the study so).
"""

from __future__ import annotations

import logging
from typing import Any

import optuna
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate

from repro.core.runtime import distributed
from repro.extras.search.study import open_study, storage_url

log = logging.getLogger(__name__)


class ReportToStudy:
    """Report `objective.metric` at every evaluation (its step: the optimizer step) and stop
    when the pruner says so. Outside a multirun (the job's overrides run alone) it does
    nothing."""

    def __init__(self) -> None:
        self.trial: optuna.Trial | None = None
        self.pruned_at: int | None = None
        hydra = HydraConfig.get() if HydraConfig.initialized() else None
        if hydra is None or hydra.mode != RunMode.MULTIRUN:
            return
        sweeper = hydra.sweeper
        pruner = instantiate(sweeper.pruner) if sweeper.get("pruner") else None
        study = open_study(storage_url(sweeper.storage), sweeper.study_name, pruner=pruner)
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(
            study._study_id, hydra.job.num
        )
        self.trial = optuna.Trial(study, trial_id)
        self.metric = sweeper.objective.metric

    def after_evaluation(self, loop: Any, row: dict[str, float], predictions: Any) -> None:
        if self.trial is None or self.metric not in row:
            return
        prune = False
        if loop.dist.is_main:  # one writer; every rank stops together
            self.trial.report(row[self.metric], row["step"])
            prune = self.trial.should_prune()
        if distributed.broadcast(prune, loop.dist):
            self.pruned_at = int(row["step"])
            loop.stop(f"pruned by optuna at step {self.pruned_at}")
            said = f"{self.metric} {row[self.metric]:.4f}"
            log.info("trial %d pruned at step %d (%s)", self.trial.number, self.pruned_at, said)

    def at_end(self, loop: Any, summary: dict[str, Any]) -> None:
        if self.trial is not None:
            summary["pruned"] = self.pruned_at is not None  # then `step` says where

    def state_dict(self) -> dict[str, Any]:
        return {"pruned_at": self.pruned_at}  # a resumed pruned run still ends pruned

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pruned_at = state.get("pruned_at")
