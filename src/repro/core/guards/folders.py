"""A run or sweep folder whose writes would land outside it is refused before any is made.

A folder copied with its links (`cp -a`) or assembled by hand may hold symlinks (run.lock,
metrics.csv, checkpoints/ ...) to files elsewhere: a resume there would truncate, append to,
create and delete files through them. So the entry points check a folder before they write
anything into it, run.lock included: a link whose target lies outside the folder (dangling or
not) is refused, as is a file written in place (appended or truncated, not renamed over) that
has a second hard link. Links inside the folder (wandb's `latest-run`) are harmless, and so are
the hard links of checkpoints/ (`last.pt` names a step file by design): those files are only
ever replaced by a rename; a file with a hard link outside the folder is refused whatever it
is. A FIFO, socket or device anywhere in the folder is refused too: the first open of one
would wait forever (Hydra's train.log) or never end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from repro.core.errors import UserError

# Appended to or truncated where they are (and every *.log: train.log), at any depth; Hydra
# rewrites its records in place too (multirun.yaml, .hydra/*.yaml).
IN_PLACE = {
    *("metrics.csv", "fingerprints.csv", "attempts.jsonl", "run.lock", ".attempts.reserve"),
    *(".mlflow_parent.lock", "multirun.yaml", "config.yaml", "hydra.yaml", "overrides.yaml"),
}


class UnsafeFolderError(UserError):
    """A link in a run or sweep folder that would carry a write out of it."""

    noted_in_log = False  # the folder's train.log may be such a link


def problem(folder: Path, kind: str = "run folder") -> str | None:
    """Why writing into `folder` could change a file outside it; None if it cannot (or the
    folder does not exist yet)."""
    if not folder.is_dir():
        return None
    root = Path(os.path.realpath(folder))
    linked: dict[tuple[int, int], list[Path]] = {}  # a file with hard links -> its names here
    links_of: dict[tuple[int, int], int] = {}
    for entry in _entries(folder):
        name = Path(entry.path).relative_to(folder)
        if entry.is_symlink():
            target = Path(os.path.realpath(entry.path))
            if target != root and root not in target.parents:
                return (
                    f"{folder}: {name} is a link to {target}, outside the {kind}: writing "
                    f"through it would change a file outside the {kind}; remove the link (or "
                    f"put a copy of its target in its place), or choose another {kind}"
                )
        elif not entry.is_dir(follow_symlinks=False) and not entry.is_file(follow_symlinks=False):
            return (
                f"{folder}: {name} is not a regular file (a FIFO, a socket or a device): "
                f"reading or writing it could wait forever; remove it, or choose another {kind}"
            )
        elif _in_place(entry) and entry.stat(follow_symlinks=False).st_nlink > 1:
            return (
                f"{folder}: {name} has another hard link: writing it would change that file, "
                f"wherever it is, too; replace it by a copy of its own (cp, then mv over it), "
                f"or choose another {kind}"
            )
        elif entry.is_file(follow_symlinks=False):
            info = entry.stat(follow_symlinks=False)
            if info.st_nlink > 1:
                linked.setdefault((info.st_dev, info.st_ino), []).append(name)
                links_of[(info.st_dev, info.st_ino)] = info.st_nlink
    for file, names in linked.items():  # checkpoints/ links its own files: those stay inside
        if len(names) < links_of[file]:
            return (
                f"{folder}: {names[0]} has a hard link outside the {kind}: it is another "
                f"file's contents; replace it by a copy of its own, or choose another {kind}"
            )
    return None


def check(folder: Path, kind: str = "run folder") -> None:
    """Raise UnsafeFolderError if writing into `folder` could change a file outside it."""
    if (message := problem(folder, kind)) is not None:
        raise UnsafeFolderError(message)


def check_sweep(sweep_dir: Path) -> None:
    """`check` for a sweep folder: its own files and its jobs' folders, a link among them too."""
    check(sweep_dir, "sweep folder")


def _in_place(entry: os.DirEntry) -> bool:
    named = entry.name in IN_PLACE or entry.name.endswith(".log")
    return named and entry.is_file(follow_symlinks=False)


def _entries(folder: Path) -> Iterator[os.DirEntry]:
    """Everything under `folder`, links listed but never followed."""
    with os.scandir(folder) as found:
        for entry in found:
            yield entry
            if entry.is_dir(follow_symlinks=False):
                yield from _entries(Path(entry.path))
