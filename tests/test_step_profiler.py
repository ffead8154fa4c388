"""The profiler's window, step by step in-process (repro.core.watch.profiling): where it opens and
closes, what each file is named, the host table's order, and the other watchers."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from repro.core.runs.position import Position
from repro.core.runtime.distributed import Context
from repro.core.watch import profiling
from repro.core.watch.profiling import StepProfiler, SyncDebug

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
    """One row of torch's key_averages(): times in microseconds."""
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
            event("step 2", count=1, total=1500.0, own=123456.0),
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
    assert lines[3] == f"{'step 2':<60} {1:>6} {1.5:>10.3f} {123.456:>10.3f}"
    assert lines[7] == f"{spans[4]:<60} {1:>6} {2.0:>10.3f} {0.5:>10.3f}"
    assert lines[:2] == [
        "The loop's spans (ms of host time; own: outside any op torch records, the loop's",
        "Python: the progress line, callbacks, the batch's hand-off, waits)",
    ]
    assert lines[2] == f"{'span':<60} {'calls':>6} {'total':>10} {'own':>10}"
    assert lines[-3:] == [
        "",
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
    with SyncDebug():  # a loop that never started arms nothing
        pass
    with SyncDebug() as watcher:
        watcher.at_start(SimpleNamespace(device=CPU))
        watcher.after_step(None)
    assert modes == []


def test_the_watchers_are_the_progress_bar_and_what_the_config_asks(tmp_path):
    trainer = SimpleNamespace(profile_steps=None, sync_debug=False)
    logger = SimpleNamespace(progress="off")
    assert list(profiling.watchers(trainer, logger, tmp_path, CPU, Context())) == ["progress"]
    trainer = SimpleNamespace(profile_steps=[2, 5], sync_debug=True)
    logger = SimpleNamespace(progress="on")
    found = profiling.watchers(trainer, logger, tmp_path, CPU, Context(rank=1, world=2))
    assert list(found) == ["progress", "profiler", "sync_debug"]
    assert found["profiler"].window == (2, 5) and found["profiler"].suffix == "-rank1"
    assert found["profiler"].folder == tmp_path / "profile"
    assert not found["progress"].bar.disable and found["profiler"].device == CPU
    assert isinstance(found["sync_debug"], SyncDebug)


def test_each_step_in_the_window_is_a_span_of_the_host_table(tmp_path):
    position = Position()
    run_steps(StepProfiler((2, 3), tmp_path, CPU, position), position, 4)
    lines = (tmp_path / "profile" / "steps-2-3-host.txt").read_text().splitlines()
    assert [line.split()[:2] for line in lines[3:5]] == [["step", "2"], ["step", "3"]]
    assert not any(line.startswith(("step 1 ", "step 4 ")) for line in lines)


def test_a_window_written_by_an_earlier_attempt_is_kept(tmp_path, caplog):
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "steps-1-2.txt").write_text("the earlier attempt's\n")  # its table alone
    position = Position()
    with caplog.at_level(logging.INFO, logger=profiling.__name__):
        run_steps(StepProfiler((1, 2), tmp_path, CPU, position), position, 3)
    assert profile_names(tmp_path) == ["steps-1-2.txt"]
    assert (folder / "steps-1-2.txt").read_text() == "the earlier attempt's\n"
    said = "steps steps-1-2 were profiled by an earlier attempt of this run: kept"
    assert caplog.messages == [said]


def test_the_profile_goes_into_a_folder_made_for_it_and_its_files_are_named(tmp_path, caplog):
    run_dir = tmp_path / "not" / "made"  # the profile/ folder's parents made too
    position = Position()
    with caplog.at_level(logging.INFO, logger=profiling.__name__):
        run_steps(StepProfiler((1, 1), run_dir, CPU, position), position, 2)
    folder = run_dir / "profile"
    trace, table, host = (folder / f"steps-1-1{end}" for end in (".json", ".txt", "-host.txt"))
    assert caplog.messages == [f"profiled steps 1-1: {trace}, {table}, {host}"]
    position = Position(step=2)  # a later window beside it: the folder is there already
    run_steps(StepProfiler((3, 3), run_dir, CPU, position), position, 1)
    assert len(profile_names(run_dir)) == 6


class FakeProfiler:
    """torch.profiler.profile as StepProfiler drives it, its calls kept."""

    made: ClassVar[list[FakeProfiler]] = []

    def __init__(self, activities):
        self.activities, self.calls = activities, []
        FakeProfiler.made.append(self)

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")

    def key_averages(self):
        return Averages([event("step 1")])

    def export_chrome_trace(self, path):
        with open(path, "w") as trace:
            trace.write("{}")


def test_on_a_gpu_its_activity_is_recorded_waited_for_and_the_table_sorted_by_it(
    tmp_path, monkeypatch
):
    synchronized = []
    monkeypatch.setattr(profiling, "profile", FakeProfiler)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronized.append)
    FakeProfiler.made.clear()
    for device in (torch.device("cuda", 1), CPU):
        position = Position()
        run_steps(StepProfiler((1, 1), tmp_path / device.type, device, position), position, 2)
    on_gpu, on_cpu = FakeProfiler.made
    cpu, cuda = profiling.ProfilerActivity.CPU, profiling.ProfilerActivity.CUDA
    assert (on_gpu.activities, on_cpu.activities) == ([cpu, cuda], [cpu])
    assert on_gpu.calls == on_cpu.calls == ["start", "stop"]
    assert synchronized == [torch.device("cuda", 1)], "the GPU's queued work, once"
    for device, column in (("cuda", "self_device_time_total"), ("cpu", "self_cpu_time_total")):
        table = tmp_path / device / "profile" / "steps-1-1.txt"
        assert table.read_text() == f"(torch's table by {column}, 40 rows)\n"


def test_a_run_failing_in_the_window_raises_its_own_error_and_writes_nothing(tmp_path, monkeypatch):
    def stop_fails(self):
        raise RuntimeError("the GPU failed again")

    monkeypatch.setattr(profiling, "profile", FakeProfiler)
    monkeypatch.setattr(FakeProfiler, "stop", stop_fails)
    profiler = StepProfiler((1, 2), tmp_path, CPU, Position())
    with pytest.raises(ValueError, match="the run's own"), profiler:
        profiler.before_step()
        raise ValueError("the run's own")
    assert profile_names(tmp_path) == [] and profiler._profiler is None


def test_a_run_resumed_at_the_windows_first_step_says_so_at_once(tmp_path, caplog):
    position = Position(step=2)
    with caplog.at_level(logging.INFO, logger=profiling.__name__):
        run_steps(StepProfiler((2, 5), tmp_path, CPU, position), position, 1)
    assert caplog.messages == ["not profiled: this attempt resumed inside steps 2-5"]


def test_a_run_resumed_where_the_window_starts_and_running_no_step_says_nothing(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=profiling.__name__):
        run_steps(StepProfiler((4, 5), tmp_path, CPU, Position(step=4)), Position(step=4), 0)
    assert caplog.messages == []
