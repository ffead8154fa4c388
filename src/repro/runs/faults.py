"""Fault injection for the exactness tests: `REPRO_FAULT=<point>:<step>[:<signal>]` sends this
process a signal there, SIGKILL unless another is named (`step:5:SIGTERM`);
`<point>:<step>:<errno name>` raises that OSError there instead (`checkpoint:8:ENOSPC`, a disk
that fills while step 8's checkpoint is written).

Points: `step` (right after that optimizer step, once the checkpoints started before it are
on disk, so that a test knows which one a resume starts from), `checkpoint` (while the
checkpoint for that step is half written on the background writer, before its rename). Unset
in normal use; reading it costs one lookup.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable

_POINT, _STEP, _WHAT = ([*os.environ.get("REPRO_FAULT", "").split(":", 2), "", ""])[:3]


def point(name: str, step: int, settle: Callable[[], None] | None = None) -> None:
    """Signal this process, or raise the OSError, if REPRO_FAULT names this point and step
    (after `settle()`)."""
    if _POINT and (name, str(step)) == (_POINT, _STEP):
        if settle is not None:
            settle()
        if _WHAT.startswith("E"):
            code = getattr(errno, _WHAT)
            raise OSError(code, os.strerror(code))
        os.kill(os.getpid(), signal.Signals[_WHAT or "SIGKILL"])
