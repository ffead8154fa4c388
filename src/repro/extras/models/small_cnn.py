"""A small, fast CNN: the default model, trains to >90% on the synthetic set in a minute on CPU."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def conv_bn_relu(cin: int, cout: int, stride: int, batchnorm: bool = True) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=not batchnorm)
    return [conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True)] if batchnorm else [conv, nn.ReLU()]


class SmallCNN(nn.Sequential):
    """conv-BN-ReLU stages, each after the first halving the resolution, then a linear head.
    `batchnorm=False`: conv (with bias)-ReLU, for checks where a batch's statistics must not
    depend on how it is split (gradient accumulation)."""

    def __init__(
        self,
        num_classes: int = 10,
        widths: Sequence[int] = (16, 32, 64, 128),
        dropout: float = 0.0,
        batchnorm: bool = True,
    ) -> None:
        layers: list[nn.Module] = []
        cin = 3
        for stage, width in enumerate(widths):
            layers += conv_bn_relu(cin, width, stride=1 if stage == 0 else 2, batchnorm=batchnorm)
            cin = width
        layers += [
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(cin, num_classes),
        ]
        super().__init__(*layers)
