"""repro.train's own steps, in this process: what summary.json holds and where each field comes
from, the attempt's line in the run history, a halted run and its resume, a rerun with nothing
to do, and the small helpers (the attempt's result, the scores line, the value a sweeper
optimises, a refusing file system told as a user's error)."""

from __future__ import annotations

import csv
import errno
import json
import time

import pytest
import torch
import yaml

from repro import build, train
from repro.errors import StorageError, UserError
from repro.runtime import determinism, distributed, environment
from repro.sweeps import ERROR_FILE

from conftest import compose_config, tiny, train_in_process

STEPS = 6  # 384 training images in batches of 64, one epoch


class Said:
    """repro.train's logger as the run calls it: each line kept, whatever logging's setup."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: object) -> None:
        self.lines.append(message % args)

    error = info


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One tiny run from start to end: its folder, summary, what it logged and how long the
    call took."""
    run_dir = tmp_path_factory.mktemp("straight")
    said = Said()
    started = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "log", said)
        summary = train_in_process(run_dir, *tiny())
    return run_dir, summary, said.lines, time.perf_counter() - started


def _attempts(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]


def test_the_summary_says_how_the_run_got_there(straight):
    run_dir, summary, _, took = straight
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert summary["step"] == summary["total_steps"] == STEPS
    assert summary["completed"] is True and summary["resumed_from_step"] is None
    assert summary["stopped_early"] is False and summary["stop_reason"] is None
    assert summary["stopped_by_signal"] is None and summary["init_weights"] is None
    assert summary["seed"] == 0 and summary["world_size"] == 1
    assert summary["amp"] == "off" and summary["amp_emulated"] is False
    assert summary["memory_format"] == "channels_last" and summary["pin_memory"] is False
    assert 0 < summary["train_s"] < summary["wall_s"] < took
    model = build.model(compose_config(*tiny()), root_seed=0, num_classes=10)
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())
    with (run_dir / "metrics.csv").open() as handle:
        evaluations = [row for row in csv.DictReader(handle) if row.get("val_acc")]
    best = max(evaluations, key=lambda row: float(row["val_acc"]))
    assert summary["best_val_acc"] == float(best["val_acc"])
    assert summary["best_step"] == int(best["step"])
    assert summary["val_acc"] == float(evaluations[-1]["val_acc"])
    assert summary["flags"] == json.loads(json.dumps(determinism.snapshot()))
    assert summary["env"] == json.loads(json.dumps(environment.describe(torch.device("cpu"))))
    assert summary["normalisation"]["mean"] == [0.5, 0.5, 0.5]
    splits = summary["data"]["splits"]
    assert [splits[name]["images"] for name in ("train", "val", "test")] == [384, 128, 128]
    assert len(summary["weights_sha256"]) == 64 and "test_acc" in summary


def test_the_run_records_its_config_its_attempt_and_what_it_trains(straight):
    run_dir, summary, said, _ = straight
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    assert resolved["seed"]["value"] == 0 and resolved["trainer"]["monitor"] == "val_acc"
    (attempt,) = _attempts(run_dir)
    assert (attempt["start_step"], attempt["end_step"]) == (0, STEPS)
    assert attempt["result"] == "completed" and attempt["env"] == summary["env"]
    described = (
        f"training SmallCNN (0.00M parameters) on cpu | 384 train / 128 val images | {STEPS} "
        "steps | seed 0 | amp off | channels_last"
    )
    assert said == [described]


def test_a_rerun_of_a_finished_run_has_nothing_to_do_and_writes_nothing(straight):
    run_dir, summary, _, _ = straight
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    again = train_in_process(run_dir, *tiny())
    assert again == {**summary, "already_complete": True}
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


def test_a_halted_run_resumes_to_the_straight_runs_weights(straight, tmp_path):
    halted = train_in_process(tmp_path, *tiny("trainer.halt_at_step=3"))
    assert halted["step"] == 3 and halted["completed"] is False
    assert _attempts(tmp_path)[-1]["result"] == "halted"
    resumed = train_in_process(tmp_path, *tiny())
    assert resumed["resumed_from_step"] == 3 and resumed["step"] == STEPS
    assert resumed["weights_sha256"] == straight[1]["weights_sha256"]
    first, second = _attempts(tmp_path)
    assert (first["end_step"], second["start_step"], second["end_step"]) == (3, 3, STEPS)
    assert second["result"] == "completed"


def test_a_failing_run_closes_its_attempt_with_the_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the model would not build")

    monkeypatch.setattr(train.assembly, "trainer", broken)
    with pytest.raises(RuntimeError, match="would not build"):
        train_in_process(tmp_path, *tiny())
    (attempt,) = _attempts(tmp_path)
    assert attempt["result"] == "failed: the model would not build"
    assert attempt["end_step"] == 0 and not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    "fields, result",
    [
        (
            {"stopped_by_signal": 15, "stop_reason": "patience", "completed": True},
            "stopped by signal 15",
        ),
        (
            {"stopped_by_signal": None, "stop_reason": "patience", "completed": True},
            "completed, stopped early: patience",
        ),
        ({"stopped_by_signal": None, "stop_reason": None, "completed": True}, "completed"),
        ({"stopped_by_signal": None, "stop_reason": None, "completed": False}, "halted"),
    ],
)
def test_an_attempts_result_reads_from_its_summary(fields, result):
    assert train._result(fields) == result


@pytest.mark.parametrize(
    "summary, line, swept",
    [
        (
            {"val_acc": 0.5, "val_loss": 1.25, "test_acc": 0.75},
            "val_acc 0.5000 val_loss 1.2500",
            0.5,
        ),
        ({"test_acc": 0.25, "test_loss": 2.0}, "test_acc 0.2500 test_loss 2.0000", 0.25),
        ({"val_acc": 0.125}, "val_acc 0.1250", 0.125),
        ({}, "no evaluation", None),
    ],
)
def test_the_scores_line_and_the_swept_value_prefer_validation_to_test(summary, line, swept):
    assert train._scores(summary) == line
    assert train._swept_value(summary) == swept


def test_a_refusing_file_system_is_a_users_error_saying_the_run_resumes(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.csv"))
    told = train._as_user_error(full, tmp_path)
    assert isinstance(told, UserError) and str(tmp_path / "metrics.csv") in str(told)
    assert "No space left on device" in str(told)
    assert str(told).endswith(
        "; the files written before are intact: free space (or fix the file system), then run "
        "the same command to resume"
    )
    nameless = train._as_user_error(OSError(errno.EROFS, "Read-only file system"), tmp_path)
    assert isinstance(nameless, UserError) and str(tmp_path) in str(nameless)
    refused = StorageError(tmp_path / "summary.json", full, doing="write")
    assert str(train._as_user_error(refused, tmp_path)).startswith(str(refused) + "; ")
    bug = ValueError("a bug")
    assert train._as_user_error(bug, tmp_path) is bug


def test_a_failed_jobs_error_is_noted_for_the_sweep_report_unless_the_disk_refuses(
    tmp_path, monkeypatch
):
    train._note_failure(tmp_path, ValueError("bad value"))
    assert (tmp_path / ERROR_FILE).read_text() == "ValueError: bad value\n"

    def refuse(path, text):
        raise StorageError(path, OSError(errno.ENOSPC, "No space left on device"), doing="write")

    monkeypatch.setattr(train, "write_text_atomic", refuse)
    said = Said()
    monkeypatch.setattr(train, "log", said)
    train._note_failure(tmp_path / "full", KeyError("k"))
    (line,) = said.lines
    assert line.endswith(": the sweep report will not see why this job failed")
    assert str(tmp_path / "full" / ERROR_FILE) in line


def test_the_seed_is_the_checkpoints_when_resuming_else_the_configs_or_one_drawn():
    alone = distributed.Context(rank=0, world=1, local_rank=0)
    fixed = compose_config("seed=7")
    assert train._root_seed(fixed, None, alone) == 7
    assert train._root_seed(fixed, {"root_seed": 7}, alone) == 7
    drawn = compose_config("seed=random")
    assert train._root_seed(drawn, {"root_seed": "12"}, alone) == 12
    seeds = {train._root_seed(drawn, None, alone) for _ in range(3)}
    assert len(seeds) == 3 and all(isinstance(seed, int) and seed >= 0 for seed in seeds)
