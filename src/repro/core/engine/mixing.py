"""MixUp and CutMix on whole training batches, on the training device.

Every draw of a batch (which of the two, the mixing weight, the partner of each image, the
CutMix box) is a pure function of (seed, epoch, batch index, rank): the same whichever worker
made the batch and after any resume. The loss takes the soft targets as
`weight * CE(labels) + (1 - weight) * CE(partner labels)`, which equals cross-entropy against
the mixed one-hot targets (label smoothing included) and needs no one-hot tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from repro.core.runtime.seeding import stream_seed
from repro.core.runtime.transfer import host_to_device


@dataclass(frozen=True)
class Mixed:
    """A mixed batch: images, each image's labels and its partner's, and the weight of the
    image's own labels."""

    images: torch.Tensor
    labels: torch.Tensor
    partner_labels: torch.Tensor
    weight: float


class BatchMixer:
    """MixUp (`mixup_alpha` > 0), CutMix (`cutmix_alpha` > 0), or one of the two per batch."""

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, root_seed: int, rank: int = 0):
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.root_seed, self.rank = root_seed, rank

    @property
    def enabled(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, epoch: int, batch: int) -> Mixed:
        draws = np.random.default_rng(
            stream_seed(self.root_seed, "mix", epoch, batch, rank=self.rank)
        )
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or draws.random() < 0.5)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        weight = float(draws.beta(alpha, alpha))
        order = host_to_device(torch.from_numpy(draws.permutation(len(labels))), images.device)
        partners = images[order]
        if use_cutmix:
            images, weight = _paste_box(images, partners, weight, draws)
        else:
            images = images * weight + partners * (1 - weight)
        return Mixed(images, labels, labels[order], weight)


def _paste_box(
    images: torch.Tensor, partners: torch.Tensor, weight: float, draws: np.random.Generator
) -> tuple[torch.Tensor, float]:
    """Paste a box of the partners, of area (1 - weight) of the image around a uniform centre
    and clipped to it, and return the weight the clipped box leaves."""
    height, width = images.shape[-2:]
    cut = math.sqrt(1 - weight)
    box_h, box_w = round(height * cut), round(width * cut)
    centre_y, centre_x = int(draws.integers(height)), int(draws.integers(width))
    top, bottom = max(centre_y - box_h // 2, 0), min(centre_y + box_h // 2, height)
    left, right = max(centre_x - box_w // 2, 0), min(centre_x + box_w // 2, width)
    mixed = images.clone()
    mixed[..., top:bottom, left:right] = partners[..., top:bottom, left:right]
    return mixed, 1 - (bottom - top) * (right - left) / (height * width)
