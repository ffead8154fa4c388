"""The training loop. It knows nothing of how a knob works: it calls the runtime's objects,
one optimizer step (`step`), the objective, and its callbacks (`repro.core.watch.callbacks`), through
which weight averaging, lookahead, the progress bar, profiling and sync debugging plug in."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.profiler import record_function

from repro.core.data.loader import Batches
from repro.core.engine.cadence import Cadence
from repro.core.engine.evaluation import Predictions, evaluate, evaluation_columns
from repro.core.engine.losses import PendingLosses
from repro.core.engine.settings import Knobs, LoopData, LoopSettings, Outputs
from repro.core.errors import CheckpointError, ConfigError
from repro.core.runs import faults
from repro.core.runs.checkpoint import capture_rng, restore_rng
from repro.core.runs.position import Best, Position, RunState
from repro.core.runs.signals import StopRequest
from repro.core.runtime import distributed
from repro.core.tasks.objectives import TOTAL, Objective, checked, column
from repro.core.watch.callbacks import Callbacks
from repro.core.watch.metrics import Throughput
from repro.core.watch.scores import Scores


@dataclass
class Trainer:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: Any  # one optimizer step: engine/step.OptimizerStep or engine/invariant.InvariantStep
    objective: Objective  # the loss and its named terms, for training and evaluation
    data: LoopData
    knobs: Knobs  # the process's place in the job, device, precision, memory format
    outputs: Outputs
    settings: LoopSettings
    extra_state: dict[str, Any]  # the config and seed, stored in every checkpoint
    total_steps: int
    callbacks: Callbacks = field(default_factory=Callbacks)
    state: RunState = field(default_factory=RunState)
    scores: Scores | None = None  # the `metrics` group's, scoring every evaluation

    def __post_init__(self) -> None:
        self.dist = self.knobs.dist
        self.val_batches = Batches(self.data.val_loader)  # one iterator: its workers start once
        self.losses = PendingLosses(
            self.outputs.fingerprints, self.settings.fingerprint_every_steps, self.dist,
            self.settings.world_invariant, self.outputs.checkpointer.folder,
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
        return self.outputs.checkpointer.folder.parent

    @property
    def classes(self) -> list[str]:
        """The data's class names, in label order."""
        return list(self.extra_state.get("classes", []))

    @property
    def validates(self) -> bool:
        """Whether there is a validation split (data.val_size=0: every image trains, no pass
        validates, nothing picks "best")."""
        return len(self.data.val_loader.dataset) > 0

    def val_sample(self, index: int) -> tuple[torch.Tensor, Any]:
        """The validation split's sample `index` as evaluation reads it: the uint8 CHW image
        after the evaluation transform (resized and cropped, not normalised), and its target.
        A callback's `predictions.outputs().indices` name the samples."""
        return self.data.val_loader.dataset[index]

    def state_dict(self) -> dict[str, Any]:
        run = self.state
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.knobs.precision.scaler.state_dict(),
            "position": run.position.state_dict(),
            "last_eval": dict(run.last_eval),
            "best": vars(run.best).copy(),
            "stopped_early": run.stopped_early,
            "stop_reason": run.stop_reason,
            "components": self.callbacks.components_state(),  # the average, lookahead
            "rng": self._rng_states(),
            "callbacks": self.callbacks.state_dict(),
            **self._objective_state(),
            **self.extra_state,
        }

    def _objective_state(self) -> dict[str, Any]:
        """An objective that keeps state between calls (a running scale, a call count) saves it
        as a module or a callback does, through state_dict; one that has none adds no key, so
        its checkpoints stay as they were."""
        state = checked(self.objective).state()
        return {} if state is None else {"objective": state}

    def _rng_states(self) -> list[dict[str, Any]]:
        """Every rank's generator states, in rank order (rank 0's alone when the run is
        world-invariant, so that the checkpoint does not depend on the world size)."""
        states = distributed.gather(capture_rng(self.device), self.dist)
        return states[:1] if self.settings.world_invariant else states

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.knobs.precision.scaler.load_state_dict(state["scaler"])
        self.state = RunState(
            position=Position(**state["position"]),
            last_eval=dict(state["last_eval"]),
            best=Best(**state.get("best", {})),
            stopped_early=bool(state.get("stopped_early", False)),
            stop_reason=state.get("stop_reason"),
        )
        self.callbacks.load_components(state)
        self.callbacks.load_state_dict(state.get("callbacks") or {})
        if "objective" in state:
            checked(self.objective).restore(state["objective"])
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
            self.outputs.checkpointer.save(state, self.state.position.step)

    # ---- the loop ----------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train to the end (or a stop signal, or `halt_at_step`); the last evaluation row."""
        try:
            return self.run()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the validation workers and wait for the last checkpoint to be on disk."""
        self.val_batches.close()
        self.outputs.checkpointer.wait()

    def run(self) -> dict[str, float]:
        """The loop itself, without stopping the validation workers or waiting for the last
        checkpoint. The training batches come through one iterator from the saved position
        to the end, so its workers start once and prefetch across epoch boundaries."""
        sampler, pos = self.data.sampler, self.state.position
        per_epoch = sampler.batches_per_epoch()
        to_read = pos.batch + max(self.total_steps - pos.step, 0)  # from this epoch's start
        sampler.set_epoch(pos.epoch, pos.batch, epochs=-(-to_read // per_epoch))
        with Batches(self.data.train_loader) as batches:
            self._run(batches, per_epoch)
        return self.state.last_eval

    def _run(self, batches: Batches, per_epoch: int) -> None:
        self.model.train()
        self._training_since = time.perf_counter()
        pos, cadence, throughput = self.state.position, Cadence.of(self.settings), Throughput()
        with StopRequest() as stop, self.callbacks.running(self):
            while not self._finished():
                self.callbacks.before_step(self)
                waited = time.perf_counter()
                images, labels = self.data.to_device(*next(batches))
                throughput.waited(time.perf_counter() - waited, len(labels))
                self.losses.append(self.train_step(images, labels))
                epoch_ended = pos.advance(per_epoch)
                self.callbacks.after_step(self)  # the weight average, the components, watchers
                faults.point("step", pos.step, settle=self.outputs.checkpointer.wait)
                if pos.step % self.settings.fingerprint_every_steps == 0:
                    self.flush_losses()  # with a weights hash at this step
                if cadence.evaluate(pos, epoch_ended, self._finished()):
                    self.evaluate_and_log(throughput)  # may stop early (trainer.patience)
                if cadence.checkpoint(pos, epoch_ended, self._finished()):
                    self.checkpoint()
                signum = stop.agreed(pos.step, self.dist)
                if signum is not None or pos.step == self.settings.halt_at_step:
                    self.checkpoint()
                    self.state.stopped_by = signum
                    return
            # Only when the loop never ran: a resume onto a checkpoint that was not evaluated
            # (trainer.max_steps lowered to it).
            last = self.state.last_eval
            if not last or last["step"] != pos.step:
                self.evaluate_and_log(throughput)
                self.checkpoint()

    def stop(self, reason: str) -> None:
        """End the run after this step as a completed one: it evaluates (unless it just did),
        checkpoints, tests and writes `reason` to summary.json and attempts.jsonl. Call it from
        `after_step` or `after_evaluation`, on every rank at the same step (decide from the
        evaluation row, the same on every rank, or agree through `repro.core.runtime.distributed`):
        a rank that goes on alone waits for the others forever."""
        if not self.state.stopped_early:  # the first reason stands
            self.state.stopped_early, self.state.stop_reason = True, str(reason)

    def _finished(self) -> bool:
        return self.state.stopped_early or self.state.position.step >= self.total_steps

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimizer step on a batch already on the device; the objective's terms, left on
        the device."""
        pos = self.state.position
        return self.step(images, labels, pos.epoch, pos.batch)

    # ---- bookkeeping -------------------------------------------------------------------

    def flush_losses(self) -> None:
        """Write the pending per-step losses to the fingerprint log and the trackers; stop on
        a non-finite one."""
        values = self.losses.flush(self.state.position, self.model)
        if values and self.dist.is_main:
            self.outputs.metrics.losses(self.state.position.step - len(values) + 1, values)

    @record_function("checkpoint")  # marked in a trace of trainer.profile_steps
    def checkpoint(self) -> None:
        """Flush the pending losses, then save (unless `save_checkpoints` is off, or this
        state is on disk already: an epoch's or the run's end that is also a halt)."""
        self.flush_losses()
        self._count_training_time()
        step = self.state.position.step
        if self.settings.save_checkpoints and self._saved_at != step:
            self.callbacks.at_checkpoint(self)
            self.save()
            self._saved_at = step
        self._training_since = time.perf_counter()

    def _count_training_time(self) -> None:
        """Add the time since training last went on to `train_seconds`. Called after a flush
        of the losses, which waits for a GPU's queued steps, so their time is counted."""
        now = time.perf_counter()
        self.state.position.train_seconds += now - self._training_since
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
        predictions = result.pop("predictions", None) or Predictions(dist=self.dist)
        pos = self.state.position
        count = pos.loss_count
        train = {column("train", TOTAL): pos.loss_sum / count if count else float("nan")}
        train |= {column("train", name): total / count for name, total in pos.term_sums.items()}
        pos.loss_sum, pos.loss_count, pos.term_sums = 0.0, 0, {}
        self.state.last_eval = {
            "epoch": pos.epoch,
            "step": pos.step,
            **train,
            **evaluation_columns("val", result),
            "lr": self.optimizer.param_groups[0]["lr"],
            "images_per_s": images_per_s,
            "data_wait_frac": wait_fraction,
            "train_s": pos.train_seconds,
        }
        self.state.last_eval |= self.callbacks.extra_metrics(self)  # the weight average's
        self._track_best()
        if self.dist.is_main:
            self.outputs.metrics.row(self.state.last_eval)
        self.callbacks.after_evaluation(self, self.state.last_eval, predictions)
        throughput.reset()
        self._training_since = time.perf_counter()

    def evaluate(self, model: nn.Module, keep_predictions: bool = False) -> dict[str, Any]:
        """The objective's terms, the accuracy and the metrics of `model` (the trained one or
        its average) on one validation pass (and its `Predictions`, if kept); nothing without
        a validation split."""
        if not self.validates:
            return {}
        batches = self.val_batches.take(len(self.data.val_loader))
        prepare, autocast = self.knobs.memory_format.batch, self.knobs.precision.autocast
        tta, objective = self.settings.tta, self.objective
        return evaluate(
            model, batches, self.data.to_device, prepare, autocast, self.dist, tta,
            objective=objective, keep_predictions=keep_predictions, scores=self.scores,
            label_names=self.classes,
        )  # fmt: skip

    def _track_best(self) -> None:
        """After an evaluation: a better monitored value writes best.pt (the whole state, so
        `repro.evaluate` and a test after training read it like any checkpoint); with
        `trainer.patience` evaluations in a row without one, the run stops early."""
        run, monitor = self.state, self.settings.monitor
        if not self.validates:  # no validation split: nothing to select by (config refuses it)
            return
        if monitor not in run.last_eval:
            named = sorted(key for key in run.last_eval if key.startswith(("val_", "ema_val_")))
            raise ConfigError("trainer.monitor", monitor, f"one of this run's {', '.join(named)}")
        step = run.position.step
        improved = run.best.record(run.last_eval[monitor], step, self.settings.monitor_mode)
        patience = self.settings.patience
        if run.best.spent(patience):  # before the checkpoint
            self.stop(f"trainer.patience: {patience} evaluations without a better {monitor}")
        if improved and self.settings.save_checkpoints:
            state = self.state_dict()  # a collective: every rank takes part
            if self.dist.is_main:
                self.outputs.checkpointer.save_best(state, step)
