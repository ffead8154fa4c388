"""A small network for fast CIFAR-10 training, after the design of Keller Jordan's airbench:
a fixed first layer that whitens the 2x2 patches of the training images, three conv groups
whose batch norms learn shifts only, and a max-pooled linear head.

whiten (2x2, 24 filters, fixed) -> GELU -> group(64) -> group(256) -> group(256) ->
global max-pool -> linear, the logits scaled down (about 2M parameters). A group: conv,
max-pool, BN, GELU, conv, BN, GELU. Each 3x3 conv starts as the identity on its first input
channels (dirac), so that the untrained network passes its input through.

The whitening filters come from the data: the template calls `fit_to_data` with
`fit_images` training images drawn by the run's seed (normalised, not augmented) after
building the model. They are
part of the state dict, so a resumed or evaluated checkpoint does not fit them again.

`WhitenBiasFreeze`, a component of the loop, stops training the whitening layer's bias after
its first epochs, as airbench94 does after 3.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from repro.core.errors import ConfigError
from repro.extras.recipes.layers import GlobalMaxPool, Scale


class PatchWhitening(nn.Conv2d):
    """A fixed `size` x `size` conv whose filters are the eigenvectors of the training
    patches' second-moment matrix, each scaled by 1 / sqrt(its eigenvalue + eps), and their
    negatives: its outputs are decorrelated, unit-variance features of the patches (and,
    through a GELU, their positive and negative parts). Only the bias is trained."""

    def __init__(self, channels: int = 3, size: int = 2, eps: float = 5e-4) -> None:
        super().__init__(channels, 2 * channels * size * size, size, bias=True)
        self.weight.requires_grad_(False)
        self.eps = eps

    @torch.no_grad()
    def fit(self, images: torch.Tensor, chunk: int = 500) -> None:
        """Set the filters from normalised (N, C, H, W) images. In float64 on the CPU, so the
        same images give the same filters whatever device trains."""
        size = self.kernel_size[0]
        features = self.in_channels * size * size
        moment = torch.zeros(features, features, dtype=torch.float64)
        count = 0
        for start in range(0, len(images), chunk):  # a chunk's patches, not all of them, in memory
            part = images[start : start + chunk].to("cpu", torch.float64)
            patches = part.unfold(2, size, 1).unfold(3, size, 1)  # N, C, H', W', size, size
            flat = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, features)
            moment += flat.T @ flat
            count += len(flat)
        eigenvalues, eigenvectors = torch.linalg.eigh(moment / count)
        order = eigenvalues.argsort(descending=True)
        scaled = eigenvectors[:, order] / (eigenvalues[order] + self.eps).sqrt()
        filters = scaled.T.reshape(features, self.in_channels, size, size)
        self.weight.copy_(torch.cat([filters, -filters]).to(self.weight))


def conv(cin: int, cout: int) -> nn.Conv2d:
    layer = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
    with torch.no_grad():
        nn.init.dirac_(layer.weight[:cin])  # the first cin filters pass their channel through
    return layer


def norm(channels: int, momentum: float) -> nn.BatchNorm2d:
    """Batch norm with its scale fixed at 1: only the shift is learned."""
    layer = nn.BatchNorm2d(channels, momentum=momentum, eps=1e-12)
    layer.weight.requires_grad_(False)
    return layer


class ConvGroup(nn.Sequential):
    def __init__(self, cin: int, cout: int, momentum: float) -> None:
        first = (conv(cin, cout), nn.MaxPool2d(2), norm(cout, momentum), nn.GELU())
        super().__init__(*first, conv(cout, cout), norm(cout, momentum), nn.GELU())


class WhitenedCNN(nn.Sequential):
    def __init__(
        self,
        num_classes: int = 10,
        widths: tuple[int, int, int] = (64, 256, 256),
        bn_momentum: float = 0.4,
        scale: float = 1 / 9,
        fit_images: int = 5000,
    ) -> None:
        first, second, third = widths
        whiten = PatchWhitening()
        groups = (
            ConvGroup(whiten.out_channels, first, bn_momentum),
            ConvGroup(first, second, bn_momentum),
            ConvGroup(second, third, bn_momentum),
        )
        head = (GlobalMaxPool(), nn.Linear(third, num_classes, bias=False), Scale(scale))
        super().__init__(whiten, nn.GELU(), *groups, *head)
        self.fit_images = fit_images

    def fit_to_data(self, images: torch.Tensor) -> None:
        """Whiten the patches of `images`: normalised training images, not augmented."""
        self[0].fit(images)


class WhitenBiasFreeze:
    """A component of the loop (`components.whiten_bias`): the whitening layers' bias trains
    for the first `epochs` epochs, then is frozen (null: trained throughout).

    Frozen means `requires_grad` off, as airbench94 does: the bias then gets no gradient, so
    the optimizer skips it, momentum and weight decay included, and the backward pass stops
    before the whitening layer, which then needs no gradient at all (airbench's reason: faster
    steps, no loss of accuracy). Lookahead still pulls it towards its slow copy,
    as airbench's does. The position alone decides, so a resume freezes it again and the
    component keeps no state of its own."""

    def __init__(self, model: nn.Module, total_steps: int, epochs: int | None = 3) -> None:
        counted = isinstance(epochs, int) and not isinstance(epochs, bool) and epochs >= 0
        if epochs is not None and not counted:
            raise ValueError(f"epochs={epochs!r}: allowed: an integer >= 0, or null (never)")
        self.biases = [m.bias for m in model.modules() if isinstance(m, PatchWhitening)]
        if not self.biases:
            raise ValueError("the model has no PatchWhitening layer (model=whitened_cnn)")
        self.epochs = epochs

    def at_start(self, loop: Any) -> None:
        """As a component of the loop: a resumed run past the epochs freezes the bias again."""
        if self.epochs is not None and loop.dist.world > 1:
            # DDP expects a gradient for every parameter that required one when it wrapped
            # the model: one that stops getting it mid-run stops the run at the next step.
            allowed = "null under torchrun (DDP cannot drop a parameter mid-run)"
            raise ConfigError("components.whiten_bias.epochs", self.epochs, allowed)
        self.apply(loop.state.position.epoch)

    def after_step(self, loop: Any) -> None:
        self.apply(loop.state.position.epoch)

    def apply(self, epoch: int) -> None:
        """Train the bias in epoch `epoch` (0 is the first) only if it is one of the first."""
        trains = self.epochs is None or epoch < self.epochs
        for bias in self.biases:
            if bias.requires_grad != trains:
                bias.requires_grad_(trains)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: `at_start` freezes by the resumed position."""
