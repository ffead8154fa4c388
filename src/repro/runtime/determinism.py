"""The `cudnn` knob: cuDNN benchmarking, deterministic algorithms and TF32."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)

# cuBLAS is deterministic only with a fixed workspace; it reads this when its first handle
# is created, so it must be in the environment before any CUDA work.
CUBLAS_WORKSPACE = ":4096:8"


def apply(cfg: Any) -> None:
    """Set torch's global flags from the `cudnn` config group."""
    if cfg.deterministic_algorithms:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
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
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
