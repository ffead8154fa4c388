"""A project as the test kit sees it: its conf/ folder, its own options, tiny runs of it.

Everything here composes the config as `make train` does (the project's conf/ first, the
engine's groups after it on Hydra's search path) and trains in this process where it can: a
tiny run costs about a second, a new interpreter several (importing torch), and a project's
whole `make test` has about a minute on two cores.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from repro.runs.fingerprint_log import FingerprintLog, Row

# A few steps on a few images (debug=fast cuts the data), an evaluation and a checkpoint every
# 2 steps, every step's loss and weights hash in fingerprints.csv: enough to resume from step 2
# and to name the first step at which two runs part.
QUICK = (
    "debug=fast", "trainer.max_steps=4", "trainer.eval_every_steps=2",
    "trainer.checkpoint_every_steps=2", "trainer.save_checkpoints=true",
    "logger.fingerprint_every_steps=1",
)  # fmt: skip
# What the engine writes into a run folder that legitimately differs between a straight run and
# a resumed one (the attempts made, times, the checkpoints' own records). Every other file is
# the run's result, the project's callbacks' files included, and must match to the byte.
ENGINE_RECORDS = (
    "attempts", "attempts.jsonl", "checkpoints", "metrics.csv", "summary.json",
    "resolved_config.yaml", ".hydra", "train.log", "tensorboard", "run.lock",
)  # fmt: skip
# The groups whose project options carry state across a checkpoint: each is added to a run as
# `+group=option` (a dict of named callbacks or components, as the engine's components are).
STATEFUL_GROUPS = ("callbacks", "components")


class Project:
    """A project's conf/ folder (the one holding its config.yaml) and what is in it."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf.resolve()
        if not (self.conf / "config.yaml").is_file():
            raise FileNotFoundError(f"{self.conf} holds no config.yaml (set repro_conf in pytest)")

    def options(self, group: str) -> list[str]:
        """The project's own options of a group: conf/<group>/*.yaml, sorted (pytest-xdist's
        workers must collect the same list). The engine's options are the engine's to test."""
        return sorted(path.stem for path in (self.conf / group).glob("*.yaml"))

    def stateful_options(self) -> list[str]:
        """`group=option` for every project option of a stateful group."""
        return [f"{group}={name}" for group in STATEFUL_GROUPS for name in self.options(group)]

    def config(self, *overrides: str) -> Any:
        """The config as `make train ARGS="..."` composes it, cut to a tiny run."""
        from hydra import compose, initialize_config_dir

        import repro.train  # noqa: F401  registers the engine's schema and resolvers

        with initialize_config_dir(config_dir=str(self.conf), version_base="1.3"):
            return compose("config", overrides=[*QUICK, *overrides])

    def dropped_choices(self, experiment: str) -> list[str]:
        """What `experiment=<experiment>` asks for that the config `make train` composes with
        it does not hold: each `override /group: option` of the file's defaults list and each
        value it sets, as `group=option (composed: other)` or `key: value (composed: other)`."""
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        import repro.train  # noqa: F401  registers the engine's schema and resolvers

        asked = OmegaConf.load(self.conf / "experiment" / f"{experiment}.yaml")
        with initialize_config_dir(config_dir=str(self.conf), version_base="1.3"):
            cfg = compose("config", [f"experiment={experiment}"], return_hydra_config=True)
        choices, dropped = cfg.hydra.runtime.choices, []
        for entry in OmegaConf.to_container(asked).get("defaults") or []:
            for key, option in entry.items() if isinstance(entry, dict) else ():
                group = str(key).removeprefix("override").strip().lstrip("/")
                if str(key).startswith("override ") and choices.get(group) != option:
                    dropped.append(f"{group}={option} (composed: {choices.get(group)})")
        own = OmegaConf.masked_copy(asked, [key for key in asked if key != "defaults"])
        for key, value in _leaves(OmegaConf.to_container(own, resolve=False)):
            found = OmegaConf.select(cfg, key, default=None)
            if found != value and not (isinstance(value, str) and "${" in value):
                dropped.append(f"{key}: {value!r} (composed: {found!r})")
        return dropped

    def train(self, run_dir: Path, *overrides: str) -> dict[str, Any]:
        """A tiny run in this process; returns what summary.json holds. Run again in the same
        folder, it resumes from the last checkpoint, as `make train` does."""
        import repro.train

        run_dir.mkdir(parents=True, exist_ok=True)
        return repro.train.train(self.config(*overrides), run_dir)

    def train_killed(self, run_dir: Path, step: int, *overrides: str) -> int:
        """The tiny run as a command, SIGKILLed right after optimizer step `step` (REPRO_FAULT,
        repro.runs.faults); returns its exit status. A new process, since a kill ends one."""
        env = {**os.environ, "REPRO_FAULT": f"step:{step}"}
        command = [
            sys.executable, "-m", "repro.train", f"--config-path={self.conf}", *QUICK,
            *overrides, f"hydra.run.dir={run_dir}",
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode not in (-9, 137):  # -9: killed itself; 137: its re-exec's parent
            raise AssertionError(
                f"the run meant to be killed after step {step} exited {done.returncode}: "
                f"{done.stderr.strip()[-1500:]}"
            )
        return done.returncode

    def train_on_processes(self, run_dir: Path, processes: int, *overrides: str) -> None:
        """The tiny run under torchrun on `processes` CPU processes (gloo), as a command."""
        command = [
            sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
            "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "-m", "repro.train",
            f"--config-path={self.conf}", *QUICK, *overrides, f"hydra.run.dir={run_dir}",
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes share this machine's cores
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise AssertionError(
                f"the run on {processes} processes exited {done.returncode}: "
                f"{done.stderr.strip()[-1500:]}"
            )


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a plain nested dict (a list is one leaf)."""
    if not isinstance(node, dict) or not node:
        return [(prefix, node)] if prefix else []
    found: list[tuple[str, Any]] = []
    for key, value in node.items():
        found += _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def steps(run_dir: Path) -> list[Row]:
    return FingerprintLog.of_run(run_dir).read()


def result_files(run_dir: Path) -> dict[str, str]:
    """{path: sha256} of the files a run folder holds beside the engine's own records."""
    found = {}
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir)
        if path.is_file() and rel.parts[0] not in ENGINE_RECORDS:
            found[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found
