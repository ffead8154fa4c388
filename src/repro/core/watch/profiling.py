"""`trainer.profile_steps=[first,last]`: torch.profiler over a window of optimizer steps.

What those steps cost, op by op, on the host and (on CUDA) on the GPU, the wait for data
included: the window opens before step `first` fetches its batch and closes before step
`last + 1` does (or where the run stops, if sooner), so an evaluation or a checkpoint right
after a step in the window is in it, marked as such by the loop (`record_function`). The run
folder's `profile/` gets, named by the steps they cover, `steps-F-L.json`, a Chrome trace
with a span per step (open it in https://ui.perfetto.dev or chrome://tracing), and
`steps-F-L.txt`, torch's table of the ops that took the most time (on CUDA, on the GPU), and
`steps-F-L-host.txt`, the host's side: the loop's own spans (each step, the loader's hand-off,
the optimizer, evaluations, checkpoints) and the ops that took the most host time: what the
host does while a GPU waits for the next batch. Under torchrun each rank writes its own
(`steps-F-L-rank1.json` ...).

Profiling only watches: the weights are the same with it as without, and a failure to write
the profile is a warning, not the run's end. A run that stops with an error inside the window
writes nothing, and files an earlier attempt wrote are never replaced.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from repro.core.files import atomic_path, write_text_atomic
from repro.core.runs.position import Position
from repro.core.runtime import distributed
from repro.core.runtime.progress import TrainingBar

log = logging.getLogger(__name__)

TABLE_ROWS = 40
HOST_ROWS = 15
# The spans the host table lists first: the loop's steps and marks, the DataLoader's hand-off
# of a batch and the optimizer's calls (torch records these two itself).
LOOP_SPANS = ("step ", "evaluate", "checkpoint", "enumerate(DataLoader)", "Optimizer.")


class StepProfiler:
    """Opens and closes torch.profiler around the configured steps of a loop at `position`
    (or, as the loop's callback, the loop's position when it starts); `before_step` comes
    before every step, and leaving the block closes an open window."""

    def __init__(
        self,
        window: tuple[int, int] | None,
        run_dir: Path,
        device: torch.device,
        position: Position | None = None,
        dist: distributed.Context | None = None,
    ) -> None:
        self.window, self.device, self.position = window, device, position
        self.folder = run_dir / "profile"
        dist = dist or distributed.Context()
        self.suffix = f"-rank{dist.rank}" if dist.world > 1 else ""
        self._profiler: Any = None
        self._span: Any = None  # the current step's span in the trace

    def at_start(self, loop: Any) -> None:
        self.position = loop.state.position

    def before_step(self, loop: Any = None) -> None:
        if self.window is None:
            return
        first, last = self.window
        done = self.position.step
        if self._profiler is not None and done == last:
            self._finish()
            return
        if self._profiler is None and done + 1 == first:
            self._start()
        elif self._profiler is None and done >= first:  # resumed inside or after the window
            if done < last:
                log.info("not profiled: this attempt resumed inside steps %d-%d", first, last)
            self.window = None
            return
        if self._profiler is not None:  # a span per step, its wait for data included
            self._end_span()
            self._span = record_function(f"step {done + 1}")
            self._span.__enter__()

    def _start(self) -> None:
        # Kineto (the profiler's tracing library) prints its stage markers to stdout, and on a
        # machine without a GPU an ERROR line about counting GPUs: noise in the run's output.
        # Its own setting, read when it first starts; a value of the user's is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities)
        self._profiler.start()

    def _end_span(self) -> None:
        if self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None

    def _stop(self) -> Any:
        """Stop profiling (the GPU's queued work first: it belongs to the window's steps)."""
        self._end_span()
        profiler, self._profiler = self._profiler, None
        try:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            profiler.stop()
        return profiler

    def _finish(self) -> None:
        """Close the window where the run is and write what it recorded."""
        assert self.window is not None
        first, self.window = self.window[0], None
        profiler = self._stop()
        name = f"steps-{first}-{self.position.step}{self.suffix}"
        trace, table = self.folder / f"{name}.json", self.folder / f"{name}.txt"
        host = self.folder / f"{name}-host.txt"
        if trace.exists() or table.exists() or host.exists():
            log.info("steps %s were profiled by an earlier attempt of this run: kept", name)
            return
        sort_by = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            averages = profiler.key_averages()
            write_text_atomic(table, averages.table(sort_by=sort_by, row_limit=TABLE_ROWS) + "\n")
            write_text_atomic(host, host_table(averages))
            with atomic_path(trace) as tmp:
                profiler.export_chrome_trace(str(tmp))
        except OSError as error:  # a full disk: the run itself went well
            log.warning("the profile of steps %s could not be written: %s", name, error)
            return
        log.info("profiled steps %d-%d: %s, %s, %s", first, self.position.step, trace, table, host)

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._profiler is None:
            if self.window is not None and self.position and self.position.step < self.window[0]:
                log.info("not profiled: the run ended before step %d", self.window[0])
            return
        if kind is None:
            self._finish()
            return
        # The run's error is what the user must see: the window is left unwritten, and a
        # second error while stopping (the GPU's, once more) is not raised over it.
        with contextlib.suppress(Exception):
            self._stop()


def host_table(averages: Any) -> str:
    """The host's side of a profile (torch's `key_averages()`): the loop's spans with their
    own time outside any op torch records, then the HOST_ROWS ops with the most self CPU
    time."""
    spans = sorted(
        (event for event in averages if str(event.key).startswith(LOOP_SPANS)),
        key=_span_order,
    )
    lines = [
        "The loop's spans (ms of host time; own: outside any op torch records, the loop's",
        "Python: the progress line, callbacks, the batch's hand-off, waits)",
        f"{'span':<60} {'calls':>6} {'total':>10} {'own':>10}",
    ]
    for event in spans:
        total, own = event.cpu_time_total / 1e3, event.self_cpu_time_total / 1e3
        lines.append(f"{str(event.key)[:60]:<60} {event.count:>6} {total:>10.3f} {own:>10.3f}")
    lines += ["", f"The {HOST_ROWS} ops with the most self CPU time"]
    lines.append(averages.table(sort_by="self_cpu_time_total", row_limit=HOST_ROWS))
    return "\n".join(lines) + "\n"


def _span_order(event: Any) -> tuple[int, int, str]:
    """Steps first, by number, then the other spans by name."""
    name = str(event.key)
    number = name.removeprefix("step ")
    return (0, int(number), "") if number.isdigit() else (1, 0, name)


class SyncDebug:
    """`trainer.sync_debug` on CUDA, as the loop's callback: from the second step (the first
    compiles and autotunes), torch warns, with the line, at every host sync; off again when
    the loop stops. On another device it does nothing."""

    def __init__(self) -> None:
        self.active = self.armed = False

    def __enter__(self) -> SyncDebug:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            torch.cuda.set_sync_debug_mode(0)

    def at_start(self, loop: Any) -> None:
        self.active = self.armed = loop.device.type == "cuda"

    def after_step(self, loop: Any) -> None:
        if self.armed:
            torch.cuda.set_sync_debug_mode("warn")
            self.armed = False


def watchers(
    trainer_cfg: Any, logger_cfg: Any, run_dir: Path, device: torch.device, dist: Any
) -> dict[str, Any]:
    """The template's own callbacks that only watch the loop, as the config asks."""
    found: dict[str, Any] = {"progress": TrainingBar(str(logger_cfg.progress))}
    window = trainer_cfg.profile_steps
    if window is not None:
        steps = (int(window[0]), int(window[1]))
        found["profiler"] = StepProfiler(steps, run_dir, device, dist=dist)
    if trainer_cfg.sync_debug:
        found["sync_debug"] = SyncDebug()
    return found
