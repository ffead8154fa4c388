"""`dataloader=device`: in-memory datasets kept on the device, batches built with tensor ops.

The whole uint8 split is copied to the device once. Each batch's random crops and flips are
one gather from a padded, mirrored copy of it (`batching.CropFlipTable`), with no worker
processes and no host-to-device copy of images; the steps after them (Cutout) run on the
batch there. The keys are those of the DataLoader path: the epoch's order comes from the
same `EpochBatches` sampler (the "order" stream, started at the saved position for exact
resume) and each sample's crop offsets and flip are the same pure function of (augment stream,
epoch, index), computed for the whole batch on the host (`seeding.SampleKeys`; there a batch's
draws cost a few numpy operations, where a GPU would launch dozens of small kernels) and sent
over with the labels in one copy (Cutout's corners in a second). So for a seed and an epoch
the batches are the DataLoader's, to the byte, and so are the final weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from repro.core.data.batching import BatchMaker
from repro.core.data.datasets import Source, Splits
from repro.core.data.loader import LoaderContext
from repro.core.data.samplers import EpochBatches
from repro.core.data.slots import Batch
from repro.core.data.sources import TensorImages, in_memory
from repro.core.data.transforms import Compose
from repro.core.errors import ConfigError
from repro.core.runtime.seeding import stream_seed


def _on_device(source: Source, transform: Compose, device: torch.device) -> TensorImages:
    held = in_memory(source)
    if held is None:
        raise ConfigError(
            "dataloader",
            "device",
            "needs an in-memory dataset (synthetic, cifar10, or image files with "
            "data.cache=memory); use dataloader=default or fast for image files",
        )
    if not transform.batchable:  # a resize or per-sample torchvision transforms
        raise ConfigError(
            "dataloader",
            "device",
            "crop, flip and Cutout only (no data.resize, no augment.transforms)",
        )
    # The labels stay on the host: `BatchMaker` picks a batch's there and sends them with it.
    return TensorImages(held.images.to(device), held.labels)


class DeviceTrainLoader:
    """Shuffled, augmented batches of a device-resident split, in the sampler's order."""

    def __init__(
        self,
        source: Source,
        transform: Compose,
        sampler: EpochBatches,
        augment_stream: int,
        device: torch.device,
    ) -> None:
        self.dataset = _on_device(source, transform, device)
        self.maker = BatchMaker(self.dataset, transform, augment_stream)
        self.sampler = sampler

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.sampler.set_epoch(epoch, start_batch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        for epoch, indices in self.sampler.index_batches():
            yield self.maker(indices, epoch)


class DeviceEvalLoader:
    """A device-resident split in stored order, pass after pass (`len` is one pass; rank r of
    `world` takes every world-th image)."""

    def __init__(
        self, source: Source, transform: Compose, batch_size: int, context: LoaderContext
    ) -> None:
        self.dataset = _on_device(source, transform, context.device)
        self.maker, self.batch_size = BatchMaker(self.dataset, transform), batch_size
        self.indices = torch.arange(context.rank, len(source), context.world)  # on the host

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            for chunk in self.indices.split(self.batch_size):
                yield self.maker(chunk)


def loaders(
    cfg: Any,
    data: Splits,
    pipelines: tuple[Compose, Compose],
    batch_size: int,
    context: LoaderContext,
) -> tuple[DeviceTrainLoader, EpochBatches, DeviceEvalLoader]:
    """The train loader, its sampler and the validation loader, as `build.loaders` returns them."""
    seed, rank, world = context.root_seed, context.rank, context.world
    sampler = EpochBatches(len(data.train), batch_size, seed, rank, world)
    if sampler.batches_per_epoch() == 0:
        allowed = f"at most the {len(data.train)} training images (over all ranks)"
        raise ConfigError("trainer.batch_size", cfg.trainer.batch_size, allowed)
    train_transform, eval_transform = pipelines
    augment = stream_seed(seed, "augment")
    train = DeviceTrainLoader(data.train, train_transform, sampler, augment, context.device)
    val = DeviceEvalLoader(data.val, eval_transform, cfg.trainer.eval_batch_size, context)
    return train, sampler, val
