"""Where a run computes (repro.core.runtime.devices): the device a name gives, glibc's settings for
host memory, and pinned memory only where a GPU copies from it."""

from __future__ import annotations

import logging

import pytest
import torch

from repro.core.errors import ConfigError
from repro.core.runtime import devices


@pytest.mark.parametrize("cuda, expected", [(True, "cuda"), (False, "cpu")])
def test_auto_picks_cuda_where_it_is_visible(monkeypatch, cuda, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert devices.select_device("auto") == torch.device(expected)
    assert devices.select_device("cpu") == torch.device("cpu")


def test_asking_for_cuda_without_it_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as refused:
        devices.select_device("cuda")
    said = "trainer.device='cuda' is not allowed: no CUDA device is visible; use cpu or auto"
    assert str(refused.value) == said
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.select_device("cuda") == torch.device("cuda")


class Libc:
    """glibc's mallopt, recorded; each call answers from `answers`."""

    def __init__(self, answers: list[int]) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answers = answers

    def mallopt(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return self.answers[len(self.calls) - 1]


def test_freed_blocks_up_to_32_mib_stay_in_a_heap_trimmed_only_above_1_gib(monkeypatch):
    libc = Libc([1, 1])
    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: libc)
    assert devices.reuse_host_memory() is True
    assert libc.calls == [(-3, 32 * 2**20), (-1, 2**30)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    refused = Libc([0, 1])
    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: refused)
    assert devices.reuse_host_memory() is False and refused.calls == [(-3, 32 * 2**20)]
    half = Libc([1, 0])
    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: half)
    assert devices.reuse_host_memory() is False


@pytest.mark.parametrize("error", [OSError("no libc"), AttributeError("mallopt")])
def test_without_glibc_host_memory_is_left_as_it_is(monkeypatch, error):
    def no_glibc(name):
        raise error

    monkeypatch.setattr(devices.ctypes, "CDLL", no_glibc)
    assert devices.reuse_host_memory() is False


def test_memory_is_pinned_only_when_asked_and_a_gpu_copies_from_it(caplog):
    caplog.set_level(logging.DEBUG, logger="repro.core.runtime.devices")
    assert devices.use_pinned_memory(True, torch.device("cuda")) is True
    assert devices.use_pinned_memory(False, torch.device("cuda")) is False
    assert devices.use_pinned_memory(False, torch.device("cpu")) is False
    assert caplog.messages == []
    assert devices.use_pinned_memory(True, torch.device("cpu")) is False
    assert caplog.messages == ["dataloader.pin_memory ignored: the device is cpu, not cuda"]
