"""The augment group: torchvision transforms kept worker-invariant, MixUp and CutMix."""

from __future__ import annotations

import signal

import pytest
import torch
from omegaconf import OmegaConf
from torchvision.transforms import v2

from repro.core import build, run
from repro.core.data.transforms import TorchvisionSteps
from repro.core.engine.mixing import BatchMixer
from repro.core.errors import ConfigError
from repro.core.runtime.seeding import SampleKeys

from conftest import compose_config, read_summary, run_cli, tiny, train_in_process

STREAM = 12345
IMAGE = torch.arange(3 * 16 * 16, dtype=torch.int64).remainder(251).to(torch.uint8).view(3, 16, 16)


def test_torchvision_draws_follow_the_sample_and_leave_the_global_generator_alone():
    steps = TorchvisionSteps([v2.RandAugment(num_ops=2, magnitude=9)])
    before = torch.get_rng_state()
    first = steps(IMAGE, SampleKeys(STREAM, 0, 7))
    assert torch.equal(torch.get_rng_state(), before), "the training's own stream is untouched"
    torch.manual_seed(99)  # whatever state the process is in, the sample's draws are its own
    assert torch.equal(steps(IMAGE, SampleKeys(STREAM, 0, 7)), first)
    others = [steps(IMAGE, SampleKeys(STREAM, epoch, index)) for epoch, index in
              [(0, 8), (1, 7), (0, 9), (2, 3), (3, 2)]]  # fmt: skip
    assert sum(not torch.equal(other, first) for other in others) >= 4


def test_the_augment_options_build_their_transforms_for_training_only():
    for option, kind in (
        ("randaugment", v2.RandAugment),
        ("trivialaugment", v2.TrivialAugmentWide),
    ):
        train, evaluate = build.pipelines(compose_config(f"augment={option}"))
        tail = train.steps[-1]
        assert isinstance(tail, TorchvisionSteps) and isinstance(tail.transforms[0], kind)
        assert not train.batchable and evaluate.steps == []  # evaluation: deterministic part
    crop_flip, _ = build.pipelines(compose_config())
    assert crop_flip.batchable and len(crop_flip.steps) == 2


def test_a_transform_that_cannot_be_built_is_named():
    cfg = compose_config("augment.transforms=[{_target_:torchvision.transforms.v2.Nope}]")
    with pytest.raises(ConfigError, match=r"augment.transforms\[0\]"):
        build.pipelines(cfg)


YAML_PIPELINE = """
crop_flip: false
transforms:
  - _target_: torchvision.transforms.v2.RandomResizedCrop
    size: 32
    scale: [0.5, 1.0]
    antialias: true
  - _target_: torchvision.transforms.v2.RandomHorizontalFlip
  - _target_: torchvision.transforms.v2.ColorJitter
    brightness: 0.4
    contrast: 0.4
  - _target_: torchvision.transforms.v2.RandomErasing
    p: 0.5
"""


def test_a_yaml_list_of_torchvision_transforms_trains_the_same_for_any_worker_count(tmp_path):
    hashes = []
    for workers in (0, 2):
        cfg = compose_config(*tiny(f"dataloader.num_workers={workers}", "trainer.max_steps=4"))
        cfg.augment = OmegaConf.merge(cfg.augment, OmegaConf.create(YAML_PIPELINE))
        run_dir = tmp_path / f"w{workers}"
        run_dir.mkdir()
        hashes.append(run.train(cfg, run_dir)["weights_sha256"])
    assert hashes[0] == hashes[1]
    plain = train_in_process(tmp_path / "plain", *tiny("trainer.epochs=2"))
    assert plain["weights_sha256"] != hashes[0], "the transforms must have changed the images"


@pytest.mark.parametrize(
    "augment", ["augment.cutout=8", "augment.flip=alternate", "augment.crop_padding_mode=reflect"]
)
@pytest.mark.slow
def test_cutout_flips_and_padding_train_the_same_with_workers_or_the_device_loader(
    augment, tmp_path
):
    run = tiny("trainer.epochs=2", augment)  # flips turn over in the second epoch
    loaders = {"w0": "dataloader.num_workers=0", "w2": "dataloader.num_workers=2",
               "device": "dataloader=device"}  # fmt: skip
    hashes = {name: train_in_process(tmp_path / name, *run, loader)["weights_sha256"]
              for name, loader in loaders.items()}  # fmt: skip
    assert len(set(hashes.values())) == 1, hashes
    plain = train_in_process(tmp_path / "plain", *tiny("trainer.epochs=2"))
    assert plain["weights_sha256"] != hashes["w0"], f"{augment} must have changed the images"


def test_mixing_is_keyed_on_the_batch_and_keeps_what_it_mixes():
    images = torch.rand(16, 3, 8, 8)
    labels = torch.arange(16)
    mixup = BatchMixer(0.4, 0.0, root_seed=3)
    first, again = mixup(images, labels, 2, 5), mixup(images, labels, 2, 5)
    assert torch.equal(first.images, again.images) and first.weight == again.weight
    assert not torch.equal(mixup(images, labels, 2, 6).images, first.images)
    partners = first.partner_labels
    assert sorted(partners.tolist()) == labels.tolist()  # a permutation of the batch
    expected = images * first.weight + images[partners] * (1 - first.weight)
    assert torch.allclose(first.images, expected) and 0 < first.weight < 1

    cutmix = BatchMixer(0.0, 1.0, root_seed=3)
    for batch in range(20):
        mixed = cutmix(images, labels, 0, batch)
        changed = (mixed.images != images).any(dim=1)  # pixels taken from the partner
        swapped = mixed.partner_labels != labels
        # The weight is the share of each image still its own: the box's area decides it.
        own = 1 - changed[swapped].float().mean().item() if swapped.any() else mixed.weight
        assert own == pytest.approx(mixed.weight, abs=1e-6)


def test_mixing_differs_by_epoch_and_rank_and_hands_back_the_labels():
    images, labels = torch.rand(8, 3, 8, 8), torch.arange(8)
    mixup = BatchMixer(0.4, 0.0, root_seed=3)
    first = mixup(images, labels, 2, 5)
    assert first.labels is labels
    assert mixup(images, labels, 3, 5).weight != first.weight  # the same batch, next epoch
    assert BatchMixer(0.4, 0.0, root_seed=3, rank=1)(images, labels, 2, 5).weight != first.weight
    assert BatchMixer(0.4, 0.0, root_seed=3, rank=0)(images, labels, 2, 5).weight == first.weight


@pytest.mark.parametrize(("centre", "weight"), [((3, 4), 0.75), ((0, 9), 0.64), ((5, 0), 0.1)])
def test_cutmix_pastes_a_box_of_the_weights_area_around_its_centre_clipped_to_the_image(
    centre, weight
):
    """A 6x10 image (not square), the centre drawn where given: the box is round(side *
    sqrt(1 - weight)) on each side, centred there, cut at the edges; the weight returned is
    the share of the image left its own."""
    from repro.core.engine.mixing import _paste_box

    class Draws:  # the two integers _paste_box draws: the centre's row, then its column
        def __init__(self) -> None:
            self.values = list(centre)

        def integers(self, high: int) -> int:
            return self.values.pop(0)

    images, partners = torch.zeros(2, 3, 6, 10), torch.ones(2, 3, 6, 10)
    mixed, left = _paste_box(images, partners, weight, Draws())
    box_h, box_w = round(6 * (1 - weight) ** 0.5), round(10 * (1 - weight) ** 0.5)
    expected = torch.zeros(6, 10)
    row, column = centre
    expected[max(row - box_h // 2, 0) : row + box_h // 2, max(column - box_w // 2, 0) :
             column + box_w // 2] = 1  # fmt: skip
    assert torch.equal(mixed[1, 2], expected) and torch.equal(mixed[0, 0], expected)
    assert left == pytest.approx(1 - float(expected.mean()))
    assert torch.equal(images, torch.zeros(2, 3, 6, 10))  # the batch itself is not written


def test_both_on_picks_one_of_the_two_per_batch():
    images, labels = torch.rand(8, 3, 8, 8), torch.arange(8)
    both = BatchMixer(1.0, 1.0, root_seed=0)
    kinds = set()
    for batch in range(40):
        mixed = both(images, labels, 0, batch)
        untouched = (mixed.images == images).all(dim=1)
        kinds.add("cutmix" if untouched.any() else "mixup")
    assert kinds == {"mixup", "cutmix"}


RANDAUGMENT_CUTMIX = tiny(
    "augment=randaugment", "augment.cutmix_alpha=1.0", "trainer.epochs=2",
    "trainer.checkpoint_every_steps=4",
)  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_randaugment_with_cutmix_is_the_same_for_any_workers_and_after_a_kill(tmp_path):
    hashes = {}
    for workers in (0, 2):
        run_dir = tmp_path / f"w{workers}"
        done = run_cli(
            "repro.train", *RANDAUGMENT_CUTMIX, f"dataloader.num_workers={workers}",
            f"hydra.run.dir={run_dir}",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        hashes[workers] = read_summary(run_dir)["weights_sha256"]
    assert hashes[0] == hashes[2]

    killed_dir = tmp_path / "killed"
    command = [*RANDAUGMENT_CUTMIX, "dataloader.num_workers=2", f"hydra.run.dir={killed_dir}"]
    killed = run_cli("repro.train", *command, env={"REPRO_FAULT": "step:9"})
    assert killed.returncode == -signal.SIGKILL
    resumed = run_cli("repro.train", *command)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(killed_dir)
    assert summary["resumed_from_step"] == 8 and summary["weights_sha256"] == hashes[0]


def test_the_loop_mixes_batches_only_when_augment_asks_and_the_data_is_augmented():
    from omegaconf import open_dict

    from repro.core.engine import assembly

    cfg = compose_config(*tiny("augment.mixup_alpha=0.2", "augment.cutmix_alpha=1.0"))
    mixer = assembly._mixer(cfg, 7, 3)
    assert (mixer.mixup_alpha, mixer.cutmix_alpha, mixer.root_seed, mixer.rank) == (0.2, 1.0, 7, 3)
    with open_dict(cfg):
        cfg.data.augment = False
    assert assembly._mixer(cfg, 7, 3) is None  # an unaugmented run is not mixed either
    assert assembly._mixer(compose_config(*tiny()), 7, 0) is None  # nothing asked
