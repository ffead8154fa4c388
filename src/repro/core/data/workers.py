"""What every DataLoader worker of the template does first."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys

from repro.core.runtime.seeding import seed_worker

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def start_worker(worker_id: int) -> None:
    """Seed the worker, and on Linux have it killed with the main process.

    A worker whose main process was killed (SIGKILL, the OOM killer, a scheduler) would
    otherwise wait forever at exit to flush batches nobody will read, holding the run's
    output pipes and shared memory.
    """
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        parent = multiprocessing.parent_process()
        if parent is not None and os.getppid() != parent.pid:  # died before the prctl
            os._exit(1)
    seed_worker(worker_id)
