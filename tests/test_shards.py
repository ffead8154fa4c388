"""Sharded data (repro.shards): packing, the shard-aware order, and every exactness promise
(workers, processes, a kill and a resume) from a local folder and from an S3 server on
localhost; bad shards, manifests and buckets refused in one line."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.core.errors import CheckpointError, DataError
from repro.shards import command as shards_command
from repro.shards.dataset import ShardImages, decode_bytes
from repro.shards.format import parse_manifest
from repro.shards.pack import pack
from repro.shards.store import LocalStore

from conftest import IMAGEFOLDER, make_image_tree, read_summary, run_cli, torchrun, train_in_process

# 3 classes x 12 images a split, 8 KB shards: 8 train shards of 4-5 images, two windows of 4.
# Batches of 12: 3 steps an epoch, 12 in all; a checkpoint every 2 steps.
SHARDS = [o.replace("data=imagefolder", "data=shards") for o in IMAGEFOLDER]
SHARDS += ["trainer.checkpoint_every_steps=2", "trainer.keep_checkpoints=3"]
SHARD_BYTES = 8000
CIFAR_JPEGS = Path("/work/shared/data/cifar10-jpeg.zip")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    pack(make_image_tree(base / "images"), base / "shards", SHARD_BYTES)
    return base / "shards"


@pytest.fixture(scope="module")
def local_hash(packed, tmp_path_factory):
    """The weights of a straight run on the local shards, without workers."""
    run = tmp_path_factory.mktemp("local") / "run"
    return train_in_process(run, *SHARDS, f"data.root={packed}")["weights_sha256"]


def _copy(packed: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed, tmp_path / "shards"))


def _flip_a_sample_byte(shards: Path, name: str = "train-000001.tar") -> None:
    manifest = json.loads((shards / "manifest.json").read_text())
    entry = next(e for e in manifest["splits"]["train"] if e["name"] == name)
    offset, size = entry["index"][0][:2]
    with (shards / name).open("r+b") as handle:
        handle.seek(offset + size // 2)
        byte = handle.read(1)
        handle.seek(offset + size // 2)
        handle.write(bytes([byte[0] ^ 0x01]))


# ---- the format and the packing command ------------------------------------------------------


def test_pack_writes_tar_shards_with_a_manifest_of_their_sha256(packed):
    manifest = parse_manifest((packed / "manifest.json").read_bytes(), "here")
    assert manifest.classes == ["bar", "blank", "circle"]
    assert sum(len(s.index) for s in manifest.splits["train"]) == 36
    assert len(manifest.splits["train"]) >= 4  # small shards: several of them
    for shards in manifest.splits.values():
        for shard in shards:
            data = (packed / shard.name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard.sha256
            assert len(data) == shard.size
    with tarfile.open(packed / "train-000000.tar") as tar:  # any tar reader reads a shard
        names = tar.getnames()
        first = tar.extractfile(names[0]).read()
    assert names[0].endswith(".png") and names[1].endswith(".cls")
    offset, size = manifest.splits["train"][0].index[0][:2]
    assert first == (packed / "train-000000.tar").read_bytes()[offset : offset + size]
    assert not list(packed.parent.glob(".*partial*"))  # written aside, renamed whole


def test_packing_is_reproducible_and_never_writes_into_an_existing_folder(packed, tmp_path):
    again = pack(packed.parent / "images", tmp_path / "again", SHARD_BYTES)
    assert again.read_bytes() == (packed / "manifest.json").read_bytes()
    before = sorted(p.name for p in packed.iterdir())
    with pytest.raises(DataError, match="exists"):
        pack(packed.parent / "images", packed, SHARD_BYTES)
    assert sorted(p.name for p in packed.iterdir()) == before


@pytest.mark.slow
def test_the_command_packs_and_verifies_and_refuses_a_damaged_shard_in_one_line(
    packed, tmp_path, capsys
):
    shards = tmp_path / "cli"
    images = str(packed.parent / "images")
    done = run_cli("repro.shards", "pack", images, str(shards), "--shard-size", "8KB")
    assert done.returncode == 0, done.stderr
    count = len(list(shards.glob("*.tar")))
    shards_command.main(["verify", str(shards)])  # in this process: the command's own code
    assert capsys.readouterr().out == f"{shards}: {count} shards match the manifest\n"
    (shards / "val-000000.tar").write_bytes(b"\0" + (shards / "val-000000.tar").read_bytes()[1:])
    refused = run_cli("repro.shards", "verify", str(shards))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: shard {shards}/val-000000.tar: its SHA-256 is not the manifest's"
    ]


def test_pixel_shards_hold_the_decoded_images_and_train_to_the_weights_of_file_shards(
    packed, tmp_path
):
    images = packed.parent / "images"
    files = pack(images, tmp_path / "files", 10**9)  # one shard a split: the same order
    pixels = pack(images, tmp_path / "pixels", 10**9, pixels=True)
    as_files, as_pixels = (_split(m.parent, 4) for m in (files, pixels))
    with tarfile.open(pixels.parent / "train-000000.tar") as tar:
        assert tar.getnames()[0].endswith(".npy")  # numpy (and WebDataset) read it as it is
    assert len(as_files) == len(as_pixels) == 36
    for index in range(len(as_files)):
        (image, label), (same, same_label) = as_files[index], as_pixels[index]
        assert torch.equal(image, same) and label == same_label
    weights = [train_in_process(tmp_path / m.parent.name / "run", *SHARDS, f"data.root={m.parent}")
               ["weights_sha256"] for m in (files, pixels)]  # fmt: skip
    assert weights[0] == weights[1]


def test_a_npy_that_is_not_uint8_pixels_is_refused_naming_the_sample():
    encoded = io.BytesIO()
    np.save(encoded, np.zeros((3, 4, 4), dtype=np.float32))
    with pytest.raises(DataError, match=r"^shard s/x\.tar, byte 0: not a readable image"):
        decode_bytes(encoded.getvalue(), "shard s/x.tar, byte 0")
    truncated = io.BytesIO()
    np.save(truncated, np.zeros((3, 4, 4), dtype=np.uint8))
    with pytest.raises(DataError, match="not a readable image"):
        decode_bytes(truncated.getvalue()[:-1], "shard s/x.tar, byte 0")


def _cifar_batch(path: Path, images: np.ndarray, labels: list[int]) -> None:
    with path.open("wb") as handle:
        pickle.dump({b"data": images.reshape(len(images), -1), b"labels": labels}, handle)


def test_cifar10_batches_pack_their_pixels_and_a_batch_holding_code_is_refused(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    with (root / "batches.meta").open("wb") as handle:
        pickle.dump({b"label_names": [b"cat", b"dog"]}, handle)
    pixels = rng.integers(0, 256, (6, 6, 3, 32, 32), dtype=np.uint8)  # batch, image, CHW
    for number, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        _cifar_batch(root / name, pixels[number], [0, 1, 0, 1, 0, 1])
    manifest = pack(tmp_path, tmp_path / "shards", 10**9, pixels=True)
    test = ShardImages.of_split(LocalStore(manifest.parent), parse_manifest(
        manifest.read_bytes(), "here").splits["test"], 4, "test")  # fmt: skip
    assert sorted(test[i][0].sum().item() for i in range(6)) == sorted(
        torch.from_numpy(pixels[5]).flatten(1).sum(1).tolist())  # fmt: skip

    class Payload:  # what a malicious pickle carries: a call made while it is read
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    _cifar_batch(root / "data_batch_2", pixels[1][:5], [0, 1, 0, 1, 0, 1])  # 5 images, 6 labels
    with pytest.raises(DataError, match=r"data_batch_2: not laid out as a CIFAR-10 batch"):
        pack(tmp_path, tmp_path / "again", 10**9)
    _cifar_batch(root / "data_batch_2", pixels[1], [0, 1, 0, 1, 0, 1])
    with (root / "data_batch_3").open("wb") as handle:
        pickle.dump({b"data": Payload(), b"labels": []}, handle)
    with pytest.raises(DataError, match=r"data_batch_3: holds pathlib\.Path\.touch, not"):
        pack(tmp_path, tmp_path / "again", 10**9)
    assert not (tmp_path / "ran").exists() and not (tmp_path / "again").exists()


# ---- the order ----------------------------------------------------------------------------


def _split(packed: Path, window: int = 2) -> ShardImages:
    store = LocalStore(packed)
    manifest = parse_manifest(store.manifest(), "here")
    return ShardImages.of_split(store, manifest.splits["train"], window, "train")


def test_the_order_is_a_pure_function_of_seed_and_epoch_and_reads_a_window_at_a_time(packed):
    source = _split(packed, window=2)
    order = source.epoch_order(7, 3)
    assert torch.equal(order, _split(packed, window=2).epoch_order(7, 3))  # a fresh source too
    assert sorted(order.tolist()) == list(range(len(source)))
    assert not torch.equal(order, source.epoch_order(7, 4))
    assert not torch.equal(order, source.epoch_order(8, 3))
    shards = source.rows[order.numpy(), 0]
    # Consecutive samples come from a window of 2 shards, each window read once in the epoch.
    windows = _cut_at_new_windows(shards.tolist(), 2)
    assert len(windows) == -(-len(source.shards) // 2) and all(len(w) == 2 for w in windows[:-1])
    assert sum(len(w) for w in windows) == len(source.shards)  # no shard opened twice


def _cut_at_new_windows(shards: list[int], window: int) -> list[list[int]]:
    """The order cut where a shard outside the current window's set begins."""
    parts: list[list[int]] = [[]]
    for shard in shards:
        if shard not in parts[-1] and len(set(parts[-1])) == window:
            parts.append([])
        parts[-1].append(shard)
    return [sorted(set(part)) for part in parts]


def test_a_subset_keeps_its_samples_shards_and_a_shard_aware_order(packed):
    source = _split(packed, window=2)
    subset = source.subset(torch.arange(0, len(source), 3))
    order = subset.epoch_order(0, 0)
    assert sorted(order.tolist()) == list(range(len(subset)))
    image, label = subset[1]
    assert torch.equal(image, source[3][0]) and label == source[3][1]
    windows = _cut_at_new_windows(subset.rows[order.numpy(), 0].tolist(), 2)
    assert sum(len(w) for w in windows) == len(set(subset.rows[:, 0].tolist()))


# ---- exactness from a local folder ----------------------------------------------------------


def test_two_workers_give_the_weights_of_none_from_local_shards(packed, local_hash, tmp_path):
    two = train_in_process(tmp_path / "two", *SHARDS, f"data.root={packed}",
                           "dataloader.num_workers=2")  # fmt: skip
    assert two["weights_sha256"] == local_hash


def test_a_halted_run_resumes_mid_epoch_to_the_straight_weights(packed, local_hash, tmp_path):
    overrides = [*SHARDS, f"data.root={packed}"]
    halted = train_in_process(tmp_path / "run", *overrides, "trainer.halt_at_step=5")
    assert halted["step"] == 5 and not halted["completed"]  # batch 2 of epoch 1, saved there
    # Another cache folder and size say where and how to read, not what: the resume takes them.
    moved = [f"data.cache_dir={tmp_path / 'elsewhere'}", "data.cache_gib=1.0"]
    resumed = train_in_process(tmp_path / "run", *overrides, *moved)
    assert resumed["resumed_from_step"] == 5 and resumed["weights_sha256"] == local_hash


def test_a_damaged_sample_is_refused_naming_its_shard(packed, tmp_path):
    shards = _copy(packed, tmp_path)
    _flip_a_sample_byte(shards)
    with pytest.raises(DataError, match=r"shard .*/train-000001\.tar: the sample at byte \d+"):
        train_in_process(tmp_path / "run", *SHARDS, f"data.root={shards}")


@pytest.mark.parametrize("damage", ["missing", "truncated", "manifest"])
def test_a_missing_or_foreign_shard_or_a_bad_manifest_is_refused_naming_it(
    damage, packed, tmp_path
):
    shards = _copy(packed, tmp_path)
    if damage == "missing":
        (shards / "train-000002.tar").unlink()
        expected = r"shard .*/train-000002\.tar: missing"
    elif damage == "truncated":
        (shards / "train-000002.tar").write_bytes(b"tar")
        expected = r"shard .*/train-000002\.tar: 3 bytes, the manifest says \d+"
    else:
        (shards / "manifest.json").write_text('{"format": "something else"}')
        expected = r"manifest\.json: not a shard manifest"
    with pytest.raises(DataError, match=expected):
        train_in_process(tmp_path / "run", *SHARDS, f"data.root={shards}")


def test_a_resume_on_shards_whose_manifest_changed_is_refused(packed, tmp_path):
    shards = _copy(packed, tmp_path)
    overrides = [*SHARDS, f"data.root={shards}"]
    train_in_process(tmp_path / "run", *overrides, "trainer.halt_at_step=4")
    checkpoints = sorted((tmp_path / "run" / "checkpoints").iterdir())
    shutil.rmtree(shards)
    pack(packed.parent / "images", shards, SHARD_BYTES, seed=1)  # the same images, repacked
    with pytest.raises(CheckpointError, match=r"data\.root=.*shards: the data's train, val, tes"):
        train_in_process(tmp_path / "run", *overrides)
    assert sorted((tmp_path / "run" / "checkpoints").iterdir()) == checkpoints  # all kept


def test_the_fingerprint_names_the_manifest_without_reading_images(packed, tmp_path):
    summary = train_in_process(tmp_path / "run", *SHARDS, f"data.root={packed}",
                               "trainer.epochs=1")  # fmt: skip
    repacked = pack(packed.parent / "images", tmp_path / "repacked", SHARD_BYTES, seed=1)
    other = train_in_process(tmp_path / "other", *SHARDS, f"data.root={repacked.parent}",
                             "trainer.epochs=1")  # fmt: skip
    assert summary["data"]["splits"]["train"]["images"] == 36
    assert summary["data"]["sha256"] != other["data"]["sha256"]


# ---- exactness across processes and a real kill (end to end) ---------------------------------

INVARIANT = ["trainer.global_batch=true", "trainer.world_invariant=true",
             "trainer.micro_batch=6", "trainer.num_threads=1", "dataloader.num_workers=0"]  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("source", ["folder", "s3"])
def test_two_processes_give_the_weights_of_one_on_shards(source, packed, request, tmp_path):
    if source == "folder":
        command = [*SHARDS, f"data.root={packed}", *INVARIANT]
    else:  # both ranks fetch into one cache folder, as processes of one machine do
        endpoint = request.getfixturevalue("s3_server")
        request.getfixturevalue("s3_env")
        url = _upload(endpoint, packed, "processes")
        command = [*_s3(url, endpoint, tmp_path / "cache"), *INVARIANT]
    one = run_cli("repro.train", *command, f"hydra.run.dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    if source == "s3":
        shutil.rmtree(tmp_path / "cache")  # the two ranks download every shard themselves
    two = torchrun(*command, f"hydra.run.dir={tmp_path / 'two'}")
    assert two.returncode == 0, two.stderr[-3000:]
    first, second = read_summary(tmp_path / "one"), read_summary(tmp_path / "two")
    assert second["world_size"] == 2 and first["weights_sha256"] == second["weights_sha256"]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_on_shards_killed_mid_epoch_resumes_exactly(workers, packed, local_hash, tmp_path):
    command = [*SHARDS, f"data.root={packed}", "dataloader=default",
               f"dataloader.num_workers={workers}", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    killed = run_cli("repro.train", *command, env={"REPRO_FAULT": "step:9"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_cli("repro.train", *command)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(tmp_path / "run")
    # The checkpoint of step 8 (3 steps an epoch: batch 2 of epoch 2): a resume mid-epoch.
    assert summary["resumed_from_step"] == 8 and summary["weights_sha256"] == local_hash


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_JPEGS.is_file(), reason=f"{CIFAR_JPEGS} is absent")
def test_the_cifar10_jpegs_pack_into_shards_that_give_their_bytes_back(tmp_path):
    with zipfile.ZipFile(CIFAR_JPEGS) as archive:
        members = [m for m in archive.namelist() if m.endswith(".jpg")]
        chosen = [m for m in members if int(Path(m).stem) < 100]  # 100 a class and split
        archive.extractall(tmp_path / "jpegs", chosen)
    manifest = pack(tmp_path / "jpegs", tmp_path / "shards", 200_000)
    store = LocalStore(manifest.parent)
    parsed = parse_manifest(store.manifest(), "here")
    train = ShardImages.of_split(store, parsed.splits["train"], 4, "train")
    assert len(parsed.classes) == 10 and len(train) == len(chosen) // 2
    image, _ = train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8


# ---- object storage: a real S3 API on localhost (moto's server) -----------------------------


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """moto's S3 server on a free port, for this module's tests; stopped after them."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path_factory.mktemp("moto") / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture
def s3_env(monkeypatch):
    """Credentials moto accepts; DataLoader workers inherit them."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def _upload(endpoint: str, folder: Path, bucket: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), bucket, f"data/{path.name}")
    return f"s3://{bucket}/data"


def _s3(url: str, endpoint: str, cache: Path, *extra: str) -> list[str]:
    return [*SHARDS, f"data.root={url}", f"data.endpoint_url={endpoint}",
            f"data.cache_dir={cache}", *extra]  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_from_s3_give_the_local_weights_with_0_and_2_workers(
    workers, packed, local_hash, s3_server, s3_env, tmp_path
):
    url = _upload(s3_server, packed, f"exact-{workers}")
    overrides = _s3(url, s3_server, tmp_path / "cache", f"dataloader.num_workers={workers}")
    summary = train_in_process(tmp_path / "run", *overrides)
    assert summary["weights_sha256"] == local_hash
    cached = list((tmp_path / "cache").rglob("*.tar"))
    assert len(cached) == len(list(packed.glob("*.tar")))  # each shard fetched whole, kept
    assert not list((tmp_path / "cache").rglob("*.part"))  # no half download left


def test_the_cache_stays_within_its_bound_and_the_weights_do_not_change(
    packed, local_hash, s3_server, s3_env, tmp_path
):
    url = _upload(s3_server, packed, "bounded")
    largest = max(p.stat().st_size for p in packed.glob("*.tar"))
    bound = 3 * largest  # under half the dataset's shards
    overrides = _s3(url, s3_server, tmp_path / "cache", f"data.cache_gib={bound / (1 << 30)}")
    summary = train_in_process(tmp_path / "run", *overrides)
    assert summary["weights_sha256"] == local_hash
    held = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*.tar"))
    assert 0 < held <= bound


def test_a_damaged_shard_in_the_bucket_is_refused_naming_it(packed, s3_server, s3_env, tmp_path):
    shards = _copy(packed, tmp_path)
    _flip_a_sample_byte(shards, "train-000003.tar")
    url = _upload(s3_server, shards, "damaged")
    with pytest.raises(DataError, match=r"shard s3://damaged/data/train-000003\.tar: its SHA-256"):
        train_in_process(tmp_path / "run", *_s3(url, s3_server, tmp_path / "cache"))
    assert not list((tmp_path / "cache").rglob("train-000003.tar"))  # never cached


def test_an_unreachable_bucket_or_a_missing_one_is_one_line(s3_server, s3_env, tmp_path):
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens
    with pytest.raises(DataError, match=r"s3://nowhere/data: cannot reach the bucket"):
        train_in_process(tmp_path / "a", *_s3("s3://nowhere/data", closed, tmp_path / "c"))
    with pytest.raises(DataError, match=r"s3://no-such-bucket/data/manifest\.json: refused"):
        train_in_process(tmp_path / "b", *_s3("s3://no-such-bucket/data", s3_server,
                                              tmp_path / "c"))  # fmt: skip


@pytest.mark.slow
@pytest.mark.e2e
def test_an_unreachable_bucket_stops_the_command_with_one_line(tmp_path):
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    pytest.importorskip("boto3")
    done = run_cli("repro.train", *_s3("s3://nowhere/data", "http://127.0.0.1:9", tmp_path),
                   f"hydra.run.dir={tmp_path / 'run'}", env=env)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("error: s3://nowhere/data: cannot reach the bucket")
    )
