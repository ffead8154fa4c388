"""The fast CIFAR-10 recipes (experiment=cifar10_speedrun, cifar10_airbench): each composes,
builds its model and optimizer and runs end to end on a little synthetic data."""

from __future__ import annotations

import pytest
import torch

from repro.core import build
from repro.core.runtime.precision import Precision

from conftest import compose_config, train_in_process


def test_the_speedrun_recipe_builds_its_model_and_fused_optimizer_and_runs(tmp_path):
    cfg = compose_config("experiment=cifar10_speedrun")
    # compile off: on an H100 it made this recipe slower (docs/benchmarks.md)
    assert (cfg.dataloader.on_device, cfg.amp.mode, cfg.trainer.compile) == (True, "bf16", False)
    model = build.model(cfg, 0)
    assert type(model).__name__ == "ResNet9"
    optimizer = build.optimizer(cfg, model, Precision("bf16", torch.device("cpu")))
    assert optimizer.defaults["fused"] is True
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    # Its whole pipeline on a little synthetic data: the device loader's reflected crops,
    # flips and Cutout, the fused optimizer, test-time flips.
    assert (cfg.augment.crop_padding_mode, cfg.augment.cutout) == ("reflect", 8)
    summary = train_in_process(
        tmp_path, "experiment=cifar10_speedrun", "data=synthetic", "data.train_size=256",
        "data.val_size=64", "data.test_size=64", "trainer.batch_size=64", "trainer.epochs=2",
        "+model.widths=[8,8,8,8]", "trainer.device=cpu", "logger.plot=false",
    )  # fmt: skip
    assert summary["completed"] and summary["total_steps"] == 8 and 0 <= summary["test_acc"] <= 1


@pytest.mark.slow
def test_the_airbench_recipe_runs_end_to_end(tmp_path):
    cfg = compose_config("experiment=cifar10_airbench")
    assert (cfg.model._target_.endswith("WhitenedCNN"), cfg.augment.flip, cfg.trainer.tta) == (
        True, "alternate", "flip_translate",
    )  # fmt: skip
    lookahead = cfg.components.lookahead
    assert (lookahead._target_, lookahead.every, lookahead.ramp) == (
        "repro.extras.recipes.lookahead.Lookahead", 5, "cubic",
    )  # fmt: skip
    groups = build.optimizer(cfg, build.model(cfg, 0), Precision("bf16", torch.device("cpu")))
    assert [group["lr"] for group in groups.param_groups] == [1.5, 1.5 * 64]
    # Its whole pipeline on a little synthetic data: the fit, the device loader, the fused
    # optimizer, alternating flips, lookahead, the frozen whitening bias, test-time views.
    summary = train_in_process(
        tmp_path, "experiment=cifar10_airbench", "data=synthetic", "data.train_size=256",
        "data.val_size=64", "data.test_size=64", "trainer.batch_size=64", "trainer.epochs=2",
        "model.widths=[8,16,16]", "model.fit_images=64", "trainer.device=cpu", "logger.plot=false",
    )  # fmt: skip
    assert summary["completed"] and summary["total_steps"] == 8 and 0 <= summary["test_acc"] <= 1
