"""The study sweeper (repro.extras.search.sweeper) in this process, with a real Optuna study in
SQLite and a launcher whose jobs are folders written here: trials asked in batches of n_jobs
and told what their folders say, a stopped sweep continued where it stopped, failures and
prunes, the seeded sampler per trial, and each setting refused in one line. Whole sweeps of
real runs are test_optuna's."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from pathlib import Path

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.utils import instantiate
from omegaconf import OmegaConf

from repro.core.errors import ConfigError
from repro.core.runs import run_lock
from repro.core.sweeps import ERROR_FILE
from repro.extras.search.study import open_study
from repro.extras.search.sweeper import REPORTER, StudySweeperImpl

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
            elif how == "killed":  # SIGKILL: nothing written, no error line
                job.status, job.return_value, summary = JobStatus.FAILED, None, None
            elif how == "odd summary":
                (folder / ERROR_FILE).write_text("ValueError: bad\n")
                job.status, job.return_value, summary = JobStatus.FAILED, None, [1, 2]
            if summary is not None:
                (folder / "summary.json").write_text(json.dumps(summary))
            # Its evaluations: half the lr, then the lr (the best when maximising, the last).
            lr = float(values[LR])
            (folder / "metrics.csv").write_text(f"step,val_acc\n1,{lr / 2}\n2,{lr}\n")
            returns.append(job)
        return returns


def only(number: int, how: str, others: str = "completed"):
    """An outcome for Launcher: trial `number`'s job ends `how`, every other one `others`."""
    return lambda trial, values: how if trial == number else others


def error_lines(capsys) -> list[str]:
    """The lines of stderr that say an error: the log records a handler of the test runner's
    (mutmut's, say) may add to stderr are not the command's answer."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]


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
    first = make_sweeper(tmp_path, Launcher(tmp_path, only(1, "stopped")))
    with caplog.at_level(logging.WARNING, logger="repro.extras.search.sweeper"):
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
    sweeper = make_sweeper(tmp_path, Launcher(tmp_path, only(0, "failed", others="pruned")))
    with caplog.at_level(logging.INFO, logger="repro.extras.search.sweeper"):
        sweeper.sweep([])
    assert len(sweeper.launcher.launched) == 1
    assert [state for state, _, _ in trials(tmp_path)] == ["FAIL", "PRUNED"]
    assert "1 of 2 trials failed (max_failure_rate 0.0): the search stops" in caplog.messages
    assert "trial 0: fail " in caplog.messages and "trial 1: pruned " in caplog.messages
    tolerant = make_sweeper(
        tmp_path / "tolerant",
        Launcher(tmp_path / "tolerant", only(0, "failed", others="pruned")),
        max_failure_rate=0.5,
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
        (
            {"objective": {"metrix": "val_acc"}},
            "hydra.sweeper.objective={'metrix': 'val_acc'}",
            "metric and take",
        ),
        (
            {"study_name": ""},
            "hydra.sweeper.study_name=''",
            "a name: the study continues under it when the command runs again",
        ),
        (
            {"storage": 5},
            "hydra.sweeper.storage=5",
            "a database URL, such as sqlite:///${hydra.sweep.dir}/optuna.db",
        ),
        (
            {"direction": ["maximize", "minimize"]},
            "hydra.sweeper.direction=['maximize', 'minimize']",
            "one of minimize, maximize: the sweeper optimises one objective",
        ),
    ],
    ids=["objective", "study_name", "storage", "direction"],
)
def test_each_setting_that_cannot_work_is_refused_in_one_line(
    settings, key, allowed, tmp_path, capsys
):
    sweeper = make_sweeper(tmp_path, **settings)
    with pytest.raises(SystemExit) as stopped:
        sweeper.sweep([])
    assert stopped.value.code not in (0, None)
    (line,) = error_lines(capsys)
    assert line == f"error: {key} is not allowed: {allowed}"
    assert sweeper.launcher.launched == []
    with pytest.raises(ConfigError, match=re.escape(key)):
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
    (line,) = error_lines(capsys)
    assert (
        line
        == f"error: {tmp_path}: another sweep works on this study (pid 12 on node7, since noon)"
    )
    assert sweeper.launcher.launched == [] and not (tmp_path / "optuna.db").exists()


def test_the_best_evaluation_is_taken_in_the_studys_direction_reruns_included(tmp_path):
    best = {"metric": "val_acc", "take": "best"}
    first = make_sweeper(tmp_path, Launcher(tmp_path, only(0, "stopped")), objective=best)
    first.sweep([])
    second = make_sweeper(tmp_path, objective=best)
    second.sweep([])  # trial 0 reruns first, then trials 2 and 3
    assert [first_job for first_job, _ in second.launcher.launched] == [0, 2]
    told = trials(tmp_path)
    assert [state for state, _, _ in told] == ["COMPLETE"] * 4
    assert all(value == params[LR] for _, value, params in told), "the larger, when maximising"
    lowest = make_sweeper(tmp_path / "min", objective=best, direction="minimize")
    lowest.sweep([])
    assert all(value == params[LR] / 2 for _, value, params in trials(tmp_path / "min"))


def test_a_stopped_job_leaves_the_others_of_its_batch_told(tmp_path, caplog):
    sweeper = make_sweeper(tmp_path, Launcher(tmp_path, only(0, "stopped")))
    with caplog.at_level(logging.INFO, logger="repro.extras.search.sweeper"):
        sweeper.sweep([])
    told = trials(tmp_path)
    assert [state for state, _, _ in told] == ["RUNNING", "COMPLETE"]
    assert f"trial 1: complete val_acc {told[1][1]:.4f}" in caplog.messages
    url = f"sqlite:///{tmp_path}/optuna.db"
    ours = [r.getMessage() for r in caplog.records if r.name == "repro.extras.search.sweeper"]
    assert ours[0] == f"study lr in {url}: 0 of 4 trials"
    best = f"best: trial 1, val_acc {told[1][1]:.4f} {told[1][2]}"
    assert ours[-1] == f"study lr: 2 trials (1 complete, 0 pruned, 0 fail, 1 running); {best}"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="repro.extras.search.sweeper"):
        make_sweeper(tmp_path).sweep([])
    said = "trials [0] were left running by a stopped sweep: they go on in their folders"
    assert said in caplog.messages


def test_a_job_killed_without_a_word_fails_and_an_odd_summary_is_none(tmp_path):
    def outcome(number, values):
        return {0: "killed", 1: "odd summary"}.get(number, "completed")

    make_sweeper(tmp_path, Launcher(tmp_path, outcome), max_failure_rate=1.0).sweep([])
    assert [state for state, _, _ in trials(tmp_path)] == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]


def test_failures_at_the_rate_allowed_go_on_without_an_error(tmp_path, caplog):
    sweeper = make_sweeper(tmp_path, Launcher(tmp_path, only(0, "failed")), max_failure_rate=0.5)
    with caplog.at_level(logging.INFO, logger="repro.extras.search.sweeper"):
        sweeper.sweep([])
    assert [state for state, _, _ in trials(tmp_path)] == ["FAIL"] + ["COMPLETE"] * 3
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_rerun_batch_that_stops_the_search_launches_nothing_after_it(tmp_path):
    study = open_study(f"sqlite:///{tmp_path}/optuna.db", "lr", direction="maximize")
    distribution = optuna.distributions.CategoricalDistribution([0.1, 0.2, 0.3, 0.4])
    for _ in range(4):  # trials 0 to 3 drawn, then the sweep was killed
        study.ask({LR: distribution})

    sweeper = make_sweeper(tmp_path, Launcher(tmp_path, only(0, "failed")), n_trials=6)
    sweeper.sweep([])
    assert [first for first, _ in sweeper.launcher.launched] == [0]
    assert [state for state, _, _ in trials(tmp_path)] == ["FAIL", "COMPLETE"] + ["RUNNING"] * 2


def test_each_trials_sampler_is_seeded_from_the_seed_and_its_number(tmp_path):
    import numpy as np

    sweeper = make_sweeper(tmp_path)
    for number in (0, 5):
        seed = int(np.random.SeedSequence([3, number]).generate_state(1)[0])
        ours, theirs = sweeper._sampler_for(number), optuna.samplers.RandomSampler(seed=seed)
        assert ours._rng.rand() == theirs._rng.rand()
    make_sweeper(tmp_path / "all").sweep([])
    assert len({params[LR] for _, _, params in trials(tmp_path / "all")}) > 1


def test_a_value_given_on_the_command_line_is_not_searched(tmp_path):
    sweeper = make_sweeper(tmp_path)
    sweeper.sweep([f"{LR}=0.3"])
    jobs = [job for _, launched in sweeper.launcher.launched for job in launched]
    assert len(jobs) == 4 and all(job == [f"{LR}=0.3", REPORTER] for job in jobs)
    assert all(params == {} for _, _, params in trials(tmp_path))


def test_a_running_trials_recorded_value_is_checked_naming_the_study(tmp_path, capsys):
    from optuna.trial import TrialState, create_trial

    study = open_study(f"sqlite:///{tmp_path}/optuna.db", "lr", direction="maximize")
    planted = "${oc.env:HOME}"
    distribution = optuna.distributions.CategoricalDistribution([planted, 0.1])
    study.add_trial(
        create_trial(
            state=TrialState.RUNNING, params={LR: planted}, distributions={LR: distribution}
        )
    )
    sweeper = make_sweeper(tmp_path)
    with pytest.raises(SystemExit):
        sweeper.sweep(["seed=5"])
    (line,) = error_lines(capsys)
    source = f"sqlite:///{tmp_path}/optuna.db (trial parameters)"
    assert line.startswith(f"error: {source}: the recorded override 'optimizer.lr={planted}'")
    assert sweeper.launcher.launched == []


def test_a_summary_linked_from_outside_its_folder_is_refused(tmp_path, capsys):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"val_acc": 0.99}))

    class Linking(Launcher):
        def launch(self, job_overrides, initial_job_idx):
            returns = super().launch(job_overrides, initial_job_idx)
            for job in returns:
                summary = Path(job.hydra_cfg.hydra.runtime.output_dir) / "summary.json"
                summary.unlink()
                summary.symlink_to(outside)
            return returns

    sweeper = make_sweeper(tmp_path / "sweep", Linking(tmp_path / "sweep"))
    with pytest.raises(SystemExit):
        sweeper.sweep([])
    (line,) = error_lines(capsys)
    assert "summary.json" in line and "0.99" not in line
