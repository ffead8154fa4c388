"""The one progress bar of the project (training steps, images decoded into the cache)."""

from __future__ import annotations

import sys

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
