"""trainer.profile_steps: torch.profiler over a window of steps, and nothing else changed."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
import torch

from repro.core import config
from repro.core.errors import ConfigError
from repro.core.runs.position import Position
from repro.core.watch.profiling import StepProfiler

from conftest import compose_config, tiny, train_in_process

RUN = tiny("trainer.max_steps=5")


def traced(run_dir, steps: str) -> Counter:
    """How many times each event name occurs in a run's Chrome trace of `steps` ("2-3")."""
    events = json.loads((run_dir / "profile" / f"steps-{steps}.json").read_text())["traceEvents"]
    return Counter(event.get("name") for event in events)


def optimizer_steps(events: Counter) -> int:
    return sum(count for name, count in events.items() if str(name).startswith("Optimizer.step#"))


def test_a_window_of_steps_is_traced_and_the_weights_are_unchanged(tmp_path):
    plain = train_in_process(tmp_path / "plain", *RUN)
    profiled = train_in_process(
        tmp_path / "profiled", *RUN, "trainer.profile_steps=[2,3]", "trainer.eval_every_steps=2"
    )
    assert profiled["weights_sha256"] == plain["weights_sha256"]
    events = traced(tmp_path / "profiled", "2-3")
    assert optimizer_steps(events) == 2  # steps 2 and 3, not 1, 4 or 5
    assert events["step 2"] == events["step 3"] == 1 and events["step 4"] == 0
    assert events["evaluate"] == 1  # the one after step 2, marked
    table = (tmp_path / "profiled" / "profile" / "steps-2-3.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
    assert not (tmp_path / "plain" / "profile").exists()


def test_a_window_past_the_end_closes_with_the_run_and_a_resume_may_set_another(tmp_path, caplog):
    run = tmp_path / "run"
    train_in_process(run, *RUN, "trainer.halt_at_step=3", "trainer.profile_steps=[1,1]")
    caplog.set_level(logging.INFO)
    resumed = train_in_process(run, *RUN, "trainer.profile_steps=[4,100]")
    straight = train_in_process(tmp_path / "straight", *RUN)
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert optimizer_steps(traced(run, "1-1")) == 1  # the first attempt's, kept
    assert optimizer_steps(traced(run, "4-5")) == 2  # steps 4 and 5, the last
    assert "profiled steps 4-5" in caplog.text


def test_a_profile_already_written_is_kept(tmp_path):
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "steps-1-2.json").write_text("an earlier attempt's\n")
    position = Position()
    with StepProfiler((1, 2), tmp_path, torch.device("cpu"), position) as profiler:
        for _ in range(3):
            profiler.before_step()
            position.step += 1
    assert (folder / "steps-1-2.json").read_text() == "an earlier attempt's\n"
    assert not (folder / "steps-1-2.txt").exists()


def test_an_error_inside_the_window_writes_nothing_and_stops_the_profiler(tmp_path):
    position = Position()
    watched = StepProfiler((1, 3), tmp_path, torch.device("cpu"), position)
    with pytest.raises(RuntimeError, match="the step's own"), watched as profiler:
        profiler.before_step()
        raise RuntimeError("the step's own error")
    assert not (tmp_path / "profile").exists()
    assert not torch.autograd.profiler._is_profiler_enabled  # a later profile can start


def test_a_profile_that_cannot_be_written_does_not_fail_the_run(tmp_path, caplog):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "profile").write_text("a file where the folder would go\n")
    caplog.set_level(logging.WARNING)
    summary = train_in_process(tmp_path / "run", *RUN, "trainer.profile_steps=[2,3]")
    assert summary["weights_sha256"] and "could not be written" in caplog.text


@pytest.mark.parametrize("window", ["[3,2]", "[0,2]", "[4]", "[1,2,3]"])
def test_a_bad_window_is_refused(window):
    cfg = compose_config(*tiny(f"trainer.profile_steps={window}"))
    with pytest.raises(ConfigError, match=r"trainer\.profile_steps"):
        config.validate(cfg)


def test_a_window_the_attempt_cannot_cover_is_not_profiled_and_says_so(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    position = Position(step=2)  # an attempt resumed after step 2
    with StepProfiler((2, 4), tmp_path, torch.device("cpu"), position) as profiler:
        profiler.before_step()
        position.step += 1
    assert "resumed inside steps 2-4" in caplog.text
    with StepProfiler((9, 10), tmp_path, torch.device("cpu"), Position()) as profiler:
        profiler.before_step()
    assert "the run ended before step 9" in caplog.text
    assert not (tmp_path / "profile").exists()
