"""Packing images into shards: `python -m repro.shards pack SRC DEST`.

SRC is an image folder (train/, and val/, test/ when present, one subfolder per class, as
`data=imagefolder` reads) or CIFAR-10 as torchvision keeps it (cifar-10-batches-py, each
image stored as PNG). Each split's samples are shuffled once with `seed` before they are cut
into shards: images packed class by class would give whole shards of one class, and a
shard-aware order could not mix them. The image files' bytes go in unchanged.

The shards and the manifest are written into a hidden folder beside DEST that is renamed to
DEST when all is written: DEST holds a whole dataset or does not exist, and a DEST that
exists is never written into.
"""

from __future__ import annotations

import io
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from repro.data.sources import IMAGE_SUFFIXES
from repro.errors import DataError
from repro.files import write_text_atomic, writing
from repro.shards.format import MANIFEST, SPLITS, manifest_text, write_shard

# A sample before packing: its extension and a way to read its bytes, and its label.
Item = tuple[str, Path | bytes, int]


def parse_size(text: str) -> int:
    """'256MB', '64KiB', '1GB' or a count of bytes."""
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6,
             "GB": 10**9, "B": 1}  # fmt: skip
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit) and upper[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return int(float(upper[: -len(unit)]) * factor)
    if upper.isdigit():
        return int(upper)
    raise DataError(f"--shard-size {text}: not a size (256MB, 64KiB, 1GB or bytes)")


def image_folder(root: Path) -> tuple[list[str], dict[str, list[Item]]]:
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if len(classes) < 2:
        raise DataError(f"{root}/train: {len(classes)} class folders; need 2+")
    splits = {}
    for split in SPLITS:
        if not (root / split).is_dir():
            continue
        items: list[Item] = []
        for label, name in enumerate(classes):
            found = sorted((root / split / name).rglob("*"))
            items += [(p.suffix.lower()[1:], p, label) for p in found
                      if p.suffix.lower() in IMAGE_SUFFIXES]  # fmt: skip
        if not items:
            raise DataError(f"{root / split}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        splits[split] = items
    return classes, splits


def cifar10(root: Path) -> tuple[list[str], dict[str, list[Item]]]:
    from PIL import Image

    def batches(names: list[str]) -> list[Item]:
        items: list[Item] = []
        for name in names:
            with (root / name).open("rb") as handle:
                batch = pickle.load(handle, encoding="bytes")  # noqa: S301: the user's own files
            images = batch[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            for pixels, label in zip(images, batch[b"labels"], strict=True):
                encoded = io.BytesIO()
                Image.fromarray(np.ascontiguousarray(pixels)).save(encoded, format="PNG")
                items.append(("png", encoded.getvalue(), int(label)))
        return items

    with (root / "batches.meta").open("rb") as handle:
        meta = pickle.load(handle, encoding="bytes")  # noqa: S301: the user's own files
    classes = [name.decode() for name in meta[b"label_names"]]
    train = batches([f"data_batch_{i}" for i in range(1, 6)])
    return classes, {"train": train, "test": batches(["test_batch"])}


def read_source(src: Path) -> tuple[list[str], dict[str, list[Item]]]:
    if (src / "train").is_dir():
        return image_folder(src)
    for root in (src, src / "cifar-10-batches-py"):
        if (root / "batches.meta").is_file():
            return cifar10(root)
    raise DataError(
        f"{src}: expected an image folder (train/<class>/...) or CIFAR-10 (cifar-10-batches-py)"
    )


def _cut(items: list[Item], shard_bytes: int) -> Iterator[list[Item]]:
    """Consecutive runs of items of about `shard_bytes` each (at least one item)."""
    shard: list[Item] = []
    size = 0
    for item in items:
        length = item[1].stat().st_size if isinstance(item[1], Path) else len(item[1])
        if shard and size + length > shard_bytes:
            yield shard
            shard, size = [], 0
        shard.append(item)
        size += length + 1536  # its header, the label's header and data, padding
    if shard:
        yield shard


def pack(src: Path, dest: Path, shard_bytes: int = 256 * 10**6, seed: int = 0) -> Path:
    """Pack `src` into shards at `dest` (which must not exist); return the manifest's path."""
    if dest.exists():
        raise DataError(f"{dest}: exists; pack into a new folder (a dataset is never rewritten)")
    classes, splits = read_source(src)
    partial = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # what an earlier, interrupted pack left
    with writing(partial):
        partial.mkdir(parents=True)
    try:
        entries = {}
        for split, items in splits.items():
            order = np.random.default_rng([seed, SPLITS.index(split)]).permutation(len(items))
            shuffled = [items[i] for i in order]
            entries[split] = []
            for number, shard in enumerate(_cut(shuffled, shard_bytes)):
                path = partial / f"{split}-{number:06d}.tar"
                with writing(path):
                    entries[split].append(write_shard(path, _samples(split, number, shard)))
        write_text_atomic(partial / MANIFEST, manifest_text(classes, entries, seed))
        with writing(dest):
            partial.rename(dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return dest / MANIFEST


def _samples(split: str, number: int, items: list[Item]) -> Iterator[tuple[str, str, bytes, int]]:
    for position, (ext, where, label) in enumerate(items):
        data = where.read_bytes() if isinstance(where, Path) else where
        yield f"{split}-{number:06d}-{position:06d}", ext, data, label
