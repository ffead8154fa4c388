"""The progress bar (repro.core.runtime.progress): where it is drawn, what it counts, and that a bar
not drawn costs the loop nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import rich
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

from repro.core.runtime.progress import TrainingBar, progress_bar


class Stdout:
    def __init__(self, terminal: bool) -> None:
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_on_draws_as_on_a_terminal_wherever_stdout_goes(monkeypatch):
    monkeypatch.setattr("sys.stdout", Stdout(terminal=False))
    bar = progress_bar("on")
    assert not bar.disable and bar.console.is_terminal and bar.live.transient
    kinds = [type(column) for column in bar.columns]
    assert kinds == [TextColumn, BarColumn, MofNCompleteColumn, TimeRemainingColumn]
    assert bar.columns[0].text_format == "[bold]{task.description}"


@pytest.mark.parametrize("terminal", [True, False])
def test_auto_draws_on_a_terminal_only_and_off_never(monkeypatch, terminal):
    monkeypatch.setattr("sys.stdout", Stdout(terminal))
    auto = progress_bar("auto")
    assert auto.disable is not terminal and auto.console is rich.get_console()
    assert progress_bar("off").disable is True


def _loop(step: int, total: int) -> SimpleNamespace:
    return SimpleNamespace(
        state=SimpleNamespace(position=SimpleNamespace(step=step)), total_steps=total
    )


def test_the_training_bar_starts_at_the_resumed_step_and_ticks_once_a_step(monkeypatch):
    monkeypatch.setattr("sys.stdout", Stdout(terminal=False))
    with TrainingBar("on") as training:
        training.at_start(_loop(step=3, total=10))
        task = training.bar.tasks[0]
        assert (task.description, task.total, task.completed) == ("train", 10, 3)
        training.after_step(None)
        training.after_step(None)
        assert training.bar.tasks[0].completed == 5
        assert training.bar.live.is_started
    assert not training.bar.live.is_started


def test_a_bar_not_drawn_is_not_advanced():
    with TrainingBar("off") as training:
        training.at_start(_loop(step=0, total=4))
        training.after_step(None)
        assert training.bar.tasks[0].completed == 0
