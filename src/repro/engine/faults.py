"""Crash injection for the exactness tests: `REPRO_FAULT=<point>:<step>` SIGKILLs the process.

Points: `step` (right after that optimizer step), `checkpoint` (while the checkpoint for that
step is half written, before its rename). Unset in normal use; reading it costs one lookup.
"""

from __future__ import annotations

import os
import signal

_FAULT = os.environ.get("REPRO_FAULT", "")


def point(name: str, step: int) -> None:
    """SIGKILL this process if REPRO_FAULT names this point and step."""
    if _FAULT and f"{name}:{step}" == _FAULT:
        os.kill(os.getpid(), signal.SIGKILL)
