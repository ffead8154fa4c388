"""The `amp` knob: autocast in bf16 or fp16, and a GradScaler for fp16 only."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from repro.core.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _supports(device: torch.device, mode: str) -> bool:
    if device.type == "cuda":
        return mode == "fp16" or torch.cuda.is_bf16_supported()
    # CPU autocast has fast bf16 kernels; fp16 on CPU is emulated and not worth offering.
    return mode == "bf16"


def native_bf16() -> bool:
    """Whether the GPU computes in bf16 natively (Ampere and newer); older ones emulate it."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # an older torch without the argument
        return torch.cuda.is_bf16_supported()


class Precision:
    """Which dtype autocast uses on this device, and the loss scaler that goes with it."""

    def __init__(self, mode: str, device: torch.device) -> None:
        if mode == "auto":
            mode = "bf16" if device.type == "cuda" and native_bf16() else "off"
        if mode != "off" and not _supports(device, mode):
            usable = [m for m in ("bf16", "fp16") if _supports(device, m)]
            allowed = ", ".join(["off", "auto", *usable])
            raise ConfigError("amp", mode, f"{device.type} cannot run it; allowed here: {allowed}")
        self.mode = mode
        self.device = device
        # Pre-Ampere GPUs run bf16 through fp32 units: correct, but slower than no autocast.
        self.emulated = mode == "bf16" and device.type == "cuda" and not native_bf16()
        if self.emulated:
            log.warning(
                "amp=bf16 on %s runs emulated (no native bf16 on this GPU) and slowly; "
                "amp=fp16 or amp=off is faster here",
                torch.cuda.get_device_name(device),
            )
        self.dtype = DTYPES.get(mode)
        # Only fp16 has too narrow a range for gradients; bf16 needs no scaling.
        self.scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield
