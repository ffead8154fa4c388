"""One assembly of a run, shared by training and the benchmarks, so that what is measured is
what trains: the knobs applied in their order, then data, model, optimizer and schedule.

`apply_knobs` comes before anything makes a tensor; `build` draws the model's weights from the
seeded generators, so the order of its steps is part of every run's weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn
from torch.utils.data import DataLoader

from repro.core import build, tasks
from repro.core.data.datasets import Splits
from repro.core.data.loader import LoaderContext
from repro.core.data.samplers import EpochBatches
from repro.core.engine import preflight
from repro.core.engine.invariant import InvariantStep
from repro.core.engine.loop import Trainer
from repro.core.engine.mixing import BatchMixer
from repro.core.engine.settings import Knobs, LoopData, LoopSettings, Outputs
from repro.core.engine.step import OptimizerStep
from repro.core.errors import ConfigError
from repro.core.runs import init_weights
from repro.core.runs.checkpoint import Checkpointer
from repro.core.runs.fingerprint_log import FingerprintLog
from repro.core.runtime import compilation, determinism, distributed, threads
from repro.core.runtime.devices import reuse_host_memory, select_device, use_pinned_memory
from repro.core.runtime.memory_format import MemoryFormat
from repro.core.runtime.precision import Precision
from repro.core.watch import callbacks, trackers
from repro.core.watch.loggers import MetricsLog
from repro.core.watch.profiling import watchers
from repro.core.watch.scores import Scores, build_scores


@dataclass
class Parts:
    """The training objects of one run, before the Trainer ties them together."""

    data: Splits
    context: LoaderContext  # what the loaders were built for: seed, rank, device, pinning
    train_loader: DataLoader
    sampler: EpochBatches
    val_loader: DataLoader
    model: nn.Module
    forward_model: nn.Module  # the DDP wrapper under torchrun, else the model
    optimizer: torch.optim.Optimizer
    scheduler: Any
    total_steps: int
    normalisation: dict[str, Any]  # the inputs' mean, std, size, interpolation
    initialised: dict[str, Any] | None = None  # trainer.init_weights: what was loaded
    scores: Scores | None = None  # the `metrics` group's, for the data's classes


def apply_knobs(cfg: Any, dist: distributed.Context) -> Knobs:
    """The settings that must be in place before any tensor is made, in their order."""
    device = distributed.device_for(dist, select_device(cfg.trainer.device))
    determinism.apply(cfg.cudnn, device)  # first: cuBLAS reads its workspace when CUDA starts
    precision = Precision(cfg.amp.mode, device)
    reuse_host_memory()
    threads.apply(cfg.trainer.num_threads)
    compilation.forget_earlier_runs()  # a sequential multirun or a bench row starts afresh
    return Knobs(dist, device, precision, MemoryFormat(cfg.memory_format.name))


def build_parts(
    cfg: Any, knobs: Knobs, root_seed: int, data: Splits, initialise: bool = True
) -> Parts:
    """Loaders over `data`, model (checked against the data; started from
    `trainer.init_weights` unless `initialise` is off, as for a resume, whose checkpoint holds
    the weights), optimizer and schedule."""
    pin_memory = use_pinned_memory(cfg.dataloader.pin_memory, knobs.device)
    rank, world = knobs.dist.rank, knobs.dist.world
    context = LoaderContext(root_seed, rank, world, knobs.device, pin_memory)
    # The model first: a pretrained one says how its inputs are made (its own stream draws
    # its weights, so the order changes nothing else).
    model = build.model(cfg, root_seed, num_classes=len(data.classes))
    norm = build.normalisation(cfg, model)
    train_loader, sampler, val_loader = build.loaders(cfg, data, context, norm)
    build.fit_to_data(
        model, cfg, data, root_seed
    )  # before init_weights or a resume: they overwrite it
    initialised = None
    if cfg.trainer.init_weights is not None and initialise:
        path = Path(cfg.trainer.init_weights).expanduser()
        initialised = init_weights.load_on_every_rank(model, path, knobs.dist)
    preflight.check_classes(model, data, norm["image_size"], tasks.of_config(cfg.objective))
    tasks.check_selection(cfg, len(data.val))  # "best" out of too few images is noise
    model = knobs.memory_format.model(model.to(knobs.device))
    forward_model = (
        model  # the micro-batch gradient exchange replaces DDP's all-reduce
        if cfg.trainer.world_invariant
        else build.data_parallel(model, cfg.trainer.sync_batchnorm, knobs.dist, knobs.device)
    )
    if cfg.trainer.compile:
        # The DDP wrapper, not the model inside: gradient all-reduces overlap the backward pass.
        compilation.compile_in_place(forward_model)
    optimizer = build.optimizer(cfg, model, knobs.precision)
    total_steps = sampler.batches_per_epoch() * cfg.trainer.epochs
    if cfg.trainer.max_steps is not None:
        total_steps = min(total_steps, cfg.trainer.max_steps)
    scheduler = instantiate(cfg.scheduler, optimizer=optimizer, total_steps=total_steps)
    loaders = {"train_loader": train_loader, "sampler": sampler, "val_loader": val_loader}
    return Parts(
        data=data,
        context=context,
        **loaders,
        model=model,
        forward_model=forward_model,
        optimizer=optimizer,
        scheduler=scheduler,
        total_steps=total_steps,
        normalisation=norm,
        initialised=initialised,
        scores=build_scores(cfg.get("metrics"), len(data.classes)),
    )


def outputs(
    cfg: Any, run_dir: Path, checkpointer: Checkpointer, dist: distributed.Context
) -> Outputs:
    """Where a run's Trainer writes (TensorBoard on rank 0 only, with `logger.tensorboard`)."""
    tracking = trackers.from_config(cfg, run_dir) if dist.is_main else []
    metrics = MetricsLog(run_dir, cfg.logger.tensorboard and dist.is_main, tracking)
    return Outputs(checkpointer, metrics, FingerprintLog.of_run(run_dir))


def trainer(
    cfg: Any,
    knobs: Knobs,
    parts: Parts,
    outputs: Outputs,
    extra_state: dict[str, Any],
) -> Trainer:
    """The loop over `parts`. Every checkpoint holds `extra_state` (the config and the seed)
    and the values a resume must find unchanged (`Knobs.resolved`)."""
    objective, settings = build.objective(cfg), LoopSettings.from_config(cfg)
    components = callbacks.build_components(cfg.get("components"), parts.model, parts.total_steps)
    objective.components = components  # a teacher, for an objective that asks (a Batch)
    if cfg.trainer.world_invariant:
        step: Any = _invariant_step(cfg, knobs, parts, objective)
    else:
        mixer = _mixer(cfg, parts.context.root_seed, knobs.dist.rank)
        step = OptimizerStep(
            parts.model, parts.forward_model, parts.optimizer, parts.scheduler,
            knobs.precision, knobs.memory_format, settings, objective, mixer,
        )  # fmt: skip
    data = LoopData(
        parts.train_loader, parts.sampler, parts.val_loader,
        build.device_batches(cfg, knobs.device, parts.normalisation),
    )  # fmt: skip
    run_dir = outputs.checkpointer.folder.parent
    builtin = watchers(cfg.trainer, cfg.logger, run_dir, knobs.device, knobs.dist)
    return Trainer(
        model=parts.model,
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        step=step,
        objective=objective,
        data=data,
        knobs=knobs,
        outputs=outputs,
        settings=settings,
        extra_state={
            **extra_state,
            "resolved": knobs.resolved(),
            "normalisation": parts.normalisation,
        },
        total_steps=parts.total_steps,
        callbacks=callbacks.build(cfg.get("callbacks"), builtin, components),
        scores=parts.scores,
    )


def _invariant_step(cfg: Any, knobs: Knobs, parts: Parts, objective: Any) -> InvariantStep:
    """The optimizer step of `trainer.world_invariant`, checked against this world."""
    per_rank, micro = build.rank_batch_size(cfg, knobs.dist.world), cfg.trainer.micro_batch
    if per_rank % micro:
        allowed = f"a divisor of the {per_rank} images each of {knobs.dist.world} ranks gets"
        raise ConfigError("trainer.micro_batch", micro, allowed)
    if knobs.precision.mode == "fp16":
        raise ConfigError("amp", "fp16", "off or bf16 with trainer.world_invariant=true")
    if knobs.device.type == "cpu" and cfg.trainer.num_threads is None:
        # A CPU kernel's sums follow the thread count, and torchrun sets OMP_NUM_THREADS=1
        # for several processes only: the count must not depend on the launch.
        allowed = "a fixed count (e.g. 1) with trainer.world_invariant=true on CPU"
        raise ConfigError("trainer.num_threads", None, allowed)
    return InvariantStep(
        parts.model, parts.optimizer, parts.scheduler, knobs.precision, knobs.memory_format,
        LoopSettings.from_config(cfg), objective, micro, parts.context.root_seed, knobs.dist,
    )  # fmt: skip


def _mixer(cfg: Any, root_seed: int, rank: int) -> BatchMixer | None:
    """MixUp/CutMix when `augment` asks for either (and the data is augmented at all)."""
    augment = cfg.augment
    mixer = BatchMixer(augment.mixup_alpha, augment.cutmix_alpha, root_seed, rank)
    return mixer if mixer.enabled and cfg.data.augment else None
