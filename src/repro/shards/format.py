"""The shard format: WebDataset-style tar files and one manifest that indexes them.

A shard is a plain POSIX tar (ustar) of members `<key>.<ext>` (the image file's own bytes,
never re-encoded) and `<key>.cls` (the label as text), so `tar tf`, WebDataset and any tar
reader read it. Beside the shards, `manifest.json` lists, per split, each shard's name, size,
SHA-256 and an index row per sample: [byte offset of its image, byte count, label, CRC-32 of
the bytes]. Reading a sample is one seek and one read; its CRC catches a damaged byte where it
is read, and a shard's SHA-256 is checked whole wherever a shard is copied (a download, or
`python -m repro.shards verify`). The manifest's own SHA-256 names the dataset (fingerprint,
resume). Every header is 512 bytes (ustar, short names, no metadata that varies between
machines), so packing the same images gives the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from repro.errors import DataError

FORMAT = "repro-shards/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
BLOCK = 512  # tar's record unit: a header, and the padding of every member's data


@dataclass(frozen=True)
class Shard:
    """One shard as the manifest lists it; `index` rows are (offset, size, label, crc32)."""

    name: str
    size: int
    sha256: str
    index: np.ndarray  # int64 (samples, 4)


@dataclass(frozen=True)
class Manifest:
    classes: list[str]
    splits: dict[str, list[Shard]]
    sha256: str  # of the manifest file's bytes: the dataset's name


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uname, info.gname = size, 0o644, 0, "", ""
    return info


def write_shard(path: Path, samples: Iterable[tuple[str, str, bytes, int]]) -> dict[str, Any]:
    """Write (key, extension, image bytes, label) samples into a tar at `path`; return its
    manifest entry."""
    rows = []
    with path.open("wb") as handle:
        with tarfile.open(fileobj=handle, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for key, ext, data, label in samples:
                offset = tar.offset + BLOCK  # the data follows its one-block header
                tar.addfile(_tar_info(f"{key}.{ext}", len(data)), io.BytesIO(data))
                assert tar.offset == offset + -(-len(data) // BLOCK) * BLOCK, "a long header"
                rows.append([offset, len(data), label, zlib.crc32(data)])
                text = str(label).encode()
                tar.addfile(_tar_info(f"{key}.cls", len(text)), io.BytesIO(text))
        handle.flush()
    return {"name": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path),
            "index": rows}  # fmt: skip


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def manifest_text(classes: list[str], splits: dict[str, list[dict]], seed: int) -> str:
    """The manifest: one line per shard, so that `diff` shows which shard changed."""
    lines = [f'{{"format": "{FORMAT}", "pack_seed": {seed}, "classes": {json.dumps(classes)},']
    lines.append(' "splits": {')
    for i, (split, shards) in enumerate(splits.items()):
        entries = ",\n".join(f"  {json.dumps(shard, sort_keys=True)}" for shard in shards)
        comma = "," if i < len(splits) - 1 else ""
        lines.append(f' "{split}": [\n{entries}\n ]{comma}')
    return "\n".join([*lines, "}}"]) + "\n"


def parse_manifest(data: bytes, where: str) -> Manifest:
    """The manifest in `data`; one DataError naming `where` if it is not one."""
    try:
        raw = json.loads(data)
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT!r}")
        classes = [str(name) for name in raw["classes"]]
        splits = {
            split: [_shard(entry, len(classes)) for entry in raw["splits"][split]]
            for split in SPLITS
            if split in raw["splits"]
        }
        if not splits.get("train"):
            raise ValueError("no train split")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DataError(f"{where}: not a shard manifest ({error})") from None
    return Manifest(classes, splits, hashlib.sha256(data).hexdigest())


def _shard(entry: dict[str, Any], classes: int) -> Shard:
    index = np.asarray(entry["index"], dtype=np.int64).reshape(-1, 4)
    name = str(entry["name"])
    if "/" in name or name.startswith(".") or not name.endswith(".tar"):
        raise ValueError(f"shard name {name!r}")  # a manifest must not point outside its folder
    if len(index) and not (index[:, 2].min() >= 0 and index[:, 2].max() < classes):
        raise ValueError(f"{name}: a label outside the {classes} classes")
    if len(index) and (index[:, 0] + index[:, 1]).max() > int(entry["bytes"]):
        raise ValueError(f"{name}: a sample past the shard's end")
    return Shard(name, int(entry["bytes"]), str(entry["sha256"]), index)
