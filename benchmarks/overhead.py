"""suite=overhead: what the template's loop costs over a bare loop.

A (template): `Trainer.run` itself, as `python -m repro.train` runs it: data-wait accounting,
losses kept on the device and flushed to fingerprints.csv with a weights hash, the progress
bar, stop-signal and fault checks. Only the evaluation and the checkpoint at the end of a
repetition are left out (a bare loop has neither).
B (bare): the loop a tutorial would write, here, on the same model, optimizer, scheduler,
DataLoader and knobs: copy to the device, normalise, autocast, cross-entropy, zero_grad,
backward, step (no side-stream prefetch: that is the template's). On CPU both get the batches
loader workers already normalised (the template's DataLoader does that); the bare loop skips
its own normalising then.

Both run in this process over the same batches (a pair uses one epoch), interleaved
A B B A A B ... so that drift in the machine's speed hits both alike. The result is
`template_over_bare` = template images/s / bare images/s, the median over the pairs.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from benchmarks import common
from benchmarks.common import Column, Result
from repro.core import build
from repro.core.data.loader import Batches
from repro.core.engine.loop import Trainer
from repro.core.runs.position import Position, RunState
from repro.core.watch.metrics import Throughput

ACCEPT = 0.97

COLUMNS = [
    Column("pair", "pair", "{:d}"),
    Column("loop", "loop"),
    Column("seconds", "seconds", "{:.3f}"),
    Column("images_per_s", "img/s", "{:.0f}"),
    Column("template_over_bare", "template / bare", "{:.3f}"),
]


class TemplateLoop(Trainer):
    """The real loop, minus the end-of-run evaluation and checkpoint (losses still flushed)."""

    def evaluate_and_log(self, throughput: Throughput) -> None:
        self.flush_losses()
        _, wait = throughput.read()
        self.state.last_eval = {"step": self.state.position.step, "data_wait_frac": wait}

    def checkpoint(self) -> None:
        self.flush_losses()


def template(trainer: Trainer, epoch: int, steps: int, clock: common.Clock) -> float:
    trainer.state, trainer.total_steps = RunState(Position(epoch=epoch)), steps
    clock.sync()
    started = time.perf_counter()
    trainer.run()
    clock.sync()
    return time.perf_counter() - started


def bare(trainer: Trainer, epoch: int, steps: int, clock: common.Clock) -> float:
    """A plain loop over the trainer's own objects; nothing of the template's bookkeeping."""
    model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.scheduler
    scaler, dtype = trainer.knobs.precision.scaler, trainer.knobs.precision.dtype
    device = trainer.device
    norm = trainer.data.to_device  # only its precomputed scale and shift tensors are used
    channels_last = trainer.knobs.memory_format.format is torch.channels_last
    # The default objective, written out: its smoothing read from the built one (Checked).
    smoothing = getattr(trainer.objective.objective, "label_smoothing", 0.0)
    clip = trainer.settings.grad_clip
    loader = getattr(
        trainer.data.train_loader, "wrapped", trainer.data.train_loader
    )  # the DataLoader
    trainer.data.sampler.set_epoch(epoch)
    clock.sync()
    started = time.perf_counter()
    with Batches(loader) as batches:
        for images, labels in batches.take(steps):
            images = images.to(device, non_blocking=True)
            if not images.is_floating_point():  # CPU loader workers hand over normalised floats
                images = images.float().mul_(norm.scale).add_(norm.shift)
            labels = labels.to(device, non_blocking=True)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            autocast = torch.autocast(
                device.type, dtype=dtype or torch.bfloat16, enabled=bool(dtype)
            )
            with autocast:
                loss = nn.functional.cross_entropy(model(images), labels, label_smoothing=smoothing)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if clip is not None:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
    clock.sync()
    return time.perf_counter() - started


def run(cfg: DictConfig, run_dir: Path) -> Result:
    suite = cfg.suite
    pairs, steps, warmup = int(suite.pairs), int(suite.steps), int(suite.warmup_steps)
    data = build.splits(cfg, int(cfg.seed.value))
    total = 2 * (warmup + pairs * steps)
    trainer = common.trainer(cfg, data, run_dir / "template", total, loop=TemplateLoop)
    per_epoch = trainer.data.sampler.batches_per_epoch()
    steps = min(steps, per_epoch)
    batch = int(trainer.data.sampler.batch_size)
    clock = common.Clock(trainer.device)
    loops = {"template": template, "bare": bare}
    rows: list[dict[str, Any]] = []
    ratios = []
    try:
        for name in loops:  # warm-up: caches, allocator, workers, autotuning
            loops[name](trainer, 0, min(warmup, per_epoch), clock)
        for pair in range(pairs):
            order = ("template", "bare") if pair % 2 == 0 else ("bare", "template")
            seconds = {name: loops[name](trainer, pair + 1, steps, clock) for name in order}
            ratio = seconds["bare"] / seconds["template"]
            ratios.append(ratio)
            for name in order:
                rows.append(
                    {
                        "pair": pair,
                        "loop": name,
                        "seconds": seconds[name],
                        "images_per_s": steps * batch / seconds[name],
                        "template_over_bare": ratio if name == "template" else None,
                    }
                )
    finally:
        trainer.close()
    speed = {name: [r["images_per_s"] for r in rows if r["loop"] == name] for name in loops}
    median = statistics.median(ratios)
    summary = {
        "template_over_bare": median,
        "template_over_bare_total": sum(r["seconds"] for r in rows if r["loop"] == "bare")
        / sum(r["seconds"] for r in rows if r["loop"] == "template"),
        "template_images_per_s": statistics.median(speed["template"]),
        "bare_images_per_s": statistics.median(speed["bare"]),
        "pairs": pairs,
        "steps_per_repetition": steps,
        "batch_size": batch,
        "accept_at_least": ACCEPT,
        "accepted": median >= ACCEPT,
    }
    notes = [
        "template_over_bare: median over the pairs of bare seconds / template seconds for the "
        "same steps (1.0: no overhead); _total: the same over all repetitions together"
    ]
    return Result("overhead", COLUMNS, rows, summary, notes)
