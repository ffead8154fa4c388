"""Seeding in-process (repro.core.runtime.seeding), each function against its definition: named
streams from numpy's SeedSequence, the counter-based draws' hash, the global generators."""

from __future__ import annotations

import logging
import random
import signal
import zlib

import numpy as np
import pytest
import torch

from repro.core.runtime import seeding
from repro.core.runtime.seeding import SampleKeys

MASK = 2**32 - 1


def lowbias32(x: int) -> int:
    """The xorshift-multiply hash with the "lowbias32" constants, on Python ints."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK
    return x ^ (x >> 16)


def test_a_stream_seed_is_numpys_seed_sequence_of_the_name_rank_and_keys():
    for root, name, keys, rank in [(0, "augment", (), 0), (7, "model", (3, 11), 2)]:
        spawn_key = (zlib.crc32(name.encode()), rank, *keys)
        sequence = np.random.SeedSequence(entropy=root, spawn_key=spawn_key)
        expected = int(sequence.generate_state(1, dtype=np.uint64)[0]) >> 1
        assert seeding.stream_seed(root, name, *keys, rank=rank) == expected < 2**63
    seeds = {
        seeding.stream_seed(1, "a"),
        seeding.stream_seed(2, "a"),
        seeding.stream_seed(1, "b"),
        seeding.stream_seed(1, "a", 0),
        seeding.stream_seed(1, "a", rank=1),
    }
    assert len(seeds) == 5


def test_a_stream_generator_is_seeded_with_its_stream_seed():
    generator = seeding.torch_generator(4, "split", 2, rank=1)
    assert generator.initial_seed() == seeding.stream_seed(4, "split", 2, rank=1)
    assert generator.device == torch.device("cpu")
    assert seeding.torch_generator(4, "split", 2).initial_seed() == seeding.stream_seed(
        4, "split", 2
    )


def test_a_fixed_seed_is_the_value_and_a_random_one_is_drawn_and_logged(monkeypatch, caplog):
    assert seeding.resolve_seed("fixed", 12) == 12 and seeding.resolve_seed("fixed", 0) == 0
    widths = []
    monkeypatch.setattr(seeding.secrets, "randbits", lambda bits: widths.append(bits) or 1234)
    with caplog.at_level(logging.INFO, logger=seeding.__name__):
        assert seeding.resolve_seed("random", None) == 1234
    assert widths == [31]
    assert caplog.messages == ["seed=random drew 1234; repeat this run with seed=1234"]


def test_the_hash_is_lowbias32_on_ints_numpy_and_torch_alike():
    values = [0, 1, 2, 15, 2**16, 2**31 - 1, 2**31, MASK - 1, MASK, 0xDEADBEEF]
    expected = [lowbias32(value) for value in values]
    assert [seeding._mix32(value) for value in values] == expected
    as_numpy = seeding._mix32(np.array(values, dtype=np.uint64))
    assert as_numpy.tolist() == expected
    as_torch = seeding._mix32(torch.tensor(values, dtype=torch.int64))
    assert as_torch.tolist() == expected
    sample = np.arange(2**16, dtype=np.uint64) * 65_537
    assert len(np.unique(seeding._mix32(sample))) == 2**16, "a bijection: no two alike"


def sample_bits(stream: int, epoch: int, index: int, draw: int) -> int:
    """A sample's draw as the docstring defines it, from the hash alone."""
    hashed = lowbias32((stream & MASK) ^ lowbias32(stream >> 32 & MASK))
    per_sample = lowbias32(lowbias32(hashed ^ epoch) ^ index)
    return lowbias32(per_sample ^ lowbias32(draw))


@pytest.mark.parametrize("stream", [5, 2**40 + 5, seeding.stream_seed(3, "augment")])
def test_a_samples_bits_are_the_hash_of_its_stream_epoch_index_and_draw(stream):
    indices = [0, 1, 6, 2**20, 2**32 - 1]
    for draw in range(11):  # three blocks of draws, the last one partial
        expected = [sample_bits(stream, 9, index, draw) for index in indices]
        assert [SampleKeys(stream, 9, index).bits(draw) for index in indices] == expected
        batch = SampleKeys(stream, 9, torch.tensor(indices)).bits(draw)
        assert batch.dtype == torch.int64 and batch.tolist() == expected
        epochs = torch.full((5,), 9)
        assert SampleKeys(stream, epochs, torch.tensor(indices)).bits(draw).tolist() == expected


def test_streams_differing_in_their_high_bits_draw_differently():
    low = SampleKeys(5, 0, torch.arange(100)).bits(0)
    high = SampleKeys(5 + 2**40, 0, torch.arange(100)).bits(0)
    assert (low == high).sum() < 3


def test_integers_and_coin_flips_come_from_the_bits_by_multiply_shift_and_threshold():
    keys = SampleKeys(77, 2, torch.arange(64))
    bits = keys.bits(3)
    for high in (1, 2, 10, 2**31 - 1):
        assert torch.equal(keys.integers(3, high), (bits * high) >> 32)
    for probability in (0.0, 0.25, 0.5, 1.0):
        threshold = round(probability * 2**32)
        flips = keys.below(3, probability)
        assert flips.dtype == torch.bool and torch.equal(flips, bits < threshold)
    one = SampleKeys(77, 2, 5)
    value = one.bits(3)
    assert one.below(3, value / 2**32) is False, "below: the draw equal to the threshold is out"
    assert one.below(3, (value + 1) / 2**32) is True
    assert one.integers(3, 10) == (one.bits(3) * 10) >> 32
    assert one.below(3, 0.5) is (one.bits(3) < 2**31)


def test_a_batch_hashes_its_draws_a_block_at_a_time_and_keeps_each_block(monkeypatch):
    keys = SampleKeys(1, 0, torch.arange(8))
    hashed = []
    real = SampleKeys._draw_keys

    def counted(self, block):
        hashed.append(block)
        return real(self, block)

    monkeypatch.setattr(SampleKeys, "_draw_keys", counted)
    for draw in (0, 1, 2, 3, 4, 0, 7, 8):
        keys.bits(draw)
    assert hashed == [0, 1, 2]
    assert seeding._draw_hashes(1) == [lowbias32(draw) for draw in (4, 5, 6, 7)]


def test_counters_on_the_cpu_are_hashed_as_numpy_and_come_back_as_torch():
    counter = seeding._counter(torch.tensor([1, 2**40]))
    assert isinstance(counter, np.ndarray) and counter.dtype == np.uint64
    assert counter.tolist() == [1, 2**40]
    assert seeding._counter(5) == 5
    meta = torch.tensor([1], device="meta")
    assert seeding._counter(meta) is meta
    flags = seeding._result(np.array([True, False]))
    assert flags.dtype == torch.bool and flags.tolist() == [True, False]
    numbers = seeding._result(np.array([3, 2**40], dtype=np.uint64))
    assert numbers.dtype == torch.int64 and numbers.tolist() == [3, 2**40]
    assert seeding._result(7) == 7


def test_the_global_generators_are_seeded_from_their_own_streams():
    seeding.seed_globals(21, rank=3)
    python = random.Random(seeding.stream_seed(21, "python", rank=3)).random()
    numpy = np.random.RandomState(seeding.stream_seed(21, "numpy", rank=3) % 2**32).rand()
    assert random.random() == python and np.random.rand() == numpy
    assert torch.initial_seed() == seeding.stream_seed(21, "torch", rank=3)


@pytest.fixture
def handlers_restored():
    saved = {name: signal.getsignal(name) for name in (signal.SIGINT, signal.SIGTERM)}
    saved[signal.SIGUSR1] = signal.getsignal(signal.SIGUSR1)
    yield
    for name, handler in saved.items():
        signal.signal(name, handler)


def test_a_worker_ignores_ctrl_c_keeps_sigterm_and_seeds_from_torch(handlers_restored):
    signal.signal(signal.SIGTERM, lambda *_: None)  # as the main process's checkpointing
    signal.signal(signal.SIGUSR1, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)  # whatever the parent had (pytest's, say)
    torch.manual_seed(2**32 + 2**31 + 9)
    seeding.seed_worker(0)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    worker_seed = 2**31 + 9  # torch's 64-bit seed, cut to numpy's 32 bits
    assert random.random() == random.Random(worker_seed).random()
    assert np.random.rand() == np.random.RandomState(worker_seed).rand()


@pytest.mark.parametrize(("value", "recorded"), [(None, None), ("random", None), ("0", "0")])
def test_the_hash_seed_is_recorded_only_when_fixed(monkeypatch, value, recorded):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    if value is not None:
        monkeypatch.setenv("PYTHONHASHSEED", value)
    assert seeding.python_hash_seed() == recorded


def test_a_seeded_block_draws_from_its_stream_and_puts_the_generator_back(monkeypatch):
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    torch.manual_seed(3)
    reseeded.clear()
    before = torch.get_rng_state()
    with seeding.seeded(8, "model", 2):
        inside = torch.rand(4)
    stream = torch.Generator().manual_seed(seeding.stream_seed(8, "model", 2))
    assert torch.equal(inside, torch.rand(4, generator=stream))
    assert torch.equal(torch.get_rng_state(), before)
    assert reseeded == [], "the GPUs keep their per-rank seeds"


def test_a_batch_on_another_device_hashes_its_draw_numbers_there_once(monkeypatch):
    monkeypatch.setattr(seeding, "_DRAW_KEYS", {})
    meta = torch.device("meta")
    keys = SampleKeys(3, 1, torch.arange(6, device=meta))
    drawn = keys.bits(5)
    assert drawn.device == meta and drawn.shape == (6,)
    (key,) = seeding._DRAW_KEYS
    cached = seeding._DRAW_KEYS[key]
    assert key == (meta, 1) and cached.device == meta and cached.shape == (seeding.DRAW_BLOCK,)
    SampleKeys(4, 2, torch.arange(3, device=meta)).bits(6)
    assert seeding._DRAW_KEYS[key] is cached, "sent to the device once, not per batch"
