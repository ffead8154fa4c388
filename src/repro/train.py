"""Train an image classifier: `python -m repro.train [group=option] [key=value] ...`.

Reads top to bottom: check the config, apply the knobs, build data and model, resume if
there is a checkpoint, train, write the summary.
"""

from __future__ import annotations

if __name__ == "__main__":  # before torch is imported, so the re-exec costs next to nothing
    from repro.launch import pin_hash_seed

    pin_hash_seed("repro.train")

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from repro import build, config, launch
from repro.data import fingerprint
from repro.engine import history, preflight, resume
from repro.engine.checkpoint import Checkpointer
from repro.engine.loggers import MetricsLog, plot_curves
from repro.engine.loop import Trainer
from repro.engine.metrics import weights_sha256
from repro.errors import UserError, exit_with, one_line
from repro.files import write_json_atomic, write_text_atomic
from repro.runtime import compilation, determinism, distributed, environment, seeding, threads
from repro.runtime.memory_format import MemoryFormat
from repro.runtime.precision import Precision
from repro.runtime.transfer import reuse_host_memory, select_device, use_pinned_memory
from repro.sweeps import ERROR_FILE
from repro.sweeps.callback import SweepReport

log = logging.getLogger("repro.train")

config.register()
launch.register_resolvers()


def train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """One training run into `run_dir`; returns what summary.json holds."""
    started = time.perf_counter()
    config.validate(cfg)

    # Knobs that must be in place before any tensor is made. Under torchrun, rank 0 alone
    # writes files; every rank computes.
    dist = distributed.from_environment()
    distributed.init(dist)
    device = distributed.device_for(dist, select_device(cfg.trainer.device))
    determinism.apply(cfg.cudnn, device)  # first: cuBLAS reads its workspace when CUDA starts
    precision = Precision(cfg.amp.mode, device)
    reuse_host_memory()
    threads.apply(cfg.trainer.num_threads)
    compilation.forget_earlier_runs()
    memory_format = MemoryFormat(cfg.memory_format.name)

    # A checkpoint to continue from decides the seed of a seed=random run.
    checkpointer = Checkpointer(run_dir / "checkpoints", cfg.trainer.keep_checkpoints)
    state = resume.find(cfg.trainer.resume, checkpointer)
    if state:
        resume.check_seed(state, cfg.seed)
    root_seed = state["root_seed"] if state else seeding.resolve_seed(cfg.seed.mode, cfg.seed.value)
    root_seed = distributed.broadcast(root_seed, dist)  # one draw of seed=random for all ranks
    cfg.seed.value = root_seed
    # What this machine made of the config: a resume must not change it.
    resolved = {"device": device.type, "amp": precision.mode, "memory_format": memory_format.name}
    if state:
        resume.check_compatible(state, cfg, resolved)
    seeding.seed_globals(root_seed, rank=dist.rank)

    # Data and model.
    data = build.splits(cfg, root_seed)
    data_fingerprint = fingerprint.fingerprint(data, cfg.data.root)
    pin_memory = use_pinned_memory(cfg.dataloader.pin_memory, device)
    train_loader, sampler, val_loader = build.loaders(
        cfg, data, pin_memory, root_seed, dist.rank, dist.world, device
    )
    model = build.model(cfg, root_seed)
    preflight.check_classes(model, data, cfg.data.image_size)
    model = memory_format.model(model.to(device))
    forward_model = build.data_parallel(model, cfg.trainer.sync_batchnorm, dist, device)
    if cfg.trainer.compile:
        # The DDP wrapper, not the model inside: gradient all-reduces overlap the backward pass.
        compilation.compile_in_place(forward_model)
    optimizer = build.optimizer(cfg, model.parameters(), precision)
    total_steps = sampler.batches_per_epoch() * cfg.trainer.epochs
    if cfg.trainer.max_steps is not None:
        total_steps = min(total_steps, cfg.trainer.max_steps)
    scheduler = instantiate(cfg.scheduler, optimizer=optimizer, total_steps=total_steps)
    if state:
        done_steps = resume.check_length(state, total_steps)
        if history.already_complete(run_dir, done_steps, total_steps):
            return {**read_summary(run_dir), "already_complete": True}

    # From here on the run writes into its folder: first, this attempt's line in its history.
    run_history = history.RunHistory(run_dir)
    if dist.is_main:
        run_history.begin(cfg, start_step=state["position"]["step"] if state else 0)
    config_values = OmegaConf.to_container(cfg, resolve=True)
    if dist.is_main:
        write_text_atomic(run_dir / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    trainer = Trainer(
        model=model, optimizer=optimizer, scheduler=scheduler, precision=precision,
        memory_format=memory_format, to_device=build.device_batches(cfg, device),
        train_loader=train_loader, sampler=sampler, val_loader=val_loader,
        checkpointer=checkpointer,
        metrics=MetricsLog(run_dir, cfg.logger.tensorboard and dist.is_main),
        fingerprints=run_dir / "fingerprints.csv", trainer_cfg=cfg.trainer,
        logger_cfg=cfg.logger,
        extra_state={"config": config_values, "root_seed": root_seed, "resolved": resolved},
        total_steps=total_steps, dist=dist, forward_model=forward_model,
    )  # fmt: skip
    if state:
        trainer.load_state_dict(state)
    if dist.is_main:
        resume.truncate_logs(run_dir, trainer.position.step)  # drop rows a killed attempt wrote
    if state:
        pos = trainer.position
        log.info(
            "resumed from %s at epoch %d, batch %d, step %d",
            state["loaded_from"], pos.epoch, pos.batch, pos.step,
        )  # fmt: skip

    log.info(
        "training %s on %s | %d train / %d val images | %d steps | seed %d | amp %s | %s",
        cfg.model._target_.rsplit(".", 1)[-1], device, len(data.train), len(data.val),
        total_steps, root_seed, precision.mode, memory_format.name,
    )  # fmt: skip
    try:
        final = trainer.fit()
    except BaseException as error:
        if dist.is_main:
            run_history.end(f"failed: {one_line(error)}", trainer.position.step)
        raise
    trainer.metrics.close()

    summary = {
        **final,
        "seed": root_seed,
        "weights_sha256": weights_sha256(model),
        "wall_s": time.perf_counter() - started,
        "total_steps": total_steps,
        "step": trainer.position.step,
        "completed": trainer.position.step >= total_steps,
        "stopped_by_signal": trainer.stopped_by,
        "resumed_from_step": state["position"]["step"] if state else None,
        "amp": precision.mode,
        "amp_emulated": precision.emulated,
        "memory_format": memory_format.name,
        "pin_memory": pin_memory,
        "flags": determinism.snapshot(),
        "env": environment.describe(device),
        "data": data_fingerprint,
        "world_size": dist.world,
    }
    if dist.is_main:
        write_json_atomic(run_dir / "summary.json", summary)
        run_history.end(_result(summary), trainer.position.step)
        if cfg.logger.plot and (run_dir / "metrics.csv").exists():
            plot_curves(run_dir / "metrics.csv", run_dir / "curves.png")
    distributed.barrier(dist)  # no rank leaves before rank 0 has written everything
    return summary


def _result(summary: dict[str, Any]) -> str:
    if summary["stopped_by_signal"] is not None:
        return f"stopped by signal {summary['stopped_by_signal']}"
    return "completed" if summary["completed"] else "halted"


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


@hydra.main(config_path="../../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        summary = train(cfg, run_dir)
    except Exception as error:
        if not in_sweep:
            if isinstance(error, UserError):
                exit_with(error)
            raise
        # One job failing must not end the sweep: record why, let the launcher go on.
        log.error("job failed: %s", one_line(error), exc_info=not isinstance(error, UserError))
        write_text_atomic(run_dir / ERROR_FILE, f"{type(error).__name__}: {one_line(error)}\n")
        return None
    if summary.get("already_complete"):
        # Printed, not logged: the run's train.log stays as the finished run left it.
        print(
            f"already complete: {run_dir} holds all {summary['step']} steps of this config "
            f"(val_acc {summary['val_acc']:.4f}); nothing to do. To train longer, raise "
            "trainer.epochs or trainer.max_steps.", flush=True,
        )  # fmt: skip
        return summary["val_acc"]
    if summary["stopped_by_signal"] is not None and in_sweep:
        log.warning(
            "stopped by signal %d at step %d", summary["stopped_by_signal"], summary["step"]
        )
        return None
    if summary["stopped_by_signal"] is not None:
        signum = summary["stopped_by_signal"]
        log.warning(
            "stopped by signal %d at step %d, checkpoint saved; to resume, rerun the same "
            "command with hydra.run.dir=%s", signum, summary["step"], run_dir,
        )  # fmt: skip
        raise SystemExit(128 + signum)
    if not summary["completed"]:
        log.info("halted after step %d as asked (trainer.halt_at_step)", summary["step"])
        return None
    log.info(
        "done | val_acc %.4f val_loss %.4f | %.1f s | weights_sha256 %s | %s",
        summary["val_acc"], summary["val_loss"], summary["wall_s"], summary["weights_sha256"][:16],
        run_dir,
    )  # fmt: skip
    return summary["val_acc"]  # what a hyperparameter sweeper optimises


if __name__ == "__main__":
    sys.argv = launch.torchrun_argv(launch.expand_seed_shorthand(sys.argv))
    main()
    distributed.shutdown()
    if SweepReport.failed_jobs:
        raise SystemExit(1)
