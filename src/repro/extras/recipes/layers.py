"""Layers the fast CIFAR-10 networks share."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class Scale(nn.Module):
    """Multiplies by a fixed factor (the logits of a network trained with a high learning rate
    are scaled down)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class GlobalMaxPool(nn.Module):
    """(N, C, H, W) -> (N, C) through max_pool2d, whose backward sends each gradient to the
    one position its index names. Not `amax`, whose backward divides among the positions
    equal to the maximum: compiled in bf16 on a CPU (torch 2.15), after a GELU, it gave NaN
    gradients. Not AdaptiveMaxPool2d: its CUDA backward has no deterministic implementation,
    so it would fail under cudnn=deterministic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional.max_pool2d(x, x.shape[-2:]).flatten(1)
