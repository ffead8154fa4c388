"""The one progress bar of the project (training steps, images decoded into the cache)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def progress_bar(setting: str = "auto") -> Progress:
    """A bar that vanishes when done (`logger.progress`): `auto` draws it on a terminal only,
    so a log file gets none; `on` draws it as on a terminal wherever stdout goes (a pipe
    through `tee`, a job's log); `off` never."""
    shown = {"on": True, "off": False}.get(setting, sys.stdout.isatty())
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(force_terminal=True) if setting == "on" else None,
        disable=not shown,
        transient=True,
    )


class TrainingBar:
    """The training loop's bar, as a callback (`logger.progress`): one tick per step."""

    def __init__(self, setting: str = "auto") -> None:
        self.bar = progress_bar(setting)

    def __enter__(self) -> TrainingBar:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)

    def at_start(self, loop: Any) -> None:
        done = loop.state.position.step
        self.task = self.bar.add_task("train", total=loop.total_steps, completed=done)

    def after_step(self, loop: Any) -> None:
        if not self.bar.disable:
            self.bar.advance(self.task)
