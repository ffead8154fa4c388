"""ResNet-9 (recipes/resnet9.py), layer by layer and in the order its weights are drawn: a
change to either changes every run of the recipes that use it."""

from __future__ import annotations

import torch
from torch import nn

from repro.extras.recipes.layers import Scale
from repro.extras.recipes.resnet9 import Residual, ResNet9
from test_models import conv, spec


def leaves(model: nn.Module) -> list[tuple]:
    """test_models' layer specs, with the logits' scale and its factor."""
    return [
        ("scale", m.factor) if isinstance(m, Scale) else spec(m)
        for m in model.modules()
        if not list(m.children())
    ]


def conv_bn(cin: int, cout: int) -> list[tuple]:
    return [conv(cin, cout, 1), ("bn", cout), ("relu", True)]


def test_resnet9_is_pages_network_layer_by_layer():
    """prep; conv, pool, residual; conv, pool; conv, pool, residual; max-pool, linear, scale."""
    residual = [*conv_bn(8, 8), *conv_bn(8, 8)]
    layer1 = [*conv_bn(4, 8), ("maxpool", 2), *residual]
    layer2 = [*conv_bn(8, 16), ("maxpool", 2)]
    layer3 = [*conv_bn(16, 32), ("maxpool", 2), *conv_bn(32, 32), *conv_bn(32, 32)]
    head = [("GlobalMaxPool",), ("linear", 32, 6, False), ("scale", 0.5)]
    model = ResNet9(num_classes=6, widths=(4, 8, 16, 32), scale=0.5)
    assert leaves(model) == [*conv_bn(3, 4), *layer1, *layer2, *layer3, *head]
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 6)
    defaults = leaves(ResNet9())
    assert defaults[0] == conv(3, 64, 1) and defaults[-2:] == [
        ("linear", 512, 10, False),
        ("scale", 0.125),
    ]


def test_a_residual_adds_its_input_to_its_body():
    torch.manual_seed(0)
    block = Residual(4).eval()
    x = torch.randn(2, 4, 6, 6)
    assert torch.equal(block(x), x + block.body(x))


def test_resnet9_draws_its_weights_in_the_order_the_network_is_drawn():
    """A refactor that builds the layers in another order changes every run's first weights."""
    widths, torch_seed = (4, 8, 16, 32), 3
    torch.manual_seed(torch_seed)
    model = ResNet9(num_classes=5, widths=widths)
    torch.manual_seed(torch_seed)
    by_hand = [nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)]
    by_hand += [nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), Residual(8)]
    by_hand += [nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)]
    by_hand += [nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), Residual(32)]
    by_hand += [nn.Linear(32, 5, bias=False)]
    drawn = [p for layer in by_hand for p in layer.parameters()]
    assert len(drawn) == len(list(model.parameters()))
    for ours, theirs in zip(model.parameters(), drawn, strict=True):
        assert torch.equal(ours, theirs)
