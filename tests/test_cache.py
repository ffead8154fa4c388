"""data.cache=memory: image files decoded once into one tensor, with the same results."""

from __future__ import annotations

import pytest
import torch

from repro.core import build
from repro.core.data.loader import EvalView, TrainView, sample_then_batch
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.data.transforms import Compose, ResizeShorter
from repro.core.errors import ConfigError, DataError

from conftest import SHAPES, compose_config, make_image_tree, train_in_process

FOLDER = [
    "data=imagefolder", "data.image_size=32", "data.resize=36", "trainer.batch_size=12",
    "trainer.eval_batch_size=16", "trainer.epochs=2", "model.widths=[8,16]", "dataloader=debug",
    "logger.plot=false", "logger.fingerprint_every_steps=1",
    "trainer.test_weights=last",  # a few validation images: too few to select by
]  # fmt: skip


def test_a_cached_tree_trains_to_the_same_weights_as_one_read_from_disk(tmp_path):
    root = make_image_tree(tmp_path / "images", side=40)  # one size: the cache is exact
    runs = {}
    for cache in ("none", "memory"):
        run_dir = tmp_path / cache
        runs[cache] = train_in_process(run_dir, *FOLDER, f"data.root={root}", f"data.cache={cache}")
    assert runs["none"]["weights_sha256"] == runs["memory"]["weights_sha256"]
    assert runs["none"]["val_loss"] == runs["memory"]["val_loss"]


def test_the_cache_holds_resized_images_and_takes_the_in_memory_paths(tmp_path):
    root = make_image_tree(tmp_path / "images", 3, side=40)
    cfg = compose_config(*FOLDER, f"data.root={root}", "data.cache=memory")
    splits = build.splits(cfg, 0)
    assert isinstance(splits.train, TensorImages) and splits.resized
    assert splits.train.images.shape == (9, 3, 36, 36)  # shorter side to data.resize
    train, evaluate = build.pipelines(cfg, resized=True)
    assert train.batchable and evaluate.batchable  # no per-sample resize left
    device = compose_config(*FOLDER, f"data.root={root}", "data.cache=memory", "dataloader=device")
    summary = train_in_process(tmp_path / "run", *FOLDER, f"data.root={root}", "data.cache=memory",
                               "dataloader=device", "trainer.batch_size=3")  # fmt: skip
    assert device.dataloader.on_device and summary["completed"]


def test_the_decoding_bar_follows_logger_progress(tmp_path, capsys):
    root = make_image_tree(tmp_path / "images", 2, side=40)
    shown = {}
    for setting in ("on", "off", "auto"):  # auto: stdout is not a terminal under pytest
        build.splits(compose_config(*FOLDER, f"data.root={root}", "data.cache=memory",
                                    f"logger.progress={setting}"), 0)  # fmt: skip
        shown[setting] = "decoding train" in capsys.readouterr().out
    assert shown == {"on": True, "off": False, "auto": False}


def test_images_of_several_sizes_need_a_resize_to_be_cached(tmp_path):
    root = make_image_tree(tmp_path / "images", 2)  # uneven, non-square sizes
    refused = compose_config(*FOLDER, f"data.root={root}", "data.cache=memory", "data.resize=null")
    with pytest.raises(ConfigError, match=r"data.resize=None .*several sizes"):
        build.splits(refused, 0)
    squared = build.splits(compose_config(*FOLDER, f"data.root={root}", "data.cache=memory"), 0)
    assert squared.train.images.shape[1:] == (3, 36, 36)  # centre-cropped to squares


def test_a_cache_over_its_budget_is_refused_before_decoding_everything(tmp_path):
    root = make_image_tree(tmp_path / "images", 2, side=40)
    cfg = compose_config(
        *FOLDER, f"data.root={root}", "data.cache=memory", "data.cache_budget_gib=0.00001"
    )
    with pytest.raises(ConfigError, match=r"data.cache_budget_gib=1e-05 .*GiB to cache"):
        build.splits(cfg, 0)


@pytest.mark.parametrize("side", [40, None])  # one size: cropped as a batch; several: one by one
def test_files_are_read_one_by_one_and_come_out_as_one_batch(tmp_path, side):
    root = make_image_tree(tmp_path / "images", 4, side=side)
    cfg = compose_config(*FOLDER, f"data.root={root}")
    files = ImageFiles.from_folder(root / "train", sorted(SHAPES))
    train, evaluate = build.pipelines(cfg)
    view = TrainView(files, train, augment_stream=5)
    keys = [(3, index) for index in (7, 0, 11, 2)]
    batch = view.__getitems__(keys)
    one_by_one = torch.stack([view[key][0] for key in keys])
    assert torch.equal(batch.images, one_by_one)
    assert batch.labels.tolist() == [files.labels[index] for _, index in keys]
    plain = EvalView(files, evaluate).__getitems__([1, 5])
    assert torch.equal(plain.images, torch.stack([EvalView(files, evaluate)[i][0] for i in (1, 5)]))


def test_files_that_stay_of_several_sizes_come_back_as_samples(tmp_path):
    root = make_image_tree(tmp_path / "images", 2)
    files = ImageFiles.from_folder(root / "train", sorted(SHAPES))
    uneven = sample_then_batch(files, Compose([ResizeShorter(32)]), [0, 1, 2])
    assert isinstance(uneven, list) and len({image.shape for image, _ in uneven}) > 1


def test_an_unreadable_image_stops_the_cache_naming_the_file(tmp_path):
    root = make_image_tree(tmp_path / "images", 2, side=40)
    (root / "train" / "bar" / "broken.png").write_bytes(b"this is not a png")
    cfg = compose_config(*FOLDER, f"data.root={root}", "data.cache=memory")
    with pytest.raises(DataError, match=r"broken\.png: not a readable image"):
        build.splits(cfg, 0)
