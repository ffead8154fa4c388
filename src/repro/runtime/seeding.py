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

import numpy as np
import torch

log = logging.getLogger(__name__)

# Streams are named, not numbered, so adding one never shifts the others.
STREAMS = ("model", "torch", "order", "augment", "split", "loader", "python", "numpy")


def resolve_seed(mode: str, value: int | None) -> int:
    """The root seed for this run: the configured one, or a fresh draw that gets logged."""
    if mode == "fixed":
        assert value is not None
        return int(value)
    drawn = secrets.randbits(31)
    log.info("seed=random drew %d; repeat this run with seed=%d", drawn, drawn)
    return drawn


def stream_seed(root: int, name: str, *keys: int, rank: int = 0) -> int:
    """A 63-bit seed for the stream `name` keyed on `keys` (epoch, sample index, ...)."""
    name_key = zlib.crc32(name.encode())  # stable across processes, unlike hash()
    seq = np.random.SeedSequence(entropy=root, spawn_key=(name_key, rank, *keys))
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def torch_generator(root: int, name: str, *keys: int, rank: int = 0) -> torch.Generator:
    """A CPU torch generator seeded from a named stream."""
    return torch.Generator().manual_seed(stream_seed(root, name, *keys, rank=rank))


def sample_rng(stream: int, epoch: int, index: int) -> random.Random:
    """A private generator for one sample's augmentation in one epoch.

    Cheap enough for the per-sample hot path; keyed only on (stream, epoch, index), so the
    worker that produces a sample does not matter.
    """
    return random.Random((stream << 64) | (epoch << 32) | index)


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
    for name, action in (("SIGINT", signal.SIG_IGN), ("SIGTERM", signal.SIG_DFL),
                         ("SIGUSR1", signal.SIG_DFL)):  # fmt: skip
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
