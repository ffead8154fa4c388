"""`python -m repro.report` called in this process (repro.report.main): its refusals word for
word, and a report of the metrics it is asked for."""

from __future__ import annotations

import json

import pytest

from repro import report
from repro.core.sweeps import render
from repro.core.sweeps.report import build as report_of


def _sweep(folder, jobs: int = 2):
    for number in range(jobs):
        job = folder / str(number)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- seed={number}\n")
        summary = {"completed": True, "step": 4, "test_acc": 0.5 + number / 10, "lr": 0.1}
        (job / "summary.json").write_text(json.dumps(summary))
    return folder


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        report.main(argv)
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_without_a_folder_it_says_its_usage(capsys):
    said = _refused([], capsys)
    assert said == "error: usage: python -m repro.report SWEEP_DIR [METRIC ...]\n"


def test_a_folder_without_jobs_is_named(tmp_path, capsys):
    said = _refused([str(tmp_path)], capsys)
    assert said == (
        f"error: {tmp_path}: no sweep jobs found (looked for */.hydra/overrides.yaml)\n"
    )
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_metric_no_job_holds_is_named_and_nothing_is_written(tmp_path, capsys):
    sweep = _sweep(tmp_path / "sweep")
    said = _refused([str(sweep), "lr", "best_nothing"], capsys)
    assert said == "error: best_nothing: no finished job's summary.json holds a number there\n"
    assert not (sweep / "sweep_summary.json").exists()


def test_the_metrics_asked_for_are_summarised_beside_the_usual(tmp_path, capsys):
    sweep = _sweep(tmp_path / "sweep")
    report.main([str(sweep), "lr"])
    out, err = capsys.readouterr()
    assert err == ""
    written = json.loads((sweep / "sweep_summary.json").read_text())
    assert "lr" in json.dumps(written) and "| lr" in out.replace("|lr", "| lr")


def _multilabel_sweep(folder, monitor: str | None):
    """Two groups of jobs whose task has no accuracy (multi-label: val_map, val_loss)."""
    for number, override in enumerate(["lr=$^$", "lr=$^$", "lr=2", "lr=2"]):
        job = folder / str(number)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- seed={number}\n- '{override}'\n")
        summary = {"completed": True, "seed": number, "val_map": 0.25 * number, "val_loss": 1.0}
        (job / "summary.json").write_text(json.dumps(summary))
        if monitor:
            config = f"trainer:\n  monitor: {monitor}\n  monitor_mode: max\n"
            (job / ".hydra" / "config.yaml").write_text(config)
    return folder


@pytest.mark.parametrize("monitor, plotted", [("val_map", "val_map"), (None, "val_loss")])
def test_a_sweep_without_accuracy_is_plotted_by_its_monitored_metric(
    tmp_path, capsys, monitor, plotted
):
    sweep = _multilabel_sweep(tmp_path / "sweep", monitor)
    built = report_of(sweep)
    assert render.plotted_metric(built) == plotted
    report.main([str(sweep)])  # group names holding "$" are drawn as written, not as math
    assert (sweep / "sweep.png").stat().st_size > 0
    assert "| lr=$^$ " in capsys.readouterr().out


def test_nothing_to_plot_still_draws_a_figure_saying_so(tmp_path):
    sweep = _multilabel_sweep(tmp_path / "sweep", None)
    built = report_of(sweep)
    built.groups.clear()
    assert render.plotted_metric(built) is None
    render.plot(built, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 0
