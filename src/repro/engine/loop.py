"""The training loop. It knows nothing of how a knob works: it calls the runtime's objects."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.profiler import record_function
from torch.utils.data import DataLoader

from repro.callbacks import Callbacks
from repro.data.loader import Batches
from repro.data.samplers import EpochBatches
from repro.engine import faults
from repro.engine.cadence import Cadence
from repro.engine.checkpoint import Checkpointer, capture_rng, restore_rng
from repro.engine.ema import WeightAverage
from repro.engine.evaluation import evaluate
from repro.engine.fingerprint_log import FingerprintLog
from repro.engine.loggers import MetricsLog
from repro.engine.lookahead import Lookahead
from repro.engine.losses import PendingLosses
from repro.engine.metrics import Throughput
from repro.engine.mixing import BatchMixer
from repro.engine.position import Best, Position
from repro.engine.profiling import StepProfiler
from repro.engine.settings import LoopSettings
from repro.engine.signals import StopRequest
from repro.engine.step import OptimizerStep
from repro.errors import CheckpointError, ConfigError
from repro.objectives import TOTAL, Objective, column
from repro.progress import progress_bar
from repro.runtime import distributed
from repro.runtime.memory_format import MemoryFormat
from repro.runtime.precision import Precision


@dataclass
class Trainer:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    memory_format: MemoryFormat
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    train_loader: DataLoader
    sampler: EpochBatches
    val_loader: DataLoader
    checkpointer: Checkpointer
    metrics: MetricsLog
    fingerprints: FingerprintLog
    settings: LoopSettings
    objective: Objective  # the loss and its named terms, for training and evaluation
    extra_state: dict[str, Any]  # the config and seed, stored in every checkpoint
    total_steps: int
    dist: distributed.Context = field(default_factory=distributed.Context)
    forward_model: nn.Module | None = None  # the DDP wrapper under torchrun; None: the model
    mixer: BatchMixer | None = None  # MixUp / CutMix
    ema: WeightAverage | None = None  # trainer.ema_decay
    lookahead: Lookahead | None = None  # trainer.lookahead_every
    step: Any = None  # one optimizer step; None: an OptimizerStep over the fields above
    position: Position = field(default_factory=Position)
    last_eval: dict[str, float] = field(default_factory=dict)
    best: Best = field(default_factory=Best)
    stopped_by: int | None = None
    stopped_early: bool = False
    callbacks: Callbacks = field(default_factory=Callbacks)  # what watches the loop

    def __post_init__(self) -> None:
        if self.forward_model is None:
            self.forward_model = self.model
        if self.step is None:
            self.step = OptimizerStep(
                self.model, self.forward_model, self.optimizer, self.scheduler, self.precision,
                self.memory_format, self.settings, self.objective, self.mixer, self.ema,
            )  # fmt: skip
        self.val_batches = Batches(self.val_loader)  # one iterator: its workers start once
        self.losses = PendingLosses(
            self.fingerprints, self.settings.fingerprint_every_steps, self.dist,
            self.settings.world_invariant, self.checkpointer.folder,
        )  # fmt: skip
        self._training_since = time.perf_counter()  # train_seconds counts from here
        self._saved_at: int | None = None  # the step of this attempt's last checkpoint

    # ---- state -------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """The training device: where the model's parameters live."""
        return next(self.model.parameters()).device

    @property
    def run_dir(self) -> Path:
        """The run folder (checkpoints/ is in it)."""
        return self.checkpointer.folder.parent

    @property
    def classes(self) -> list[str]:
        """The data's class names, in label order."""
        return list(self.extra_state.get("classes", []))

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "position": self.position.state_dict(),
            "last_eval": dict(self.last_eval),
            "best": vars(self.best).copy(),
            "stopped_early": self.stopped_early,
            **{name: None if part is None else part.state_dict() for name, part in self._options()},
            "rng": self._rng_states(),
            "callbacks": self.callbacks.state_dict(),
            **self.extra_state,
        }

    def _options(self) -> list[tuple[str, Any]]:
        """The optional parts with state of their own: the weight average, lookahead."""
        return [("ema", self.ema), ("lookahead", self.lookahead)]

    def _rng_states(self) -> list[dict[str, Any]]:
        """Every rank's generator states, in rank order (rank 0's alone when the run is
        world-invariant, so that the checkpoint does not depend on the world size)."""
        states = distributed.gather(capture_rng(self.device), self.dist)
        return states[:1] if self.settings.world_invariant else states

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.precision.scaler.load_state_dict(state["scaler"])
        self.position = Position(**state["position"])
        self.last_eval = dict(state["last_eval"])
        self.best = Best(**state.get("best", {}))
        self.stopped_early = bool(state.get("stopped_early", False))
        self.callbacks.load_state_dict(state.get("callbacks") or {})
        for name, part in self._options():
            if part is not None and state.get(name) is None:
                raise CheckpointError(f"the checkpoint holds no {name} state to resume")
            if part is not None:
                part.load_state_dict(state[name])
        if self.settings.world_invariant:  # nothing depends on the world size: rank 0's will do
            restore_rng(state["rng"][0], self.device)
            return
        if len(state["rng"]) != self.dist.world:
            raise CheckpointError(
                f"the checkpoint was written by {len(state['rng'])} process(es), this run has "
                f"{self.dist.world}; resume with the same torchrun --nproc_per_node (or train "
                "with trainer.world_invariant=true)"
            )
        restore_rng(state["rng"][self.dist.rank], self.device)

    def save(self) -> None:
        state = self.state_dict()  # a collective: every rank takes part
        if self.dist.is_main:
            self.checkpointer.save(state, self.position.step)

    # ---- the loop ----------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train to the end (or a stop signal, or `halt_at_step`); the last evaluation row."""
        try:
            return self.run()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the validation workers and wait for the last checkpoint to be on disk."""
        if self.settings.sync_debug and self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
        self.val_batches.close()
        self.checkpointer.wait()

    def run(self) -> dict[str, float]:
        """The loop itself, without stopping the validation workers or waiting for the last
        checkpoint. The training batches come through one iterator from the saved position
        to the end, so its workers start once and prefetch across epoch boundaries."""
        per_epoch = self.sampler.batches_per_epoch()
        pos = self.position
        to_read = pos.batch + max(self.total_steps - pos.step, 0)  # from this epoch's start
        self.sampler.set_epoch(pos.epoch, pos.batch, epochs=-(-to_read // per_epoch))
        with Batches(self.train_loader) as batches:
            self._run(batches, per_epoch)
        return self.last_eval

    def _run(self, batches: Batches, per_epoch: int) -> None:
        watch_syncs = self.settings.sync_debug and self.device.type == "cuda"
        self.model.train()
        self._training_since = time.perf_counter()
        pos, cadence = self.position, Cadence.of(self.settings)
        profiler = StepProfiler(
            self.settings.profile_steps, self.run_dir, self.device, pos, self.dist
        )
        with StopRequest() as stop, progress_bar(self.settings.progress) as progress, profiler:
            task = progress.add_task("train", total=self.total_steps, completed=self.position.step)
            throughput = Throughput()
            while not self._finished():
                profiler.before_step()
                waited = time.perf_counter()
                images, labels = self.to_device(*next(batches))
                throughput.waited(time.perf_counter() - waited, len(labels))
                self.losses.append(self.train_step(images, labels))
                pos.batch += 1
                pos.step += 1
                if self.lookahead is not None:
                    self.lookahead.after_step(pos.step)
                self.callbacks.after_step(self)
                if not progress.disable:
                    progress.advance(task)
                faults.point("step", pos.step, settle=self.checkpointer.wait)
                if watch_syncs:  # from the second step: the first compiles and autotunes
                    torch.cuda.set_sync_debug_mode("warn")
                    watch_syncs = False
                if pos.step % self.settings.fingerprint_every_steps == 0:
                    self.flush_losses()  # with a weights hash at this step
                epoch_ended = pos.batch == per_epoch
                if epoch_ended:
                    pos.epoch, pos.batch = pos.epoch + 1, 0
                if cadence.evaluate(pos, epoch_ended, self._finished()):
                    self.evaluate_and_log(throughput)
                    if self.best.spent(self.settings.patience):
                        self.stopped_early = True  # first: the checkpoint records it
                        self.checkpoint()
                        return
                if cadence.checkpoint(pos, epoch_ended, self._finished()):
                    self.checkpoint()
                signum = stop.agreed(pos.step, self.dist)
                if signum is not None or pos.step == self.settings.halt_at_step:
                    self.checkpoint()
                    self.stopped_by = signum
                    return
            # Only when the loop never ran: a resume onto a checkpoint that was not evaluated
            # (trainer.max_steps lowered to it).
            if not self.last_eval or self.last_eval["step"] != pos.step:
                self.evaluate_and_log(throughput)
                self.checkpoint()

    def _finished(self) -> bool:
        return self.stopped_early or self.position.step >= self.total_steps

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimizer step on a batch already on the device; the objective's terms, left on
        the device."""
        return self.step(images, labels, self.position.epoch, self.position.batch)

    # ---- bookkeeping -------------------------------------------------------------------

    def flush_losses(self) -> None:
        """Write the pending per-step losses to the fingerprint log; stop on a non-finite one."""
        self.losses.flush(self.position, self.model)

    @record_function("checkpoint")  # marked in a trace of trainer.profile_steps
    def checkpoint(self) -> None:
        """Flush the pending losses, then save (unless `save_checkpoints` is off, or this
        state is on disk already: an epoch's or the run's end that is also a halt)."""
        self.flush_losses()
        self._count_training_time()
        if self.settings.save_checkpoints and self._saved_at != self.position.step:
            self.callbacks.at_checkpoint(self)
            self.save()
            self._saved_at = self.position.step
        self._training_since = time.perf_counter()

    def _count_training_time(self) -> None:
        """Add the time since training last went on to `train_seconds`. Called after a flush
        of the losses, which waits for a GPU's queued steps, so their time is counted."""
        now = time.perf_counter()
        self.position.train_seconds += now - self._training_since
        self._training_since = now

    @record_function("evaluate")  # marked in a trace of trainer.profile_steps
    def evaluate_and_log(self, throughput: Throughput) -> None:
        """Flush the pending losses, evaluate, and write the metrics row and the log line."""
        self.flush_losses()
        self._count_training_time()
        self._saved_at = None  # the evaluation changes the state a checkpoint holds
        images_per_s, wait_fraction = throughput.read()
        images_per_s *= self.dist.world  # every rank trains as many images
        # The metric is the checkpointed model's: rank 0's, buffers included.
        distributed.broadcast_buffers(self.model, self.dist)
        result = self.evaluate(self.model, keep_predictions=True)
        predictions = result.pop("predictions")
        pos = self.position
        count = pos.loss_count
        train = {column("train", TOTAL): pos.loss_sum / count if count else float("nan")}
        train |= {column("train", name): total / count for name, total in pos.term_sums.items()}
        pos.loss_sum, pos.loss_count, pos.term_sums = 0.0, 0, {}
        self.last_eval = {
            "epoch": pos.epoch,
            "step": pos.step,
            **train,
            **_columns("val", result),
            "lr": self.optimizer.param_groups[0]["lr"],
            "images_per_s": images_per_s,
            "data_wait_frac": wait_fraction,
            "train_s": pos.train_seconds,
        }
        if self.ema is not None:
            self.last_eval |= _columns("ema_val", self.evaluate(self.ema.model))
        self._track_best()
        if self.dist.is_main:
            self.metrics.row(self.last_eval)
        self.callbacks.after_evaluation(self, self.last_eval, predictions)
        throughput.reset()
        self._training_since = time.perf_counter()

    def evaluate(self, model: nn.Module, keep_predictions: bool = False) -> dict[str, Any]:
        """The objective's terms and the accuracy of `model` (the trained one or its average)
        on one validation pass (and its `Predictions`, if kept)."""
        batches = self.val_batches.take(len(self.val_loader))
        prepare, autocast = self.memory_format.batch, self.precision.autocast
        tta, objective = self.settings.tta, self.objective
        return evaluate(
            model, batches, self.to_device, prepare, autocast, self.dist, tta,
            objective=objective, keep_predictions=keep_predictions,
        )  # fmt: skip

    def _track_best(self) -> None:
        """After an evaluation: a better monitored value writes best.pt (the whole state, so
        `repro.evaluate` and a test after training read it like any checkpoint)."""
        monitor = self.settings.monitor
        if monitor not in self.last_eval:
            named = sorted(key for key in self.last_eval if key.startswith(("val_", "ema_val_")))
            raise ConfigError("trainer.monitor", monitor, f"one of this run's {', '.join(named)}")
        value = self.last_eval[monitor]
        improved = self.best.record(value, self.position.step, self.settings.monitor_mode)
        if improved and self.settings.save_checkpoints:
            state = self.state_dict()  # a collective: every rank takes part
            if self.dist.is_main:
                self.checkpointer.save_best(state, self.position.step)


def _columns(prefix: str, result: dict[str, float]) -> dict[str, float]:
    """An evaluation's results as metrics columns: `val_loss`, `val_acc`, `val_<term>` ..."""
    ordered = [TOTAL, "acc", *(name for name in result if name not in (TOTAL, "acc"))]
    return {column(prefix, name): result[name] for name in ordered}
