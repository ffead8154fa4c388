"""Freeze the backbone, then train it: `+components=finetune` (conf/components/finetune.yaml).

For the first `freeze_epochs` epochs (or `freeze_steps` steps) only the classifier head
(`repro.core.build.head_name`) trains; then everything does. Whether a step is frozen is a
function of the run's position alone, so a resume on either side of the unfreeze is exact.

How a step is frozen, the same with one process, under DDP and in the world-invariant step:
every parameter keeps `requires_grad` (DDP registered them all when it wrapped the model, and
its reducer would wait for gradients that never come); a hook on each backbone parameter
turns its gradient into zeros (so clipping and the gradient exchange see none), and a hook
run before the optimizer's step sets them to None, which every torch optimizer skips: no
weight decay, no momentum, no Adam moments for a frozen weight. With `bn_eval`, the
backbone's BatchNorm layers run in eval mode while frozen: their running statistics stay as
the pretrained weights left them (the world-invariant step updates only layers in training
mode, as BatchNorm itself does).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from repro.core.build import head_name, in_head
from repro.core.errors import ConfigError


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}: allowed: an integer >= 0")
    return value


class Finetune:
    def __init__(
        self,
        model: nn.Module,
        total_steps: int,
        freeze_epochs: int = 0,
        freeze_steps: int = 0,
        bn_eval: bool = True,
    ) -> None:
        self.freeze_epochs = _count(freeze_epochs, "freeze_epochs")
        self.freeze_steps = _count(freeze_steps, "freeze_steps")
        if self.freeze_epochs and self.freeze_steps:
            raise ValueError("freeze_epochs and freeze_steps both set: allowed: one of them")
        if self.freeze_steps > total_steps:
            allowed = f"at most the run's {total_steps} steps"
            raise ValueError(f"freeze_steps={freeze_steps}: allowed: {allowed}")
        if not isinstance(bn_eval, bool):
            raise ValueError(f"bn_eval={bn_eval!r}: allowed: true or false")
        head = head_name(model)
        if head is None:
            raise ValueError("the model has no classifier head (an nn.Linear) to train alone")
        self.bn_eval, self.frozen = bn_eval, False
        self.backbone = [
            p for n, p in model.named_parameters() if p.requires_grad and not in_head(n, head)
        ]
        self.norms = [
            module
            for name, module in model.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and not in_head(name, head)
        ]
        for parameter in self.backbone:
            parameter.register_hook(self._zero_if_frozen)
        self._hooked: set[int] = set()

    def frozen_at(self, position: Any) -> bool:
        """Whether the step after `position` (the run's place before it) trains the head only."""
        if self.freeze_epochs:
            return position.epoch < self.freeze_epochs
        return position.step < self.freeze_steps

    def _zero_if_frozen(self, gradient: torch.Tensor) -> torch.Tensor | None:
        return torch.zeros_like(gradient) if self.frozen else None

    def _drop_frozen_gradients(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.frozen:
            for parameter in self.backbone:
                parameter.grad = None

    # ---- as a component of the loop (repro.core.watch.callbacks) ----------------------------------

    def at_start(self, loop: Any) -> None:
        if self.freeze_epochs:
            per_epoch = loop.data.sampler.batches_per_epoch()
            if self.freeze_epochs * per_epoch > loop.total_steps:
                allowed = f"at most the run's {loop.total_steps // per_epoch} epochs"
                raise ConfigError("components.finetune.freeze_epochs", self.freeze_epochs, allowed)
        if id(loop.optimizer) not in self._hooked:
            loop.optimizer.register_step_pre_hook(self._drop_frozen_gradients)
            self._hooked.add(id(loop.optimizer))

    def before_step(self, loop: Any) -> None:
        was, self.frozen = self.frozen, self.frozen_at(loop.state.position)
        if self.bn_eval and self.frozen:
            for norm in self.norms:
                norm.eval()  # the loop's model.train() after an evaluation turned them back
        elif self.bn_eval and was:
            for norm in self.norms:
                norm.train(loop.model.training)

    def state_dict(self) -> dict[str, Any]:
        """Nothing to restore (the phase follows from the position); kept for the record."""
        return {"freeze_epochs": self.freeze_epochs, "freeze_steps": self.freeze_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
