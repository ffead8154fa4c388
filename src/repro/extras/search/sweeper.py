"""The Optuna study sweeper: Hydra's Optuna plugin, made to survive a stop and to prune.

What it changes in the plugin's `sweep`:
- the study is kept in `storage` (by default SQLite in the sweep folder) and `n_trials` counts
  every trial it holds, so running the same command again runs only those still missing;
- a trial left running by a killed sweep is launched again first, in its own folder (job N is
  trial N), where its run resumes from its last checkpoint;
- a seeded sampler is seeded again for every trial from (seed, trial number), so a search
  stopped and continued asks what one run straight through asks;
- every job gets the `ReportToStudy` callback, which reports each evaluation and stops a trial
  the `pruner` prunes; the trial's value is read from its folder (`objective`), not returned;
- one sweep at a time works on a sweep folder (its run.lock), and the end writes study.json.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from hydra.core.utils import JobReturn, JobStatus
from hydra.utils import instantiate
from hydra_plugins.hydra_optuna_sweeper._impl import (
    OptunaSweeperImpl,
    create_params_from_overrides,
)
from optuna.trial import TrialState

from repro.core import overrides as recorded_overrides
from repro.core.errors import ConfigError, UserError, exit_with
from repro.core.guards import received
from repro.core.runs import run_lock
from repro.core.sweeps import ERROR_FILE
from repro.extras.search.study import Objective, open_study, storage_url, write_summary

log = logging.getLogger(__name__)

# Added to every job's overrides: `++` so that a config naming the callback itself still works.
REPORTER = "++callbacks.optuna_trial._target_=repro.extras.search.trial.ReportToStudy"


class StudySweeperImpl(OptunaSweeperImpl):
    def __init__(self, *, pruner: Any = None, objective: Any = None, **settings: Any) -> None:
        super().__init__(**settings)
        self.pruner, self.objective_settings = pruner, dict(objective or {})

    def sweep(self, arguments: list[str]) -> None:
        try:
            directions = self._get_directions()
            self._check(directions)
            self._process_searchspace_config()
            space, fixed = create_params_from_overrides(
                [*self._parse_sweeper_params_config(), *arguments]
            )
            space = {**(self.search_space_distributions or {}), **space}
            for name in fixed:
                space.pop(name, None)
            sweep_dir = Path(self.config.hydra.sweep.dir)
            owner = run_lock.try_claim(sweep_dir)
            if owner is not None:
                raise UserError(f"{sweep_dir}: another sweep works on this study ({owner})")
            try:
                self._search(sweep_dir, space, fixed, directions[0])
            finally:
                run_lock.release(sweep_dir)
        except UserError as error:
            exit_with(error)

    def _check(self, directions: list[str]) -> None:
        try:
            self.objective = Objective(**self.objective_settings)
        except TypeError:  # a key it does not know
            raise ConfigError("hydra.sweeper.objective", self.objective_settings,
                              "metric and take") from None  # fmt: skip
        if not self.study_name:
            raise ConfigError("hydra.sweeper.study_name", self.study_name, _ALLOWED["study_name"])
        if not isinstance(self.storage, str):
            raise ConfigError("hydra.sweeper.storage", self.storage, _ALLOWED["storage"])
        if len(directions) != 1:
            raise ConfigError("hydra.sweeper.direction", directions, _ALLOWED["direction"])

    def _search(self, sweep_dir: Path, space: dict, fixed: dict, direction: str) -> None:
        if isinstance(self.sampler, functools.partial):  # the grid sampler takes the space
            grid = {name: self._to_grid_sampler_choices(d) for name, d in space.items()}
            self.sampler = self.sampler(grid)
            # GridSampler ends `optimize` when its grid is done by calling study.stop(), which
            # raises outside `optimize`: this sweeper asks and tells, and stops at the grid's size.
            self.sampler.after_trial = lambda *told: None
            self.n_trials = min(self.n_trials, math.prod(len(c) for c in grid.values()))
        url = storage_url(self.storage)
        study = open_study(url, self.study_name, direction=direction, sampler=self.sampler,
                           pruner=self.pruner)  # fmt: skip
        trials = study.get_trials(deepcopy=False)
        log.info("study %s in %s: %d of %d trials", study.study_name, url, len(trials),
                 self.n_trials)  # fmt: skip
        going = self._finish_unfinished(study, trials, space, fixed, direction)
        while going and (left := self.n_trials - len(study.get_trials(deepcopy=False))) > 0:
            numbers, overrides = [], []
            for _ in range(min(left, self.n_jobs)):
                study.sampler = self._sampler_for(len(study.get_trials(deepcopy=False)))
                trial = study.ask()  # the sampler draws now and in _configure_trials
                overrides += self._configure_trials([trial], space, fixed)
                numbers.append(trial.number)
            going = self._run(study, numbers, overrides, direction)
        log.info("%s", write_summary(study, sweep_dir, self.objective))

    def _finish_unfinished(
        self, study: optuna.Study, trials: list, space: dict, fixed: dict, direction: str
    ) -> bool:
        """Launch again the trials a stopped sweep left running, in runs of consecutive
        numbers (a batch's); one asked but never given its parameters fails."""
        batch: list[Any] = []
        for trial in [t for t in trials if t.state == TrialState.RUNNING]:
            if set(space) - set(trial.params):
                study.tell(trial.number, state=TrialState.FAIL)
                continue
            if batch and (trial.number != batch[-1].number + 1 or len(batch) == self.n_jobs):
                if not self._rerun(study, batch, space, fixed, direction):
                    return False
                batch = []
            batch.append(trial)
        return not batch or self._rerun(study, batch, space, fixed, direction)

    def _rerun(
        self, study: optuna.Study, trials: list, space: dict, fixed: dict, direction: str
    ) -> bool:
        """Launch `trials` again with their recorded parameters. The study's database is a
        file of the sweep folder, which may come from someone else: it gives values of the
        search space's keys only (this command's), each checked as a recorded override."""
        log.info("trials %s were left running by a stopped sweep: they go on in their folders",
                 [t.number for t in trials])  # fmt: skip
        source = f"{storage_url(self.storage)} (trial parameters)"
        overrides = []
        for t in trials:
            kept = {k: v for k, v in t.params.items() if k in space}
            recorded_overrides.check(
                [f"{k}={v}" for k, v in kept.items() if k not in fixed], source
            )
            overrides.append(tuple(f"{k}={v}" for k, v in {**kept, **fixed}.items()))
        return self._run(study, [t.number for t in trials], overrides, direction)

    def _sampler_for(self, number: int) -> Any:
        """The sampler for trial `number`: a seeded one seeded from (seed, number)."""
        node = self.config.hydra.sweeper.sampler
        if node.get("seed") is None:
            return self.sampler
        seed = int(np.random.SeedSequence([int(node.seed), number]).generate_state(1)[0])
        return instantiate(node, seed=seed)

    def _run(
        self, study: optuna.Study, numbers: list[int], overrides: Sequence[Sequence[str]],
        direction: str,
    ) -> bool:  # fmt: skip
        """Launch trials `numbers` as jobs of the same numbers and tell the study how each
        ended; False when the sweep must stop (a job stopped by a signal, too many failures)."""
        returns = self.launcher.launch(
            [(*job, REPORTER) for job in overrides], initial_job_idx=numbers[0]
        )
        stopped = failed = 0
        for number, job in zip(numbers, returns, strict=True):
            state, value = self._outcome(job, direction)
            if state is None:
                log.warning("trial %d was stopped: run the same command to go on", number)
                stopped += 1
                continue
            study.tell(number, value, state=state)
            failed += state == TrialState.FAIL
            shown = f"{self.objective.metric} {value:.4f}" if value is not None else ""
            log.info("trial %d: %s %s", number, state.name.lower(), shown)
        if failed / len(returns) > self.max_failure_rate:
            log.error("%d of %d trials failed (max_failure_rate %s): the search stops", failed,
                      len(returns), self.max_failure_rate)  # fmt: skip
        return not stopped and failed / len(returns) <= self.max_failure_rate

    def _outcome(self, job: JobReturn, direction: str) -> tuple[TrialState | None, float | None]:
        """How a job ended, for its trial: (state, value); no state for a job stopped by a
        signal, whose trial stays running for the next sweep to resume."""
        folder = Path(job.hydra_cfg.hydra.runtime.output_dir)
        summary_file = folder / "summary.json"
        summary = received.load_json(summary_file, root=folder) if summary_file.is_file() else {}
        summary = summary if isinstance(summary, dict) else {}
        if job.status == JobStatus.FAILED or job.return_value is None:
            failed = (folder / ERROR_FILE).exists() or summary.get("stopped_by_signal") is None
            return (TrialState.FAIL if failed else None), None
        if summary.get("pruned"):
            return TrialState.PRUNED, None
        return TrialState.COMPLETE, self.objective.value(folder, summary, direction)


_ALLOWED = {
    "direction": "one of minimize, maximize: the sweeper optimises one objective",
    "study_name": "a name: the study continues under it when the command runs again",
    "storage": "a database URL, such as sqlite:///${hydra.sweep.dir}/optuna.db",
}
