"""Which images a batch holds: the training order, pure in (seed, epoch), and the
evaluation passes in stored order, each cut into shards for torchrun ranks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import Sampler

from repro.core.runtime.seeding import torch_generator


class EpochBatches(Sampler[list[tuple[int, int]]]):
    """Shuffled batches of (epoch, index) keys, from any batch of any epoch on.

    With `world` ranks, step b of an epoch takes the next `batch_size * world` indices of the
    epoch's order and rank r gets the r-th slice of `batch_size`: the ranks see disjoint data
    and together cover the epoch (up to the incomplete last global batch, which is dropped).
    A source may order its own epochs (`epoch_order(root_seed, epoch)`, a pure function of
    both: sharded data reads shard by shard); the rest are shuffled whole.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        root_seed: int,
        rank: int = 0,
        world: int = 1,
        epoch_order: Callable[[int, int], torch.Tensor] | None = None,
    ) -> None:
        self.size, self.batch_size, self.root_seed = size, batch_size, root_seed
        self.rank, self.world, self.epoch_order = rank, world, epoch_order
        self.epoch, self.start, self.epochs = 0, 0, 1

    def set_epoch(self, epoch: int, start_batch: int = 0, epochs: int = 1) -> None:
        """Iterate from batch `start_batch` of `epoch` through the end of `epochs` epochs."""
        self.epoch, self.start, self.epochs = epoch, start_batch, epochs

    def batches_per_epoch(self) -> int:
        return self.size // (self.batch_size * self.world)

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's order, the same on every rank: a pure function of (seed, epoch)."""
        if self.epoch_order is not None:
            return self.epoch_order(self.root_seed, epoch)
        return torch.randperm(self.size, generator=torch_generator(self.root_seed, "order", epoch))

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for epoch, indices in self.index_batches():
            yield [(epoch, index) for index in indices.tolist()]

    def index_batches(self) -> Iterator[tuple[int, torch.Tensor]]:
        """The same batches as (epoch, int64 tensor of indices): no Python per sample, for
        loaders that make a batch whole (`dataloader=device`)."""
        step = self.batch_size * self.world
        for epoch in range(self.epoch, self.epoch + self.epochs):
            order = self.order(epoch)
            start = self.start if epoch == self.epoch else 0
            for batch in range(start, self.batches_per_epoch()):
                first = batch * step + self.rank * self.batch_size
                yield epoch, order[first : first + self.batch_size]

    def __len__(self) -> int:
        return self.epochs * self.batches_per_epoch() - self.start


class EvalBatches(Sampler[list[int]]):
    """A split's batches in stored order, one pass after another for as long as it is read
    (`len` is one pass). Rank r of `world` takes every world-th image from the r-th, so
    summed over ranks each image counts exactly once."""

    def __init__(self, size: int, batch_size: int, rank: int = 0, world: int = 1) -> None:
        self.indices, self.batch_size = range(rank, size, world), batch_size

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            for start in range(0, len(self.indices), self.batch_size):
                yield list(self.indices[start : start + self.batch_size])

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)
