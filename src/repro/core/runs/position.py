"""Where a run is, and the best evaluation so far: both checkpointed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Position:
    """Where the run is: `batch` batches of `epoch` done, `step` optimizer steps in all,
    the training loss and the objective's other terms summed since the last evaluation (for
    its metrics row), and the seconds spent training so far, over every attempt (steps and
    waits for data; not evaluations, checkpoints or start-up)."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    train_seconds: float = 0.0
    term_sums: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict:
        """A copy to checkpoint: the loop goes on changing the sums while it is written."""
        return {**vars(self), "term_sums": dict(self.term_sums)}

    def advance(self, batches_per_epoch: int) -> bool:
        """Count a step done; whether it ended its epoch (the next one then starts)."""
        self.batch += 1
        self.step += 1
        if self.batch < batches_per_epoch:
            return False
        self.epoch, self.batch = self.epoch + 1, 0
        return True


@dataclass
class Best:
    """The best monitored value so far, its step, and the evaluations since then."""

    value: float | None = None
    step: int | None = None
    stale: int = 0

    def improves(self, value: float, mode: str) -> bool:
        if self.value is None or math.isnan(self.value):
            return not math.isnan(value)
        return value > self.value if mode == "max" else value < self.value

    def record(self, value: float, step: int, mode: str) -> bool:
        """Take an evaluation's monitored value; whether it is the new best."""
        if not self.improves(value, mode):
            self.stale += 1
            return False
        self.value, self.step, self.stale = value, step, 0
        return True

    def spent(self, patience: int | None) -> bool:
        """`patience` evaluations in a row without a better value (None: never)."""
        return patience is not None and self.stale >= patience


@dataclass
class RunState:
    """What a run's loop has done so far, all of it checkpointed: where it is, its last
    evaluation row, its best monitored value, and whether it stopped early (and why) or by a
    signal."""

    position: Position = field(default_factory=Position)
    last_eval: dict[str, float] = field(default_factory=dict)
    best: Best = field(default_factory=Best)
    stopped_by: int | None = None  # the signal that stopped it (not checkpointed)
    stopped_early: bool = False
    stop_reason: str | None = None  # what stopped it early: trainer.patience, a callback
