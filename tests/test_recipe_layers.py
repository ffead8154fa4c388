"""The layers the fast CIFAR-10 networks share (recipes/layers.py)."""

from __future__ import annotations

import torch

from repro.extras.recipes.layers import GlobalMaxPool, Scale
from repro.extras.recipes.resnet9 import ResNet9
from repro.extras.recipes.whitened_cnn import WhitenedCNN


def test_the_global_max_pool_sends_each_gradient_to_one_maximum_among_ties():
    """bf16 makes equal maxima common; a backward that splits among them (amax) once gave
    NaN gradients when compiled. Each channel's gradient must land whole on one position."""
    x = torch.zeros(2, 3, 4, 4)
    x[:, :, 1, 2] = x[:, :, 3, 0] = 5.0  # two equal maxima per channel
    x.requires_grad_(True)
    pooled = GlobalMaxPool()(x)
    assert pooled.shape == (2, 3) and torch.equal(pooled, torch.full((2, 3), 5.0))
    pooled.sum().backward()
    per_channel = x.grad.flatten(2)
    assert torch.equal(per_channel.sum(-1), torch.ones(2, 3))
    assert torch.equal((per_channel != 0).sum(-1), torch.ones(2, 3, dtype=torch.long))


def test_both_fast_networks_pool_their_heads_through_it():
    for model in (ResNet9(widths=(8, 8, 8, 8)), WhitenedCNN(widths=(8, 8, 8))):
        heads = [m for m in model.modules() if isinstance(m, GlobalMaxPool)]
        assert len(heads) == 1, type(model).__name__


def test_scale_multiplies_by_its_factor_and_the_networks_scale_their_logits_down():
    x = torch.tensor([[1.0, -2.0, 4.0]])
    assert torch.equal(Scale(0.125)(x), torch.tensor([[0.125, -0.25, 0.5]]))
    for model in (ResNet9(widths=(8, 8, 8, 8)), WhitenedCNN(widths=(8, 8, 8))):
        factors = [m.factor for m in model.modules() if isinstance(m, Scale)]
        assert len(factors) == 1 and 0 < factors[0] < 1, type(model).__name__
