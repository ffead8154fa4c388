"""Training runs as a user starts them: `python -m repro.train` (or torchrun) in a fresh
process per run, with shared overrides, read back from the run folder's summary.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Run:
    """One finished `repro.train` process."""

    name: str
    returncode: int
    summary: dict[str, Any] | None
    error: str

    @property
    def sha(self) -> str | None:
        return self.summary["weights_sha256"] if self.summary else None

    def describe(self) -> str:
        if self.summary:
            return f"{self.name} {self.sha[:12]}"
        return f"{self.name} failed ({self.error})"


def sets(override: str, keys: tuple[str, ...]) -> bool:
    """Whether a command-line override sets one of `keys` or something inside one."""
    key = override.lstrip("+~").split("=", 1)[0]
    return any(key == k or key.startswith(f"{k}.") for k in keys)


def merged(base: list[str], extra: list[str]) -> list[str]:
    """`base` then `extra`, leaving out of `base` what `extra` sets again (Hydra refuses a key
    given twice)."""
    taken = tuple(override.lstrip("+~").split("=", 1)[0] for override in extra)
    return [*(o for o in base if not sets(o, taken)), *extra]


class Runner:
    """Starts training runs into `folder/<name>` with the shared overrides."""

    def __init__(self, folder: Path, overrides: list[str], timeout_s: float) -> None:
        self.folder, self.overrides, self.timeout_s = folder, overrides, timeout_s

    def without(self, keys: tuple[str, ...]) -> Runner:
        """The same runner with the shared overrides of `keys` left out (Hydra has no
        override that unsets a config group chosen earlier on the command line)."""
        kept = [o for o in self.overrides if not sets(o, keys)]
        return Runner(self.folder, kept, self.timeout_s)

    def train(
        self,
        name: str,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        processes: int = 1,
    ) -> Run:
        run_dir = self.folder / name
        launcher = [sys.executable, "-m", "repro.train"]
        if processes > 1:
            launcher = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc_per_node={processes}",
                "--rdzv-backend=c10d",
                "--rdzv-endpoint=localhost:0",
                "-m",
                "repro.train",
            ]
        overrides = merged(self.overrides, list(extra))
        command = [*launcher, *overrides, f"hydra.run.dir={run_dir}"]
        env = {**os.environ, **(env or {})}
        env.pop("REPRO_RUN", None)  # each run names itself
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=self.timeout_s
            )
        except subprocess.TimeoutExpired:
            return Run(name, -1, None, f"no result within suite.timeout_s={self.timeout_s}")
        summary_file = run_dir / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
        if done.returncode != 0:
            summary = None  # a killed run's folder holds no summary; a failed one none to trust
        lines = (done.stderr or done.stdout).strip().splitlines()
        errors = [line for line in lines if line.startswith("error:")]
        return Run(name, done.returncode, summary, (errors or lines or ["no output"])[-1])
