"""The kit's runs, in-process with the training stood in for (repro.extras.testkit.runs): how an
error is named, where each run goes and when it is reused, the ranks' variables, what counts as
a run's result. test_testkit_forks.py forks for real."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time

import pytest
from omegaconf import OmegaConf

from repro.extras.testkit import runs
from repro.extras.testkit.runs import RunFailedError, Runs


def raised_from(code: str, filename: str) -> BaseException:
    return raised_from_with(code, filename, {})


def raised_from_with(code: str, filename: str, names: dict) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), names)
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
    helper = {}  # the project's code calls a library's, which raises: the project's line
    exec(compile("def check():\n    raise TypeError('deep')", "/usr/lib/lib.py", "exec"), helper)
    calling = "\n\ncheck()"
    error = raised_from_with(calling, str(project / "data.py"), helper)
    assert runs.describe(error, project) == "TypeError: deep (at data.py:3)"


def test_a_run_that_raises_is_one_run_failed_error_with_its_trace(tmp_path, monkeypatch):
    from repro.core import run

    def failing(config, run_dir):
        raise ValueError("the objective's own bug")

    monkeypatch.setattr(run, "train", failing)
    with pytest.raises(RunFailedError) as failed:
        runs.in_process({}, tmp_path / "run", tmp_path)
    assert failed.value.line.startswith("ValueError: the objective's own bug (at ")
    assert "Traceback" in failed.value.trace and (tmp_path / "run").is_dir()
    given = []
    monkeypatch.setattr(
        run, "train", lambda config, run_dir: given.append((config, run_dir)) or {"s": 3}
    )
    nested = tmp_path / "scratch" / "straight-1"  # its parent made too
    assert runs.in_process({"seed": 1}, nested, tmp_path) == {"s": 3}
    assert given == [({"seed": 1}, nested)] and nested.is_dir()
    runs.in_process({"seed": 1}, nested, tmp_path)  # again in its folder: a resume
    assert given[-1] == ({"seed": 1}, nested)


def test_each_config_and_way_has_its_own_folder_made_once(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(runs, "in_process", lambda *given: made.append(given[1]) or given)
    kit = Runs(tmp_path / "project", tmp_path / "scratch")
    first, second = OmegaConf.create({"seed": 1}), OmegaConf.create({"seed": 2})
    folder = kit.straight(first)
    assert folder.parent == tmp_path / "scratch"
    assert re.fullmatch("straight-[0-9a-f]{16}", folder.name)
    text = OmegaConf.to_yaml(first, resolve=False)
    key = hashlib.sha256(("straight\n" + text).encode()).hexdigest()[:16]
    assert folder.name == f"straight-{key}"
    linked = OmegaConf.create({"seed": 1, "copy": "${seed}"})  # named as written, unresolved
    assert kit._folder(linked, "straight") != kit._folder(
        OmegaConf.create({"seed": 1, "copy": 1}), "straight"
    )
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
    for name in ("killed", "in_process", "on_processes"):
        monkeypatch.setattr(runs, name, lambda *given, name=name: calls.append((name, *given)))
    kit, config = Runs(tmp_path, tmp_path / "scratch"), OmegaConf.create({"a": 1})
    folder = kit.killed_and_rerun(config)
    assert calls == [("killed", config, folder, tmp_path), ("in_process", config, folder, tmp_path)]
    assert re.fullmatch("killed-[0-9a-f]{16}", folder.name)
    ranks = kit.on_two_processes(config)
    assert calls[-1] == ("on_processes", config, ranks, tmp_path)
    assert re.fullmatch("ranks-[0-9a-f]{16}", ranks.name)
    straight = kit.straight(config)
    assert calls[-1] == ("in_process", config, straight, tmp_path)


@pytest.mark.parametrize("status", [0, 1, -signal.SIGTERM])
def test_a_run_meant_to_be_killed_that_ends_otherwise_fails(tmp_path, monkeypatch, status):
    started, ran, waited_for = [], [], []

    def forked(work, env, report, project):
        started.append((env, report, project))
        work()  # what the fork would run
        return 42

    monkeypatch.setattr(runs, "forked", forked)
    monkeypatch.setattr(runs, "in_process", lambda *given: ran.append(given))
    monkeypatch.setattr(runs, "waited", lambda forks: waited_for.append(forks) or [status])
    with pytest.raises(RunFailedError) as failed:
        runs.killed({"a": 1}, tmp_path / "run", tmp_path, step=5)
    assert failed.value.line == f"the run meant to be killed after step 5 exited {status}"
    assert failed.value.trace == ""
    assert started == [({"REPRO_FAULT": "step:5"}, tmp_path / "run.failed", tmp_path)]
    assert ran == [({"a": 1}, tmp_path / "run", tmp_path)]
    assert waited_for == [[(42, tmp_path / "run.failed")]]
    monkeypatch.setattr(runs, "waited", lambda forks: [-signal.SIGKILL])
    runs.killed({}, tmp_path / "run", tmp_path)
    assert started[-1][0] == {"REPRO_FAULT": f"step:{runs.KILL_AFTER_STEP}"}


def test_the_ranks_get_torchruns_variables_and_one_port(tmp_path, monkeypatch):
    started, ran, waited_for = [], [], []

    def forked(work, env, report, project):
        started.append((env, report))
        work()  # what the fork would run
        return len(started)

    monkeypatch.setattr(runs, "forked", forked)
    monkeypatch.setattr(runs, "in_process", lambda *given: ran.append(given))
    monkeypatch.setattr(runs, "waited", lambda forks: waited_for.append(forks) or [0] * len(forks))
    runs.on_processes({"a": 1}, tmp_path / "run", tmp_path, processes=3)
    assert ran == [({"a": 1}, tmp_path / "run", tmp_path)] * 3
    reports = [tmp_path / f"run.rank{rank}.failed" for rank in range(3)]
    assert waited_for == [list(zip([1, 2, 3], reports, strict=True))]
    (port,) = {env["MASTER_PORT"] for env, _ in started}
    assert port.isdigit() and int(port) >= 1024  # one the system handed out, free
    assert [env["RANK"] for env, _ in started] == ["0", "1", "2"]
    assert [env["LOCAL_RANK"] for env, _ in started] == ["0", "1", "2"]
    assert {env["WORLD_SIZE"] for env, _ in started} == {"3"}
    assert {env["MASTER_ADDR"] for env, _ in started} == {"127.0.0.1"}
    assert len({env["MASTER_PORT"] for env, _ in started}) == 1
    assert {env["OMP_NUM_THREADS"] for env, _ in started} == {"1"}
    assert [report.name for _, report in started] == [f"run.rank{r}.failed" for r in range(3)]
    monkeypatch.setattr(runs, "waited", lambda forks: [0, 1])
    with pytest.raises(RunFailedError, match=r"^the run on 2 processes exited \[0, 1\]") as failed:
        runs.on_processes({}, tmp_path / "run", tmp_path)
    assert failed.value.trace == ""


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
    assert failed.value.trace == ""
    with pytest.raises(ProcessLookupError):
        os.kill(sleeper[0], 0)
