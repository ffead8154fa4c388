"""Counter-based augmentation draws: a pure function of (stream, epoch, index, draw), the same
for one sample or a batch, on the CPU or a GPU, and random enough to augment with."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.nn import functional

from repro.core.data import transforms
from repro.core.data.batching import over
from repro.core.data.loader import TrainView
from repro.core.data.sources import TensorImages
from repro.core.runtime import seeding
from repro.core.runtime.seeding import SampleKeys

STREAM = seeding.stream_seed(3, "augment")


def test_a_samples_draws_do_not_depend_on_its_batch_or_its_neighbours():
    first = SampleKeys(STREAM, 4, torch.tensor([5, 9, 2]))
    second = SampleKeys(STREAM, 4, torch.tensor([2, 100, 5, 7]))
    for draw, high in ((0, 9), (1, 9), (2, 1000)):
        a, b = first.integers(draw, high), second.integers(draw, high)
        assert a[0] == b[2] and a[2] == b[0]
        # One sample alone, with Python ints (the per-sample path), gives the same numbers.
        assert [SampleKeys(STREAM, 4, i).integers(draw, high) for i in (5, 9, 2)] == a.tolist()


def test_draws_are_uniform_and_differ_across_samples_epochs_and_draw_numbers():
    indices = torch.arange(200_000)
    keys = SampleKeys(STREAM, 0, indices)
    counts = torch.bincount(keys.integers(0, 10), minlength=10).double()
    expected = len(indices) / 10
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 30, f"9 degrees of freedom: p < 0.001 beyond 27.9 ({chi_square})"
    flips = keys.below(2, 0.5).double().mean().item()
    assert abs(flips - 0.5) < 0.005
    bits = keys.bits(0)
    assert len(torch.unique(bits)) > 0.999 * len(indices), "distinct samples, distinct draws"
    next_epoch = SampleKeys(STREAM, 1, indices).bits(0)
    assert (next_epoch == bits).double().mean() < 1e-4, "another epoch, other draws"
    # Neither a neighbouring index nor another draw number of the same sample is correlated.
    top, left = keys.integers(0, 9).double(), keys.integers(1, 9).double()
    assert abs(torch.corrcoef(torch.stack([top, left]))[0, 1]) < 0.01
    assert abs(torch.corrcoef(torch.stack([top[1:], top[:-1]]))[0, 1]) < 0.01
    other_stream = SampleKeys(seeding.stream_seed(4, "augment"), 0, indices).bits(0)
    assert (other_stream == bits).double().mean() < 1e-4, "another seed, other draws"


@pytest.mark.parametrize(
    ("mode", "padding"), [("zeros", 3), ("reflect", 3), ("edge", 3), ("zeros", 10), ("edge", 10)]
)
def test_batched_crop_and_flip_give_the_per_sample_bytes(mode, padding):
    """Also with crops wholly inside a padding wider than the image."""
    images = torch.randint(0, 256, (50, 3, 8, 8), dtype=torch.uint8)
    pipeline = transforms.build(True, 8, None, crop_padding=padding, padding_mode=mode)
    indices = torch.tensor([7, 3, 3, 41, 0, 12])
    batched = over(pipeline, images)(indices, SampleKeys(STREAM, 5, indices))
    one_by_one = [pipeline(images[i], SampleKeys(STREAM, 5, int(i))) for i in indices]
    assert torch.equal(batched, torch.stack(one_by_one))
    plain = pipeline.batch(images[indices], SampleKeys(STREAM, 5, indices))
    assert torch.equal(plain, batched), "the gather table and the plain batch ops agree"


def test_alternating_flips_turn_every_sample_over_each_epoch_the_same_per_sample_and_batched():
    flip = transforms.HorizontalFlip(alternate=True)
    indices = torch.arange(20_000)
    flips = [flip.draw(SampleKeys(STREAM, epoch, indices)) for epoch in range(4)]
    assert abs(flips[0].double().mean().item() - 0.5) < 0.01, "the first epoch at random"
    for before, after in itertools.pairwise(flips):
        assert torch.equal(after, ~before), "every sample the other way in the next epoch"
    assert [flip.draw(SampleKeys(STREAM, 3, int(i))) for i in indices[:50]] == flips[3][
        :50
    ].tolist()
    randomly = transforms.HorizontalFlip().draw(SampleKeys(STREAM, 1, indices))
    assert not torch.equal(randomly, ~flips[0]), "random flips do not alternate"
    images = torch.randint(0, 256, (50, 3, 8, 8), dtype=torch.uint8)
    pipeline = transforms.build(True, image_size=8, resize=None, crop_padding=2, flip="alternate")
    picked = torch.tensor([7, 3, 41, 0])
    for epoch in (0, 1):
        batched = over(pipeline, images)(picked, SampleKeys(STREAM, epoch, picked))
        one_by_one = [pipeline(images[i], SampleKeys(STREAM, epoch, int(i))) for i in picked]
        assert torch.equal(batched, torch.stack(one_by_one))


def test_cutout_zeroes_one_square_per_sample_the_same_per_sample_and_batched():
    images = torch.randint(1, 256, (50, 3, 8, 8), dtype=torch.uint8)  # no zero of its own
    pipeline = transforms.build(True, image_size=8, resize=None, crop_padding=0, cutout=3)
    indices = torch.arange(50)
    keys = SampleKeys(STREAM, 5, indices)
    batched = over(pipeline, images)(indices, keys)  # crop and flip gathered, then the cutout
    one_by_one = [pipeline(images[i], SampleKeys(STREAM, 5, int(i))) for i in indices]
    assert torch.equal(batched, torch.stack(one_by_one))
    assert torch.equal(pipeline.batch(images, keys), batched)
    zeroed = batched == 0
    assert (zeroed.sum(dim=(1, 2, 3)) == 3 * 3 * 3).all(), "one 3x3 square, in every channel"
    rows, cols = zeroed[:, 0].any(2).int().argmax(1), zeroed[:, 0].any(1).int().argmax(1)
    assert len(set(zip(rows.tolist(), cols.tolist(), strict=True))) > 10, "squares move"


def test_a_batch_is_keyed_once_not_per_sample(monkeypatch):
    made = []
    original = SampleKeys.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(SampleKeys, "__init__", counting)
    source = TensorImages(
        torch.zeros((100, 3, 8, 8), dtype=torch.uint8), torch.zeros(100, dtype=torch.int64)
    )
    view = TrainView(source, transforms.build(True, 8, None, 2), STREAM)
    view.__getitems__([(2, index) for index in range(64)])
    assert made == [1], "no Python per sample"


def test_the_int64_tensor_arithmetic_a_gpu_runs_equals_the_cpu_paths():
    """On a CPU the batch path computes with numpy uint64 (cheaper per call); a GPU runs the
    same code on int64 tensors, where products wrap. Both must give the Python ints' bits."""
    values = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 123456789, *range(1000, 1100)]
    exact = [seeding._mix32(v) for v in values]
    as_int64 = seeding._mix32(torch.tensor(values, dtype=torch.int64))
    as_uint64 = seeding._mix32(np.array(values, dtype=np.uint64))
    assert as_int64.tolist() == exact == as_uint64.tolist()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_same_draws_on_a_gpu():
    indices = torch.arange(10_000)
    on_cpu = SampleKeys(STREAM, 3, indices)
    on_gpu = SampleKeys(STREAM, 3, indices.cuda())
    for draw in range(transforms.CUTOUT_LEFT + 1):
        assert torch.equal(on_cpu.bits(draw), on_gpu.bits(draw).cpu())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_crop_flip_and_cutout_give_the_same_bytes_on_a_gpu():
    images = torch.randint(0, 256, (50, 3, 8, 8), dtype=torch.uint8)
    pipeline = transforms.build(True, image_size=8, resize=None, crop_padding=2, cutout=3)
    indices = torch.arange(50)
    on_cpu = over(pipeline, images)(indices, SampleKeys(STREAM, 5, indices))
    gpu_indices = indices.cuda()
    on_gpu = over(pipeline, images.cuda())(gpu_indices, SampleKeys(STREAM, 5, gpu_indices))
    assert torch.equal(on_cpu, on_gpu.cpu())


@pytest.mark.parametrize(("mode", "torch_mode"), [("reflect", "reflect"), ("edge", "replicate")])
def test_padding_modes_are_torchs_reflect_and_replicate(mode, torch_mode):
    images = torch.randint(0, 256, (4, 3, 7, 9), dtype=torch.uint8)
    expected = functional.pad(images.float(), (3, 3, 3, 3), mode=torch_mode)
    assert torch.equal(transforms.pad(images, 3, mode).float(), expected)
    zeros = transforms.pad(images, 3)
    assert zeros[..., :3, :].eq(0).all() and torch.equal(zeros[..., 3:-3, 3:-3], images)
