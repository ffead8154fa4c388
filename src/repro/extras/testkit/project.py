"""A project as the test kit sees it: its conf/ folder, its own options, the experiment each
option is meant for, and the config `make train` composes, cut to a tiny run (runs.py runs it).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from repro.core import config
from repro.extras.testkit.runs import Runs

# A few steps on a few images (debug=fast cuts the data), an evaluation and a checkpoint every
# 2 steps, every step's loss and weights hash in fingerprints.csv: enough to resume from step 2
# and to name the first step at which two runs part. On the CPU: the kit checks what a part
# does, and its forked runs could not use a GPU that this process had initialised. One thread:
# a fork inherits OpenMP's thread team but not its threads, and waits forever on the team's
# barrier at its first parallel region (pytest -n 2 keeps both cores busy anyway).
QUICK = (
    "debug=fast",
    "trainer.max_steps=4",
    "trainer.eval_every_steps=2",
    "trainer.checkpoint_every_steps=2",
    "trainer.save_checkpoints=true",
    "logger.fingerprint_every_steps=1",
    "trainer.device=cpu",
    "trainer.num_threads=1",
)
# The groups whose project options carry state across a checkpoint: each is added to a run as
# `+group=option` (a dict of named callbacks or components, as the engine's components are).
STATEFUL_GROUPS = ("callbacks", "components")


class Project:
    """A project's conf/ folder (the one holding its config.yaml) and what is in it."""

    def __init__(self, conf: Path, scratch: Path | None = None) -> None:
        self.conf = conf.resolve()
        if not (self.conf / "config.yaml").is_file():
            raise FileNotFoundError(f"{self.conf} holds no config.yaml (set repro_conf in pytest)")
        self.root = self.conf.parent
        self.runs = Runs(self.root, scratch)

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

        config.register()  # the engine's schema and resolvers

        with initialize_config_dir(config_dir=str(self.conf), version_base="1.3"):
            return compose("config", overrides=[*QUICK, *overrides])

    def meant_for(self, group: str, option: str) -> list[str]:
        """`["experiment=E"]` for the first experiment (by name) that chooses `option` of
        `group` (data, objective, metrics, callbacks, components): a dataset is checked with
        the objective and metrics its experiment pairs it with. `[]` where no experiment chooses it: the
        project's defaults then go with it."""
        for experiment in self.options("experiment"):
            chosen = self._choices(experiment).get(group)
            if chosen == option or (isinstance(chosen, list) and option in chosen):
                return [f"experiment={experiment}"]
        return []

    @cache  # noqa: B019  a session's one Project: composed once per experiment
    def _choices(self, experiment: str) -> dict[str, Any]:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        config.register()  # the engine's schema and resolvers

        with initialize_config_dir(config_dir=str(self.conf), version_base="1.3"):
            cfg = compose("config", [f"experiment={experiment}"], return_hydra_config=True)
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        return {**choices, "metrics": list(cfg.get("metrics") or [])}

    def dropped_choices(self, experiment: str) -> list[str]:
        """What `experiment=<experiment>` asks for that the config `make train` composes with
        it does not hold: each `override /group: option` of the file's defaults list and each
        value it sets, as `group=option (composed: other)` or `key: value (composed: other)`."""
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        config.register()  # the engine's schema and resolvers

        asked = OmegaConf.load(self.conf / "experiment" / f"{experiment}.yaml")
        with initialize_config_dir(config_dir=str(self.conf), version_base="1.3"):
            cfg = compose("config", [f"experiment={experiment}"], return_hydra_config=True)
        choices, dropped = cfg.hydra.runtime.choices, []
        for entry in OmegaConf.to_container(asked).get("defaults") or []:
            for key, option in entry.items() if isinstance(entry, dict) else ():
                group = str(key).removeprefix("override").strip().lstrip("/")
                # A list of options (metrics: [a, b]) is no one choice: the group's keys show it.
                composed = sorted(cfg.get(group) or []) if isinstance(option, list) else None
                found = composed if composed is not None else choices.get(group)
                if str(key).startswith("override ") and found != (
                    sorted(option) if isinstance(option, list) else option
                ):
                    dropped.append(f"{group}={option} (composed: {found})")
        own = OmegaConf.masked_copy(asked, [key for key in asked if key != "defaults"])
        for key, value in _leaves(OmegaConf.to_container(own, resolve=False)):
            found = OmegaConf.select(cfg, key, default=None)
            if found != value and not (isinstance(value, str) and "${" in value):
                dropped.append(f"{key}: {value!r} (composed: {found!r})")
        return dropped

    def train(self, run_dir: Path, *overrides: str) -> dict[str, Any]:
        """A tiny run in this process; returns what summary.json holds."""
        from repro.extras.testkit.runs import in_process

        return in_process(self.config(*overrides), run_dir, self.root)


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a plain nested dict (a list is one leaf)."""
    if not isinstance(node, dict) or not node:
        return [(prefix, node)] if prefix else []
    found: list[tuple[str, Any]] = []
    for key, value in node.items():
        found += _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return found
