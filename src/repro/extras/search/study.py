"""The study on disk, opened the same way by the sweeper and by its jobs, and what a job's
folder says its trial scored.

optuna 2.10 is the newest the Hydra Optuna plugin allows, and it predates SQLAlchemy 2, which
the lock installs: its schema-version check reads a stamp written in a connection it never
commits (so the check fails), and that connection holds SQLite's write lock until it is
collected. `open_study` skips the check and collects it. It also bypasses optuna's trial cache,
which keeps a running trial's parameters and reports in this process until the trial ends: a
killed sweep would lose them, and the sweeper would not see what its jobs report.
"""

from __future__ import annotations

import csv
import gc
import io
import math
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.storages import RDBStorage

from repro.core.errors import ConfigError
from repro.core.files import write_json_atomic, write_text_atomic
from repro.core.guards import received

SQLITE = "sqlite:///"
SUMMARY_FILE = "study.json"


def storage_url(url: str) -> str:
    """`url` with a relative SQLite path made absolute (and its folder made), so that the
    sweeper and its jobs open the same file."""
    if not url.startswith(SQLITE) or url[len(SQLITE) :].startswith("/"):
        return url
    path = Path(url[len(SQLITE) :]).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLITE + str(path)


def open_study(
    url: str, name: str, *, direction: str | None = None, sampler: Any = None, pruner: Any = None
) -> optuna.Study:
    """The study `name` in the storage at `url`: created if `direction` is given and it does not
    exist yet, else loaded."""
    with warnings.catch_warnings():  # optuna 2 uses SQLAlchemy 1 names that 2 still accepts
        warnings.simplefilter("ignore", DeprecationWarning)
        storage = RDBStorage(url, skip_compatibility_check=True)
    gc.collect()  # the version check's uncommitted connection: its lock goes with it
    if direction is None:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    else:
        study = optuna.create_study(
            storage=storage, study_name=name, direction=direction, sampler=sampler,
            pruner=pruner, load_if_exists=True,
        )  # fmt: skip
    study._storage = storage  # past the cache: every write reaches the database at once
    return study


@dataclass(frozen=True)
class Objective:
    """What a trial scores: `metric` (any number summary.json holds) at the run's end
    (`take: final`) or at its best evaluation (`take: best`, from metrics.csv)."""

    metric: str = "val_acc"
    take: str = "final"

    def __post_init__(self) -> None:
        if self.take not in ("final", "best"):
            raise ConfigError("hydra.sweeper.objective.take", self.take, "final or best")

    def value(self, folder: Path, summary: dict[str, Any], direction: str) -> float:
        """The trial's value, from its job's folder and summary."""
        if self.take == "final":
            found, named = summary.get(self.metric), summary
        else:
            text = received.read_text(folder / "metrics.csv", "table", root=folder)
            rows = list(csv.DictReader(io.StringIO(text, newline="")))
            named = rows[0] if rows else {}
            scores = [float(row[self.metric]) for row in rows if row.get(self.metric)]
            found = (max if direction == "maximize" else min)(scores) if scores else None
        if not isinstance(found, int | float) or isinstance(found, bool) or math.isnan(found):
            numbers = sorted(key for key, value in named.items() if _number(value))
            where = "summary.json" if self.take == "final" else "metrics.csv"
            allowed = f"a number the jobs' {where} holds: {', '.join(numbers)}"
            raise ConfigError("hydra.sweeper.objective.metric", self.metric, allowed)
        return float(found)


def _number(value: Any) -> bool:
    try:
        return not isinstance(value, bool) and not math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def write_summary(study: optuna.Study, sweep_dir: Path, objective: Objective) -> str:
    """study.json (every trial: state, value, parameters; the counts; the best trial) and
    optimization_results.yaml (the best parameters, as the Hydra plugin writes them) in the
    sweep folder; returns a line that says it all."""
    trials = study.get_trials(deepcopy=False)
    counts = Counter(trial.state.name.lower() for trial in trials)
    done = [trial for trial in trials if trial.state == optuna.trial.TrialState.COMPLETE]
    best = study.best_trial if done else None
    payload = {
        "study": study.study_name,
        "direction": study.direction.name.lower(),
        "objective": {"metric": objective.metric, "take": objective.take},
        "counts": dict(counts),
        "best": _row(best, sweep_dir) if best else None,
        "trials": [_row(trial, sweep_dir) for trial in trials],
    }
    write_json_atomic(sweep_dir / SUMMARY_FILE, payload)
    line = (
        f"study {study.study_name}: {len(trials)} trials ("
        + ", ".join(
            f"{counts[state]} {state}" for state in ("complete", "pruned", "fail", "running")
        )
        + ")"
    )
    if best is None:
        return line + "; none complete"
    results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
    write_text_atomic(sweep_dir / "optimization_results.yaml", yaml.safe_dump(results))
    return line + f"; best: trial {best.number}, {objective.metric} {best.value:.4f} {best.params}"


def _row(trial: optuna.trial.FrozenTrial, sweep_dir: Path) -> dict[str, Any]:
    state, folder = trial.state.name.lower(), str(sweep_dir / str(trial.number))
    return {"trial": trial.number, "state": state, "value": trial.value, "params": trial.params,
            "folder": folder}  # fmt: skip
