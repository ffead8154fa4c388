"""Numbers about a run (repro.core.watch.metrics): the weights hash as docs/exactness.md defines
it, and the throughput and data-wait accounting."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from repro.core.watch import metrics
from repro.core.watch.metrics import Throughput, host_bytes, weights_sha256


def _by_hand(model: nn.Module) -> str:
    """name|dtype|shape| then the bytes, for each tensor of the state in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_the_hash_covers_each_tensors_name_dtype_shape_and_bytes_in_name_order():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert weights_sha256(model) == _by_hand(model)
    model[1].running_mean[0] += 1  # a buffer counts as much as a weight
    assert weights_sha256(model) == _by_hand(model)
    renamed = nn.Sequential(nn.Identity(), *model)  # the same values under other names
    assert weights_sha256(renamed) != weights_sha256(model)
    as_double = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    as_double.load_state_dict(model.state_dict())
    assert weights_sha256(as_double) == weights_sha256(model)
    assert weights_sha256(as_double.double()) != weights_sha256(model)


def test_the_memory_format_of_the_weights_leaves_the_hash_alone():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    plain = weights_sha256(model)
    assert weights_sha256(model.to(memory_format=torch.channels_last)) == plain


def test_the_bytes_of_a_model_off_the_host_are_gathered_into_one_copy(monkeypatch):
    asked = []

    def recorded(tensors, gather):
        asked.append(gather)
        return [torch.zeros(0, dtype=torch.uint8) for _ in tensors]

    monkeypatch.setattr(metrics, "host_bytes", recorded)
    weights_sha256(nn.Linear(2, 2))
    weights_sha256(nn.Linear(2, 2, device="meta"))  # a device other than the CPU
    assert asked == [False, True]


def test_gathered_bytes_are_views_of_one_copy_and_others_each_their_own():
    tensors = [torch.ones(3), torch.zeros(2, 2)]
    storages = {part.untyped_storage().data_ptr() for part in host_bytes(tensors, True)}
    assert len(storages) == 1
    storages = {part.untyped_storage().data_ptr() for part in host_bytes(tensors, False)}
    assert len(storages) == 2


@pytest.mark.parametrize("gather", [True, False])
def test_host_bytes_are_each_tensors_logical_bytes_gathered_or_not(gather):
    tensors = [torch.arange(6.0).reshape(2, 3).t(), torch.tensor([1, 2], dtype=torch.int16)]
    found = host_bytes(tensors, gather)
    expected = [t.contiguous().numpy().tobytes() for t in tensors]
    assert [part.numpy().tobytes() for part in found] == expected
    assert all(part.dtype == torch.uint8 and part.device.type == "cpu" for part in found)
    assert host_bytes([], gather) == []
    (alone,) = host_bytes([torch.ones(2, dtype=torch.float16)], gather)
    assert alone.numpy().tobytes() == torch.ones(2, dtype=torch.float16).numpy().tobytes()


def test_throughput_is_images_a_second_and_the_share_of_time_spent_waiting(monkeypatch):
    now = [10.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
    counter = Throughput()
    counter.waited(2.0, 64)
    counter.waited(1.0, 32)
    now[0] = 14.0
    assert counter.read() == (24.0, 0.75)
    counter.reset()
    assert (counter.images, counter.waiting, counter.start) == (0, 0.0, 14.0)
    assert counter.read() == (0.0, 0.0)  # no time passed: no division by zero
    counter.waited(0.0, 10)
    assert counter.read() == (10 / 1e-9, 0.0)  # a nanosecond at least
