"""A model (conf/model/): any torch nn.Module the config builds; the engine seeds its weights.

Patches of the image embedded by one strided convolution, mixed by two depthwise-separable
blocks, pooled, then a linear head: a small network of a different shape from the engine's."""

from __future__ import annotations

import torch
from torch import nn


class PatchMixer(nn.Module):
    def __init__(self, num_classes: int, width: int = 48, patch: int = 4, blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Conv2d(3, width, patch, stride=patch), nn.BatchNorm2d(width))
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(width, width, 3, padding=1, groups=width),  # mixes positions
                nn.Conv2d(width, width, 1),  # mixes channels
                nn.BatchNorm2d(width),
                nn.GELU(),
            )
            for _ in range(blocks)
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.embed(images)
        for block in self.blocks:
            features = features + block(features)  # residual: each block refines
        return self.head(features.mean(dim=(2, 3)))
