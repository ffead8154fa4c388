"""airbench's triangular learning-rate schedule, as a LambdaLR factor of the base rate:

    scheduler:
      _target_: repro.extras.recipes.schedules.triangle
      warmup: 0.23
      start: 0.2
      end: 0.07

The factor rises linearly from `start` at step 0 to 1 at step `int(warmup * total_steps)`,
then falls linearly to `end` at `total_steps` (the step after the last). With `start` and
`end` 0 it is the template's warmup_linear, give or take its first step.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def triangle(
    optimizer: Optimizer,
    total_steps: int,
    warmup: float = 0.23,
    start: float = 0.2,
    end: float = 0.07,
) -> LambdaLR:
    """`start` -> 1 over the first `warmup` of the steps, then 1 -> `end` at the run's end."""
    for name, value in (("start", start), ("end", end)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name}={value!r}: allowed: a number in [0, 1] (of the base lr)")
    return LambdaLR(optimizer, triangle_factor(total_steps, warmup, start, end))


def triangle_factor(
    total_steps: int, warmup: float, start: float, end: float
) -> Callable[[int], float]:
    """The factor at each optimizer step (0 is the first)."""
    # int(), not round(): airbench's peak step, so that both runs peak at the same step.
    peak = int(warmup * total_steps)

    def factor(step: int) -> float:
        if step < peak:
            return start + (1 - start) * step / peak
        progress = min(1.0, (step - peak) / max(1, total_steps - peak))
        return 1 + (end - 1) * progress

    return factor
