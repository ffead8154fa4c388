"""`trainer.compile`: torch.compile in place, starting from a clean compiler state each run."""

from __future__ import annotations

import sys

from torch import nn


def forget_earlier_runs() -> None:
    """Drop the graphs, guards and recompilation counts of runs made earlier in this process
    (a sequential multirun, the benchmark's rows): they hold memory, and their counts would
    push this run past torch's recompilation limit, where it silently runs uncompiled."""
    dynamo = sys.modules.get("torch._dynamo")  # never imported: nothing to forget (import ~2 s)
    if dynamo is not None:
        dynamo.reset()


def compile_in_place(module: nn.Module) -> None:
    """Compile `module` in place: its state_dict keys and the weights hash stay the same."""
    module.compile()
