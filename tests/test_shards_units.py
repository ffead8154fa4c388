"""repro.shards.dataset unit by unit: the epoch order against the rule docs/data.md states,
written again here step by step; empty splits and subsets; what identifies a split; each way of
decoding a sample (.npy pixels, formats PIL reads) and each refusal naming its sample; the
builder's settings and their one-line refusals."""

from __future__ import annotations

import inspect
import io
import json
import os
import pickle
import re
import shutil
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from repro.core.errors import ConfigError, DataError
from repro.core.runtime.seeding import torch_generator
from repro.shards import dataset
from repro.shards.dataset import ShardImages, decode_bytes
from repro.shards.format import Shard
from repro.shards.pack import pack
from repro.shards.store import LocalStore

from conftest import make_image_tree, upload

SHARDS = 10


def _split(window: int = 3, per_shard: int = 20) -> ShardImages:
    """Rows of SHARDS shards (no files: the order reads none), stored shard after shard."""
    shards = [Shard(f"train-{i:06d}.tar", 1, "0" * 64, np.zeros((0, 4))) for i in range(SHARDS)]
    rows = np.array(
        [[s, 512 * k, 100, k % 3, 0] for s in range(SHARDS) for k in range(per_shard)],
        dtype=np.int64,
    )
    return ShardImages(LocalStore(Path("/nowhere")), shards, rows, window, "train")


def _order_by_the_rule(split: ShardImages, seed: int, epoch: int) -> list[int]:
    """docs/data.md, The order: the shards shuffled with the epoch's "order" generator, taken
    in windows of `window`, the samples of each window (in stored order) shuffled with it."""
    generator = torch_generator(seed, "order", epoch)
    present = sorted(set(split.rows[:, 0].tolist()))
    shuffled = [present[i] for i in torch.randperm(len(present), generator=generator).tolist()]
    order: list[int] = []
    for start in range(0, len(shuffled), split.window):
        window = shuffled[start : start + split.window]
        members = [
            i for shard in window for i in range(len(split.rows)) if split.rows[i, 0] == shard
        ]
        order += [members[j] for j in torch.randperm(len(members), generator=generator).tolist()]
    return order


@pytest.mark.parametrize(("window", "seed", "epoch"), [(3, 0, 0), (3, 5, 2), (1, 1, 1), (4, 2, 7)])
def test_the_epoch_order_is_the_rule_docs_data_md_states(window, seed, epoch):
    split = _split(window)
    order = split.epoch_order(seed, epoch)
    assert order.dtype == torch.int64
    assert order.tolist() == _order_by_the_rule(split, seed, epoch)


def test_a_subsets_order_follows_the_rule_over_the_shards_it_holds():
    subset = _split().subset(torch.arange(5, 200, 7))
    assert subset.epoch_order(3, 1).tolist() == _order_by_the_rule(subset, 3, 1)


def test_an_empty_split_or_subset_has_an_empty_order_and_no_rows():
    empty = ShardImages.of_split(LocalStore(Path("/nowhere")), [], 4, "val")
    assert len(empty) == 0 and empty.rows.shape == (0, 5) and empty.rows.dtype == np.int64
    assert empty.labels == []
    for split in (empty, _split().subset(torch.tensor([], dtype=torch.int64))):
        assert split.rows.shape == (0, 5)
        order = split.epoch_order(0, 0)
        assert order.dtype == torch.int64 and order.tolist() == []


def test_a_subset_keeps_its_splits_name_shards_and_window_and_the_digest_tells_them_apart():
    split = _split()
    subset = split.subset(torch.tensor([3, 1, 40]))
    assert (subset.name, subset.window, subset.shards) == ("train", 3, split.shards)
    assert subset.rows.tolist() == split.rows[[3, 1, 40]].tolist()
    digests = {split.digest(), subset.digest(), split.subset(torch.tensor([3, 1, 41])).digest()}
    assert len(digests) == 3
    renamed = ShardImages(split.store, split.shards, split.rows, 3, "val")
    assert renamed.digest() != split.digest() and _split().digest() == split.digest()


def _npy(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, pixels)
    return buffer.getvalue()


def test_npy_pixels_are_read_whatever_their_headers_length():
    pixels = np.arange(3 * 5 * 7, dtype=np.uint8).reshape(3, 5, 7)
    assert torch.equal(decode_bytes(_npy(pixels), "s"), torch.from_numpy(pixels))
    wide = np.arange(3 * 2 * 300, dtype=np.uint8).reshape(3, 2, 300) % 251
    assert torch.equal(decode_bytes(_npy(wide), "s"), torch.from_numpy(wide))


@pytest.mark.parametrize(("format_", "mode"), [("BMP", "RGB"), ("GIF", "P"), ("BMP", "L")])
def test_formats_pil_reads_come_back_as_rgb_channels_first(format_, mode):
    rgb = np.random.default_rng(0).integers(0, 256, size=(6, 9, 3), dtype=np.uint8)
    image = Image.fromarray(rgb).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=format_)
    decoded = decode_bytes(buffer.getvalue(), "s")
    expected = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    assert decoded.shape == (3, 6, 9) and decoded.dtype == torch.uint8
    assert decoded.is_contiguous()
    assert torch.equal(decoded, torch.from_numpy(expected.copy()).permute(2, 0, 1))


def test_an_unreadable_or_oversized_sample_is_one_line_naming_it():
    with pytest.raises(DataError) as unreadable:
        decode_bytes(b"not an image", "shard s3://b/train-000001.tar, byte 1536")
    assert str(unreadable.value) == (
        "shard s3://b/train-000001.tar, byte 1536: not a readable image (UnidentifiedImageError)"
    )
    header = b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR"
    bomb = header + (70000).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0]) + b"\0" * 4
    with pytest.raises(DataError) as oversized:
        decode_bytes(bomb, "shard here.tar, byte 0")
    said = str(oversized.value)
    assert said.startswith("shard here.tar, byte 0: ") and "70000" in said
    assert "\n" not in said


def test_a_damaged_sample_is_named_by_its_shard_and_byte(tmp_path):
    (tmp_path / "train-000000.tar").write_bytes(b"\0" * 2048)
    shard = Shard("train-000000.tar", 2048, "0" * 64, np.zeros((0, 4)))
    rows = np.array([[0, 512, 100, 1, 12345]], dtype=np.int64)
    split = ShardImages(LocalStore(tmp_path), [shard], rows, 1, "train")
    with pytest.raises(DataError) as damaged:
        split[0]
    assert str(damaged.value) == (
        f"shard {tmp_path}/train-000000.tar: the sample at byte 512 does not match the "
        "manifest: the shard is damaged; pack (or download) it again"
    )
    rows[0, 4] = zlib.crc32(b"\0" * 100)  # a crc32 that matches: then the bytes are no image
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}/train-000000.tar, byte 512: not")):
        split[0]


def _data(**settings) -> object:
    return OmegaConf.create({"root": None, "num_classes": None, **settings})


def test_the_builders_defaults_are_the_configs():
    cfg = OmegaConf.load(Path(dataset.__file__).parents[1] / "conf" / "data" / "shards.yaml")
    defaults = inspect.signature(dataset.shards).parameters
    for name in ("window", "cache_gib", "cache_dir", "endpoint_url"):
        assert defaults[name].default == cfg[name], name


@pytest.mark.parametrize(
    ("settings", "key", "allowed"),
    [
        ({"window": 0}, "data.window", "1 or more shards"),
        ({"cache_gib": 0.0}, "data.cache_gib", "a positive size in GiB"),
        ({"cache_gib": -1.0}, "data.cache_gib", "a positive size in GiB"),
    ],
)
def test_a_window_or_cache_bound_out_of_range_is_one_line(tmp_path, settings, key, allowed):
    with pytest.raises(ConfigError) as refused:
        dataset.shards(_data(root=str(tmp_path)), 0, **settings)
    value = next(iter(settings.values()))
    assert (refused.value.key, refused.value.value, refused.value.allowed) == (key, value, allowed)


def test_a_memory_cache_or_no_root_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as memory:
        dataset.shards(_data(root=str(tmp_path), cache="memory"), 0)
    assert memory.value.key == "data.cache" and memory.value.allowed == (
        "none: sharded data is read from its shards (the order is shard-aware)"
    )
    with pytest.raises(ConfigError) as missing:
        dataset.shards(_data(), 0)
    assert missing.value.allowed == (
        "a folder path: a folder of shards or s3://bucket/prefix (python -m repro.shards)"
    )


def test_a_window_of_1_a_config_without_cache_and_a_home_path_are_read(tmp_path, monkeypatch):
    """Past the checks, the builder opens data.root (here a folder without a manifest)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DataError, match=re.escape(f"data.root={tmp_path / 'mine'}: manifest")):
        dataset.shards(_data(root="~/mine"), 0, window=1, cache_gib=1e-9)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """3 classes, train and val, 8 KB shards."""
    base = tmp_path_factory.mktemp("packed")
    pack(make_image_tree(base / "images", per_class=4), base / "shards", 8000)
    return base / "shards"


def test_the_builder_gives_each_split_with_its_shards_and_window(packed):
    splits = dataset.shards(_data(root=str(packed), val_size=2), 0)
    assert splits.any_size is True and splits.classes == ["bar", "blank", "circle"]
    assert splits.train.window == 4 and splits.train.name == "train"  # the default window
    assert (len(splits.train), len(splits.val)) == (12, 12)  # the shards' own val split
    assert splits.test is splits.val  # no test split: the val split stands in
    assert splits.train.store.url == str(packed)
    image, label = splits.train.subset(torch.tensor([2]))[0]
    assert torch.equal(image, splits.train[2][0]) and label == splits.train[2][1]


def test_without_a_val_split_one_is_carved_out_of_train_by_the_seed(packed, tmp_path):
    only_train = tmp_path / "train_only"
    pack(make_image_tree(tmp_path / "images", per_class=4, val_per_class=1), only_train, 8000)
    manifest = json.loads((only_train / "manifest.json").read_text())
    del manifest["splits"]["val"]
    (only_train / "manifest.json").write_text(json.dumps(manifest))
    splits = dataset.shards(_data(root=str(only_train), val_size=3), 5)
    assert (len(splits.train), len(splits.val)) == (9, 3) and splits.test is splits.val
    again = dataset.shards(_data(root=str(only_train), val_size=3), 5)
    assert again.val.rows.tolist() == splits.val.rows.tolist()
    other = dataset.shards(_data(root=str(only_train), val_size=3), 6)
    assert other.val.rows.tolist() != splits.val.rows.tolist()
    with_test = tmp_path / "with_test"
    manifest["splits"]["test"] = [manifest["splits"]["train"].pop()]
    shutil.copytree(only_train, with_test)
    (with_test / "manifest.json").write_text(json.dumps(manifest))
    tested = dataset.shards(_data(root=str(with_test), val_size=3), 5)
    assert tested.test.name == "test" and len(tested.test) == len(
        manifest["splits"]["test"][0]["index"]
    )


def test_a_class_count_that_is_not_the_manifests_is_one_line(packed):
    assert dataset.shards(_data(root=str(packed), num_classes=3), 0).classes == [
        "bar",
        "blank",
        "circle",
    ]
    with pytest.raises(ConfigError) as refused:
        dataset.shards(_data(root=str(packed), num_classes=4), 0)
    assert (refused.value.key, refused.value.value) == ("data.num_classes", 4)
    assert refused.value.allowed == f"{packed} has 3 classes (or null to infer)"
    with pytest.raises(ConfigError) as memory:
        dataset.shards(_data(root=str(packed), cache="memory"), 0)
    assert memory.value.value == "memory"


def test_a_bad_manifest_is_named_by_its_place(tmp_path):
    (tmp_path / "manifest.json").write_text("[]")
    with pytest.raises(DataError) as refused:
        dataset.shards(_data(root=str(tmp_path)), 0)
    assert (
        str(refused.value) == f"{tmp_path}/manifest.json: not a shard manifest (not a JSON object)"
    )


def test_an_s3_root_reaches_its_store_with_the_cache_and_endpoint_asked(
    packed, tmp_path, s3_in_process
):
    upload(s3_in_process, packed, "units", "d")
    default = dataset.shards(_data(root="s3://units/d"), 0, cache_dir=str(tmp_path))
    assert default.train.store.url == "s3://units/d" and default.train.store.limit == 4 << 30
    assert default.train.store.cache.parent == tmp_path
    asked = dataset.shards(
        _data(root="s3://units/d"), 0, cache_dir=str(tmp_path / "c"), cache_gib=0.5
    )
    assert asked.train.store.limit == 1 << 29 and asked.train.store.cache.parent == tmp_path / "c"


def test_a_split_sent_to_a_worker_opens_its_own_files(packed):
    split = dataset.shards(_data(root=str(packed)), 0).train
    first = split[0]
    assert split._open  # a file stays open in this process
    copy = pickle.loads(pickle.dumps(split))
    assert copy._open == OrderedDict() and copy._pid == -1
    assert torch.equal(copy[0][0], first[0]) and copy._pid == os.getpid()
