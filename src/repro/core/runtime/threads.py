"""CPU threads for torch's intra-op parallelism.

On CPU, kernels split their reductions by thread, so the thread count is part of what makes
results bit-exact. `trainer.num_threads: null` keeps what the environment gives this process
(all cores, or cores / n_jobs under the joblib launcher); an integer pins it.
"""

from __future__ import annotations

import torch

_AT_START = torch.get_num_threads()  # before any run of this process changed it


def apply(num_threads: int | None) -> int:
    """Set torch's thread count for this run (so one job of a sweep never leaks into the next)."""
    torch.set_num_threads(num_threads or _AT_START)
    return torch.get_num_threads()
