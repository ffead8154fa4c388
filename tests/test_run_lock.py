"""One live process per run folder: a second launch is refused naming the owner, the owner is
unharmed, and a SIGKILLed owner never blocks its resume."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.core.runs import run_lock

from conftest import ROOT, read_summary, run_cli, tiny

COMMAND = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2")


def _locked_by_someone(run_dir: Path) -> bool:
    """Whether a lock on run.lock is held (tried through a descriptor of our own)."""
    fd = os.open(run_dir / run_lock.LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_claim_holds_the_lock_until_released(tmp_path):
    assert run_lock.try_claim(tmp_path) is None
    assert run_lock.try_claim(tmp_path) is None  # this process's again: kept
    assert _locked_by_someone(tmp_path)
    assert f'"pid": {os.getpid()}' in (tmp_path / run_lock.LOCK_FILE).read_text()
    run_lock.release(tmp_path)
    assert not (tmp_path / run_lock.LOCK_FILE).exists()  # the folder holds no lock file
    assert run_lock.try_claim(tmp_path) is None  # free for the next run
    run_lock.release(tmp_path)


def test_a_lock_file_removed_or_replaced_is_no_longer_the_folders(tmp_path):
    """What lets a claim that locked a file its owner removed meanwhile try again."""
    path = tmp_path / run_lock.LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        assert run_lock._still_named(fd, path)
        path.unlink()
        assert not run_lock._still_named(fd, path)
        path.touch()  # a new file under the name
        assert not run_lock._still_named(fd, path)
    finally:
        os.close(fd)


def test_a_forked_child_does_not_keep_the_lock_alive(tmp_path):
    """A DataLoader worker outliving a SIGKILLed run must not block the resume."""
    assert run_lock.try_claim(tmp_path) is None
    ours = os.open(tmp_path / run_lock.LOCK_FILE, os.O_RDWR)  # to try the lock once it is gone
    ready, started = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only says it runs, then waits to be killed
        os.write(started, b"x")
        time.sleep(60)
        os._exit(0)
    try:
        os.read(ready, 1)  # the child runs: the fork's hooks are done in it
        run_lock.release(tmp_path)
        fcntl.flock(ours, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if the child held it
    finally:
        os.close(ours)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def _launch(run_dir: Path, fault: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": "0", "REPRO_FAULT": fault}
    log = (run_dir.parent / f"{run_dir.name}-{fault.replace(':', '-')}.log").open("w")
    command = [sys.executable, "-m", "repro.train", *COMMAND, *extra, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_until_stopped(process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before its stop point"
        if Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.1)
    raise AssertionError("the run never reached its stop point")


@pytest.mark.e2e
@pytest.mark.slow  # 20 s of launches; test_a_folder_another_process_holds_... keeps it fast
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")
def test_a_second_launch_is_refused_and_a_killed_owner_blocks_nothing(tmp_path):
    # A live owner, stopped (SIGSTOP) at step 3 while holding the folder.
    run_dir = tmp_path / "live"
    owner = _launch(run_dir, "step:3:SIGSTOP")
    try:
        _wait_until_stopped(owner)
        record = (run_dir / ".hydra" / "config.yaml").read_text()
        log = (run_dir / "train.log").read_text()
        second = run_cli("repro.train", *COMMAND, "seed=7", f"hydra.run.dir={run_dir}")
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"in use by a live run (pid {owner.pid} on " in lines[0]
        assert (run_dir / ".hydra" / "config.yaml").read_text() == record  # nothing rewritten
        assert (run_dir / "train.log").read_text() == log
        assert not (run_dir / "error.txt").exists()
    finally:
        owner.send_signal(signal.SIGCONT)
    assert owner.wait(timeout=300) == 0
    straight = read_summary(run_dir)["weights_sha256"]  # the owner went on unharmed

    # An owner with DataLoader workers, SIGKILLed: its resume starts at once and is exact.
    run_dir = tmp_path / "killed"
    owner = _launch(run_dir, "step:5:SIGSTOP", "dataloader.num_workers=2")
    try:
        _wait_until_stopped(owner)
    finally:
        owner.kill()
    owner.wait()
    resumed = run_cli(
        "repro.train", *COMMAND, "dataloader.num_workers=2", f"hydra.run.dir={run_dir}"
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 4
    assert summary["weights_sha256"] == straight


MOUNTS = """\
22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw
40 22 0:50 / /cluster rw,relatime - nfs4 server:/export rw,vers=4.2,local_lock=none
41 40 0:51 / /cluster/scratch rw - nfs server:/scratch rw,vers=3,nolock,local_lock=all
"""


def test_nfs_mounts_whose_locks_stay_on_one_host_are_found():
    assert run_lock.host_only_locks(Path("/cluster/scratch/run"), MOUNTS) == "nolock"
    assert run_lock.host_only_locks(Path("/cluster/home/run"), MOUNTS) is None  # lockd: seen
    assert run_lock.host_only_locks(Path("/work/run"), MOUNTS) is None  # not NFS


# ---- the unit: who holds a folder, and what a claim does where locks are missing -----------

HOLDER = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "os.write(fd, sys.argv[2].encode())\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)


def held_by_another_process(run_dir: Path, text: str) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    owner = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir / run_lock.LOCK_FILE), text],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert owner.stdout.readline().strip() == "locked"
    return owner


@pytest.mark.parametrize(
    ("text", "said"),
    [('{"pid": 7, "host": "node3", "since": "2026-11-26T09:00:00+0000"}',
      "pid 7 on node3, since 2026-11-26T09:00:00+0000"),
     ('{"pid": 7', "pid not yet recorded"), ('{"pid": 7}', "pid not yet recorded"),
     ("[1]", "pid not yet recorded"), ("", "pid not yet recorded")],
)  # fmt: skip
def test_a_folder_another_process_holds_is_refused_naming_the_owner(tmp_path, text, said):
    from repro.core.runtime.distributed import Context

    run_dir = tmp_path / "run"
    owner = held_by_another_process(run_dir, text)
    try:
        assert run_lock.try_claim(run_dir) == said
        with (
            pytest.raises(run_lock.RunFolderInUseError) as refused,
            run_lock.owned(run_dir, Context()),
        ):
            pytest.fail("the block ran in a folder another process owns")
    finally:
        owner.kill()
        owner.wait()
    assert str(refused.value) == (
        f"{run_dir} is in use by a live run ({said}); a second process there would overwrite "
        "its checkpoints and logs: wait for it to end or stop it, then run the same command to "
        "resume, or choose another folder (hydra.run.dir=...)"
    )
    with run_lock.owned(run_dir, Context()):  # the owner is gone: ours now, then let go
        assert f'"pid": {os.getpid()}' in (run_dir / run_lock.LOCK_FILE).read_text()
    assert not (run_dir / run_lock.LOCK_FILE).exists()


def test_a_file_system_that_cannot_lock_lets_the_run_go_on_with_a_warning(
    tmp_path, monkeypatch, caplog
):
    import errno

    def refuse(fd, operation, code=errno.ENOLCK):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(run_lock.fcntl, "flock", refuse)
    assert run_lock.try_claim(tmp_path) is None
    (said,) = [r.getMessage() for r in caplog.records if r.name == "repro.core.runs.run_lock"]
    assert said == (
        f"{tmp_path}: this file system cannot lock files ({os.strerror(errno.ENOLCK)}); a second "
        "launch into this folder would not be refused"
    )
    assert tmp_path.absolute() not in run_lock._held
    monkeypatch.setattr(run_lock.fcntl, "flock", lambda fd, op: refuse(fd, op, errno.EIO))
    with pytest.raises(OSError, match="Input/output error"):
        run_lock.try_claim(tmp_path)


def test_a_claim_on_nfs_without_shared_locks_warns_that_other_nodes_are_not_refused(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(run_lock, "host_only_locks", lambda folder: "local_lock=all")
    try:
        assert run_lock.try_claim(tmp_path) is None
    finally:
        run_lock.release(tmp_path)
    (said,) = [r.getMessage() for r in caplog.records if r.name == "repro.core.runs.run_lock"]
    assert said == (
        f"{tmp_path} is on NFS mounted with local_lock=all: its lock is seen on this host only, "
        "so a launch into it from another node would not be refused"
    )


def test_only_rank_0_claims_and_every_rank_hears_its_answer(tmp_path, monkeypatch):
    from repro.core.runtime.distributed import Context

    told = []

    def broadcast(value, dist):
        told.append(value)
        return "pid 9 on rank0host, since then" if len(told) == 2 else value

    monkeypatch.setattr(run_lock.distributed, "broadcast", broadcast)
    in_use = r"\(pid 9 on rank0host, since then\)"
    with (
        pytest.raises(run_lock.RunFolderInUseError, match=in_use),
        run_lock.owned(tmp_path / "run", Context(rank=1, world=2)),
    ):
        pass
    assert told == [None, None] and not (tmp_path / "run").exists()  # rank 1 made nothing


MORE_MOUNTS = """\
malformed line without its separator
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:50 / /cluster rw,relatime shared:2 master:1 - nfs4 server:/export rw,local_lock=flock
41 40 0:51 / /cluster/my\\040runs rw,nolock - nfs server:/runs rw,vers=3
42 40 0:52 / /cluster/all rw - nfs server:/all rw,local_lock=all
43 40 0:53 / /cluster/all rw - nfs server:/all rw,local_lock=none
"""


@pytest.mark.parametrize(
    ("folder", "option"),
    [("/cluster/x", "local_lock=flock"),  # optional fields before the separator
     ("/cluster/my runs/run", "nolock"),  # a space, written \\040; the mount's own options
     ("/cluster/all/run", None),  # the later of two mounts at one point is the one seen
     ("/work", None)],
)  # fmt: skip
def test_the_deepest_mount_holding_a_folder_decides_whether_its_locks_are_shared(folder, option):
    assert run_lock.host_only_locks(Path(folder), MORE_MOUNTS) == option
    root = "1 0 0:1 / / rw - nfs4 server:/ rw,local_lock=all\n"  # the whole tree on NFS
    assert run_lock.host_only_locks(Path("/work/run"), root) == "local_lock=all"
    earlier = MORE_MOUNTS.rsplit("\n", 2)[0]  # without the last mount over /cluster/all
    assert run_lock.host_only_locks(Path("/cluster/all"), earlier) == "local_lock=all"


def test_a_claim_makes_its_folder_and_a_lock_file_of_one_line_readable_by_all(tmp_path):
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    (folder / run_lock.LOCK_FILE).write_text("x" * 500 + "\n")  # a dead owner's, longer
    deeper = tmp_path / "new" / "deeper"
    previous = os.umask(0o022)
    try:
        assert run_lock.try_claim(folder) is None and run_lock.try_claim(deeper) is None
    finally:
        os.umask(previous)
    try:
        text = (folder / run_lock.LOCK_FILE).read_text()
        record = json.loads(text)
        assert text == json.dumps(record) + "\n" and list(record) == ["pid", "host", "since"]
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", record["since"])
        assert (deeper / run_lock.LOCK_FILE).stat().st_mode & 0o777 == 0o644
    finally:
        run_lock.release(folder)
        run_lock.release(deeper)


def test_releasing_a_folder_not_held_or_whose_lock_file_is_gone_is_quiet(tmp_path):
    run_lock.release(tmp_path / "never claimed")
    assert run_lock.try_claim(tmp_path) is None
    (tmp_path / run_lock.LOCK_FILE).unlink()  # someone removed it
    run_lock.release(tmp_path)
    assert tmp_path.absolute() not in run_lock._held


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_a_claim_that_locked_a_replaced_file_tries_again_without_leaking(tmp_path, monkeypatch):
    answers = iter([False, True])  # the first file locked was no longer the folder's
    monkeypatch.setattr(run_lock, "_still_named", lambda fd, path: next(answers))
    opened = len(os.listdir("/proc/self/fd"))
    assert run_lock.try_claim(tmp_path) is None
    assert len(os.listdir("/proc/self/fd")) == opened + 1  # the held one only
    run_lock.release(tmp_path)
