"""Seed sweeps: parallel launchers, the statistics report, failed jobs, unique folders."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys

import pytest
import yaml
from scipy import stats

from repro.core.sweeps import render, report

from conftest import ROOT, read_summary, run_cli, sweep_said, tiny, train_in_process

# One DataLoader worker: inside a joblib job, workers must still start.
SWEEP = tiny("trainer.num_threads=1", "dataloader.num_workers=1")


def job_dirs(sweep_dir):
    return sorted((p for p in sweep_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


@pytest.mark.e2e
@pytest.mark.slow
def test_joblib_sweep_report_and_a_job_equals_its_single_run(tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep_args = [
        "-m", "seed=0,1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *SWEEP,
        f"hydra.sweep.dir={sweep_dir}",
    ]  # fmt: skip
    done = run_cli("repro.train", *sweep_args)
    assert done.returncode == 0, sweep_said(done, sweep_dir)
    assert "| group | metric |" in done.stdout  # the table is printed at the end

    summary = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert len(summary["jobs"]) == 3 and all(j["status"] == "ok" for j in summary["jobs"])
    assert (sweep_dir / "sweep_summary.csv").read_text().count("\n") == 4
    assert (sweep_dir / "sweep_summary.md").is_file()
    assert (sweep_dir / "sweep.png").read_bytes().startswith(b"\x89PNG")

    accs = [read_summary(d)["val_acc"] for d in job_dirs(sweep_dir)]
    group = summary["groups"]["all"]["val_acc"]
    assert group["count"] == 3
    assert group["mean"] == pytest.approx(statistics.fmean(accs), abs=1e-12)
    assert group["std"] == pytest.approx(statistics.stdev(accs), abs=1e-12)

    seed0 = next(j for j in summary["jobs"] if j["seed"] == 0)
    alone = train_in_process(tmp_path / "alone", *SWEEP, "seed=0")
    assert seed0["weights_sha256"] == alone["weights_sha256"]

    # Each job's record names the sweep command as typed, and the job's own overrides.
    for number, job in enumerate(job_dirs(sweep_dir)):
        attempt = json.loads((job / "attempts.jsonl").read_text().splitlines()[0])
        assert attempt["command"] == shlex.join(["python", "-m", "repro.train", *sweep_args])
        assert f"seed.value={number}" in attempt["overrides"]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_failing_job_does_not_stop_the_others(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "repro.train", "-m", "optimizer.lr=0.1,-1,0.2", *SWEEP, f"hydra.sweep.dir={sweep_dir}"
    )
    assert done.returncode == 1, done.stderr  # the sweep finished, but not every job did
    jobs = json.loads((sweep_dir / "sweep_summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["ok", "failed", "ok"]
    assert "optimizer.lr=-1" in jobs[1]["error"] and ">= 0" in jobs[1]["error"]
    assert "FAILED" in (sweep_dir / "sweep_summary.md").read_text()
    # Jobs share a process with the basic launcher: no state leaks from one into the next.
    alone = train_in_process(tmp_path / "alone", *SWEEP, "optimizer.lr=0.2")
    assert jobs[2]["weights_sha256"] == alone["weights_sha256"]


def fake_job(sweep_dir, num, overrides, **metrics):
    folder = sweep_dir / str(num)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    values = {"val_acc": 0.5, "val_loss": 1.0, "train_loss": 1.0, "wall_s": 1.0, **metrics}
    (folder / "summary.json").write_text(json.dumps({**values, "seed": num, "completed": True}))


def test_the_report_shows_test_accuracy_beside_validation_where_jobs_tested(tmp_path):
    fake_job(tmp_path, 0, ["seed=0"], val_acc=0.8, test_acc=0.7, test_loss=0.9)
    fake_job(tmp_path, 1, ["seed=1"], val_acc=0.9, test_acc=0.75, test_loss=0.8)
    built = report.build(tmp_path)
    assert built.groups["all"]["test_acc"]["mean"] == pytest.approx(0.725)
    text = render.markdown(built)
    assert "| job | group | seed | val_acc | test_acc |" in text and "| 0.7500 |" in text
    untested = tmp_path / "untested"
    fake_job(untested, 0, ["seed=0", "amp=off"], val_acc=0.8)  # no test after training
    fake_job(untested, 1, ["seed=0", "amp=bf16"], val_acc=0.7)
    built = report.build(untested)
    assert "test_acc" not in built.groups["amp=off"] and "test_acc" not in built.comparisons[0]


def test_two_groups_statistics_and_the_difference_interval(tmp_path):
    a = [0.90, 0.92, 0.91, 0.95]
    b = [0.93, 0.97, 0.96]
    for i, acc in enumerate(a):
        fake_job(tmp_path, i, [f"seed={i}", "amp=off", "trainer.epochs=3"], val_acc=acc)
    for i, acc in enumerate(b, start=len(a)):
        fake_job(tmp_path, i, [f"seed={i}", "amp=bf16", "trainer.epochs=3"], val_acc=acc)
    built = report.build(tmp_path)
    assert set(built.groups) == {"amp=off", "amp=bf16"}  # shared overrides and seeds dropped
    off = built.groups["amp=off"]["val_acc"]
    half = stats.t.ppf(0.975, 3) * statistics.stdev(a) / len(a) ** 0.5
    assert off["ci_low"] == pytest.approx(statistics.fmean(a) - half)
    assert off["ci_high"] == pytest.approx(statistics.fmean(a) + half)
    assert (off["min"], off["max"]) == (0.90, 0.95)

    (comparison,) = built.comparisons
    welch = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    diff = comparison["val_acc"]
    assert diff["difference"] == pytest.approx(statistics.fmean(b) - statistics.fmean(a))
    assert (diff["ci_low"], diff["ci_high"]) == pytest.approx((welch.low, welch.high))


@pytest.mark.e2e
def test_report_cli_rebuilds_a_partly_failed_sweep(tmp_path):
    fake_job(tmp_path, 0, ["seed=0"], val_acc=0.8)
    fake_job(tmp_path, 1, ["seed=1"], val_acc=0.9)
    (tmp_path / "2" / ".hydra").mkdir(parents=True)
    (tmp_path / "2" / ".hydra" / "overrides.yaml").write_text("- seed=2\n")
    (tmp_path / "2" / "error.txt").write_text("ConfigError: trainer.batch_size=0 is not allowed\n")
    done = run_cli("repro.report", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "FAILED: ConfigError: trainer.batch_size=0" in done.stdout
    jobs = json.loads((tmp_path / "sweep_summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["ok", "ok", "failed"]
    empty = run_cli("repro.report", str(tmp_path / "nothing"))
    assert empty.returncode == 2 and "no sweep jobs" in empty.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_submitit_local_sweep_of_two_jobs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep_args = [
        "-m", "seed=0,1", "hydra/launcher=submitit_local", *SWEEP, f"hydra.sweep.dir={sweep_dir}"
    ]  # fmt: skip
    done = run_cli("repro.train", *sweep_args)
    assert done.returncode == 0, sweep_said(done, sweep_dir)
    jobs = json.loads((sweep_dir / "sweep_summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["ok", "ok"]
    assert jobs[0]["weights_sha256"] != jobs[1]["weights_sha256"]
    attempt = json.loads((sweep_dir / "1" / "attempts.jsonl").read_text().splitlines()[0])
    assert attempt["command"] == shlex.join(["python", "-m", "repro.train", *sweep_args])


@pytest.mark.e2e
@pytest.mark.slow
def test_optuna_search_runs_seeded_trials(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "repro.train", "-m", "hparams_search=lr_wd", "hydra.sweeper.n_trials=2", *SWEEP,
        f"hydra.sweep.dir={sweep_dir}",
    )  # fmt: skip
    assert done.returncode == 0, sweep_said(done, sweep_dir)
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert set(result["best_params"]) == {"optimizer.lr", "optimizer.weight_decay"}
    jobs = json.loads((sweep_dir / "sweep_summary.json").read_text())["jobs"]
    assert len(jobs) == 2 and all(j["status"] == "ok" for j in jobs)


@pytest.mark.e2e
@pytest.mark.slow
def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    # The date alone would collide for certain; the run id is what keeps the folders apart.
    pattern = f"hydra.run.dir={tmp_path}/${{now:%Y-%m-%d}}-${{run_id:}}"
    command = [sys.executable, "-m", "repro.train", *tiny("trainer.max_steps=1"), pattern]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    processes = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    for process in processes:
        assert process.wait(timeout=120) == 0, process.stderr.read()
    folders = [p for p in tmp_path.iterdir() if (p / "summary.json").exists()]
    assert len(folders) == 2


# ---- the unit: the end-of-multirun callback (fast, in-process) -----------------------------


def test_the_multirun_callback_writes_prints_and_counts_the_failed_jobs(tmp_path, capsys, caplog):
    from omegaconf import OmegaConf

    from repro.core.sweeps.callback import SweepReport
    from test_sweep_statistics import fake_job

    for seed in range(2):
        fake_job(tmp_path, seed, ["amp=off", f"seed.value={seed}"], seed, best_val_acc=0.5 + seed)
    fake_job(tmp_path, 2, ["amp=off", "seed.value=2"], 2)
    (tmp_path / "2" / "summary.json").unlink()
    (tmp_path / "2" / "error.txt").write_text("ConfigError: ...\n")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "logger": {}})
    SweepReport.failed_jobs = 0
    try:
        with caplog.at_level("WARNING", logger="repro.core.sweeps.callback"):
            SweepReport(metrics=["best_val_acc"]).on_multirun_end(config)
        assert SweepReport.failed_jobs == 1  # repro.train exits non-zero on it
    finally:
        SweepReport.failed_jobs = 0
    assert f"1 of 3 jobs failed; see {tmp_path}" in [r.getMessage() for r in caplog.records]
    expected = report.build(tmp_path, ["best_val_acc"])
    assert capsys.readouterr().out == render.markdown(expected) + "\n"
    written = json.loads((tmp_path / "sweep_summary.json").read_text())
    assert written["groups"]["all"]["best_val_acc"]["mean"] == 1.0  # the metric asked for
    for name in ("sweep_summary.csv", "sweep_summary.md", "sweep.png"):
        assert (tmp_path / name).stat().st_size > 0
    # A sweep folder with no jobs yet (all of them refused before starting): nothing written.
    empty = tmp_path / "empty"
    empty.mkdir()
    SweepReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(empty)}}}))
    assert list(empty.iterdir()) == [] and SweepReport.failed_jobs == 0


def test_the_multirun_callback_finishes_the_sweeps_mlflow_run_or_says_why_not(
    tmp_path, caplog, monkeypatch
):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from repro.core.sweeps.callback import SweepReport
    from repro.core.watch import trackers
    from test_sweep_statistics import fake_job

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = f"file:{tmp_path / 'mlruns'}"
    client = MlflowClient(tracking_uri=store)
    parent = client.create_run(client.create_experiment("repro"), run_name="sweep").info.run_id
    sweep = tmp_path / "sweep"
    for seed in range(2):
        fake_job(sweep, seed, ["amp=off", f"seed.value={seed}"], seed)
    (sweep / trackers.MlflowTracker.PARENT_FILE).write_text(parent + "\n")
    config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(sweep)}}, "logger": {"mlflow": {"tracking_uri": store}}}
    )
    SweepReport().on_multirun_end(config)
    assert client.get_run(parent).info.status == "FINISHED"
    assert "sweep_summary.json" in {item.path for item in client.list_artifacts(parent)}

    def unreachable(config, folder):
        raise ConnectionError("no answer from the tracking server")

    monkeypatch.setattr(trackers, "end_sweep", unreachable)
    (sweep / "sweep_summary.json").unlink()
    with caplog.at_level("WARNING", logger="repro.core.sweeps.callback"):
        SweepReport().on_multirun_end(config)  # the report is written all the same
    assert (sweep / "sweep_summary.json").is_file()
    said = [record.getMessage() for record in caplog.records]
    assert "the sweep's MLflow run was not finished: no answer from the tracking server" in said


# ---- the unit: a report rendered, word for word ---------------------------------------------


def small_report(sweep_dir, adaptive=None):
    """A report of three jobs (one ok per group, one pruned, one failed) built by hand."""
    group = {"count": 2, "mean": 0.5, "std": 0.125, "min": 0.25, "max": 0.75,
             "ci_low": 0.125, "ci_high": 0.875}  # fmt: skip
    jobs = [
        report.Job("0", ["amp=off", "seed=0"], {"seed": 0, "val_acc": 0.75, "test_acc": 0.625,
                   "weights_sha256": "f" * 64}, None, group="amp=off"),
        report.Job("1", ["amp=bf16", "seed=0"], {"seed": 0, "val_acc": 0.5, "pruned": True,
                   "step": 7}, None, group="amp=bf16"),
        report.Job("2", ["amp=bf16", "seed=1"], None, "=cmd|boom", group="amp=bf16"),
    ]  # fmt: skip
    difference = {"difference": -0.25, "ci_low": -0.5, "ci_high": 0.0, "test": "paired: 2 shared seeds",
                  "verdict": "no difference shown", "welch": {"ci_low": -0.75, "ci_high": 0.25}}  # fmt: skip
    comparisons = [{"a": "amp=off", "b": "amp=bf16", "val_acc": difference}]
    return report.Report(sweep_dir, jobs, {"amp=off": {"val_acc": group}}, comparisons,
                         ["val_acc", "test_acc"], adaptive)  # fmt: skip


def test_the_markdown_report_is_exactly_its_tables(tmp_path):
    looks = [{"seeds": 2, "difference": 0.015, "ci_low": -0.01, "ci_high": 0.04},
             {"seeds": 4, "difference": 0.02, "ci_low": 0.005, "ci_high": None}]  # fmt: skip
    adaptive = {"metric": "val_acc", "a": "amp=off", "b": "amp=bf16", "look_confidence": 0.975,
                "why": "resolved after 4 seeds", "looks": looks}  # fmt: skip
    assert render.markdown(small_report(tmp_path, adaptive)) == "\n".join([
        f"# Sweep report: {tmp_path}", "",
        "3 jobs, 1 finished, 1 failed, 1 pruned.", "",
        "## Adaptive seeds: val_acc of b = amp=bf16 vs a = amp=off", "",
        "resolved after 4 seeds", "",
        "| seeds | val_acc: b - a | 97.50% CI |", "|---|---|---|",
        "| 2 | 0.0150 | [-0.0100, 0.0400] |", "| 4 | 0.0200 | [0.0050, n/a] |", "",
        "## Groups (95% confidence intervals, t distribution)", "",
        "| group | metric | n | mean | std | min | max | 95% CI |",
        "|---|---|---|---|---|---|---|---|",
        "| amp=off | val_acc | 2 | 0.5000 | 0.1250 | 0.2500 | 0.7500 | [0.1250, 0.8750] |", "",
        "## Differences (b - a, 95% CI: paired over shared seeds, else Welch)", "",
        "| a | b | metric | difference | 95% CI | test | Welch 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|",
        "| amp=off | amp=bf16 | val_acc | -0.2500 | [-0.5000, 0.0000] | paired: 2 shared seeds "
        "| [-0.7500, 0.2500] | no difference shown |", "",
        "## Jobs", "",
        "| job | group | seed | val_acc | test_acc | weights_sha256 | status |",
        "|---|---|---|---|---|---|---|",
        f"| 0 | amp=off | 0 | 0.7500 | 0.6250 | {'f' * 16} | ok |",
        "| 1 | amp=bf16 | 0 | 0.5000 | n/a |  | pruned at step 7 |",
        "| 2 | amp=bf16 |  | n/a | n/a |  | FAILED: =cmd\\|boom |",  # no extra column
    ]) + "\n"  # fmt: skip
    plain = small_report(tmp_path)
    plain.jobs, plain.comparisons = plain.jobs[:1], []
    text = render.markdown(plain)
    assert "1 jobs, 1 finished, 0 failed.\n" in text and "Differences" not in text
    assert "Adaptive" not in text


def test_the_summary_files_hold_each_job_and_no_cell_a_spreadsheet_would_run(tmp_path, monkeypatch):
    import csv

    drawn = []
    monkeypatch.setattr(render, "plot", lambda built, out: drawn.append(out))
    built = small_report(tmp_path)
    render.write(built)
    assert drawn == [tmp_path / "sweep.png"]
    saved = json.loads((tmp_path / "sweep_summary.json").read_text())
    assert saved["sweep_dir"] == str(tmp_path) and saved["adaptive"] is None
    assert saved["groups"]["amp=off"]["val_acc"]["mean"] == 0.5
    assert saved["comparisons"][0]["val_acc"]["test"] == "paired: 2 shared seeds"
    assert saved["jobs"][2] == {"job": "2", "group": "amp=bf16", "overrides": ["amp=bf16", "seed=1"],
                                "status": "failed", "error": "=cmd|boom", "seed": None,
                                "weights_sha256": None, "val_acc": None, "test_acc": None}  # fmt: skip
    assert saved["jobs"][1]["status"] == "pruned" and saved["jobs"][1]["val_acc"] == 0.5
    assert (tmp_path / "sweep_summary.json").read_text().startswith('{\n  "sweep_dir": ')
    text = (tmp_path / "sweep_summary.csv").read_bytes().decode()
    assert text.count("\r\n") == 4  # CSV's own line ends: a header and three jobs
    rows = list(csv.reader(text.splitlines()))
    assert rows[0] == ["job", "group", "overrides", "status", "error", "seed", "weights_sha256",
                       "val_acc", "test_acc"]  # fmt: skip
    assert rows[1] == ["0", "amp=off", "amp=off seed=0", "ok", "", "0", "f" * 64, "0.75", "0.625"]
    assert rows[3][4] == "'=cmd|boom" and rows[3][3] == "failed"  # not a formula
    assert (tmp_path / "sweep_summary.md").read_text() == render.markdown(built)


def test_the_plot_shows_each_finished_job_and_each_groups_mean_and_interval(tmp_path, monkeypatch):
    drawn = {}
    monkeypatch.setattr(
        render, "save_figure_atomic", lambda figure, out: drawn.update(f=figure, out=out)
    )
    built = small_report(tmp_path)
    built.jobs.append(
        report.Job("3", ["amp=off", "seed=1"], {"val_acc": 0.25}, None, group="amp=off")
    )
    built.groups["amp=bf16"] = {"val_acc": {"mean": 0.5, "ci_low": 0.25, "ci_high": 1.0}}
    built.groups["amp=off"]["val_acc"]["ci_low"] = float("nan")  # one job: no interval
    render.plot(built, tmp_path / "sweep.png")
    (axis,) = drawn["f"].axes
    assert drawn["out"] == tmp_path / "sweep.png"
    assert [label.get_text() for label in axis.get_xticklabels()] == ["amp=off", "amp=bf16"]
    assert axis.get_ylabel() == "val_acc"  # the plotted metric, by its name
    assert axis.get_title() == "val_acc per job; mean and 95% CI per group"
    points = [collection.get_offsets().tolist() for collection in axis.collections[:2]]
    assert points == [[[0, 0.75], [0, 0.25]], []]  # pruned and failed jobs are not drawn
    (bar,) = axis.containers  # amp=bf16's, the one group with an interval
    (line,) = bar.lines[0:1]
    assert line.get_xydata().tolist() == [[1.15, 0.5]]
    (segments,) = bar.lines[2]
    assert segments.get_segments()[0].tolist() == [[1.15, 0.25], [1.15, 1.0]]
    # How it looks: jobs as pale blue dots, each group's mean and interval in black, capped.
    from matplotlib.colors import to_rgba

    dots = axis.collections[0]
    assert dots.get_facecolor().tolist() == [list(to_rgba("tab:blue", 0.6))]
    assert (
        line.get_color() == "black" and line.get_marker() == "o" and line.get_linestyle() == "None"
    )
    assert segments.get_color().tolist() == [list(to_rgba("black"))]
    assert [cap.get_markersize() for cap in bar.lines[1]] == [8, 8]  # capsize 4: 2 x 4 wide
    labels = axis.get_xticklabels()
    assert {(label.get_rotation(), label.get_horizontalalignment()) for label in labels} == {
        (20.0, "right")
    }
    assert drawn["f"].get_size_inches().tolist() == [max(4, 1.6 * 2 + 2), 4]
    assert {gridline.get_alpha() for gridline in axis.get_xgridlines()} == {0.3}
