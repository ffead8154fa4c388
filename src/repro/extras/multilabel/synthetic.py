"""`data=synthetic_multilabel`: four of the synthetic shapes in every image, nothing to download.

Each 32x32 image is a 2x2 grid of the template's synthetic shapes, each shrunk to 16x16 (the
mean of 2x2 pixels, in integers: the same bytes on every machine); its target is the multi-hot
row of the classes it shows (1 to 4 of them: a class drawn twice counts once). The pixels come
from `data.generator_seed` alone; the run's seed only picks the validation split.
"""

from __future__ import annotations

from typing import Any

import torch

from repro.core.data import synthetic as shapes
from repro.core.data.datasets import Splits, carve_validation
from repro.core.data.sources import TensorImages
from repro.core.errors import ConfigError

PER_IMAGE = 4  # shapes, in a 2x2 grid


def generate(count: int, seed: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` images, uint8 (count, 3, 32, 32), and their float32 multi-hot rows."""
    tiles, labels = shapes.generate(count * PER_IMAGE, seed, classes)
    half = shapes.SIZE // 2
    sums = tiles.view(-1, 3, half, 2, half, 2).to(torch.int32).sum((3, 5))
    small = ((sums + 2) // 4).to(torch.uint8)  # the rounded mean of each 2x2 block
    grid = small.view(count, 2, 2, 3, half, half).permute(0, 3, 1, 4, 2, 5)
    images = grid.reshape(count, 3, shapes.SIZE, shapes.SIZE).contiguous()
    targets = torch.zeros(count, classes, dtype=torch.float32)
    targets[torch.arange(count).repeat_interleave(PER_IMAGE), labels] = 1.0
    return images, targets


def synthetic_multilabel(cfg: Any, split_seed: int) -> Splits:
    """The shapes' grids: train and validation from one pool, a test set of their own."""
    classes = cfg.num_classes
    if classes is None or not 2 <= classes <= len(shapes.CLASSES):
        allowed = f"2..{len(shapes.CLASSES)} for synthetic_multilabel"
        raise ConfigError("data.num_classes", classes, allowed)
    pool = TensorImages(*generate(cfg.train_size + cfg.val_size, cfg.generator_seed, classes))
    test = TensorImages(*generate(cfg.test_size, cfg.generator_seed + 1_000_003, classes))
    train, val = carve_validation(pool, cfg.val_size, split_seed)
    return Splits(train, val, test, list(shapes.CLASSES[:classes]))
