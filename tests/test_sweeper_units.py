"""The study sweeper (repro.search.sweeper) in this process, with a real Optuna study in
SQLite and a launcher whose jobs are folders written here: trials asked in batches of n_jobs
and told what their folders say, a stopped sweep continued where it stopped, failures and
prunes, the seeded sampler per trial, and each setting refused in one line. Whole sweeps of
real runs are test_optuna's."""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.utils import instantiate
from omegaconf import OmegaConf

from repro.errors import ConfigError
from repro.runs import run_lock
from repro.search.study import open_study
from repro.search.sweeper import REPORTER, StudySweeperImpl
from repro.sweeps import ERROR_FILE

LR = "optimizer.lr"


class Launcher:
    """Hydra's launcher, as the sweeper uses it: job N runs in folder N; `outcome` says how
    each trial's job ends, from its overrides (the default: completed, val_acc = the lr)."""

    def __init__(self, sweep_dir: Path, outcome=None) -> None:
        self.sweep_dir, self.outcome, self.launched = sweep_dir, outcome, []

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        self.launched.append((initial_job_idx, [list(job) for job in job_overrides]))
        returns = []
        for number, overrides in enumerate(job_overrides, start=initial_job_idx):
            folder = self.sweep_dir / str(number)
            folder.mkdir(parents=True, exist_ok=True)
            values = dict(o.split("=", 1) for o in overrides if not o.startswith("++"))
            how = self.outcome(number, values) if self.outcome else "completed"
            job = JobReturn(hydra_cfg=OmegaConf.create({"hydra": {"runtime": {}}}))
            job.hydra_cfg.hydra.runtime.output_dir = str(folder)
            summary: dict = {"val_acc": float(values[LR]), "stopped_by_signal": None}
            job.status, job.return_value = JobStatus.COMPLETED, summary["val_acc"]
            if how == "stopped":
                summary["stopped_by_signal"] = 15
                job.return_value = None
            elif how == "failed":
                (folder / ERROR_FILE).write_text("ValueError: bad\n")
                job.status, job.return_value = JobStatus.FAILED, ValueError("bad")
                summary = None
            elif how == "pruned":
                summary["pruned"] = True
            if summary is not None:
                (folder / "summary.json").write_text(json.dumps(summary))
            returns.append(job)
        return returns


def make_sweeper(sweep_dir: Path, launcher=None, sampler: dict | None = None, **settings):
    """A sweeper over lr in {0.1, 0.2, 0.3, 0.4}, built as Hydra's plugin builds it: the
    sampler instantiated from its config node (seed 3, unless `sampler` says otherwise)."""
    node = sampler or {"_target_": "optuna.samplers.RandomSampler", "seed": 3}
    given = {
        "sampler": instantiate(node),
        "direction": "maximize",
        "storage": f"sqlite:///{sweep_dir}/optuna.db",
        "study_name": "lr",
        "n_trials": 4,
        "n_jobs": 2,
        "max_failure_rate": 0.0,
        "search_space": None,
        "custom_search_space": None,
        "params": OmegaConf.create({LR: "choice(0.1,0.2,0.3,0.4)"}),
        "objective": {"metric": "val_acc"},
    } | settings
    sweeper = StudySweeperImpl(**given)
    sweeper.config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(sweep_dir)}, "sweeper": {"sampler": node}}}
    )
    sweeper.launcher = launcher or Launcher(sweep_dir)
    return sweeper


def trials(sweep_dir: Path) -> list[tuple[str, float | None, dict]]:
    """Each trial's state, value and parameters, from the study.json a sweep ends with."""
    told = json.loads((sweep_dir / "study.json").read_text())["trials"]
    return [(t["state"].upper(), t["value"], t["params"]) for t in told]


def test_trials_run_n_jobs_at_a_time_each_told_its_folders_value(tmp_path):
    sweeper = make_sweeper(tmp_path)
    sweeper.sweep([])
    launched = sweeper.launcher.launched
    assert [first for first, _ in launched] == [0, 2]  # job N is trial N
    assert all(len(jobs) == 2 and job[-1] == REPORTER for _, jobs in launched for job in jobs)
    told = trials(tmp_path)
    assert [state for state, _, _ in told] == ["COMPLETE"] * 4
    assert all(value == params[LR] for _, value, params in told)
    summary = json.loads((tmp_path / "study.json").read_text())
    assert summary["counts"] == {"complete": 4}
    again = make_sweeper(tmp_path)
    again.sweep([])  # every trial done: nothing to launch
    assert again.launcher.launched == []
    assert not run_lock.try_claim(tmp_path)  # the sweep let go of its folder
    run_lock.release(tmp_path)


def test_a_seeded_search_stopped_and_continued_asks_what_one_run_straight_asks(tmp_path):
    make_sweeper(tmp_path / "straight", n_trials=4).sweep([])
    make_sweeper(tmp_path / "parts", n_trials=2, n_jobs=1).sweep([])
    make_sweeper(tmp_path / "parts", n_trials=4, n_jobs=1).sweep([])
    straight, parts = trials(tmp_path / "straight"), trials(tmp_path / "parts")
    assert [p for _, _, p in straight] == [p for _, _, p in parts]
    unseeded = make_sweeper(
        tmp_path / "unseeded", sampler={"_target_": "optuna.samplers.RandomSampler"}
    )
    assert unseeded._sampler_for(3) is unseeded.sampler


def test_a_trial_stopped_by_a_signal_stays_running_and_goes_on_in_its_folder(tmp_path, caplog):
    def stop_trial_1(number, values):
        return "stopped" if number == 1 else "completed"

    first = make_sweeper(tmp_path, Launcher(tmp_path, stop_trial_1))
    with caplog.at_level(logging.WARNING, logger="repro.search.sweeper"):
        first.sweep([])
    assert [first_job for first_job, _ in first.launcher.launched] == [0]  # it stopped there
    assert [state for state, _, _ in trials(tmp_path)] == ["COMPLETE", "RUNNING"]
    assert "trial 1 was stopped: run the same command to go on" in caplog.messages
    lr = trials(tmp_path)[1][2][LR]
    second = make_sweeper(tmp_path)
    second.sweep([])
    rerun, *rest = second.launcher.launched
    assert rerun == (1, [[f"{LR}={lr}", REPORTER]])  # its own parameters, in folder 1
    assert [first_job for first_job, _ in rest] == [2]
    assert [state for state, _, _ in trials(tmp_path)] == ["COMPLETE"] * 4


def test_failures_past_the_rate_stop_the_search_and_a_prune_is_told(tmp_path, caplog):
    def fail_trial_0(number, values):
        return "failed" if number == 0 else "pruned"

    sweeper = make_sweeper(tmp_path, Launcher(tmp_path, fail_trial_0))
    with caplog.at_level(logging.INFO, logger="repro.search.sweeper"):
        sweeper.sweep([])
    assert len(sweeper.launcher.launched) == 1
    assert [state for state, _, _ in trials(tmp_path)] == ["FAIL", "PRUNED"]
    assert "1 of 2 trials failed (max_failure_rate 0.0): the search stops" in caplog.messages
    assert "trial 0: fail " in caplog.messages and "trial 1: pruned " in caplog.messages
    tolerant = make_sweeper(
        tmp_path / "tolerant", Launcher(tmp_path / "tolerant", fail_trial_0), max_failure_rate=0.5
    )
    tolerant.sweep([])
    assert [state for state, _, _ in trials(tmp_path / "tolerant")] == ["FAIL"] + ["PRUNED"] * 3


def test_a_trial_asked_but_never_given_its_parameters_fails_and_others_rerun_in_batches(
    tmp_path,
):
    study = open_study(f"sqlite:///{tmp_path}/optuna.db", "lr", direction="maximize")
    distribution = optuna.distributions.CategoricalDistribution([0.1, 0.2, 0.3, 0.4])
    study.ask()  # trial 0: killed before its parameters were drawn
    for _ in range(3):  # trials 1, 2, 3: drawn, then the sweep was killed
        study.ask({LR: distribution})
    sweeper = make_sweeper(tmp_path)
    sweeper.sweep([])
    assert [(first, len(jobs)) for first, jobs in sweeper.launcher.launched] == [(1, 2), (3, 1)]
    assert [state for state, _, _ in trials(tmp_path)] == ["FAIL"] + ["COMPLETE"] * 3


GRID = {"_target_": "optuna.samplers.GridSampler", "_partial_": True}


def test_a_fixed_override_joins_every_job_and_a_grid_runs_each_point_once(tmp_path):
    sweeper = make_sweeper(tmp_path, sampler=GRID, n_trials=10)
    sweeper.sweep(["seed=5"])
    jobs = [job for _, launched in sweeper.launcher.launched for job in launched]
    assert len(jobs) == 4 and all("seed=5" in job for job in jobs)
    assert sorted(p[LR] for _, _, p in trials(tmp_path)) == [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize(
    "settings, key, allowed",
    [
        ({"objective": {"metrix": "val_acc"}}, "hydra.sweeper.objective", "metric and take"),
        ({"study_name": ""}, "hydra.sweeper.study_name", "a name: the study continues"),
        ({"storage": None}, "hydra.sweeper.storage", "a database URL"),
        ({"direction": ["maximize", "minimize"]}, "hydra.sweeper.direction", "one of minimize"),
    ],
)
def test_each_setting_that_cannot_work_is_refused_in_one_line(
    settings, key, allowed, tmp_path, capsys
):
    sweeper = make_sweeper(tmp_path, **settings)
    with pytest.raises(SystemExit) as stopped:
        sweeper.sweep([])
    assert stopped.value.code not in (0, None)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {key}=") and allowed in line
    assert sweeper.launcher.launched == []
    with pytest.raises(ConfigError, match=key):
        sweeper._check(sweeper._get_directions())


def test_a_second_sweep_on_a_study_in_use_is_refused_naming_the_owner(tmp_path, capsys):
    held = os.open(tmp_path / run_lock.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # as another sweep's process holds it
    os.write(held, json.dumps({"pid": 12, "host": "node7", "since": "noon"}).encode())
    try:
        sweeper = make_sweeper(tmp_path)
        with pytest.raises(SystemExit):
            sweeper.sweep([])
    finally:
        os.close(held)
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line
        == f"error: {tmp_path}: another sweep works on this study (pid 12 on node7, since noon)"
    )
    assert sweeper.launcher.launched == [] and not (tmp_path / "optuna.db").exists()
