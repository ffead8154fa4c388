"""Where an evaluation's row goes (repro.watch.loggers), in-process: metrics.csv across
resumes, the log line, TensorBoard and trackers, and curves.png from the file."""

from __future__ import annotations

import logging

import pytest

from repro.watch import loggers
from repro.watch.loggers import STEP_LOSS, MetricsLog

ROW = {
    "epoch": 0,
    "step": 4,
    "train_loss": 1.25,
    "val_loss": 0.875,
    "val_acc": 0.5,
    "lr": 0.1,
    "images_per_s": 1234.4,
    "data_wait_frac": 0.125,
}


class Recorder:
    """A tracker, or a TensorBoard writer: what it was given, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_rows_go_under_the_first_rows_columns(tmp_path):
    metrics = MetricsLog(tmp_path, tensorboard=False)
    metrics.row(ROW)
    metrics.row({**ROW, "step": 8, "val_acc": 0.75})
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines == [
        "epoch,step,train_loss,val_loss,val_acc,lr,images_per_s,data_wait_frac",
        "0,4,1.25,0.875,0.5,0.1,1234.4,0.125",
        "0,8,1.25,0.875,0.75,0.1,1234.4,0.125",
    ]


def test_a_resumed_run_writes_under_the_files_columns_and_adds_new_ones_blank_before(tmp_path):
    MetricsLog(tmp_path, tensorboard=False).row(ROW)
    resumed = MetricsLog(tmp_path, tensorboard=False)
    reordered = {key: ROW[key] for key in reversed(ROW)}
    resumed.row({**reordered, "step": 8})
    resumed.row({**ROW, "step": 12, "ema_val_acc": 0.625})
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0].endswith("data_wait_frac,ema_val_acc")
    assert lines[1] == "0,4,1.25,0.875,0.5,0.1,1234.4,0.125,"
    assert lines[2] == "0,8,1.25,0.875,0.5,0.1,1234.4,0.125,"
    assert lines[3] == "0,12,1.25,0.875,0.5,0.1,1234.4,0.125,0.625"


def test_a_resume_drops_the_rows_after_its_checkpoint_keeping_the_columns(tmp_path):
    metrics = MetricsLog(tmp_path, tensorboard=False)
    for step in (4, 8, 12):
        metrics.row({**ROW, "step": step})
    metrics.truncate_after(8)
    steps = [line.split(",")[1] for line in (tmp_path / "metrics.csv").read_text().splitlines()]
    assert steps == ["step", "4", "8"]
    metrics.truncate_after(0)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [",".join(ROW)]


def test_a_torn_file_is_cut_to_whole_rows_or_dropped_without_a_header(tmp_path):
    path = tmp_path / "metrics.csv"
    MetricsLog(tmp_path, tensorboard=False).truncate_after(5)  # no file: nothing to do
    assert not path.exists()
    path.write_text("epoch,st")
    MetricsLog(tmp_path, tensorboard=False).truncate_after(5)
    assert not path.exists()
    path.write_text(",".join(ROW) + "\n0,4,1,1,1,1,1,1\n0,9,1,1")
    MetricsLog(tmp_path, tensorboard=False).truncate_after(9)
    assert path.read_text().splitlines()[1:] == ["0,4,1,1,1,1,1,1"]


def test_each_row_reaches_tensorboard_and_the_trackers(tmp_path):
    tracker, board = Recorder(), Recorder()
    metrics = MetricsLog(tmp_path, tensorboard=False, trackers=[tracker])
    metrics.writer = board
    metrics.row(ROW)
    scalars = [call for call in board.calls if call[0] == "add_scalar"]
    assert scalars == [("add_scalar", key, ROW[key], 4) for key in list(ROW)[2:]]
    assert board.calls[-1] == ("flush",)
    assert tracker.calls == [("metrics", ROW, 4)]
    metrics.losses(5, [0.5, 0.25])
    assert board.calls[-2:] == [
        ("add_scalar", STEP_LOSS, 0.5, 5),
        ("add_scalar", STEP_LOSS, 0.25, 6),
    ]
    assert tracker.calls[-1] == ("losses", 5, [0.5, 0.25])
    metrics.finish({"val_acc": 0.5})
    assert tracker.calls[-1] == ("finish", {"val_acc": 0.5})
    metrics.close()
    assert board.calls[-1] == ("close",)


def test_a_column_a_resumed_run_no_longer_fills_is_left_out_of_tensorboard(tmp_path):
    MetricsLog(tmp_path, tensorboard=False).row({**ROW, "ema_val_acc": 0.5})
    board = Recorder()
    resumed = MetricsLog(tmp_path, tensorboard=False)
    resumed.writer = board
    resumed.row({**ROW, "step": 8})
    assert "ema_val_acc" not in [call[1] for call in board.calls if call[0] == "add_scalar"]


def test_tensorboard_writes_under_the_run_folder(tmp_path):
    metrics = MetricsLog(tmp_path, tensorboard=True)
    metrics.row(ROW)
    metrics.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_the_log_line_shows_the_run_then_every_other_column_but_per_label_ones(tmp_path, caplog):
    metrics = MetricsLog(tmp_path, tensorboard=False)
    extra = {"ema_val_acc": 0.61234, "val_ap_cat": 0.9, "val_f1_dog": 0.8, "train_s": 3.0}
    with caplog.at_level(logging.INFO, logger=loggers.__name__):
        metrics.row({**ROW, **extra})
        without_validation = {k: v for k, v in ROW.items() if k not in ("val_loss", "val_acc")}
        metrics.row({**without_validation, **dict.fromkeys(extra, 1.0), "step": 8})
    assert caplog.messages[0] == (
        "epoch 0 step 4 | train_loss 1.2500 val_loss 0.8750 val_acc 0.5000 | lr 0.1 | "
        "1234 img/s, 12.5% waiting for data | ema_val_acc 0.6123"
    )
    assert caplog.messages[1].startswith("epoch 0 step 8 | train_loss 1.2500 | lr 0.1 |")


def test_rows_read_back_as_numbers_without_their_blank_cells(tmp_path):
    (tmp_path / "metrics.csv").write_text("step,train_loss,ema\n1,0.5,\n2,0.25,0.75\n")
    assert loggers.read_rows(tmp_path / "metrics.csv") == [
        {"step": 1.0, "train_loss": 0.5},
        {"step": 2.0, "train_loss": 0.25, "ema": 0.75},
    ]


@pytest.mark.parametrize(
    "text",
    [
        "step,train_loss,val_loss,val_acc\n1,0.5,0.6,0.3\n2,0.25,0.4,0.5\n",
        "step,train_loss\n1,0.5\n2,0.25\n",  # no validation split
        "step,train_loss,val_loss,val_acc\n1,0.5,,\n2,0.25,0.4,0.5\n",  # a blank row's cells
    ],
)
def test_the_curves_are_drawn_from_the_file_whatever_it_holds(tmp_path, text):
    import matplotlib.pyplot as plt

    (tmp_path / "metrics.csv").write_text(text)
    loggers.plot_curves(tmp_path / "metrics.csv", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == [], "the figure is closed"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["curves.png", "metrics.csv"]
