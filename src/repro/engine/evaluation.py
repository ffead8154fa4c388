"""Evaluation: loss and accuracy of a model over a split, optionally with test-time
augmentation (flips, and one-pixel shifts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from repro.runtime import distributed


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
) -> dict[str, Any]:
    """Mean cross-entropy and accuracy over `batches` (summed over torchrun ranks, each of
    which evaluates its own shard), of the logits `predict` gives with `tta`; with `classes`,
    also the confusion matrix (rows: true class, columns: predicted)."""
    was_training = model.training
    model.eval()
    # Sums stay on the device until the end (a read per batch would wait for the GPU each
    # time), and start there: a host scalar copied in would wait too.
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    truths: list[torch.Tensor] = []
    predictions: list[torch.Tensor] = []
    for images, labels in batches:
        images, labels = to_device(images, labels)
        with autocast():
            logits = predict(model, prepare(images), tta)
        # Per-image losses summed in float64: the total does not depend on how the images
        # were batched (or sharded over ranks) beyond the logits' own last bits.
        losses = nn.functional.cross_entropy(logits, labels, reduction="none")
        loss_sum += losses.double().sum()
        predicted = logits.argmax(1)
        correct += (predicted == labels).sum().double()
        count += len(labels)
        if classes is not None:
            truths.append(labels)
            predictions.append(predicted)
    model.train(was_training)
    # One copy to the host: one wait for a GPU.
    totals = torch.stack([loss_sum, correct, torch.full_like(loss_sum, count)]).cpu()
    if dist is not None:
        totals = distributed.sum_tensor(totals, dist)
    loss_total, correct_total, images = totals.tolist()
    result: dict[str, Any] = {"loss": loss_total / images, "acc": correct_total / images}
    if classes is not None:
        result["confusion"] = _confusion(truths, predictions, classes, dist).tolist()
    return result


def _confusion(
    truths: list[torch.Tensor],
    predictions: list[torch.Tensor],
    classes: int,
    dist: distributed.Context | None,
) -> torch.Tensor:
    """Counted on the host, once: a GPU's scatter-add has no deterministic kernel."""
    pairs = torch.cat(truths).cpu() * classes + torch.cat(predictions).cpu()
    confusion = torch.bincount(pairs, minlength=classes * classes).view(classes, classes)
    return distributed.sum_tensor(confusion, dist) if dist is not None else confusion
