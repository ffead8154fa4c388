"""A dataset of your own: stripes at one of `num_classes` angles, drawn from a fixed seed.

The angles run from 0 to 90 degrees: a horizontal flip (the default augmentation) turns an
angle a into 180 - a, which is then no other class's angle, so flipped images stay learnable
(angles spread over 0-180 would make 30 and 150 degrees, say, one picture).

conf/data/stripes.yaml names this builder by `_target_`. A dataset gives the same item for the
same index in every call and every process: the images are drawn once, here, from
`data.generator_seed`; the run's seed only picks the validation split. `noise` is a setting of
its own, a keyword argument the engine checks and records like any data key.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from repro.api import ConfigError, Splits, TensorImages, carve_validation


def stripes(cfg: Any, seed: int, *, noise: float = 0.1) -> Splits:
    """Gray stripes, one angle in [0, 90] degrees per class, each image with its own phase and
    pixel noise."""
    if not 0 <= noise <= 1:  # one line before any data is made, naming the key
        raise ConfigError("data.noise", noise, "a number from 0 to 1")

    def split(size: int, offset: int) -> TensorImages:
        generator = torch.Generator().manual_seed(cfg.generator_seed + offset)
        labels = torch.randint(cfg.num_classes, (size,), generator=generator)
        angle = labels.float() * (math.pi / 2) / max(cfg.num_classes - 1, 1)
        phase = torch.rand(size, generator=generator) * 2 * math.pi
        axis = torch.arange(cfg.image_size, dtype=torch.float32)
        y, x = torch.meshgrid(axis, axis, indexing="ij")
        along = x * angle.cos()[:, None, None] + y * angle.sin()[:, None, None]  # [N, H, W]
        wave = (0.8 * along + phase[:, None, None]).sin()
        wave = wave + noise * torch.randn(wave.shape, generator=generator)
        gray = ((wave.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return TensorImages(gray[:, None].expand(-1, 3, -1, -1).contiguous(), labels)

    train, val = carve_validation(split(cfg.train_size + cfg.val_size, 0), cfg.val_size, seed)
    classes = [f"{90 * k // max(cfg.num_classes - 1, 1)}deg" for k in range(cfg.num_classes)]
    return Splits(train, val, split(cfg.test_size, 1), classes)
