"""Where a run computes: the device it trains on and how host memory is used for it."""

from __future__ import annotations

import ctypes
import logging

import torch

from repro.core.errors import ConfigError

log = logging.getLogger(__name__)


def select_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; asking for CUDA without it is a config error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device", name, "no CUDA device is visible; use cpu or auto")
    return torch.device(name)


def reuse_host_memory() -> bool:
    """Keep freed CPU memory in the process for the next allocation (glibc only).

    By default glibc hands every block above 128 KiB back to the kernel when it is freed, so
    each step's activations, gradients and batches come from fresh pages, and on a small
    or virtual machine the page faults cost more than the arithmetic (a fifth of the step
    time of the default model here). Blocks up to 32 MiB now come from the heap, which is
    not trimmed below 1 GiB. Values and results are unchanged; returns whether it applied.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


def use_pinned_memory(requested: bool, device: torch.device) -> bool:
    """Pinning only helps copies to a GPU; on CPU it would cost page-locked RAM for nothing."""
    if requested and device.type != "cuda":
        log.debug("dataloader.pin_memory ignored: the device is %s, not cuda", device.type)
    return requested and device.type == "cuda"
