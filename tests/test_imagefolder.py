"""Training on a user's own ImageFolder tree: any image size, resize and crop from the config."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from repro.core.data.sources import ImageFiles
from repro.core.data.transforms import CenterCrop, ResizeShorter
from repro.core.errors import DataError

from conftest import (
    IMAGEFOLDER,
    IMAGEFOLDER_EPOCHS,
    ROOT,
    SHAPES,
    compose_config,
    make_image_tree,
    run_cli,
    train_in_process,
)


def test_learns_a_tree_of_pngs_of_any_size(image_tree, tmp_path):
    summary = train_in_process(tmp_path / "run", *IMAGEFOLDER, f"data.root={image_tree}")
    assert summary["completed"] and summary["total_steps"] == IMAGEFOLDER_EPOCHS * (3 * 12 // 12)
    assert summary["val_acc"] >= 0.6, summary  # three classes: chance is 1/3
    assert summary["data"]["classes"] == 3  # inferred from the class folders


def test_classes_follow_folder_names_and_images_decode_to_uint8_chw(tmp_path):
    root = make_image_tree(tmp_path / "images", 2)
    files = ImageFiles.from_folder(root / "train", sorted(SHAPES))
    assert len(files) == 6 and sorted(set(files.labels)) == [0, 1, 2]
    image, _ = files[0]
    assert image.dtype.is_floating_point is False and image.shape[0] == 3
    resized = ResizeShorter(36)(image, None)
    assert min(resized.shape[1:]) == 36
    assert CenterCrop(32)(resized, None).shape == (3, 32, 32)


def test_an_unreadable_image_is_named(tmp_path):
    root = make_image_tree(tmp_path / "images", 2)
    broken = root / "train" / "bar" / "broken.png"
    broken.write_bytes(b"this is not a png")
    files = ImageFiles.from_folder(root / "train", sorted(SHAPES))
    with pytest.raises(DataError, match=r"broken\.png: not a readable image"):
        files[files.paths.index(broken)]


@pytest.mark.e2e
@pytest.mark.slow
def test_an_unreadable_image_in_a_worker_is_one_clean_line(tmp_path):
    root = make_image_tree(tmp_path / "images", 2)
    (root / "train" / "bar" / "broken.png").write_bytes(b"this is not a png")
    done = run_cli(
        "repro.train",
        *IMAGEFOLDER,
        f"data.root={root}",
        "dataloader=default",
        "trainer.batch_size=2",
        "trainer.test_weights=last",  # 6 validation images
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 2
    assert "broken.png: not a readable image" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_without_val_folder_a_seeded_part_of_train_is_held_out(tmp_path):
    from repro.core.data.datasets import build_splits
    from repro.core.runtime import seeding

    root = make_image_tree(tmp_path / "images", 10)
    for image in (root / "val").rglob("*.png"):
        image.unlink()
    for folder in sorted((root / "val").iterdir()):
        folder.rmdir()
    (root / "val").rmdir()
    cfg = compose_config(*IMAGEFOLDER, f"data.root={root}", "data.val_size=6")
    first = build_splits(cfg.data, seeding.stream_seed(0, "x"))
    again = build_splits(cfg.data, seeding.stream_seed(0, "x"))
    other = build_splits(cfg.data, seeding.stream_seed(1, "x"))
    assert (len(first.train), len(first.val)) == (24, 6)
    assert first.val.paths == again.val.paths != other.val.paths
    assert not set(first.val.paths) & set(first.train.paths)
    assert first.test is first.val


def test_missing_class_folder_in_val(tmp_path):
    root = make_image_tree(tmp_path / "images", 1)
    for image in (root / "val" / "bar").iterdir():
        image.unlink()
    (root / "val" / "bar").rmdir()
    with pytest.raises(DataError, match="missing class folders"):
        train_in_process(tmp_path / "run", *IMAGEFOLDER, f"data.root={root}")


# A zip of CIFAR-10 as JPEGs (train/<class>/*.jpg, test/<class>/*.jpg): REPRO_CIFAR10_JPEG,
# else the developers' shared copy beside the checkout.
CIFAR_JPEG = Path(
    os.environ.get("REPRO_CIFAR10_JPEG") or ROOT.parent / "shared" / "data" / "cifar10-jpeg.zip"
)


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_JPEG.exists(), reason=f"{CIFAR_JPEG} is absent")
def test_cifar10_jpeg_subset_trains_above_chance(tmp_path):
    """Real images in the archive's own layout (train/, test/): 300 + 100 JPEGs per class."""
    root = tmp_path / "cifar"
    with zipfile.ZipFile(CIFAR_JPEG) as archive:
        names = sorted(n for n in archive.namelist() if n.endswith(".jpg"))
        counts: dict[tuple[str, str], int] = {}
        for name in names:
            split, cls = name.split("/")[-3:-1]
            key = (split, cls)
            limit = 100 if split == "test" else 300
            if counts.get(key, 0) < limit:
                counts[key] = counts.get(key, 0) + 1
                target = root / key[0] / cls / Path(name).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
    summary = train_in_process(
        tmp_path / "run",
        "data=imagefolder",
        f"data.root={root}",
        "data.resize=32",
        "data.crop_padding=4",
        "data.val_size=500",
        "trainer.epochs=4",
        "trainer.batch_size=100",
        "dataloader.num_workers=2",
        "logger.plot=false",
    )
    assert summary["val_acc"] > 0.2  # chance is 0.1


def test_every_image_trains_from_memory_on_the_device_loader_with_no_validation_split(tmp_path):
    import shutil

    from conftest import IMAGEFOLDER, make_image_tree, train_in_process

    root = make_image_tree(tmp_path / "images")
    shutil.rmtree(root / "val")  # data.val_size images of train/ would be held out: none here
    overrides = [o for o in IMAGEFOLDER if not o.startswith("dataloader=")]
    summary = train_in_process(
        tmp_path / "run",
        *overrides,
        f"data.root={root}",
        "data.cache=memory",
        "dataloader=device",
        "data.val_size=0",
        "trainer.test_weights=last",
        "trainer.max_steps=2",
    )
    assert summary["step"] == 2 and summary["data"]["splits"]["train"]["images"] == 36
