"""The loop's settings: what `engine/loop.py` reads from a run's config, read once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoopSettings:
    """What the loop reads from the config, as plain values read once: a DictConfig read costs
    microseconds, and the loop reads several on every step."""

    grad_clip: float | None = None
    eval_every_epochs: int = 1
    eval_every_steps: int | None = None
    checkpoint_every_steps: int | None = None
    halt_at_step: int | None = None
    save_checkpoints: bool = True
    sync_debug: bool = False
    profile_steps: tuple[int, int] | None = None
    fingerprint_every_steps: int = 50
    progress: str = "auto"
    monitor: str = "val_acc"
    monitor_mode: str = "max"
    patience: int | None = None
    accumulate_steps: int = 1
    world_invariant: bool = False
    tta: str = "none"

    @classmethod
    def from_config(cls, cfg: Any) -> LoopSettings:
        """From a run's config: its `trainer` and `logger` sections."""
        trainer, logger = cfg.trainer, cfg.logger
        return cls(
            grad_clip=trainer.grad_clip,
            eval_every_epochs=int(trainer.eval_every_epochs),
            eval_every_steps=trainer.eval_every_steps,
            checkpoint_every_steps=trainer.checkpoint_every_steps,
            halt_at_step=trainer.halt_at_step,
            save_checkpoints=bool(trainer.save_checkpoints),
            sync_debug=bool(trainer.sync_debug),
            profile_steps=_window(trainer.profile_steps),
            fingerprint_every_steps=int(logger.fingerprint_every_steps),
            progress=str(logger.progress),
            monitor=str(trainer.monitor),
            monitor_mode=str(trainer.monitor_mode),
            patience=trainer.patience,
            accumulate_steps=int(trainer.accumulate_steps),
            world_invariant=bool(trainer.world_invariant),
            tta=str(trainer.tta),
        )


def _window(steps: Any) -> tuple[int, int] | None:
    """`trainer.profile_steps` as (first, last), or None."""
    return None if steps is None else (int(steps[0]), int(steps[1]))
