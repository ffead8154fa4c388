"""Numbers about a run: the weights hash and throughput/data-wait accounting."""

from __future__ import annotations

import hashlib
import time

import torch
from torch import nn


def weights_sha256(model: nn.Module) -> str:
    """SHA-256 over every state_dict tensor (name, dtype, shape, bytes) in sorted name order.

    Tensors are hashed in their logical (contiguous) layout, so the memory format of the
    weights does not change the hash, only their values do.
    """
    digest = hashlib.sha256()
    state = model.state_dict()
    names = sorted(state)
    tensors = [state[name].detach() for name in names]
    on_device = any(tensor.device.type != "cpu" for tensor in tensors)
    for name, tensor, raw in zip(names, tensors, host_bytes(tensors, on_device), strict=True):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(raw.numpy().tobytes())
    return digest.hexdigest()


def host_bytes(tensors: list[torch.Tensor], gather: bool) -> list[torch.Tensor]:
    """Each tensor's bytes in its logical layout, on the host. With `gather`, through one copy
    of all of them (one transfer and one wait for a GPU model, not one per tensor)."""
    raw = [tensor.contiguous().reshape(-1).view(torch.uint8) for tensor in tensors]
    if not gather or not raw:
        return [part.cpu() for part in raw]
    flat = torch.cat([part.to(raw[0].device) for part in raw]).cpu()
    return list(flat.split([len(part) for part in raw]))


class Throughput:
    """Images per second and the fraction of wall time spent waiting for the next batch."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.waiting = 0.0
        self.images = 0

    def waited(self, seconds: float, images: int) -> None:
        self.waiting += seconds
        self.images += images

    def read(self) -> tuple[float, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return self.images / elapsed, self.waiting / elapsed
