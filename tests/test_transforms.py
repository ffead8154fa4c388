"""Each image step (repro.core.data.transforms) against what its docstring says it does, written
again with numpy and plain slicing; test_counter_draws.py has the batch forms agreeing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional

from repro.core.data import transforms
from repro.core.data.transforms import (
    CenterCrop,
    Cutout,
    HorizontalFlip,
    RandomCrop,
    ResizeShorter,
    TorchvisionSteps,
)
from repro.core.runtime import seeding
from repro.core.runtime.seeding import SampleKeys

STREAM = seeding.stream_seed(11, "augment")
NUMPY_MODES = {"zeros": "constant", "reflect": "reflect", "edge": "edge"}


def image(height: int = 5, width: int = 7, channels: int = 2) -> torch.Tensor:
    values = torch.arange(channels * height * width) % 251 + 1  # no zeros of its own
    return values.to(torch.uint8).view(channels, height, width)


@pytest.mark.parametrize(("mode", "padding"), [("zeros", 3), ("reflect", 2), ("edge", 9)])
def test_padding_is_numpys_constant_reflect_and_edge(mode, padding):
    picture = image()
    padded = transforms.pad(picture, padding, mode)
    expected = np.pad(picture.numpy(), ((0, 0), (padding,) * 2, (padding,) * 2), NUMPY_MODES[mode])
    assert np.array_equal(padded.numpy(), expected)
    batch = torch.stack([picture, picture.flip(-1)])
    assert torch.equal(transforms.pad(batch, padding, mode)[0], padded)


def corners(step, shape, count=3000):
    keys = SampleKeys(STREAM, 0, torch.arange(count))
    return step.draw(keys, *shape)


def test_a_crop_corner_covers_every_position_of_the_padded_image_and_no_more():
    top, left = corners(RandomCrop(4, padding=2), (5, 7))
    assert sorted(set(top.tolist())) == list(range(-2, 5 - 4 + 2 + 1))
    assert sorted(set(left.tolist())) == list(range(-2, 7 - 4 + 2 + 1))


@pytest.mark.parametrize("mode", ["zeros", "reflect", "edge"])
def test_a_crop_is_the_window_of_the_padded_image_at_its_corner(mode):
    picture, crop = image(), RandomCrop(4, padding=2, mode=mode)
    padded = np.pad(picture.numpy(), ((0, 0), (2, 2), (2, 2)), NUMPY_MODES[mode])
    seen_inside = False
    for index in range(60):
        keys = SampleKeys(STREAM, 1, index)
        top, left = crop.draw(keys, 5, 7)
        expected = padded[:, top + 2 : top + 6, left + 2 : left + 6]
        cropped = crop(picture, keys)
        assert np.array_equal(cropped.numpy(), expected), index
        if 0 <= top <= 1 and 0 <= left <= 3:
            seen_inside = True
            assert cropped.untyped_storage().data_ptr() == picture.untyped_storage().data_ptr()
    assert seen_inside


def test_a_random_flip_mirrors_exactly_the_samples_its_draw_says():
    picture = image()
    flip = HorizontalFlip(p=0.3)
    keys = SampleKeys(STREAM, 4, torch.arange(2000))
    drawn = keys.below(transforms.FLIP, 0.3)
    assert torch.equal(flip.draw(keys), drawn) and 0.25 < drawn.float().mean() < 0.35
    for index in range(8):
        one = SampleKeys(STREAM, 4, index)
        expected = picture.flip(-1) if one.below(transforms.FLIP, 0.3) else picture
        assert torch.equal(flip(picture, one), expected)
    assert not HorizontalFlip(p=0.0).draw(keys).any() and HorizontalFlip(p=1.0).draw(keys).all()


def test_an_alternating_flip_turns_every_image_over_in_each_epoch_after_the_first():
    flip, first_flip = HorizontalFlip(alternate=True), HorizontalFlip()
    indices = torch.arange(500)
    first = first_flip.draw(SampleKeys(STREAM, 0, indices))
    for epoch in range(4):
        drawn = flip.draw(SampleKeys(STREAM, epoch, indices))
        assert torch.equal(drawn, first if epoch % 2 == 0 else ~first), epoch
        assert flip.draw(SampleKeys(STREAM, epoch, 3)) == bool(drawn[3])
    batch = torch.stack([image()] * 4)
    flipped = flip.batch(batch, SampleKeys(STREAM, 1, torch.arange(4)))
    assert flipped.is_contiguous()


def test_a_cutout_blacks_out_one_square_wholly_inside_the_image():
    cutout, picture = Cutout(3), image(6, 9)
    top, left = corners(cutout, (6, 9))
    assert sorted(set(top.tolist())) == list(range(6 - 3 + 1))
    assert sorted(set(left.tolist())) == list(range(9 - 3 + 1))
    for index in range(20):
        keys = SampleKeys(STREAM, 2, index)
        top, left = cutout.draw(keys, 6, 9)
        expected = picture.clone()
        expected[:, top : top + 3, left : left + 3] = 0
        assert torch.equal(cutout(picture, keys), expected)
        batch = cutout.batch(picture[None], SampleKeys(STREAM, 2, torch.tensor([index])))
        assert torch.equal(batch[0], expected)
    assert picture.min() > 0, "the image itself is left as it was"


def test_a_cutouts_bands_mark_the_squares_rows_for_each_start():
    bands = Cutout(3).bands(7, torch.device("cpu"))
    assert bands.shape == (5, 7) and bands.dtype == torch.bool
    for start in range(5):
        assert bands[start].nonzero().flatten().tolist() == [start, start + 1, start + 2]
    assert Cutout(3).bands(7, torch.device("cpu")) is bands, "made once"


def test_draws_already_on_the_devices_stay_as_they_are():
    like, draws = torch.zeros(2), (torch.tensor([1, 2]), torch.tensor([3, 4]))
    kept = transforms.on_device_of(like, *draws)
    assert all(out is draw for out, draw in zip(kept, draws, strict=True))
    moved = transforms.on_device_of(torch.zeros(2, device="meta"), *draws)
    assert [draw.device.type for draw in moved] == ["meta", "meta"]
    with pytest.raises(AssertionError, match=r"^one dtype, one device"):
        transforms.on_device_of(torch.zeros(2, device="meta"), draws[0], draws[1].float())


@pytest.mark.parametrize(
    ("shape", "resized"), [((10, 15), (4, 6)), ((15, 10), (6, 4)), ((9, 9), (4, 4))]
)
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_resizing_sets_the_shorter_side_and_keeps_the_aspect(shape, resized, mode):
    picture = (torch.arange(3 * shape[0] * shape[1]) * 37 % 256).to(torch.uint8)
    picture = picture.view(3, *shape)
    out = ResizeShorter(4, mode)(picture, None)
    expected = functional.interpolate(
        picture[None].float(), size=resized, mode=mode, antialias=True, align_corners=False
    )[0]
    assert out.dtype == torch.uint8 and out.shape == (3, *resized)
    assert torch.equal(out, expected.round().clamp(0, 255).to(torch.uint8))
    same = ResizeShorter(min(shape))
    assert same(picture, None) is picture


def test_a_resize_never_makes_a_side_shorter_than_asked():
    thin = torch.zeros(1, 3, 400, dtype=torch.uint8)
    assert ResizeShorter(2)(thin, None).shape == (1, 2, 267)
    assert ResizeShorter(3)(torch.zeros(1, 4, 5, dtype=torch.uint8), None).shape == (1, 3, 4)


def test_a_centre_crop_takes_the_middle_rounding_up_and_left():
    picture = image(8, 9)
    assert torch.equal(CenterCrop(3)(picture, None), picture[:, 2:5, 3:6])
    batch = CenterCrop(3).batch(torch.stack([picture, picture]), None)
    assert batch.is_contiguous() and torch.equal(batch[1], picture[:, 2:5, 3:6])


def test_a_pipeline_splits_into_its_per_sample_head_and_its_batchable_tail():
    resize, crop, flip = ResizeShorter(8), RandomCrop(4, 1), HorizontalFlip()
    extra = TorchvisionSteps([abs])
    for steps, head in [
        ([resize, crop, flip], [resize]),
        ([crop, extra, flip], [crop, extra]),
        ([crop, flip], []),
        ([resize], [resize]),
        ([], []),
    ]:
        per_sample, tail = transforms.Compose(steps).split()
        assert per_sample.steps == head and tail.steps == steps[len(head) :], steps


def test_the_defaults_pad_with_zeros_and_resize_bilinearly():
    assert (RandomCrop(4).padding, RandomCrop(4).mode) == (0, "zeros")
    assert ResizeShorter(4).mode == "bilinear" and HorizontalFlip().p == 0.5
    crop, flip = transforms.build(True, 8, None, 2).steps
    assert crop.mode == "zeros" and not flip.alternate
    resize, _ = transforms.build(False, 8, 10, 2).steps
    assert resize.mode == "bilinear"


def test_a_resize_that_overshoots_is_clamped_to_bytes():
    edges = torch.zeros(1, 4, 4, dtype=torch.uint8)
    edges[:, ::2, ::2] = 255  # enlarged, a bicubic kernel overshoots both ways at such edges
    raw = functional.interpolate(
        edges[None].float(), size=(9, 9), mode="bicubic", antialias=True, align_corners=False
    )[0].round()
    assert raw.min() < 0 and raw.max() > 255
    assert torch.equal(ResizeShorter(9, "bicubic")(edges, None), raw.clamp(0, 255).to(torch.uint8))


def test_torchvision_steps_draw_from_the_samples_keys_and_leave_torchs_generator():
    drawn = []

    def noisy(picture):
        drawn.append(torch.rand(2))
        return picture + 1

    keys = SampleKeys(STREAM, 3, 5)
    seed = keys.bits(transforms.TORCHVISION_SEED_LOW)
    # The high word a 64-bit seed would add: torch's CPU generator reads the low 32 bits only.
    wide = torch.Generator().manual_seed(keys.bits(transforms.TORCHVISION_SEED_HIGH) << 32 | seed)
    assert torch.equal(
        torch.rand(3, generator=wide), torch.rand(3, generator=torch.Generator().manual_seed(seed))
    )
    torch.manual_seed(0)
    before = torch.get_rng_state()
    out = TorchvisionSteps([noisy, noisy])(torch.zeros(1), keys)
    assert out.tolist() == [2.0] and torch.equal(torch.get_rng_state(), before)
    expected = torch.rand(4, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(torch.cat(drawn), expected)

    def failing(picture):
        torch.rand(1)
        raise ValueError("bad transform")

    with pytest.raises(ValueError):
        TorchvisionSteps([failing])(torch.zeros(1), keys)
    assert torch.equal(torch.get_rng_state(), before)


def kinds(pipeline):
    return [type(step).__name__ for step in pipeline.steps]


def test_the_pipelines_hold_the_steps_asked_for_in_order():
    assert kinds(transforms.build(False, 32, None, 4)) == []
    assert kinds(transforms.build(False, 32, 36, 4)) == ["ResizeShorter", "CenterCrop"]
    assert kinds(transforms.build(False, 32, 36, 4, resized=True)) == ["CenterCrop"]
    options = {"flip": "alternate", "padding_mode": "edge", "cutout": 8, "extra": [abs]}
    full = transforms.build(True, 32, 36, 4, interpolation="bicubic", **options)
    assert kinds(full) == [
        "ResizeShorter",
        "RandomCrop",
        "HorizontalFlip",
        "Cutout",
        "TorchvisionSteps",
    ]
    resize, crop, flip, cutout, extra = full.steps
    assert (resize.size, resize.mode) == (36, "bicubic")
    assert (crop.size, crop.padding, crop.mode) == (32, 4, "edge")
    assert flip.alternate and flip.p == 0.5 and cutout.size == 8 and extra.transforms == [abs]
    assert not transforms.build(True, 32, None, 4).steps[1].alternate
    assert kinds(transforms.build(True, 32, None, 4, crop_flip=False)) == []
    assert not full.batchable and transforms.build(True, 32, None, 4, cutout=2).batchable
