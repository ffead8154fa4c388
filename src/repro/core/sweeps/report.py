"""Build a sweep's report from its job folders: per job, per group of overrides, between groups.

A group is the set of a job's overrides other than the seed, minus those shared by every job
(so `-m seed=0,1,2 amp=off,bf16` gives the groups `amp=off` and `amp=bf16`). Failed jobs are
listed with their error line and left out of the statistics, and so are jobs an Optuna search
pruned (their summary says `pruned`). Two groups that ran the same seeds are compared seed by
seed (paired), others by Welch's interval (`compare`), and each difference gets a verdict
(`repro.core.sweeps.verdict`): which group is better, no difference shown, or not comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from repro.core.guards import received
from repro.core.sweeps import DECISION_FILE, ERROR_FILE
from repro.core.sweeps.stats import difference_of_means, paired_difference, summarize
from repro.core.sweeps.verdict import TIMES, verdict

# The metrics shown first, in this order; test_acc and test_loss only where the jobs tested
# after training (trainer.test_after_fit). Any other number a job's summary holds under one of
# PREFIXES (an objective's term: val_logit_penalty ...) follows, in name order, then any other
# number a summary holds that the user names (`python -m repro.report DIR best_val_acc`).
METRICS = ("val_acc", "test_acc", "val_loss", "test_loss", "train_loss", "wall_s")
PREFIXES = ("train_", "val_", "test_", "ema_val_")


@dataclass
class Job:
    name: str
    overrides: list[str]
    summary: dict[str, Any] | None
    error: str | None
    group: str = ""
    monitor: tuple[str, str] | None = None  # (trainer.monitor, trainer.monitor_mode)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def counted(self) -> bool:
        """Finished and not pruned: in the statistics."""
        return self.ok and not (self.summary or {}).get("pruned")

    @property
    def status(self) -> str:
        """ok, pruned or failed."""
        return "failed" if not self.ok else "ok" if self.counted else "pruned"


@dataclass
class Report:
    sweep_dir: Path
    jobs: list[Job]
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    adaptive: dict[str, Any] | None = None  # the adaptive sweeper's decision, if it ran


def number(summary: dict[str, Any], name: str) -> float | None:
    """The number a summary holds under `name`, or under a dotted path (`env.num_threads`)."""
    value: Any = summary.get(name)
    if name not in summary:
        value = summary
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if is_number else None


def metrics_of(jobs: list[Job], named: Sequence[str] = ()) -> list[str]:
    """The metrics to summarise: METRICS, then every other number the jobs' summaries hold
    under one of PREFIXES (columns come from the runs, not from a fixed list), then `named`."""
    found = {
        key
        for job in jobs
        for key in (job.summary or {})
        if key.startswith(PREFIXES) and number(job.summary, key) is not None
        and key not in METRICS
    }  # fmt: skip
    listed = [*METRICS, *sorted(found)]
    return listed + [name for name in dict.fromkeys(named) if name not in listed]


def _is_seed(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return key in ("seed", "seed.value")


def read_job(folder: Path) -> Job:
    """A job's overrides, summary and how it failed; records that cannot be read (damaged, or
    not repro's) make it a failed job saying so, not a failed report."""
    summary_file, error_file = folder / "summary.json", folder / ERROR_FILE
    sweep_dir = folder.parent  # what the job reads lies in the sweep folder the command named
    present = summary_file.exists() or summary_file.is_symlink()
    try:
        overrides = received.load_yaml(folder / ".hydra" / "overrides.yaml", sweep_dir) or []
        summary = received.load_json(summary_file, root=sweep_dir) if present else None
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ValueError(".hydra/overrides.yaml holds no list of overrides")
        if summary is not None and not isinstance(summary, dict):
            raise ValueError("summary.json holds no mapping")
    except (received.ReceivedFileError, ValueError) as unreadable:
        said = getattr(unreadable, "why", str(unreadable))
        reason = said.strip().splitlines()[0] if said.strip() else ""
        return Job(
            folder.name, [], None, f"records unreadable: {reason or type(unreadable).__name__}"
        )
    error = None
    # An error.txt older than the summary is a failed attempt that a later one made good.
    if (error_file.exists() or error_file.is_symlink()) and not _newer(summary_file, error_file):
        try:
            said = received.read_text(error_file, root=sweep_dir).strip().splitlines()
        except received.ReceivedFileError as unreadable:
            said = [f"error.txt unreadable: {unreadable.why}"]
        error = said[-1] if said else "?"
    elif summary is None:
        error = "no summary.json (the job was killed or is still running)"
    elif not summary.get("completed", True):
        error = f"stopped at step {summary.get('step')} (signal {summary.get('stopped_by_signal')})"
    return Job(folder.name, list(overrides), summary, error, monitor=_monitor(folder, summary))


def _monitor(folder: Path, summary: dict[str, Any]) -> tuple[str, str] | None:
    """The job's (trainer.monitor, trainer.monitor_mode): which side of its monitored column
    the user called better (`auto` as the run resolved it: its summary's `best_<column>`).
    None where .hydra/config.yaml does not say (its absence or damage costs the report only
    that)."""
    try:
        recorded = received.load_yaml(folder / ".hydra" / "config.yaml", folder.parent)
        trainer = (recorded or {})["trainer"]
        monitor = str(trainer["monitor"])
        if monitor == "auto":
            named = [key for key in summary if key.startswith("best_") and key != "best_step"]
            monitor = named[0].removeprefix("best_") if len(named) == 1 else monitor
        return monitor, str(trainer["monitor_mode"])
    except (received.ReceivedFileError, ValueError, KeyError, TypeError):
        return None


def _newer(path: Path, than: Path) -> bool:
    return path.is_file() and path.stat().st_mtime_ns > than.stat().st_mtime_ns


def collect(sweep_dir: Path) -> list[Job]:
    folders = [p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")]
    jobs = [read_job(f) for f in sorted(folders, key=lambda p: (len(p.name), p.name))]
    if not jobs:
        return jobs
    shared = set.intersection(*(set(j.overrides) for j in jobs))
    for job in jobs:
        own = sorted(o for o in job.overrides if o not in shared and not _is_seed(o))
        job.group = " ".join(own) or "all"
    return jobs


def _decision(found: Any) -> dict[str, Any] | None:
    """The adaptive sweeper's decision file as the report reads it: None (it says nothing) if
    it names no metric."""
    return found if isinstance(found, dict) and isinstance(found.get("metric"), str) else None


def build(sweep_dir: Path, metrics: Sequence[str] = ()) -> Report:
    """The report of the jobs in `sweep_dir`; `metrics`: numbers to summarise beyond the usual."""
    jobs = collect(sweep_dir)
    decision_file = sweep_dir / DECISION_FILE
    adaptive = None
    if decision_file.exists() or decision_file.is_symlink():
        adaptive = _decision(received.load_json(decision_file, root=sweep_dir))
    named = [*metrics, *([adaptive["metric"]] if adaptive else [])]
    report = Report(sweep_dir, jobs, metrics=metrics_of(jobs, named), adaptive=adaptive)
    values: dict[str, dict[str, list[tuple[Any, float]]]] = {}  # group, metric: (seed, value)s
    for job in report.jobs:
        if job.counted and job.summary is not None:
            group = values.setdefault(job.group, {m: [] for m in report.metrics})
            for metric in report.metrics:
                if (value := number(job.summary, metric)) is not None:
                    group[metric].append((job.summary.get("seed"), value))
    for name, by_metric in values.items():
        report.groups[name] = {
            m: summarize([value for _, value in pairs]).as_dict()
            for m, pairs in by_metric.items()
            if pairs
        }
    for a, b in combinations(values, 2):
        both = [m for m in report.metrics if values[a][m] and values[b][m]]
        report.comparisons.append(
            {"a": a, "b": b, **{m: compare(values[a][m], values[b][m]) for m in both}}
        )
    _judge(report)
    return report


def _judge(report: Report) -> None:
    """Each comparison's verdict per metric (repro.core.sweeps.verdict), from the keys of the
    overrides in which its two groups differ, the objective's terms (train_<term> columns) and
    the monitor modes the jobs agree on."""
    overrides: dict[str, set[str]] = {}
    for job in (j for j in report.jobs if j.counted):
        overrides.setdefault(job.group, set()).update(o for o in job.overrides if not _is_seed(o))
    terms = {m.removeprefix("train_") for m in report.metrics if m.startswith("train_")}
    terms -= {t.removeprefix("train_") for t in TIMES}
    pairs = {job.monitor for job in report.jobs if job.counted and job.monitor}
    modes = {m: mode for m, mode in pairs if [n for n, _ in pairs].count(m) == 1}
    for comp in report.comparisons:
        keys = overrides[comp["a"]] ^ overrides[comp["b"]]
        for metric in (m for m in report.metrics if m in comp):
            d = comp[metric]
            said = verdict(metric, d["ci_low"], d["ci_high"], comp["a"], comp["b"],
                           keys=keys, terms=terms, modes=modes)  # fmt: skip
            d.update(said.as_dict())


def compare(a: list[tuple[Any, float]], b: list[tuple[Any, float]]) -> dict[str, Any]:
    """b - a from (seed, value) pairs: Welch's interval, and where the groups share two seeds or
    more, the paired one over those seeds, which is then the headline. A shared seed gives both
    groups the same start (init, order, validation split): the per-seed difference cancels that
    luck, where Welch's treats the groups as independent and keeps it in its wider interval."""
    welch = difference_of_means([value for _, value in a], [value for _, value in b])
    in_a, in_b = _by_seed(a), _by_seed(b)
    shared = [seed for seed in in_a if seed in in_b]
    if len(shared) < 2:
        test, paired = "Welch: seeds not shared", None
        return {**welch.as_dict(), "test": test, "paired": paired, "welch": welch.as_dict()}
    paired = paired_difference([in_a[s] for s in shared], [in_b[s] for s in shared])
    unmatched = len(a) + len(b) - 2 * len(shared)
    test = f"paired: {len(shared)} shared seeds" + (
        f" ({unmatched} unmatched jobs left out)" if unmatched else ""
    )
    return {**paired.as_dict(), "test": test, "paired": paired.as_dict(), "welch": welch.as_dict()}


def _by_seed(pairs: list[tuple[Any, float]]) -> dict[Any, float]:
    """seed -> value, for the seeds that occur once (a repeated seed has no single partner)."""
    seeds = [seed for seed, _ in pairs]
    return {seed: value for seed, value in pairs if seed is not None and seeds.count(seed) == 1}
