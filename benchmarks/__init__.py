"""The suites behind `python -m benchmarks suite=<name>`: one module per suite.

Each suite module has `run(cfg, run_dir) -> common.Result`; `common` holds what they share
(building the training objects from a config, timing, peak memory, tables, output files).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from repro.core.errors import ConfigError

SUITES = ("knobs", "overhead", "startup", "exactness", "data", "peers")


# Per suite: the counts it reads and their least allowed value.
COUNTS = {
    "knobs": {"warmup_steps": 1, "timed_steps": 1},  # the first step compiles and autotunes
    "overhead": {"pairs": 1, "steps": 1, "warmup_steps": 0},
    "startup": {"repeats": 1},
    "exactness": {"steps": 3, "checkpoint_every_steps": 1, "timeout_s": 1},
    "data": {"batches": 1, "warmup_batches": 0, "repeats": 1},
    "peers": {"seeds": 2, "timeout_s": 1},  # a spread needs two timed runs a side
}
GRID = {
    "memory_format": ("contiguous", "channels_last"),
    "amp": ("off", "auto", "bf16", "fp16"),
    "pin_memory": (False, True),
    "cudnn_benchmark": (False, True),
    "compile": (False, True),
}


def load(name: str) -> ModuleType:
    if name not in SUITES:
        raise ConfigError("suite", name, f"choose one of {', '.join(SUITES)}")
    return importlib.import_module(f"benchmarks.{name}")


def validate(suite: Any) -> None:
    """Check the suite's own settings, naming the key and what is allowed."""
    load(suite.name)
    for key, least in COUNTS[suite.name].items():
        value = suite.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"suite.{key}", value, f"an integer >= {least}")
    if suite.name == "exactness":
        _validate_exactness(suite)
    if suite.name == "data":
        _validate_list(suite, "loaders", "loader", prefix="suite")
    if suite.name == "knobs":
        for axis in (*GRID, "loader"):
            _validate_list(suite.grid, axis, axis, prefix="suite.grid")
        _validate_rows(suite.get("rows"))


_ALLOWED = {axis: ", ".join(str(v).lower() for v in values) for axis, values in GRID.items()}
_ALLOWED["loader"] = "DataLoader worker counts (integers >= 0) or device"


def _allowed(axis: str, value: Any) -> bool:
    if axis == "loader":
        return value == "device" or (type(value) is int and value >= 0)
    return any(value == v and type(value) is type(v) for v in GRID[axis])


def _validate_exactness(suite: Any) -> None:
    if suite.checkpoint_every_steps >= suite.steps - 1:
        allowed = f"less than suite.steps - 1 ({suite.steps - 1}): the kill comes after it"
        raise ConfigError("suite.checkpoint_every_steps", suite.checkpoint_every_steps, allowed)
    from benchmarks.exactness import CHECKS

    names = suite.get("checks")
    if not names or isinstance(names, str) or any(name not in CHECKS for name in names):
        allowed = f"a non-empty list of: {', '.join(CHECKS)}"
        raise ConfigError("suite.checks", names, allowed)
    seed = suite.get("kill_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError("suite.kill_seed", seed, "null (a fresh draw) or an integer >= 0")


def _validate_rows(rows: Any) -> None:
    """suite.rows: null, or a list of rows, each mapping some axes to allowed values."""
    if rows is None:
        return
    example = "a list of rows like [{loader:2},{amp:bf16,compile:true}]"
    if isinstance(rows, str | int | bool) or not rows:
        raise ConfigError("suite.rows", rows, f"null (the grid) or {example}")
    axes = (*GRID, "loader")
    for row in rows:
        if not hasattr(row, "items"):
            raise ConfigError("suite.rows", row, example)
        for axis, value in row.items():
            if axis not in axes:
                raise ConfigError("suite.rows", axis, f"axes from: {', '.join(axes)}")
            if not _allowed(axis, value):
                raise ConfigError(f"suite.rows.{axis}", value, f"one of: {_ALLOWED[axis]}")


def _validate_list(node: Any, key: str, axis: str, prefix: str) -> None:
    """`node[key]` must be a non-empty list of the values allowed on `axis`."""
    values = node.get(key)
    if not values or isinstance(values, str | int | bool):
        raise ConfigError(f"{prefix}.{key}", values, "a non-empty list, e.g. [a,b]")
    for value in values:
        if not _allowed(axis, value):
            raise ConfigError(f"{prefix}.{key}", value, f"list items from: {_ALLOWED[axis]}")
