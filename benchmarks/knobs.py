"""suite=knobs: what each speed knob buys on this machine.

A grid over memory format x amp x loader (DataLoader workers, or the device-resident loader)
x pinned memory x cuDNN benchmarking x torch.compile. Each row builds the training objects
as train.py does, runs `suite.warmup_steps` untimed steps, then `suite.timed_steps` timed
ones through `Trainer.train_step`, and reports images per second, the step time (median,
p10, p90: on CUDA between CUDA events, so without a sync per step), the fraction of wall
time spent waiting for the next batch (fetch and copy to the device, as metrics.csv counts
it), peak memory, and the speed-up over the plain row (contiguous, fp32, no pinning, no
benchmarking, no compile, the first loader listed). Values that need CUDA are listed as
n/a rows on a CPU.
"""

from __future__ import annotations

import copy
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from benchmarks import common
from benchmarks.common import Column, Result
from repro.core import build
from repro.core.errors import UserError
from repro.core.runtime.devices import select_device

AXES = ("memory_format", "amp", "loader", "pin_memory", "cudnn_benchmark", "compile")
PLAIN = {
    "memory_format": "contiguous",
    "amp": "off",
    "pin_memory": False,
    "cudnn_benchmark": False,
    "compile": False,
}

COLUMNS = [
    Column("memory_format", "memory format"),
    Column("amp", "amp"),
    Column("loader", "loader"),
    Column("pin_memory", "pinned"),
    Column("cudnn_benchmark", "cudnn bench"),
    Column("compile", "compile"),
    Column("images_per_s", "img/s", "{:.0f}"),
    Column("step_ms_median", "step ms", "{:.1f}"),
    Column("step_ms_p10", "p10", "{:.1f}"),
    Column("step_ms_p90", "p90", "{:.1f}"),
    Column("data_wait_frac", "data wait", "{:.1%}"),
    Column("peak_mem_mib", "peak MiB", "{:.0f}"),
    Column("speedup", "speed-up", "{:.2f}x"),
    Column("status", "status"),
]


def unavailable(axis: str, value: Any, device: torch.device) -> str | None:
    """Why a knob value cannot be measured here, or None."""
    if device.type == "cuda":
        if axis == "amp" and value == "bf16" and not torch.cuda.is_bf16_supported():
            return "n/a: this GPU has no bf16"
        return None
    needs_cuda = {
        ("pin_memory", True),
        ("cudnn_benchmark", True),
        ("compile", True),
        ("amp", "fp16"),
    }
    return "n/a: needs CUDA" if (axis, value) in needs_cuda else None


def row_config(cfg: DictConfig, row: dict[str, Any]) -> DictConfig:
    cfg = copy.deepcopy(cfg)
    cfg.memory_format.name = row["memory_format"]
    cfg.amp.mode = row["amp"]
    on_device = row["loader"] == "device"
    cfg.dataloader.on_device = on_device
    cfg.dataloader.num_workers = 0 if on_device else int(row["loader"])
    cfg.dataloader.pin_memory = bool(row["pin_memory"])
    cfg.cudnn.benchmark = bool(row["cudnn_benchmark"])
    cfg.trainer.compile = bool(row["compile"])
    return cfg


def measure(cfg: DictConfig, data: Any, folder: Path, warmup: int, timed: int) -> dict[str, Any]:
    """One row: warm up, then time `timed` steps of the template's own train step."""
    device = select_device(cfg.trainer.device)
    common.reset_peak_memory(device)
    trainer = common.trainer(cfg, data, folder, total_steps=warmup + timed)
    source = common.endless(trainer.data.train_loader, trainer.data.sampler)
    try:
        for _ in range(warmup):
            trainer.train_step(*trainer.data.to_device(*next(source)))
        clock = common.Clock(device)
        clock.sync()
        waits, images = [], 0
        started = time.perf_counter()
        clock.mark()
        for _ in range(timed):
            fetch = time.perf_counter()
            batch, labels = trainer.data.to_device(*next(source))
            waits.append(time.perf_counter() - fetch)
            trainer.train_step(batch, labels)
            images += len(labels)
            clock.mark()
        clock.sync()
        wall = time.perf_counter() - started
    finally:
        source.close()
        trainer.close()
    steps = common.percentiles([1000 * s for s in clock.intervals()])
    return {
        "images_per_s": images / wall,
        "step_ms_median": steps["median"],
        "step_ms_p10": steps["p10"],
        "step_ms_p90": steps["p90"],
        "data_wait_frac": sum(waits) / wall,
        "peak_mem_mib": common.peak_memory_mib(device),
        "status": "ok",
    }


def planned_rows(suite: Any, device: torch.device) -> tuple[list[dict[str, Any]], list[dict]]:
    """The rows to measure (the grid's product, or `suite.rows` as listed) and the n/a rows."""
    grid = {axis: list(suite.grid[axis]) for axis in AXES}
    na_rows = []
    if suite.get("rows"):
        kept = []
        for listed in suite.rows:
            row = {**PLAIN, "loader": grid["loader"][0], **listed}
            reason = next(filter(None, (unavailable(a, row[a], device) for a in AXES)), None)
            if reason:
                na_rows.append({**row, "status": reason})
            else:
                kept.append(row)
        return kept, na_rows
    for axis in AXES:
        for value in list(grid[axis]):
            reason = unavailable(axis, value, device)
            if reason and len(grid[axis]) > 1:
                grid[axis].remove(value)
                na_rows.append({**{a: "" for a in AXES}, axis: value, "status": reason})
    rows = [dict(zip(AXES, values, strict=True)) for values in itertools.product(*grid.values())]
    # Nothing to pin with dataloader=device: the data already lives on the device.
    return [r for r in rows if not (r["loader"] == "device" and r["pin_memory"])], na_rows


def run(cfg: DictConfig, run_dir: Path) -> Result:
    suite = cfg.suite
    device = select_device(cfg.trainer.device)
    data = build.splits(cfg, int(cfg.seed.value))  # made once, shared by every row
    planned, na_rows = planned_rows(suite, device)
    notes = []
    if na_rows:
        notes.append(
            "n/a rows: pinned memory speeds up copies to a GPU only, cuDNN benchmarking and "
            "fp16 autocast need CUDA, and torch.compile is measured on GPUs only (its C++ "
            "build on a small CPU takes minutes)"
        )
    rows = []
    with tempfile.TemporaryDirectory(prefix="rows-", dir=run_dir) as scratch:
        for row in planned:
            folder = Path(scratch) / str(len(rows))
            row |= measure(
                row_config(cfg, row), data, folder, suite.warmup_steps, suite.timed_steps
            )
            rows.append(row)
    if not rows:
        reasons = sorted({row["status"] for row in na_rows}) or ["no row left to measure"]
        raise UserError(f"suite=knobs: no row can run on this machine ({'; '.join(reasons)})")
    first_loader = suite.grid.loader[0]
    plain_rows = [r for r in rows if all(r[k] == v for k, v in PLAIN.items())]
    plain = next((r for r in plain_rows if r["loader"] == first_loader), None)
    plain = plain or (plain_rows or rows)[0]
    if any(plain[k] != v for k, v in PLAIN.items()):
        notes.append("the grid has no plain row; speed-ups are over the first row")
    for row in rows:
        row["speedup"] = row["images_per_s"] / plain["images_per_s"]
    best = max(rows, key=lambda r: r["images_per_s"])
    summary = {
        "device": str(device),
        "batch_size": int(cfg.trainer.batch_size),
        "warmup_steps": int(suite.warmup_steps),
        "timed_steps": int(suite.timed_steps),
        "plain_images_per_s": plain["images_per_s"],
        "best": {k: best[k] for k in (*AXES, "images_per_s", "speedup")},
    }
    notes.append(
        "data wait: share of wall time spent fetching the next batch and copying it to the "
        "device; peak MiB: "
        + (
            "torch.cuda.max_memory_allocated"
            if device.type == "cuda"
            else "peak resident set of this process (VmHWM), workers excluded"
        )
    )
    return Result("knobs", COLUMNS, rows + na_rows, summary, notes)
