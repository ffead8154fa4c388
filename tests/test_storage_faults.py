"""A file system that refuses the run (full, read-only, over quota) is one line naming the path
and the cause; the attempt is marked failed, what is on disk stays intact, and once space is
freed the same command resumes to the uninterrupted weights."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from repro.core.errors import StorageError
from repro.core.files import complete_lines, write_text_atomic
from repro.core.runs import checkpoint
from repro.core.runs.fingerprint_log import FingerprintLog

from conftest import ROOT, read_summary, run_cli, tiny, train_in_process

COMMAND = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2", "model.widths=[8,16]")


def test_a_refused_atomic_write_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    write_text_atomic(path, "old\n")

    def quota_exceeded(fd: int) -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(os, "fsync", quota_exceeded)  # the new text is written, not yet safe
    with pytest.raises(StorageError, match=r"cannot write .*record\.json: .* \(EDQUOT\)$"):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_last_line_torn_by_a_full_disk_is_dropped():
    assert complete_lines("1,0.5,\n2,0.4") == "1,0.5,\n"
    assert complete_lines("1,0.5,\n") == "1,0.5,\n"
    assert complete_lines("1,0.") == ""


def test_a_resume_drops_a_torn_fingerprint_line_and_stays_exact(tmp_path):
    straight = train_in_process(tmp_path / "straight", *COMMAND)
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *COMMAND, "trainer.halt_at_step=4")
    log = FingerprintLog.of_run(run_dir)
    with log.path.open("a") as handle:
        handle.write("5,0.12")  # a full disk cut this append short
    resumed = train_in_process(run_dir, *COMMAND)
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert [row.step for row in log.read()] == list(range(1, resumed["total_steps"] + 1))


@pytest.fixture(scope="module")
def straight_hash(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    done = run_cli("repro.train", *COMMAND, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr
    return read_summary(run_dir)["weights_sha256"]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_disk_that_fills_during_a_checkpoint_is_one_line_and_resumable(straight_hash, tmp_path):
    run_dir = tmp_path / "run"
    command = [*COMMAND, f"hydra.run.dir={run_dir}"]
    full = run_cli("repro.train", *command, env={"REPRO_FAULT": "checkpoint:8:ENOSPC"})
    assert full.returncode == 2
    assert "Traceback" not in full.stderr + full.stdout
    (line,) = full.stderr.strip().splitlines()
    step_file = run_dir / "checkpoints" / "step-00000008.pt"
    assert line.startswith(f"error: cannot write {step_file}: {os.strerror(errno.ENOSPC)} (ENOSPC)")
    assert "run the same command to resume" in line
    (attempt,) = (
        json.loads(text) for text in (run_dir / "attempts.jsonl").read_text().splitlines()
    )
    assert attempt["result"].startswith("failed: cannot write") and attempt["end_step"] >= 8
    # What was on disk is whole: no temporary file, every checkpoint loads, last.pt at step 6.
    folder = run_dir / "checkpoints"
    assert not list(folder.glob(".*.tmp")) and not step_file.exists()
    assert all(checkpoint.load(path) for path in folder.glob("*.pt"))
    assert checkpoint.load(folder / "last.pt")["position"]["step"] == 6

    resumed = run_cli("repro.train", *command)  # space freed: the same command
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 6
    assert summary["weights_sha256"] == straight_hash


class FillingDisk:
    """A file whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, data) -> int:
        size = len(memoryview(data).cast("B"))
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return size

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("room", [0, 100, 5000])
def test_torch_save_on_a_full_disk_raises_the_disks_error_not_torchs(room):
    state = {"model": {"w": torch.zeros(4096)}, "position": {"step": 1}}
    with pytest.raises(OSError) as refused:
        checkpoint._save(state, FillingDisk(room))
    assert refused.value.errno == errno.ENOSPC  # torch alone says "unexpected pos"


# Run inside a mount namespace of its own (unshare): a small tmpfs holds the run folder, a
# stopped run's disk is filled to the last page, then the run goes on and hits the full disk.
FILL_A_TMPFS = r"""
import json, os, shutil, signal, subprocess, sys, time
mount, out, command = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "none", mount], check=True)
run = [sys.executable, "-m", "repro.train", *command, f"hydra.run.dir={mount}/run"]
env = {**os.environ, "PYTHONHASHSEED": "0"}
owner = subprocess.Popen(run, env={**env, "REPRO_FAULT": "step:5:SIGSTOP"}, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
while open(f"/proc/{owner.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
    time.sleep(0.05)
with open(f"{mount}/filler", "wb", buffering=0) as filler:
    for chunk in (1 << 16, 1 << 12):
        try:
            while True:
                filler.write(bytes(chunk))
        except OSError:
            pass
owner.send_signal(signal.SIGCONT)
stdout, stderr = owner.communicate()
shutil.copytree(f"{mount}/run", f"{out}/full")
os.unlink(f"{mount}/filler")  # space freed: the same command again
again = subprocess.run(run, env=env, capture_output=True, text=True)
shutil.copytree(f"{mount}/run", f"{out}/freed")
print(json.dumps([owner.returncode, stdout, stderr, again.returncode, again.stderr]))
"""


def _can_mount_tmpfs(tmp_path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "none"]
    return subprocess.run([*probe, str(tmp_path)], capture_output=True).returncode == 0


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_tmpfs_that_fills_then_frees_up(straight_hash, tmp_path):
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("needs unshare and the right to mount a tmpfs in a mount namespace")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", FILL_A_TMPFS,
         str(mount), str(tmp_path), json.dumps(COMMAND)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    full_rc, full_out, full_err, freed_rc, freed_err = json.loads(done.stdout)
    assert full_rc == 2 and "Traceback" not in full_out + full_err
    (line,) = full_err.strip().splitlines()
    assert line.startswith(f"error: cannot write {mount}/run/") and "(ENOSPC)" in line, line
    full = tmp_path / "full"
    (attempt,) = (json.loads(text) for text in (full / "attempts.jsonl").read_text().splitlines())
    assert attempt["result"].startswith("failed: cannot write"), attempt
    assert not list(full.rglob(".*.tmp"))
    assert all(checkpoint.load(path) for path in (full / "checkpoints").glob("*.pt"))

    assert freed_rc == 0, freed_err
    assert read_summary(tmp_path / "freed")["weights_sha256"] == straight_hash


# ---- the unit: REPRO_FAULT's injection point (fast, in-process) ----------------------------


@pytest.mark.parametrize(
    ("what", "raised", "sent"),
    [("ENOSPC", errno.ENOSPC, None), ("EROFS", errno.EROFS, None),
     ("", None, "SIGKILL"), ("SIGTERM", None, "SIGTERM")],
)  # fmt: skip
def test_a_fault_fires_at_its_point_and_step_only_after_settling(what, raised, sent, monkeypatch):
    import signal

    from repro.core.runs import faults

    monkeypatch.setenv(faults.VARIABLE, f"checkpoint:8:{what}" if what else "checkpoint:8")
    happened = []
    monkeypatch.setattr(os, "kill", lambda pid, number: happened.append((pid, number)))
    for name, step in (("checkpoint", 7), ("step", 8), ("checkpoint", 80)):
        faults.point(name, step, lambda: happened.append("settled"))
    assert happened == []  # another point or step: nothing, not even the settling
    settle = lambda: happened.append("settled")  # noqa: E731
    if raised is not None:
        with pytest.raises(OSError) as fired:
            faults.point("checkpoint", 8, settle)
        assert (fired.value.errno, fired.value.strerror) == (raised, os.strerror(raised))
        assert happened == ["settled"]
    else:
        faults.point("checkpoint", 8, settle)
        assert happened == ["settled", (os.getpid(), signal.Signals[sent])]
        faults.point("checkpoint", 8)  # no settling asked for
        assert happened[-1] == (os.getpid(), signal.Signals[sent])


def test_no_fault_named_is_no_fault(monkeypatch):
    from repro.core.runs import faults

    monkeypatch.delenv(faults.VARIABLE, raising=False)
    monkeypatch.setattr(os, "kill", lambda *args: pytest.fail("signalled with no fault named"))
    faults.point("", 0, lambda: pytest.fail("settled with no fault named"))  # "" is not a point
