"""The study's side of a search, in this process (tests/test_optuna.py runs whole sweeps): the
storage a relative path names, a trial's value from its job's folder, study.json and the
best parameters, and a job's reports and pruning."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from repro.core.errors import ConfigError
from repro.core.runtime.distributed import Context
from repro.extras.search.study import Objective, open_study, storage_url, write_summary
from repro.extras.search.trial import ReportToStudy


def test_a_relative_sqlite_path_is_made_absolute_and_its_folder_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage_url("sqlite:///sweeps/a/optuna.db") == f"sqlite:///{tmp_path}/sweeps/a/optuna.db"
    assert (tmp_path / "sweeps" / "a").is_dir()
    for unchanged in ("sqlite:////abs/optuna.db", "postgresql://host/db", "sqlite://"):
        assert storage_url(unchanged) == unchanged
    assert not (tmp_path / "abs").exists()


def test_a_study_is_created_once_then_loaded_and_every_write_reaches_the_database(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    with pytest.raises(KeyError):
        open_study(url, "s")  # loading one that was never created
    made = open_study(url, "s", direction="maximize")
    again = open_study(url, "s", direction="maximize")  # load_if_exists
    assert made._study_id == again._study_id and made.direction.name == "MAXIMIZE"
    trial = made.ask()
    trial.report(0.5, 3)
    # Another process (here another handle) sees the report while the trial runs.
    seen = open_study(url, "s").get_trials(deepcopy=False)
    assert seen[0].intermediate_values == {3: 0.5}


def _job(tmp_path: Path, rows: list[dict]) -> Path:
    folder = tmp_path / "0"
    folder.mkdir(parents=True)
    header = list(rows[0]) if rows else ["step", "val_acc"]
    lines = [",".join(header)] + [",".join(str(row.get(k, "")) for k in header) for row in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_a_trials_value_is_its_final_or_its_best_evaluation(tmp_path):
    rows = [
        {"step": 1, "val_acc": 0.4, "val_loss": 2.0},
        {"step": 2, "val_acc": 0.7, "val_loss": 1.0},
        {"step": 3, "val_acc": 0.6, "val_loss": 1.5},
    ]
    folder = _job(tmp_path, rows)
    summary = {"val_acc": 0.6, "val_loss": 1.5, "seed": 3, "completed": True, "note": "x"}
    assert Objective().value(folder, summary, "maximize") == 0.6
    assert Objective("val_acc", "best").value(folder, summary, "maximize") == 0.7
    assert Objective("val_acc", "best").value(folder, summary, "minimize") == 0.4
    assert Objective("val_loss", "best").value(folder, summary, "minimize") == 1.0
    assert isinstance(Objective("seed").value(folder, summary, "maximize"), float)


def test_a_metric_the_job_does_not_hold_is_one_line_naming_the_numbers_it_does(tmp_path):
    folder = _job(tmp_path, [{"step": 1, "val_acc": 0.4}])
    summary = {"val_acc": 0.6, "seed": 3, "completed": True, "lost": float("nan"), "note": "x"}
    with pytest.raises(ConfigError) as final:
        Objective("val_f1").value(folder, summary, "maximize")
    assert final.value.key == "hydra.sweeper.objective.metric"
    assert "a number the jobs' summary.json holds: seed, val_acc" in str(final.value)
    for unusable in ("completed", "lost", "note"):
        with pytest.raises(ConfigError):
            Objective(unusable).value(folder, summary, "maximize")
    with pytest.raises(ConfigError, match=r"metrics\.csv holds: step, val_acc"):
        Objective("val_f1", "best").value(folder, summary, "maximize")
    with pytest.raises(ConfigError, match=r"metrics\.csv holds: $"):
        Objective("val_acc", "best").value(_job(tmp_path / "empty", []), summary, "maximize")
    with pytest.raises(ConfigError, match="final or best") as take:
        Objective("val_acc", "last")
    assert take.value.key == "hydra.sweeper.objective.take"


def test_study_json_lists_every_trial_and_the_best_parameters_are_written(tmp_path):
    study = open_study(f"sqlite:///{tmp_path}/optuna.db", "lr", direction="minimize")
    objective = Objective("val_loss", "best")
    assert write_summary(study, tmp_path, objective) == (
        "study lr: 0 trials (0 complete, 0 pruned, 0 fail, 0 running); none complete"
    )
    assert not (tmp_path / "optimization_results.yaml").exists()
    for value in (2.0, 0.5, None):
        trial = study.ask({"lr": optuna.distributions.UniformDistribution(0.0, 1.0)})
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
    line = write_summary(study, tmp_path, objective)
    trials = study.get_trials(deepcopy=False)
    best = min((t for t in trials if t.value is not None), key=lambda t: t.value)
    assert line == (
        f"study lr: 3 trials (2 complete, 1 pruned, 0 fail, 0 running); best: trial "
        f"{best.number}, val_loss 0.5000 {best.params}"
    )
    written = json.loads((tmp_path / "study.json").read_text())
    assert written["study"] == "lr" and written["direction"] == "minimize"
    assert written["objective"] == {"metric": "val_loss", "take": "best"}
    assert written["counts"] == {"complete": 2, "pruned": 1}
    assert written["best"] == {
        "trial": best.number,
        "state": "complete",
        "value": 0.5,
        "params": best.params,
        "folder": str(tmp_path / "1"),
    }
    assert [row["state"] for row in written["trials"]] == ["complete", "complete", "pruned"]
    assert written["trials"][2]["value"] is None
    results = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert results == {"name": "optuna", "best_params": best.params, "best_value": 0.5}


class Loop:
    """What the callback reads of the loop: the ranks, and a stop it may ask for."""

    def __init__(self, is_main: bool = True) -> None:
        self.dist = Context(rank=0 if is_main else 1, world=1)  # one process: no broadcast
        self.stopped: list[str] = []

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)


def test_outside_a_multirun_the_callback_does_nothing():
    report = ReportToStudy()
    assert report.trial is None
    report.after_evaluation(Loop(), {"step": 3, "val_acc": 0.1}, None)
    summary: dict = {}
    report.at_end(Loop(), summary)
    assert summary == {} and report.state_dict() == {"pruned_at": None}


def _reporting(tmp_path: Path, threshold: float) -> tuple[ReportToStudy, optuna.Study]:
    pruner = optuna.pruners.ThresholdPruner(lower=threshold)
    study = open_study(f"sqlite:///{tmp_path}/o.db", "s", direction="maximize", pruner=pruner)
    report = ReportToStudy()
    report.trial, report.metric = study.ask(), "val_acc"
    return report, study


def test_each_evaluation_is_reported_at_its_step_and_a_pruned_trial_stops_the_run(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="repro.extras.search.trial")
    report, study = _reporting(tmp_path, threshold=0.5)
    loop = Loop()
    report.after_evaluation(loop, {"step": 4, "val_acc": 0.8}, None)
    report.after_evaluation(loop, {"step": 6, "val_loss": 0.1}, None)  # not the metric
    assert loop.stopped == [] and report.pruned_at is None
    report.after_evaluation(loop, {"step": 8, "val_acc": 0.2}, None)
    assert loop.stopped == ["pruned by optuna at step 8"] and report.pruned_at == 8
    said = [r.getMessage() for r in caplog.records if r.name == "repro.extras.search.trial"]
    assert said == ["trial 0 pruned at step 8 (val_acc 0.2000)"]
    [trial] = study.get_trials(deepcopy=False)
    assert trial.intermediate_values == {4: 0.8, 8: 0.2}
    summary: dict = {}
    report.at_end(loop, summary)
    assert summary == {"pruned": True}
    assert report.state_dict() == {"pruned_at": 8}
    resumed = ReportToStudy()
    resumed.load_state_dict(report.state_dict())
    assert resumed.pruned_at == 8
    resumed.load_state_dict({})
    assert resumed.pruned_at is None


def test_only_the_main_rank_reports_and_a_complete_trial_ends_unpruned(tmp_path):
    report, study = _reporting(tmp_path, threshold=0.5)
    report.after_evaluation(Loop(is_main=False), {"step": 2, "val_acc": 0.1}, None)
    assert study.get_trials(deepcopy=False)[0].intermediate_values == {}
    assert report.pruned_at is None
    summary: dict = {"step": 2}
    report.at_end(Loop(), summary)
    assert summary == {"step": 2, "pruned": False}


@pytest.fixture
def in_a_multirun(tmp_path, monkeypatch):
    """This process as job 1 of a study sweep: Hydra's config says so, as in a launched job."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from repro.extras.search import trial

    url = f"sqlite:///{tmp_path}/study.db"
    study = open_study(url, "search", direction="maximize")
    study.ask(), study.ask()  # trials 0 and 1, as the sweeper asks before launching
    open_study(url, "another search", direction="maximize")  # the name picks ours
    pruner = {"_target_": "optuna.pruners.ThresholdPruner", "lower": 0.5}
    sweeper = {"storage": url, "study_name": "search", "objective": {"metric": "val_acc"}}
    hydra = {"mode": RunMode.MULTIRUN, "job": {"num": 1}, "sweeper": {**sweeper, "pruner": pruner}}
    job = OmegaConf.create(hydra)
    launched = SimpleNamespace(initialized=lambda: True, get=lambda: job)
    monkeypatch.setattr(trial, "HydraConfig", launched)
    return study


def test_in_a_multirun_job_n_reports_to_trial_n_with_the_sweepers_pruner(in_a_multirun):
    report = ReportToStudy()
    assert report.trial is not None and report.trial.number == 1 and report.metric == "val_acc"
    loop = Loop()
    report.after_evaluation(loop, {"step": 3, "val_acc": 0.25}, None)
    assert loop.stopped == ["pruned by optuna at step 3"]  # the threshold pruner's doing
    trials = in_a_multirun.get_trials(deepcopy=False)
    assert [t.intermediate_values for t in trials] == [{}, {3: 0.25}]
