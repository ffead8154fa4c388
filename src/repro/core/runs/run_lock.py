"""One live process owns a run folder: an advisory lock on the folder's `run.lock`.

A second launch into a folder whose run is alive (the same command twice, a SLURM requeue
racing the job it replaces) is refused before it writes anything there. The kernel drops the
lock when its owner dies, however it dies, so a SIGKILLed run never blocks its own resume.
Under torchrun rank 0 holds it for every rank; each job of a sweep holds its own folder's.

The lock is taken as early as a job can: when Hydra asks `record_subdir` whether to write
`.hydra/` (before it writes it), and again, on the same descriptor, when training starts.
run.lock names its owner while it lives; the owner removes it on leaving (a dead owner's file
stays behind, unlocked, and the next run takes it over). A claim that locked a file removed
meanwhile tries again on the folder's new one, so two claims never both win.
A file system that cannot lock (NFS without lockd, some FUSE mounts) answers ENOLCK or
EOPNOTSUPP: the run goes on, with a warning that a second launch would not be refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from repro.core.errors import UserError
from repro.core.guards import folders
from repro.core.runtime import distributed

LOCK_FILE = "run.lock"
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)

log = logging.getLogger(__name__)
_held: dict[Path, int] = {}  # run folder -> the descriptor that holds its lock


class RunFolderInUseError(UserError):
    """Another live process trains in the run folder."""

    noted_in_log = False  # the folder's train.log is the live run's, not ours


def try_claim(run_dir: Path) -> str | None:
    """Take `run_dir`'s lock for this process (kept if it holds it already): None once it is
    ours, else who holds it (pid, host, since when). UnsafeFolderError, with nothing written,
    for a folder with a link out of it (run.lock among them)."""
    folder = run_dir.absolute()
    if folder in _held:
        return None
    folders.check(folder)
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC  # a link is refused
        fd = os.open(folder / LOCK_FILE, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            return owner
        except OSError as error:
            os.close(fd)
            if error.errno not in NO_LOCKS:
                raise
            log.warning(
                "%s: this file system cannot lock files (%s); a second launch into this "
                "folder would not be refused",
                folder,
                error.strerror,
            )
            return None
        if _still_named(fd, folder / LOCK_FILE):
            break
        os.close(fd)  # locked a file its owner removed on leaving: take the folder's new one
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%FT%T%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    _held[folder] = fd
    option = host_only_locks(folder)
    if option is not None:
        log.warning(
            "%s is on NFS mounted with %s: its lock is seen on this host only, so a launch "
            "into it from another node would not be refused",
            folder,
            option,
        )
    return None


def _still_named(fd: int, path: Path) -> bool:
    """Whether `path` is still the file `fd` has open."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _owner(fd: int) -> str:
    try:
        owner = json.loads(os.pread(fd, 4096, 0))
        return f"pid {owner['pid']} on {owner['host']}, since {owner['since']}"
    except (OSError, ValueError, KeyError, TypeError):  # the owner is still writing it
        return "pid not yet recorded"


def release(run_dir: Path) -> None:
    """Let go of `run_dir`'s lock, if this process holds it, and remove run.lock: a folder
    holds one only while a process trains there (or one that died left it, unlocked)."""
    folder = run_dir.absolute()
    fd = _held.pop(folder, None)
    if fd is not None:
        (folder / LOCK_FILE).unlink(missing_ok=True)  # before the unlock: no one holds it then
        os.close(fd)


def host_only_locks(folder: Path, mountinfo: str | None = None) -> str | None:
    """The mount option that keeps locks in `folder` on this host (an NFS mount with `nolock`
    or `local_lock=all|flock`), or None. `mountinfo`: /proc/self/mountinfo's text."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None  # not Linux: nothing to tell
    best = ("", "", "")
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        end = fields.index("-", 6)
        point = fields[4].replace("\\040", " ")
        inside = folder == Path(point) or Path(point) in folder.parents
        if inside and len(point) >= len(best[0]):
            best = (point, fields[end + 1], f"{fields[5]},{fields[end + 3]}")
    _, kind, options = best
    if not kind.startswith("nfs"):
        return None
    local = [o for o in ("nolock", "local_lock=all", "local_lock=flock") if o in options.split(",")]
    return local[0] if local else None


@contextlib.contextmanager
def owned(run_dir: Path, dist: distributed.Context) -> Iterator[None]:
    """Own `run_dir` for the block, or raise on every rank before it starts: UnsafeFolderError
    for a folder with a link out of it, RunFolderInUseError for one a live process owns."""
    unsafe = folders.problem(run_dir) if dist.is_main else None
    if (unsafe := distributed.broadcast(unsafe, dist)) is not None:
        raise folders.UnsafeFolderError(unsafe)
    owner = try_claim(run_dir) if dist.is_main else None
    owner = distributed.broadcast(owner, dist)
    if owner is not None:
        raise RunFolderInUseError(
            f"{run_dir} is in use by a live run ({owner}); a second process there would "
            "overwrite its checkpoints and logs: wait for it to end or stop it, then run the "
            "same command to resume, or choose another folder (hydra.run.dir=...)"
        )
    try:
        yield
    finally:
        release(run_dir)


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) shares the descriptor: closing its copy keeps the
    # lock with the parent alone, so the parent's death frees it at once.
    for fd in _held.values():
        os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
