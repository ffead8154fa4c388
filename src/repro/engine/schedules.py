"""Learning-rate schedules as LambdaLR factors of the optimizer's base rate, stepped per step."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(optimizer: Optimizer, total_steps: int, warmup: float = 0.1) -> LambdaLR:
    """Linear warm-up for `warmup` of the steps, then cosine decay to zero."""
    warmup_steps = max(1, round(warmup * total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return LambdaLR(optimizer, factor)


def constant(optimizer: Optimizer, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: 1.0)
