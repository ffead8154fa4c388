"""Writes are atomic and durable: a crash inside a write (mid-file, or between the fsync and
the rename) leaves the old file whole and no other, and the data is fsynced before the rename
makes it visible. For checkpoints and for every record file a run rewrites."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch

from repro.core.errors import StorageError
from repro.core.files import write_text_atomic
from repro.core.runs import checkpoint
from repro.core.runs.checkpoint import Checkpointer

from conftest import tiny, train_in_process


class CrashError(OSError):
    """The injected failure (an OSError, as a dying disk or a full one raises)."""


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((2048,), float(step))}, "position": {"step": step}}


def _half_then_crash(obj, handle, *args, **kwargs) -> None:
    """torch.save that dies half-way through writing its bytes."""
    buffer = io.BytesIO()
    real_save(obj, buffer)
    handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    raise CrashError(5, "injected crash mid-write")


real_save = torch.save


def _checkpointer_with_step_2(folder: Path) -> Checkpointer:
    writer = Checkpointer(folder, keep=5)
    writer.save(_state(2), 2)
    writer.wait()
    return writer


def _only_step_2_is_there(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "step-00000002.pt"]
    assert checkpoint.load(folder / "last.pt")["position"]["step"] == 2


def test_a_crash_mid_checkpoint_leaves_the_last_one_and_no_other(tmp_path, monkeypatch):
    writer = _checkpointer_with_step_2(tmp_path)
    monkeypatch.setattr(torch, "save", _half_then_crash)
    writer.save(_state(4), 4)
    with pytest.raises(StorageError, match=r"step-00000004\.pt"):
        writer.wait()
    _only_step_2_is_there(tmp_path)


def test_a_crash_between_fsync_and_rename_leaves_the_last_checkpoint(tmp_path, monkeypatch):
    writer = _checkpointer_with_step_2(tmp_path)
    real_replace = Path.replace

    def crash_on_rename(self: Path, target):
        if ".tmp" in self.name:
            raise CrashError(5, "injected crash before the rename")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", crash_on_rename)
    writer.save(_state(4), 4)
    with pytest.raises(StorageError):
        writer.wait()
    _only_step_2_is_there(tmp_path)


def _fsync_then_rename(monkeypatch) -> list[tuple[str, str]]:
    """Record each fsync (of a file, by name) and rename, in order."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, Path.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        real_fsync(fd)

    def replace(self: Path, target):
        events.append(("rename", self.name))
        return real_replace(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "replace", replace)
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names descriptors through /proc")
def test_data_is_fsynced_before_the_rename_makes_it_visible(tmp_path, monkeypatch):
    events = _fsync_then_rename(monkeypatch)
    write_text_atomic(tmp_path / "summary.json", "{}\n")
    checkpoint.atomic_save(_state(1), tmp_path / "step-00000001.pt")
    renamed = [name for kind, name in events if kind == "rename"]
    assert len(renamed) == 2
    for name in renamed:
        synced = events.index(("fsync", name))
        assert synced < events.index(("rename", name)), events


RUN = tiny("trainer.max_steps=4", "trainer.checkpoint_every_steps=2", "model.widths=[8,16]")
LONGER = tiny("trainer.max_steps=6", "trainer.checkpoint_every_steps=2", "model.widths=[8,16]")


@pytest.mark.parametrize("record", ["attempts.jsonl", "summary.json", "resolved_config.yaml"])
def test_a_crash_inside_a_record_write_keeps_the_old_record_whole(record, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *RUN)
    before = (run_dir / record).read_text()
    real_fsync = os.fsync

    def dies_on_the_record(fd: int) -> None:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(f".{record}."):
            raise CrashError(5, "injected crash before the record is safe")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", dies_on_the_record)
    with pytest.raises(StorageError, match=record.replace(".", "[.]")):
        train_in_process(run_dir, *LONGER)  # the same run extended: every record rewritten
    assert (run_dir / record).read_text() == before
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
