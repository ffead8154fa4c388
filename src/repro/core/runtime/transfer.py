"""Moving batches to the device: non_blocking copies, normalisation there, and the CUDA
side-stream prefetcher."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch


def host_to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device` without waiting for the GPU: through pinned memory on
    CUDA, since a copy from ordinary memory blocks until the GPU has finished its queued work."""
    if device.type == "cuda" and not values.is_cuda:
        return values.pin_memory().to(device, non_blocking=True)
    return values.to(device)


# Elementwise ops on fewer elements than torch's grain size (32768) run in the calling thread.
SERIAL_ELEMENTS = 32767


class DeviceBatches:
    """Moves (uint8 images, labels) batches to the device and turns images into floats there.

    Images travel as uint8 (4x fewer bytes than float32) and are normalised on the device,
    written straight in the model's memory format (no second copy to convert them). Copies
    from pinned memory are issued with non_blocking=True, so the host does not wait.
    """

    def __init__(
        self,
        device: torch.device,
        mean: list[float],
        std: list[float],
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> None:
        self.device, self.memory_format = device, memory_format
        self.non_blocking = device.type == "cuda"
        shape = (1, len(mean), 1, 1)
        self.scale = (1.0 / (255.0 * torch.tensor(std))).view(shape).to(device)
        self.shift = (-torch.tensor(mean) / torch.tensor(std)).view(shape).to(device)

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if images.is_floating_point():  # prepared ahead, on the device, by a Prefetcher
            return images, labels
        images = images.to(self.device, non_blocking=self.non_blocking)
        labels = labels.to(self.device, non_blocking=self.non_blocking)
        out = torch.empty(
            images.shape,
            dtype=torch.float32,
            device=self.device,
            memory_format=self.memory_format if images.dim() == 4 else torch.contiguous_format,
        )
        per_image = math.prod(images.shape[1:])
        if self.device.type == "cpu" and 0 < per_image <= SERIAL_ELEMENTS < images.numel():
            return self._serial(images, out, per_image), labels
        return torch.mul(images, self.scale, out=out).add_(self.shift), labels  # uint8 * float

    def _serial(self, images: torch.Tensor, out: torch.Tensor, per_image: int) -> torch.Tensor:
        """The same values on a CPU, in chunks that each run in this thread alone: a parallel
        op would wait at its barrier whenever a DataLoader worker holds one of the cores,
        which made this small step cost several times its arithmetic. (A batch small enough
        runs in this thread as one op.)"""
        step = SERIAL_ELEMENTS // per_image
        for start in range(0, len(images), step):
            part = slice(start, start + step)
            torch.mul(images[part], self.scale, out=out[part]).add_(self.shift)
        return out


class Prefetcher:
    """Wraps a loader of pinned CPU batches: the next batch is copied to the GPU and
    normalised there on a side stream while the current one trains, so the copy overlaps
    compute instead of queueing behind it. The compute stream waits for the side stream
    before it uses the batch.
    """

    def __init__(self, loader: Any, prepare: DeviceBatches) -> None:
        self.wrapped, self.prepare, self.device = loader, prepare, prepare.device
        self.stream = torch.cuda.Stream(self.device)

    def __len__(self) -> int:
        return len(self.wrapped)

    def __getattr__(self, name: str) -> Any:  # the DataLoader's own: dataset, num_workers ...
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        pending = None
        for batch in self.wrapped:
            with torch.cuda.stream(self.stream):
                moved = self.prepare(*batch)
                copied = torch.cuda.Event()
                copied.record(self.stream)
            if pending is not None:
                yield self._ready(*pending)
            pending = moved, copied
        if pending is not None:
            yield self._ready(*pending)

    def _ready(
        self, tensors: tuple[torch.Tensor, ...], copied: torch.cuda.Event
    ) -> tuple[torch.Tensor, ...]:
        compute = torch.cuda.current_stream(self.device)
        # This batch's event, not the whole side stream: the next batch's copy, queued there
        # already, must not hold up the step that uses this one.
        compute.wait_event(copied)
        for tensor in tensors:
            tensor.record_stream(compute)  # its memory is not reused before compute is done
        return tensors


def prefetched(loader: Any, prepare: DeviceBatches, pin_memory: bool) -> Any:
    """`loader` behind a side-stream `Prefetcher` when its batches are pinned for a GPU (the
    DataLoader's pin-memory thread receives them); as it is otherwise."""
    if pin_memory and prepare.device.type == "cuda":
        return Prefetcher(loader, prepare)
    return loader
