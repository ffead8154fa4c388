"""DataLoaders whose output depends only on (seed, epoch), never on workers or pinning.

The train sampler yields batches of (epoch, index) keys: the epoch's order is a pure
function of (seed, epoch), and each sample is augmented with a generator keyed on
(seed, epoch, index). Batches come back from the DataLoader in sampler order whatever the
number of workers, so the model sees the same bytes in every configuration. A resumed
run starts the sampler at its saved batch position instead of replaying data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from repro.data.datasets import Source, Splits
from repro.data.transforms import Compose
from repro.runtime.seeding import sample_rng, seed_worker, stream_seed, torch_generator


class EpochBatches(Sampler[list[tuple[int, int]]]):
    """Shuffled batches of (epoch, index) keys, starting at any batch of any epoch."""

    def __init__(
        self, size: int, batch_size: int, root_seed: int, drop_last: bool = True
    ) -> None:
        self.size, self.batch_size, self.root_seed = size, batch_size, root_seed
        self.drop_last = drop_last
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start = epoch, start_batch

    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.size, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.size, generator=torch_generator(self.root_seed, "order", epoch))

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        order = self.order(self.epoch).tolist()
        for batch in range(self.start, self.batches_per_epoch()):
            chunk = order[batch * self.batch_size : (batch + 1) * self.batch_size]
            yield [(self.epoch, index) for index in chunk]

    def __len__(self) -> int:
        return self.batches_per_epoch() - self.start


class TrainView(Dataset):
    """A source seen through random augmentation keyed on (seed, epoch, index)."""

    def __init__(self, source: Source, transform: Compose, augment_stream: int) -> None:
        self.source, self.transform, self.stream = source, transform, augment_stream

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        image, label = self.source[index]
        return self.transform(image, sample_rng(self.stream, epoch, index)), label


class EvalView(Dataset):
    """A source through the deterministic eval transform."""

    def __init__(self, source: Source, transform: Compose) -> None:
        self.source, self.transform = source, transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.source[index]
        return self.transform(image, None), label


def close(loader: DataLoader) -> None:
    """Stop a loader's persistent workers now, in order.

    Left to interpreter exit (after an error, say), workers are terminated while
    multiprocessing joins them, and torch reports that as a second, confusing error.
    """
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def _loader_options(cfg: Any, pin_memory: bool, root_seed: int) -> dict[str, Any]:
    workers = int(cfg.num_workers)
    options: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": pin_memory,
        "worker_init_fn": seed_worker,
        # Seeds the workers' base seed without touching torch's global stream.
        "generator": torch_generator(root_seed, "loader"),
    }
    if workers > 0:
        options["persistent_workers"] = bool(cfg.persistent_workers)
        options["prefetch_factor"] = int(cfg.prefetch_factor)
    return options


def train_loader(
    splits: Splits, transform: Compose, batch_size: int, loader_cfg: Any, pin_memory: bool,
    root_seed: int,
) -> tuple[DataLoader, EpochBatches]:
    """The training DataLoader and its sampler (call `sampler.set_epoch` before each epoch)."""
    sampler = EpochBatches(len(splits.train), batch_size, root_seed)
    view = TrainView(splits.train, transform, stream_seed(root_seed, "augment"))
    options = _loader_options(loader_cfg, pin_memory, root_seed)
    return DataLoader(view, batch_sampler=sampler, **options), sampler


def eval_loader(
    source: Source, transform: Compose, batch_size: int, loader_cfg: Any, pin_memory: bool,
    root_seed: int,
) -> DataLoader:
    """Batches of a split in its stored order."""
    options = _loader_options(loader_cfg, pin_memory, root_seed)
    return DataLoader(EvalView(source, transform), batch_size=batch_size, shuffle=False, **options)
