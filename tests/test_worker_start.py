"""What a DataLoader worker does first (repro.core.data.workers.start_worker), called in a forked
child of this process: it dies with the main process, it exits at once if that process died
before it could ask, and it is seeded from torch's seed for the worker."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import random
import signal
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from repro.core.data import workers

PR_GET_PDEATHSIG = 2  # linux/prctl.h

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")


def _in_a_child(body, *args) -> tuple[int, object]:
    """Run body(queue, *args) in a forked child; its exit code, with what it put in the queue."""
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    child = context.Process(target=body, args=(queue, *args))
    child.start()
    child.join(timeout=60)
    found = queue.get() if not queue.empty() else None
    return child.exitcode, found


def _start_and_report(queue, worker_id: int) -> None:
    torch.manual_seed(2**33 + 12345)  # what the DataLoader gives worker `worker_id`
    workers.start_worker(worker_id)
    death = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(death))
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)]
    queue.put((death.value, random.random(), float(np.random.rand()), handlers))


def test_a_worker_is_killed_with_its_main_process_and_seeded_from_torchs_seed():
    code, found = _in_a_child(_start_and_report, 3)
    assert code == 0
    death, python_draw, numpy_draw, handlers = found
    assert death == signal.SIGKILL
    seed = (2**33 + 12345) % 2**32
    assert python_draw == random.Random(seed).random()
    assert numpy_draw == np.random.RandomState(seed).rand()
    assert handlers == [signal.SIG_IGN, signal.SIG_DFL, signal.SIG_DFL]


def _orphaned(queue) -> None:
    # The main process died before the prctl: the worker's parent is now another process.
    os.getppid = lambda: -1  # type: ignore[assignment]
    workers.start_worker(0)
    queue.put("carried on")


def test_a_worker_whose_main_process_died_before_it_started_exits_at_once():
    assert _in_a_child(_orphaned) == (1, None)


def _in_the_main_process(queue) -> None:
    # Called where there is no parent process to watch (the main process itself): it seeds.
    multiprocessing.parent_process = lambda: None  # type: ignore[assignment]
    os.getppid = lambda: -1  # type: ignore[assignment]
    workers.start_worker(0)
    queue.put("carried on")


def test_without_a_parent_process_to_watch_it_carries_on():
    assert _in_a_child(_in_the_main_process) == (0, "carried on")


class Libc:
    """libc as start_worker loads it, its prctl recorded instead of made."""

    def __init__(self, calls: list, name: object, use_errno: bool) -> None:
        self.calls = calls
        calls.append(("load", name, use_errno))

    def prctl(self, option: int, value: int) -> None:
        self.calls.append(("prctl", option, value))


@pytest.fixture
def steps(monkeypatch) -> list:
    """start_worker's steps, recorded in this process (its effects are the forked tests')."""
    calls: list = []
    monkeypatch.setattr(
        workers.ctypes, "CDLL", lambda name, use_errno: Libc(calls, name, use_errno)
    )
    monkeypatch.setattr(workers, "seed_worker", lambda worker_id: calls.append(("seed", worker_id)))
    monkeypatch.setattr(workers.multiprocessing, "parent_process", lambda: SimpleNamespace(pid=42))
    monkeypatch.setattr(workers.os, "getppid", lambda: 42)

    def exit_now(code: int) -> None:
        calls.append(("exit", code))
        raise SystemExit(code)

    monkeypatch.setattr(workers.os, "_exit", exit_now)
    return calls


def test_a_worker_asks_to_die_with_its_parent_then_is_seeded(steps):
    workers.start_worker(7)
    assert steps == [("load", None, True), ("prctl", 1, signal.SIGKILL), ("seed", 7)]


def test_an_orphaned_worker_exits_before_it_is_seeded(steps, monkeypatch):
    monkeypatch.setattr(workers.os, "getppid", lambda: 1)
    with pytest.raises(SystemExit):
        workers.start_worker(7)
    assert steps == [("load", None, True), ("prctl", 1, signal.SIGKILL), ("exit", 1)]


def test_in_the_main_process_or_off_linux_a_worker_is_only_seeded(steps, monkeypatch):
    monkeypatch.setattr(workers.multiprocessing, "parent_process", lambda: None)
    monkeypatch.setattr(workers.os, "getppid", lambda: 1)
    workers.start_worker(2)
    assert steps[-1] == ("seed", 2) and ("exit", 1) not in steps
    steps.clear()
    monkeypatch.setattr(workers.sys, "platform", "darwin")
    workers.start_worker(3)
    assert steps == [("seed", 3)]
