"""`python -m repro.shards pack|verify`, called in this process (the command line's tests in
test_shards.py start it as a user would): what each prints, the packing it asks for, and a
mistake as one line and exit status 2."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from repro.shards.command import main
from repro.shards.format import parse_manifest
from repro.shards.pack import pack

from conftest import make_image_tree, upload


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_image_tree(tmp_path_factory.mktemp("source") / "images", per_class=4)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    """The command's exit status, standard output and standard error."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def _shards(manifest_path: Path) -> list:
    manifest = parse_manifest(manifest_path.read_bytes(), "manifest.json")
    return [shard for shards in manifest.splits.values() for shard in shards]


def test_pack_packs_as_asked_and_verify_counts_every_shard_of_every_split(images, tmp_path, capsys):
    dest = tmp_path / "shards"
    argv = ["pack", str(images), str(dest), "--shard-size", "2KB", "--seed", "3"]
    code, out, err = _run(capsys, *argv)
    assert (code, err) == (0, "")
    assert out == f"packed {images} into {dest} (manifest.json lists the shards)\n"
    asked = pack(images, tmp_path / "asked", 2000, seed=3)
    assert (dest / "manifest.json").read_bytes() == asked.read_bytes()
    assert asked.read_bytes() != pack(images, tmp_path / "seed0", 2000).read_bytes()
    shards = _shards(dest / "manifest.json")
    assert len({shard.name.split("-")[0] for shard in shards}) == 2 < len(shards)
    assert _run(capsys, "verify", str(dest)) == (
        0,
        f"{dest}: {len(shards)} shards match the manifest\n",
        "",
    )


def test_pack_by_default_makes_256mb_shards_of_the_files_bytes_with_seed_0(
    images, tmp_path, capsys
):
    dest = tmp_path / "shards"
    assert _run(capsys, "pack", str(images), str(dest))[0] == 0
    default = pack(images, tmp_path / "default", 256 * 10**6, seed=0)
    assert (dest / "manifest.json").read_bytes() == default.read_bytes()
    assert [s.name for s in _shards(dest / "manifest.json")] == [
        "train-000000.tar",
        "val-000000.tar",
    ]
    with tarfile.open(dest / "train-000000.tar") as tar:
        assert all(name.endswith((".png", ".cls")) for name in tar.getnames())
    assert _run(capsys, "pack", str(images), str(tmp_path / "pixels"), "--pixels")[0] == 0
    with tarfile.open(tmp_path / "pixels" / "train-000000.tar") as tar:
        assert any(name.endswith(".npy") for name in tar.getnames())


def test_paths_may_start_at_the_home_folder(images, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(images, tmp_path / "images")
    code, out, _ = _run(capsys, "pack", "~/images", "~/shards", "--shard-size", "4KB")
    assert code == 0 and (tmp_path / "shards" / "manifest.json").is_file()
    assert out == f"packed ~/images into {tmp_path / 'shards'} (manifest.json lists the shards)\n"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--shard-size", "12XB"], "--shard-size 12XB: not a size (256MB, 64KiB, 1GB or bytes)"),
        (["--shard-size", "1KB"], None),  # the second pack: into a folder that exists
    ],
)
def test_a_mistake_in_pack_is_one_line_and_status_2(images, tmp_path, capsys, argv, said):
    dest = tmp_path / "shards"
    if said is None:
        dest.mkdir()
        (dest / "mine.txt").write_text("kept")
    code, out, err = _run(capsys, "pack", str(images), str(dest), *argv)
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith("error: ")
    if said is not None:
        assert err == f"error: {said}\n"
    else:
        assert "exists" in err and (dest / "mine.txt").read_text() == "kept"


def test_verify_names_a_damaged_shard_in_one_line(images, tmp_path, capsys):
    dest = tmp_path / "shards"
    pack(images, dest, 2000)
    damaged = dest / "val-000000.tar"
    damaged.write_bytes(b"\1" + damaged.read_bytes()[1:])
    assert _run(capsys, "verify", str(dest)) == (
        2,
        "",
        f"error: shard {dest}/val-000000.tar: its SHA-256 is not the manifest's\n",
    )


def test_verify_reads_the_members_of_a_shard_whose_digest_matches(images, tmp_path, capsys):
    """A shard whose manifest entry was made to match it, but whose member is a link."""
    dest = tmp_path / "shards"
    pack(images, dest, 2000)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        member = tarfile.TarInfo("0.png")
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(member)
    crafted = buffer.getvalue()
    (dest / "val-000000.tar").write_bytes(crafted)
    manifest = json.loads((dest / "manifest.json").read_text())
    entry = manifest["splits"]["val"][0]
    entry.update(sha256=hashlib.sha256(crafted).hexdigest(), bytes=len(crafted))
    (dest / "manifest.json").write_text(json.dumps(manifest))
    assert _run(capsys, "verify", str(dest)) == (
        2,
        "",
        f"error: shard {dest}/val-000000.tar: member '0.png' is a link: refused\n",
    )


def test_verify_from_s3_fetches_every_shard_and_keeps_them(images, tmp_path, capsys, s3_in_process):
    dest = tmp_path / "shards"
    pack(images, dest, 2000)
    upload(s3_in_process, dest, "kept", "data")
    cache = tmp_path / "cache"
    code, out, _ = _run(capsys, "verify", "s3://kept/data", "--cache-dir", str(cache))
    shards = _shards(dest / "manifest.json")
    assert (code, out) == (0, f"s3://kept/data: {len(shards)} shards match the manifest\n")
    assert sorted(p.name for p in cache.rglob("*.tar")) == sorted(s.name for s in shards)


def _said(out: str, text: str) -> bool:
    """Whether a help line ends with `text`, after a space: an option's or command's help."""
    return any(re.search(rf"(^|\s){re.escape(text)}$", line) for line in out.splitlines())


def test_the_help_says_what_each_command_and_option_does(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps to the terminal's width: no wrapping
    code, out, _ = _run(capsys, "--help")
    assert code == 0 and out.startswith("usage: python -m repro.shards [-h] {pack,verify} ...")
    assert "`python -m repro.shards pack SRC DEST [--shard-size 256MB]" in out  # the docstring
    assert _said(out, "pack an image folder or CIFAR-10 into shards")
    assert _said(out, "check every shard against the manifest")
    code, out, _ = _run(capsys, "pack", "--help")
    assert code == 0 and out.startswith("usage: python -m repro.shards pack [-h]")
    for text in (
        "an image folder (train/<class>/...) or CIFAR-10's folder",
        "the new folder of shards (must not exist)",
        "bytes per shard (256MB)",
        "the packing shuffle's seed",
        "store decoded pixels (.npy), not the image files' bytes",
    ):
        assert _said(out, text), text
    code, out, _ = _run(capsys, "verify", "--help")
    for text in (
        "a folder of shards or s3://bucket/prefix",
        "an S3-compatible endpoint",
        "where s3 shards are cached",
    ):
        assert _said(out, text), text
    code, _, err = _run(capsys)
    assert code == 2 and "the following arguments are required: command" in err


def test_verify_names_the_manifest_it_could_not_read(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"format": "other"}')
    code, out, err = _run(capsys, "verify", str(tmp_path))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {tmp_path}/manifest.json: not a shard manifest (format 'other'")
