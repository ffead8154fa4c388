"""A model this checkout's conf/ does not name: a colleague's, for the trust tests."""

from torch import nn


def tiny_net(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, num_classes),
    )  # fmt: skip


def dropout_net(num_classes: int) -> nn.Module:
    """Draws from torch's global generator every training step: a resume must restore it."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Dropout(0.5), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, num_classes),
    )  # fmt: skip
