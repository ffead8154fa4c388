"""Turn SIGTERM, SIGINT and SIGUSR1 into a request to checkpoint and stop at the next step."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import torch

from repro.core.runtime import distributed

log = logging.getLogger(__name__)

# Under torchrun the ranks agree on a stop every this many steps: an all-reduce read on the
# host waits for the GPU, and doing it every step would drain its queue each time.
SYNC_STEPS = 10

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, name)
)


class StopRequest:
    """While active, the signals above set `signum` instead of killing the process.

    The loop checks it after every step, saves a checkpoint and exits with 128 + signum
    (143 for SIGTERM), the code schedulers such as SLURM expect from a terminated job.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            log.warning(
                "got %s: saving a checkpoint at the end of this step", signal.Signals(signum).name
            )
        self.signum = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def agreed(self, step: int, dist: distributed.Context) -> int | None:
        """The stop signal after `step`, if any rank got one: all ranks stop at one step."""
        if not dist.enabled:
            return self.signum
        if step % SYNC_STEPS:
            return None
        flag = torch.tensor([self.signum or 0])
        return int(distributed.max_tensor(flag, dist).item()) or None

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
