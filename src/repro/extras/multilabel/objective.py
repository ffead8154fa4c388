"""`objective=multilabel_bce`: binary cross-entropy over multi-hot targets."""

from __future__ import annotations

import torch
from torch.nn import functional

from repro.core.errors import ConfigError
from repro.core.tasks import MULTI_LABEL
from repro.core.tasks.objectives import TOTAL, Targets


class MultilabelBCE:
    """Binary cross-entropy of each label's sigmoid, summed over the labels, per image: for
    multi-hot targets (any number of labels per image). `pos_weight` weighs each label's
    positives against its negatives (one number for every label, or a list of one per label),
    for labels that are rare. Mixing blends the multi-hot rows, the loss being linear in them."""

    task = MULTI_LABEL
    mixes = True

    def __init__(self, pos_weight: float | list[float] | None = None) -> None:
        self.pos_weight = None if pos_weight is None else torch.tensor(pos_weight).float()
        if self.pos_weight is not None and (self.pos_weight <= 0).any():
            raise ConfigError("objective.pos_weight", pos_weight, "null or positive numbers")

    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]:
        weight = self.pos_weight
        if weight is not None:
            if weight.dim() and len(weight) != logits.shape[1]:
                allowed = f"one number, or one per label ({logits.shape[1]})"
                raise ConfigError("objective.pos_weight", weight.tolist(), allowed)
            weight = weight.to(logits.device)

        def loss_of(labels: torch.Tensor) -> torch.Tensor:
            return functional.binary_cross_entropy_with_logits(
                logits.float(), labels.float(), pos_weight=weight, reduction="none"
            ).sum(1)

        return {TOTAL: targets.mixed(loss_of)}
