"""What the loop is given besides its model: the settings it reads from the config (read
once), what this machine made of the knobs, its data and where it writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from repro.core import tasks
from repro.core.runtime import distributed
from repro.core.runtime.memory_format import MemoryFormat
from repro.core.runtime.precision import Precision

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from repro.core.data.samplers import EpochBatches
    from repro.core.runs.checkpoint import Checkpointer
    from repro.core.runs.fingerprint_log import FingerprintLog
    from repro.core.watch.loggers import MetricsLog


@dataclass(frozen=True)
class Knobs:
    """This process's place in the job, and what this machine made of the config's device,
    precision and layout settings."""

    dist: distributed.Context
    device: torch.device
    precision: Precision
    memory_format: MemoryFormat

    def resolved(self) -> dict[str, str]:
        """The values a resume must find unchanged (stored in every checkpoint)."""
        return {
            "device": self.device.type,
            "amp": self.precision.mode,
            "memory_format": self.memory_format.name,
        }


@dataclass(frozen=True)
class LoopData:
    """The loop's batches: training batches from the sampler's position, validation passes,
    and the copy of a batch to the device (normalised)."""

    train_loader: DataLoader
    sampler: EpochBatches
    val_loader: DataLoader
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Outputs:
    """Where a loop writes: checkpoints, the metrics log and the fingerprint log."""

    checkpointer: Checkpointer
    metrics: MetricsLog
    fingerprints: FingerprintLog


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
    fingerprint_every_steps: int = 50
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
            fingerprint_every_steps=int(logger.fingerprint_every_steps),
            monitor=tasks.monitor(cfg),
            monitor_mode=str(trainer.monitor_mode),
            patience=trainer.patience,
            accumulate_steps=int(trainer.accumulate_steps),
            world_invariant=bool(trainer.world_invariant),
            tta=str(trainer.tta),
        )
