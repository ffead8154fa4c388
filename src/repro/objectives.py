"""What training minimises: the `objective` config group.

An objective is any callable `objective(logits, targets) -> dict[str, Tensor]` named by
`_target_`. The dict holds the total under "loss" and, besides it, any named terms worth
watching (a penalty, an auxiliary loss). Each value is either one number per image (shape
`[batch]`: preferred, since evaluation sums those in float64 and its figures then do not depend
on how the images were batched or sharded) or one number for the batch (0-d). The training
steps (plain and world-invariant) take each value's mean over the batch; evaluation calls the
same objective, so `val_<name>` and `train_<name>` measure one thing. Every name becomes a
`train_<name>` and a `val_<name>` column of metrics.csv, a tracker metric and a metric the
sweep report summarises.

MixUp and CutMix reach the objective as `Targets` with partner labels and a weight:
`targets.mixed(loss_of)` applies a per-label loss to both and blends them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.nn import functional

from repro.errors import ConfigError

TOTAL = "loss"  # the key of the total the optimizer follows
RESERVED = ("acc", "confusion")  # names evaluation gives its own results


@dataclass(frozen=True)
class Targets:
    """What the images of a batch should be classified as: their labels; with MixUp/CutMix
    also each image's partner's labels and the share (`weight`) of the image's own."""

    labels: torch.Tensor
    partners: torch.Tensor | None = None
    weight: float = 1.0

    def mixed(self, loss_of: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """`loss_of(labels)`, or with a partner, `weight * loss_of(labels) + (1 - weight) *
        loss_of(partners)`: for cross-entropy, the loss against the blended one-hot targets."""
        own = loss_of(self.labels)
        if self.partners is None:
            return own
        return own * self.weight + loss_of(self.partners) * (1 - self.weight)

    def chunk(self, pieces: int) -> list[Targets]:
        """The targets of `pieces` consecutive micro-batches, as `Tensor.chunk` cuts images."""
        labels = self.labels.chunk(pieces)
        partners = (
            self.partners.chunk(pieces) if self.partners is not None else [None] * len(labels)
        )
        return [
            Targets(own, other, self.weight) for own, other in zip(labels, partners, strict=True)
        ]


class Objective(Protocol):
    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]: ...


class CrossEntropy:
    """Cross-entropy with optional label smoothing, per image: the template's default."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = float(label_smoothing)

    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]:
        def loss_of(labels: torch.Tensor) -> torch.Tensor:
            return functional.cross_entropy(
                logits, labels, label_smoothing=self.label_smoothing, reduction="none"
            )

        return {TOTAL: targets.mixed(loss_of)}


def batch_means(terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each term as one number for the batch: per-image values averaged, 0-d ones as they are."""
    return {name: value.mean() if value.dim() else value for name, value in terms.items()}


def batch_sums(terms: dict[str, torch.Tensor], images: int) -> dict[str, torch.Tensor]:
    """Each term summed over the batch in float64 (a 0-d batch value counts once per image),
    for evaluation's means over a whole split."""
    return {
        name: value.double().sum() if value.dim() else value.double() * images
        for name, value in terms.items()
    }


class Checked:
    """An objective whose first result is checked (`check_terms`): a user's objective that
    returns the wrong thing fails in one line at the first step, not deep in the loop."""

    def __init__(self, objective: Objective, target: str) -> None:
        self.objective, self.target, self.unchecked = objective, target, True

    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]:
        terms = self.objective(logits, targets)
        if self.unchecked:
            check_terms(terms, len(targets.labels), self.target)
            self.unchecked = False
        return terms


def check_terms(terms: Any, images: int, target: str) -> None:
    """Raise a ConfigError naming what is wrong with an objective's result, if anything."""
    key = "objective._target_"
    if not isinstance(terms, dict) or TOTAL not in terms:
        raise ConfigError(key, target, f'must return a dict of tensors holding "{TOTAL}"')
    for name, value in terms.items():
        if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
            allowed = f"term names that are identifiers other than {', '.join(RESERVED)}"
            raise ConfigError(key, target, f"returned the term {name!r}; use {allowed}")
        if not isinstance(value, torch.Tensor) or value.shape not in ((), (images,)):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            allowed = f"a tensor of shape ({images},) (per image) or () (per batch)"
            raise ConfigError(key, target, f"returned {name!r} as {shape}; use {allowed}")


def column(prefix: str, name: str) -> str:
    """A term's column in metrics.csv: `train_loss`, `val_logit_penalty` ..."""
    return f"{prefix}_{name}"
