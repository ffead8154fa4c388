"""One training run into a folder, top to bottom: check the config, own the folder, apply the
knobs, resume if there is a checkpoint, build data, model and loop, fit, test, record.

`python -m repro.train` (repro/train.py) is the command around it: Hydra's composition, the
exit status, a sweep's failed jobs. The test kit and `repro.verify` call `train` directly.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

from repro.core import build, config, tasks
from repro.core.data import fingerprint
from repro.core.engine import assembly, final_test
from repro.core.engine.loop import Trainer
from repro.core.files import write_json_atomic, write_text_atomic
from repro.core.guards import received
from repro.core.runs import history, resume, run_lock
from repro.core.runs.checkpoint import Checkpointer
from repro.core.runtime import determinism, distributed, environment, seeding
from repro.core.watch import loggers
from repro.core.watch.loggers import MetricsLog, plot_curves
from repro.core.watch.metrics import weights_sha256

log = logging.getLogger("repro.train")


def train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """One training run into `run_dir`; returns what summary.json holds."""
    started = time.perf_counter()
    config.validate(cfg)
    dist = distributed.from_environment()  # under torchrun every rank computes, rank 0 writes
    distributed.init(dist)
    # One live process trains in a folder at a time, and never through a link out of it.
    with run_lock.owned(run_dir, dist):
        return _train(cfg, run_dir, dist, started)


def _train(
    cfg: DictConfig, run_dir: Path, dist: distributed.Context, started: float
) -> dict[str, Any]:
    """`train`, in a run folder this process owns."""
    knobs = assembly.apply_knobs(cfg, dist)

    # A checkpoint to continue from decides the seed, and must fit the config and the data.
    checkpointer = Checkpointer(run_dir / "checkpoints", cfg.trainer.keep_checkpoints)
    state = resume.find(cfg.trainer.resume, checkpointer)
    root_seed = _root_seed(cfg, state, dist)
    # What the run records as its config: the one asked for, with the seed it actually used
    # (drawn, with seed=random). The config asked for is never written to.
    recorded = copy.deepcopy(cfg)
    recorded.seed.value = root_seed
    recorded.trainer.monitor = tasks.monitor(cfg)  # `auto` as the objective's task resolves it
    if state:
        resume.check_compatible(state, recorded, knobs.resolved())
    seeding.seed_globals(root_seed, rank=dist.rank)

    data = build.splits(cfg, root_seed)
    parts = assembly.build_parts(cfg, knobs, root_seed, data, initialise=state is None)
    if state:
        resume.check_same_data(state, parts.data, cfg.data.root)
    data_fingerprint = fingerprint.fingerprint(parts.data, cfg.data.root) if dist.is_main else None
    if state and _already_complete(run_dir, state, parts.total_steps):
        return {**read_summary(run_dir), "already_complete": True}

    # From here on the run writes into its folder: first, this attempt's line in its history,
    # which says how the attempt ended whatever stops it (but SIGKILL: the next one says so).
    run_history = history.RunHistory(run_dir)
    start_step = state["position"]["step"] if state else 0
    if dist.is_main:
        env = environment.describe(knobs.device)
        run_history.begin(recorded, start_step, resume.provenance(state, run_dir), env)
    trainer = None
    try:
        if dist.is_main:
            resolved = OmegaConf.to_yaml(recorded, resolve=True)
            write_text_atomic(run_dir / "resolved_config.yaml", resolved)
        outputs = assembly.outputs(recorded, run_dir, checkpointer, dist)  # trackers log it
        # What the weights started from stays the first attempt's record (a resume loads none).
        started_from = state.get("init_weights") if state else parts.initialised
        saved = {
            "config": OmegaConf.to_container(recorded, resolve=True),
            "root_seed": root_seed,
            "init_weights": started_from,
            "classes": list(parts.data.classes),  # names for repro.predict's output
            "split_sizes": resume.split_sizes(parts.data),  # a resume checks its data by them
            "split_digests": resume.split_digests(parts.data),
        }
        trainer = assembly.trainer(cfg, knobs, parts, outputs, saved)
        _start(trainer, state, run_dir)
        log.info("training %s", _describe(recorded, parts, knobs))
        trainer.fit()
        trainer.outputs.metrics.close()

        summary = _summary(trainer, parts, knobs, started, state) | {"data": data_fingerprint}
        summary |= final_test.test_after_fit(cfg, trainer, parts)  # with trainer.test_after_fit
        trainer.callbacks.at_end(trainer, summary)
        if dist.is_main:
            _write_records(run_dir, summary, run_history, cfg, trainer.outputs.metrics)
    except BaseException as error:
        if dist.is_main:
            step = trainer.state.position.step if trainer is not None else start_step
            run_history.fail(error, step)
        raise
    distributed.barrier(dist)  # no rank leaves before rank 0 has written everything
    return summary


def _root_seed(cfg: DictConfig, state: dict | None, dist: distributed.Context) -> int:
    """The checkpoint's seed when resuming (a fixed seed asked for must match it), else the
    config's or, with seed=random, one drawn once and shared by every rank."""
    if state:
        resume.check_seed(state, cfg.seed)
        return int(state["root_seed"])
    seed = seeding.resolve_seed(cfg.seed.mode, cfg.seed.value)
    return distributed.broadcast(seed, dist)


def _already_complete(run_dir: Path, state: dict, total_steps: int) -> bool:
    """A finished run (or one stopped early) rerun as it was: nothing to do. A shorter one is
    refused."""
    done_steps = resume.check_length(state, total_steps)
    if state.get("stopped_early"):
        return history.already_complete(run_dir, done_steps, done_steps)
    return history.already_complete(run_dir, done_steps, total_steps)


def _start(trainer: Trainer, state: dict | None, run_dir: Path) -> None:
    """Load the resume state; drop the log rows and best weights a killed attempt wrote
    after it."""
    if state:
        trainer.load_state_dict(state)
    if trainer.dist.is_main:
        loggers.truncate_logs(run_dir, trainer.state.position.step)
        trainer.outputs.checkpointer.settle_best(trainer.state.best.step)
    if state:
        pos = trainer.state.position
        where = f"at epoch {pos.epoch}, batch {pos.batch}, step {pos.step}"
        log.info("resumed from %s %s", state["loaded_from"], where)


def _describe(cfg: DictConfig, parts: assembly.Parts, knobs: assembly.Knobs) -> str:
    name = cfg.model._target_.rsplit(".", 1)[-1]
    model = f"{name} ({_parameters(parts.model) / 1e6:.2f}M parameters)"
    images = f"{len(parts.data.train)} train / {len(parts.data.val)} val images"
    settings = f"seed {cfg.seed.value} | amp {knobs.precision.mode} | {knobs.memory_format.name}"
    return f"{model} on {knobs.device} | {images} | {parts.total_steps} steps | {settings}"


def _parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def _summary(
    trainer: Trainer,
    parts: assembly.Parts,
    knobs: assembly.Knobs,
    started: float,
    state: dict[str, Any] | None,
) -> dict[str, Any]:
    """What summary.json holds, but the data fingerprint: the last evaluation and how the run
    got there. `started` is the `time.perf_counter()` of this process's start of training."""
    position = trainer.state.position
    return {
        **trainer.state.last_eval,
        "seed": trainer.extra_state["root_seed"],
        "weights_sha256": weights_sha256(trainer.model),
        "wall_s": time.perf_counter() - started,
        "train_s": position.train_seconds,
        "total_steps": trainer.total_steps,
        "parameters": _parameters(trainer.model),
        "init_weights": trainer.extra_state["init_weights"],
        "step": position.step,
        "completed": position.step >= trainer.total_steps or trainer.state.stopped_early,
        "stopped_early": trainer.state.stopped_early,
        "stop_reason": trainer.state.stop_reason,
        f"best_{trainer.settings.monitor}": trainer.state.best.value,
        "best_step": trainer.state.best.step,
        "stopped_by_signal": trainer.state.stopped_by,
        "resumed_from_step": state["position"]["step"] if state else None,
        "amp": knobs.precision.mode,
        "amp_emulated": knobs.precision.emulated,
        "memory_format": knobs.memory_format.name,
        "pin_memory": parts.context.pin_memory,
        "flags": determinism.snapshot(),
        "env": environment.describe(knobs.device),
        "world_size": knobs.dist.world,
        "normalisation": parts.normalisation,
    }


def _write_records(
    run_dir: Path,
    summary: dict[str, Any],
    run_history: history.RunHistory,
    cfg: DictConfig,
    metrics: MetricsLog,
) -> None:
    """summary.json, the attempt's result in the run history, the curves, then all of it to
    the experiment trackers."""
    write_json_atomic(run_dir / "summary.json", summary)
    run_history.end(_result(summary), summary["step"])
    if cfg.logger.plot and (run_dir / "metrics.csv").exists():
        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png")
    metrics.finish(summary)


def _result(summary: dict[str, Any]) -> str:
    if summary["stopped_by_signal"] is not None:
        return f"stopped by signal {summary['stopped_by_signal']}"
    if summary["stop_reason"] is not None:
        return f"completed, stopped early: {summary['stop_reason']}"
    return "completed" if summary["completed"] else "halted"


def read_summary(run_dir: Path) -> dict[str, Any]:
    return received.load_json(run_dir / "summary.json", root=run_dir)
