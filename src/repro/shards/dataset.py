"""`data=shards`: a dataset packed into tar shards (repro.shards.format), read from a folder or
from S3-compatible object storage (repro.shards.store).

The training order is shard-aware and a pure function of (seed, epoch): the shards are
shuffled, then the samples inside each window of `window` consecutive shards. A window's
shards are read from start to end once in the epoch, so each worker reads a few files
sequentially instead of seeking across the whole dataset, and an object store serves whole
shards instead of one request per image. Every rank computes the same global order and the
sampler slices it as for any dataset (repro.core.data.samplers.EpochBatches), so the weights do not
depend on the number of workers or processes, and a resumed run starts at its saved batch
without reading what came before it. A subset (the validation split carved out of train,
`data.fraction`) keeps each sample's shard, so its order is shard-aware too.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import zlib
from collections import OrderedDict
from typing import Any, BinaryIO

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from repro.core.data.datasets import Splits, carve_validation, folder
from repro.core.data.sources import torchvision_decoder
from repro.core.errors import ConfigError, DataError
from repro.core.guards import received
from repro.core.runtime.seeding import torch_generator
from repro.shards.format import Manifest, Shard, parse_manifest
from repro.shards.store import Store, open_shard, open_store

# Magic bytes of the formats torchvision.io decodes (faster than PIL, same pixels); the rest
# go through PIL.
TORCHVISION_MAGIC = (b"\xff\xd8\xff", b"\x89PNG")
NPY_MAGIC = b"\x93NUMPY"  # pixels decoded at packing time (pack --pixels)


class ShardImages:
    """One split of a sharded dataset: a Source (repro.core.data.sources) whose samples are read
    one seek and one read each, with `epoch_order` for the sampler and `digest` for the
    fingerprint and resume checks."""

    def __init__(self, store: Store, shards: list[Shard], rows: np.ndarray, window: int,
                 name: str) -> None:  # fmt: skip
        self.store, self.shards, self.window, self.name = store, shards, window, name
        self.rows = rows  # int64 (n, 5): shard, offset, size, label, crc32
        self._open: OrderedDict[int, BinaryIO] = OrderedDict()
        self._pid = os.getpid()
        torchvision_decoder()  # imported here, so that forked workers inherit it

    @classmethod
    def of_split(cls, store: Store, shards: list[Shard], window: int, name: str) -> ShardImages:
        parts = [np.column_stack([np.full(len(s.index), i), s.index]) for i, s in enumerate(shards)]
        rows = np.concatenate(parts) if parts else np.zeros((0, 5), dtype=np.int64)
        return cls(store, shards, rows.astype(np.int64), window, name)

    def __getstate__(self) -> dict[str, Any]:  # open files stay in the process that opened them
        return {**self.__dict__, "_open": OrderedDict(), "_pid": -1}

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, indices: torch.Tensor) -> ShardImages:
        rows = self.rows[indices.numpy()] if len(indices) else self.rows[:0]
        return ShardImages(self.store, self.shards, rows, self.window, self.name)

    @property
    def labels(self) -> list[int]:
        return self.rows[:, 3].tolist()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        shard, offset, size, label, crc = (int(v) for v in self.rows[index])
        handle = self._handle(shard)
        handle.seek(offset)
        data = handle.read(size)
        named = f"{self.store.url}/{self.shards[shard].name}"
        if len(data) != size or zlib.crc32(data) != crc:
            raise DataError(
                f"shard {named}: the sample at byte {offset} does not match the manifest: "
                "the shard is damaged; pack (or download) it again"
            )
        return decode_bytes(data, f"shard {named}, byte {offset}"), label

    def _handle(self, shard: int) -> BinaryIO:
        """An open file of `shard`: a few stay open per process (a window's worth), so a
        window is read with as many opens as it has shards."""
        if self._pid != os.getpid():  # a forked worker: its parent's files are not its own
            self._open, self._pid = OrderedDict(), os.getpid()
        if shard in self._open:
            self._open.move_to_end(shard)
            return self._open[shard]
        handle = open_shard(self.store, self.shards[shard])
        self._open[shard] = handle
        while len(self._open) > 2 * self.window:
            self._open.popitem(last=False)[1].close()
        return handle

    def epoch_order(self, root_seed: int, epoch: int) -> torch.Tensor:
        """The epoch's order: shards shuffled, then samples inside windows of `window` shards;
        a pure function of (seed, epoch) and this split's contents."""
        generator = torch_generator(root_seed, "order", epoch)
        present = np.unique(self.rows[:, 0])
        shuffled = present[torch.randperm(len(present), generator=generator).numpy()]
        rank = np.empty(len(self.shards), dtype=np.int64)
        rank[shuffled] = np.arange(len(shuffled))
        # Positions grouped by their shard's place in the shuffled order, stored order within.
        by_shard = np.argsort(rank[self.rows[:, 0]], kind="stable")
        window_of = rank[self.rows[by_shard, 0]] // self.window
        order = []
        for window in range(int(window_of.max()) + 1 if len(by_shard) else 0):
            members = by_shard[window_of == window]
            order.append(members[torch.randperm(len(members), generator=generator).numpy()])
        return torch.from_numpy(np.concatenate(order) if order else by_shard)

    def digest(self) -> str:
        """The split's identity without reading an image: the manifest's SHA-256 and which of
        its samples the split holds."""
        digest = hashlib.sha256(f"{self.name}\0".encode())
        digest.update(np.ascontiguousarray(self.rows).tobytes())
        for shard in self.shards:
            digest.update(f"{shard.name}\0{shard.sha256}\n".encode())
        return digest.hexdigest()


def decode_bytes(data: bytes, named: str) -> torch.Tensor:
    """Encoded image bytes (or pack --pixels' .npy) as a uint8 RGB (3, H, W) tensor; DataError
    naming it if unreadable."""
    try:
        if data.startswith(NPY_MAGIC):
            start, shape = npy_layout(data[: 10 + int.from_bytes(data[8:10], "little")])
            return torch.frombuffer(bytearray(data[start:]), dtype=torch.uint8).view(shape)
        received.check_pixels(data, named)
        if data.startswith(TORCHVISION_MAGIC) and (decode := torchvision_decoder()):
            return decode(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        with Image.open(io.BytesIO(data)) as image:
            pixels = np.asarray(image.convert("RGB"))
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()
    except received.ReceivedFileError as error:
        raise DataError(str(error)) from None
    except (UnidentifiedImageError, OSError, RuntimeError, ValueError) as error:
        raise DataError(f"{named}: not a readable image ({error.__class__.__name__})") from None


@functools.lru_cache(maxsize=64)
def npy_layout(header: bytes) -> tuple[int, tuple[int, int, int]]:
    """Where a .npy's pixels start and their (3, H, W) shape. numpy's own np.load takes as long
    as decoding a small JPEG; the header of a split's images repeats, so it is parsed once."""
    stream = io.BytesIO(header)
    if np.lib.format.read_magic(stream) != (1, 0):
        raise ValueError("not a version 1.0 .npy")
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    if dtype != np.uint8 or fortran_order or len(shape) != 3 or shape[0] != 3:
        raise ValueError(f"not uint8 (3, H, W) pixels: {dtype} {shape}")
    return stream.tell(), shape


def shards(
    cfg: Any,
    split_seed: int,
    *,
    cache_dir: str | None = None,
    cache_gib: float = 4.0,
    window: int = 4,
    endpoint_url: str | None = None,
) -> Splits:
    """Splits from the shards at data.root (a folder, or s3://bucket/prefix)."""
    url = str(folder(cfg, "a folder of shards or s3://bucket/prefix (python -m repro.shards)"))
    url = cfg.root if str(cfg.root).startswith("s3://") else url  # Path would fold s3:// to s3:/
    if window < 1:
        raise ConfigError("data.window", window, "1 or more shards")
    if cache_gib <= 0:
        raise ConfigError("data.cache_gib", cache_gib, "a positive size in GiB")
    if cfg.get("cache", "none") != "none":
        allowed = "none: sharded data is read from its shards (the order is shard-aware)"
        raise ConfigError("data.cache", cfg.cache, allowed)
    store = open_store(url, cache_dir, cache_gib, endpoint_url)
    manifest: Manifest = parse_manifest(store.manifest(), f"{url}/manifest.json")
    classes = manifest.classes
    if cfg.num_classes is not None and cfg.num_classes != len(classes):
        allowed = f"{url} has {len(classes)} classes (or null to infer)"
        raise ConfigError("data.num_classes", cfg.num_classes, allowed)

    def split(name: str) -> ShardImages:
        return ShardImages.of_split(store, manifest.splits[name], window, name)

    train = split("train")
    if "val" in manifest.splits:
        val = split("val")
    else:
        train, val = carve_validation(train, cfg.val_size, split_seed)
    test = split("test") if "test" in manifest.splits else val
    return Splits(train, val, test, classes, any_size=True)


# Where and how the shards are read, not what: a resume may name another cache or endpoint.
shards.may_change = ("cache_dir", "cache_gib", "endpoint_url")  # type: ignore[attr-defined]
