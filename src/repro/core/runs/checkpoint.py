"""Checkpoints: the whole state of a run, written atomically, read without unpickling code.

A checkpoint is a dict of tensors and plain Python values only, so `torch.load` with
`weights_only=True` reads it and a file holding arbitrary pickled objects is refused.
Files are written to a temporary name, fsynced and renamed, so a crash at any moment
leaves the previous checkpoint intact. `last.pt` always names the newest good one.

Saving copies the state to host memory (the training step goes on at once) and writes it on
a background thread, one write at a time; `Checkpointer.wait` returns when it is on disk.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from repro.core.errors import CheckpointError
from repro.core.files import atomic_path
from repro.core.guards import received
from repro.core.runs import faults, integrity

log = logging.getLogger(__name__)

FORMAT = "repro-checkpoint"
# 2: the RNG state holds the training device's generator only (1 held every visible GPU's).
# 3: augmentation draws are counter-based (seeding.SampleKeys); 2 resumed with other draws.
# 4: a digest of the content (runs/integrity.py), checked on every load; 3 has none.
VERSION = 4
READABLE = (3, 4)
ZIP_MAGIC = b"PK\x03\x04"
STEP_FILE = re.compile(r"^step-(\d{8,})\.pt$")
BEST_FILE = "best.pt"  # the best evaluated weights (trainer.monitor) that last.pt records
PENDING_BEST = re.compile(r"^best-(\d{8,})\.pt$")  # a better evaluation since last.pt


class DamagedCheckpointError(CheckpointError):
    """A checkpoint cut short (a crash while writing one elsewhere, a full disk) or altered
    since it was written (bit rot, a torn copy): an older one may serve instead."""


def capture_rng(device: torch.device) -> dict[str, Any]:
    """The global RNG states a run draws from, as tensors and plain values: python, numpy,
    torch's CPU generator and, when training on a GPU, that GPU's generator (one per rank).

    Only the training device's generator: the other visible GPUs are never drawn from, and
    storing all of them would tie the checkpoint to how many GPUs the machine shows.
    """
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "device": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Put back what `capture_rng` took; the GPU state goes to this run's training device."""
    saved_on_gpu = state["device"] is not None
    if saved_on_gpu != (device.type == "cuda"):
        trained_on = "a CUDA device" if saved_on_gpu else "the CPU"
        raise CheckpointError(
            f"the checkpoint's random state is for {trained_on}, this run trains on "
            f"{device.type}; resume on the kind of device it was trained on"
        )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if saved_on_gpu:
        torch.cuda.set_rng_state(state["device"], device)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # platforms without directory fds (Windows)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def to_host(state: Any) -> tuple[Any, torch.cuda.Event | None]:
    """A copy of `state` whose tensors live in host memory and no longer change with
    training, and the event after which the copies from a GPU are complete (None if none).

    GPU tensors are copied into pinned memory without waiting: the copies are queued on the
    current stream before any later step, so they read this step's values.
    """
    from_gpu = False

    def copy(value: Any) -> Any:
        nonlocal from_gpu
        if isinstance(value, torch.Tensor):
            if value.is_cuda:
                from_gpu = True
                host = torch.empty_like(value, device="cpu", pin_memory=True)
                return host.copy_(value.detach(), non_blocking=True)
            return value.detach().clone()
        if isinstance(value, dict):
            return {key: copy(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(copy(item) for item in value)
        return value

    host = copy(state)
    if not from_gpu:
        return host, None
    copied = torch.cuda.Event()
    copied.record()
    return host, copied


def atomic_save(obj: Any, path: Path, step: int = -1) -> None:
    """torch.save through a temporary file, fsync and rename; a checkpoint of ours is sealed
    with the digest of its content on the way."""
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        obj = integrity.sealed(obj)
    with atomic_path(path) as tmp, tmp.open("wb") as handle:
        _save(obj, handle)
        handle.flush()
        faults.point("checkpoint", step)
        os.fsync(handle.fileno())
    _fsync_dir(path.parent)


def _save(obj: Any, handle: Any) -> None:
    """torch.save into `handle`, raising the OSError of a write that failed: torch reports it
    as a RuntimeError of its own ("unexpected pos"), which names neither file nor cause."""
    noted = _NotedWrites(handle)
    try:
        torch.save(obj, noted)
    except RuntimeError:
        if noted.refused is not None:
            raise noted.refused from None
        raise


class _NotedWrites:
    """A file's writes, and the first OSError one of them raised."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.refused = handle, None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.refused = self.refused or error
            raise

    def flush(self) -> None:
        self.handle.flush()


def load(path: Path, mmap: bool = False, root: Path | None = None) -> dict[str, Any]:
    """Read one of our checkpoints, or raise CheckpointError saying why it cannot be used.
    `mmap`: tensors stay in the file until read (to look at a checkpoint's plain values).
    `root`: the folder the file must lie in (received.opened), else the file's own."""
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with received.opened(path, "checkpoint", root) as handle:
            magic = handle.read(len(ZIP_MAGIC))
        if len(magic) < len(ZIP_MAGIC):
            raise DamagedCheckpointError(f"{path}: truncated ({len(magic)} bytes)")
        if magic != ZIP_MAGIC:
            raise CheckpointError(f"{path}: not a checkpoint (torch.save writes zip archives)")
        state = received.load_checkpoint(path, root, mmap=mmap)
    except received.ReceivedFileError as error:
        raise CheckpointError(str(error)) from None
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path}: refused, it holds pickled objects other than tensors and plain values "
            "(loading them could run code)"
        ) from None
    except CheckpointError:
        raise
    except Exception as error:  # a broken archive fails in many ways, all of them damage
        raise DamagedCheckpointError(
            f"{path}: unreadable or truncated ({error.__class__.__name__})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a repro checkpoint (no '{FORMAT}' marker)")
    if state.get("version") not in READABLE:
        found = state.get("version")
        raise CheckpointError(f"{path}: checkpoint format version {found}, expected {VERSION}")
    check_layout(state, path)
    check_intact(state, path)
    return state


def check_layout(state: dict[str, Any], path: Path | str) -> None:
    """Refuse a checkpoint whose entries are not of the kinds a run writes (a crafted one can
    carry a matching digest), in one line, not a TypeError where one is first used."""
    model, position, classes = state.get("model"), state.get("position"), state.get("classes")
    wrong = []
    if "model" in state and not (
        isinstance(model, dict)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items())
    ):
        wrong.append("model is not a mapping of names to tensors")
    if "position" in state and not (
        isinstance(position, dict) and isinstance(position.get("step"), int)
    ):
        wrong.append("position is not a mapping with an integer step")
    if classes is not None and not (
        isinstance(classes, list) and all(isinstance(name, str) for name in classes)
    ):
        wrong.append("classes is not a list of names")
    for key in ("config", "normalisation", "split_sizes", "resolved"):
        if key in state and state[key] is not None and not isinstance(state[key], dict):
            wrong.append(f"{key} is not a mapping")
    if not isinstance(state.get("root_seed", 0), int):
        wrong.append("root_seed is not an integer")
    if wrong:
        raise CheckpointError(f"{path}: not laid out as a repro checkpoint ({'; '.join(wrong)})")


def check_intact(state: dict[str, Any], path: Path | str) -> None:
    """Refuse a checkpoint whose content no longer matches its digest (format 3 has none)."""
    if state.get("version", VERSION) >= 4 and not integrity.intact(state):
        raise DamagedCheckpointError(
            f"{path}: damaged, its content no longer matches the digest written with it "
            "(bit rot, or a torn copy)"
        )


def best_step_of(path: Path) -> int | None:
    """The step of the checkpoint `path` holds; None if there is none we can use there."""
    try:
        return int(load(path, mmap=True)["position"]["step"])
    except CheckpointError:
        return None


class Checkpointer:
    """Writes step-NNNNNNNN.pt files, keeps the newest `keep`, points last.pt at the newest.

    Writes happen on a background thread, one at a time: `save` returns once the state is
    copied to host memory, and the next `save`, or `wait`, first waits for the write before.
    """

    def __init__(self, folder: Path, keep: int) -> None:
        self.folder, self.keep = folder, keep
        self._writer: threading.Thread | None = None
        self._failure: BaseException | None = None
        # Half-written files of a killed run: never renamed, so never used; tidy them away.
        for stale in folder.glob(".*.tmp") if folder.is_dir() else ():
            stale.unlink(missing_ok=True)

    def step_files(self) -> list[Path]:
        """Our step files, newest first."""
        return [path for _, path in self._numbered(STEP_FILE)]

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Start writing `state` as the checkpoint of `step`; returns the file it will be."""
        return self._start(state, self.folder / f"step-{step:08d}.pt", step, latest=True)

    def save_best(self, state: dict[str, Any], step: int) -> Path:
        """Start writing `state`, the best evaluated weights so far, as best-NNNNNNNN.pt.

        It becomes best.pt once the next checkpoint, which records it as the best, is on
        disk. So best.pt always holds the best that last.pt records: a run killed between an
        evaluation and its next checkpoint resumes with a best.pt that agrees with it, even
        if the resumed run never repeats that evaluation. best.pt is never pruned and never
        what a resume starts from.
        """
        return self._start(state, self.folder / f"best-{step:08d}.pt", step, latest=False)

    def settle_best(self, best_step: int | None) -> None:
        """On starting a run: make best.pt the best that the checkpoint it starts from
        records (at `best_step`; None: a fresh run, or no evaluation yet). A pending best of
        that step is promoted (killed between the two renames); later ones, and a best.pt of
        another step (a resume from an older checkpoint, or a fresh run in an old folder),
        are dropped: the run decides again, as its logs are cut back to its checkpoint."""
        self.wait()
        for step, path in self._numbered(PENDING_BEST):
            if step == best_step:
                self._promote(path)
            else:
                path.unlink()
        best = self.folder / BEST_FILE
        if best.exists() and best_step_of(best) != best_step:
            best.unlink()

    def _start(self, state: dict[str, Any], path: Path, step: int, latest: bool) -> Path:
        self.wait()
        host, copied = to_host({"format": FORMAT, "version": VERSION, **state})
        # Not a daemon: if the main thread ends first, the interpreter still finishes the write.
        self._writer = threading.Thread(
            target=self._write, args=(host, copied, path, step, latest), name="checkpoint-writer"
        )
        self._writer.start()
        return path

    def wait(self) -> None:
        """Return when the last checkpoint started is on disk; raise what its write raised."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _write(
        self,
        state: dict[str, Any],
        copied: torch.cuda.Event | None,
        path: Path,
        step: int,
        latest: bool,
    ) -> None:
        try:
            if copied is not None:
                copied.synchronize()
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_save(state, path, step)
            if latest:
                self._point_last_at(path)
                self._promote_best_up_to(step)
                for old in self.step_files()[self.keep :]:
                    old.unlink(missing_ok=True)
            else:  # a newer best: the pending ones before it can never be promoted
                for pending_step, pending in self._numbered(PENDING_BEST):
                    if pending_step < step:
                        pending.unlink()
        except BaseException as error:  # handed to the training thread by `wait`
            self._failure = error

    def _point_last_at(self, path: Path) -> None:
        # A hard link costs no space; renaming it over last.pt is atomic.
        with atomic_path(self.folder / "last.pt") as tmp:
            try:
                os.link(path, tmp)
            except OSError:  # a file system without hard links: a copy
                atomic_save(received.load_checkpoint(path), tmp)
        _fsync_dir(self.folder)

    def _numbered(self, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
        """The files `pattern` names (step-NNNNNNNN.pt, best-NNNNNNNN.pt) and their steps,
        newest first."""
        if not self.folder.is_dir():
            return []
        found = [(pattern.match(p.name), p) for p in self.folder.iterdir()]
        return sorted(((int(m.group(1)), p) for m, p in found if m), reverse=True)

    def _promote_best_up_to(self, step: int) -> None:
        """The checkpoint of `step` is on disk: the newest best evaluated by then is best.pt."""
        due = [path for best_step, path in self._numbered(PENDING_BEST) if best_step <= step]
        if due:
            self._promote(due[0])
        for superseded in due[1:]:
            superseded.unlink()

    def _promote(self, path: Path) -> None:
        path.replace(self.folder / BEST_FILE)
        _fsync_dir(self.folder)

    def latest_good(self, skipped: list[str] | None = None) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that loads, falling back past damaged ones with a warning
        (each named in `skipped`, when given).

        A foreign or unsafe file stops the search: it was put there by someone, and guessing
        past it could resume from the wrong run.
        """
        candidates = [self.folder / "last.pt", *self.step_files()]
        errors = []
        for path in candidates:
            if not path.exists():
                continue
            try:
                return path, load(path)
            except DamagedCheckpointError as error:
                errors.append(error)
                log.warning("skipping checkpoint: %s", error)
                if skipped is not None:
                    skipped.append(str(error))
        if errors:
            raise CheckpointError(
                f"no usable checkpoint in {self.folder} (newest: {errors[0]}); nothing to resume "
                "from: move the checkpoints aside to train afresh here, or use a new run folder"
            )
        return None
