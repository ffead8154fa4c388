"""What the suites share: the training objects built from a config as train.py builds them,
device-aware clocks, peak memory, percentiles, and the table in bench.json and bench.md."""

from __future__ import annotations

import contextlib
import copy
import datetime
import gc
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from repro.core.data.datasets import Splits
from repro.core.data.loader import Batches
from repro.core.data.samplers import EpochBatches
from repro.core.engine import assembly
from repro.core.engine.loop import Trainer
from repro.core.files import write_json_atomic
from repro.core.runs.checkpoint import Checkpointer
from repro.core.runs.fingerprint_log import FingerprintLog
from repro.core.runtime import distributed
from repro.core.runtime.seeding import seed_globals
from repro.core.watch.loggers import MetricsLog

ENDLESS_EPOCHS = 10**9  # more than any benchmark reads


@dataclass
class Column:
    key: str
    header: str
    format: str = "{}"  # applied to numbers; strings (e.g. "n/a") are shown as they are


@dataclass
class Result:
    suite: str
    columns: list[Column]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ---- the training objects ------------------------------------------------------------------


def trainer(
    cfg: DictConfig, data: Splits, folder: Path, total_steps: int, loop: type[Trainer] = Trainer
) -> Trainer:
    """A Trainer for `total_steps` steps on `data` (built once per suite), assembled by
    `engine.assembly` as train.py assembles one: what is measured is what trains. No resume;
    nothing written outside `folder`."""
    cfg = copy.deepcopy(cfg)
    # Exactly `total_steps` steps, and a schedule over them: every epoch has one batch or more.
    cfg.trainer.epochs = cfg.trainer.max_steps = total_steps
    knobs = assembly.apply_knobs(cfg, distributed.Context())
    seed = int(cfg.seed.value)
    seed_globals(seed)
    parts = assembly.build_parts(cfg, knobs, seed, data)
    folder.mkdir(parents=True, exist_ok=True)
    checkpointer = Checkpointer(folder / "checkpoints", 1)
    outputs = assembly.Outputs(
        checkpointer, MetricsLog(folder, False), FingerprintLog.of_run(folder)
    )
    built = assembly.trainer(cfg, knobs, parts, outputs, {})
    if loop is Trainer:
        return built
    # A variant of the loop (a subclass) over the same objects: the core knows nothing of it.
    return loop(**{slot.name: getattr(built, slot.name) for slot in fields(Trainer)})


def endless(loader: Any, sampler: EpochBatches, epoch: int = 0) -> Batches:
    """A training loader's batches from `epoch` on, through the epochs, as the loop draws
    them (one iterator: its workers start once); `close()` it when done."""
    sampler.set_epoch(epoch, epochs=ENDLESS_EPOCHS)
    return Batches(loader)


# ---- time and memory -----------------------------------------------------------------------


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU (no sync per step), wall time on
    a CPU, where every op has finished when it returns."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks (call after `sync`)."""
        pairs = zip(self.marks, self.marks[1:], strict=False)
        if self.cuda:
            return [start.elapsed_time(end) / 1000 for start, end in pairs]
        return [end - start for start, end in pairs]


def reset_peak_memory(device: torch.device) -> None:
    gc.collect()  # a compiled model is a reference cycle: free the previous row's now
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):  # Linux: "5" resets the peak resident set (VmHWM)
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mib(device: torch.device) -> float:
    """CUDA: torch.cuda.max_memory_allocated. CPU: this process's peak resident set size
    since the last reset (VmHWM; loader workers are other processes and not counted)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    return {"median": statistics.median(ordered), "p10": at(0.1), "p90": at(0.9)}


# ---- reporting -----------------------------------------------------------------------------


def machine(device: torch.device | None = None) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = (
        torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else None
    )
    return {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def train_overrides() -> list[str]:
    """This command's overrides that concern training (not the suite, not Hydra's own)."""
    if not HydraConfig.initialized():
        return []
    task = HydraConfig.get().overrides.task
    return [o for o in task if not o.lstrip("+~").startswith(("suite", "hydra"))]


def command() -> str:
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return " ".join(["python -m benchmarks", *overrides])


def _cell(value: Any, column: Column) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, int | float):
        return "" if value is None else str(value)
    return (
        "n/a"
        if isinstance(value, float) and not math.isfinite(value)
        else column.format.format(value)
    )


def write(result: Result, run_dir: Path, cfg: DictConfig, device: torch.device) -> dict[str, Any]:
    """bench.json (everything, numbers as numbers) and bench.md (the table) in `run_dir`."""
    payload = {
        "suite": result.suite,
        "command": command(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(device),
        "summary": result.summary,
        "rows": result.rows,
        "notes": result.notes,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    write_json_atomic(run_dir / "bench.json", payload)
    header = [column.header for column in result.columns]
    lines = [
        f"# benchmarks suite={result.suite}",
        "",
        f"- command: `{payload['command']}`",
        f"- date: {payload['date']}",
        "- machine: " + ", ".join(f"{k} {v}" for k, v in payload["machine"].items() if v),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in result.rows:
        lines.append("| " + " | ".join(_cell(row.get(c.key), c) for c in result.columns) + " |")
    lines += ["", *(f"- {key}: {value}" for key, value in result.summary.items())]
    lines += [f"- {note}" for note in result.notes]
    (run_dir / "bench.md").write_text("\n".join(lines) + "\n")
    return payload


def show(result: Result, run_dir: Path) -> None:
    """The table on the console, then the summary."""
    table = Table(title=f"benchmarks suite={result.suite}")
    for column in result.columns:
        justify = "left" if column.format == "{}" else "right"
        table.add_column(column.header, justify=justify, no_wrap=True)
    for row in result.rows:
        table.add_row(*(_cell(row.get(c.key), c) for c in result.columns))
    console = Console(file=sys.stdout, width=max(160, Console().width))
    console.print(table)
    for key, value in result.summary.items():
        console.print(f"{key}: {json.dumps(value)}")
    for note in result.notes:
        console.print(note)
    console.print(f"written: {run_dir / 'bench.json'}, {run_dir / 'bench.md'}")
