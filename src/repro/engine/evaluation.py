"""Evaluation: the objective's terms and the accuracy of a model over a split, optionally with
test-time augmentation (flips, and one-pixel shifts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from repro.objectives import (
    TOTAL,
    CrossEntropy,
    Objective,
    Targets,
    batch_sums,
    checked,
    column,
)
from repro.runtime import distributed
from repro.watch.scores import Scores


def predict(model: nn.Module, images: torch.Tensor, tta: str = "none") -> torch.Tensor:
    """Float32 logits of `images`. With `tta="flip"`, the mean of the logits of each image
    and of its mirror image (left-right), as fast CIFAR-10 training evaluates; with
    `"flip_translate"`, half that and half the same mean over two copies shifted by one pixel
    (up and left, down and right; the edge reflected in), as airbench evaluates."""
    if tta == "none":
        return model(images).float()
    logits = _with_mirror(model, images)
    if tta == "flip_translate":
        padded = functional.pad(images, (1, 1, 1, 1), mode="reflect")
        height, width = images.shape[-2:]
        shifted = [padded[..., :height, :width], padded[..., 2:, 2:]]
        moved = (_with_mirror(model, shifted[0]) + _with_mirror(model, shifted[1])) / 2
        logits = (logits + moved) / 2
    return logits


def _with_mirror(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    return (model(images).float() + model(images.flip(-1)).float()) / 2


@dataclass
class Predictions:
    """This rank's labels and predicted classes of one evaluation pass, left on the device."""

    labels: list[torch.Tensor] = field(default_factory=list)
    predicted: list[torch.Tensor] = field(default_factory=list)
    dist: distributed.Context | None = None

    def confusion(self, classes: int) -> torch.Tensor:
        """The confusion matrix over every rank's shard (rows: true class, columns: predicted),
        counted on the host, once: a GPU's scatter-add has no deterministic kernel. Under
        torchrun every rank must call it (a sum over ranks)."""
        if not self.labels:
            counts = torch.zeros(classes, classes, dtype=torch.int64)
        else:
            pairs = torch.cat(self.labels).cpu() * classes + torch.cat(self.predicted).cpu()
            counts = torch.bincount(pairs, minlength=classes * classes).view(classes, classes)
        return distributed.sum_tensor(counts, self.dist) if self.dist is not None else counts


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    prepare: Callable[[torch.Tensor], torch.Tensor],
    autocast: Callable[[], AbstractContextManager[None]],
    dist: distributed.Context | None = None,
    tta: str = "none",
    classes: int | None = None,
    objective: Objective | None = None,
    keep_predictions: bool = False,
    scores: Scores | None = None,
) -> dict[str, Any]:
    """The mean of each of the objective's terms (plain cross-entropy without one) under its
    name ("loss" the total), and the accuracy ("acc"), over `batches` (summed over torchrun
    ranks, each of which evaluates its own shard), of the logits `predict` gives with `tta`;
    with `classes`, also the confusion matrix (rows: true class, columns: predicted); with
    `keep_predictions`, the pass's `Predictions` under "predictions"; with `scores` (the
    `metrics` group), the metrics' results (`Scores.results`)."""
    objective = checked(objective or CrossEntropy())
    was_training = model.training
    model.eval()
    # Sums stay on the device until the end (a read per batch would wait for the GPU each
    # time), and start there: a host scalar copied in would wait too.
    device = next(model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    correct = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    kept = Predictions(dist=dist)
    scored: list[tuple[torch.Tensor, torch.Tensor]] = []  # scored after the pass: see Scores
    for images, labels in batches:
        images, labels = to_device(images, labels)
        images = prepare(images)
        with autocast():
            logits = predict(model, images, tta)
        # Per-image terms summed in float64: the totals do not depend on how the images were
        # batched (or sharded over ranks) beyond the logits' own last bits.
        terms = objective(logits, Targets(labels), images, model)
        for name, total in batch_sums(terms, len(labels)).items():
            sums[name] = sums[name] + total if name in sums else total
        predicted = logits.argmax(1)
        correct += (predicted == labels).sum().double()
        count += len(labels)
        if scores is not None:
            scored.append((logits, labels))
        if classes is not None or keep_predictions:
            kept.labels.append(labels)
            kept.predicted.append(predicted)
    model.train(was_training)
    # One copy to the host: one wait for a GPU.
    names = list(sums) or [TOTAL]  # an empty split: nothing summed
    terms = [sums.get(name, torch.zeros_like(correct)) for name in names]
    states = [scores.states(scored, device)] if scores is not None else []  # counts, summed too
    totals = torch.cat([torch.stack([*terms, correct, torch.full_like(correct, count)]), *states])
    totals = totals.cpu()
    if dist is not None:
        totals = distributed.sum_tensor(totals, dist)
    *term_totals, correct_total, images = totals[: len(names) + 2].tolist()
    result: dict[str, Any] = {
        name: value / images for name, value in zip(names, term_totals, strict=True)
    }
    result["acc"] = correct_total / images
    if scores is not None:
        result |= scores.results(totals[len(names) + 2 :], names)
    if classes is not None:
        result["confusion"] = kept.confusion(classes).tolist()
    if keep_predictions:
        result["predictions"] = kept
    return result


def evaluation_columns(
    prefix: str, result: dict[str, Any], matrices: bool = False
) -> dict[str, Any]:
    """An evaluation's results as metrics columns: `val_loss`, `val_acc`, `val_<term>`,
    `val_<metric>` ...; a matrix (the confusion matrix) only with `matrices`, for summary.json."""
    ordered = [TOTAL, "acc", *(name for name in result if name not in (TOTAL, "acc"))]
    shown = [name for name in ordered if matrices or not isinstance(result[name], list)]
    return {column(prefix, name): result[name] for name in shown}
