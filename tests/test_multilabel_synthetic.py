"""`data=synthetic_multilabel` (repro.extras.multilabel.synthetic), pixel by pixel: each image is a
2x2 grid of the synthetic shapes at half size, its target the multi-hot row of their classes;
the pixels come from the generator seed alone, the split from the run's seed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from repro.core.data import synthetic as shapes
from repro.core.errors import ConfigError
from repro.extras.multilabel.synthetic import generate, synthetic_multilabel


def _half_size(tile: torch.Tensor) -> torch.Tensor:
    """The rounded mean of each 2x2 block of pixels, in integers."""
    c, h, w = tile.shape
    blocks = tile.to(torch.int32).reshape(c, h // 2, 2, w // 2, 2)
    return ((blocks.sum((2, 4)) + 2) // 4).to(torch.uint8)


def test_each_image_is_four_half_size_shapes_left_to_right_then_down():
    images, targets = generate(3, seed=7, classes=6)
    tiles, labels = shapes.generate(3 * 4, 7, 6)
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.uint8
    for image in range(3):
        for k in range(4):
            row, col = divmod(k, 2)
            placed = images[image, :, 16 * row : 16 * row + 16, 16 * col : 16 * col + 16]
            assert torch.equal(placed, _half_size(tiles[4 * image + k])), (image, k)
        expected = torch.zeros(6)
        expected[labels[4 * image : 4 * image + 4]] = 1.0
        assert torch.equal(targets[image], expected) and targets.dtype == torch.float32


def _cfg(**settings) -> SimpleNamespace:
    base = {"num_classes": 4, "train_size": 12, "val_size": 4, "test_size": 5, "generator_seed": 3}
    return SimpleNamespace(**{**base, **settings})


def test_the_splits_pixels_come_from_the_generator_seed_and_the_run_seed_picks_validation():
    data = synthetic_multilabel(_cfg(), split_seed=1)
    assert (len(data.train), len(data.val), len(data.test)) == (12, 4, 5)
    assert data.classes == list(shapes.CLASSES[:4])
    pool_images, pool_targets = generate(16, 3, 4)
    test_images, test_targets = generate(5, 3 + 1_000_003, 4)
    assert torch.equal(data.test.images, test_images)
    assert torch.equal(data.test.labels, test_targets)

    def rows(images: torch.Tensor, targets: torch.Tensor) -> list[bytes]:
        pairs = zip(images, targets, strict=True)
        return sorted(image.numpy().tobytes() + row.numpy().tobytes() for image, row in pairs)

    split = rows(data.train.images, data.train.labels) + rows(data.val.images, data.val.labels)
    assert sorted(split) == rows(pool_images, pool_targets)  # the pool, each with its target
    again = synthetic_multilabel(_cfg(), split_seed=1)
    assert torch.equal(again.val.images, data.val.images)  # the run's seed, nothing else
    other = synthetic_multilabel(_cfg(), split_seed=2)
    assert torch.equal(other.test.images, data.test.images)
    assert not torch.equal(other.val.images, data.val.images)


@pytest.mark.parametrize("classes", [None, 1, len(shapes.CLASSES) + 1])
def test_a_class_count_the_shapes_cannot_give_is_named(classes):
    with pytest.raises(ConfigError) as refused:
        synthetic_multilabel(_cfg(num_classes=classes), split_seed=0)
    allowed = f"2..{len(shapes.CLASSES)} for synthetic_multilabel"
    assert str(refused.value) == f"data.num_classes={classes!r} is not allowed: {allowed}"


@pytest.mark.parametrize("classes", [2, len(shapes.CLASSES)])
def test_two_classes_up_to_all_the_shapes_are_taken(classes):
    data = synthetic_multilabel(_cfg(num_classes=classes), split_seed=0)
    assert data.train.labels.shape == (12, classes) and len(data.classes) == classes
