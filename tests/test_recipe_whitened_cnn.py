"""model=whitened_cnn: a first layer fitted to the training data, and what stays fixed."""

from __future__ import annotations

import pytest
import torch

from repro import build
from repro.data.datasets import Splits
from repro.data.sources import TensorImages
from repro.errors import ConfigError
from repro.recipes.whitened_cnn import PatchWhitening, WhitenedCNN
from repro.runs.checkpoint import load
from repro.runtime.seeding import torch_generator

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
    assert torch.allclose(moment.diagonal()[moment.diagonal() > 0.5], torch.tensor(1.0).double(),
                          atol=0.02)  # fmt: skip
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
