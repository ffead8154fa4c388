"""trainer.profile_steps: torch.profiler over a window of steps, and nothing else changed."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
import torch

from repro import config
from repro.engine.position import Position
from repro.engine.profiling import StepProfiler
from repro.errors import ConfigError

from conftest import compose_config, tiny, train_in_process

RUN = tiny("trainer.max_steps=5")


def traced(run_dir, name="trace.json") -> Counter:
    """How many times each event name occurs in a run's Chrome trace."""
    events = json.loads((run_dir / "profile" / name).read_text())["traceEvents"]
    return Counter(event.get("name") for event in events)


def optimizer_steps(events: Counter) -> int:
    return sum(count for name, count in events.items() if str(name).startswith("Optimizer.step#"))


def test_a_window_of_steps_is_traced_and_the_weights_are_unchanged(tmp_path):
    plain = train_in_process(tmp_path / "plain", *RUN)
    profiled = train_in_process(tmp_path / "profiled", *RUN, "trainer.profile_steps=[2,3]")
    assert profiled["weights_sha256"] == plain["weights_sha256"]
    events = traced(tmp_path / "profiled")
    assert optimizer_steps(events) == 2  # steps 2 and 3, not 1, 4 or 5
    assert events["step 2"] == events["step 3"] == 1 and events["step 4"] == 0
    table = (tmp_path / "profiled" / "profile" / "ops.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
    assert not (tmp_path / "plain" / "profile").exists()


def test_a_window_past_the_end_closes_with_the_run_and_a_resume_may_change_it(tmp_path, caplog):
    run = tmp_path / "run"
    train_in_process(run, *RUN, "trainer.halt_at_step=2")
    caplog.set_level(logging.INFO)
    resumed = train_in_process(run, *RUN, "trainer.profile_steps=[4,100]")
    assert (
        resumed["weights_sha256"] == train_in_process(tmp_path / "straight", *RUN)["weights_sha256"]
    )
    assert optimizer_steps(traced(run)) == 2  # steps 4 and 5, the last
    assert "profiled steps 4-5" in caplog.text


def test_a_profile_already_written_is_kept(tmp_path):
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "trace.json").write_text("an earlier attempt's\n")
    position = Position()
    with StepProfiler((1, 2), folder, torch.device("cpu"), position) as profiler:
        for _ in range(3):
            profiler.before_step()
            position.step += 1
    assert (folder / "trace.json").read_text() == "an earlier attempt's\n"
    assert not (folder / "ops.txt").exists()


@pytest.mark.parametrize("window", ["[3,2]", "[0,2]", "[4]", "[1,2,3]"])
def test_a_bad_window_is_refused(window):
    cfg = compose_config(*tiny(f"trainer.profile_steps={window}"))
    with pytest.raises(ConfigError, match=r"trainer\.profile_steps"):
        config.validate(cfg)
