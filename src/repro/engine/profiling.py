"""`trainer.profile_steps=[first,last]`: torch.profiler over a window of optimizer steps.

What those steps cost, op by op, on the host and (on CUDA) on the GPU, the wait for data
included: the window opens before step `first` fetches its batch and closes after step
`last` (or where the run stops, if sooner). The run folder's `profile/` gets `trace.json`, a
Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing), and `ops.txt`, torch's
table of the ops that took the most time. Under torchrun each rank writes its own
(`trace-rank1.json` ...).

Profiling only watches: the weights are the same with it as without. A window that an
earlier attempt of the run profiled already is not profiled again, so its files are kept.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from repro.engine.position import Position
from repro.files import atomic_path, write_text_atomic

log = logging.getLogger(__name__)

TABLE_ROWS = 40


class StepProfiler:
    """Opens and closes torch.profiler around the configured steps of a loop at `position`;
    the loop calls `before_step` before every step, and leaving the block closes an open
    window."""

    def __init__(
        self,
        window: tuple[int, int] | None,
        folder: Path,
        device: torch.device,
        position: Position,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.window, self.folder, self.device, self.position = window, folder, device, position
        suffix = f"-rank{rank}" if world > 1 else ""
        self.trace, self.table = folder / f"trace{suffix}.json", folder / f"ops{suffix}.txt"
        self._profiler: Any = None
        self._span: Any = None  # the current step's span in the trace

    def before_step(self) -> None:
        if self.window is None:
            return
        first, last = self.window
        done = self.position.step
        if done + 1 == first and self._profiler is None:
            self._start()
        elif done == last:
            self.finish()
        elif first <= done <= last and self._profiler is None:
            log.info("not profiled: this attempt resumed inside steps %d-%d", first, last)
            self.window = None
        if self._profiler is not None:  # a span per step, its wait for data included
            self._end_span()
            self._span = record_function(f"step {done + 1}")
            self._span.__enter__()

    def _end_span(self) -> None:
        if self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None

    def _start(self) -> None:
        if self.trace.exists():
            log.info("%s holds these steps' profile already (an earlier attempt): kept", self.trace)
            self.window = None
            return
        # Kineto (the profiler's tracing library) prints its stage markers to stdout, and on a
        # machine without a GPU an ERROR line about counting GPUs: noise in the run's output.
        # Its own setting, read when it first starts; a value of the user's is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities)
        self._profiler.start()

    def finish(self) -> None:
        """Close the window (at its last step, or where the run stopped) and write the files."""
        if self._profiler is None:
            return
        self._end_span()
        profiler, self._profiler = self._profiler, None
        if self.device.type == "cuda":  # the GPU's queued work belongs to the window's steps
            torch.cuda.synchronize(self.device)
        profiler.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        sort_by = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        write_text_atomic(
            self.table, profiler.key_averages().table(sort_by=sort_by, row_limit=TABLE_ROWS) + "\n"
        )
        with atomic_path(self.trace) as tmp:
            profiler.export_chrome_trace(str(tmp))
        first = self.window[0] if self.window else 0
        log.info("profiled steps %d-%d: %s, %s", first, self.position.step, self.trace, self.table)
        self.window = None

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
