"""repro.shards.store unit by unit, against moto's S3 in this process: where a store's files
are, the cache's folder and keys, each S3 failure in one line, a download checked whole before
it is kept, and what the cache keeps within its bound."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import pytest

from repro.core.errors import DataError
from repro.shards import store
from repro.shards.format import Shard
from repro.shards.store import LocalStore, S3Store, open_store


def _shard(name: str, data: bytes) -> Shard:
    digest = hashlib.sha256(data).hexdigest()
    return Shard(name, len(data), digest, np.zeros((0, 4), dtype=np.int64))


def test_a_path_or_file_url_is_a_local_store_and_s3_an_object_store(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for url in ("~/data", f"file://{tmp_path}/data", f"{tmp_path}/data"):
        local = open_store(url, None, 1.0, None)
        assert isinstance(local, LocalStore) and local.root == tmp_path / "data"
        assert local.url == str(tmp_path / "data")
    remote = open_store("s3://bucket/some/prefix/", str(tmp_path / "c"), 2.0, "http://e")
    assert isinstance(remote, S3Store)
    assert (remote.url, remote.bucket) == ("s3://bucket/some/prefix", "bucket")
    assert remote.prefix == "some/prefix"
    assert remote.endpoint_url == "http://e" and remote.limit == 2 * (1 << 30)
    assert remote.cache.parent == tmp_path / "c"
    assert remote.key("m.json") == "some/prefix/m.json"
    assert S3Store("s3://bucket", None, 1.0, None).key("m.json") == "m.json"


def test_the_cache_folder_is_one_per_endpoint_and_url_under_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    one = S3Store("s3://bkt/p", None, 1.0, None)
    assert one.cache.parent == tmp_path / "xdg" / "repro" / "shards" and one.root == one.cache
    expected = hashlib.sha256(b"None|s3://bkt/p").hexdigest()[:16]
    assert one.cache.name == expected
    assert S3Store("s3://bkt/p", None, 1.0, "http://other").cache != one.cache
    assert S3Store("s3://bkt/q", None, 1.0, None).cache != one.cache
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store.default_cache() == tmp_path / "home" / ".cache" / "repro" / "shards"
    mine = S3Store("s3://bkt/p", "~/cache", 1.0, None)
    assert mine.cache == tmp_path / "home" / "cache" / expected


def test_a_local_shard_is_read_where_it_is_if_its_size_is_the_manifests(tmp_path):
    data = b"x" * 700
    (tmp_path / "a.tar").write_bytes(data)
    local = LocalStore(tmp_path)
    assert local.path(_shard("a.tar", data)) == tmp_path / "a.tar"
    with pytest.raises(DataError) as missing:
        local.path(_shard("b.tar", data))
    assert str(missing.value) == f"shard {tmp_path}/b.tar: missing (the manifest lists it)"
    with pytest.raises(DataError) as resized:
        local.path(_shard("a.tar", data + b"y"))
    assert str(resized.value) == (
        f"shard {tmp_path}/a.tar: 700 bytes, the manifest says 701: damaged, or not the shard "
        "the manifest lists; pack the data again"
    )
    with pytest.raises(DataError) as no_manifest:
        local.manifest()
    assert str(no_manifest.value).startswith(f"data.root={tmp_path}: manifest.json: ")
    assert str(no_manifest.value).endswith(
        "expected a folder of shards with manifest.json (python -m repro.shards pack)"
    )
    (tmp_path / "manifest.json").write_bytes(b'{"m": 1}')
    assert local.manifest() == b'{"m": 1}'


@pytest.fixture
def bucket(s3_in_process):
    """moto's S3 in this process, with one bucket: a client to fill it."""
    s3_in_process.create_bucket(Bucket="bkt")
    return s3_in_process


def test_a_shard_is_downloaded_once_checked_whole_and_kept(bucket, tmp_path):
    data = b"shard bytes " * 100
    bucket.put_object(Bucket="bkt", Key="p/a.tar", Body=data)
    bucket.put_object(Bucket="bkt", Key="p/manifest.json", Body=b"{}")
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, None)
    assert remote.manifest() == b"{}"
    path = remote.path(_shard("a.tar", data))
    assert path == remote.cache / "a.tar" and path.read_bytes() == data
    bucket.delete_object(Bucket="bkt", Key="p/a.tar")
    assert remote.path(_shard("a.tar", data)).read_bytes() == data  # from the cache
    assert sorted(p.name for p in remote.cache.iterdir()) == [".a.tar.lock", "a.tar"]
    assert remote.client() is remote.client()  # one client per process
    assert remote.__getstate__()["_client"] is None  # a spawned worker makes its own


def test_a_download_whose_digest_is_not_the_manifests_is_refused_and_not_kept(bucket, tmp_path):
    bucket.put_object(Bucket="bkt", Key="p/a.tar", Body=b"what the bucket holds")
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, None)
    listed = _shard("a.tar", b"what the manifest says!")
    with pytest.raises(DataError) as refused:
        remote.path(listed)
    assert str(refused.value) == (
        "shard s3://bkt/p/a.tar: its SHA-256 is not the manifest's: damaged, or not the shard "
        "the manifest lists; pack and upload the data again"
    )
    assert [p.name for p in remote.cache.iterdir()] == [".a.tar.lock"]  # no .part, no shard
    same_size = _shard("a.tar", b"what the bucket holdz")  # the size alone is not enough
    with pytest.raises(DataError, match="its SHA-256 is not the manifest's"):
        remote.path(same_size)


def test_a_missing_key_or_bucket_is_one_line(bucket, tmp_path):
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, None)
    with pytest.raises(DataError) as missing:
        remote.manifest()
    assert str(missing.value) == "s3://bkt/p/manifest.json: missing"
    nowhere = S3Store("s3://no-such-bucket/p", str(tmp_path), 1.0, None)
    with pytest.raises(DataError) as refused:
        nowhere.manifest()
    assert str(refused.value) == "s3://no-such-bucket/p/manifest.json: refused (NoSuchBucket)"


def test_an_unreachable_endpoint_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, "http://127.0.0.1:9")
    remote.client().meta.config.retries = {"max_attempts": 0}
    with pytest.raises(DataError) as unreachable:
        remote.manifest()
    assert str(unreachable.value).startswith("s3://bkt/p: cannot reach the bucket (")


def test_the_cache_keeps_what_fits_and_evicts_the_oldest_first(tmp_path):
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, None)
    remote.cache.mkdir(parents=True)
    for age, name in enumerate(("old.tar", "mid.tar", "new.tar")):
        (remote.cache / name).write_bytes(b"x" * 100)
        store.os.utime(remote.cache / name, (1000 + age, 1000 + age))
    (remote.cache / ".old.tar.lock").write_bytes(b"")
    (remote.cache / "notes.txt").write_bytes(b"y" * 1000)  # not a shard: never counted
    remote.limit = 300
    remote._evict(keep=remote.cache / "new.tar")
    assert sorted(p.name for p in remote.cache.glob("*.tar")) == ["mid.tar", "new.tar", "old.tar"]
    remote.limit = 200
    remote._evict(keep=remote.cache / "old.tar")  # the one just fetched stays, however old
    assert sorted(p.name for p in remote.cache.glob("*.tar")) == ["new.tar", "old.tar"]
    remote.limit = 50
    remote._evict(keep=remote.cache / "new.tar")
    assert sorted(p.name for p in remote.cache.iterdir()) == [
        ".old.tar.lock",
        "new.tar",
        "notes.txt",
    ]


def test_a_cached_shard_is_fresh_only_at_the_manifests_size(tmp_path):
    data = b"z" * 10
    assert not store._fresh(tmp_path / "a.tar", _shard("a.tar", data))
    (tmp_path / "a.tar").write_bytes(data[:9])
    assert not store._fresh(tmp_path / "a.tar", _shard("a.tar", data))
    (tmp_path / "a.tar").write_bytes(data)
    assert store._fresh(tmp_path / "a.tar", _shard("a.tar", data))
    (tmp_path / "b.tar").symlink_to(tmp_path / "a.tar")
    # A link in the cache is no cached shard, even to a file of the right size.
    assert not store._fresh(tmp_path / "b.tar", _shard("b.tar", data))


def test_a_download_is_kept_with_its_mode_in_a_cache_folder_made_for_it(bucket, tmp_path):
    data = b"s" * 300
    bucket.put_object(Bucket="bkt", Key="p/a.tar", Body=data)
    remote = S3Store("s3://bkt/p", str(tmp_path / "deep" / "er"), 1.0, None)
    remote.limit = 100  # smaller than the shard: the one just fetched is kept all the same
    umask = os.umask(0o022)  # the usual one: 0o644 stays 0o644
    try:
        path = remote.path(_shard("a.tar", data))
    finally:
        os.umask(umask)
    assert path.read_bytes() == data and path.parent.parent.parent == tmp_path / "deep"
    assert path.stat().st_mode & 0o777 == 0o644


def test_eviction_stops_as_soon_as_the_cache_fits(tmp_path):
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, None)
    remote.cache.mkdir(parents=True)
    for age, (name, size) in enumerate((("old.tar", 50), ("mid.tar", 300), ("new.tar", 100))):
        (remote.cache / name).write_bytes(b"x" * size)
        store.os.utime(remote.cache / name, (1000 + age, 1000 + age))
    remote.limit = 150
    remote._evict(keep=remote.cache / "new.tar")
    assert [p.name for p in remote.cache.glob("*.tar")] == ["new.tar"]


def test_the_client_has_bounded_timeouts_and_retries_and_the_stores_endpoint(tmp_path, monkeypatch):
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    remote = S3Store("s3://bkt/XdataX/", str(tmp_path), 1.0, "http://127.0.0.1:9000")
    assert (remote.url, remote.prefix) == ("s3://bkt/XdataX", "XdataX")
    client = remote.client()
    config = client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (5, 60)
    assert config.retries["total_max_attempts"] == 4  # botocore counts the first try too
    assert client.meta.endpoint_url == "http://127.0.0.1:9000"


def test_without_boto3_the_store_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(DataError) as missing:
        S3Store("s3://bkt/p", str(tmp_path), 1.0, None).client()
    assert str(missing.value) == (
        "data.root=s3://bkt/p: needs boto3 (install the s3 extra: uv sync --extra s3)"
    )


@pytest.mark.parametrize(
    ("response", "said"),
    [
        ({"Error": {"Code": "404"}}, "missing"),
        ({}, "refused (error)"),
        ({"Error": {}}, "refused (error)"),
        ({"Error": {"Code": "AccessDenied"}}, "refused (AccessDenied)"),
    ],
)
def test_each_answer_of_the_server_is_named(tmp_path, monkeypatch, response, said):
    botocore = pytest.importorskip("botocore.exceptions")
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, None)

    class Client:
        def get_object(self, **kwargs):
            raise botocore.ClientError(response, "GetObject")

    monkeypatch.setattr(remote, "client", Client)
    with pytest.raises(DataError) as refused:
        remote.manifest()
    assert str(refused.value) == f"s3://bkt/p/manifest.json: {said}"


def test_a_download_that_breaks_off_or_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    botocore = pytest.importorskip("botocore.exceptions")
    remote = S3Store("s3://bkt/p", str(tmp_path), 1.0, None)

    class Broken:
        def read(self, size):
            raise botocore.ReadTimeoutError(endpoint_url="http://s3")

    monkeypatch.setattr(remote, "_get", lambda name: Broken())
    with pytest.raises(DataError) as broken:
        remote.path(_shard("a.tar", b"data"))
    assert str(broken.value).startswith("shard s3://bkt/p/a.tar: download failed (Read timeout")
    monkeypatch.setattr(store.secrets, "token_hex", lambda n: "fixed")
    (remote.cache / f".a.tar.{os.getpid()}.fixed.part").write_bytes(b"")  # the name is taken
    with pytest.raises(DataError) as unwritable:
        remote.path(_shard("a.tar", b"data"))
    assert str(unwritable.value) == f"shard cache {remote.cache}: File exists"


def test_a_shard_that_is_no_regular_file_is_named_by_its_store(tmp_path):
    os.mkfifo(tmp_path / "a.tar")
    local = LocalStore(tmp_path)
    shard = _shard("a.tar", b"")  # a FIFO's size is 0
    with pytest.raises(DataError) as refused:
        store.open_shard(local, shard)
    assert str(refused.value).startswith(f"shard {tmp_path}/a.tar: ")
