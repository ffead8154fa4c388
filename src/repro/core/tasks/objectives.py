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

A target is what the dataset gives: a class index, a vector of class probabilities (soft
labels), a multi-hot vector, or another tensor. An objective says which by its `task`
(repro.core.tasks: `SINGLE_LABEL` unless it declares another), and the task decides what
evaluation computes from the logits, the accuracy, the metrics and the monitored value.

MixUp and CutMix reach the objective as `Targets` with partner labels and a weight:
`targets.mixed(loss_of)` applies a per-label loss to both and blends them. That blend is the
loss against the blended targets only for a loss linear in its target (cross-entropy, binary
cross-entropy); an objective of another task than single-label says so with `mixes = True`,
or mixing is refused before the run starts.

An objective that needs more (distillation needs a teacher's logits for the same images) takes
a third argument, a `Batch`: the images the logits came from, the model that made them, the
run's components by name (a teacher is one) and whether it is training. Every caller passes it
alike: both training steps (each micro-batch its own images), evaluation (with TTA, the images
before flipping; the logits are the flips' mean) and the test after training.

An objective that keeps state between calls (a running scale, a count) gives it through
`state_dict()` and takes it back in `load_state_dict(state)`, as a callback does: checkpoints
carry it under "objective", so a resumed run goes on as a straight one would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional

from repro.core import tasks
from repro.core.errors import ConfigError
from repro.core.tasks import SINGLE_LABEL

TOTAL = "loss"  # the key of the total the optimizer follows
RESERVED = ("acc", "confusion", "map")  # names evaluation gives its own results


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


@dataclass(frozen=True)
class Batch:
    """What an objective taking a third argument gets besides logits and targets."""

    images: torch.Tensor  # as the model saw them: mixed, in its memory format, on its device
    model: nn.Module  # the model whose logits these are (without DDP's wrapper; in evaluation,
    # the one evaluated: the weight average for ema_val_ columns)
    components: Mapping[str, Any]  # the run's `components` by name; empty in repro.evaluate
    training: bool  # False in evaluation: no gradient is taken

    def component(self, name: str) -> Any:
        """The component `name`; one line naming what to add when the run has none."""
        if name not in self.components:
            allowed = f"a component named {name}: add +components.{name}._target_=..."
            raise ConfigError(f"components.{name}", None, allowed)
        return self.components[name]


class Objective(Protocol):
    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]: ...


class CrossEntropy:
    """Cross-entropy with optional label smoothing, per image: the template's default. Targets
    are class indices, or class probabilities (soft labels: a float row per image)."""

    task = SINGLE_LABEL
    mixes = True

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = float(label_smoothing)

    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]:
        def loss_of(labels: torch.Tensor) -> torch.Tensor:
            inputs = logits
            if labels.is_floating_point():  # class probabilities: compared in float32
                inputs, labels = logits.float(), labels.float()
            return functional.cross_entropy(
                inputs, labels, label_smoothing=self.label_smoothing, reduction="none"
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
    """An objective as the loop calls it: with a `Batch` if it takes one, and its first result
    checked (`check_terms`), so that a user's objective that returns the wrong thing fails in
    one line at the first step, not deep in the loop."""

    def __init__(self, objective: Objective, target: str) -> None:
        self.objective, self.target, self.unchecked = objective, target, True
        self.takes_batch = _takes_batch(objective)
        self.task = tasks.of(objective)
        self.components: Mapping[str, Any] = {}  # the run's, once built (engine/assembly)

    def __call__(
        self, logits: torch.Tensor, targets: Targets, images: torch.Tensor, model: nn.Module
    ) -> dict[str, torch.Tensor]:
        if self.takes_batch:
            batch = Batch(images, model, self.components, model.training)
            terms = self.objective(logits, targets, batch)  # type: ignore[call-arg]
        else:
            terms = self.objective(logits, targets)
        if self.unchecked:
            check_terms(terms, len(targets.labels), self.target)
            self.unchecked = False
        return terms

    def state(self) -> dict[str, Any] | None:
        """The objective's own state (its `state_dict()`); None for one that keeps none."""
        saver = getattr(self.objective, "state_dict", None)
        return saver() if callable(saver) else None

    def restore(self, state: dict[str, Any]) -> None:
        loader = getattr(self.objective, "load_state_dict", None)
        if callable(loader):
            loader(state)


def checked(objective: Objective | Checked) -> Checked:
    """`objective` as the loop calls it (one the template built is already)."""
    if isinstance(objective, Checked):
        return objective
    return Checked(objective, getattr(objective, "__qualname__", type(objective).__name__))


def _takes_batch(objective: Any) -> bool:
    """Whether the objective's call takes a third positional argument (the `Batch`)."""
    try:
        parameters = inspect.signature(objective).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the two-argument form
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return True
    return sum(p.kind in positional for p in parameters) >= 3


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
