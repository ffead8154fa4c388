"""Seeding: every random number of a run flows from one root seed through named streams.

A stream is identified by a name and integer keys (epoch, rank, ...); its seed is derived
with numpy's SeedSequence, so streams are statistically independent and a stream's seed
never depends on how much another stream was used. This is what makes results independent
of the number of DataLoader workers and lets a resumed run continue exactly.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import zlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


def resolve_seed(mode: str, value: int | None) -> int:
    """The root seed for this run: the configured one, or a fresh draw that gets logged."""
    if mode == "fixed":
        assert value is not None
        return int(value)
    drawn = secrets.randbits(31)
    log.info("seed=random drew %d; repeat this run with seed=%d", drawn, drawn)
    return drawn


def stream_seed(root: int, name: str, *keys: int, rank: int = 0) -> int:
    """A 63-bit seed for the stream `name` keyed on `keys` (epoch, sample index, ...).
    Streams are named, not numbered, so adding one never shifts the others."""
    name_key = zlib.crc32(name.encode())  # stable across processes, unlike hash()
    seq = np.random.SeedSequence(entropy=root, spawn_key=(name_key, rank, *keys))
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def torch_generator(root: int, name: str, *keys: int, rank: int = 0) -> torch.Generator:
    """A CPU torch generator seeded from a named stream."""
    return torch.Generator().manual_seed(stream_seed(root, name, *keys, rank=rank))


# ---- counter-based draws: a sample's random numbers as a pure function of its key ----------

MASK32 = 0xFFFFFFFF
DRAW_BLOCK = 4  # a batch's draws are hashed four at a time (the built-in steps make three)
_DRAW_KEYS: dict[tuple[torch.device, int], torch.Tensor] = {}
Counter = int | torch.Tensor  # one sample (a Python int) or a batch (an int64 tensor)


def _mix32(x: Counter) -> Counter:
    """A bijective 32-bit integer hash with low bias (xorshift-multiply, "lowbias32"
    constants), for x in [0, 2**32). Integer operations only, so exact: an int64 product
    wraps modulo 2**64 on every device, and its low 32 bits, all that is kept, are those of
    the exact product that Python ints compute."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    x ^= x >> 16
    return x


@dataclass(frozen=True)
class SampleKeys:
    """The counters of samples' random draws: a stream seed, and epochs and dataset indices,
    as Python ints (one sample) or int64 tensors (a batch, on any device).

    Draw number `draw` of a sample is a pure function of (stream, epoch, index, draw): the
    same whichever worker, batch or device computes it, and for a whole batch it costs a few
    tensor operations instead of Python per sample.
    """

    stream: int
    epoch: Counter  # in [0, 2**32)
    index: Counter  # in [0, 2**32)

    @cached_property
    def _sample_hash(self) -> Any:
        hashed = _mix32((self.stream & MASK32) ^ _mix32((self.stream >> 32) & MASK32))
        return _mix32(_mix32(hashed ^ _counter(self.epoch)) ^ _counter(self.index))

    def _bits(self, draw: int) -> Any:
        if isinstance(self._sample_hash, int):  # one sample: Python ints
            return _mix32(self._sample_hash ^ _mix32(draw))
        block, column = divmod(draw, DRAW_BLOCK)
        if block not in self._blocks:
            # A block of draws for the whole batch in one pass: a GPU launches each of the
            # hash's kernels once per block instead of once per draw.
            self._blocks[block] = _mix32(self._sample_hash[..., None] ^ self._draw_keys(block))
        return self._blocks[block][..., column]

    @cached_property
    def _blocks(self) -> dict[int, Any]:
        return {}

    def _draw_keys(self, block: int) -> Any:
        """The draws' own hashes for `block`, as an array like the batch's (built once)."""
        if isinstance(self._sample_hash, np.ndarray):
            return np.array(_draw_hashes(block), dtype=np.uint64)
        device = self._sample_hash.device
        if (device, block) not in _DRAW_KEYS:  # a copy to a GPU once, not per batch
            _DRAW_KEYS[device, block] = torch.tensor(_draw_hashes(block)).to(device)
        return _DRAW_KEYS[device, block]

    def bits(self, draw: int) -> Counter:
        """32 random bits, in [0, 2**32)."""
        return _result(self._bits(draw))

    def integers(self, draw: int, high: int) -> Counter:
        """A uniform integer in [0, high), high < 2**31 (multiply-shift: no modulo bias
        beyond high / 2**32)."""
        return _result((self._bits(draw) * high) >> 32)

    def below(self, draw: int, probability: float) -> bool | torch.Tensor:
        """True with `probability`."""
        return _result(self._bits(draw) < round(probability * 2**32))


def _draw_hashes(block: int) -> list[int]:
    return [_mix32(draw) for draw in range(block * DRAW_BLOCK, (block + 1) * DRAW_BLOCK)]


def _counter(value: Counter) -> Any:
    """A CPU tensor as a numpy uint64 array: the same integer operations (unsigned products
    wrap modulo 2**64 by definition), at a fraction of torch's cost per call on a batch."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return value.numpy().astype(np.uint64)
    return value


def _result(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value if value.dtype == np.bool_ else value.astype(np.int64))
    return value


def seed_globals(root: int, rank: int = 0) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device) global generators.

    Our own code draws from named streams; the global generators serve code we do not
    control (dropout, user transforms). Torch's global stream is checkpointed.
    """
    random.seed(stream_seed(root, "python", rank=rank))
    np.random.seed(stream_seed(root, "numpy", rank=rank) % 2**32)
    torch.manual_seed(stream_seed(root, "torch", rank=rank))  # also seeds every CUDA device


def seed_worker(worker_id: int) -> None:
    """DataLoader worker_init_fn: a distinct python and numpy seed per worker, no stop signals.

    torch already seeds each worker from the loader's generator; we pass that on.
    """
    # The main process alone answers stop signals (it checkpoints). A worker drops the handler
    # it inherited, ignores Ctrl-C (sent to the whole process group) and keeps SIGTERM's
    # default action, which the DataLoader uses to end workers that do not exit.
    for name, action in (
        ("SIGINT", signal.SIG_IGN),
        ("SIGTERM", signal.SIG_DFL),
        ("SIGUSR1", signal.SIG_DFL),
    ):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), action)
    worker_seed = torch.initial_seed() % 2**32
    random.seed(worker_seed)
    np.random.seed(worker_seed)


def python_hash_seed() -> str | None:
    """PYTHONHASHSEED as this interpreter started with it (None when unset or random)."""
    value = os.environ.get("PYTHONHASHSEED")
    return None if value in (None, "random") else value


class seeded:  # noqa: N801 - used like a function: `with seeded(root, "model"): ...`
    """Run a block with torch's CPU generator seeded from a stream, restoring it afterwards.

    Only the CPU generator: `torch.manual_seed` would also reseed every CUDA generator with
    this rank-independent stream, and the per-rank seeds `seed_globals` gave them (dropout on
    the GPU) would be lost on every rank alike.
    """

    def __init__(self, root: int, name: str, *keys: int) -> None:
        self.seed = stream_seed(root, name, *keys)

    def __enter__(self) -> None:
        self.saved = torch.get_rng_state()
        torch.default_generator.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch.set_rng_state(self.saved)
