"""ResNet-9 for 32x32 inputs (David Page's DAWNBench network): fast to train on CIFAR-10.

prep conv 64 -> conv 128, pool, residual(128) -> conv 256, pool -> conv 512, pool,
residual(512) -> global max-pool -> linear, with the logits scaled down (6.5M parameters).
"""

from __future__ import annotations

import torch
from torch import nn

from repro.extras.recipes.layers import GlobalMaxPool, Scale


def conv_bn(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*conv_bn(channels, channels), *conv_bn(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResNet9(nn.Sequential):
    def __init__(
        self,
        num_classes: int = 10,
        widths: tuple[int, int, int, int] = (64, 128, 256, 512),
        scale: float = 0.125,
    ) -> None:
        prep, first, second, third = widths
        # Built in the order the network is drawn: their weights are drawn in that order.
        stem = conv_bn(3, prep)
        layer1 = [*conv_bn(prep, first), nn.MaxPool2d(2), Residual(first)]
        layer2 = [*conv_bn(first, second), nn.MaxPool2d(2)]
        layer3 = [*conv_bn(second, third), nn.MaxPool2d(2), Residual(third)]
        head = [GlobalMaxPool(), nn.Linear(third, num_classes, bias=False), Scale(scale)]
        super().__init__(*stem, *layer1, *layer2, *layer3, *head)
