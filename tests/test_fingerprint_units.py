"""data/fingerprint.py: each kind of source's digest recomputed here by hand from its
definition, the fingerprint's layout, and the cache of slow content hashes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from repro.core.data import fingerprint
from repro.core.data.datasets import Splits
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.guards import received


def sha(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def whole(splits: dict, classes: list[str]) -> str:
    return sha(json.dumps([splits, classes], sort_keys=True).encode())


def tensors(seed: int = 0, shape=(5, 3, 2, 2)) -> TensorImages:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    return TensorImages(images, torch.arange(shape[0]) % 3)


class Listed:
    """A source that is neither in memory nor files, nor names its digest: read sample by sample."""

    def __init__(self, images: list[torch.Tensor], labels: list) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.images[index], self.labels[index]


class Named(Listed):
    """A source that names its contents (as a sharded split does from its manifest)."""

    def digest(self) -> str:
        return "named-" + str(len(self))


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    for i in range(3):
        (root / "a" / f"{i}.bin").write_bytes(bytes([i + 1]) * (10 + i))
    return root


def files_in(root: Path) -> ImageFiles:
    paths = sorted((root / "a").glob("*.bin"))
    return ImageFiles(paths, [i % 2 for i in range(len(paths))])


def by_hand(files: ImageFiles, base: Path) -> str:
    import os

    described = b"".join(
        f"{os.path.relpath(p, base)}\0{p.stat().st_size}\0{label}\n".encode()
        for p, label in zip(files.paths, files.labels, strict=True)
    )
    contents = sha(*(p.read_bytes() for p in files.paths))
    return sha(f"{sha(described)}\0{contents}".encode())


def test_in_memory_images_are_the_digest_of_their_shape_bytes_and_labels():
    source = tensors()
    expected = sha(
        repr((5, 3, 2, 2)).encode(),
        source.images.numpy().tobytes(),
        source.labels.numpy().tobytes(),
    )
    data = Splits(source, source.subset(torch.arange(2)), source, ["x", "y", "z"])
    found = fingerprint.fingerprint(data, None)
    val = fingerprint._tensor_digest(source.subset(torch.arange(2)))
    splits = {
        "train": {"images": 5, "sha256": expected},
        "val": {"images": 2, "sha256": val},
        "test": {"images": 5, "sha256": expected},
    }
    assert found == {"sha256": whole(splits, ["x", "y", "z"]), "splits": splits, "classes": 3}
    assert list(found["splits"]) == ["train", "val", "test"]
    # The same bytes in another shape are other images.
    reshaped = TensorImages(source.images.reshape(5, 3, 1, 4), source.labels)
    assert fingerprint._tensor_digest(reshaped) != expected


def test_a_split_that_is_another_splits_object_is_read_once(monkeypatch):
    source, calls = tensors(), []
    digest = fingerprint._digest

    def counted(split, root):
        calls.append(split)
        return digest(split, root)

    monkeypatch.setattr(fingerprint, "_digest", counted)
    other = source.subset(torch.arange(2))
    fingerprint.fingerprint(Splits(source, other, source, ["a"]), None)
    assert len(calls) == 2 and calls[0] is source and calls[1] is other


def test_a_source_read_sample_by_sample_is_the_digest_of_each_shape_target_and_bytes():
    images = [torch.full((3, 2, 2), 7, dtype=torch.uint8), torch.zeros(3, 1, 2, dtype=torch.uint8)]
    labels = [1, torch.tensor([0.0, 1.0])]
    source = Listed(images, labels)
    first = (b"(3, 2, 2)|1|", images[0].numpy().tobytes())
    second = (b"(3, 1, 2)|float32(2,)[0.0, 1.0]|", images[1].numpy().tobytes())
    expected = sha(*first, *second)
    found = fingerprint.fingerprint(Splits(source, source, source, ["a", "b"]), None)
    assert found["splits"]["train"] == {"images": 2, "sha256": expected}


def test_a_source_that_names_its_digest_is_taken_at_its_word():
    source = Named([torch.zeros(3, 1, 1, dtype=torch.uint8)], [0])
    found = fingerprint.fingerprint(Splits(source, source, source, ["a"]), None)
    assert found["splits"]["test"] == {"images": 1, "sha256": "named-1"}


def test_image_files_are_their_paths_under_the_root_sizes_labels_and_contents(folder):
    files = files_in(folder)
    found = fingerprint.fingerprint(Splits(files, files, files, ["p", "q"]), str(folder))
    assert found["splits"]["val"]["sha256"] == by_hand(files, folder)
    # Without a root, paths count from the filesystem's root.
    without = fingerprint.fingerprint(Splits(files, files, files, ["p", "q"]), None)
    assert without["splits"]["val"]["sha256"] == by_hand(files, Path("/"))
    assert without["sha256"] != found["sha256"]


def test_an_image_whose_folder_links_outside_the_root_is_refused(folder, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "0.bin").write_bytes(b"outside")
    (folder / "b").symlink_to(elsewhere, target_is_directory=True)
    files = ImageFiles([folder / "b" / "0.bin"], [0])
    with pytest.raises(received.ReceivedFileError, match="lies outside"):
        fingerprint.fingerprint(Splits(files, files, files, ["p"]), str(folder))


def test_paths_and_labels_of_other_lengths_are_refused(folder):
    files = files_in(folder)
    files.labels = files.labels[:-1]
    with pytest.raises(ValueError):
        fingerprint._files_digest(files, folder)


def test_the_cache_is_in_xdg_cache_home_or_the_home_folders_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert fingerprint.cache_dir() == tmp_path / "x" / "repro" / "data-fingerprints"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fingerprint.cache_dir() == tmp_path / "home" / ".cache" / "repro" / "data-fingerprints"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # set but empty: the home folder's
    assert fingerprint.cache_dir() == tmp_path / "home" / ".cache" / "repro" / "data-fingerprints"


def test_every_slow_hash_is_cached_beside_the_others(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint, "CACHE_AFTER_S", -1.0)  # every hash counts as slow
    other = tmp_path / "other"
    (other / "a").mkdir(parents=True)
    (other / "a" / "0.bin").write_bytes(b"other")
    for root in (folder, other):
        fingerprint._files_digest(files_in(root), root)
    cached = sorted(fingerprint.cache_dir().iterdir())
    assert len(cached) == 2
    contents = sha(*(p.read_bytes() for p in files_in(other).paths))
    assert {json.loads(p.read_text())["contents_sha256"] for p in cached} >= {contents}


def test_a_hash_that_took_no_longer_than_the_threshold_is_not_cached(folder, monkeypatch):
    monkeypatch.setattr(fingerprint, "CACHE_AFTER_S", 0.0)
    monkeypatch.setattr(fingerprint.time, "perf_counter", lambda: 12.5)  # it took no time
    fingerprint._files_digest(files_in(folder), folder)
    assert not fingerprint.cache_dir().exists()


@pytest.mark.parametrize("cached", ['{"contents_sha256": 5}', '{"other": "x"}', "[1]", "{no json"])
def test_a_cache_entry_that_is_not_a_digest_is_hashed_again(folder, monkeypatch, cached):
    monkeypatch.setattr(fingerprint, "CACHE_AFTER_S", -1.0)
    files = files_in(folder)
    fingerprint._files_digest(files, folder)
    (entry,) = fingerprint.cache_dir().iterdir()
    entry.write_text(cached)
    assert fingerprint._files_digest(files, folder) == by_hand(files, folder)
