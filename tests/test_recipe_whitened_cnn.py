"""model=whitened_cnn: a first layer fitted to the training data, and what stays fixed."""

from __future__ import annotations

import pytest
import torch

from repro.core import build
from repro.core.data.datasets import Splits
from repro.core.data.sources import TensorImages
from repro.core.errors import ConfigError
from repro.core.runs.checkpoint import load
from repro.core.runtime.seeding import torch_generator
from repro.extras.recipes.whitened_cnn import PatchWhitening, WhitenedCNN

from conftest import compose_config, tiny, train_in_process

WHITENED = ("model=whitened_cnn", "model.widths=[8,16,16]", "model.fit_images=200")


def test_the_fitted_filters_decorrelate_the_patches_they_were_fitted_to():
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(300, 1, 9, 9, generator=generator)
    # Strongly correlated channels and neighbours, with variances far above eps.
    images = torch.cat([base, 0.8 * base + 0.2 * torch.randn(300, 1, 9, 9), -base], dim=1)
    images = images + 0.5 * images.roll(1, dims=3)
    whiten = PatchWhitening(eps=1e-6)
    whiten.fit(images, chunk=64)  # the second moment is summed over chunks
    features = torch.nn.functional.conv2d(images, whiten.weight)[:, :12]  # without the bias
    flat = features.permute(1, 0, 2, 3).reshape(12, -1).double()
    moment = flat @ flat.T / flat.shape[1]
    informative = torch.linalg.eigvalsh(moment) > 0.5  # directions the data has at all
    assert informative.sum() >= 8
    variances = moment.diagonal()[moment.diagonal() > 0.5]
    assert torch.allclose(variances, torch.tensor(1.0).double(), atol=0.02)
    off_diagonal = moment - torch.diag(moment.diagonal())
    assert off_diagonal.abs().max() < 0.02
    assert torch.equal(whiten.weight[12:], -whiten.weight[:12]), "each filter and its negative"


def test_the_model_is_fitted_to_images_drawn_by_the_seed_when_a_run_starts():
    cfg = compose_config(*tiny(*WHITENED))
    data = build.splits(cfg, 0)
    model = build.model(cfg, 0)
    unfitted = model[0].weight.clone()
    build.fit_to_data(model, cfg, data, root_seed=0)
    assert not torch.equal(model[0].weight, unfitted)
    drawn = torch.randperm(len(data.train), generator=torch_generator(0, "fit"))[:200]
    chosen = torch.stack([data.train[i][0] for i in drawn.sort().values.tolist()])
    expected = PatchWhitening()
    expected.fit(build.device_batches(cfg, torch.device("cpu"))(chosen, torch.zeros(200))[0])
    assert torch.equal(model[0].weight, expected.weight)
    other = build.model(cfg, 0)
    build.fit_to_data(other, cfg, data, root_seed=1)
    assert not torch.equal(other[0].weight, model[0].weight), "another seed, other images"
    model.fit_images = 0
    with pytest.raises(ConfigError, match=r"model\.fit_images=0"):
        build.fit_to_data(model, cfg, data, root_seed=0)
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert "0.weight" not in trained and "0.bias" in trained
    assert not any(name.endswith("weight") and "2.2" in name for name in trained), "BN scales"


def test_a_split_ordered_by_class_is_whitened_for_every_class():
    """An image folder lists its images class by class; fitting on the first ones would
    whiten one or two classes. Here class c has contrast (c + 1) / 10, so the first fifth
    alone gives whitened features of variance about 15 on the whole split."""
    cfg = compose_config(*tiny(*WHITENED, "model.fit_images=400"))
    noise = torch.rand(2000, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    contrast = (torch.arange(10).repeat_interleave(200) + 1).float().view(-1, 1, 1, 1) / 10
    images = (128 + (noise - 0.5) * 255 * contrast).round().clamp(0, 255).to(torch.uint8)
    ordered = TensorImages(images, torch.arange(10).repeat_interleave(200))
    model = build.model(cfg, 0)
    build.fit_to_data(model, cfg, Splits(ordered, ordered, ordered, list("abcdefghij")), 3)
    sample = torch.randperm(2000, generator=torch.Generator().manual_seed(1))[:500]
    normalised, _ = build.device_batches(cfg, torch.device("cpu"))(images[sample], sample)
    features = torch.nn.functional.conv2d(normalised, model[0].weight)[:, :12]
    variances = features.var(dim=(0, 2, 3))
    assert variances.min() > 0.7 and variances.max() < 1.4, variances


@pytest.mark.slow
def test_fixed_tensors_stay_put_and_the_run_is_exact_across_loaders_and_a_resume(tmp_path):
    run = tiny(*WHITENED, "trainer.epochs=2", "optimizer.lr_scale_biases_and_norms=8")
    straight = train_in_process(tmp_path / "straight", *run)
    device = train_in_process(tmp_path / "device", *run, "dataloader=device")
    assert device["weights_sha256"] == straight["weights_sha256"]
    train_in_process(tmp_path / "resumed", *run, "trainer.halt_at_step=7")
    resumed = train_in_process(tmp_path / "resumed", *run)
    assert resumed["resumed_from_step"] == 7
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    cfg = compose_config(*run)
    model = build.model(cfg, int(straight["seed"]))
    seed = int(straight["seed"])
    build.fit_to_data(model, cfg, build.splits(cfg, seed), seed)
    weights = load(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    assert torch.equal(weights["0.weight"], model[0].weight), "the whitening is never trained"
    assert torch.equal(weights["2.2.weight"], torch.ones(8)), "nor the batch norms' scales"
    assert not torch.equal(weights["2.2.bias"], torch.zeros(8)), "their shifts are"


@pytest.mark.slow  # torch.compile on a CPU: a minute or more of Inductor's code generation
def test_compiled_in_bf16_the_gradients_stay_finite():
    """The head once took a global max with `amax`, whose compiled bf16 backward gave NaN."""
    torch.manual_seed(0)
    model = WhitenedCNN(widths=(8, 16, 16))
    images, labels = torch.randn(32, 3, 32, 32), torch.arange(32) % 10
    model.fit_to_data(images)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(torch.compile(model)(images), labels)
    loss.backward()
    gradients = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in gradients)


# ---- the parts, one by one ----------------------------------------------------------------


def test_the_whitening_filters_are_the_scaled_eigenvectors_largest_first_and_their_negatives():
    generator = torch.Generator().manual_seed(3)
    images = (
        torch.randn(40, 3, 6, 6, generator=generator) * torch.tensor([1.0, 2.0, 0.5])[:, None, None]
    )
    whiten = PatchWhitening(eps=0.1)
    assert whiten.out_channels == 24 and whiten.kernel_size == (2, 2) and whiten.eps == 0.1
    assert not whiten.weight.requires_grad and whiten.bias.requires_grad
    whiten.fit(images, chunk=7)
    patches = images.double().unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5)
    flat = patches.reshape(-1, 12)
    values, vectors = torch.linalg.eigh(flat.T @ flat / len(flat))
    order = values.argsort(descending=True)
    expected = (vectors[:, order] / (values[order] + 0.1).sqrt()).T.reshape(12, 3, 2, 2)
    filters = whiten.weight[:12].double()
    # An eigenvector's sign is the solver's choice: compare each filter up to its sign.
    signs = (filters * expected).flatten(1).sum(1).sign()
    assert torch.allclose(filters, expected * signs[:, None, None, None], atol=1e-6)
    assert torch.equal(whiten.weight[12:], -whiten.weight[:12])
    whole = PatchWhitening(eps=0.1)
    whole.fit(images, chunk=10_000)
    assert torch.allclose(whole.weight, whiten.weight, atol=1e-6), "chunks add up to the whole"


def test_a_3x3_conv_starts_as_the_identity_on_its_first_channels():
    from repro.extras.recipes.whitened_cnn import conv

    layer = conv(3, 5)
    assert layer.bias is None and layer.padding == (1, 1) and layer.weight.shape == (5, 3, 3, 3)
    x = torch.randn(2, 3, 4, 4)
    assert torch.allclose(layer(x)[:, :3], x, atol=1e-7)
    narrower, five = conv(5, 3), torch.randn(2, 5, 4, 4)
    assert torch.allclose(narrower(five), five[:, :3], atol=1e-7), "as many as it has"


def test_a_batch_norm_learns_its_shift_only():
    from repro.extras.recipes.whitened_cnn import norm

    layer = norm(6, momentum=0.3)
    assert not layer.weight.requires_grad and layer.bias.requires_grad
    assert layer.momentum == 0.3 and layer.eps == 1e-12 and layer.num_features == 6


def test_the_network_is_whitening_three_groups_and_a_scaled_linear_head():
    from repro.extras.recipes.layers import GlobalMaxPool, Scale
    from repro.extras.recipes.whitened_cnn import ConvGroup

    model = WhitenedCNN(num_classes=4, widths=(8, 16, 12), bn_momentum=0.2, scale=0.5, fit_images=9)
    kinds = [type(layer) for layer in model]
    groups = [ConvGroup] * 3
    assert kinds == [PatchWhitening, torch.nn.GELU, *groups, GlobalMaxPool, torch.nn.Linear, Scale]
    group = model[2]
    names = " ".join(type(layer).__name__ for layer in group)
    assert names == "Conv2d MaxPool2d BatchNorm2d GELU Conv2d BatchNorm2d GELU"
    assert (group[0].in_channels, group[0].out_channels, group[4].in_channels) == (24, 8, 8)
    norms = [layer for layer in model.modules() if isinstance(layer, torch.nn.BatchNorm2d)]
    assert len(norms) == 6 and {layer.momentum for layer in norms} == {0.2}
    assert model[4][0].out_channels == 12
    head = model[6]
    assert (head.in_features, head.out_features, head.bias) == (12, 4, None)
    assert model[7].factor == 0.5 and model.fit_images == 9
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 4)
    images = torch.randn(5, 3, 8, 8)
    model.fit_to_data(images)
    reference = PatchWhitening()
    reference.fit(images)
    assert torch.equal(model[0].weight, reference.weight)


def test_the_networks_defaults_are_airbenchs():
    model = WhitenedCNN()
    norms = [layer for layer in model.modules() if isinstance(layer, torch.nn.BatchNorm2d)]
    assert {layer.momentum for layer in norms} == {0.4} and model[7].factor == 1 / 9
    assert (model[6].in_features, model[6].out_features, model.fit_images) == (256, 10, 5000)


@pytest.mark.parametrize("epochs", [True, -1, 2.5, "3"])
def test_freezing_after_a_number_of_epochs_needs_a_whole_number(epochs):
    from repro.extras.recipes.whitened_cnn import WhitenBiasFreeze

    with pytest.raises(ValueError) as refused:
        WhitenBiasFreeze(WhitenedCNN(widths=(8, 8, 8)), 10, epochs)
    assert str(refused.value) == f"epochs={epochs!r}: allowed: an integer >= 0, or null (never)"


def test_the_whitening_bias_trains_for_its_first_epochs_then_freezes():
    from types import SimpleNamespace

    from repro.extras.recipes.whitened_cnn import WhitenBiasFreeze

    model = WhitenedCNN(widths=(8, 8, 8))
    bias = model[0].bias
    freeze = WhitenBiasFreeze(model, 100, epochs=2)
    assert freeze.biases == [bias]
    for epoch, trains in [(0, True), (1, True), (2, False), (5, False)]:
        loop = SimpleNamespace(state=SimpleNamespace(position=SimpleNamespace(epoch=epoch)))
        freeze.after_step(loop)
        assert bias.requires_grad is trains, epoch
    one = SimpleNamespace(world=1)
    resumed = SimpleNamespace(dist=one, state=SimpleNamespace(position=SimpleNamespace(epoch=3)))
    bias.requires_grad_(True)
    freeze.at_start(resumed)
    assert not bias.requires_grad, "a resume past the epochs freezes it again"
    assert WhitenBiasFreeze(model, 100).epochs == 3
    at_once = WhitenBiasFreeze(model, 100, epochs=0)  # frozen from the first step
    at_once.apply(0)
    assert not bias.requires_grad
    never = WhitenBiasFreeze(model, 100, epochs=None)
    never.apply(50)
    assert bias.requires_grad
    never.at_start(SimpleNamespace(dist=SimpleNamespace(world=2), state=resumed.state))
    assert freeze.state_dict() == {} and freeze.load_state_dict({}) is None
    with pytest.raises(ConfigError) as refused:
        freeze.at_start(SimpleNamespace(dist=SimpleNamespace(world=2), state=resumed.state))
    assert str(refused.value) == (
        "components.whiten_bias.epochs=2 is not allowed: null under torchrun (DDP cannot drop a "
        "parameter mid-run)"
    )
    with pytest.raises(ValueError) as refused:
        WhitenBiasFreeze(torch.nn.Linear(2, 2), 10)
    assert str(refused.value) == "the model has no PatchWhitening layer (model=whitened_cnn)"
