"""The one progress bar of the project (training steps, images decoded into the cache)."""

from __future__ import annotations

import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def progress_bar(setting: str = "auto") -> Progress:
    """A bar that vanishes when done: `on`, `off`, or `auto` (on a terminal only, so a log
    file gets none; `logger.progress`)."""
    shown = {"on": True, "off": False}.get(setting, sys.stdout.isatty())
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not shown,
        transient=True,
    )
