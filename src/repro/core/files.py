"""Writing files so that a reader never sees half of one: write aside, then rename over."""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from repro.core.errors import StorageError


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """What the file system refuses while the block writes `path` (a full disk, a read-only
    mount, a lost permission) comes out as one StorageError naming `path`."""
    try:
        yield
    except OSError as error:
        raise StorageError(path, error) from None


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write to: when the block ends it replaces `path` in
    one step; if the block raises, it is removed and `path` is left as it was. The name is
    new and unguessable, so no link planted in a received folder waits under it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with writing(path):
            tmp.unlink(missing_ok=True)  # a link is removed, never followed
            yield tmp
            tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def open_in_place(path: Path, mode: str = "a", newline: str | None = None) -> IO[Any]:
    """`path` opened to append (`a`, `ab`) or to overwrite where it is (`wb`), as the files of
    a run folder that may come from someone else are: never through a link (`O_NOFOLLOW`),
    never a FIFO or device, never a file with a second hard link (an OSError, which
    `writing` names). Nothing is truncated before those checks."""
    # O_NONBLOCK: opening a FIFO to write would otherwise wait forever for a reader; without
    # one it fails at once (ENXIO), and with one it is refused below as no regular file.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(path, flags | (os.O_APPEND if "a" in mode else 0), 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            why = "not a regular file, or a file with another hard link: refused"
            raise OSError(errno.EPERM, why, str(path))
        os.set_blocking(fd, True)
        if "w" in mode:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, mode, newline=newline) if "b" not in mode else os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def complete_lines(text: str) -> str:
    """`text` without a last line cut short (an append that a full disk or a kill tore)."""
    return text if text.endswith("\n") else text[: text.rfind("\n") + 1]


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step; a crash leaves the old file or the new one."""
    with atomic_path(path) as tmp, tmp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def json_text(payload: Any) -> str:
    """The project's JSON files: indented, keys sorted, a final newline."""
    return json.dumps(payload, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: Path, payload: Any) -> None:
    write_text_atomic(path, json_text(payload))
