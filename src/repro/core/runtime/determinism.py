"""The `cudnn` knob: cuDNN benchmarking, deterministic algorithms, TF32 and cuBLAS's workspace."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from repro.core.errors import ConfigError

log = logging.getLogger(__name__)

# cuBLAS is deterministic only with a fixed workspace configuration; these are the two NVIDIA
# documents. It is read from the environment once per process, when CUDA first uses cuBLAS.
CUBLAS_VARIABLE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE = ":4096:8"
DETERMINISTIC_WORKSPACES = (":4096:8", ":16:8")


class CublasWorkspace:
    """CUBLAS_WORKSPACE_CONFIG as cuBLAS sees it in this process.

    Until CUDA starts, the variable can still be set (for a deterministic job) or removed again
    (for a later job that does not need it); once CUDA has started, the value it started with is
    in force for the rest of the process, whatever the environment says afterwards. A sequential
    multirun or the benchmark's rows run several jobs in one process, so this is tracked.
    """

    def __init__(self) -> None:
        self.set_by_us = False  # a value the user exported is never changed
        self.started_with: str | None = None
        self.started = False

    def prepare(self, needed: bool, device: torch.device) -> None:
        """Set or clear the variable for a job about to run on `device`, or refuse the job
        when it needs a workspace this process can no longer give."""
        if self._cuda_started():
            usable = self.started_with in DETERMINISTIC_WORKSPACES
            if needed and device.type == "cuda" and not usable:
                raise ConfigError(
                    "cudnn.deterministic_algorithms",
                    True,
                    f"this process started CUDA with {CUBLAS_VARIABLE}={self.started_with!r} "
                    "(an earlier job in it) and cuBLAS reads it only then: run each job in its "
                    "own process (hydra/launcher=joblib or submitit) or export "
                    f"{CUBLAS_VARIABLE}={CUBLAS_WORKSPACE} before starting",
                )
            return
        current = os.environ.get(CUBLAS_VARIABLE)
        if needed and current is None:
            os.environ[CUBLAS_VARIABLE] = CUBLAS_WORKSPACE
            self.set_by_us = True
        elif not needed and self.set_by_us:
            del os.environ[CUBLAS_VARIABLE]
            self.set_by_us = False

    def in_force(self) -> str | None:
        """The value cuBLAS runs with (or, before CUDA starts, will start with)."""
        if self._cuda_started():
            return self.started_with
        return os.environ.get(CUBLAS_VARIABLE)

    def _cuda_started(self) -> bool:
        # Conservative: CUDA starts before cuBLAS does. Only `prepare` changes the variable, so
        # the first time CUDA is seen started, the environment still holds what it started with.
        if not self.started and torch.cuda.is_initialized():
            self.started, self.started_with = True, os.environ.get(CUBLAS_VARIABLE)
        return self.started


cublas_workspace = CublasWorkspace()


def apply(cfg: Any, device: torch.device) -> None:
    """Set torch's global flags from the `cudnn` config group, for a run on `device`.

    Call it before anything touches CUDA (cuBLAS's workspace is fixed when CUDA starts).
    """
    cublas_workspace.prepare(bool(cfg.deterministic_algorithms), device)
    torch.backends.cudnn.benchmark = bool(cfg.benchmark)
    torch.backends.cudnn.deterministic = bool(cfg.deterministic)
    wanted = (bool(cfg.deterministic_algorithms), bool(cfg.warn_only))
    current = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if wanted != current:  # the call imports torch._inductor (~2 s on a small CPU) every time
        torch.use_deterministic_algorithms(wanted[0], warn_only=wanted[1])
    torch.backends.cuda.matmul.allow_tf32 = bool(cfg.tf32_matmul)
    torch.backends.cudnn.allow_tf32 = bool(cfg.tf32_cudnn)


def snapshot() -> dict[str, object]:
    """The flags as they are now, for the run's summary and for verify's comparison."""
    return {
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "cublas_workspace_config": cublas_workspace.in_force(),
    }
