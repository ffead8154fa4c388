"""The Hydra callback that writes a sweep's report when the multirun ends."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """After the last job: sweep_summary.{json,csv,md} and sweep.png, and the table printed;
    with logger=mlflow, they go to the sweep's MLflow run, which is then finished."""

    failed_jobs = 0  # read by repro.train to exit non-zero once the whole sweep is done

    def __init__(self, metrics: list[str] | None = None) -> None:
        self.metrics = list(metrics or [])  # more numbers to summarise (hydra.callbacks...)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from repro.core.sweeps import render, report

        sweep_dir = Path(config.hydra.sweep.dir)
        built = report.build(sweep_dir, self.metrics)
        if not built.jobs:
            return
        render.write(built)
        print(render.markdown(built), flush=True)
        try:  # the report is written: a tracker that fails now costs only its copy
            from repro.core.watch import trackers

            trackers.end_sweep(config, sweep_dir)
        except Exception as error:
            log.warning("the sweep's MLflow run was not finished: %s", error)
        failed = [job for job in built.jobs if not job.ok]
        SweepReport.failed_jobs = len(failed)
        if failed:
            log.warning("%d of %d jobs failed; see %s", len(failed), len(built.jobs), sweep_dir)
