"""A data option for the tests: the synthetic shapes with soft labels (0.9 on the class, the
rest spread evenly), named as `data._target_=soft_data.soft_synthetic` with tests/ on the path."""

from __future__ import annotations

from typing import Any

import torch

from repro.core.data.datasets import Splits, synthetic
from repro.core.data.sources import TensorImages


def soft_synthetic(cfg: Any, seed: int) -> Splits:
    splits = synthetic(cfg, seed)
    classes = len(splits.classes)

    def soft(source: TensorImages) -> TensorImages:
        rows = torch.full((len(source), classes), 0.1 / (classes - 1))
        rows[torch.arange(len(source)), source.labels] = 0.9
        return TensorImages(source.images, rows)

    return Splits(soft(splits.train), soft(splits.val), soft(splits.test), splits.classes)
