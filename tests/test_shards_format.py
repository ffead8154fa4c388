"""repro.shards.format unit by unit: the bytes a shard is written as (ustar headers that carry
nothing of the machine), the manifest's text, each member a reader refuses, and each manifest
entry refused in one line naming what is wrong."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from repro.core.errors import DataError
from repro.shards.format import (
    LARGEST,
    Shard,
    check_members,
    manifest_text,
    parse_manifest,
    sha256_of,
    write_shard,
)

SAMPLES = [("a", "png", b"\x89PNG" + b"x" * 700, 2), ("b", "jpg", b"\xff\xd8\xff" + b"y" * 10, 0)]


def test_a_shard_is_ustar_with_headers_that_carry_nothing_of_the_machine(tmp_path):
    entry = write_shard(tmp_path / "train-000000.tar", SAMPLES)
    data = (tmp_path / "train-000000.tar").read_bytes()
    assert entry["name"] == "train-000000.tar" and entry["bytes"] == len(data)
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert data[257:265] == b"ustar\x0000"  # POSIX ustar, not GNU or PAX
    with tarfile.open(tmp_path / "train-000000.tar") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["a.png", "a.cls", "b.jpg", "b.cls"]
        for member in members:
            assert (member.mode, member.mtime, member.uname, member.gname) == (0o644, 0, "", "")
            assert (member.uid, member.gid) == (0, 0)
        assert tar.extractfile("a.cls").read() == b"2"
        assert tar.extractfile("b.cls").read() == b"0"
    for (offset, size, label, crc), (_, _, image, expected) in zip(
        entry["index"], SAMPLES, strict=True
    ):
        assert data[offset : offset + size] == image
        assert (label, crc) == (expected, zlib.crc32(image))


def test_sha256_of_hashes_what_is_left_to_read():
    data = bytes(range(256)) * 9000  # past one block of reading
    handle = io.BytesIO(data)
    assert sha256_of(handle) == hashlib.sha256(data).hexdigest()
    handle.seek(1000)
    assert sha256_of(handle) == hashlib.sha256(data[1000:]).hexdigest()


def test_the_manifest_is_one_line_per_shard_with_sorted_keys():
    entry = {"sha256": "0" * 64, "name": "t.tar", "index": [[512, 3, 0, 7]], "bytes": 2048}
    text = manifest_text(["cat", "dog"], {"train": [entry, entry], "val": [entry]}, 4)
    lines = text.splitlines()
    assert lines[0] == '{"format": "repro-shards/1", "pack_seed": 4, "classes": ["cat", "dog"],'
    assert lines[2] == ' "train": ['
    assert lines[3] == (
        '  {"bytes": 2048, "index": [[512, 3, 0, 7]], "name": "t.tar", "sha256": "'
        + "0" * 64
        + '"},'
    )
    assert json.loads(text)["splits"]["val"] == [entry]


def _shard_of(data: bytes, rows: list[list[int]] | None = None) -> Shard:
    index = np.array(rows if rows is not None else [], dtype=np.int64).reshape(-1, 4)
    return Shard("s.tar", len(data), "0" * 64, index)


def _tar(*members: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.size = kind, size
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        member.linkname = "/etc/passwd"
    return member


def test_a_shard_whose_rows_are_its_members_data_passes(tmp_path):
    entry = write_shard(tmp_path / "s.tar", SAMPLES)
    data = (tmp_path / "s.tar").read_bytes()
    check_members(io.BytesIO(data), _shard_of(data, entry["index"]), "here/s.tar")
    check_members(io.BytesIO(data), _shard_of(data), "here/s.tar")  # no rows: members alone


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_member("a.png", tarfile.SYMTYPE), "member 'a.png' is a link: refused"),
        (_member("a.png", tarfile.LNKTYPE), "member 'a.png' is a link: refused"),
        (_member("a.png", tarfile.CHRTYPE), "member 'a.png' is not a plain file: refused"),
        (_member("a.png", tarfile.DIRTYPE), "member 'a.png' is not a plain file: refused"),
        (_member("/etc/a.png"), "member name '/etc/a.png': refused"),
        (_member("x/../a.png"), "member name 'x/../a.png': refused"),
        (_member("x\\a.png"), "member name 'x\\\\a.png': refused"),
    ],
)
def test_a_member_a_reader_must_not_extract_is_refused_naming_it(member, why):
    data = _tar(member)
    with pytest.raises(DataError) as refused:
        check_members(io.BytesIO(data), _shard_of(data), "here/s.tar")
    assert str(refused.value) == f"shard here/s.tar: {why}"


def test_plain_names_in_folders_pass_and_data_past_the_end_is_refused():
    data = _tar(_member("x/a..b.png", size=5), data=b"12345")
    check_members(io.BytesIO(data), _shard_of(data, [[512, 5, 0, 0]]), "s")
    exact = Shard("s.tar", 512 + 5, "0" * 64, np.zeros((0, 4), dtype=np.int64))
    check_members(io.BytesIO(data), exact, "s")  # data ending at the file's end is whole
    short = Shard("s.tar", 512 + 4, "0" * 64, np.zeros((0, 4), dtype=np.int64))
    with pytest.raises(DataError) as past:
        check_members(io.BytesIO(data), short, "s")
    assert str(past.value) == "shard s: member 'x/a..b.png' runs past the file's end"


@pytest.mark.parametrize("row", [[1024, 5, 0, 0], [512, 4, 0, 0]])
def test_a_manifest_row_that_is_not_a_members_data_is_refused(row):
    data = _tar(_member("a.png", size=5), data=b"12345")
    with pytest.raises(DataError) as refused:
        check_members(io.BytesIO(data), _shard_of(data, [row]), "s")
    assert str(refused.value) == (
        f"shard s: the manifest's sample at byte {row[0]} is not a member's data"
    )


def test_bytes_that_are_no_tar_are_one_line():
    with pytest.raises(DataError) as refused:
        check_members(io.BytesIO(b"\1" * 1024), _shard_of(b"\1" * 1024), "s")
    assert str(refused.value).startswith("shard s: not a tar file (")


def _manifest(**entry_fields) -> bytes:
    entry = {"name": "train-0.tar", "bytes": 1024, "sha256": "a" * 64, "index": [[0, 1, 0, 0]]}
    entry.update(entry_fields)
    entry = {k: v for k, v in entry.items() if v is not ...}
    raw = {"format": "repro-shards/1", "classes": ["a"], "splits": {"train": [entry]}}
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"name": "a..b.tar"}, "shard name 'a..b.tar'"),
        ({"name": ".lock.tar"}, "shard name '.lock.tar'"),
        ({"bytes": LARGEST + 1}, f"train-0.tar: bytes {LARGEST + 1}"),
        ({"bytes": -1}, "train-0.tar: bytes -1"),
        ({"bytes": 1.5}, "train-0.tar: bytes 1.5"),
        ({"sha256": 7}, "train-0.tar: sha256"),
        ({"sha256": "A" * 64}, "train-0.tar: sha256"),
    ],
)
def test_each_wrong_field_of_a_shard_entry_is_named(fields, why):
    with pytest.raises(DataError) as refused:
        parse_manifest(_manifest(**fields), "m.json")
    assert str(refused.value) == f"m.json: not a shard manifest ({why})"


def test_an_entry_that_is_no_object_is_named_and_edge_sizes_pass():
    raw = {"format": "repro-shards/1", "classes": ["a"], "splits": {"train": [[1]]}}
    with pytest.raises(DataError) as refused:
        parse_manifest(json.dumps(raw).encode(), "m.json")
    assert str(refused.value) == (
        "m.json: not a shard manifest (a shard entry that is not an object)"
    )
    empty = parse_manifest(_manifest(bytes=0, index=[]), "m.json").splits["train"][0]
    assert empty.size == 0 and empty.index.shape == (0, 4) and empty.index.dtype == np.int64
    largest = parse_manifest(_manifest(bytes=LARGEST), "m.json").splits["train"][0]
    assert largest.size == LARGEST


def test_a_written_shard_reads_back_through_its_own_manifest(tmp_path):
    entry = write_shard(tmp_path / "train-000000.tar", SAMPLES)
    text = manifest_text(["c0", "c1", "c2"], {"train": [entry]}, 0)
    manifest = parse_manifest(text.encode(), "m.json")
    [shard] = manifest.splits["train"]
    assert shard.index.tolist() == entry["index"] and shard.size == entry["bytes"]
    assert manifest.sha256 == hashlib.sha256(text.encode()).hexdigest()
    data = Path(tmp_path / "train-000000.tar").read_bytes()
    check_members(io.BytesIO(data), shard, "here")


@pytest.mark.parametrize(
    ("index", "why"),
    [
        ([[0.5, 1, 0, 0]], "train-0.tar: index is not rows of 4 whole numbers"),
        ([1, 2, 3, 4], "train-0.tar: index is not rows of 4 whole numbers"),
        ([[0, 1, 0]], "train-0.tar: index is not rows of 4 whole numbers"),
        ([[-1, 1, 0, 0]], "train-0.tar: a negative or huge number in the index"),
        ([[0, 1, 0, LARGEST + 1]], "train-0.tar: a negative or huge number in the index"),
        ([[0, 1, 1, 0]], "train-0.tar: a label outside the 1 classes"),
        ([[1000, 30, 0, 0]], "train-0.tar: a sample past the shard's end"),
        ([[0, 1, 0, 2**32]], "train-0.tar: a CRC-32 past 32 bits"),
    ],
)
def test_each_wrong_index_row_is_named(index, why):
    with pytest.raises(DataError) as refused:
        parse_manifest(_manifest(index=index), "m.json")
    assert str(refused.value) == f"m.json: not a shard manifest ({why})"


def test_index_values_up_to_the_largest_and_the_last_class_pass():
    entry = parse_manifest(_manifest(bytes=LARGEST, index=[[LARGEST, 0, 0, 2**32 - 1]]), "m")
    assert entry.splits["train"][0].index.tolist() == [[LARGEST, 0, 0, 2**32 - 1]]
    edge = parse_manifest(_manifest(index=[[1000, 24, 0, 0]]), "m")  # ends at the shard's end
    assert edge.splits["train"][0].index.tolist() == [[1000, 24, 0, 0]]


def test_a_compressed_tar_is_no_shard(tmp_path):
    """A reader seeks to a sample's byte in the file: a gzip'd tar's offsets are not the
    file's, so it is refused where a tar reader would open it transparently."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.addfile(_member("a.png", size=5), io.BytesIO(b"12345"))
    data = buffer.getvalue()
    with pytest.raises(DataError, match=r"^shard s: not a tar file \("):
        check_members(io.BytesIO(data), _shard_of(data), "s")


def _raw(**fields) -> bytes:
    entry = {"name": "train-0.tar", "bytes": 1024, "sha256": "a" * 64, "index": []}
    raw = {"format": "repro-shards/1", "classes": ["a"], "splits": {"train": [entry]}}
    raw.update(fields)
    return json.dumps(raw).encode()


TWICE = {"name": "t.tar", "bytes": 9, "sha256": "a" * 64, "index": []}


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"[1]", "not a JSON object"),
        (_raw(format="repro-shards/0"), "format 'repro-shards/0', expected 'repro-shards/1'"),
        (_raw(classes=["a", 1]), "classes: not a list of names"),
        (_raw(splits=[]), "splits: not an object"),
        (_raw(splits={"train": {}}), "splits.train: not a list"),
        (_raw(splits={"val": []}), "no train split"),
        (_raw(splits={"train": []}), "no train split"),
        (_raw(splits={"train": [TWICE], "val": [TWICE]}), "shard 't.tar' listed twice"),
    ],
)
def test_a_manifest_that_is_not_one_is_named_with_why(data, why):
    with pytest.raises(DataError) as refused:
        parse_manifest(data, "s3://b/manifest.json")
    assert str(refused.value) == f"s3://b/manifest.json: not a shard manifest ({why})"


def test_a_manifest_holds_its_classes_and_its_own_digest_and_bad_json_names_where():
    manifest = parse_manifest(_raw(classes=["cat", "dog"]), "m")
    assert manifest.classes == ["cat", "dog"] and list(manifest.splits) == ["train"]
    with pytest.raises(DataError, match=r"^s3://b/manifest\.json: "):
        parse_manifest(b"{not json", "s3://b/manifest.json")
