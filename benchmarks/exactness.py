"""suite=exactness: does the exactness contract hold on this machine?

Short real runs of `python -m repro.train`, each in a fresh process, with this command's
training overrides (the configured model and data), compared by their `weights_sha256`:

- rerun: the same run twice;
- workers: 0 and 2 DataLoader workers (and, on CUDA, pinned memory off) against the reference;
- device_loader: `dataloader.on_device=true` against the reference;
- kill_resume: SIGKILL at a random step after the first checkpoint, then the same command again;
- fp16_kill_resume (CUDA): the same with `amp=fp16` and its GradScaler;
- torchrun (two or more GPUs): a 2-process run, twice;
- and what exactness costs: images per second of the reference against `preset=fast`.

On CUDA every run is under `preset=exact` (unless a preset is named); on a CPU the defaults are
exact already. The summary holds `checks` (name, passed, detail) and `all_passed`; the command
exits 1 when a check fails.
"""

from __future__ import annotations

import csv
import logging
import math
import random
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from benchmarks.common import Column, Result, train_overrides
from benchmarks.runs import Run, Runner, sets
from repro.core.errors import UserError
from repro.core.runtime.devices import select_device

log = logging.getLogger(__name__)

COLUMNS = [
    Column("name", "check"),
    Column("passed", "passed"),
    Column("detail", "detail"),
    Column("seconds", "seconds", "{:.1f}"),
]

# Set by the suite for every run (the seed: the one this command resolved, fixed); the user's
# overrides of these are left out.
SUITE_KEYS = (
    "seed",
    "trainer.max_steps",
    "trainer.checkpoint_every_steps",
    "trainer.resume",
    "trainer.halt_at_step",
    "logger.progress",
    "logger.plot",
    "hydra",
)

# The fp16 runs: preset=exact's settings but amp, which the preset pins to off.
FP16_EXACT = ("cudnn=deterministic", "amp=fp16", "trainer.compile=false")


@dataclass
class Check:
    name: str
    passed: bool | None  # None: not a pass/fail check, or not run on this machine
    detail: str
    seconds: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)  # for the summary


def same_weights(name: str, runs: list[Run], started: float) -> Check:
    """Passed when every run finished and all give the first run's weights."""
    detail = ", ".join(run.describe() for run in runs)
    passed = all(run.sha is not None for run in runs) and len({run.sha for run in runs}) == 1
    return Check(name, passed, detail, time.perf_counter() - started)


def kill_and_resume(
    runner: Runner, name: str, reference: Run, extra: tuple[str, ...], kill_step: int
) -> Check:
    """SIGKILL a run right after `kill_step`, rerun the same command, compare with `reference`."""
    started = time.perf_counter()
    killed = runner.train(name, extra, env={"REPRO_FAULT": f"step:{kill_step}"})
    if killed.returncode != -signal.SIGKILL:
        detail = f"the run to kill at step {kill_step} ended with {killed.returncode}"
        return Check(name, False, f"{detail} ({killed.error})", time.perf_counter() - started)
    resumed = runner.train(name, extra)
    check = same_weights(name, [reference, resumed], started)
    resumed_from = resumed.summary and resumed.summary["resumed_from_step"]
    if not resumed_from:
        check.passed = False  # started over: equal weights would prove nothing
    check.detail = f"killed at step {kill_step}, resumed from {resumed_from}: {check.detail}"
    return check


def kill_step_for(total_steps: int, first_checkpoint: int, seed: int | None) -> int | None:
    """A random step after the first checkpoint and before the last step."""
    if total_steps - 1 <= first_checkpoint:
        return None
    draw = random.Random(secrets.randbits(32) if seed is None else seed)
    return draw.randint(first_checkpoint + 1, total_steps - 1)


@dataclass
class Plan:
    """What the checks share: where runs go, the reference run, and this machine's facts."""

    runner: Runner
    reference: Run
    on_cuda: bool
    kill_step: int | None
    skip_reason: str = ""


def check_rerun(plan: Plan) -> Check:
    started = time.perf_counter()
    again = plan.runner.train("rerun")
    return same_weights("rerun", [plan.reference, again], started)


def check_workers(plan: Plan) -> Check:
    started = time.perf_counter()
    worker_runs = [("workers-0", "0", "true"), ("workers-2", "2", "true")]
    if plan.on_cuda:
        worker_runs.append(("workers-2-unpinned", "2", "false"))
    runs = [
        plan.runner.train(
            name,
            (
                "dataloader.on_device=false",
                f"dataloader.num_workers={n}",
                f"dataloader.pin_memory={pin}",
            ),
        )
        for name, n, pin in worker_runs
    ]
    return same_weights("workers", [plan.reference, *runs], started)


def check_device_loader(plan: Plan) -> Check:
    started = time.perf_counter()
    on_device = plan.runner.train("device-loader", ("dataloader.on_device=true",))
    return same_weights("device_loader", [plan.reference, on_device], started)


def check_kill_resume(plan: Plan) -> Check:
    if plan.kill_step is None:
        return Check("kill_resume", False, plan.skip_reason)
    return kill_and_resume(plan.runner, "kill_resume", plan.reference, (), plan.kill_step)


def check_fp16_kill_resume(plan: Plan) -> Check:
    if not plan.on_cuda:
        return Check("fp16_kill_resume", None, "skipped: amp=fp16 needs CUDA")
    if plan.kill_step is None:
        return Check("fp16_kill_resume", False, plan.skip_reason)
    # preset=exact means amp off: these runs spell out the preset's other settings instead.
    runner = plan.runner.without(("preset",))
    started = time.perf_counter()
    straight = runner.train("fp16", FP16_EXACT)
    if straight.summary is None:
        return Check("fp16_kill_resume", False, straight.describe(), time.perf_counter() - started)
    return kill_and_resume(runner, "fp16_kill_resume", straight, FP16_EXACT, plan.kill_step)


def check_torchrun(plan: Plan) -> Check:
    if not plan.on_cuda or torch.cuda.device_count() < 2:
        return Check("torchrun", None, "skipped: needs two or more GPUs")
    started = time.perf_counter()
    pair = [plan.runner.train(f"torchrun-{i}", processes=2) for i in (1, 2)]
    return same_weights("torchrun", pair, started)


def check_cost(plan: Plan) -> Check:
    """Not pass or fail: what the exact settings cost against preset=fast, same model. Both
    runs evaluate halfway too, and the speed is that of their second half: compilation and
    cuDNN autotuning happen in the first, and would hide what a long run sees."""
    started = time.perf_counter()
    halfway = (f"trainer.eval_every_steps={max(1, plan.reference.summary['total_steps'] // 2)}",)
    speeds = []
    for name, extra in (("cost-exact", ()), ("fast", ("preset=fast",))):
        run = plan.runner.train(name, (*extra, *halfway))
        speeds.append(second_half_speed(plan.runner.folder / name) if run.summary else math.nan)
    exact_speed, fast_speed = speeds
    detail = (
        f"{exact_speed:.0f} img/s under these settings, {fast_speed:.0f} img/s with "
        f"preset=fast: {exact_speed / fast_speed:.2f}x"
    )
    check = Check("cost", None, detail, time.perf_counter() - started)
    check.figures = {
        "exact_images_per_s": exact_speed,
        "fast_images_per_s": fast_speed,
        "exact_over_fast": exact_speed / fast_speed,
    }
    return check


def second_half_speed(run_dir: Path) -> float:
    """Images per second between a run's last two evaluations (its metrics.csv)."""
    with (run_dir / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return float(rows[-1]["images_per_s"])


CHECKS = {
    "rerun": check_rerun,
    "workers": check_workers,
    "device_loader": check_device_loader,
    "kill_resume": check_kill_resume,
    "fp16_kill_resume": check_fp16_kill_resume,
    "torchrun": check_torchrun,
    "cost": check_cost,
}


def run(cfg: DictConfig, run_dir: Path) -> Result:
    suite = cfg.suite
    device = select_device(cfg.trainer.device)
    user = [o for o in train_overrides() if not sets(o, SUITE_KEYS)]
    on_cuda = device.type == "cuda"
    exact = ["preset=exact"] if on_cuda and not any(sets(o, ("preset",)) for o in user) else []
    every = int(suite.checkpoint_every_steps)
    base = [
        *user,
        *exact,
        f"seed.value={int(cfg.seed.value)}",
        f"trainer.max_steps={int(suite.steps)}",
        f"trainer.checkpoint_every_steps={every}",
        "logger.progress=off",
        "logger.plot=false",
    ]
    runner = Runner(run_dir / "runs", base, float(suite.timeout_s))

    reference = runner.train("reference")
    log.info("reference run: %s", reference.describe())
    if reference.summary is None:
        raise UserError(f"suite=exactness: the reference training run failed: {reference.error}")
    total = int(reference.summary["total_steps"])
    kill_step = kill_step_for(total, min(every, total), suite.kill_seed)
    plan = Plan(runner, reference, on_cuda, kill_step)
    if kill_step is None:
        plan.skip_reason = (
            f"{total} steps leave no step to kill after the first checkpoint (step "
            f"{min(every, total)}): raise suite.steps or lower suite.checkpoint_every_steps"
        )
    checks = []
    for name in suite.checks:  # a few minutes in all: say how each went as it ends
        checks.append(CHECKS[name](plan))
        verdict = {True: "passed", False: "FAILED", None: "-"}[checks[-1].passed]
        log.info("%s %s (%.0f s): %s", name, verdict, checks[-1].seconds, checks[-1].detail)

    ran = [check for check in checks if check.passed is not None]
    summary: dict[str, Any] = {
        "device": str(device),
        "settings": " ".join(exact) or "the config as given (CPU runs are exact by default)",
        "steps": total,
        "kill_step": kill_step,
        "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks],
        "all_passed": all(check.passed for check in ran),
    }
    for check in checks:
        summary |= check.figures
    notes = [f"runs: {runner.folder}; each a fresh `python -m repro.train` process"]
    if "cost" in suite.checks:
        notes.append(
            "cost: images per second over each run's second half (after compilation and "
            "cuDNN autotuning), from two extra runs that also evaluate halfway"
        )
    rows = [{k: v for k, v in vars(check).items() if k != "figures"} for check in checks]
    return Result("exactness", COLUMNS, rows, summary, notes)
