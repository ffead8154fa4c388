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
import os
import re
import tarfile
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import numpy as np

from repro.core.errors import DataError
from repro.core.guards import received

FORMAT = "repro-shards/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
BLOCK = 512  # tar's record unit: a header, and the padding of every member's data
# A shard's name in the manifest is a file name of the manifest's own folder, nothing more.
SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\.tar")
SHA256 = re.compile(r"[0-9a-f]{64}")
LARGEST = 2**62  # no offset, size or CRC of a sample comes near it; int64 arithmetic stays exact


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
    with received.opened(path, "shard", path.parent) as written:
        size, digest = os.fstat(written.fileno()).st_size, sha256_of(written)
    return {"name": path.name, "bytes": size, "sha256": digest, "index": rows}


def sha256_of(handle: IO[bytes]) -> str:
    """The SHA-256 of what is left to read in `handle`."""
    digest = hashlib.sha256()
    while block := handle.read(1 << 20):
        digest.update(block)
    return digest.hexdigest()


def check_members(handle: IO[bytes], shard: Shard, named: str) -> None:
    """Refuse a shard whose tar holds more than plain files with plain names (a link, a
    device, a name with `..` or a leading `/`, data past the file's end), or whose manifest
    rows are not its members' data: a tar reader that extracts it would write where the
    shard's maker chose."""
    members: dict[int, int] = {}  # data offset -> size
    try:
        with tarfile.open(fileobj=handle, mode="r:") as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()  # one header at a time: a shard may hold millions
                _check_member(member, shard, named)
                members[member.offset_data] = member.size
    except (tarfile.TarError, EOFError) as error:
        raise DataError(f"shard {named}: not a tar file ({error})") from None
    for offset, size, _, _ in shard.index.tolist():
        if members.get(offset) != size:
            raise DataError(
                f"shard {named}: the manifest's sample at byte {offset} is not a member's data"
            )


def _check_member(member: tarfile.TarInfo, shard: Shard, named: str) -> None:
    name = PurePosixPath(member.name)
    if not member.isreg():
        why = "a link" if member.issym() or member.islnk() else "not a plain file"
        raise DataError(f"shard {named}: member {member.name!r} is {why}: refused")
    if name.is_absolute() or ".." in name.parts or "\\" in member.name:
        raise DataError(f"shard {named}: member name {member.name!r}: refused")
    if member.offset_data + member.size > shard.size:
        raise DataError(f"shard {named}: member {member.name!r} runs past the file's end")


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
        raw = received.parse_json(data, where)
    except received.ReceivedFileError as error:  # not JSON, or nested past the cap
        raise DataError(str(error)) from None
    try:
        _expect(isinstance(raw, dict), "not a JSON object")
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT!r}")
        classes, found = raw.get("classes"), raw.get("splits")
        _expect(
            isinstance(classes, list) and all(isinstance(c, str) for c in classes),
            "classes: not a list of names",
        )
        _expect(isinstance(found, dict), "splits: not an object")
        splits = {}
        for split in SPLITS:
            if split in found:
                _expect(isinstance(found[split], list), f"splits.{split}: not a list")
                splits[split] = [_shard(entry, len(classes)) for entry in found[split]]
        if not splits.get("train"):
            raise ValueError("no train split")
        counts = Counter(shard.name for shards in splits.values() for shard in shards)
        twice = sorted(name for name, count in counts.items() if count > 1)
        _expect(not twice, f"shard {twice[0] if twice else ''!r} listed twice")
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as error:
        raise DataError(f"{where}: not a shard manifest ({error})") from None
    return Manifest(classes, splits, hashlib.sha256(data).hexdigest())


def _expect(holds: bool, why: str) -> None:
    if not holds:
        raise ValueError(why)


def _shard(entry: Any, classes: int) -> Shard:
    _expect(isinstance(entry, dict), "a shard entry that is not an object")
    name, size, sha256 = entry.get("name"), entry.get("bytes"), entry.get("sha256")
    # A manifest must not point outside its folder, nor at a hidden file of ours (a lock).
    _expect(
        isinstance(name, str) and bool(SHARD_NAME.fullmatch(name)) and ".." not in name,
        f"shard name {name!r}",
    )
    _expect(type(size) is int and 0 <= size <= LARGEST, f"{name}: bytes {size!r}")
    _expect(isinstance(sha256, str) and bool(SHA256.fullmatch(sha256)), f"{name}: sha256")
    rows = np.asarray(entry.get("index"))
    if rows.size == 0:
        rows = np.zeros((0, 4), dtype=np.int64)
    _expect(
        rows.dtype.kind in "iu" and rows.ndim == 2 and rows.shape[1] == 4,
        f"{name}: index is not rows of 4 whole numbers",
    )
    _expect(
        not len(rows) or (rows.min() >= 0 and rows.max() <= LARGEST),
        f"{name}: a negative or huge number in the index",
    )
    index = rows.astype(np.int64)
    if len(index) and not index[:, 2].max() < classes:
        raise ValueError(f"{name}: a label outside the {classes} classes")
    if len(index) and (index[:, 0] + index[:, 1]).max() > size:
        raise ValueError(f"{name}: a sample past the shard's end")
    if len(index) and index[:, 3].max() >= 2**32:
        raise ValueError(f"{name}: a CRC-32 past 32 bits")
    return Shard(name, size, sha256, index)
