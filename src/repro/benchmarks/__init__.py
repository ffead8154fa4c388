"""The suites behind `python -m repro.bench suite=<name>`: one module per suite.

Each suite module has `run(cfg, run_dir) -> common.Result`; `common` holds what they share
(building the training objects from a config, timing, peak memory, tables, output files).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hydra.core.config_store import ConfigStore

from repro.config import Config
from repro.errors import ConfigError

SUITES = ("knobs", "overhead", "startup")


@dataclass
class BenchConfig(Config):
    """The training schema plus the suite's own settings (free-form, per suite)."""

    suite: Any = None


def register() -> None:
    """Stand in for the training schema, so conf/config.yaml composes with a `suite` key."""
    ConfigStore.instance().store(name="schema", node=BenchConfig)


def load(name: str) -> ModuleType:
    if name not in SUITES:
        raise ConfigError("suite", name, f"choose one of {', '.join(SUITES)}")
    return importlib.import_module(f"repro.benchmarks.{name}")
