"""DataLoaders whose output depends only on (seed, epoch), never on workers or pinning.

The train sampler yields batches of (epoch, index) keys: the epoch's order is a pure
function of (seed, epoch), and each sample's augmentation draws are a pure function of
(seed, epoch, index) (`seeding.SampleKeys`). Batches come back from the DataLoader in sampler
order whatever the number of workers, so the model sees the same bytes in every
configuration. A resumed run starts the sampler at its saved batch position instead of
replaying data.

For in-memory sources the views build a whole batch at once (`__getitems__`, which the
DataLoader calls with the batch's keys, `batching.BatchMaker`): one gather that crops and
flips, with the draws of all samples computed at once, equal to those of the per-sample path.

A run reads each loader through one `Batches` iterator, so its workers start once per run.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from repro.core.data.batching import BatchMaker
from repro.core.data.datasets import Source, Splits
from repro.core.data.samplers import EpochBatches, EvalBatches
from repro.core.data.slots import Batch, SharedSlots, SlotRef
from repro.core.data.sources import stack_targets
from repro.core.data.transforms import Compose
from repro.core.data.workers import start_worker
from repro.core.runtime.seeding import SampleKeys, stream_seed, torch_generator

CPU = torch.device("cpu")


@dataclass(frozen=True)
class LoaderContext:
    """What a loader needs to know of the process it feeds: the run's root seed, its rank
    among `world` ranks, the training device and whether batches are pinned for it."""

    root_seed: int
    rank: int = 0
    world: int = 1
    device: torch.device = CPU
    pin_memory: bool = False


class Batches:
    """A loader's batches through one iterator that lives until `close`.

    Its workers start once and keep prefetching across epoch and evaluation boundaries.
    `close` drops the only reference to the iterator, whose finaliser stops the workers in
    order: left to interpreter exit (after an error, say), they are terminated while
    multiprocessing joins them, and torch reports that as a second, confusing error.
    """

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader, self.iterator = loader, None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.iterator is None:
            self.iterator = iter(self.loader)
        try:
            return next(self.iterator)
        except StopIteration:
            raise
        except BaseException as error:
            # The error's frames hold the iterator; cleared (the traceback still prints),
            # they let `close` stop the workers now rather than at interpreter exit.
            traceback.clear_frames(error.__traceback__)
            self.close()
            raise

    def take(self, count: int) -> Iterator[Any]:
        """The next `count` batches."""
        for _ in range(count):
            yield next(self)

    def close(self) -> None:
        self.iterator = None

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TrainView(Dataset):
    """A source seen through random augmentation keyed on (seed, epoch, index)."""

    def __init__(self, source: Source, transform: Compose, augment_stream: int) -> None:
        self.source, self.transform, self.stream = source, transform, augment_stream
        self.maker = BatchMaker.of(source, transform, augment_stream)  # for in-memory data
        self.slots: SharedSlots | None = None  # set by train_loader when workers make batches
        # Set by train_loader for CPU training with workers: batches leave the workers as the
        # model's float input, so the training thread neither waits for nor does that work.
        self.prepare: Callable[[torch.Tensor, torch.Tensor], tuple[Any, Any]] | None = None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, Any]:
        epoch, index = key
        image, label = self.source[index]
        return self.transform(image, SampleKeys(self.stream, epoch, index)), label

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> Batch | SlotRef | list[Any]:
        epoch = keys[0][0]  # EpochBatches: one epoch per batch
        indices = [index for _, index in keys]
        if self.maker is not None:
            batch = self.maker(indices, epoch)
        else:
            batch = sample_then_batch(self.source, self.transform, indices, self.stream, epoch)
            if not isinstance(batch, Batch):  # sizes differ: default_collate will say so
                return batch
        if self.prepare is not None:
            batch = Batch(*self.prepare(*batch))
        return self.slots.put(batch) if self.slots is not None else batch


class EvalView(Dataset):
    """A source through the deterministic eval transform."""

    def __init__(self, source: Source, transform: Compose) -> None:
        self.source, self.transform = source, transform
        self.maker = BatchMaker.of(source, transform)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        image, label = self.source[index]
        return self.transform(image, None), label

    def __getitems__(self, indices: Sequence[int]) -> Batch | list[Any]:
        if self.maker is None:
            return sample_then_batch(self.source, self.transform, list(indices))
        return self.maker(list(indices))


def sample_then_batch(
    source: Source,
    transform: Compose,
    indices: list[int],
    stream: int | None = None,
    epoch: int | None = None,
) -> Batch | list[tuple[torch.Tensor, Any]]:
    """Samples that must be read one by one (image files, a resize, torchvision transforms):
    the per-sample steps on each, then the pipeline's batchable tail on them stacked, with the
    batch's keys (the same draws as per sample, without Python per sample). Samples of other
    sizes go through the tail one by one; if they still differ, they are returned as a list."""

    def keys(index: Any) -> SampleKeys | None:
        return None if epoch is None else SampleKeys(stream, epoch, index)  # type: ignore[arg-type]

    per_sample, tail = transform.split()
    images, labels = [], []
    for index in indices:
        image, label = source[index]
        images.append(per_sample(image, keys(index)))
        labels.append(label)
    if all(image.shape == images[0].shape for image in images):
        batch = torch.stack(images)
        if tail.steps:
            batch = tail.batch(batch, keys(torch.tensor(indices)))
    else:  # other aspect ratios: the tail per sample (a crop makes them one size)
        images = [tail(image, keys(index)) for image, index in zip(images, indices, strict=True)]
        if any(image.shape != images[0].shape for image in images):
            return list(zip(images, labels, strict=True))
        batch = torch.stack(images)
    return Batch(batch, stack_targets(labels))


def collate(data: Batch | SlotRef | list[Any]) -> Any:
    """A batch a view built whole passes through; a list of samples is stacked as usual."""
    return data if isinstance(data, Batch | SlotRef) else default_collate(data)


def _loader_options(cfg: Any, context: LoaderContext) -> dict[str, Any]:
    workers = int(cfg.num_workers)
    options: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": context.pin_memory,
        "worker_init_fn": start_worker,
        "collate_fn": collate,
        # Seeds the workers' base seed without touching torch's global stream.
        "generator": torch_generator(context.root_seed, "loader"),
    }
    if workers > 0:
        # No persistent_workers: the run reads each loader through one iterator (`Batches`),
        # so its workers live for the run anyway, and nothing keeps a hidden iterator alive.
        options["prefetch_factor"] = int(cfg.prefetch_factor)
        # The platform's own start method, named explicitly: inside a joblib (loky) job the
        # process-wide default is loky's, which cannot start DataLoader workers.
        options["multiprocessing_context"] = multiprocessing.get_all_start_methods()[0]
    return options


def train_loader(
    splits: Splits,
    transform: Compose,
    batch_size: int,
    loader_cfg: Any,
    context: LoaderContext,
    prepare_in_workers: Callable[[torch.Tensor, torch.Tensor], tuple[Any, Any]] | None = None,
) -> tuple[DataLoader, EpochBatches]:
    """The training DataLoader and its sampler (`sampler.set_epoch` says where to start).

    With `prepare_in_workers` (CPU training), workers that build whole batches also apply it.
    """
    seed = context.root_seed
    order = getattr(splits.train, "epoch_order", None)  # a source's own (sharded data)
    sampler = EpochBatches(
        len(splits.train), batch_size, seed, context.rank, context.world, epoch_order=order
    )
    view = TrainView(splits.train, transform, stream_seed(seed, "augment"))
    options = _loader_options(loader_cfg, context)
    if options["num_workers"] > 0:
        view.prepare = prepare_in_workers
    sample = view.__getitems__([(0, 0)] * batch_size)
    if options["num_workers"] > 0 and isinstance(sample, Batch):
        per_worker = int(loader_cfg.prefetch_factor) + 2
        view.slots = SharedSlots(options["num_workers"], per_worker, sample)
    return DataLoader(view, batch_sampler=sampler, **options), sampler


def eval_loader(
    source: Source, transform: Compose, batch_size: int, loader_cfg: Any, context: LoaderContext
) -> DataLoader:
    """Batches of a split in its stored order, pass after pass (`EvalBatches`)."""
    batches = EvalBatches(len(source), batch_size, context.rank, context.world)
    view = EvalView(source, transform)
    return DataLoader(view, batch_sampler=batches, **_loader_options(loader_cfg, context))
