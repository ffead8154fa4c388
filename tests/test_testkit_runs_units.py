"""The kit's runs, in-process with the training stood in for (repro.testkit.runs): how an
error is named, where each run goes and when it is reused, the ranks' variables, what counts as
a run's result. test_testkit_forks.py forks for real."""

from __future__ import annotations

import hashlib
import os
import signal
import time

import pytest
from omegaconf import OmegaConf

from repro.testkit import runs
from repro.testkit.runs import RunFailedError, Runs


def raised_from(code: str, filename: str) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), {})
    except Exception as error:
        return error
    raise AssertionError("no error")


def test_an_error_is_named_by_its_type_first_line_and_the_projects_own_frame(tmp_path):
    project = tmp_path / "project"
    error = raised_from("raise ValueError('bad shape\\nmore')", str(project / "src" / "model.py"))
    assert runs.describe(error, project) == "ValueError: bad shape (at src/model.py:1)"
    elsewhere = raised_from("raise KeyError('k')", "/usr/lib/python3/thing.py")
    assert runs.describe(elsewhere, project) == "KeyError: 'k' (at thing.py:1)"
    assert runs.describe(RuntimeError(""), project) == "RuntimeError: "


def test_a_run_that_raises_is_one_run_failed_error_with_its_trace(tmp_path, monkeypatch):
    import repro.train

    def failing(config, run_dir):
        raise ValueError("the objective's own bug")

    monkeypatch.setattr(repro.train, "train", failing)
    with pytest.raises(RunFailedError) as failed:
        runs.in_process({}, tmp_path / "run", tmp_path)
    assert failed.value.line.startswith("ValueError: the objective's own bug (at ")
    assert "Traceback" in failed.value.trace and (tmp_path / "run").is_dir()
    monkeypatch.setattr(repro.train, "train", lambda config, run_dir: {"step": 3})
    assert runs.in_process({}, tmp_path / "run", tmp_path) == {"step": 3}


def test_each_config_and_way_has_its_own_folder_made_once(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(runs, "in_process", lambda config, folder, project: made.append(folder))
    kit = Runs(tmp_path / "project", tmp_path / "scratch")
    first, second = OmegaConf.create({"seed": 1}), OmegaConf.create({"seed": 2})
    folder = kit.straight(first)
    assert folder.parent == tmp_path / "scratch" and folder.name.startswith("straight-")
    assert kit.straight(OmegaConf.create({"seed": 1})) == folder and kit.straight(second) != folder
    assert len(made) == 3, "not finished yet: run again"
    (folder / "summary.json").parent.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    assert kit.straight(first) == folder and len(made) == 3, "finished: reused"
    killed_folder, _ = kit._folder(first, "killed")
    assert killed_folder != folder and killed_folder.name.startswith("killed-")


def test_a_kit_without_a_scratch_folder_makes_one_on_its_first_run(tmp_path):
    kit = Runs(tmp_path)
    scratch = kit.scratch
    assert scratch.is_dir() and scratch.name.startswith("repro-testkit-")
    assert kit.scratch == scratch
    scratch.rmdir()


def test_a_killed_and_rerun_run_is_killed_then_resumed_in_one_folder(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        runs, "killed", lambda config, folder, project: calls.append(("kill", folder))
    )
    monkeypatch.setattr(
        runs, "in_process", lambda config, folder, project: calls.append(("run", folder))
    )
    monkeypatch.setattr(
        runs, "on_processes", lambda config, folder, project: calls.append(("ranks", folder))
    )
    kit = Runs(tmp_path, tmp_path / "scratch")
    folder = kit.killed_and_rerun(OmegaConf.create({"a": 1}))
    assert calls == [("kill", folder), ("run", folder)]
    ranks = kit.on_two_processes(OmegaConf.create({"a": 1}))
    assert calls[-1] == ("ranks", ranks) and ranks.name.startswith("ranks-")


@pytest.mark.parametrize("status", [0, 1, -signal.SIGTERM])
def test_a_run_meant_to_be_killed_that_ends_otherwise_fails(tmp_path, monkeypatch, status):
    started = []
    monkeypatch.setattr(
        runs, "forked", lambda work, env, report, project: started.append((env, report)) or 42
    )
    monkeypatch.setattr(runs, "waited", lambda forks: [status])
    with pytest.raises(RunFailedError) as failed:
        runs.killed({}, tmp_path / "run", tmp_path, step=5)
    assert failed.value.line == f"the run meant to be killed after step 5 exited {status}"
    assert started == [({"REPRO_FAULT": "step:5"}, tmp_path / "run.failed")]
    monkeypatch.setattr(runs, "waited", lambda forks: [-signal.SIGKILL])
    runs.killed({}, tmp_path / "run", tmp_path)
    assert started[-1][0] == {"REPRO_FAULT": f"step:{runs.KILL_AFTER_STEP}"}


def test_the_ranks_get_torchruns_variables_and_one_port(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(
        runs,
        "forked",
        lambda work, env, report, project: started.append((env, report)) or len(started),
    )
    monkeypatch.setattr(runs, "waited", lambda forks: [0] * len(forks))
    runs.on_processes({}, tmp_path / "run", tmp_path, processes=3)
    assert [env["RANK"] for env, _ in started] == ["0", "1", "2"]
    assert [env["LOCAL_RANK"] for env, _ in started] == ["0", "1", "2"]
    assert {env["WORLD_SIZE"] for env, _ in started} == {"3"}
    assert {env["MASTER_ADDR"] for env, _ in started} == {"127.0.0.1"}
    assert len({env["MASTER_PORT"] for env, _ in started}) == 1
    assert {env["OMP_NUM_THREADS"] for env, _ in started} == {"1"}
    assert [report.name for _, report in started] == [f"run.rank{r}.failed" for r in range(3)]
    monkeypatch.setattr(runs, "waited", lambda forks: [0, 1])
    with pytest.raises(RunFailedError, match=r"^the run on 2 processes exited \[0, 1\]"):
        runs.on_processes({}, tmp_path / "run", tmp_path)


def test_a_runs_results_are_its_files_beside_the_engines_records(tmp_path):
    run = tmp_path / "run"
    for name in [
        "summary.json",
        "metrics.csv",
        "checkpoints/last.pt",
        ".hydra/config.yaml",
        "train.log",
        "attempts.jsonl",
        "predictions/val.csv",
        "embedding.npy",
    ]:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(name)
    found = runs.result_files(run)
    assert found == {
        "embedding.npy": hashlib.sha256(b"embedding.npy").hexdigest(),
        "predictions/val.csv": hashlib.sha256(b"predictions/val.csv").hexdigest(),
    }


def test_a_runs_steps_are_its_fingerprint_log(tmp_path):
    (tmp_path / "fingerprints.csv").write_text("1,0.5,\n2,0.25,ab\n")
    assert [(row.step, row.loss, row.weights_sha256) for row in runs.steps(tmp_path)] == [
        (1, "0.5", ""),
        (2, "0.25", "ab"),
    ]


# ---- forked and waited: real forks of this process, doing next to nothing ------------------


def fork(tmp_path, name, work, env=None):
    report = tmp_path / f"{name}.failed"
    return runs.forked(work, env or {}, report, tmp_path), report


def test_a_fork_gets_its_variables_and_one_thread_and_its_status_is_waited_for(tmp_path):
    import torch

    def work():
        if os.environ.get("KIT_VALUE") != "7" or torch.get_num_threads() != 1:
            raise ValueError("not the fork's settings")

    done = fork(tmp_path, "ok", work, {"KIT_VALUE": "7"})
    killed = fork(tmp_path, "killed", lambda: os.kill(os.getpid(), signal.SIGKILL))
    assert runs.waited([done, killed]) == [0, -signal.SIGKILL]
    assert "KIT_VALUE" not in os.environ and not done[1].exists()


def test_a_fork_that_raises_reports_its_line_and_trace_and_its_peers_are_stopped(tmp_path):
    def fails():
        raise ValueError("the project's bug\nsecond line")

    sleeper = fork(tmp_path, "sleeper", lambda: time.sleep(60))
    failing = fork(tmp_path, "failing", fails)
    started = time.monotonic()
    with pytest.raises(RunFailedError) as failed:
        runs.waited([sleeper, failing])
    assert time.monotonic() - started < 30
    assert failed.value.line.startswith("ValueError: the project's bug (at test_testkit_runs")
    assert "Traceback (most recent call last)" in failed.value.trace
    with pytest.raises(ProcessLookupError):
        os.kill(sleeper[0], 0)  # stopped and reaped

    def run_fails():
        raise RunFailedError("KeyError: 'x' (at data.py:3)", "the trace")

    (pid, report) = fork(tmp_path, "kit", run_fails)
    with pytest.raises(RunFailedError) as failed:
        runs.waited([(pid, report)])
    assert (failed.value.line, failed.value.trace) == ("KeyError: 'x' (at data.py:3)", "the trace")


def test_a_fork_past_its_limit_is_stopped(tmp_path):
    sleeper = fork(tmp_path, "sleeper", lambda: time.sleep(60))
    with pytest.raises(RunFailedError) as failed:
        runs.waited([sleeper], limit=0.4)
    assert failed.value.line == "the run did not finish within 0 s (stopped)"
    with pytest.raises(ProcessLookupError):
        os.kill(sleeper[0], 0)
