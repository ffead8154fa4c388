"""The test kit's forked runs (repro.extras.testkit.runs): a fork that fails stops its siblings and
reports its own error; a stuck one is stopped at the limit. Neither leaves the test waiting."""

from __future__ import annotations

import os
import time

import pytest

from repro.extras.testkit import runs


def broken() -> None:
    raise ValueError("broken on purpose")


def test_a_fork_that_fails_stops_its_sibling_and_raises_its_own_error(tmp_path):
    sleeper = runs.forked(lambda: time.sleep(120), {}, tmp_path / "a.failed", tmp_path)
    failing = runs.forked(broken, {}, tmp_path / "b.failed", tmp_path)
    started = time.monotonic()
    with pytest.raises(runs.RunFailedError, match=r"^ValueError: broken on purpose \(at "):
        runs.waited([(sleeper, tmp_path / "a.failed"), (failing, tmp_path / "b.failed")])
    assert time.monotonic() - started < 60  # not the sibling's 120 s
    with pytest.raises(ChildProcessError):  # reaped: nothing left running
        os.waitpid(sleeper, os.WNOHANG)


def test_a_stuck_fork_is_stopped_at_the_limit_and_a_finished_one_gives_its_status(tmp_path):
    stuck = runs.forked(lambda: time.sleep(120), {}, tmp_path / "a.failed", tmp_path)
    with pytest.raises(runs.RunFailedError, match="did not finish within 1 s"):
        runs.waited([(stuck, tmp_path / "a.failed")], limit=1)
    done = runs.forked(lambda: None, {}, tmp_path / "b.failed", tmp_path)
    assert runs.waited([(done, tmp_path / "b.failed")]) == [0]
