"""suite=data on an image folder (`data=imagefolder`): the template's training loader against
a plain torchvision one, written here.

Per row (a worker count, with `data.cache` none or memory), images per second of:

- template: the training batches as the loop receives them (`build.loaders`, then
  `to_device`: normalised floats);
- torchvision: `torchvision.datasets.ImageFolder` with a `transforms.v2` pipeline doing the
  same work per sample (decode, resize, padded random crop, flip, scale and normalise) and a
  `DataLoader` with the same workers and batch size.

`data_over_torchvision` = template rate / torchvision rate, the median of alternating (A B B A)
repetitions' ratios. The cached rows include nothing of the one-off decoding (timed apart,
`decode_s`).
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.transforms import v2

from benchmarks import common
from benchmarks.common import Column, Result
from repro.core import build
from repro.core.data.loader import Batches, LoaderContext
from repro.core.runtime.devices import select_device

COLUMNS = [
    Column("loader", "workers"),
    Column("cache", "data.cache"),
    Column("template_images_per_s", "template images/s", "{:.0f}"),
    Column("torchvision_images_per_s", "torchvision images/s", "{:.0f}"),
    Column("data_over_torchvision", "template / torchvision", "{:.2f}"),
    Column("decode_s", "decode s", "{:.1f}"),
]


def torchvision_loader(cfg: DictConfig, workers: int) -> DataLoader:
    """The plain torchvision way to read the same training images with the same augmentation."""
    data = cfg.data
    steps: list[Any] = [v2.ToImage()]
    mode = cfg.augment.crop_padding_mode if "augment" in cfg else "zeros"
    padding_mode = {"zeros": "constant"}.get(mode, mode)  # reflect and edge: the same names
    if data.resize is not None:
        steps.append(v2.Resize(data.resize, antialias=True))
    steps += [
        v2.RandomCrop(data.image_size, padding=data.crop_padding, padding_mode=padding_mode),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(data.mean), list(data.std)),
    ]
    folder = datasets.ImageFolder(str(Path(data.root) / "train"), transform=v2.Compose(steps))
    return DataLoader(
        folder, batch_size=int(cfg.trainer.batch_size), shuffle=True, num_workers=workers,
        drop_last=True, persistent_workers=workers > 0,
    )  # fmt: skip


def images_per_s(batches: Any, to_device: Any, count: int) -> float:
    started = time.perf_counter()
    images = 0
    for _ in range(count):
        images += len(to_device(*next(batches))[1])
    return images / (time.perf_counter() - started)


def measure(cfg: DictConfig, workers: int, cache: str, suite: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    cfg.dataloader.num_workers, cfg.dataloader.on_device, cfg.data.cache = workers, False, cache
    device = select_device(cfg.trainer.device)
    seed = int(cfg.seed.value)
    started = time.perf_counter()
    data = build.splits(cfg, seed)
    decode_s = time.perf_counter() - started if cache == "memory" else None
    train, sampler, _ = build.loaders(cfg, data, LoaderContext(seed, device=device))
    to_device = build.device_batches(cfg, device)
    template = common.endless(train, sampler)
    stream = _forever(torchvision_loader(cfg, workers))
    plain = Batches(stream)
    try:
        images_per_s(template, to_device, suite.warmup_batches)
        images_per_s(plain, _identity, suite.warmup_batches)
        template_rates, plain_rates = [], []
        for repeat in range(suite.repeats):
            sides = [(template, to_device, template_rates), (plain, _identity, plain_rates)]
            for source, prepare, rates in sides if repeat % 2 == 0 else sides[::-1]:
                rates.append(images_per_s(source, prepare, suite.batches))
    finally:
        template.close(), stream.close()  # the workers stop before the next row
    ratios = [t / p for t, p in zip(template_rates, plain_rates, strict=True)]
    return {
        "loader": workers,
        "cache": cache,
        "template_images_per_s": statistics.median(template_rates),
        "torchvision_images_per_s": statistics.median(plain_rates),
        "data_over_torchvision": statistics.median(ratios),
        "decode_s": decode_s,
    }


def _forever(loader: DataLoader) -> Any:
    while True:
        yield from loader


def _identity(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return images, labels


def run(cfg: DictConfig, run_dir: Path) -> Result:
    suite = cfg.suite
    workers = [loader for loader in suite.loaders if loader != "device"]
    rows = [measure(cfg, count, cache, suite) for cache in ("none", "memory") for count in workers]
    summary = {
        "device": str(select_device(cfg.trainer.device)),
        "batch_size": int(cfg.trainer.batch_size),
        "data_over_torchvision": {
            f"{row['loader']}/{row['cache']}": row["data_over_torchvision"] for row in rows
        },
    }
    notes = [
        f"{cfg.data.root}/train; rates: medians of {suite.repeats} alternating repetitions of "
        f"{suite.batches} batches after {suite.warmup_batches} untimed; template batches "
        "timed up to the loop's normalised input, torchvision's as its DataLoader gives them"
    ]
    return Result("data", COLUMNS, rows, summary, notes)
