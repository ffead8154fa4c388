"""Hydra builds sweepers only from the `hydra_plugins` package: this names repro's Optuna study
sweeper there (`hydra/sweeper=optuna_study`). It imports repro.extras.search, and optuna, only when a
sweep uses it, since Hydra imports every module here whenever it starts."""

from __future__ import annotations

import logging
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

# optuna imports alembic, which logs a line per plugin it sets up: not news to anyone sweeping.
logging.getLogger("alembic").setLevel(logging.WARNING)


class StudySweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        from repro.extras.search.sweeper import StudySweeperImpl

        self.sweeper = StudySweeperImpl(**settings)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        return self.sweeper.sweep(arguments)
