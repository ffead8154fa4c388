"""The profiler's window, step by step in-process (repro.watch.profiling): where it opens and
closes, what each file is named, the host table's order, and the other watchers."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import torch

from repro.engine.position import Position
from repro.runtime.distributed import Context
from repro.watch import profiling
from repro.watch.profiling import StepProfiler, SyncDebug

CPU = torch.device("cpu")


def run_steps(profiler: StepProfiler, position: Position, steps: int) -> list[bool]:
    """`steps` steps as the loop runs them; whether the profiler was open during each."""
    open_during = []
    with profiler:
        for _ in range(steps):
            profiler.before_step()
            torch.ones(4).add_(1)
            open_during.append(profiler._profiler is not None)
            position.step += 1
    return open_during


def profile_names(run_dir) -> list[str]:
    folder = run_dir / "profile"
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


def test_the_window_opens_before_its_first_step_and_closes_before_the_step_after_its_last(
    tmp_path,
):
    position = Position()
    profiler = StepProfiler((2, 3), tmp_path, CPU, position)
    assert run_steps(profiler, position, 5) == [False, True, True, False, False]
    assert profile_names(tmp_path) == ["steps-2-3-host.txt", "steps-2-3.json", "steps-2-3.txt"]
    assert profiler.window is None


def test_a_run_ending_inside_the_window_names_the_profile_by_its_last_step(tmp_path):
    position = Position()
    run_steps(StepProfiler((2, 9), tmp_path, CPU, position), position, 4)
    assert profile_names(tmp_path) == ["steps-2-4-host.txt", "steps-2-4.json", "steps-2-4.txt"]


def test_each_rank_of_several_writes_its_own(tmp_path):
    position = Position()
    ranked = StepProfiler((1, 1), tmp_path, CPU, position, dist=Context(rank=1, world=2))
    run_steps(ranked, position, 2)
    assert profile_names(tmp_path) == [
        "steps-1-1-rank1-host.txt",
        "steps-1-1-rank1.json",
        "steps-1-1-rank1.txt",
    ]
    alone = StepProfiler((1, 1), tmp_path, CPU, Position(), dist=Context(rank=0, world=1))
    assert alone.suffix == ""


def test_a_window_resumed_into_is_dropped_and_said_once(tmp_path, caplog):
    for start, said in [(3, True), (5, False), (6, False)]:
        caplog.clear()
        position = Position(step=start)
        with caplog.at_level(logging.INFO, logger=profiling.__name__):
            opened = run_steps(StepProfiler((2, 5), tmp_path, CPU, position), position, 2)
        assert opened == [False, False] and profile_names(tmp_path) == []
        expected = ["not profiled: this attempt resumed inside steps 2-5"] if said else []
        assert caplog.messages == expected, start


def test_a_run_ending_before_the_window_says_so(tmp_path, caplog):
    position = Position()
    with caplog.at_level(logging.INFO, logger=profiling.__name__):
        run_steps(StepProfiler((4, 5), tmp_path, CPU, position), position, 3)
    assert caplog.messages == ["not profiled: the run ended before step 4"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=profiling.__name__):
        run_steps(StepProfiler(None, tmp_path, CPU, Position()), Position(), 2)
    assert caplog.messages == [] and profile_names(tmp_path) == []


def test_the_loops_position_is_the_one_watched(tmp_path):
    profiler = StepProfiler((1, 2), tmp_path, CPU)
    position = Position(step=7)
    profiler.at_start(SimpleNamespace(state=SimpleNamespace(position=position)))
    assert profiler.position is position


def test_kinetos_chatter_is_quietened_unless_the_user_set_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    position = Position()
    run_steps(StepProfiler((1, 1), tmp_path / "a", CPU, position), position, 1)
    assert os.environ["KINETO_LOG_LEVEL"] == "6"
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")
    position = Position()
    run_steps(StepProfiler((1, 1), tmp_path / "b", CPU, position), position, 1)
    assert os.environ["KINETO_LOG_LEVEL"] == "2"


def test_a_profile_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch, caplog):
    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(profiling, "write_text_atomic", full)
    position = Position()
    with caplog.at_level(logging.WARNING, logger=profiling.__name__):
        run_steps(StepProfiler((1, 1), tmp_path, CPU, position), position, 2)
    assert caplog.messages == [
        "the profile of steps steps-1-1 could not be written: [Errno 28] No space left on device"
    ]


def event(key: str, count: int = 1, total: float = 2000.0, own: float = 500.0):
    return SimpleNamespace(key=key, count=count, cpu_time_total=total, self_cpu_time_total=own)


class Averages(list):
    def table(self, sort_by, row_limit):
        return f"(torch's table by {sort_by}, {row_limit} rows)"


def test_the_host_table_lists_steps_by_number_then_the_loops_other_spans_by_name():
    averages = Averages(
        [
            event("aten::add"),
            event("step 10"),
            event("checkpoint"),
            event("step 2", count=1, total=1500.0, own=250.0),
            event("Optimizer.step#SGD.step"),
            event("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"),
            event("evaluate"),
        ]
    )
    lines = profiling.host_table(averages).splitlines()
    spans = [line[:60].rstrip() for line in lines[3:9]]
    assert spans == [
        "step 2",
        "step 10",
        "Optimizer.step#SGD.step",
        "checkpoint",
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next_",  # cut at 60
        "evaluate",
    ]
    assert lines[3] == f"{'step 2':<60} {1:>6} {1.5:>10.3f} {0.25:>10.3f}"
    assert lines[2] == f"{'span':<60} {'calls':>6} {'total':>10} {'own':>10}"
    assert lines[-2:] == [
        "The 15 ops with the most self CPU time",
        "(torch's table by self_cpu_time_total, 15 rows)",
    ]
    assert len(lines) == 3 + 6 + 3, "aten::add is in torch's table, not the spans"


def test_sync_debug_warns_from_the_second_step_on_a_gpu_only(monkeypatch):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    on_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    with SyncDebug() as watcher:
        watcher.at_start(on_gpu)
        assert modes == []
        watcher.after_step(on_gpu)
        watcher.after_step(on_gpu)
    assert modes == ["warn", 0]
    modes.clear()
    with SyncDebug() as watcher:
        watcher.at_start(SimpleNamespace(device=CPU))
        watcher.after_step(None)
    assert modes == []


def test_the_watchers_are_the_progress_bar_and_what_the_config_asks(tmp_path):
    trainer = SimpleNamespace(profile_steps=None, sync_debug=False)
    logger = SimpleNamespace(progress="off")
    assert list(profiling.watchers(trainer, logger, tmp_path, CPU, Context())) == ["progress"]
    trainer = SimpleNamespace(profile_steps=[2, 5], sync_debug=True)
    found = profiling.watchers(trainer, logger, tmp_path, CPU, Context(rank=1, world=2))
    assert list(found) == ["progress", "profiler", "sync_debug"]
    assert found["profiler"].window == (2, 5) and found["profiler"].suffix == "-rank1"
    assert found["profiler"].folder == tmp_path / "profile"
    assert found["progress"].bar.disable
