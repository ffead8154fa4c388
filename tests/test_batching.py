"""Whole batches of an in-memory split (repro.core.data.batching): the per-sample bytes and targets,
whichever kind of maker the pipeline gets, for targets of any shape."""

from __future__ import annotations

import pytest
import torch

from repro.core.data import transforms
from repro.core.data.batching import BatchMaker, CropFlipTable, Gathered, over
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.runtime import seeding
from repro.core.runtime.seeding import SampleKeys

STREAM = seeding.stream_seed(5, "augment")
INDICES = [4, 0, 9, 9, 2]


def images(count: int = 12, channels: int = 3, size: int = 6) -> torch.Tensor:
    generator = torch.Generator().manual_seed(count * channels + size)
    shape = (count, channels, size, size)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)


def one_by_one(pipeline, data: torch.Tensor, indices, epoch: int | None) -> torch.Tensor:
    def keys(i):
        return None if epoch is None else SampleKeys(STREAM, epoch, i)

    return torch.stack([pipeline(data[i], keys(i)) for i in indices])


def test_a_crop_first_pipeline_becomes_one_gather_keeping_its_flip_and_the_steps_after():
    data = images()
    crop_flip = transforms.build(True, 6, None, crop_padding=2)
    table = over(crop_flip, data)
    assert isinstance(table, CropFlipTable) and table.flip is crop_flip.steps[1]
    assert table.crop is crop_flip.steps[0] and table.then is None
    crop_only = transforms.build(True, 6, None, crop_padding=2, crop_flip=False)
    crop_only.steps = [transforms.RandomCrop(6, 2)]
    assert over(crop_only, data).flip is None
    with_cutout = transforms.build(True, 6, None, crop_padding=2, cutout=3)
    table = over(with_cutout, data)
    assert [type(step) for step in table.then.steps] == [transforms.Cutout]


@pytest.mark.parametrize(
    "steps",
    [
        [transforms.HorizontalFlip(), transforms.RandomCrop(6, 2)],  # the flip first
        [transforms.CenterCrop(4)],
        [],
    ],
)
def test_any_other_pipeline_is_a_gather_then_its_batch_form(steps):
    data = images()
    pipeline = transforms.Compose(steps)
    maker = over(pipeline, data)
    assert isinstance(maker, Gathered)
    indices = torch.tensor(INDICES)
    keys = SampleKeys(STREAM, 2, indices)
    assert torch.equal(maker(indices, keys), one_by_one(pipeline, data, INDICES, 2))
    assert torch.equal(maker.locate(indices, keys), indices), "a gather is located by index"


@pytest.mark.parametrize(("channels", "padding"), [(1, 0), (3, 1), (2, 4)])
def test_the_table_gives_each_samples_crop_and_flip(channels, padding):
    data = images(channels=channels)
    for pipeline in (
        transforms.build(True, 6, None, crop_padding=padding),
        transforms.Compose([transforms.RandomCrop(6, padding, "edge")]),
        transforms.build(True, 6, None, crop_padding=padding, padding_mode="reflect", cutout=2),
    ):
        indices = torch.tensor(INDICES)
        for epoch in (0, 3):
            made = over(pipeline, data)(indices, SampleKeys(STREAM, epoch, indices))
            assert torch.equal(made, one_by_one(pipeline, data, INDICES, epoch))


def test_a_crop_smaller_than_the_image_reads_its_own_rows():
    data = images(size=7)
    pipeline = transforms.Compose([transforms.RandomCrop(4, 1), transforms.HorizontalFlip()])
    indices = torch.tensor(INDICES)
    made = over(pipeline, data)(indices, SampleKeys(STREAM, 1, indices))
    assert made.shape == (5, 3, 4, 4)
    assert torch.equal(made, one_by_one(pipeline, data, INDICES, 1))


def test_a_maker_gives_class_indices_with_the_per_sample_images():
    data, labels = images(), torch.arange(12) % 4
    pipeline = transforms.build(True, 6, None, crop_padding=2)
    maker = BatchMaker(TensorImages(data, labels), pipeline, stream=STREAM)
    batch = maker(INDICES, epoch=3)
    assert torch.equal(batch.images, one_by_one(pipeline, data, INDICES, 3))
    assert torch.equal(batch.labels, labels[INDICES]) and batch.labels.dtype == torch.int64
    again = maker(torch.tensor(INDICES), epoch=3)
    assert torch.equal(again.images, batch.images), "a list and a tensor of indices agree"
    assert not torch.equal(maker(INDICES, epoch=4).images, batch.images), "the epoch keys draws"


@pytest.mark.parametrize(
    "labels",
    [
        (torch.arange(36).view(12, 3) % 2).float(),  # multi-hot
        torch.softmax(torch.arange(48, dtype=torch.float64).view(12, 4), dim=1),  # soft
        torch.arange(12, dtype=torch.float32) / 7,  # one value per image
    ],
)
def test_targets_of_any_shape_and_dtype_come_with_their_images_unchanged(labels):
    data = images()
    pipeline = transforms.build(True, 6, None, crop_padding=1)
    batch = BatchMaker(TensorImages(data, labels), pipeline, stream=STREAM)(INDICES, epoch=0)
    assert batch.labels.dtype == labels.dtype and torch.equal(batch.labels, labels[INDICES])
    assert torch.equal(batch.images, one_by_one(pipeline, data, INDICES, 0))


def test_without_an_epoch_nothing_is_drawn():
    data = images()
    pipeline = transforms.build(False, 4, None, crop_padding=0)
    batch = BatchMaker(TensorImages(data, torch.zeros(12)), pipeline)(INDICES)
    assert torch.equal(batch.images, one_by_one(pipeline, data, INDICES, None))


def test_a_maker_only_for_a_split_in_memory_and_a_pipeline_with_a_batch_form(tmp_path):
    held = TensorImages(images(), torch.arange(12))
    pipeline = transforms.build(True, 6, None, crop_padding=2)
    maker = BatchMaker.of(held, pipeline, stream=17)
    assert isinstance(maker, BatchMaker) and maker.stream == 17
    assert isinstance(maker.make, CropFlipTable)
    resizing = transforms.build(True, 6, 8, crop_padding=2)
    assert not resizing.batchable and BatchMaker.of(held, resizing) is None
    files = ImageFiles([tmp_path / "a.png"], [0])
    assert BatchMaker.of(files, pipeline) is None
