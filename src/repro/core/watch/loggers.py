"""Where metrics go: metrics.csv and the run's log always, TensorBoard when enabled,
experiment trackers (MLflow, W&B) when configured, curves.png at the end."""

from __future__ import annotations

import csv
import io
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.core.files import atomic_path, complete_lines, open_in_place, write_text_atomic, writing
from repro.core.guards import received
from repro.core.runs.fingerprint_log import FingerprintLog

# Columns the log line shows in its own format; any other (an objective's term, the weight
# average's results) follows them as `name value`.
PER_LABEL = re.compile(r"_(ap|f1)_")  # a multi-label objective's column per label
LOGGED = {"epoch", "step", "train_loss", "val_loss", "val_acc", "lr", "images_per_s"}
LOGGED |= {"data_wait_frac", "train_s"}
STEP_LOSS = "train_loss_step"  # every step's training loss, for TensorBoard and the trackers

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one row per evaluation to metrics.csv (kept across resumes), the log, TensorBoard
    and the trackers. The columns are the first row's keys (or, resumed, the file's own)."""

    def __init__(self, run_dir: Path, tensorboard: bool, trackers: Sequence[Any] = ()) -> None:
        self.path = run_dir / "metrics.csv"
        self.columns: list[str] | None = None  # known at the first row
        self.trackers = list(trackers)  # watch/trackers.py
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        text = received.read_text(self.path, "table", root=self.path.parent)
        reader = csv.DictReader(io.StringIO(complete_lines(text), newline=""))
        return list(reader.fieldnames or []), list(reader)  # the header is read first

    def _rewrite(self, columns: list[str], rows: list[dict[str, str]]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, columns)
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(self.path, text.getvalue())

    def truncate_after(self, step: int) -> None:
        """On resume, drop rows written after the checkpoint we resume from (the file keeps
        its own columns)."""
        if not self.path.exists():
            return
        columns, rows = self._read()
        if not columns:  # a file torn before its header was whole
            self.path.unlink()
            return
        self._rewrite(columns, [row for row in rows if int(row["step"]) <= step])

    def row(self, values: dict[str, float]) -> None:
        new = not self.path.exists()
        if self.columns is None:
            self.columns = list(values) if new else self._header()
        added = [key for key in values if key not in self.columns]
        if added and not new:  # a callback added on resume: its columns join, earlier rows blank
            columns, rows = self._read()
            self.columns = [*columns, *added]
            self._rewrite(self.columns, rows)
        with writing(self.path), open_in_place(self.path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, self.columns)
            if new:
                writer.writeheader()
            writer.writerow(values)  # a key the header lacks is an error, not a lost value
        if self.writer is not None:
            for key in self.columns[2:]:
                if key in values:  # a callback dropped on resume leaves its column blank
                    self.writer.add_scalar(key, values[key], values["step"])
            self.writer.flush()
        for tracker in self.trackers:
            tracker.metrics(values, values["step"])
        # Per-label figures (`val_ap_cat` ...) are metrics.csv's, too many for a line.
        others = " ".join(
            f"{key} {value:.4g}"
            for key, value in values.items()
            if key not in LOGGED and not PER_LABEL.search(key)
        )
        validation = "".join(
            f" {key} {values[key]:.4f}" for key in ("val_loss", "val_acc") if key in values
        )
        log.info(
            "epoch %d step %d | train_loss %.4f%s | lr %.4g | "
            "%.0f img/s, %.1f%% waiting for data%s",
            values["epoch"],
            values["step"],
            values["train_loss"],
            validation,
            values["lr"],
            values["images_per_s"],
            100 * values["data_wait_frac"],
            f" | {others}" if others else "",
        )

    def losses(self, first_step: int, values: list[float]) -> None:
        """The training loss of steps `first_step`, `first_step + 1`, ... (a flush of the
        per-step losses): one call to each tracker."""
        if self.writer is not None:
            for offset, value in enumerate(values):
                self.writer.add_scalar(STEP_LOSS, value, first_step + offset)
        for tracker in self.trackers:
            tracker.losses(first_step, values)

    def _header(self) -> list[str]:
        """The columns of the metrics.csv a resumed run goes on writing."""
        with received.opened(self.path, "table", root=self.path.parent) as handle:
            return next(csv.reader(io.TextIOWrapper(handle, newline="")), [])

    def finish(self, summary: dict[str, Any]) -> None:
        """The run's end: its summary and records to the trackers."""
        for tracker in self.trackers:
            tracker.finish(summary)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_rows(path: Path) -> list[dict[str, float]]:
    """metrics.csv's rows as numbers; a blank cell (a column that joined on resume, in the
    rows before it) is left out of its row."""
    text = received.read_text(path, "table", root=path.parent)
    rows = csv.DictReader(io.StringIO(text))
    return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in rows]


def plot_curves(metrics_csv: Path, out: Path) -> None:
    """Loss and accuracy against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(metrics_csv)
    steps = [r["step"] for r in rows]

    def column(name: str) -> list[float]:
        return [r.get(name, math.nan) for r in rows]  # a gap where a row lacks it

    figure, (loss_axis, acc_axis) = plt.subplots(1, 2, figsize=(10, 4))
    loss_axis.plot(steps, column("train_loss"), marker="o", label="train")
    if any("val_loss" in r for r in rows):  # none without a validation split
        loss_axis.plot(steps, column("val_loss"), marker="o", label="validation")
    loss_axis.set(xlabel="step", ylabel="loss", title="loss")
    loss_axis.legend()
    if any("val_acc" in r for r in rows):
        acc_axis.plot(steps, column("val_acc"), marker="o", color="tab:green")
    acc_axis.set(xlabel="step", ylabel="accuracy", title="validation accuracy", ylim=(0, 1))
    for axis in (loss_axis, acc_axis):
        axis.grid(alpha=0.3)
    save_figure_atomic(figure, out)


def save_figure_atomic(figure: Any, out: Path) -> None:
    """Write a matplotlib figure as PNG (through a temporary file and a rename), then close it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    with atomic_path(out) as tmp:
        figure.savefig(tmp, dpi=100, format="png")
    plt.close(figure)


def truncate_logs(run_dir: Path, step: int) -> None:
    """Drop log rows written after the checkpoint, so the logs read as one straight run."""
    MetricsLog(run_dir, tensorboard=False).truncate_after(step)
    FingerprintLog.of_run(run_dir).truncate_after(step)
