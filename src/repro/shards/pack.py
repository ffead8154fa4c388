"""Packing images into shards: `python -m repro.shards pack SRC DEST`.

SRC is an image folder (train/, and val/, test/ when present, one subfolder per class, as
`data=imagefolder` reads) or CIFAR-10 as torchvision keeps it (cifar-10-batches-py, each
image stored as PNG). Each split's samples are shuffled once with `seed` before they are cut
into shards: images packed class by class would give whole shards of one class, and a
shard-aware order could not mix them. The image files' bytes go in unchanged, or with
`pixels=True` (`--pixels`) as the decoded uint8 (3, H, W) pixels in a `.npy`: no decoding at
training time, for small images whose decoding costs more than reading their pixels.

The shards and the manifest are written into a hidden folder beside DEST that is renamed to
DEST when all is written: DEST holds a whole dataset or does not exist, and a DEST that
exists is never written into.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from repro.core.data.sources import IMAGE_SUFFIXES
from repro.core.errors import DataError
from repro.core.files import write_text_atomic, writing
from repro.core.guards import received
from repro.shards.dataset import decode_bytes
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


def refuse_links(root: Path) -> None:
    """Refuse, in one line, a source folder holding a symbolic link anywhere under it, or a
    file with a hard link outside it: either would pack a file from outside the folder (a
    key, a password file) into shards that others download. Nothing is followed to find
    them; hard links among the folder's own files (a deduplicated dataset) are fine."""
    names: dict[tuple[int, int], list[Path]] = {}
    links: dict[tuple[int, int], int] = {}
    for folder, dirs, files in os.walk(root):  # links to folders are listed, not entered
        for name in sorted(dirs + files):
            path = Path(folder) / name
            if path.is_symlink():
                raise DataError(
                    f"{path}: a symbolic link in the folder to pack (to {path.readlink()}): "
                    "refused, its target would go into the shards; put a copy in its place"
                )
            info = path.stat(follow_symlinks=False)
            if name in files and info.st_nlink > 1:
                names.setdefault((info.st_dev, info.st_ino), []).append(path)
                links[(info.st_dev, info.st_ino)] = info.st_nlink
    for file, found in names.items():
        if len(found) < links[file]:
            raise DataError(
                f"{found[0]}: has a hard link outside the folder to pack: refused, it is another "
                "file's contents; put a copy of its own in its place"
            )


def image_folder(root: Path) -> tuple[list[str], dict[str, list[Item]]]:
    refuse_links(root)
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


# CIFAR-10's batches are pickles of dicts, lists and numpy arrays. A downloaded file is
# someone else's: any other global (a function to call) is refused, never imported.
CIFAR_GLOBALS = frozenset({("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")})  # fmt: skip


def load_cifar_batch(path: Path) -> Any:
    """One of CIFAR-10's pickled batches, read with numpy's array globals only."""

    class ArraysOnly(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) not in CIFAR_GLOBALS:
                raise DataError(f"{path}: holds {module}.{name}, not CIFAR-10's arrays; refused")
            return super().find_class(module, name)

    try:
        with received.opened(path, "shard", path.parent) as handle:
            return ArraysOnly(handle, encoding="bytes").load()
    except received.ReceivedFileError as error:
        raise DataError(str(error)) from None
    except (pickle.UnpicklingError, EOFError, ValueError) as error:
        raise DataError(f"{path}: not a CIFAR-10 batch ({error})") from None


@contextlib.contextmanager
def _laid_out_as_cifar10(path: Path) -> Iterator[None]:
    """A batch that unpickles but is not laid out as CIFAR-10's (keys, sizes, types): one line."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as error:
        said = f"{error.__class__.__name__}: {error}"
        raise DataError(f"{path}: not laid out as a CIFAR-10 batch ({said})") from None


def cifar10(root: Path) -> tuple[list[str], dict[str, list[Item]]]:
    from PIL import Image

    def batches(names: list[str]) -> list[Item]:
        items: list[Item] = []
        for name in names:
            with _laid_out_as_cifar10(root / name):
                batch = load_cifar_batch(root / name)
                images = batch[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
                for pixels, label in zip(images, batch[b"labels"], strict=True):
                    encoded = io.BytesIO()
                    Image.fromarray(np.ascontiguousarray(pixels)).save(encoded, format="PNG")
                    items.append(("png", encoded.getvalue(), int(label)))
        return items

    with _laid_out_as_cifar10(root / "batches.meta"):
        meta = load_cifar_batch(root / "batches.meta")
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


def _cut(items: Iterable[Item], shard_bytes: int) -> Iterator[list[Item]]:
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


def pack(
    src: Path, dest: Path, shard_bytes: int = 256 * 10**6, seed: int = 0, pixels: bool = False
) -> Path:
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
            shuffled = (items[i] for i in order)
            if pixels:  # decoded a shard at a time, so memory holds one shard's pixels
                shuffled = map(as_pixels, shuffled)
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


def as_pixels(item: Item) -> Item:
    """The item's image decoded as the readers decode it, stored as a .npy of uint8 (3, H, W)."""
    _, where, label = item
    data = _read(where)
    image = decode_bytes(data, str(where) if isinstance(where, Path) else "an image")
    encoded = io.BytesIO()
    np.save(encoded, image.numpy(), allow_pickle=False)
    return "npy", encoded.getvalue(), label


def _read(where: Path | bytes) -> bytes:
    """An item's bytes: a file of the source, read through the boundary (a regular file, no
    link out of its class folder), or bytes already made (CIFAR-10's PNGs)."""
    if not isinstance(where, Path):
        return where
    try:
        return received.read_bytes(where, "image", where.parent)
    except received.ReceivedFileError as error:
        raise DataError(str(error)) from None


def _samples(split: str, number: int, items: list[Item]) -> Iterator[tuple[str, str, bytes, int]]:
    for position, (ext, where, label) in enumerate(items):
        data = _read(where)
        yield f"{split}-{number:06d}-{position:06d}", ext, data, label
