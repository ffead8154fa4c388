"""A sweep's report (`repro.core.sweeps.report.build`) rendered: the markdown the sweep prints and
sweep_summary.md, sweep_summary.json and .csv, and sweep.png, in the sweep folder."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from repro.core.files import write_text_atomic
from repro.core.sweeps.report import Job, Report, number
from repro.core.text import for_csv, for_markdown, for_terminal
from repro.core.watch.loggers import save_figure_atomic


def _fmt(x: Any, digits: int = 4) -> str:
    """A number as the tables show it; anything else a job's summary holds, as escaped text."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, int | float) and not isinstance(x, bool):
        return f"{x:.{digits}f}"
    return for_markdown(x)


def markdown(report: Report) -> str:
    md = for_markdown  # every name, value and error from the jobs' files, as text
    lines = [f"# Sweep report: {md(report.sweep_dir)}", ""]
    counted, failed = sum(j.counted for j in report.jobs), sum(not j.ok for j in report.jobs)
    pruned = len(report.jobs) - counted - failed  # said only where a search pruned some
    said = f"{len(report.jobs)} jobs, {counted} finished, {failed} failed"
    lines += [said + (f", {pruned} pruned." if pruned else "."), ""]
    if report.adaptive:
        lines += _adaptive_lines(report.adaptive)
    lines += ["## Groups (95% confidence intervals, t distribution)", ""]
    lines += [
        "| group | metric | n | mean | std | min | max | 95% CI |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, metrics in report.groups.items():
        for metric, s in metrics.items():
            ci = f"[{_fmt(s['ci_low'])}, {_fmt(s['ci_high'])}]"
            lines.append(
                f"| {md(name)} | {md(metric)} | {s['count']} | {_fmt(s['mean'])} | {_fmt(s['std'])} | "
                f"{_fmt(s['min'])} | {_fmt(s['max'])} | {ci} |"
            )
    if report.comparisons:
        lines += ["", "## Differences (b - a, 95% CI: paired over shared seeds, else Welch)", ""]
        lines += ["| a | b | metric | difference | 95% CI | test | Welch 95% CI | verdict |"]
        lines += ["|---|---|---|---|---|---|---|---|"]
        for comp in report.comparisons:
            for metric in (m for m in report.metrics if m in comp):
                d, w = comp[metric], comp[metric]["welch"]
                cis = [f"[{_fmt(x['ci_low'])}, {_fmt(x['ci_high'])}]" for x in (d, w)]
                lines.append(
                    f"| {md(comp['a'])} | {md(comp['b'])} | {md(metric)} | {_fmt(d['difference'])} | "
                    f"{cis[0]} | {d['test']} | {cis[1]} | {d['verdict']} |"
                )
    lines += ["", "## Jobs", ""]
    lines += ["| job | group | seed | val_acc | test_acc | weights_sha256 | status |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for job in report.jobs:
        s = job.summary or {}
        status = {"ok": "ok", "pruned": f"pruned at step {s.get('step')}"}.get(job.status)
        status = md(status or f"FAILED: {job.error}")
        sha = md(str(s.get("weights_sha256", ""))[:16])
        seed, acc, test = md(s.get("seed", "")), _fmt(s.get("val_acc")), _fmt(s.get("test_acc"))
        row = [md(job.name), md(job.group), seed, acc, test, sha, status]
        lines.append("| " + " | ".join(row) + " |")
    # Escaped again as a whole: the report's text is printed too.
    return "\n".join(map(for_terminal, lines)) + "\n"


def _adaptive_lines(decision: dict[str, Any]) -> list[str]:
    """The adaptive sweeper's answer and its looks (hydra_plugins.repro.adaptive_seeds), each
    value as the decision file holds it, escaped."""
    md, get = for_markdown, decision.get
    confidence = get("look_confidence")
    level = f"{_fmt(100 * confidence, 2)}%" if isinstance(confidence, int | float) else "?"
    metric, a, b = md(get("metric")), md(get("a", "?")), md(get("b", "?"))
    lines = [f"## Adaptive seeds: {metric} of b = {b} vs a = {a}", "", md(get("why", "")), ""]
    lines += [f"| seeds | {metric}: b - a | {level} CI |", "|---|---|---|"]
    looks = get("looks") if isinstance(get("looks"), list) else []
    for look in (look for look in looks if isinstance(look, dict)):
        ci = f"[{_fmt(look.get('ci_low'))}, {_fmt(look.get('ci_high'))}]"
        lines.append(f"| {md(look.get('seeds'))} | {_fmt(look.get('difference'))} | {ci} |")
    return [*lines, ""]


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
        "adaptive": report.adaptive,
    }
    write_text_atomic(folder / "sweep_summary.json", json.dumps(payload, indent=2) + "\n")
    columns = ["job", "group", "overrides", "status", "error", "seed", "weights_sha256"]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, [*columns, *report.metrics])
    # The jobs' files name the groups, errors and metrics: no cell may run in a spreadsheet.
    writer.writerow({name: for_csv(name) for name in writer.fieldnames})
    for row in payload["jobs"]:
        cells = {**row, "overrides": " ".join(row["overrides"])}
        writer.writerow({name: for_csv(value) for name, value in cells.items()})
    write_text_atomic(folder / "sweep_summary.csv", table.getvalue())
    write_text_atomic(folder / "sweep_summary.md", markdown(report))
    plot(report, folder / "sweep.png")


def _literal(text: str) -> str:
    """Text from the jobs' files as matplotlib draws it: as written (a `$` would start math)."""
    return for_terminal(text).replace("$", r"\$")


def plotted_metric(report: Report) -> str | None:
    """The metric sweep.png shows: the one the finished jobs agree to monitor, else the first
    of the report's metrics a group holds (val_acc, where the task has one); None if none."""
    held = [m for m in report.metrics if any(m in group for group in report.groups.values())]
    monitored = {job.monitor[0] for job in report.jobs if job.counted and job.monitor}
    if len(monitored) == 1 and (agreed := monitored.pop()) in held:
        return agreed
    return held[0] if held else None


def plot(report: Report, out: Path) -> None:
    """The plotted metric per job, by group, with each group's mean and 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = plotted_metric(report)
    names = list(report.groups) if metric else []
    figure, axis = plt.subplots(figsize=(max(4, 1.6 * len(names) + 2), 4))
    for x, name in enumerate(names):
        counted = [j for j in report.jobs if j.counted and j.group == name]
        values = [v for j in counted if (v := number(j.summary or {}, metric)) is not None]
        axis.scatter([x] * len(values), values, color="tab:blue", alpha=0.6)
        s = report.groups[name].get(metric)
        if s and not math.isnan(s["ci_low"]):
            spread = [[s["mean"] - s["ci_low"]], [s["ci_high"] - s["mean"]]]
            axis.errorbar(x + 0.15, s["mean"], yerr=spread, fmt="o", color="black", capsize=4)
    axis.set_xticks(range(len(names)), [_literal(n) for n in names], rotation=20, ha="right")
    title = f"{metric} per job; mean and 95% CI per group" if metric else "no finished job"
    axis.set(ylabel=_literal(metric or ""), title=_literal(title))
    axis.grid(alpha=0.3)
    save_figure_atomic(figure, out)
