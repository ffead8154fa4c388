"""Lookahead: slow weights that follow the trained ones in jumps; a component of the loop.

    components:
      lookahead:
        _target_: repro.extras.recipes.lookahead.Lookahead
        every: 5
        decay: 0.774
        ramp: cubic

Every `every` optimizer steps, and at the run's last step, the slow copy of the model's
floating-point parameters and buffers moves towards the trained ones,
`slow = decay * slow + (1 - decay) * weights`, and the model trains on from the slow copy
(the weights are overwritten with it). The optimizer's state is left as it is. With
`ramp=cubic` the decay at step s of n is `decay * (s / n) ** 3`: no pull early on, while the
learning rate is high and the weights move far, growing towards the end (the schedule
airbench uses); `constant` is the original method. The slow copy is in every checkpoint, so
a resume between two pulls is exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

RAMPS = ("constant", "cubic")


class Lookahead:
    def __init__(
        self,
        model: nn.Module,
        total_steps: int,
        every: int = 5,
        decay: float = 0.5,
        ramp: str = "constant",
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r}: allowed: an integer >= 1 (steps between pulls)")
        if not 0 <= decay < 1:
            raise ValueError(f"decay={decay!r}: allowed: a number in [0, 1)")
        if ramp not in RAMPS:
            raise ValueError(f"ramp={ramp!r}: allowed: {' | '.join(RAMPS)}")
        self.every, self.decay, self.ramp, self.total_steps = every, decay, ramp, total_steps
        named = model.state_dict(keep_vars=True).items()  # the live tensors, by name
        self.names = [name for name, tensor in named if tensor.is_floating_point()]
        self.weights = [tensor for _, tensor in named if tensor.is_floating_point()]
        self.slow = [tensor.detach().clone() for tensor in self.weights]

    def decay_at(self, step: int) -> float:
        """The slow weights' share in the pull after optimizer step `step`."""
        if self.ramp == "cubic":
            return self.decay * (step / self.total_steps) ** 3
        return self.decay

    def after_step(self, loop: Any) -> None:
        """As a component of the loop (repro.core.watch.callbacks): after every optimizer step."""
        self.pull(loop.state.position.step)

    @torch.no_grad()
    def pull(self, step: int) -> None:
        """Pull and write back if `step` (optimizer steps done) is on the cadence or the last."""
        if step % self.every and step != self.total_steps:
            return
        torch._foreach_lerp_(self.slow, self.weights, 1 - self.decay_at(step))
        torch._foreach_copy_(self.weights, self.slow)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The slow weights by their names in the model's state dict."""
        return dict(zip(self.names, self.slow, strict=True))

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if list(state) != self.names:
            raise ValueError("the checkpoint's lookahead weights are not this model's")
        for mine, saved in zip(self.slow, state.values(), strict=True):
            mine.copy_(saved)
