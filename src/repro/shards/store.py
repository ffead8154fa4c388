"""Where shards live: a local (or network-mounted) folder, or S3-compatible object storage
seen through a bounded local cache.

The cache holds whole shards, each downloaded once (a lock file keeps DataLoader workers of
one or several runs from fetching the same shard twice), checked against the manifest's
SHA-256 while it streams in, and renamed into place only when whole: a reader never sees half
a shard. Each use touches the file's modification time, and a download that takes the cache
past `cache_gib` evicts the least recently used shards first. A worker that has a shard open
keeps reading it if another evicts it (POSIX keeps unlinked files alive while open), so
eviction never breaks a read; at worst a shard is fetched again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from repro.core.errors import DataError
from repro.core.guards import received
from repro.shards.format import MANIFEST, Shard

CHUNK = 8 << 20


class Store(Protocol):
    url: str
    root: Path  # the local folder every file read lies in: the shards', or the cache

    def manifest(self) -> bytes: ...

    def path(self, shard: Shard) -> Path: ...  # a local file holding the shard's bytes


def open_shard(store: Store, shard: Shard) -> BinaryIO:
    """The shard's local file, open through the boundary (guards/received): a regular file
    inside the store's folder, no link out; the caller closes it."""
    path = store.path(shard)
    try:
        return received.open_file(path, "shard", store.root)
    except received.ReceivedFileError as error:
        raise DataError(f"shard {store.url}/{shard.name}: {error.why}") from None


def open_store(
    url: str, cache_dir: str | None, cache_gib: float, endpoint_url: str | None
) -> Store:
    if url.startswith("s3://"):
        return S3Store(url, cache_dir, cache_gib, endpoint_url)
    return LocalStore(Path(url.removeprefix("file://")).expanduser())


class LocalStore:
    """A folder of shards, read in place."""

    def __init__(self, root: Path) -> None:
        self.root, self.url = root, str(root)

    def manifest(self) -> bytes:
        try:
            return received.read_bytes(self.root / MANIFEST, "manifest", self.root)
        except received.ReceivedFileError as error:
            expected = f"a folder of shards with {MANIFEST} (python -m repro.shards pack)"
            raise DataError(
                f"data.root={self.url}: {MANIFEST}: {error.why}; expected {expected}"
            ) from None

    def path(self, shard: Shard) -> Path:
        path = self.root / shard.name
        return check_size(path, shard, f"{self.url}/{shard.name}")


def check_size(path: Path, shard: Shard, named: str) -> Path:
    """`path`, if it holds as many bytes as the manifest says the shard has."""
    try:
        size = path.stat().st_size
    except OSError:
        raise DataError(f"shard {named}: missing (the manifest lists it)") from None
    if size != shard.size:
        raise DataError(
            f"shard {named}: {size} bytes, the manifest says {shard.size}: damaged, or not "
            "the shard the manifest lists; pack the data again"
        )
    return path


class S3Store:
    """s3://bucket/prefix through boto3 (credentials and region as boto3 finds them; the
    endpoint from `endpoint_url` or AWS_ENDPOINT_URL, for MinIO, Ceph, R2 ...)."""

    def __init__(
        self, url: str, cache_dir: str | None, cache_gib: float, endpoint_url: str | None
    ) -> None:
        self.url, self.endpoint_url = url.rstrip("/"), endpoint_url
        self.bucket, _, self.prefix = url.removeprefix("s3://").partition("/")
        self.prefix = self.prefix.strip("/")
        digest = hashlib.sha256(f"{endpoint_url}|{self.url}".encode()).hexdigest()[:16]
        base = Path(cache_dir).expanduser() if cache_dir else default_cache()
        self.cache = self.root = base / digest
        self.limit = int(cache_gib * (1 << 30))
        self._client: tuple[int, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker makes its own client
        return {**self.__dict__, "_client": None}

    def client(self) -> Any:
        # One client per process: boto3 clients are not safe to share across fork.
        if self._client is None or self._client[0] != os.getpid():
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise DataError(f"data.root={self.url}: needs boto3 (install the s3 extra: "
                                "uv sync --extra s3)") from None  # fmt: skip
            config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3})
            client = boto3.client("s3", endpoint_url=self.endpoint_url, config=config)
            self._client = (os.getpid(), client)
        return self._client[1]

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _get(self, name: str) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client().get_object(Bucket=self.bucket, Key=self.key(name))["Body"]
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "error")
            what = "missing" if code in ("NoSuchKey", "404") else f"refused ({code})"
            raise DataError(f"{self.url}/{name}: {what}") from None
        except BotoCoreError as error:
            raise DataError(f"{self.url}: cannot reach the bucket ({error})") from None

    def manifest(self) -> bytes:
        return self._get(MANIFEST).read()

    def path(self, shard: Shard) -> Path:
        path = self.cache / shard.name
        if not _fresh(path, shard):
            self.cache.mkdir(parents=True, exist_ok=True)
            with _lock_file(self.cache / f".{shard.name}.lock") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one download per shard, whoever asks
                if not _fresh(path, shard):
                    self._download(shard, path)
                    self._evict(keep=path)
        os.utime(path, follow_symlinks=False)  # the eviction order: least recently used first
        return path

    def _download(self, shard: Shard, path: Path) -> None:
        from botocore.exceptions import BotoCoreError

        tmp = path.with_name(f".{shard.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        digest = hashlib.sha256()
        try:
            body = self._get(shard.name)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(tmp, flags, 0o644), "wb") as handle:
                while block := body.read(CHUNK):
                    digest.update(block)
                    handle.write(block)
            if digest.hexdigest() != shard.sha256 or tmp.stat().st_size != shard.size:
                raise DataError(
                    f"shard {self.url}/{shard.name}: its SHA-256 is not the manifest's: damaged,"
                    " or not the shard the manifest lists; pack and upload the data again"
                )
            tmp.replace(path)
        except BotoCoreError as error:
            raise DataError(f"shard {self.url}/{shard.name}: download failed ({error})") from None
        except OSError as error:
            raise DataError(f"shard cache {self.cache}: {error.strerror}") from None
        finally:
            tmp.unlink(missing_ok=True)

    def _evict(self, keep: Path) -> None:
        """Delete the least recently used shards until the cache fits its limit."""
        held = []
        for path in self.cache.glob("*.tar"):
            try:
                stat = path.stat()
            except OSError:  # another process evicted it meanwhile
                continue
            held.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in held)
        for _, size, path in sorted(held):
            if total <= self.limit:
                break
            if path != keep:
                path.unlink(missing_ok=True)
                total -= size


@contextmanager
def _lock_file(path: Path) -> Iterator[int]:
    """The cache's lock for one shard, made or opened without following a link and never
    truncated: a lock planted in a cache folder from someone else cannot reach a file of
    yours. A link, a special file or a file with a second hard link there is refused."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise DataError(f"shard cache {path}: {error.strerror}: refused (a link?)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            raise DataError(f"shard cache {path}: not a lock file of its own: refused")
        yield fd
    finally:
        os.close(fd)


def _fresh(path: Path, shard: Shard) -> bool:
    """A cached shard is whole if it has the manifest's size: it was renamed into place only
    after its SHA-256 matched."""
    try:
        return path.stat(follow_symlinks=False).st_size == shard.size
    except OSError:
        return False


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "repro" / "shards"
