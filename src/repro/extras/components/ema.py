"""An exponential moving average of a model's weights: `+components=ema` (conf/components/).

A copy of the model whose floating-point parameters and buffers move towards the trained
model's after every optimizer step, `ema = decay * ema + (1 - decay) * weights`, in a few
multi-tensor operations; integer buffers (BatchNorm's step count) are copied. The copy is
evaluated beside the trained model, stored in checkpoints (so a resume is exact) and can be
the one tested after training (`trainer.test_weights=ema`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from repro.core.engine.evaluation import evaluation_columns


class WeightAverage:
    def __init__(self, model: nn.Module, total_steps: int = 0, decay: float = 0.999) -> None:
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0 < decay < 1:
            raise ValueError(f"decay={decay!r}: allowed: a number in (0, 1)")
        self.decay = float(decay)
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self._pairs = _floating_pairs(self.model, model)
        self._counts = [
            (mine, theirs)
            for mine, theirs in zip(self.model.buffers(), model.buffers(), strict=True)
            if not mine.is_floating_point()
        ]

    @torch.no_grad()
    def update(self) -> None:
        """One step towards the trained model's current weights."""
        averaged, current = self._pairs
        torch._foreach_lerp_(averaged, current, 1 - self.decay)
        for mine, theirs in self._counts:
            mine.copy_(theirs)

    # ---- as a component of the loop (repro.core.watch.callbacks) ----------------------------------

    def after_step(self, loop: Any) -> None:
        self.update()

    def extra_metrics(self, loop: Any) -> dict[str, float]:
        """The average's evaluation: the `ema_val_...` columns of the row."""
        return evaluation_columns("ema_val", loop.evaluate(self.model))

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)


def _floating_pairs(
    average: nn.Module, model: nn.Module
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pairs = [
        (mine, theirs)
        for mine, theirs in zip(
            [*average.parameters(), *average.buffers()],
            [*model.parameters(), *model.buffers()],
            strict=True,
        )
        if mine.is_floating_point()
    ]
    return [mine for mine, _ in pairs], [theirs for _, theirs in pairs]
