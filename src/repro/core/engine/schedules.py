"""Learning-rate schedules as LambdaLR factors of the optimizer's base rate, stepped per step."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(optimizer: Optimizer, total_steps: int, warmup: float = 0.1) -> LambdaLR:
    """Linear warm-up for `warmup` of the steps, then cosine decay to zero."""
    return LambdaLR(optimizer, _after_warmup(total_steps, warmup, _cosine))


def warmup_linear(optimizer: Optimizer, total_steps: int, warmup: float = 0.2) -> LambdaLR:
    """Linear warm-up for `warmup` of the steps, then linear decay to zero: the triangular
    schedule of published fast CIFAR-10 training."""
    return LambdaLR(optimizer, _after_warmup(total_steps, warmup, _linear))


def constant(optimizer: Optimizer, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: 1.0)


def _after_warmup(
    total_steps: int, warmup: float, decay: Callable[[float], float]
) -> Callable[[int], float]:
    """The factor at each step: rising linearly to 1 over the warm-up's steps (`warmup`, a
    fraction in [0, 1) that config.validate checks), then `decay(progress)` with progress
    going from 0 to 1 over the remaining steps."""
    warmup_steps = max(1, round(warmup * total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return decay(min(1.0, progress))

    return factor


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _linear(progress: float) -> float:
    return 1.0 - progress
