"""What a run records about where it ran, what code it ran and what data it read."""

from __future__ import annotations

import hashlib
import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import torch

from repro.core.data import fingerprint
from repro.core.data.datasets import Splits
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.runtime import environment

# ---- the machine and the libraries ---------------------------------------------------------


def test_the_environment_names_the_cpu_its_kernels_and_the_locked_dependencies():
    described = environment.describe(torch.device("cpu"))
    assert described["cpu_model"] and described["device_name"] == described["cpu_model"]
    assert described["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert described["num_threads"] == torch.get_num_threads()
    assert described["packages"]["torch"] == metadata.version("torch")
    assert described["packages"]["hydra-core"] == metadata.version("hydra-core")
    lock = environment.PROJECT_DIR / "uv.lock"
    assert described["uv_lock_sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    # Every key verify treats as changing results is one the record holds (CUDA ones on CUDA).
    cuda_only = {"nccl", "compute_capability", "gpu_driver"}
    assert set(environment.CHANGES_RESULTS) - cuda_only <= set(described)


# ---- the code: source.patch ----------------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


def committed_repo(path: Path) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "src" / "model.py").write_text("WIDTH = 8\n")
    (path / "src" / "weights.bin").write_bytes(bytes(range(256)))
    git(path, "init", "-q")
    git(path, "add", ".")
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    git(path, *identity, "commit", "-qm", "first")
    return path


def test_a_clean_tree_and_a_folder_outside_git_have_no_patch(tmp_path):
    repo = committed_repo(tmp_path / "repo")
    assert environment.source_patch(inside=repo / "src") is None
    outside = tmp_path / "plain"
    outside.mkdir()
    assert environment.source_patch(inside=outside) is None


@pytest.mark.parametrize("untracked", [True, False], ids=["with-untracked", "binary-last"])
def test_the_patch_rebuilds_edited_and_untracked_files_on_the_commit(tmp_path, untracked):
    repo = committed_repo(tmp_path / "repo")
    (repo / "src" / "model.py").write_text("WIDTH = 16\n")
    (repo / "src" / "weights.bin").write_bytes(bytes(reversed(range(256))))
    names = ["model.py", "weights.bin"]
    if untracked:
        (repo / "src" / "augment.py").write_text("FLIP = True\n")  # new, never added
        names.append("augment.py")
    patch = environment.source_patch(inside=repo / "src")
    assert patch and ("augment.py" in patch.splitlines()[0]) == untracked

    rebuilt = tmp_path / "rebuilt"
    git(tmp_path, "clone", "-q", str(repo), str(rebuilt))
    (tmp_path / "source.patch").write_text(patch)
    git(rebuilt, "apply", str(tmp_path / "source.patch"))
    for name in names:
        assert (rebuilt / "src" / name).read_bytes() == (repo / "src" / name).read_bytes()


# ---- the data: fingerprints ----------------------------------------------------------------


def tensor_splits(seed: int) -> Splits:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (12, 3, 4, 4), dtype=torch.uint8, generator=generator)
    labels = torch.arange(12) % 3
    whole = TensorImages(images, labels)
    return Splits(whole, whole.subset(torch.arange(4)), whole, ["a", "b", "c"])


def test_in_memory_data_has_a_fingerprint_per_split_that_follows_its_bytes():
    first, again, other = (fingerprint.fingerprint(tensor_splits(s), None) for s in (0, 0, 1))
    assert first == again
    assert first["sha256"] != other["sha256"]
    assert first["splits"]["val"]["images"] == 4 and first["classes"] == 3
    assert first["splits"]["train"] == first["splits"]["test"]  # one source, one digest


def file_splits(root: Path) -> Splits:
    paths = sorted(root.glob("*.bin"))
    files = ImageFiles(paths, [i % 2 for i in range(len(paths))])
    return Splits(files, files, files, ["even", "odd"])


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "images"
    root.mkdir()
    for i in range(6):
        (root / f"{i}.bin").write_bytes(bytes([i]) * 64)
    return root


def test_files_are_fingerprinted_by_their_contents_not_only_their_sizes(folder):
    before = fingerprint.fingerprint(file_splits(folder), str(folder))
    stat = (folder / "3.bin").stat()
    (folder / "3.bin").write_bytes(bytes([9]) * 64)  # same size, same time: other pixels
    os.utime(folder / "3.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    fingerprint.cache_dir().mkdir(parents=True, exist_ok=True)  # nothing cached (fast hash)
    assert not any(fingerprint.cache_dir().iterdir())
    after = fingerprint.fingerprint(file_splits(folder), str(folder))
    assert after["sha256"] != before["sha256"]


def test_a_slow_content_hash_is_cached_and_reused_for_an_unchanged_folder(folder, monkeypatch):
    monkeypatch.setattr(fingerprint, "CACHE_AFTER_S", -1.0)  # every hash counts as slow
    first = fingerprint.fingerprint(file_splits(folder), str(folder))
    assert len(list(fingerprint.cache_dir().iterdir())) == 1

    def unread(*_):
        raise AssertionError("the cached digest should have been used")

    monkeypatch.setattr(fingerprint, "_contents_digest", unread)
    assert fingerprint.fingerprint(file_splits(folder), str(folder)) == first
    (folder / "0.bin").write_bytes(bytes([7]) * 65)  # a changed listing is hashed again
    with pytest.raises(AssertionError, match="cached digest"):
        fingerprint.fingerprint(file_splits(folder), str(folder))


def test_the_fingerprint_does_not_depend_on_where_the_folder_lives(folder, tmp_path):
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    here = fingerprint.fingerprint(file_splits(moved), str(moved))
    moved.rename(folder)
    assert fingerprint.fingerprint(file_splits(folder), str(folder)) == here
