"""suite=data: the data path alone, without a model, against a bare reference.

Per loader (DataLoader workers 0, 2 ..., or `device`), batches per second of:

- template: the training batches as the loop receives them: the template's loader (built by
  `build.loaders`, as training builds it) followed by its `to_device` (copy and normalise);
- bare: the same work written plainly in this file: a padded copy of the training images made
  once; per batch, one generator seeded with the batch number draws every crop corner and flip
  at once (no per-sample keys), then one gather, a flip, and the same normalisation. For worker
  rows it runs in a plain DataLoader with that many workers; for `device`, on the device.

`data_over_bare` = template rate / bare rate; 1.0 means keying every sample's draws on its own
(seed, epoch, index), which is what makes the batches independent of the workers, costs
nothing. Template and bare alternate (A B B A ...) so that drift in the machine hits both, and
the figure is the median of the repetitions' ratios.

With `data=imagefolder` the suite compares the template with torchvision's own loader instead
(`folder_data.py`); with `data=shards`, shards with the same images as an image folder
(`shard_data.py`).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from benchmarks import common, folder_data, shard_data
from benchmarks.common import Column, Result
from repro.core import build
from repro.core.data.loader import Batches, LoaderContext
from repro.core.data.samplers import EpochBatches
from repro.core.data.sources import in_memory
from repro.core.runtime.devices import select_device, use_pinned_memory
from repro.core.runtime.transfer import DeviceBatches

COLUMNS = [
    Column("loader", "loader"),
    Column("template_batches_per_s", "template batches/s", "{:.1f}"),
    Column("bare_batches_per_s", "bare batches/s", "{:.1f}"),
    Column("data_over_bare", "template / bare", "{:.3f}"),
]


class BareBatches(Dataset):
    """Random crop and flip of whole batches, with one generator per batch: one gather of
    image rows from a padded copy of the images stored beside its mirror image."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, size: int, pad: int) -> None:
        count, channels, height, width = images.shape
        padded = images.new_zeros((count, channels, height + 2 * pad, width + 2 * pad))
        padded[:, :, pad : pad + height, pad : pad + width] = images
        self.rows = torch.stack([padded, padded.flip(-1)]).view(-1).unfold(0, size, 1)
        self.shape, self.size, self.labels = padded.shape, size, labels
        self.normalise: DeviceBatches | None = None  # on CPU, as the template's workers do

    def __len__(self) -> int:
        return len(self.labels)

    def __getitems__(self, batch: list[tuple[int, torch.Tensor]]) -> Any:
        ((number, indices),) = batch
        return self.make(number, indices)

    def make(self, number: int, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device, (count, channels, height, width) = self.rows.device, self.shape
        draw = torch.Generator(device).manual_seed(number)
        corners = height - self.size + 1
        top, left = torch.randint(
            0, corners, (2, len(indices), 1, 1), generator=draw, device=device
        )
        flip = torch.randint(0, 2, (len(indices), 1, 1), generator=draw, device=device)
        indices = indices.to(device)
        # Row r of channel c of the crop at (top, left) of image i (or of its mirror).
        image = (flip * count + indices.view(-1, 1, 1)) * channels
        channel = torch.arange(channels, device=device).view(1, -1, 1)
        row = torch.arange(self.size, device=device).view(1, 1, -1)
        start = ((image + channel) * height + top + row) * width + left
        images = self.rows.index_select(0, start.view(-1)).view(len(indices), channels, -1)
        images = images.view(len(indices), channels, self.size, self.size)
        labels = self.labels[indices]
        return self.normalise(images, labels) if self.normalise else (images, labels)


def bare_source(
    bare: BareBatches, sampler: EpochBatches, workers: int | None, pin: bool
) -> Iterator:
    """Bare batches of the sampler's indices, numbered in order: through a DataLoader with
    `workers` processes, or made directly where they are used (None, as `device` does)."""

    def numbered() -> Iterator[list[tuple[int, torch.Tensor]]]:
        number, epoch = 0, 0
        while True:
            sampler.set_epoch(epoch)
            for keys in sampler:
                yield [(number, torch.tensor([index for _, index in keys]))]
                number += 1
            epoch += 1

    if workers is None:
        return (bare.make(*batch[0]) for batch in numbered())
    loader = DataLoader(
        bare,
        batch_sampler=numbered(),
        num_workers=workers,
        pin_memory=pin,
        collate_fn=lambda made: made,
    )
    return Batches(loader)


def rate(source: Iterator, to_device: Any, count: int, clock: common.Clock) -> float:
    """Batches per second over `count` batches, as the loop takes them."""
    clock.sync()
    started = time.perf_counter()
    for _ in range(count):
        to_device(*next(source))
    clock.sync()
    return count / (time.perf_counter() - started)


def row_config(cfg: DictConfig, loader: Any) -> DictConfig:
    cfg = copy.deepcopy(cfg)
    cfg.dataloader.on_device = loader == "device"
    cfg.dataloader.num_workers = 0 if loader == "device" else int(loader)
    return cfg


def measure(cfg: DictConfig, data: Any, loader: Any, suite: Any) -> dict[str, Any]:
    device = select_device(cfg.trainer.device)
    seed = int(cfg.seed.value)
    pin = use_pinned_memory(cfg.dataloader.pin_memory, device) and loader != "device"
    train, sampler, _ = build.loaders(cfg, data, LoaderContext(seed, device=device, pin_memory=pin))
    to_device = build.device_batches(cfg, device)
    on = device if loader == "device" else torch.device("cpu")
    images, labels = data.train.images.to(on), data.train.labels.to(on)
    bare = BareBatches(images, labels, cfg.data.image_size, cfg.data.crop_padding)
    workers = None if loader == "device" else int(loader)
    if device.type == "cpu" and workers:
        bare.normalise = to_device  # on a CPU the template's workers normalise too
    bare_sampler = EpochBatches(len(data.train), sampler.batch_size, seed)
    template = common.endless(train, sampler)
    plain = bare_source(bare, bare_sampler, workers, pin)
    clock = common.Clock(device)
    try:
        rate(template, to_device, suite.warmup_batches, clock)
        rate(plain, to_device, suite.warmup_batches, clock)
        template_rates, bare_rates = [], []
        for repeat in range(suite.repeats):  # A B, then B A: drift hits both sides alike
            sides = [(template, template_rates), (plain, bare_rates)]
            for source, rates in sides if repeat % 2 == 0 else sides[::-1]:
                rates.append(rate(source, to_device, suite.batches, clock))
    finally:
        template.close(), plain.close()  # the workers stop before the next row is timed
    ratios = [t / b for t, b in zip(template_rates, bare_rates, strict=True)]
    return {
        "loader": loader,
        "template_batches_per_s": statistics.median(template_rates),
        "bare_batches_per_s": statistics.median(bare_rates),
        "data_over_bare": statistics.median(ratios),  # of each repetition's pair
    }


def run(cfg: DictConfig, run_dir: Path) -> Result:
    data = build.splits(cfg, int(cfg.seed.value))
    if hasattr(data.train, "epoch_order"):  # shards: against the same images as a folder
        return shard_data.run(cfg, run_dir, data)
    if in_memory(data.train) is None:  # files: the template against torchvision's loader
        return folder_data.run(cfg, run_dir)
    suite = cfg.suite
    device = select_device(cfg.trainer.device)
    rows = [measure(row_config(cfg, loader), data, loader, suite) for loader in suite.loaders]
    summary = {
        "device": str(device),
        "batch_size": int(cfg.trainer.batch_size),
        "data_over_bare": {str(row["loader"]): row["data_over_bare"] for row in rows},
    }
    notes = [
        f"rates: medians of {suite.repeats} alternating repetitions of {suite.batches} batches "
        f"(template / bare: the median of the repetitions' ratios), after "
        f"{suite.warmup_batches} untimed; a batch is timed up to the loop's normalised input"
    ]
    return Result("data", COLUMNS, rows, summary, notes)
