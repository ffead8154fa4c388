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

from repro.core import tasks
from repro.core.runtime import distributed
from repro.core.tasks.objectives import (
    TOTAL,
    CrossEntropy,
    Objective,
    Targets,
    batch_sums,
    checked,
    column,
)
from repro.core.watch.scores import Scores


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


@dataclass(frozen=True)
class SplitOutputs:
    """One evaluation pass over a whole split, on the host, in the split's order: each image's
    index in the split, its target as the dataset gave it, the logits (with `trainer.tta`, the
    views' mean) and the prediction the objective's task makes of them."""

    indices: torch.Tensor  # int64 (N,): row i is the split's sample indices[i] (loop.val_sample)
    targets: torch.Tensor  # (N,) class indices, or (N, classes) rows
    logits: torch.Tensor  # float32 (N, classes)
    predicted: torch.Tensor  # (N,) classes, or (N, classes) 0/1 labels

    def wrong(self) -> torch.Tensor:
        """The rows whose prediction is not the target (every label, for multi-label)."""
        wanted = self.targets
        if self.predicted.dim() == 1:
            wanted = wanted if wanted.dim() == 1 else wanted.argmax(1)
            return torch.nonzero(self.predicted != wanted).flatten()
        return torch.nonzero((self.predicted.bool() != (wanted > 0.5)).any(1)).flatten()


@dataclass
class Predictions:
    """This rank's targets, predictions and logits of one evaluation pass, left on the device;
    `outputs()` gathers every rank's in the split's order, on the host."""

    labels: list[torch.Tensor] = field(default_factory=list)  # the targets, as batched
    predicted: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    dist: distributed.Context | None = None
    _gathered: SplitOutputs | None = None

    def confusion(self, classes: int) -> torch.Tensor:
        """The confusion matrix over every rank's shard (rows: true class, columns: predicted),
        counted on the host, once: a GPU's scatter-add has no deterministic kernel. Under
        torchrun every rank must call it (a sum over ranks). Soft labels count as their most
        likely class; a multi-label pass has no confusion matrix."""
        if not self.labels:
            counts = torch.zeros(classes, classes, dtype=torch.int64)
        else:
            targets = torch.cat(self.labels).cpu()
            truth = targets if targets.dim() == 1 else targets.argmax(1)
            pairs = truth * classes + torch.cat(self.predicted).cpu()
            counts = torch.bincount(pairs, minlength=classes * classes).view(classes, classes)
        return distributed.sum_tensor(counts, self.dist) if self.dist is not None else counts

    def outputs(self) -> SplitOutputs:
        """The whole split's `SplitOutputs`, gathered once (under torchrun a collective: every
        rank must call it). Rank r evaluated images r, r + world, ... (`EvalBatches`)."""
        if self._gathered is None:
            rank, world = (self.dist.rank, self.dist.world) if self.dist else (0, 1)
            mine = [_joined(self.labels), _joined(self.logits), _joined(self.predicted)]
            mine.insert(0, rank + world * torch.arange(len(mine[0])))
            shards = distributed.gather(mine, self.dist) if self.dist else [mine]
            filled = [shard for shard in shards if len(shard[0])] or shards[:1]
            indices, targets, logits, predicted = (
                torch.cat([shard[i] for shard in filled]) for i in range(4)
            )
            order = torch.argsort(indices)
            self._gathered = SplitOutputs(
                indices[order], targets[order], logits[order], predicted[order]
            )
        return self._gathered


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(tensors).cpu() if tensors else torch.zeros(0)


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
    label_names: list[str] | None = None,
) -> dict[str, Any]:
    """The mean of each of the objective's terms (plain cross-entropy without one) under its
    name ("loss" the total), and the accuracy ("acc": for a multi-label objective, the share of
    images with every label right), over `batches` (summed over torchrun ranks, each of which
    evaluates its own shard), of the logits `predict` gives with `tta`; with `classes`, also the
    confusion matrix (rows: true class, columns: predicted); with `keep_predictions`, the
    pass's `Predictions` under "predictions"; with `scores` (the `metrics` group), the
    metrics' results (`Scores.results`); for a task that scores the whole split (multi-label:
    `map`, `ap_<label>`, `f1_<label>`), its figures, labels named by `label_names`."""
    objective = checked(objective or CrossEntropy())
    task = tasks.of(objective)
    was_training = model.training
    model.eval()
    # Sums stay on the device until the end (a read per batch would wait for the GPU each
    # time), and start there: a host scalar copied in would wait too.
    device = next(model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    correct = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    kept = Predictions(dist=dist)
    keep = classes is not None or keep_predictions or task.needs_outputs
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
        predicted = task.predicted(logits)
        correct += task.correct(predicted, labels)
        count += len(labels)
        if scores is not None:
            scored.append((logits, labels))
        if keep:
            kept.labels.append(labels)
            kept.predicted.append(predicted)
            kept.logits.append(logits)
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
    if task.needs_outputs:
        whole = kept.outputs()
        named = label_names or [str(i) for i in range(whole.logits.shape[-1])]
        result |= task.outputs_metrics(whole.logits, whole.targets, named)
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
    if not result:  # no validation split
        return {}
    ordered = [TOTAL, "acc", *(name for name in result if name not in (TOTAL, "acc"))]
    shown = [name for name in ordered if matrices or not isinstance(result[name], list)]
    return {column(prefix, name): result[name] for name in shown}
