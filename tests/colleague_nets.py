"""Models this checkout's conf/ does not name: a colleague's, for the trust and export tests."""

import torch
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


class _Spectrum(nn.Module):
    """(N, C, K) features -> the C eigenvalues of each image's C x C Gram matrix."""

    def forward(self, features):
        return torch.linalg.eigvalsh(features @ features.transpose(1, 2))


def spectral_net(num_classes: int) -> nn.Module:
    """Trains, but uses an operation ONNX has no operator for (an eigen-decomposition)."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(2), nn.Flatten(2), _Spectrum(),
        nn.Linear(4, num_classes),
    )  # fmt: skip


class CountingObjective:
    """Cross-entropy scaled by its call count modulo 3: an objective with state, which it
    saves and restores as a callback does."""

    def __init__(self) -> None:
        from repro.core.tasks.objectives import CrossEntropy

        self.cross_entropy, self.calls = CrossEntropy(0.0), 0

    def __call__(self, logits: torch.Tensor, targets) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"loss": self.cross_entropy(logits, targets)["loss"] * (1 + self.calls % 3)}

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]
