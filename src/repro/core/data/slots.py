"""How a batch made in a DataLoader worker reaches the main process.

Training batches go through `SharedSlots`, buffers in shared memory mapped once by every
process, so the message is a few bytes; other batches travel by value.
"""

from __future__ import annotations

import secrets
import weakref
from typing import Any, ClassVar, NamedTuple

import torch
from torch.utils.data import get_worker_info


class Batch(NamedTuple):
    """A batch built whole by a view; `collate` passes it through untouched."""

    images: torch.Tensor
    labels: torch.Tensor

    def __reduce__(self) -> tuple[Any, ...]:
        # From a worker, a CPU batch travels by value through the pipe: a tensor would go
        # through a fresh shared-memory block per batch, whose first touch in the main
        # process (page faults) costs more than copying a batch of small images.
        if self.images.device.type != "cpu":
            return Batch, (self.images, self.labels)
        return _batch_from_arrays, (self.images.numpy(), self.labels.numpy())


def _batch_from_arrays(images: Any, labels: Any) -> Batch:
    return Batch(torch.from_numpy(images), torch.from_numpy(labels))


class SharedSlots:
    """Batch-sized buffers in shared memory that the main process and every worker map once.

    A worker writes each training batch into its next slot and sends the slot's number; the
    main process copies the batch out when it receives it. Nothing is mapped or faulted in
    per batch, and the message is a few bytes. Worker w cycles through its own `per_worker`
    slots. It has at most prefetch_factor batches in flight, and the DataLoader sends it a
    new task only after it has received an earlier one, so with prefetch_factor + 2 slots a
    slot is never written again before it has been copied out.
    """

    live: ClassVar[weakref.WeakValueDictionary[str, SharedSlots]] = weakref.WeakValueDictionary()

    def __init__(self, workers: int, per_worker: int, sample: Batch) -> None:
        self.token, self.per_worker, self.produced = secrets.token_hex(8), per_worker, 0
        count = workers * per_worker
        self.images = torch.zeros((count, *sample.images.shape), dtype=sample.images.dtype)
        self.labels = torch.zeros((count, *sample.labels.shape), dtype=sample.labels.dtype)
        self.images.share_memory_(), self.labels.share_memory_()
        SharedSlots.live[self.token] = self

    def __setstate__(self, state: dict[str, Any]) -> None:  # in a spawned worker
        self.__dict__.update(state)
        SharedSlots.live[self.token] = self

    def put(self, batch: Batch) -> Batch | SlotRef:
        worker = get_worker_info()
        if worker is None or batch.images.shape != self.images.shape[1:]:
            return batch
        slot = worker.id * self.per_worker + self.produced % self.per_worker
        self.produced += 1
        self.images[slot].copy_(batch.images)
        self.labels[slot].copy_(batch.labels)
        return SlotRef(self.token, slot)


class SlotRef(NamedTuple):
    """A batch waiting in a shared slot; unpickled in the main process as a copy of it."""

    token: str
    slot: int

    def __reduce__(self) -> tuple[Any, ...]:
        return _batch_from_slot, (self.token, self.slot)


def _batch_from_slot(token: str, slot: int) -> Batch:
    slots = SharedSlots.live[token]
    return Batch(slots.images[slot].clone(), slots.labels[slot].clone())
