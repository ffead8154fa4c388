"""When the loop evaluates and checkpoints: pure functions of where the run is."""

from __future__ import annotations

from dataclasses import dataclass

from repro.core.engine.settings import LoopSettings
from repro.core.runs.position import Position


@dataclass(frozen=True)
class Cadence:
    eval_every_epochs: int = 1
    eval_every_steps: int | None = None
    checkpoint_every_steps: int | None = None

    @classmethod
    def of(cls, settings: LoopSettings) -> Cadence:
        return cls(
            settings.eval_every_epochs, settings.eval_every_steps, settings.checkpoint_every_steps
        )

    def evaluate(self, position: Position, epoch_ended: bool, finished: bool) -> bool:
        """At the end of every `eval_every_epochs`-th epoch and of the run, and every
        `eval_every_steps` steps inside an epoch."""
        if finished:
            return True
        if epoch_ended:
            return position.epoch % self.eval_every_epochs == 0
        return _every(self.eval_every_steps, position.step)

    def checkpoint(self, position: Position, epoch_ended: bool, finished: bool) -> bool:
        """At the end of every epoch and of the run (wherever `max_steps` ends it), and every
        `checkpoint_every_steps` steps."""
        return epoch_ended or finished or _every(self.checkpoint_every_steps, position.step)


def _every(steps: int | None, step: int) -> bool:
    return bool(steps) and step % steps == 0
