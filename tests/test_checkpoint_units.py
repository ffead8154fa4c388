"""runs/checkpoint.py in this process, without training: the random state, the copy to the
host, atomic writes, what a load refuses and why, and the Checkpointer's files."""

from __future__ import annotations

import errno
import io
import os
import pickle
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.core.errors import CheckpointError, StorageError
from repro.core.runs import checkpoint, faults, integrity
from repro.core.runs.checkpoint import Checkpointer, DamagedCheckpointError

from conftest import Exploit, save_as_from_a_gpu


def small_state(step: int) -> dict:
    return {"position": {"step": step}, "model": {"w": torch.full((2,), float(step))}}


def write_ours(path: Path, **state) -> Path:
    """A checkpoint as a run writes it: marked, versioned and sealed."""
    checkpoint.atomic_save(
        {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, **state}, path
    )
    return path


def refusal(path: Path, **options) -> CheckpointError:
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(path, **options)
    return refused.value


def best_weights(folder: Path) -> int:
    return int(checkpoint.load(folder / "best.pt")["model"]["w"][0])


# ---- the random state ----------------------------------------------------------------------


def test_the_exploit_runs_code_when_unpickled(tmp_path):
    """So that the tests below, which find no marker, could have found one."""
    pickle.loads(pickle.dumps(Exploit(tmp_path / "pwned")))
    assert (tmp_path / "pwned").exists()


def test_the_random_state_round_trips_and_refuses_another_kind_of_device():
    np.random.seed(2)
    np.random.standard_normal()  # numpy now holds a cached second normal draw
    saved = checkpoint.capture_rng(torch.device("cpu"))
    assert set(saved) == {"python", "numpy", "torch", "device"} and saved["device"] is None
    kind, keys, position, has_gauss, cached = saved["numpy"]
    assert kind == "MT19937" and keys.dtype == torch.int64 and keys.shape == (624,)
    assert (position, has_gauss, cached) == np.random.get_state()[2:] and has_gauss == 1
    drawn = (random.random(), np.random.standard_normal(), np.random.rand(), torch.rand(1).item())
    random.random(), np.random.rand(), torch.rand(3)  # the run draws on
    checkpoint.restore_rng(saved, torch.device("cpu"))
    again = (random.random(), np.random.standard_normal(), np.random.rand(), torch.rand(1).item())
    assert again == drawn
    # A python state whose key came back as a list (it was a tuple when captured) still sets.
    version, internal, gauss = saved["python"]
    checkpoint.restore_rng(
        {**saved, "python": [version, list(internal), gauss]}, torch.device("cpu")
    )
    assert random.random() == drawn[0]
    with pytest.raises(CheckpointError) as refused:
        checkpoint.restore_rng(saved, torch.device("cuda"))
    assert str(refused.value) == (
        "the checkpoint's random state is for the CPU, this run trains on cuda; resume on the "
        "kind of device it was trained on"
    )
    with pytest.raises(CheckpointError) as refused:
        checkpoint.restore_rng({**saved, "device": torch.zeros(2)}, torch.device("cpu"))
    assert str(refused.value) == (
        "the checkpoint's random state is for a CUDA device, this run trains on cpu; resume on "
        "the kind of device it was trained on"
    )


def test_a_gpus_random_state_is_taken_from_and_put_back_on_the_training_device(monkeypatch):
    taken, put = [], []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: taken.append(device) or "g")
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda state, device: put.append((state, device))
    )
    gpu = torch.device("cuda", 1)
    saved = checkpoint.capture_rng(gpu)
    assert saved["device"] == "g" and taken == [gpu]
    checkpoint.restore_rng({**saved, "device": torch.arange(3)}, gpu)
    ((state, device),) = put
    assert state.tolist() == [0, 1, 2] and device == gpu


# ---- the copy to the host ------------------------------------------------------------------


def test_a_state_copied_to_the_host_no_longer_changes_with_training():
    weight = torch.ones(2, requires_grad=True)
    state = {"model": {"w": weight}, "list": [torch.zeros(1), 3], "pair": (torch.ones(1), "x"),
             "n": 5}  # fmt: skip
    host, copied = checkpoint.to_host(state)
    with torch.no_grad():
        weight.add_(1)
        state["list"][0].add_(1)
        state["pair"][0].add_(1)
    assert copied is None  # nothing came from a GPU: nothing to wait for
    assert host["model"]["w"].tolist() == [1.0, 1.0] and not host["model"]["w"].requires_grad
    assert host["list"][0].tolist() == [0.0] and host["list"][1] == 3
    assert isinstance(host["list"], list) and isinstance(host["pair"], tuple)
    assert host["pair"][0].tolist() == [1.0] and host["pair"][1] == "x" and host["n"] == 5


class OnAGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU: to_host's GPU path, on a machine without one."""

    @property
    def is_cuda(self) -> bool:
        return True


def test_a_gpus_tensors_go_to_pinned_memory_without_waiting_and_an_event_marks_the_end(
    monkeypatch,
):
    made, copies, events = [], [], []
    real_empty_like = torch.empty_like

    def empty_like(value, **options):
        made.append(options)
        return real_empty_like(value, device="cpu")

    class Event:
        def __init__(self):
            events.append(self)
            self.recorded = False

        def record(self):
            self.recorded = True

    real_copy = torch.Tensor.copy_

    def copy_(self, source, non_blocking=False):
        copies.append(non_blocking)
        return real_copy(self, source)

    monkeypatch.setattr(torch, "empty_like", empty_like)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    weight = torch.arange(3.0).as_subclass(OnAGpu)
    host, copied = checkpoint.to_host({"model": {"w": weight}, "step": 4})
    assert made == [{"device": "cpu", "pin_memory": True}] and copies[0] is True
    assert host["model"]["w"].tolist() == [0.0, 1.0, 2.0] and host["step"] == 4
    assert events == [copied] and copied.recorded


# ---- writing one file ----------------------------------------------------------------------


def test_a_file_is_fsynced_then_its_folder_and_ours_are_sealed(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    path = write_ours(tmp_path / "ours.pt", **small_state(3))
    folder = os.path.realpath(tmp_path)
    assert len(synced) == 2 and synced[1] == folder  # the file (under its temporary name) first
    assert synced[0].startswith(os.path.join(folder, ".ours.pt"))
    assert integrity.intact(torch.load(path, weights_only=True))
    checkpoint.atomic_save([1, 2], tmp_path / "list.pt")  # not ours: saved as it is
    assert torch.load(tmp_path / "list.pt", weights_only=True) == [1, 2]
    checkpoint.atomic_save({"format": "other", "w": 1}, tmp_path / "other.pt")
    assert torch.load(tmp_path / "other.pt", weights_only=True) == {"format": "other", "w": 1}
    synced.clear()
    checkpoint._fsync_dir(path)  # not a folder: nothing to do
    checkpoint._fsync_dir(tmp_path / "missing")
    assert synced == []


def test_syncing_a_folder_leaves_no_descriptor_open(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        checkpoint._fsync_dir(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_fault_named_for_the_checkpoint_of_a_step_fires_while_that_step_is_written(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(faults.VARIABLE, "checkpoint:7:ENOSPC")
    checkpoint.atomic_save([1], tmp_path / "other.pt")  # step -1 when none is named
    checkpoint.atomic_save([1], tmp_path / "six.pt", 6)
    with pytest.raises(StorageError, match=r"seven\.pt: No space left on device \(ENOSPC\)"):
        checkpoint.atomic_save([1], tmp_path / "seven.pt", 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.pt", "six.pt"]
    monkeypatch.setenv(faults.VARIABLE, "checkpoint:-1:EIO")
    with pytest.raises(StorageError, match="Input/output error"):
        checkpoint.atomic_save([1], tmp_path / "unnamed.pt")


def test_torch_saves_failed_write_comes_out_as_the_os_error_it_was():
    class Full(io.BytesIO):
        def write(self, data):
            if self.tell() + len(data) > 64:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    with pytest.raises(OSError) as refused:
        checkpoint._save({"w": torch.zeros(1000)}, Full())
    assert refused.value.errno == errno.ENOSPC
    saved = io.BytesIO()
    checkpoint._save({"w": torch.zeros(1)}, saved)  # room enough: no error, a whole file
    assert torch.load(io.BytesIO(saved.getvalue()), weights_only=True)["w"].tolist() == [0.0]


def test_the_first_refused_write_is_the_one_kept_and_flushes_pass_through():
    class Failing(io.BytesIO):
        def __init__(self):
            super().__init__()
            self.codes, self.flushed = [errno.ENOSPC, errno.EIO], 0

        def write(self, data):
            raise OSError(self.codes.pop(0), "refused")

        def flush(self):
            self.flushed += 1

    handle = Failing()
    noted = checkpoint._NotedWrites(handle)
    assert noted.refused is None
    for _ in range(2):
        with pytest.raises(OSError):
            noted.write(b"x")
    assert noted.refused.errno == errno.ENOSPC
    noted.flush()
    assert handle.flushed == 1
    assert checkpoint._NotedWrites(io.BytesIO()).write(b"abc") == 3


def test_an_error_of_torch_save_that_no_write_raised_is_torchs_own():
    class Unsaveable:
        def __reduce__(self):
            raise RuntimeError("cannot be saved")

    with pytest.raises(RuntimeError, match="cannot be saved"):
        checkpoint._save({"x": Unsaveable()}, io.BytesIO())


# ---- reading one file ----------------------------------------------------------------------


def test_a_checkpoint_of_ours_reads_back_as_written_mapped_or_not(tmp_path):
    path = write_ours(tmp_path / "x.pt", **small_state(3), classes=["a", "b"], root_seed=5,
                      config=None, resolved={"k": 1})  # fmt: skip
    for mmap in (False, True):
        state = checkpoint.load(path, mmap=mmap)
        assert state["position"] == {"step": 3} and state["model"]["w"].tolist() == [3.0, 3.0]
        assert state["version"] == checkpoint.VERSION == 4 and state["format"] == "repro-checkpoint"
    assert checkpoint.load(path, root=tmp_path)["classes"] == ["a", "b"]
    assert checkpoint.best_step_of(path) == 3
    assert checkpoint.best_step_of(tmp_path / "missing.pt") is None
    (tmp_path / "torn.pt").write_bytes(b"PK\x03\x04 torn")
    assert checkpoint.best_step_of(tmp_path / "torn.pt") is None


def test_a_file_that_is_not_a_usable_checkpoint_is_refused_saying_why(tmp_path):
    good = checkpoint.load(write_ours(tmp_path / "good.pt", **small_state(3)))
    cases = {}

    def case(name, write, message, damaged=False):
        path = tmp_path / name
        write(path)
        cases[path] = (message.format(path=path), damaged)

    case("short.pt", lambda p: p.write_bytes(b"PK\x03"), "{path}: truncated (3 bytes)", True)
    case("empty.pt", lambda p: p.write_bytes(b""), "{path}: truncated (0 bytes)", True)
    case("text.pt", lambda p: p.write_text("weights"),
         "{path}: not a checkpoint (torch.save writes zip archives)")  # fmt: skip
    case("code.pt", lambda p: torch.save({"x": Exploit(tmp_path / "pwned")}, p),
         "{path}: refused, it holds pickled objects other than tensors and plain values "
         "(loading them could run code)")  # fmt: skip
    case("cut.pt", lambda p: p.write_bytes((tmp_path / "good.pt").read_bytes()[:900]),
         "{path}: unreadable or truncated (RuntimeError)", True)  # fmt: skip
    marker = "{path}: not a repro checkpoint (no 'repro-checkpoint' marker)"
    case("list.pt", lambda p: torch.save([1], p), marker)
    case("other.pt", lambda p: torch.save({"format": "lightning"}, p), marker)
    case("v9.pt", lambda p: torch.save({**good, "version": 9}, p),
         "{path}: checkpoint format version 9, expected 4")  # fmt: skip
    unversioned = {key: value for key, value in good.items() if key != "version"}
    case("v.pt", lambda p: torch.save(unversioned, p),
         "{path}: checkpoint format version None, expected 4")  # fmt: skip
    case("rot.pt", lambda p: torch.save({**good, "position": {"step": 99}}, p),
         "{path}: damaged, its content no longer matches the digest written with it (bit rot, "
         "or a torn copy)", True)  # fmt: skip
    for path, (message, damaged) in cases.items():
        refused = refusal(path)
        assert str(refused) == message
        assert isinstance(refused, DamagedCheckpointError) is damaged, path.name
    assert not (tmp_path / "pwned").exists()
    assert (
        str(refusal(tmp_path / "missing.pt"))
        == f"{tmp_path / 'missing.pt'}: no such checkpoint file"
    )
    old = tmp_path / "v3.pt"  # format 3 had no digest: read as it is
    torch.save({**good, "version": 3, "position": {"step": 99}}, old)
    assert checkpoint.load(old)["position"]["step"] == 99
    from_gpu = tmp_path / "from_gpu.pt"
    save_as_from_a_gpu(good, from_gpu)
    assert checkpoint.load(from_gpu)["position"] == good["position"]


def test_code_in_a_checkpoint_is_refused_even_with_torchs_default_switched_off(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    path = tmp_path / "code.pt"
    torch.save({"format": checkpoint.FORMAT, "x": Exploit(tmp_path / "pwned")}, path)
    refused = refusal(path)
    assert "refused" in str(refused) and not isinstance(refused, DamagedCheckpointError)
    assert not (tmp_path / "pwned").exists()


def test_a_link_or_a_file_outside_its_folder_is_refused_by_the_boundary(tmp_path):
    inside, outside = tmp_path / "run", tmp_path / "elsewhere"
    inside.mkdir(), outside.mkdir()
    path = write_ours(inside / "x.pt", **small_state(3))
    refused = refusal(path, root=outside)
    assert (
        str(refused)
        == f"{path}: lies outside {outside} once its links are followed ({path}): refused"
    )
    assert type(refused) is CheckpointError
    short = inside / "short.pt"
    short.write_bytes(b"PK")  # refused for where it lies before anything of it is read
    refused = refusal(short, root=outside)
    assert "lies outside" in str(refused) and type(refused) is CheckpointError
    for link, target in (("link.pt", path), ("dangling.pt", inside / "gone.pt")):
        (inside / link).symlink_to(target)
        assert str(refusal(inside / link)) == (
            f"{inside / link}: a symbolic link: files from others are read as they are, not "
            "through links; put a copy of its target in its place"
        )


@pytest.mark.parametrize(
    ("entries", "wrong"),
    [
        ({"model": [torch.zeros(1)]}, "model is not a mapping of names to tensors"),
        ({"model": {1: torch.zeros(1)}}, "model is not a mapping of names to tensors"),
        ({"model": {"w": 1.0}}, "model is not a mapping of names to tensors"),
        ({"position": [3]}, "position is not a mapping with an integer step"),
        ({"position": {"step": 3.0}}, "position is not a mapping with an integer step"),
        ({"position": {}}, "position is not a mapping with an integer step"),
        ({"classes": "ab"}, "classes is not a list of names"),
        ({"classes": ["a", 1]}, "classes is not a list of names"),
        ({"config": [1]}, "config is not a mapping"),
        ({"normalisation": "x"}, "normalisation is not a mapping"),
        ({"split_sizes": 3}, "split_sizes is not a mapping"),
        ({"resolved": [1]}, "resolved is not a mapping"),
        ({"root_seed": "3"}, "root_seed is not an integer"),
        (
            {"model": 1, "classes": [2], "root_seed": None},
            "model is not a mapping of names to tensors; classes is not a list of names; "
            "root_seed is not an integer",
        ),
    ],
)
def test_a_checkpoint_laid_out_otherwise_is_refused_naming_each_entry(tmp_path, entries, wrong):
    # Sealed, as a crafted file can be: only its layout gives it away.
    path = write_ours(tmp_path / "crafted.pt", **{**small_state(3), **entries})
    refused = refusal(path)
    assert str(refused) == f"{path}: not laid out as a repro checkpoint ({wrong})"
    assert type(refused) is CheckpointError


def test_entries_a_run_leaves_out_or_empty_pass_the_layout_check():
    checkpoint.check_layout({}, "p")
    checkpoint.check_layout({"classes": None, "config": None, "normalisation": None,
                             "split_sizes": None, "resolved": None, "root_seed": 0,
                             "model": {}, "position": {"step": 0}}, "p")  # fmt: skip


def test_the_digest_is_checked_from_format_4_on_and_a_missing_version_counts_as_todays():
    sealed = integrity.sealed({"format": checkpoint.FORMAT, "model": {}})
    checkpoint.check_intact(sealed, "p")
    checkpoint.check_intact({**sealed, "model": {"w": torch.zeros(1)}, "version": 3}, "p")
    for altered in ({**sealed, "version": 4, "model": {"w": torch.zeros(1)}}, {"model": {}}):
        with pytest.raises(DamagedCheckpointError) as refused:
            checkpoint.check_intact(altered, "where.pt")
        assert str(refused.value) == (
            "where.pt: damaged, its content no longer matches the digest written with it "
            "(bit rot, or a torn copy)"
        )


# ---- the Checkpointer's files --------------------------------------------------------------


def test_the_newest_checkpoints_are_kept_and_last_pt_is_a_link_to_the_newest(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / ".step-00000009.pt.123.tmp").write_bytes(b"half")  # a killed run's
    (folder / "notes.tmp").write_text("the user's")
    saver = Checkpointer(folder, keep=2)
    assert not (folder / ".step-00000009.pt.123.tmp").exists() and saver.step_files() == []
    assert (folder / "notes.tmp").exists()
    for step in (1, 2, 3, 4):
        assert saver.save(small_state(step), step) == folder / f"step-{step:08d}.pt"
    saver.wait()
    assert saver.step_files() == [folder / "step-00000004.pt", folder / "step-00000003.pt"]
    assert os.path.samefile(folder / "last.pt", folder / "step-00000004.pt")
    last = checkpoint.load(folder / "last.pt")
    assert last["position"]["step"] == 4 and last["format"] == checkpoint.FORMAT
    assert last["version"] == checkpoint.VERSION
    (folder / "step-00000099.txt").write_text("not ours")
    (folder / "step-1.pt").write_text("not ours either")
    (folder / "step-00000099.pt.bak").write_text("nor this")
    assert len(saver.step_files()) == 2
    assert Checkpointer(tmp_path / "none", keep=1).step_files() == []


def test_steps_are_ordered_by_number_past_eight_digits(tmp_path):
    saver = Checkpointer(tmp_path, keep=2)
    for step in (99_999_999, 100_000_000, 5):
        saver.save(small_state(step), step)
    saver.wait()
    assert [p.name for p in saver.step_files()] == ["step-100000000.pt", "step-99999999.pt"]
    assert checkpoint.load(tmp_path / "last.pt")["position"]["step"] == 5  # the newest written


def test_the_saved_state_is_a_copy_taken_at_save_time(tmp_path):
    weights = torch.zeros(3)
    keeper = Checkpointer(tmp_path / "a" / "b", keep=2)  # folders made on write
    keeper.save({"model": {"w": weights}, "position": {"step": 1}}, 1)
    weights.add_(1)  # the next training step, while the write may still be going on
    keeper.wait()
    assert torch.equal(
        checkpoint.load(tmp_path / "a" / "b" / "last.pt")["model"]["w"], torch.zeros(3)
    )


def test_writes_happen_one_at_a_time_on_a_thread_the_interpreter_waits_for(tmp_path, monkeypatch):
    writing, real_save = [], checkpoint.atomic_save
    release = threading.Event()

    def slow(obj, path, step=-1):
        thread = threading.current_thread()
        writing.append((thread.name, thread.daemon, path.name))
        release.wait(5)
        real_save(obj, path, step)

    monkeypatch.setattr(checkpoint, "atomic_save", slow)
    saver = Checkpointer(tmp_path, keep=3)
    saver.save(small_state(1), 1)
    second = threading.Thread(target=saver.save, args=(small_state(2), 2))
    second.start()
    second.join(0.3)
    assert second.is_alive(), "the next save waits for the write before"
    assert writing == [("checkpoint-writer", False, "step-00000001.pt")]
    release.set()
    second.join()
    saver.wait()
    assert [name for *_, name in writing] == ["step-00000001.pt", "step-00000002.pt"]
    assert saver._writer is None


def test_a_failed_write_is_raised_once_by_the_next_wait_or_save(tmp_path, monkeypatch):
    saver = Checkpointer(tmp_path, keep=1)

    def full(obj, path, step=-1):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "atomic_save", full)
    saver.save(small_state(1), 1)
    with pytest.raises(OSError, match="No space left"):
        saver.wait()
    saver.wait()  # raised once
    saver.save(small_state(2), 2)
    with pytest.raises(OSError, match="No space left"):
        saver.save_best(small_state(2), 2)


def test_a_disk_that_fills_while_a_checkpoint_is_written_is_the_disks_error(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.VARIABLE, "checkpoint:7:ENOSPC")
    saver = Checkpointer(tmp_path, keep=2)
    saver.save(small_state(6), 6)
    saver.wait()  # another step: written
    saver.save(small_state(7), 7)
    with pytest.raises(StorageError) as refused:
        saver.wait()
    assert str(refused.value) == (
        f"cannot write {tmp_path / 'step-00000007.pt'}: No space left on device (ENOSPC)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-00000006.pt"]


def test_without_hard_links_last_pt_is_a_copy(tmp_path, monkeypatch):
    def refuse(source, target):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(checkpoint.os, "link", refuse)
    saver = Checkpointer(tmp_path, keep=1)
    saver.save(small_state(3), 3)
    saver.wait()
    assert not os.path.samefile(tmp_path / "last.pt", tmp_path / "step-00000003.pt")
    assert checkpoint.load(tmp_path / "last.pt")["position"]["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-00000003.pt"]


def test_last_pt_is_fsynced_into_its_folder(tmp_path, monkeypatch):
    step_file = write_ours(tmp_path / "step-00000001.pt", **small_state(1))
    synced = []
    monkeypatch.setattr(checkpoint, "_fsync_dir", synced.append)
    Checkpointer(tmp_path, keep=1)._point_last_at(step_file)
    assert synced == [tmp_path] and os.path.samefile(
        tmp_path / "last.pt", tmp_path / "step-00000001.pt"
    )


def test_best_pt_changes_only_once_a_checkpoint_records_the_new_best(tmp_path):
    folder = tmp_path / "checkpoints"
    saver = Checkpointer(folder, keep=3)
    assert saver.save_best(small_state(1), 1) == folder / "best-00000001.pt"
    saver.save(small_state(2), 2)
    saver.save_best(small_state(3), 3)
    saver.save_best(small_state(4), 4)  # a newer best: best-3 can never be promoted
    saver.wait()
    assert best_weights(folder) == 1  # last.pt records step 2, whose best was step 1
    assert sorted(p.name for p in folder.glob("best*")) == ["best-00000004.pt", "best.pt"]
    assert checkpoint.load(folder / "last.pt")["position"]["step"] == 2, "a best is not the last"
    saver.save_best(small_state(5), 5)
    saver.save(small_state(5), 5)  # a best evaluated at the very step of a checkpoint is due
    saver.save_best(small_state(6), 6)  # pending until the next checkpoint
    saver.wait()
    assert best_weights(folder) == 5
    assert sorted(p.name for p in folder.glob("best*")) == ["best-00000006.pt", "best.pt"]
    assert [p.name for p in saver.step_files()] == ["step-00000005.pt", "step-00000002.pt"]


def test_a_resume_keeps_the_best_its_checkpoint_records_and_drops_the_rest(tmp_path):
    folder = tmp_path / "checkpoints"
    saver = Checkpointer(folder, keep=3)
    saver.save_best(small_state(4), 4)
    saver.save(small_state(5), 5)
    saver.save_best(small_state(6), 6)
    saver.wait()
    assert checkpoint.best_step_of(folder / "best.pt") == 4
    saver.settle_best(6)  # killed between the two renames: the pending best of step 6 stands
    assert checkpoint.best_step_of(folder / "best.pt") == 6 and not list(folder.glob("best-*"))
    saver.settle_best(6)  # nothing pending: best.pt of this step stays
    assert best_weights(folder) == 6
    saver.save_best(small_state(8), 8)
    saver.settle_best(6)  # resumed from step 6's checkpoint: later bests are dropped
    assert checkpoint.best_step_of(folder / "best.pt") == 6 and not list(folder.glob("best-*"))
    saver.save_best(small_state(2), 2)
    saver.settle_best(4)  # resumed from an older checkpoint: best.pt is not its best
    assert not list(folder.glob("best*"))
    saver.save_best(small_state(9), 9)
    saver.settle_best(None)  # a fresh run in an old folder
    assert not list(folder.glob("best*"))
    assert checkpoint.best_step_of(folder / "best.pt") is None


def test_promoting_a_best_fsyncs_its_folder(tmp_path, monkeypatch):
    saver = Checkpointer(tmp_path, keep=1)
    saver.save_best(small_state(1), 1)
    saver.wait()
    synced = []
    monkeypatch.setattr(checkpoint, "_fsync_dir", synced.append)
    saver._promote(tmp_path / "best-00000001.pt")
    assert synced == [tmp_path] and best_weights(tmp_path) == 1


def test_a_resume_passes_damaged_checkpoints_and_names_them_but_stops_at_a_foreign_one(
    tmp_path, caplog
):
    saver = Checkpointer(tmp_path, keep=3)
    for step in (1, 2):
        saver.save(small_state(step), step)
    saver.wait()
    (tmp_path / "last.pt").unlink()
    (tmp_path / "last.pt").write_bytes(b"PK\x03\x04 torn")
    skipped = []
    path, state = saver.latest_good(skipped)
    assert path == tmp_path / "step-00000002.pt" and state["position"]["step"] == 2
    assert skipped == [f"{tmp_path / 'last.pt'}: unreadable or truncated (RuntimeError)"]
    said = [r.getMessage() for r in caplog.records if r.name == "repro.core.runs.checkpoint"]
    assert said == [f"skipping checkpoint: {skipped[0]}"]
    assert saver.latest_good()[0] == path  # no list to name them in: skipped all the same
    torch.save({"weights": 1}, tmp_path / "step-00000003.pt")  # someone else's file
    with pytest.raises(CheckpointError, match="not a repro checkpoint"):
        saver.latest_good()
    for path in tmp_path.glob("step-*"):
        path.write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(CheckpointError) as refused:
        saver.latest_good()
    assert str(refused.value) == (
        f"no usable checkpoint in {tmp_path} (newest: {tmp_path / 'last.pt'}: unreadable or "
        "truncated (RuntimeError)); nothing to resume from: move the checkpoints aside to "
        "train afresh here, or use a new run folder"
    )
    assert type(refused.value) is CheckpointError
    assert Checkpointer(tmp_path / "empty", keep=1).latest_good() is None


def test_a_resume_finds_the_step_files_when_last_pt_is_gone(tmp_path):
    saver = Checkpointer(tmp_path, keep=2)
    for step in (1, 2):
        saver.save(small_state(step), step)
    saver.wait()
    (saver.folder / "last.pt").unlink()
    path, state = saver.latest_good()
    assert path == saver.folder / "step-00000002.pt" and state["position"]["step"] == 2
