"""One optimizer step: MixUp/CutMix, micro-batches, the scaled backward, clipping, the
optimizer, schedule and weight-average updates."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from repro.engine.ema import WeightAverage
from repro.engine.mixing import BatchMixer
from repro.engine.settings import LoopSettings
from repro.runtime.memory_format import MemoryFormat
from repro.runtime.precision import Precision


@dataclass
class OptimizerStep:
    model: nn.Module
    forward_model: nn.Module  # the DDP wrapper under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    memory_format: MemoryFormat
    settings: LoopSettings
    mixer: BatchMixer | None = None
    ema: WeightAverage | None = None

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, epoch: int, batch: int
    ) -> torch.Tensor:
        """One optimizer step on a batch already on the device, the `batch`-th of `epoch`;
        the loss, left on the device.

        With `accumulate_steps` k, the batch runs as k micro-batches in order, each loss
        divided by k, so the summed gradients are those of the whole batch's mean loss; under
        DDP the gradients are all-reduced once, with the last micro-batch.
        """
        mixed = None
        if self.mixer is not None:  # keyed on the batch's place: the position before the step
            mixed = self.mixer(images, labels, epoch, batch)
            images = mixed.images
        images = self.memory_format.batch(images)
        pieces = self.settings.accumulate_steps
        partners = mixed.partner_labels if mixed is not None else labels
        weight = mixed.weight if mixed is not None else None
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.precision.scaler
        total = None
        if pieces == 1:  # the usual case, without the micro-batch split's Python per step
            micro: Any = ((images, labels, partners),)
        else:
            chunks = images.chunk(pieces), labels.chunk(pieces), partners.chunk(pieces)
            micro = zip(*chunks, strict=True)
        for index, (x, y, partner) in enumerate(micro):
            with self._gradient_sync(last=index == pieces - 1), self.precision.autocast():
                loss = self._loss(self.forward_model(x), y, partner, weight)
                if pieces > 1:
                    loss = loss / pieces
            scaler.scale(loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.settings.grad_clip is not None:
            scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        scaler.step(self.optimizer)
        scaler.update()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update()
        return total

    def _loss(
        self, logits: torch.Tensor, labels: torch.Tensor, partners: torch.Tensor, weight: Any
    ) -> torch.Tensor:
        """Cross-entropy; with MixUp/CutMix against the mixed targets."""
        smoothing = self.settings.label_smoothing
        loss = nn.functional.cross_entropy(logits, labels, label_smoothing=smoothing)
        if weight is None:
            return loss
        other = nn.functional.cross_entropy(logits, partners, label_smoothing=smoothing)
        return loss * weight + other * (1 - weight)

    def _gradient_sync(self, last: bool) -> AbstractContextManager[Any]:
        """DDP all-reduces gradients in backward; only the last micro-batch's should."""
        if last or not isinstance(self.forward_model, DistributedDataParallel):
            return nullcontext()
        return self.forward_model.no_sync()
