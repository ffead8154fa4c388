"""Promises of sharded data that no single module keeps: what the split hands the sampler and
the loop (a training run reads the shards a window at a time, in the split's own order), what
a split's open files and the S3 cache keep and evict (the least recently used). Each would
leave the weights exact if broken, so no exactness test can see it: these assert the reads."""

from __future__ import annotations

import pytest

from repro.shards import dataset, store
from repro.shards.dataset import ShardImages
from repro.shards.format import parse_manifest
from repro.shards.pack import pack
from repro.shards.store import LocalStore, S3Store
from test_shards import SHARD_BYTES, SHARDS, _cut_at_new_windows, _split

from conftest import make_image_tree, train_in_process, upload

WINDOW = 2


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """test_shards' data: 8 training shards of 4-5 images."""
    base = tmp_path_factory.mktemp("shards")
    pack(make_image_tree(base / "images"), base / "shards", SHARD_BYTES)
    return base / "shards"


def _recording(monkeypatch) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Every sample read (split, shard) and every shard opened (split, shard), in order."""
    reads: list[tuple[str, int]] = []
    opens: list[tuple[str, int]] = []
    read, open_shard = ShardImages.__getitem__, dataset.open_shard

    def recorded_read(self, index):
        reads.append((self.name, int(self.rows[index, 0])))
        return read(self, index)

    def recorded_open(where, shard):
        opens.append((where.url, shard.name))
        return open_shard(where, shard)

    monkeypatch.setattr(ShardImages, "__getitem__", recorded_read)
    monkeypatch.setattr(dataset, "open_shard", recorded_open)
    return reads, opens


def test_a_run_reads_its_training_shards_a_window_at_a_time_in_the_splits_own_order(
    packed, monkeypatch, tmp_path
):
    reads, opens = _recording(monkeypatch)
    summary = train_in_process(
        tmp_path / "run", *SHARDS, f"data.root={packed}", f"data.window={WINDOW}", "seed=5"
    )
    source = _split(packed, window=WINDOW)
    trained = [shard for split, shard in reads if split == "train"]
    steps_per_epoch = len(source) // 12  # batches of 12, the incomplete last one dropped
    epochs = summary["step"] // steps_per_epoch
    per_epoch = steps_per_epoch * 12
    # Before the loop, the loader reads its first sample once per image of a batch to learn
    # the batches' shape; the loop's reads follow.
    probe, trained = trained[: -summary["step"] * 12], trained[-summary["step"] * 12 :]
    assert len(probe) <= 12 and epochs >= 2
    for epoch in range(epochs):
        read = trained[epoch * per_epoch : (epoch + 1) * per_epoch]
        # The very samples, in the order the split gives the sampler for this seed and epoch.
        order = source.epoch_order(summary["seed"], epoch)[:per_epoch]
        assert read == source.rows[order.numpy(), 0].tolist()
        windows = _cut_at_new_windows(read, WINDOW)
        assert all(len(window) <= WINDOW for window in windows)
        assert sum(len(window) for window in windows) == len(set(read))  # each shard read once
    # A window is read with as many opens as it has shards, for the whole run: the files stay
    # open while the window is read, and none is opened twice in an epoch.
    shards_opened = [name for url, name in opens if name.startswith("train-")]
    assert len(shards_opened) <= epochs * len(source.shards)


def test_a_split_keeps_its_most_recently_read_shards_open_and_closes_the_oldest(packed):
    source = _split(packed, window=1)  # two files open at most
    opened: list[int] = []
    first_of = {int(shard): int(row) for row, shard in reversed(list(enumerate(source.rows[:, 0])))}
    original = source._handle

    def handle(shard):
        if shard not in source._open:
            opened.append(shard)
        return original(shard)

    source._handle = handle
    for shard in (0, 1, 0, 2, 0, 1):
        source[first_of[shard]]
    # 0 was read after 1, so opening 2 closes 1, not 0; then 1 is opened again.
    assert opened == [0, 1, 2, 1]
    assert list(source._open) == [0, 1]
    assert all(not h.closed for h in source._open.values())


def test_the_s3_cache_evicts_the_least_recently_used_shard_not_the_oldest_download(
    packed, monkeypatch, tmp_path, s3_in_process
):
    upload(s3_in_process, packed, "lru", "data")
    manifest = parse_manifest(LocalStore(packed).manifest(), "here")
    a, b, c = manifest.splits["train"][:3]
    room = a.size + b.size + c.size - 1  # two of them fit, never three
    cache = S3Store("s3://lru/data", str(tmp_path), room / (1 << 30), None)
    times = iter(range(1_000, 2_000, 10))  # a clock that always moves on

    def touch(path, *args, **kwargs):
        tick = next(times)
        return original_utime(path, (tick, tick), follow_symlinks=False)

    original_utime = store.os.utime
    monkeypatch.setattr(store.os, "utime", touch)
    for shard in (a, b, a, c):
        with store.open_shard(cache, shard) as handle:
            assert len(handle.read()) == shard.size
    held = sorted(path.name for path in cache.cache.glob("*.tar"))
    # b was used before a's second use: it goes, a stays with the new c.
    assert held == sorted([a.name, c.name])
    assert sum((cache.cache / name).stat().st_size for name in held) <= cache.limit
