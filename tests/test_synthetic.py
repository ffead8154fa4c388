"""The built-in dataset: a pure function of its seed, whatever renders it."""

from __future__ import annotations

import pytest
import torch

from repro.core.data import synthetic


def test_the_same_seed_renders_the_same_pixels_on_any_number_of_threads(monkeypatch):
    # 600 images: two full blocks and a partial one, so blocks finish in varying order.
    images, labels = synthetic.generate(600, seed=3)
    monkeypatch.setattr(synthetic, "_THREADS", 1)
    serial_images, serial_labels = synthetic.generate(600, seed=3)
    assert torch.equal(images, serial_images) and torch.equal(labels, serial_labels)
    other, _ = synthetic.generate(600, seed=4)
    assert not torch.equal(images, other)


def test_images_carry_the_class_not_the_colour():
    images, labels = synthetic.generate(2000, seed=0)
    assert images.dtype == torch.uint8 and labels.min() == 0 and labels.max() == 9
    # Mean colour barely differs between classes: the shape is what a model has to learn.
    means = torch.stack([images[labels == k].float().mean() for k in range(10)])
    assert means.max() - means.min() < 20
    # Every class is present in roughly equal numbers.
    counts = torch.bincount(labels, minlength=10)
    assert counts.min() > 150


def test_the_number_of_classes_is_checked():
    with pytest.raises(ValueError, match="num_classes"):
        synthetic.generate(10, seed=0, num_classes=11)
