"""Where an evaluation's row goes (repro.core.watch.loggers), in-process: metrics.csv across
resumes, the log line, TensorBoard and trackers, and curves.png from the file."""

from __future__ import annotations

import logging
import math

import pytest

from repro.core.errors import StorageError
from repro.core.guards import received
from repro.core.watch import loggers
from repro.core.watch.loggers import STEP_LOSS, MetricsLog

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
    with caplog.at_level(logging.INFO, logger=loggers.__name__):
        (tmp_path / "plain").mkdir()
        (tmp_path / "two").mkdir()
        MetricsLog(tmp_path / "plain", tensorboard=False).row(ROW)  # no other column
        MetricsLog(tmp_path / "two", tensorboard=False).row({**ROW, "a_top5": 0.5, "b": 2.0})
    assert caplog.messages[2].endswith("12.5% waiting for data")
    assert caplog.messages[3].endswith("waiting for data | a_top5 0.5 b 2")


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


def test_a_row_is_appended_and_the_file_rewritten_only_when_a_column_joins(tmp_path, monkeypatch):
    rewritten = []
    real = loggers.write_text_atomic
    monkeypatch.setattr(
        loggers, "write_text_atomic", lambda path, text: rewritten.append(path) or real(path, text)
    )
    MetricsLog(tmp_path, tensorboard=False).row(ROW)
    resumed = MetricsLog(tmp_path, tensorboard=False)
    resumed.row({**ROW, "step": 8})
    assert rewritten == []
    resumed.row({**ROW, "step": 12, "ema_acc": 0.5})
    assert rewritten == [tmp_path / "metrics.csv"]


def test_a_disk_that_refuses_a_row_is_one_error_naming_metrics_csv(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loggers, "open_in_place", full)
    with pytest.raises(StorageError) as refused:
        MetricsLog(tmp_path, tensorboard=False).row(ROW)
    assert str(refused.value).startswith(f"cannot write {tmp_path / 'metrics.csv'}: ")


def test_metrics_csv_is_read_as_a_table_not_a_record(tmp_path, monkeypatch):
    """A long run's file is far larger than a record may be (8 MiB): it is read as a table."""
    monkeypatch.setitem(received.SIZE_LIMITS, "record", 16)
    metrics = MetricsLog(tmp_path, tensorboard=False)
    metrics.row(ROW)
    assert loggers.read_rows(tmp_path / "metrics.csv")[0]["step"] == 4
    assert MetricsLog(tmp_path, tensorboard=False)._header() == list(ROW)
    metrics.row({**ROW, "step": 8, "extra": 1.0})  # read whole, to add the column
    metrics.truncate_after(4)
    assert [row["step"] for row in loggers.read_rows(tmp_path / "metrics.csv")] == [4.0]


def test_a_column_name_holding_a_line_break_reads_back_as_written(tmp_path):
    """csv quotes such a name; the file is read without newline translation, as csv asks."""
    metrics = MetricsLog(tmp_path, tensorboard=False)
    odd = "val_a\r\nb"
    metrics.row({**ROW, odd: 0.5})
    assert MetricsLog(tmp_path, tensorboard=False)._header() == [*ROW, odd]
    metrics.row({**ROW, "step": 8, odd: 0.25, "joined": 1.0})
    assert MetricsLog(tmp_path, tensorboard=False)._header() == [*ROW, odd, "joined"]
    metrics.truncate_after(8)
    assert loggers.read_rows(tmp_path / "metrics.csv")[1][odd] == 0.25


def test_the_curves_plot_each_loss_and_the_accuracy_against_step(tmp_path, monkeypatch):
    import matplotlib
    import matplotlib.pyplot as plt

    drawn = []
    monkeypatch.setattr(loggers, "save_figure_atomic", lambda *given: drawn.append(given))
    both = "step,train_loss,val_loss,val_acc\n1,2.5,2.25,0.125\n2,2.0,1.5,0.25\n"
    (tmp_path / "metrics.csv").write_text(both)
    loggers.plot_curves(tmp_path / "metrics.csv", tmp_path / "curves.png")
    ((figure, out),) = drawn
    assert out == tmp_path / "curves.png" and matplotlib.get_backend().lower() == "agg"
    assert list(figure.get_size_inches()) == [10, 4]
    loss, accuracy = figure.axes
    assert loss.get_position().x1 < accuracy.get_position().x0  # side by side

    def lines(axis):
        return [
            (line.get_label(), list(line.get_xdata()), list(line.get_ydata()), line.get_marker())
            for line in axis.get_lines()
        ]

    assert lines(loss) == [
        ("train", [1, 2], [2.5, 2.0], "o"),
        ("validation", [1, 2], [2.25, 1.5], "o"),
    ]
    assert (loss.get_xlabel(), loss.get_ylabel(), loss.get_title()) == ("step", "loss", "loss")
    assert [text.get_text() for text in loss.get_legend().get_texts()] == ["train", "validation"]
    ((_, steps, values, marker),) = lines(accuracy)
    assert (steps, values, marker) == ([1, 2], [0.125, 0.25], "o")
    assert accuracy.get_lines()[0].get_color() == "tab:green"
    titled = (accuracy.get_xlabel(), accuracy.get_ylabel(), accuracy.get_title())
    assert titled == ("step", "accuracy", "validation accuracy")
    assert accuracy.get_ylim() == (0, 1)
    for axis in figure.axes:
        grid = axis.get_xgridlines()[0]
        assert grid.get_visible() and grid.get_alpha() == 0.3
    (tmp_path / "metrics.csv").write_text("step,train_loss\n1,2.5\n2,2.0\n")
    loggers.plot_curves(tmp_path / "metrics.csv", tmp_path / "curves.png")
    loss, accuracy = drawn[1][0].axes
    assert [line.get_label() for line in loss.get_lines()] == ["train"]
    assert accuracy.get_lines() == []
    (tmp_path / "metrics.csv").write_text("step,train_loss,val_loss\n1,2.5,\n2,2.0,1.5\n")
    loggers.plot_curves(tmp_path / "metrics.csv", tmp_path / "curves.png")
    (_, validation) = drawn[2][0].axes[0].get_lines()
    gap, value = validation.get_ydata()
    assert math.isnan(gap) and value == 1.5  # a gap where the row lacks it
    plt.close("all")


def test_a_figure_is_saved_at_100_dpi_and_only_it_is_closed(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt

    plt.close("all")
    saved, current = plt.figure(figsize=(3, 2), dpi=50), plt.figure()
    try:
        with matplotlib.rc_context({"savefig.dpi": 50}):  # neither the figure's nor the default
            loggers.save_figure_atomic(saved, tmp_path / "f.png")
        png = (tmp_path / "f.png").read_bytes()
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (300, 200)
        assert plt.get_fignums() == [current.number]
    finally:
        plt.close("all")


def test_an_empty_file_left_by_a_kill_gets_its_header_with_the_first_row(tmp_path):
    (tmp_path / "metrics.csv").write_text("")
    MetricsLog(tmp_path, tensorboard=False).row(ROW)
    assert loggers.read_rows(tmp_path / "metrics.csv") == [{k: float(v) for k, v in ROW.items()}]
