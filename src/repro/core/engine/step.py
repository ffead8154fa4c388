"""One optimizer step: MixUp/CutMix, micro-batches, the objective and its scaled backward,
clipping, the optimizer and schedule updates."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from repro.core.engine.mixing import BatchMixer
from repro.core.engine.settings import LoopSettings
from repro.core.runtime.memory_format import MemoryFormat
from repro.core.runtime.precision import Precision
from repro.core.tasks.objectives import TOTAL, Objective, Targets, batch_means, checked


@dataclass
class OptimizerStep:
    model: nn.Module
    forward_model: nn.Module  # the DDP wrapper under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    memory_format: MemoryFormat
    settings: LoopSettings
    objective: Objective
    mixer: BatchMixer | None = None

    def __post_init__(self) -> None:
        self.objective = checked(self.objective)

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, epoch: int, batch: int
    ) -> dict[str, torch.Tensor]:
        """One optimizer step on a batch already on the device, the `batch`-th of `epoch`;
        the objective's terms (batch means), left on the device.

        With `accumulate_steps` k, the batch runs as k micro-batches in order, each term
        divided by k, so the summed gradients are those of the whole batch's mean loss; under
        DDP the gradients are all-reduced once, with the last micro-batch.
        """
        targets = Targets(labels)
        if self.mixer is not None:  # keyed on the batch's place: the position before the step
            mixed = self.mixer(images, labels, epoch, batch)
            images, targets = mixed.images, Targets(labels, mixed.partner_labels, mixed.weight)
        images = self.memory_format.batch(images)
        pieces = self.settings.accumulate_steps
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.precision.scaler
        total: dict[str, torch.Tensor] = {}
        # The usual case (one piece) without the micro-batch split's Python per step.
        micro: Any = [(images, targets)]
        if pieces > 1:
            micro = zip(images.chunk(pieces), targets.chunk(pieces), strict=True)
        for index, (x, y) in enumerate(micro):
            with self._gradient_sync(last=index == pieces - 1), self.precision.autocast():
                terms = batch_means(self.objective(self.forward_model(x), y, x, self.model))
                if pieces > 1:
                    terms = {name: value / pieces for name, value in terms.items()}
            scaler.scale(terms[TOTAL]).backward()
            for name, value in terms.items():
                total[name] = total[name] + value.detach() if name in total else value.detach()
        if self.settings.grad_clip is not None:
            scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        scaler.step(self.optimizer)
        scaler.update()
        self.scheduler.step()
        return total

    def _gradient_sync(self, last: bool) -> AbstractContextManager[Any]:
        """DDP all-reduces gradients in backward; only the last micro-batch's should."""
        if last or not isinstance(self.forward_model, DistributedDataParallel):
            return nullcontext()
        return self.forward_model.no_sync()
