"""suite=startup: how long `python -m repro.train` takes to reach its first optimizer step,
beyond what importing torch and torchvision costs anyway.

Everything runs in fresh processes. The training run gets this command's training overrides
plus `trainer.max_steps=1 logger.fingerprint_every_steps=1`: its first step is done when the
loop writes fingerprints.csv (the step's loss and a weights hash), so the file's modification
time, less the moment the process was started, is the time to the first step; nothing in
the template is instrumented for it. startup_overhead_s = that time - the time a fresh
interpreter takes to `import torch, torchvision` (medians over `suite.repeats`).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from benchmarks.common import Column, Result, train_overrides
from repro.core.errors import UserError
from repro.core.runs.fingerprint_log import FingerprintLog

ACCEPT = 1.0
IMPORTS = {
    "import_torch_s": "import torch",
    "import_torch_torchvision_s": "import torch, torchvision",
}

COLUMNS = [
    Column("repeat", "repeat", "{:d}"),
    Column("what", "what"),
    Column("seconds", "seconds", "{:.3f}"),
]


def time_import(statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - started


def time_first_step(overrides: list[str], folder: Path) -> float:
    command = [
        sys.executable,
        "-m",
        "repro.train",
        *overrides,
        "trainer.max_steps=1",
        "logger.fingerprint_every_steps=1",
        "logger.plot=false",
        "trainer.resume=never",
        f"hydra.run.dir={folder}",
    ]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    fingerprints = FingerprintLog.of_run(folder).path
    if done.returncode != 0 or not fingerprints.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"the training run for suite=startup failed: {tail[0]}")
    return fingerprints.stat().st_mtime - started


def run(cfg: DictConfig, run_dir: Path) -> Result:
    overrides = train_overrides()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="startup-", dir=run_dir) as scratch:
        for repeat in range(int(cfg.suite.repeats)):
            for key, statement in IMPORTS.items():
                rows.append({"repeat": repeat, "what": key, "seconds": time_import(statement)})
            seconds = time_first_step(overrides, Path(scratch) / str(repeat))
            rows.append({"repeat": repeat, "what": "first_step_s", "seconds": seconds})
    median = {
        key: statistics.median(r["seconds"] for r in rows if r["what"] == key)
        for key in (*IMPORTS, "first_step_s")
    }
    overhead = median["first_step_s"] - median["import_torch_torchvision_s"]
    summary = {
        **median,
        "startup_overhead_s": overhead,
        "overhead_over_torch_alone_s": median["first_step_s"] - median["import_torch_s"],
        "train_overrides": overrides,
        "accept_at_most_s": ACCEPT,
        "accepted": overhead <= ACCEPT,
    }
    notes = [
        "first_step_s: from starting `python -m repro.train` to the end of its first step; "
        "startup_overhead_s = first_step_s - import_torch_torchvision_s (medians)"
    ]
    return Result("startup", COLUMNS, rows, summary, notes)
