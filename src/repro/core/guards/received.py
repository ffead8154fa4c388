"""The one way in for bytes someone else made (docs/security.md): a run or sweep folder's
records, a checkpoint, a manifest, a shard, a dataset's images.

Every such file is opened here, and only here (tests/test_received_boundary.py says so):
without following a link at its last step (`O_NOFOLLOW`) nor out of the folder the command
named at any step (the open descriptor's own path is compared, not the path we were given),
regular files only (`fstat`: a FIFO or a device would hang or never end), a second hard link
only where every link lies inside that folder, and at most the size its kind may have. What
is parsed from it is plain data: YAML and JSON without resolvers or tags, checkpoints with
`weights_only=True`, all three walked with a cap on nesting and on nodes (a node reached
twice counts twice, so a few shared references cannot stand for billions), images measured
from their header before a pixel is decoded. Each refusal is one ReceivedFileError line.
"""

from __future__ import annotations

import io
import json
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import yaml

from repro.core.errors import UserError
from repro.core.text import for_terminal

MiB, GiB = 2**20, 2**30
# The most a file of each kind may hold: far above what repro writes (a resolved config is
# ~10 KB, a CIFAR-10 JPEG 1 KB), far below what would exhaust a machine's memory.
SIZE_LIMITS = {
    "record": 8 * MiB,  # YAML, JSON and text records: configs, summaries, overrides, errors
    "table": 2 * GiB,  # metrics.csv, attempts.jsonl, fingerprints.csv, a dataset's listing
    "manifest": 256 * MiB,  # a shard set's manifest.json
    "checkpoint": 64 * GiB,
    "shard": 64 * GiB,
    "image": 256 * MiB,
}
# Read by the million, and often hard-linked on purpose (a deduplicated dataset): for these a
# second hard link is allowed. One that leads out of a received folder can only be made on
# this machine, by someone who can read its target already.
LINKED_KINDS = ("image", "shard")
MAX_DEPTH = 64  # nesting of a parsed record or checkpoint (ours reach ~8)
MAX_NODES = 2_000_000  # values visited in one, counting every reference to a shared one
MAX_PIXELS = 2**27  # 134 M pixels (11585 x 11585): about 0.4 GB as RGB once decoded


class ReceivedFileError(UserError):
    """A file from someone else that is refused before it is read or parsed: `why`, and the
    message naming the file."""

    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(f"{for_terminal(str(path))}: {why}")
        self.why = why


def _refuse(path: Path | str, why: str) -> ReceivedFileError:
    return ReceivedFileError(path, why)


def open_file(path: Path | str, kind: str, root: Path | str | None = None) -> IO[bytes]:
    """`path` open for reading as a file of `kind`, every check above made on the descriptor;
    the caller closes it (`opened` does, for a block). `root`: the folder the command named (a
    run folder, a dataset's root); the file and the folders on the way to it must lie inside
    it. Without one, the file's own folder."""
    path = Path(path)
    limit = SIZE_LIMITS[kind]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _refuse(path, "no such file") from None
    except OSError as error:
        if path.is_symlink():
            raise _refuse(
                path,
                "a symbolic link: files from others are read as they are, "
                "not through links; put a copy of its target in its place",
            ) from None
        raise _refuse(path, f"cannot be read ({error.strerror or error})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind_of_file = _file_type(info.st_mode)
            hangs = "" if kind_of_file == "folder" else ", reading it could wait or never end"
            raise _refuse(path, f"a {kind_of_file}, not a regular file: refused{hangs}")
        inside = Path(os.path.realpath(root if root is not None else path.parent))
        where = _descriptor_path(fd, path)
        if where != inside and inside not in where.parents:
            raise _refuse(
                path,
                f"lies outside {for_terminal(str(inside))} once its links are "
                f"followed ({for_terminal(str(where))}): refused",
            )
        if (
            kind not in LINKED_KINDS
            and info.st_nlink > 1
            and _links_inside(inside, info) < info.st_nlink
        ):
            raise _refuse(
                path,
                "has a hard link outside its folder: refused, it is another "
                "file's contents; replace it by a copy of its own",
            )
        if info.st_size > limit:
            raise _refuse(
                path, f"{info.st_size} bytes, more than a {kind} file may hold ({limit} bytes)"
            )
        os.set_blocking(fd, True)
        return io.BufferedReader(_Capped(os.fdopen(fd, "rb"), limit, path, kind))
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def opened(path: Path | str, kind: str, root: Path | str | None = None) -> Iterator[IO[bytes]]:
    """`open_file` for the length of a block."""
    with open_file(path, kind, root) as handle:
        yield handle


def read_bytes(path: Path | str, kind: str, root: Path | str | None = None) -> bytes:
    """The whole file, opened as `opened` opens it."""
    with opened(path, kind, root) as handle:
        return handle.read()


def read_text(path: Path | str, kind: str = "record", root: Path | str | None = None) -> str:
    """The whole file as UTF-8 text."""
    data = read_bytes(path, kind, root)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, "not UTF-8 text") from None


def load_yaml(path: Path | str, root: Path | str | None = None) -> Any:
    """A YAML record as plain data: safe_load (no tags, no code), never resolved by OmegaConf
    (`${...}` stays text), its shape capped. Damage is one ReceivedFileError line."""
    return parse_yaml(read_text(path, "record", root), path)


def parse_yaml(text: str, source: Path | str) -> Any:
    """`load_yaml` for text already read through this module."""
    try:
        _check_yaml_events(text, source)  # before composing: libyaml's composer recurses in C
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        said = getattr(error, "problem", None) or getattr(error, "context", None)
        raise _refuse(source, f"not valid YAML{where}" + (f" ({said})" if said else "")) from None


def _check_yaml_events(text: str, source: Path | str) -> None:
    """`check_shape` on YAML's event stream, before any node is built: depth from the
    open collections, size with each alias counted as the whole node it repeats."""
    sizes: dict[str, int] = {}  # anchor -> values in its node, aliases expanded
    counts = [0]  # values so far in each open collection (the document's at the bottom)
    anchors: list[str | None] = [None]
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            counts[-1] += sizes.get(event.anchor, 1)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            counts.append(1)
            anchors.append(event.anchor)
            if len(counts) > MAX_DEPTH + 1:
                raise _refuse(source, f"nested deeper than {MAX_DEPTH} levels: refused")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, anchor = counts.pop(), anchors.pop()
            counts[-1] += size
            if anchor is not None:
                sizes[anchor] = size
        elif isinstance(event, yaml.ScalarEvent):
            counts[-1] += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        if counts[-1] > MAX_NODES:
            raise _refuse(
                source,
                f"more than {MAX_NODES} values (an alias counted as the node it repeats): refused",
            )


def load_json(path: Path | str, kind: str = "record", root: Path | str | None = None) -> Any:
    """A JSON record as plain data, its shape capped."""
    return parse_json(read_text(path, kind, root), path)


def parse_json(text: str | bytes, source: Path | str) -> Any:
    """`load_json` for text already read through this module (a line of attempts.jsonl)."""
    try:
        found = json.loads(text)
    except RecursionError:
        raise _refuse(source, "nested too deep") from None
    except json.JSONDecodeError as error:
        said = f"{error.msg} at line {error.lineno} column {error.colno}"
        raise _refuse(source, f"not valid JSON ({said})") from None
    except ValueError:  # bytes that are no UTF-8
        raise _refuse(source, "not valid JSON (not UTF-8 text)") from None
    check_shape(found, source)
    return found


def load_checkpoint(path: Path | str, root: Path | str | None = None, mmap: bool = False) -> Any:
    """A checkpoint's contents: torch.load with weights_only=True (no pickle runs code) from
    the checked descriptor, its shape capped. Errors of torch.load pass to the caller, which
    names them for its kind of file."""
    import torch

    with opened(path, "checkpoint", root) as handle:
        if mmap:  # torch maps a file by name: the descriptor's own, not the path again
            found = torch.load(
                f"/proc/self/fd/{handle.fileno()}", map_location="cpu", weights_only=True, mmap=True
            )
        else:
            found = torch.load(handle, map_location="cpu", weights_only=True)
    check_shape(found, path)
    return found


def parse_checkpoint(contents: bytes, source: Path | str) -> Any:
    """`load_checkpoint` for bytes already read through this module."""
    import torch

    found = torch.load(io.BytesIO(contents), map_location="cpu", weights_only=True)
    check_shape(found, source)
    return found


def check_shape(value: Any, source: Path | str) -> None:
    """Refuse parsed data nested deeper than MAX_DEPTH or with more than MAX_NODES values,
    a shared value counted at each reference (what a walk over it would visit)."""
    visited = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        visited += 1
        if visited > MAX_NODES:
            raise _refuse(
                source,
                f"more than {MAX_NODES} values (shared references counted at each use): refused",
            )
        if depth > MAX_DEPTH:
            raise _refuse(source, f"nested deeper than {MAX_DEPTH} levels: refused")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for pair in item.items() for child in pair)
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((child, depth + 1) for child in item)


def check_pixels(data: bytes, source: Path | str) -> None:
    """Refuse an image whose header asks for more than MAX_PIXELS, before decoding it."""
    from PIL import Image

    try:
        size = image_size(data)
    except Image.DecompressionBombError as error:
        raise _refuse(source, f"{error} (more pixels than may be decoded): refused") from None
    if size is not None and size[0] * size[1] > MAX_PIXELS:
        width, height = size
        raise _refuse(
            source,
            f"an image of {width} x {height} pixels, more than "
            f"{MAX_PIXELS} may be decoded: refused",
        )


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image's header: PNG and JPEG read here (the datasets' formats,
    on every item), others through PIL's lazy open, which decodes nothing. None: no header
    found, and the decoder will say so."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Image.DecompressionBombError:
        raise  # PIL measured it first: over twice its own cap
    except Exception:  # not an image PIL knows: the decoder's own error names it
        return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The frame size of a JPEG: the first start-of-frame marker's height and width."""
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + struct.unpack(">H", data[at + 2 : at + 4])[0]
    return None


class _Loader(yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader (libyaml's where built): plain values only."""


class _Capped(io.RawIOBase):
    """A received file's reads, stopped at its kind's limit: a file that grows while we read
    it (or lied in fstat) cannot make us read past it."""

    def __init__(self, handle: IO[bytes], limit: int, path: Path, kind: str) -> None:
        self.handle, self.limit, self.path, self.kind = handle, limit, path, kind

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()

    def fileno(self) -> int:
        return self.handle.fileno()

    def close(self) -> None:
        self.handle.close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        got = self.handle.readinto(buffer) or 0
        if self.handle.tell() > self.limit:
            raise _refuse(self.path, f"grew past what a {self.kind} file may hold")
        return got


def _descriptor_path(fd: int, given: Path) -> Path:
    """Where the open file lies, from the descriptor itself (Linux's /proc); elsewhere the
    path's real path, checked to be the same file as the descriptor."""
    try:
        return Path(f"/proc/self/fd/{fd}").readlink()
    except OSError:
        real = Path(os.path.realpath(given))
        if not os.path.samestat(real.stat(), os.fstat(fd)):
            raise _refuse(given, "changed while it was opened: refused") from None
        return real


def _links_inside(root: Path, info: os.stat_result) -> int:
    """How many names under `root` are this file (the hard links of checkpoints/ are ours)."""
    found = 0
    for folder, _, files in os.walk(root):  # links to folders are not followed
        for name in files:
            try:
                other = (Path(folder) / name).stat(follow_symlinks=False)
            except OSError:
                continue
            found += os.path.samestat(other, info)
    return found


def _file_type(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "FIFO",
        stat.S_ISCHR: "character device",
        stat.S_ISBLK: "block device",
        stat.S_ISSOCK: "socket",
        stat.S_ISDIR: "folder",
    }
    return next((name for test, name in kinds.items() if test(mode)), "special file")
