"""Fault injection for the exactness tests: `REPRO_FAULT=<point>:<step>[:<signal>]` sends this
process a signal there, SIGKILL unless another is named (`step:5:SIGTERM`).

Points: `step` (right after that optimizer step, once the checkpoints started before it are
on disk, so that a test knows which one a resume starts from), `checkpoint` (while the
checkpoint for that step is half written on the background writer, before its rename). Unset
in normal use; reading it costs one lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

_FAULT, _, _SIGNAL = os.environ.get("REPRO_FAULT", "").partition(":SIG")


def point(name: str, step: int, settle: Callable[[], None] | None = None) -> None:
    """Signal this process if REPRO_FAULT names this point and step (after `settle()`)."""
    if _FAULT and f"{name}:{step}" == _FAULT:
        if settle is not None:
            settle()
        os.kill(os.getpid(), signal.Signals[f"SIG{_SIGNAL}"] if _SIGNAL else signal.SIGKILL)
