"""Fault injection for the exactness tests: `REPRO_FAULT=<point>:<step>[:<signal>]` sends this
process a signal there, SIGKILL unless another is named (`step:5:SIGTERM`);
`<point>:<step>:<errno name>` raises that OSError there instead (`checkpoint:8:ENOSPC`, a disk
that fills while step 8's checkpoint is written).

Points: `step` (right after that optimizer step, once the checkpoints started before it are
on disk, so that a test knows which one a resume starts from), `checkpoint` (while the
checkpoint for that step is half written on the background writer, before its rename). Unset
in normal use; reading it costs one lookup. It is read at each point, not once at import, so
that a process forked after the engine is imported (the test kit's tiny runs) can arm it.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable

VARIABLE = "REPRO_FAULT"


def point(name: str, step: int, settle: Callable[[], None] | None = None) -> None:
    """Signal this process, or raise the OSError, if REPRO_FAULT names this point and step
    (after `settle()`)."""
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    at, when, what = [*spec.split(":", 2), "", ""][:3]
    if (name, str(step)) == (at, when):
        if settle is not None:
            settle()
        if what.startswith("E"):
            code = getattr(errno, what)
            raise OSError(code, os.strerror(code))
        os.kill(os.getpid(), signal.Signals[what or "SIGKILL"])
