"""The per-step losses between two flushes: kept on the device so that steps never wait for
the host, then written to fingerprints.csv in one copy, with a non-finite check. The
objective's other terms ride along, summed for the next metrics row."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from repro.core.errors import UserError
from repro.core.runs.fingerprint_log import FingerprintLog
from repro.core.runs.position import Position
from repro.core.runtime import distributed
from repro.core.tasks.objectives import TOTAL
from repro.core.watch.metrics import weights_sha256


class NonFiniteLossError(UserError):
    """The loss became NaN or infinite: a diverged run, reported with its step."""


class PendingLosses:
    """The objective's terms of each step since the last flush, 0-d tensors on the training
    device."""

    def __init__(
        self,
        fingerprints: FingerprintLog,
        hash_every_steps: int,
        dist: distributed.Context,
        world_invariant: bool,
        checkpoints: Path,
    ) -> None:
        self.fingerprints, self.hash_every_steps = fingerprints, hash_every_steps
        self.dist, self.world_invariant, self.checkpoints = dist, world_invariant, checkpoints
        self.pending: list[dict[str, torch.Tensor]] = []

    def append(self, terms: dict[str, torch.Tensor]) -> None:
        self.pending.append(terms)

    def flush(self, position: Position, model: nn.Module) -> list[float]:
        """Write the pending losses, which end at `position.step`, and add them to its sums;
        a weights hash goes with a step on the hashing cadence. A non-finite loss stops the
        run, naming its step. Returns the losses written (none: nothing was pending)."""
        if not self.pending:
            return []
        names = [TOTAL, *(name for name in self.pending[0] if name != TOTAL)]
        stacked = torch.stack([torch.stack([terms[n] for terms in self.pending]) for n in names])
        stacked = stacked.double()
        if self.dist.enabled and not self.world_invariant:  # the mean over ranks
            stacked = distributed.sum_tensor(stacked, self.dist) / self.dist.world
        values, *others = stacked.cpu().tolist()
        first_step = position.step - len(values) + 1
        bad = next((i for i, value in enumerate(values) if not math.isfinite(value)), None)
        if bad is not None:  # the steps before it are still logged, for verify and diff
            if self.dist.is_main and bad:
                self.fingerprints.append(first_step, values[:bad])
            raise NonFiniteLossError(
                f"loss is {values[bad]} at step {first_step + bad}; the last good "
                f"checkpoint is kept in {self.checkpoints} (lower optimizer.lr or set "
                "trainer.grad_clip)"
            )
        if self.dist.is_main:
            hashed = position.step % self.hash_every_steps == 0
            self.fingerprints.append(first_step, values, weights_sha256(model) if hashed else "")
        position.loss_sum += sum(values)
        position.loss_count += len(values)
        for name, term in zip(names[1:], others, strict=True):
            position.term_sums[name] = position.term_sums.get(name, 0.0) + sum(term)
        self.pending.clear()
        return values
