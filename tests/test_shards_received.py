"""Shards from someone else through the boundary: a source holding a link is not packed, a
lock planted in the cache reaches no file of yours, special files and odd manifests and tar
members end in one line (tests/test_shards_fuzz.py draws them at random)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from repro.core.errors import DataError
from repro.shards import store
from repro.shards.format import check_members, parse_manifest
from repro.shards.pack import pack

from conftest import make_image_tree, run_cli

SHARD_BYTES = 8000


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("packed")
    pack(make_image_tree(base / "images"), base / "shards", SHARD_BYTES)
    return base / "shards"


@pytest.mark.parametrize("linked", ["file", "folder", "hard link"])
def test_pack_refuses_a_source_holding_a_link_and_writes_nothing(tmp_path, linked):
    source = make_image_tree(tmp_path / "images")
    key = tmp_path / "id_ed25519"
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    image = next((source / "train" / "bar").iterdir())
    if linked == "file":
        image.unlink()
        image.symlink_to(key)
    elif linked == "hard link":
        image.unlink()
        os.link(key, image)
    else:
        shutil.move(source / "train" / "bar", tmp_path / "bar")
        (source / "train" / "bar").symlink_to(tmp_path / "bar")
    with pytest.raises(DataError, match=r"link (in|outside) the folder to pack"):
        pack(source, tmp_path / "shards", SHARD_BYTES)
    assert not (tmp_path / "shards").exists() and not list(tmp_path.glob(".shards*"))


def test_a_lock_planted_in_the_cache_reaches_no_file_of_yours(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own notes\n")
    lock = tmp_path / "cache" / ".train-000000.tar.lock"
    lock.parent.mkdir()
    lock.symlink_to(mine)
    with pytest.raises(DataError, match="refused"), store._lock_file(lock):
        pass
    os.link(mine, tmp_path / "cache" / ".hard.lock")
    hard = store._lock_file(tmp_path / "cache" / ".hard.lock")
    with pytest.raises(DataError, match="not a lock file of its own"), hard:
        pass
    assert mine.read_text() == "the user's own notes\n"
    with store._lock_file(tmp_path / "cache" / ".fresh.lock") as fd:
        assert os.fstat(fd).st_size == 0


@pytest.mark.parametrize("how", ["fifo", "/dev/zero", "link out"])
def test_verify_refuses_a_special_or_linked_shard_in_one_line(packed, tmp_path, how):
    shards = Path(shutil.copytree(packed, tmp_path / "shards"))
    target = shards / "train-000001.tar"
    copy = tmp_path / "elsewhere.tar"
    shutil.copy(target, copy)
    target.unlink()
    if how == "fifo":
        os.mkfifo(target)
    elif how == "/dev/zero":
        target.symlink_to("/dev/zero")
    else:
        target.symlink_to(copy)
    done = run_cli("repro.shards", "verify", str(shards), timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "train-000001.tar" in lines[0]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda m: m["splits"]["train"][0].update(name="../x.tar"), "shard name"),
        (lambda m: m["splits"]["train"][0].update(bytes="12"), "bytes"),
        (lambda m: m["splits"]["train"][0].update(index="x"), "index"),
        (lambda m: m.update(splits=[1]), "splits: not an object"),
        (lambda m: m.update(classes="abc"), "classes: not a list of names"),
    ],
)
def test_a_manifest_of_the_wrong_layout_is_one_line(packed, edit, said):
    manifest = json.loads((packed / "manifest.json").read_text())
    edit(manifest)
    with pytest.raises(DataError, match=said):
        parse_manifest(json.dumps(manifest).encode(), "manifest.json")
    with pytest.raises(DataError, match=r"not JSON|nested too deep"):
        parse_manifest(b"[" * 100_000 + b"]" * 100_000, "manifest.json")


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE])
def test_a_shard_member_that_is_no_plain_file_is_refused(packed, kind):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        member = tarfile.TarInfo("a.png")
        member.type, member.linkname = kind, "/etc/passwd"
        tar.addfile(member)
    shard = parse_manifest((packed / "manifest.json").read_bytes(), "m").splits["train"][0]
    buffer.seek(0)
    with pytest.raises(DataError, match="refused"):
        check_members(buffer, shard, "crafted.tar")
