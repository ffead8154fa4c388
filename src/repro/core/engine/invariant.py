"""`trainer.world_invariant`: the same weights whatever the number of processes.

A global batch of `trainer.batch_size` images (`trainer.global_batch=true`) is a fixed sequence
of micro-batches of `trainer.micro_batch` images; rank r of W holds the r-th W-th of them, in
order. Every micro-batch runs forward and backward on its own, so what it computes does not
depend on where it runs:

- gradients: each micro-batch's flattened gradient is gathered from every rank, and every
  rank sums them in one fixed binary tree over the micro-batch indices (pairs (0,1), (2,3) ...,
  then pairs of those), never in the communication library's order; the mean over
  micro-batches is then the same tensor on every rank and for any W;
- BatchNorm: a micro-batch's forward normalises with its own statistics but leaves the running
  statistics alone; the micro-batches' statistics are gathered and applied to the running
  statistics in micro-batch order, on every rank;
- dropout and other draws from torch's generator: per micro-batch, from a stream keyed on
  (seed, step, micro-batch index), not per rank.

No DDP wrapper: the gradient exchange above replaces its all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from repro.core.engine.settings import LoopSettings
from repro.core.runtime import distributed
from repro.core.runtime.memory_format import MemoryFormat
from repro.core.runtime.precision import Precision
from repro.core.runtime.seeding import stream_seed
from repro.core.tasks.objectives import TOTAL, Objective, Targets, batch_means, checked


def _flat_gradient(parameter: nn.Parameter) -> torch.Tensor:
    if parameter.grad is None:  # unused in this forward pass
        return torch.zeros(parameter.numel(), device=parameter.device)
    return parameter.grad.reshape(-1)


def tree_sum(rows: torch.Tensor) -> torch.Tensor:
    """The sum of `rows` along dim 0 in a fixed binary tree: the same bits for the same rows,
    however they were computed or gathered."""
    while len(rows) > 1:
        paired = rows[0 : len(rows) - 1 : 2] + rows[1::2]
        rows = torch.cat([paired, rows[-1:]]) if len(rows) % 2 else paired
    return rows[0]


class BatchNormStatistics:
    """Per micro-batch statistics of every BatchNorm layer, collected during forward passes
    that leave the running statistics alone, then applied to them in a given order."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.pending: list[torch.Tensor] = []  # one row per micro-batch: all layers' stats

    def __enter__(self) -> BatchNormStatistics:
        self._current: list[torch.Tensor] = []
        self._hooks = [layer.register_forward_pre_hook(self._record) for layer in self.layers]
        for layer in self.layers:
            layer.track_running_stats = False  # normalise with the batch's own statistics
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()
        for layer in self.layers:
            layer.track_running_stats = True
        if self._current:
            self.pending.append(torch.cat(self._current))

    def _record(self, layer: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0].detach().float()
        dims = [0, *range(2, x.dim())]
        self._current += [x.mean(dims), x.var(dims, unbiased=True)]

    def apply(self, rows: torch.Tensor) -> None:
        """Update the running statistics with each row (one micro-batch), in order, exactly as
        BatchNorm's own update would, once per micro-batch."""
        with torch.no_grad():
            for row in rows:
                offset = 0
                for layer in self.layers:
                    size = layer.num_features
                    mean, var = row[offset : offset + size], row[offset + size : offset + 2 * size]
                    offset += 2 * size
                    if not layer.training:  # in eval mode BatchNorm keeps its statistics
                        continue
                    layer.num_batches_tracked += 1
                    momentum = layer.momentum
                    if momentum is None:  # a cumulative average
                        momentum = 1.0 / float(layer.num_batches_tracked)
                    layer.running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
                    layer.running_var.mul_(1 - momentum).add_(var, alpha=momentum)


@dataclass
class InvariantStep:
    """One optimizer step that gives the same weights for any number of processes."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    memory_format: MemoryFormat
    settings: LoopSettings
    objective: Objective
    micro_batch: int
    root_seed: int
    dist: distributed.Context
    norms: BatchNormStatistics = field(init=False)

    def __post_init__(self) -> None:
        self.norms = BatchNormStatistics(self.model)
        self.objective = checked(self.objective)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, epoch: int, batch: int
    ) -> dict[str, torch.Tensor]:
        images = self.memory_format.batch(images)
        per_rank = len(images) // self.micro_batch
        first = self.dist.rank * per_rank  # this rank's first micro-batch in the global batch
        gradients, rows = [], []
        names: list[str] = []
        self.norms.pending = []
        for offset, (x, y) in enumerate(
            zip(images.split(self.micro_batch), labels.split(self.micro_batch), strict=True)
        ):
            with torch.random.fork_rng(devices=self._devices()):
                key = (epoch, batch, first + offset)  # this micro-batch's place in the run
                torch.manual_seed(stream_seed(self.root_seed, "micro", *key))
                self.optimizer.zero_grad(set_to_none=True)
                with self.norms, self.precision.autocast():
                    terms = batch_means(self.objective(self.model(x), Targets(y), x, self.model))
                terms[TOTAL].backward()
            gradients.append(torch.cat([_flat_gradient(p) for p in self.parameters]))
            names = list(terms)
            rows.append(torch.stack([terms[name].detach().float() for name in names]))
        # The terms ride along with the gradients: one gather, one tree, for both.
        everything = self._gather(torch.cat([torch.stack(gradients), torch.stack(rows)], 1))
        total = tree_sum(everything) / len(everything)  # the mean over all micro-batches
        if self.norms.layers:  # a model without BatchNorm has no statistics to combine
            self.norms.apply(self._gather(torch.stack(self.norms.pending)))
        self._set_gradients(total[: -len(names)])
        if self.settings.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        means = total[-len(names) :]
        return {name: means[index] for index, name in enumerate(names)}

    def _gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Every rank's rows, in rank order: the global micro-batch order."""
        if not self.dist.enabled:
            return rows
        parts = [torch.empty_like(rows) for _ in range(self.dist.world)]
        torch.distributed.all_gather(parts, rows.contiguous())
        return torch.cat(parts)

    def _set_gradients(self, flat: torch.Tensor) -> None:
        """Each parameter's slice of the flat mean gradient, laid out as the parameter is (a
        channels_last weight gets a channels_last gradient: CUDA's fused optimizers refuse
        a gradient whose strides differ from its parameter's)."""
        offset = 0
        for parameter in self.parameters:
            size = parameter.numel()
            gradient = torch.empty_like(parameter)  # the parameter's strides
            gradient.copy_(flat[offset : offset + size].view(parameter.shape))
            parameter.grad = gradient
            offset += size

    def _devices(self) -> list[int]:
        device = next(self.model.parameters()).device
        return [device.index or 0] if device.type == "cuda" else []
