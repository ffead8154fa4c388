"""Build a sweep's report from its job folders: per job, per group of overrides, between groups.

A group is the set of a job's overrides other than the seed, minus those shared by every job
(so `-m seed=0,1,2 amp=off,bf16` gives the groups `amp=off` and `amp=bf16`). Failed jobs are
listed with their error line and left out of the statistics, and so are jobs an Optuna search
pruned (their summary says `pruned`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml

from repro.files import write_text_atomic
from repro.sweeps import ERROR_FILE
from repro.sweeps.stats import difference_of_means, summarize
from repro.watch.loggers import save_figure_atomic

# The metrics shown first, in this order; test_acc and test_loss only where the jobs tested
# after training (trainer.test_after_fit). Any other number a job's summary holds under one of
# PREFIXES (an objective's term: val_logit_penalty ...) follows, in name order.
METRICS = ("val_acc", "test_acc", "val_loss", "test_loss", "train_loss", "wall_s")
PREFIXES = ("train_", "val_", "test_", "ema_val_")


@dataclass
class Job:
    name: str
    overrides: list[str]
    summary: dict[str, Any] | None
    error: str | None
    group: str = ""

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


def metrics_of(jobs: list[Job]) -> list[str]:
    """The metrics to summarise: METRICS, then every other number the jobs' summaries hold
    under one of PREFIXES (columns come from the runs, not from a fixed list)."""
    found = {
        key
        for job in jobs
        for key, value in (job.summary or {}).items()
        if key.startswith(PREFIXES) and isinstance(value, int | float)
        and not isinstance(value, bool) and key not in METRICS
    }  # fmt: skip
    return [*METRICS, *sorted(found)]


def _is_seed(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return key in ("seed", "seed.value")


def _read_job(folder: Path) -> Job:
    overrides = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or []
    summary_file, error_file = folder / "summary.json", folder / ERROR_FILE
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    error = None
    if error_file.is_file():
        error = error_file.read_text().strip().splitlines()[-1] if error_file.read_text() else "?"
    elif summary is None:
        error = "no summary.json (the job was killed or is still running)"
    elif not summary.get("completed", True):
        error = f"stopped at step {summary.get('step')} (signal {summary.get('stopped_by_signal')})"
    return Job(folder.name, list(overrides), summary, error)


def collect(sweep_dir: Path) -> list[Job]:
    folders = [p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")]
    jobs = [_read_job(f) for f in sorted(folders, key=lambda p: (len(p.name), p.name))]
    if not jobs:
        return jobs
    shared = set.intersection(*(set(j.overrides) for j in jobs))
    for job in jobs:
        own = sorted(o for o in job.overrides if o not in shared and not _is_seed(o))
        job.group = " ".join(own) or "all"
    return jobs


def build(sweep_dir: Path) -> Report:
    jobs = collect(sweep_dir)
    report = Report(sweep_dir, jobs, metrics=metrics_of(jobs))
    values: dict[str, dict[str, list[float]]] = {}
    for job in report.jobs:
        if job.counted and job.summary is not None:
            group = values.setdefault(job.group, {m: [] for m in report.metrics})
            for metric in report.metrics:
                if job.summary.get(metric) is not None:
                    group[metric].append(float(job.summary[metric]))
    for name, metrics in values.items():
        report.groups[name] = {m: summarize(v).as_dict() for m, v in metrics.items() if v}
    for a, b in combinations(values, 2):
        both = [m for m in report.metrics if values[a][m] and values[b][m]]
        differences = {m: difference_of_means(values[a][m], values[b][m]).as_dict() for m in both}
        report.comparisons.append({"a": a, "b": b, **differences})
    return report


def _fmt(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def markdown(report: Report) -> str:
    lines = [f"# Sweep report: {report.sweep_dir}", ""]
    counted, failed = sum(j.counted for j in report.jobs), sum(not j.ok for j in report.jobs)
    pruned = len(report.jobs) - counted - failed  # said only where a search pruned some
    said = f"{len(report.jobs)} jobs, {counted} finished, {failed} failed"
    lines += [said + (f", {pruned} pruned." if pruned else "."), ""]
    lines += ["## Groups (95% confidence intervals, t distribution)", ""]
    lines += [
        "| group | metric | n | mean | std | min | max | 95% CI |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, metrics in report.groups.items():
        for metric, s in metrics.items():
            ci = f"[{_fmt(s['ci_low'])}, {_fmt(s['ci_high'])}]"
            lines.append(
                f"| {name} | {metric} | {s['count']} | {_fmt(s['mean'])} | {_fmt(s['std'])} | "
                f"{_fmt(s['min'])} | {_fmt(s['max'])} | {ci} |"
            )
    if report.comparisons:
        lines += ["", "## Differences of means (b - a, Welch 95% CI)", ""]
        lines += ["| a | b | metric | difference | 95% CI |", "|---|---|---|---|---|"]
        for comp in report.comparisons:
            for metric in (m for m in report.metrics if m in comp):
                d = comp[metric]
                ci = f"[{_fmt(d['ci_low'])}, {_fmt(d['ci_high'])}]"
                lines.append(
                    f"| {comp['a']} | {comp['b']} | {metric} | {_fmt(d['difference'])} | {ci} |"
                )
    lines += ["", "## Jobs", ""]
    lines += ["| job | group | seed | val_acc | test_acc | weights_sha256 | status |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for job in report.jobs:
        s = job.summary or {}
        status = {"ok": "ok", "pruned": f"pruned at step {s.get('step')}"}.get(job.status)
        status = status or f"FAILED: {job.error}"
        sha = s.get("weights_sha256", "")[:16]
        seed, acc, test = s.get("seed", ""), _fmt(s.get("val_acc")), _fmt(s.get("test_acc"))
        lines.append(f"| {job.name} | {job.group} | {seed} | {acc} | {test} | {sha} | {status} |")
    return "\n".join(lines) + "\n"


def _job_row(job: Job, metrics: list[str]) -> dict[str, Any]:
    summary = job.summary or {}
    return {
        "job": job.name,
        "group": job.group,
        "overrides": job.overrides,
        "status": job.status,
        "error": job.error,
        "seed": summary.get("seed"),
        "weights_sha256": summary.get("weights_sha256"),
        **{m: summary.get(m) for m in metrics},
    }


def write(report: Report) -> None:
    """sweep_summary.json, .csv, .md and sweep.png in the sweep folder."""
    folder = report.sweep_dir
    payload = {
        "sweep_dir": str(folder),
        "jobs": [_job_row(job, report.metrics) for job in report.jobs],
        "groups": report.groups,
        "comparisons": report.comparisons,
    }
    write_text_atomic(folder / "sweep_summary.json", json.dumps(payload, indent=2) + "\n")
    columns = ["job", "group", "overrides", "status", "error", "seed", "weights_sha256"]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, [*columns, *report.metrics])
    writer.writeheader()
    for row in payload["jobs"]:
        writer.writerow({**row, "overrides": " ".join(row["overrides"])})
    write_text_atomic(folder / "sweep_summary.csv", table.getvalue())
    write_text_atomic(folder / "sweep_summary.md", markdown(report))
    plot(report, folder / "sweep.png")


def plot(report: Report, out: Path) -> None:
    """Validation accuracy per job, by group, with each group's mean and 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report.groups)
    figure, axis = plt.subplots(figsize=(max(4, 1.6 * len(names) + 2), 4))
    for x, name in enumerate(names):
        accs = [j.summary["val_acc"] for j in report.jobs if j.counted and j.group == name]
        axis.scatter([x] * len(accs), accs, color="tab:blue", alpha=0.6)
        s = report.groups[name]["val_acc"]
        if not math.isnan(s["ci_low"]):
            spread = [[s["mean"] - s["ci_low"]], [s["ci_high"] - s["mean"]]]
            axis.errorbar(x + 0.15, s["mean"], yerr=spread, fmt="o", color="black", capsize=4)
    axis.set_xticks(range(len(names)), names, rotation=20, ha="right")
    axis.set(ylabel="validation accuracy", title="val_acc per job; mean and 95% CI per group")
    axis.grid(alpha=0.3)
    save_figure_atomic(figure, out)
