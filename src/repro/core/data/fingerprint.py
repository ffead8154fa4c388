"""A fingerprint of the data as a run loaded it, so `verify` can tell "other data" from "other
numbers" before it trains.

In-memory images (synthetic, CIFAR-10): a SHA-256 of their bytes and labels. Image files (a
source with `paths`): of their paths relative to data.root, sizes, labels and contents. Any
source with a `digest()` (sharded data: its manifest's digests): that. Any other source: of
every image and label it gives, read once. Reading every file of a large
folder takes long, so a content hash that took more than CACHE_AFTER_S is kept in the user's
cache, keyed by the folder's listing (paths, sizes, modification times): an unchanged folder
is fingerprinted from its listing alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from repro.core.data.datasets import Source, Splits
from repro.core.data.sources import ImageFiles, TensorImages, in_memory, target_text
from repro.core.files import write_json_atomic
from repro.core.guards import received

CACHE_AFTER_S = 1.0
SPLITS = ("train", "val", "test")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "repro" / "data-fingerprints"


def _tensor_digest(source: TensorImages) -> str:
    digest = hashlib.sha256()
    digest.update(repr(tuple(source.images.shape)).encode())
    digest.update(source.images.contiguous().numpy().tobytes())
    digest.update(source.labels.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _contents_digest(paths: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with received.opened(path, "image", root) as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def _files_digest(source: ImageFiles, root: Path) -> str:
    listing = hashlib.sha256()  # what the folder looks like: names, sizes, times, labels
    described = hashlib.sha256()  # the same without times: part of the fingerprint itself
    for path, label in zip(source.paths, source.labels, strict=True):
        stat = path.stat()
        entry = f"{os.path.relpath(path, root)}\0{stat.st_size}\0{target_text(label)}\n"
        described.update(entry.encode())
        listing.update(f"{path.resolve()}\0{stat.st_mtime_ns}\0{entry}".encode())
    cached = cache_dir() / f"{listing.hexdigest()}.json"
    try:
        contents = received.load_json(cached)["contents_sha256"]
        if not isinstance(contents, str):
            raise ValueError(contents)
    except (received.ReceivedFileError, ValueError, KeyError, TypeError):
        started = time.perf_counter()
        contents = _contents_digest(source.paths, root)
        if time.perf_counter() - started > CACHE_AFTER_S:
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(cached, {"contents_sha256": contents})
            except OSError:
                pass  # a read-only home: hash again next time
    return hashlib.sha256(f"{described.hexdigest()}\0{contents}".encode()).hexdigest()


def _samples_digest(source: Source) -> str:
    digest = hashlib.sha256()
    for index in range(len(source)):
        image, label = source[index]
        digest.update(f"{tuple(image.shape)}|{target_text(label)}|".encode())
        digest.update(image.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _digest(source: Source, root: Path | None) -> str:
    held = in_memory(source)
    if held is not None:
        return _tensor_digest(held)
    named = getattr(source, "digest", None)  # a source that names its contents (shards)
    if callable(named):
        return named()
    if hasattr(source, "paths"):
        return _files_digest(source, root or Path("/"))  # type: ignore[arg-type]
    return _samples_digest(source)


def fingerprint(data: Splits, root: str | None) -> dict[str, Any]:
    """{"sha256": of everything, "splits": {name: {"images": n, "sha256": ...}}, "classes"}."""
    base = Path(root).expanduser() if root else None
    done: dict[int, str] = {}  # a split that is another's object (ImageFolder's val as test)
    splits = {}
    for name in SPLITS:
        source = getattr(data, name)
        if id(source) not in done:
            done[id(source)] = _digest(source, base)
        splits[name] = {"images": len(source), "sha256": done[id(source)]}
    whole = hashlib.sha256(json.dumps([splits, data.classes], sort_keys=True).encode())
    return {"sha256": whole.hexdigest(), "splits": splits, "classes": len(data.classes)}
