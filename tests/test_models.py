"""The built-in models' architecture, layer by layer: a change to any of them changes every
run's weights, so it must be deliberate (and named by `python -m repro.verify --against`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repro.extras.models.resnet_cifar import BasicBlock, ResNetCifar, resnet18_cifar
from repro.extras.models.small_cnn import SmallCNN, conv_bn_relu


def spec(module: nn.Module) -> tuple:
    """What defines a layer: its kind and the settings that shape its weights and output."""
    if isinstance(module, nn.Conv2d):
        bias = module.bias is not None
        shape = (module.in_channels, module.out_channels, module.kernel_size)
        return ("conv", *shape, module.stride, module.padding, bias)
    if isinstance(module, nn.BatchNorm2d):
        return ("bn", module.num_features)
    if isinstance(module, nn.ReLU):
        return ("relu", module.inplace)  # in place after batch norm: one activation less kept
    if isinstance(module, nn.Linear):
        return ("linear", module.in_features, module.out_features, module.bias is not None)
    if isinstance(module, nn.Dropout):
        return ("dropout", module.p)
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return ("avgpool", module.output_size)
    if isinstance(module, nn.MaxPool2d):
        return ("maxpool", module.kernel_size)
    return (type(module).__name__,)


def leaves(model: nn.Module) -> list[tuple]:
    return [spec(m) for m in model.modules() if not list(m.children())]


def conv(cin: int, cout: int, stride: int, bias: bool = False, size: int = 3) -> tuple:
    padding = (size // 2, size // 2)
    return ("conv", cin, cout, (size, size), (stride, stride), padding, bias)


def stages(batchnorm: bool, *shapes: tuple[int, int, int]) -> list[tuple]:
    """conv-BN-ReLU (or conv with bias, then ReLU) for each (in, out, stride)."""
    found: list[tuple] = []
    for cin, cout, stride in shapes:
        if batchnorm:
            found += [conv(cin, cout, stride), ("bn", cout), ("relu", True)]
        else:
            found += [conv(cin, cout, stride, bias=True), ("relu", False)]
    return found


def test_the_small_cnn_halves_the_resolution_at_each_stage_after_the_first():
    model = SmallCNN(num_classes=5, widths=(4, 8, 16), dropout=0.25)
    head = [("avgpool", 1), ("Flatten",), ("dropout", 0.25), ("linear", 16, 5, True)]
    assert leaves(model) == stages(True, (3, 4, 1), (4, 8, 2), (8, 16, 2)) + head
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 5)


def test_without_batch_norm_each_conv_has_its_bias_and_a_plain_relu():
    head = [("avgpool", 1), ("Flatten",), ("dropout", 0.0), ("linear", 8, 3, True)]
    model = SmallCNN(num_classes=3, widths=(4, 8), batchnorm=False)
    assert leaves(model) == stages(False, (3, 4, 1), (4, 8, 2)) + head


def test_the_small_cnns_defaults():
    widths = (16, 32, 64, 128)
    head = [("avgpool", 1), ("Flatten",), ("dropout", 0.0), ("linear", 128, 10, True)]
    shapes = zip((3, *widths[:-1]), widths, (1, 2, 2, 2), strict=True)
    assert leaves(SmallCNN()) == stages(True, *shapes) + head
    assert [spec(layer) for layer in conv_bn_relu(3, 4, 2)] == stages(True, (3, 4, 2))


def block(cin: int, cout: int, stride: int) -> list[tuple]:
    """A basic block's layers in the order they are registered."""
    shortcut = (
        [] if stride == 1 and cin == cout else [conv(cin, cout, stride, size=1), ("bn", cout)]
    )
    main = [conv(cin, cout, stride), ("bn", cout), conv(cout, cout, 1), ("bn", cout)]
    return (
        [*main, ("relu", True), *shortcut] if shortcut else [*main, ("relu", True), ("Identity",)]
    )


def test_the_cifar_resnet_keeps_full_resolution_in_its_first_stage_and_halves_it_after():
    model = ResNetCifar(num_classes=7, blocks=(2, 1), widths=(4, 8))
    stem = [conv(3, 4, 1), ("bn", 4), ("relu", True)]
    body = block(4, 4, 1) + block(4, 4, 1) + block(4, 8, 2)
    head = [("avgpool", 1), ("Flatten",), ("linear", 8, 7, True)]
    assert leaves(model) == stem + body + head
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)


def test_a_block_adds_its_input_through_the_shortcut_and_applies_relu_after():
    torch.manual_seed(0)
    changed = BasicBlock(4, 8, 2).eval()
    x = torch.randn(2, 4, 8, 8)
    main = changed.bn2(changed.conv2(torch.relu(changed.bn1(changed.conv1(x)))))
    assert torch.equal(changed(x), torch.relu(main + changed.shortcut(x)))
    same = BasicBlock(4, 4, 1).eval()
    main = same.bn2(same.conv2(torch.relu(same.bn1(same.conv1(x)))))
    assert torch.equal(same(x), torch.relu(main + x))


def test_resnet18_is_two_blocks_a_stage_at_64_to_512_channels():
    model = resnet18_cifar(num_classes=4)
    widths = [m.conv2.out_channels for m in model.modules() if isinstance(m, BasicBlock)]
    assert widths == [64, 64, 128, 128, 256, 256, 512, 512]
    assert leaves(model)[-1] == ("linear", 512, 4, True)
    assert leaves(ResNetCifar())[-1] == ("linear", 512, 10, True)


def test_a_block_projects_its_shortcut_when_it_strides_or_changes_width():
    for cin, cout, stride in ((4, 4, 2), (4, 8, 1), (4, 8, 2)):
        assert block(cin, cout, stride)[-2:] == [conv(cin, cout, stride, size=1), ("bn", cout)]
        assert leaves(BasicBlock(cin, cout, stride)) == block(cin, cout, stride)
    assert leaves(BasicBlock(4, 4, 1))[-1] == ("Identity",)


def test_blocks_and_widths_must_pair_up_and_resnet18_defaults_to_ten_classes():
    with pytest.raises(ValueError):
        ResNetCifar(blocks=(1, 1, 1), widths=(4, 8))
    assert leaves(resnet18_cifar())[-1] == ("linear", 512, 10, True)
