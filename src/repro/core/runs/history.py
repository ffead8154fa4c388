"""A run folder's history: every attempt that trained in it, and the first one's record kept.

Hydra writes the composed config to `.hydra/` before a job starts. The first attempt that
trains in a folder keeps that record for good: for any later attempt (a resume, an extension,
a requeued SLURM job) `record_subdir` tells Hydra to write nothing, and the attempt's config
and overrides go to `attempts/<n>/` instead. attempts.jsonl holds one line per attempt: its
command line, start time, start step, end step, result, commit, environment (what
summary.json's `env` holds, so that an attempt killed before its summary has one) and (from a
dirty tree) the source.patch that rebuilds its code.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from repro.core.errors import StorageError, UserError, exit_with, one_line
from repro.core.files import open_in_place, write_text_atomic
from repro.core.guards import folders, received
from repro.core.runs import run_lock
from repro.core.runtime import environment
from repro.core.runtime.launch import COMMAND_VARIABLE

ATTEMPTS_FILE = "attempts.jsonl"
FIRST_RECORD = ".hydra"
SOURCE_PATCH = "source.patch"
RESERVE_FILE = ".attempts.reserve"  # held while an attempt runs, freed to record its end
RESERVE_BYTES = 64 * 1024
DIED = "died: ended without recording a result (killed, or its machine failed)"

log = logging.getLogger(__name__)


def record_subdir(output_dir: str) -> str | None:
    """Hydra's `output_subdir` for a job in `output_dir`: `.hydra` until an attempt has trained
    there, then none (a refused or failed first try leaves nothing worth keeping). Asked before
    Hydra writes there, so the job claims the folder here: while another live process owns
    it, nothing is written (training then refuses to start)."""
    run_dir = Path(output_dir)
    try:
        in_use = run_lock.try_claim(run_dir) is not None
    except folders.UnsafeFolderError:
        return None  # nothing written there: training refuses the folder in one line
    except OSError:
        in_use = False  # an unwritable folder: training says so in one line
    if in_use or (run_dir / ATTEMPTS_FILE).exists():
        return None
    return FIRST_RECORD


def _command_line() -> str:
    """The command the user typed: as the entry point recorded it (a sweep's jobs run in
    launcher workers whose argv is the worker's), else this process's own."""
    if typed := os.environ.get(COMMAND_VARIABLE):
        return typed
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = ["python", "-m", spec.name] if spec and spec.name else [Path(sys.argv[0]).name]
    return shlex.join([*program, *sys.argv[1:]])


def _task_overrides() -> list[str]:
    """The command line's overrides as Hydra parsed them; none when run outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


class RunHistory:
    """attempts.jsonl of one run folder; `begin` adds this attempt, `end` closes it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / ATTEMPTS_FILE
        self.reserve = run_dir / RESERVE_FILE

    def attempts(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        text = received.read_text(self.path, "table", root=self.run_dir)
        return [received.parse_json(line, self.path) for line in text.splitlines() if line]

    def begin(self, cfg: DictConfig, start_step: int, resumed: dict[str, Any], env: dict) -> None:
        """Record this attempt before it writes anything else into the folder. An earlier
        attempt still `running` died without a word (this process owns the folder now)."""
        earlier = self.attempts()
        for attempt in earlier:
            if attempt["result"] == "running":
                attempt["result"] = DIED
        number = len(earlier) + 1
        overrides = _task_overrides()
        first_record = self.run_dir / FIRST_RECORD / "config.yaml"
        if number == 1 and first_record.exists():
            record = FIRST_RECORD  # written by Hydra for this very attempt
        else:
            record = f"attempts/{number}"
            folder = self.run_dir / record
            folder.mkdir(parents=True, exist_ok=True)
            write_text_atomic(folder / "config.yaml", OmegaConf.to_yaml(cfg))
            write_text_atomic(folder / "overrides.yaml", OmegaConf.to_yaml(overrides))
        # A dirty source tree: what it takes to rebuild this attempt's code from its commit.
        patch = environment.source_patch()
        patch_file = self.run_dir / (SOURCE_PATCH if number == 1 else f"{record}/{SOURCE_PATCH}")
        if patch:
            write_text_atomic(patch_file, patch)
        self._current = {
            "attempt": number,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": _command_line(),
            "overrides": overrides,
            "config": record,
            "git_commit": environment.git_commit(),
            "env": env,  # environment.describe(): repro.resume compares it with its own
            "source_patch": str(patch_file.relative_to(self.run_dir)) if patch else None,
            "start_step": start_step,
            **resumed,  # the checkpoint it started from, and those it skipped
            "end_step": None,
            "result": "running",  # stays so if the attempt is killed outright
        }
        self._write([*earlier, self._current])
        try:  # room to record how the attempt ends, should the disk fill while it runs
            with open_in_place(self.reserve, "wb") as handle:
                handle.write(os.urandom(RESERVE_BYTES))  # random: no file system packs it
        except OSError:
            self.reserve.unlink(missing_ok=True)  # nearly full already: the next write says so

    def end(self, result: str, end_step: int) -> None:
        """Close this attempt's line: completed, halted, stopped by signal N, failed: ..."""
        self.reserve.unlink(missing_ok=True)
        self._current.update(result=result, end_step=end_step)
        earlier = [a for a in self.attempts() if a["attempt"] != self._current["attempt"]]
        self._write([*earlier, self._current])

    def fail(self, error: BaseException, end_step: int) -> None:
        """Close this attempt's line as failed by `error`. If the file system refuses that
        too, say so on the console: `error`, which the caller raises on, matters more."""
        try:
            self.end(f"failed: {one_line(error) or type(error).__name__}", end_step)
        except StorageError as refused:
            log.warning("%s: the attempt's line still says running", refused)

    def _write(self, attempts: list[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(a, sort_keys=True) + "\n" for a in attempts)
        write_text_atomic(self.path, lines)


def already_complete(run_dir: Path, checkpoint_step: int, total_steps: int) -> bool:
    """Whether the folder holds a finished run of exactly `total_steps` steps."""
    summary = run_dir / "summary.json"
    if checkpoint_step != total_steps or not summary.exists():
        return False
    recorded = received.load_json(summary, root=run_dir)
    if not isinstance(recorded, dict):
        return False
    return bool(recorded.get("completed")) and recorded.get("step") == total_steps


def check_writable(folder: Path, key: str, guard: Callable[[Path], None] = folders.check) -> None:
    """Create `folder` and write a probe file in it, or exit with one line naming it; first,
    `guard` refuses a folder whose writes would leave it (a link out), before any is made."""
    try:
        guard(folder)
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except folders.UnsafeFolderError as error:
        exit_with(error)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        message = f"cannot write the output folder {folder} ({reason}): set {key} to one you can"
        exit_with(UserError(message))


class OutputFolderCheck(Callback):
    """Before Hydra creates a run's or a sweep's folder (or writes train.log, .hydra/,
    multirun.yaml into one): one clear line, exit 2, if it cannot or must not."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_writable(Path(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_writable(Path(config.hydra.sweep.dir), "hydra.sweep.dir", folders.check_sweep)
