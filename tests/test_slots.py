"""How a worker's batch reaches the main process (repro.core.data.slots), in this process: a CPU
batch travels by value, a training batch through its worker's next shared slot, copied out
on arrival."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import torch

from repro.core.data import slots
from repro.core.data.slots import Batch, SharedSlots, SlotRef


def _batch(value: int, size: int = 2) -> Batch:
    images = torch.full((size, 3, 4, 4), value, dtype=torch.uint8)
    return Batch(images, torch.arange(size) + value)


def test_a_cpu_batch_travels_by_value_and_another_devices_as_tensors():
    batch = _batch(7)
    rebuild, arrays = batch.__reduce__()
    assert rebuild is slots._batch_from_arrays and arrays[0].shape == (2, 3, 4, 4)
    back = pickle.loads(pickle.dumps(batch))
    assert isinstance(back, Batch)
    assert torch.equal(back.images, batch.images) and torch.equal(back.labels, batch.labels)
    on_meta = Batch(torch.zeros(2, 3, device="meta"), torch.zeros(2, device="meta"))
    assert on_meta.__reduce__() == (Batch, (on_meta.images, on_meta.labels))


def test_slots_are_shared_batch_sized_buffers_one_set_per_worker():
    shared = SharedSlots(workers=3, per_worker=2, sample=_batch(0))
    assert shared.images.shape == (6, 2, 3, 4, 4) and shared.images.dtype == torch.uint8
    assert shared.labels.shape == (6, 2) and shared.labels.dtype == torch.int64
    assert shared.images.is_shared() and shared.labels.is_shared()
    assert SharedSlots.live[shared.token] is shared and len(shared.token) == 16
    assert SharedSlots(1, 1, _batch(0)).token != shared.token


def test_in_the_main_process_or_for_a_short_batch_the_batch_is_sent_as_it_is(monkeypatch):
    shared = SharedSlots(workers=2, per_worker=2, sample=_batch(0))
    batch = _batch(1)
    assert shared.put(batch) is batch  # no worker: nothing to share
    monkeypatch.setattr(slots, "get_worker_info", lambda: SimpleNamespace(id=0))
    short = _batch(1, size=1)  # the incomplete last batch of an epoch
    assert shared.put(short) is short and shared.produced == 0


def test_a_worker_cycles_through_its_own_slots_and_each_arrives_as_a_copy(monkeypatch):
    shared = SharedSlots(workers=2, per_worker=3, sample=_batch(0))
    monkeypatch.setattr(slots, "get_worker_info", lambda: SimpleNamespace(id=1))
    refs = [shared.put(_batch(value)) for value in (10, 11, 12, 13)]
    assert refs == [SlotRef(shared.token, slot) for slot in (3, 4, 5, 3)]
    arrived = pickle.loads(pickle.dumps(refs[1]))
    assert torch.equal(arrived.images, _batch(11).images)
    assert torch.equal(arrived.labels, _batch(11).labels)
    shared.images[4].fill_(0)  # the slot is written again: the batch that arrived keeps its own
    assert torch.equal(arrived.images, _batch(11).images)
    assert torch.equal(shared.images[3], _batch(13).images)


def test_a_worker_that_unpickles_the_slots_finds_them_by_their_token():
    found = SharedSlots.__new__(SharedSlots)
    found.__setstate__({"token": "abc123", "per_worker": 1, "produced": 0})
    assert SharedSlots.live["abc123"] is found and found.per_worker == 1
