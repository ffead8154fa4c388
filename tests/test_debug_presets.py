"""debug=fast | overfit | limit, data.fraction and trainer.save_checkpoints; experiment configs."""

from __future__ import annotations

import csv

import pytest

from repro.core import build, config
from repro.core.errors import ConfigError

from conftest import compose_config, make_image_tree, tiny, train_in_process

QUICK = ["dataloader=debug", "model.widths=[8,16]", "logger.fingerprint_every_steps=2"]


def rows(run_dir) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_fast_runs_three_steps_evaluates_once_and_keeps_no_checkpoints(tmp_path):
    summary = train_in_process(tmp_path, "debug=fast", *QUICK)
    assert summary["completed"] and summary["step"] == summary["total_steps"] == 3
    assert len(rows(tmp_path)) == 1
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "curves.png").exists()
    assert (tmp_path / "fingerprints.csv").read_text().count("\n") == 3  # losses still logged


def test_fast_shortens_an_experiment_without_changing_its_recipe():
    cfg = compose_config("experiment=cifar10_resnet18", "debug=fast")
    assert cfg.trainer.max_steps == 3 and not cfg.trainer.save_checkpoints
    assert cfg.model._target_.endswith("resnet18_cifar") and cfg.data._target_.endswith(".cifar10")
    assert cfg.optimizer.lr == 0.4 and cfg.objective.label_smoothing == 0.1


@pytest.mark.slow
def test_overfit_memorises_its_few_fixed_batches(tmp_path):
    cfg = compose_config("debug=overfit")
    assert (cfg.data.train_size, cfg.data.augment, cfg.trainer.epochs) == (512, False, 50)
    shorter = ["trainer.epochs=30", "data.val_size=64", "dataloader=debug"]
    summary = train_in_process(tmp_path, "debug=overfit", *shorter)
    assert summary["total_steps"] == 30 * 512 // 64
    losses = [float(row["train_loss"]) for row in rows(tmp_path)]
    assert len(losses) == 3 and losses == sorted(losses, reverse=True)
    # From chance (ln 10 = 2.3) to nearly zero on the training batches, far below the loss on
    # images it has not seen: it memorised them.
    assert losses[-1] < 0.1 and losses[-1] < summary["val_loss"] / 10


def test_limit_keeps_a_seeded_fraction_of_every_split():
    def splits(*overrides: str):
        cfg = compose_config(*tiny(*overrides))
        config.validate(cfg)
        return build.splits(cfg, root_seed=cfg.seed.value)

    full, limited, again = splits(), splits("debug=limit"), splits("debug=limit")
    for name in ("train", "val", "test"):
        whole, part = getattr(full, name), getattr(limited, name)
        assert len(part) == round(len(whole) * 0.1)
        assert getattr(again, name).images.equal(part.images)  # the same subset every time
        chosen = {image.numpy().tobytes() for image in part.images}
        assert chosen <= {image.numpy().tobytes() for image in whole.images}
    other_seed = splits("debug=limit", "seed=1").train
    assert not other_seed.images.equal(limited.train.images)


def test_limit_on_an_image_folder_without_test_evaluates_on_the_same_val_subset(tmp_path):
    root = make_image_tree(tmp_path / "images", 16, 4)  # train/ and val/, no test/
    cfg = compose_config("data=imagefolder", f"data.root={root}", "data.fraction=0.5")
    limited = build.splits(cfg, root_seed=0)
    assert (len(limited.train), len(limited.val)) == (24, 6) and limited.test is limited.val


def test_limit_trains(tmp_path):
    last = "trainer.test_weights=last"  # a tenth of 128 validation images: too few to select by
    summary = train_in_process(tmp_path, *tiny("debug=limit", "trainer.batch_size=8", last))
    assert summary["completed"] and summary["total_steps"] == round(384 * 0.1) // 8


@pytest.mark.parametrize("fraction", ["0", "1.5", "-0.1"])
def test_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ConfigError, match=r"data\.fraction"):
        config.validate(compose_config(f"data.fraction={fraction}"))


def test_experiments_compose():
    cifar = compose_config("experiment=cifar10_resnet18")
    assert cifar.data._target_.endswith(".cifar10")
    assert (cifar.trainer.epochs, cifar.trainer.batch_size) == (30, 512)
    images = compose_config("experiment=imagefolder_example", "data.root=/somewhere")
    assert (
        images.data._target_.endswith(".imagefolder") and images.dataloader.num_workers == 6
    )  # fast
    assert images.data.root == "/somewhere"
