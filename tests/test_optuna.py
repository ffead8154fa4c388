"""Optuna searches that survive (repro.extras.search): the study in the sweep folder, continued by the
same command after a kill; hopeless trials pruned; the objective read from config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hydra import compose, initialize_config_dir
from optuna.trial import TrialState

from repro.core.errors import ConfigError
from repro.core.runs import run_lock
from repro.extras.search.study import Objective, open_study

from conftest import CONF, IMAGEFOLDER, ROOT, TINY, run_cli

SWEEP = [*TINY, "trainer.num_threads=1"]


def study_of(sweep_dir, name="lr_wd"):
    return open_study(f"sqlite:///{sweep_dir}/optuna.db", name)


def attempts(folder):
    return [json.loads(line) for line in (folder / "attempts.jsonl").read_text().splitlines()]


def test_a_search_keeps_its_study_in_a_folder_named_after_it():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", ["hparams_search=lr_wd"], return_hydra_config=True)
    assert cfg.hydra.sweep.dir == "outputs/sweeps/lr_wd"  # the same command finds it again
    assert cfg.hydra.sweeper.storage == "sqlite:///outputs/sweeps/lr_wd/optuna.db"


@pytest.mark.e2e
@pytest.mark.slow
def test_a_search_killed_after_three_trials_continues_to_six_in_one_study(tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = [sys.executable, "-m", "repro.train", "-m", "hparams_search=lr_wd",
               "hydra.sweeper.n_trials=6", *SWEEP, f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    sweep = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)  # fmt: skip
    try:  # SIGKILL the sweep once trial 3's run starts training: trials 0 to 2 are told by then
        deadline = time.monotonic() + 240
        while not (sweep_dir / "3" / "attempts.jsonl").exists() and sweep.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        sweep.send_signal(signal.SIGKILL)
    finally:
        stderr = sweep.communicate()[1].decode()
    assert sweep.returncode == -9, stderr

    killed = study_of(sweep_dir).trials
    assert [t.state for t in killed] == [TrialState.COMPLETE] * 3 + [TrialState.RUNNING]
    asked = killed[3].params

    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(sweep_dir).trials
    assert [t.number for t in trials] == list(range(6))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    # Trial 3 went on with the parameters it was given, in its own folder; 0 to 2 never reran.
    assert trials[3].params == asked
    assert [a["result"].split(":")[0] for a in attempts(sweep_dir / "3")] == ["died", "completed"]
    assert all(len(attempts(sweep_dir / str(n))) == 1 for n in (0, 1, 2, 4, 5))
    # Each trial's sampler is seeded from (seed, trial number): no draw is asked twice.
    assert len({t.params["optimizer.lr"] for t in trials}) == 6
    for trial in trials:  # the value is the job's own final val_acc
        summary = json.loads((sweep_dir / str(trial.number) / "summary.json").read_text())
        assert trial.value == summary["val_acc"] and not summary["pruned"]
    study = json.loads((sweep_dir / "study.json").read_text())
    assert study["counts"] == {"complete": 6}
    assert study["best"]["value"] == max(t.value for t in trials)
    jobs = json.loads((sweep_dir / "sweep_summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["ok"] * 6


@pytest.mark.e2e
@pytest.mark.slow
def test_the_pruner_stops_a_hopeless_trial_and_the_report_says_so(tmp_path, image_tree):
    # Two sane trials, then one with lr=0 (accuracy stays at chance) in the same study: the
    # median pruner stops it at its first evaluation. Objective: the best val_loss, minimised.
    sweep_dir = tmp_path / "sweep"
    search = [
        "-m", "hydra/sweeper=optuna_study", *IMAGEFOLDER, f"data.root={image_tree}",
        "trainer.num_threads=1", f"hydra.sweep.dir={sweep_dir}", "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.direction=minimize", "hydra.sweeper.objective.metric=val_loss",
        "hydra.sweeper.objective.take=best", "+hydra.sweeper.pruner._target_="
        "optuna.pruners.MedianPruner", "+hydra.sweeper.pruner.n_startup_trials=2",
    ]  # fmt: skip
    sane = run_cli(
        "repro.train", *search, "hydra.sweeper.n_trials=2", "optimizer.lr=choice(0.05,0.1)"
    )
    assert sane.returncode == 0, sane.stderr[-3000:]
    hopeless = run_cli("repro.train", *search, "hydra.sweeper.n_trials=3", "optimizer.lr=0")
    assert hopeless.returncode == 0, hopeless.stderr[-3000:]

    trials = study_of(sweep_dir, "search").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED]
    pruned = json.loads((sweep_dir / "2" / "summary.json").read_text())
    assert pruned["pruned"] and pruned["step"] == 3  # of 12
    assert pruned["completed"] and pruned["stopped_early"]  # a clean ending, checkpointed
    for trial in trials[:2]:
        rows = (sweep_dir / str(trial.number) / "metrics.csv").read_text().splitlines()
        header = rows[0].split(",")
        losses = [float(row.split(",")[header.index("val_loss")]) for row in rows[1:]]
        assert trial.value == min(losses) and len(losses) == 4  # each epoch reported
        assert sorted(trial.intermediate_values) == [3, 6, 9, 12]

    report = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert [j["status"] for j in report["jobs"]] == ["ok", "ok", "pruned"]
    assert sum(group["val_acc"]["count"] for group in report["groups"].values()) == 2
    assert "pruned at step 3" in (sweep_dir / "sweep_summary.md").read_text()
    assert json.loads((sweep_dir / "study.json").read_text())["counts"] == {
        "complete": 2,
        "pruned": 1,
    }

    # A metric the jobs do not record is the user's to fix: named, with those they do.
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\.objective\.metric.*val_acc"):
        Objective("val_f1", "best").value(sweep_dir / "0", pruned, "minimize")


@pytest.mark.e2e
@pytest.mark.slow  # a sweep's start-up: test-all; test_run_lock has the lock's own promises
def test_a_second_sweep_on_a_study_in_use_is_refused_in_one_line(tmp_path):
    sweep_dir = tmp_path / "sweep"
    assert run_lock.try_claim(sweep_dir) is None  # this process is the live sweep
    try:
        command = ["-m", "hparams_search=lr_wd", *SWEEP, f"hydra.sweep.dir={sweep_dir}"]
        done = run_cli("repro.train", *command)
    finally:
        run_lock.release(sweep_dir)
    assert done.returncode == 2
    assert f"another sweep works on this study (pid {os.getpid()}" in done.stderr
    assert "Traceback" not in done.stderr and not (sweep_dir / "0").exists()


def test_hydras_sweeper_hands_its_settings_setup_and_sweep_to_the_study_sweeper(monkeypatch):
    """Hydra builds sweepers from hydra_plugins only; ours there forwards every call."""
    from hydra_plugins.repro.study_sweeper import StudySweeper
    from repro.extras.search import sweeper

    calls = []

    class Recording:
        def __init__(self, **settings):
            calls.append(("init", settings))

        def setup(self, **given):
            calls.append(("setup", given))

        def sweep(self, arguments):
            calls.append(("sweep", arguments))
            return "swept"

    monkeypatch.setattr(sweeper, "StudySweeperImpl", Recording)
    plugin = StudySweeper(study="lr_wd", n_trials=3)
    plugin.setup(hydra_context="context", task_function=len, config="config")
    assert plugin.sweep(["seed=1"]) == "swept"
    assert calls == [
        ("init", {"study": "lr_wd", "n_trials": 3}),
        ("setup", {"hydra_context": "context", "task_function": len, "config": "config"}),
        ("sweep", ["seed=1"]),
    ]
