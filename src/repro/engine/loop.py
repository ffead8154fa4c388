"""The training loop. It knows nothing of how a knob works: it calls the runtime's objects."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn
from torch.utils.data import DataLoader

from repro.data.loader import EpochBatches, close
from repro.engine import faults
from repro.engine.checkpoint import Checkpointer, capture_rng, restore_rng
from repro.engine.loggers import MetricsLog
from repro.engine.metrics import Throughput, evaluate, weights_sha256
from repro.engine.signals import StopRequest
from repro.errors import CheckpointError, UserError
from repro.runtime import distributed
from repro.runtime.memory_format import MemoryFormat
from repro.runtime.precision import Precision

log = logging.getLogger(__name__)


SIGNAL_SYNC_STEPS = 10


class NonFiniteLossError(UserError):
    """The loss became NaN or infinite: a diverged run, reported with its step."""


@dataclass
class Position:
    """Where the run is: `batch` batches of `epoch` done, `step` optimizer steps in all,
    and the training loss summed since the last evaluation (for its metrics row)."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0


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
    fingerprints: Path
    trainer_cfg: Any
    logger_cfg: Any
    extra_state: dict[str, Any]  # the config and seed, stored in every checkpoint
    total_steps: int
    dist: distributed.Context = field(default_factory=distributed.Context)
    forward_model: nn.Module | None = None  # the DDP wrapper under torchrun, else the model
    position: Position = field(default_factory=Position)
    last_eval: dict[str, float] = field(default_factory=dict)
    stopped_by: int | None = None

    # ---- state -------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """The training device: where the model's parameters live."""
        return next(self.model.parameters()).device

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "position": vars(self.position).copy(),
            "last_eval": dict(self.last_eval),
            "rng": distributed.gather(capture_rng(self.device), self.dist),  # in rank order
            **self.extra_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.precision.scaler.load_state_dict(state["scaler"])
        self.position = Position(**state["position"])
        self.last_eval = dict(state["last_eval"])
        if len(state["rng"]) != self.dist.world:
            raise CheckpointError(
                f"the checkpoint was written by {len(state['rng'])} process(es), this run has "
                f"{self.dist.world}; resume with the same torchrun --nproc_per_node"
            )
        restore_rng(state["rng"][self.dist.rank], self.device)

    def save(self) -> None:
        state = self.state_dict()  # a collective: every rank takes part
        if self.dist.is_main:
            self.checkpointer.save(state, self.position.step)

    # ---- the loop ----------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        try:
            return self._fit()
        finally:
            if self._options.sync_debug and self.device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
            close(self.train_loader)
            close(self.val_loader)
            self.checkpointer.wait()  # the run ends with its last checkpoint on disk

    def _fit(self) -> dict[str, float]:
        cfg = self._options
        fingerprint_every = int(self.logger_cfg.fingerprint_every_steps)
        batches_per_epoch = self.sampler.batches_per_epoch()
        watch_syncs = cfg.sync_debug and self.device.type == "cuda"
        self.model.train()
        with StopRequest() as stop, self._progress() as progress:
            task = progress.add_task("train", total=self.total_steps, completed=self.position.step)
            throughput = Throughput()
            losses: list[torch.Tensor] = []
            while not self._finished():
                pos = self.position
                self.sampler.set_epoch(pos.epoch, start_batch=pos.batch)
                batches = iter(self.train_loader)
                for _ in range(pos.batch, batches_per_epoch):
                    waited = time.perf_counter()
                    images, labels = self.to_device(*next(batches))
                    throughput.waited(time.perf_counter() - waited, len(labels))
                    losses.append(self._train_step(images, labels))
                    pos.batch += 1
                    pos.step += 1
                    if not progress.disable:
                        progress.advance(task)
                    faults.point("step", pos.step, settle=self.checkpointer.wait)
                    if watch_syncs:  # from the second step: the first compiles and autotunes
                        torch.cuda.set_sync_debug_mode("warn")
                        watch_syncs = False
                    if pos.step % fingerprint_every == 0:
                        self._flush_losses(losses)  # with a weights hash at this step
                    if pos.batch == batches_per_epoch:
                        pos.epoch, pos.batch = pos.epoch + 1, 0
                        if pos.epoch % cfg.eval_every_epochs == 0 or self._finished():
                            self._evaluate_and_log(losses, throughput)
                        self._checkpoint(losses)
                    elif cfg.eval_every_steps and pos.step % cfg.eval_every_steps == 0:
                        self._evaluate_and_log(losses, throughput)
                    if cfg.checkpoint_every_steps and pos.step % cfg.checkpoint_every_steps == 0:
                        self._checkpoint(losses)
                    signum = self._agreed_signal(stop)
                    if signum is not None or pos.step == cfg.halt_at_step:
                        self._checkpoint(losses)
                        self.stopped_by = signum
                        return self.last_eval
                    if self._finished():
                        break
                del batches  # end this epoch's iterator before the next one starts
            if not self.last_eval or self.last_eval["step"] != self.position.step:
                self._evaluate_and_log(losses, throughput)
                self._checkpoint(losses)
        return self.last_eval

    def _finished(self) -> bool:
        return self.position.step >= self.total_steps

    def _agreed_signal(self, stop: StopRequest) -> int | None:
        """The stop signal, if any rank got one: all ranks must stop at the same step. Under
        torchrun the ranks agree every SIGNAL_SYNC_STEPS steps only: an all-reduce read on
        the host waits for the GPU, and doing it every step would drain its queue each time."""
        if not self.dist.enabled:
            return stop.signum
        if self.position.step % SIGNAL_SYNC_STEPS:
            return None
        flag = torch.tensor([stop.signum or 0])
        signum = int(distributed.max_tensor(flag, self.dist).item())
        return signum or None

    @cached_property
    def _options(self) -> Any:
        """The trainer config as plain values, read once: a DictConfig read costs microseconds,
        and the loop reads several on every step."""
        if isinstance(self.trainer_cfg, DictConfig):
            return SimpleNamespace(**OmegaConf.to_container(self.trainer_cfg, resolve=True))
        return self.trainer_cfg

    def _train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        smoothing, grad_clip = self._options.label_smoothing, self._options.grad_clip
        images = self.memory_format.batch(images)
        with self.precision.autocast():
            logits = (self.forward_model or self.model)(images)
            loss = nn.functional.cross_entropy(logits, labels, label_smoothing=smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.precision.scaler
        scaler.scale(loss).backward()
        if grad_clip is not None:
            scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
        scaler.step(self.optimizer)
        scaler.update()
        self.scheduler.step()
        return loss.detach()

    # ---- bookkeeping -------------------------------------------------------------------

    def _flush_losses(self, losses: list[torch.Tensor]) -> None:
        """Write pending per-step losses to the fingerprint log; stop on a non-finite one.

        Losses stay on the device between flushes so that steps never wait for the host.
        """
        if not losses:
            return
        stacked = torch.stack(losses).double()
        if self.dist.enabled:  # the loss of a step is the mean over ranks
            stacked = distributed.sum_tensor(stacked, self.dist) / self.dist.world
        values = stacked.cpu().tolist()
        first_step = self.position.step - len(values) + 1
        lines = []
        for offset, value in enumerate(values):
            step = first_step + offset
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"loss is {value} at step {step}; the last good checkpoint is kept in "
                    f"{self.checkpointer.folder} (lower optimizer.lr or set trainer.grad_clip)"
                )
            lines.append(f"{step},{value!r},")
        if self.dist.is_main:
            if self.position.step % self.logger_cfg.fingerprint_every_steps == 0:
                lines[-1] += weights_sha256(self.model)
            with self.fingerprints.open("a") as handle:
                handle.write("\n".join(lines) + "\n")
        self.position.loss_sum += sum(values)
        self.position.loss_count += len(values)
        losses.clear()

    def _checkpoint(self, losses: list[torch.Tensor]) -> None:
        self._flush_losses(losses)
        if self.trainer_cfg.save_checkpoints:
            self.save()

    def _evaluate_and_log(self, losses: list[torch.Tensor], throughput: Throughput) -> None:
        self._flush_losses(losses)
        images_per_s, wait_fraction = throughput.read()
        images_per_s *= self.dist.world  # every rank trains as many images
        # The metric is the checkpointed model's: rank 0's, buffers included.
        distributed.broadcast_buffers(self.model, self.dist)
        result = evaluate(
            self.model,
            self.val_loader,
            self.to_device,
            self.memory_format.batch,
            self.precision.autocast,
            self.dist,
        )
        pos = self.position
        train_loss = pos.loss_sum / pos.loss_count if pos.loss_count else float("nan")
        pos.loss_sum, pos.loss_count = 0.0, 0
        self.last_eval = {
            "epoch": pos.epoch, "step": pos.step, "train_loss": train_loss,
            "val_loss": result["loss"], "val_acc": result["acc"],
            "lr": self.optimizer.param_groups[0]["lr"],
            "images_per_s": images_per_s, "data_wait_frac": wait_fraction,
        }  # fmt: skip
        if not self.dist.is_main:
            throughput.reset()
            return
        self.metrics.row(self.last_eval)
        log.info(
            "epoch %d step %d | train_loss %.4f val_loss %.4f val_acc %.4f | lr %.4g | "
            "%.0f img/s, %.1f%% waiting for data",
            pos.epoch, pos.step, train_loss, result["loss"], result["acc"],
            self.last_eval["lr"], images_per_s, 100 * wait_fraction,
        )  # fmt: skip
        throughput.reset()

    def _progress(self) -> Progress:
        enabled = {"on": True, "off": False}.get(self.logger_cfg.progress, sys.stdout.isatty())
        return Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeRemainingColumn(), disable=not enabled, transient=True,
        )  # fmt: skip
