"""An objective term: cross-entropy plus a penalty on large logits (conf/objective/).

Every value is per image (shape [batch]) so that evaluation's sums do not depend on batching;
each name becomes a train_<name> and val_<name> column of metrics.csv."""

from __future__ import annotations

import torch
from repro.api import CrossEntropy, Targets


class LogitPenalty(CrossEntropy):
    """Cross-entropy plus `weight` times each image's mean squared logit."""

    def __init__(self, weight: float = 0.1, label_smoothing: float = 0.0) -> None:
        super().__init__(label_smoothing)
        self.weight = weight

    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]:
        cross_entropy = super().__call__(logits, targets)["loss"]  # MixUp/CutMix included
        penalty = logits.float().pow(2).mean(dim=1)
        total = cross_entropy + self.weight * penalty
        return {"loss": total, "cross_entropy": cross_entropy, "logit_penalty": penalty}
