"""The assembly of a run (engine/assembly.py): each setting reaches the part it configures,
checked on the parts themselves, in this process, without training."""

from __future__ import annotations

import hashlib

import pytest
import torch

from repro.core import build
from repro.core.engine import assembly
from repro.core.runs.checkpoint import Checkpointer
from repro.core.runtime.distributed import Context

from conftest import compose_config, save_test_resnet, tiny

SMALL = tiny("data.train_size=64", "data.val_size=32", "data.test_size=32", "trainer.batch_size=32")
SEED = 11


def assembled(*overrides: str, initialise: bool | None = None):
    other_model = any(o.startswith("model=") for o in overrides)
    base = [o for o in SMALL if not (other_model and o.startswith("model.widths="))]
    cfg = compose_config(*base, *overrides)
    knobs = assembly.apply_knobs(cfg, Context())
    data = build.splits(cfg, SEED)
    if initialise is None:  # the default: a fresh run
        return cfg, knobs, assembly.build_parts(cfg, knobs, SEED, data)
    return cfg, knobs, assembly.build_parts(cfg, knobs, SEED, data, initialise=initialise)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """timm's small test network, its own normalisation: mean and std 0.5, 160 pixels."""
    file = save_test_resnet(tmp_path_factory.mktemp("weights") / "test_resnet.safetensors", 10)
    return [
        "model=timm", "model.name=test_resnet", f"model.pretrained={file}",
        "model.image_size=16", "memory_format=contiguous",
    ]  # fmt: skip


def test_the_knobs_are_applied_before_anything_is_built():
    torch.set_num_threads(2)
    cfg = compose_config(*SMALL, "trainer.num_threads=1")
    knobs = assembly.apply_knobs(cfg, Context())
    assert torch.get_num_threads() == 1
    assert (knobs.device, knobs.memory_format.name) == (torch.device("cpu"), cfg.memory_format.name)


def test_a_pretrained_models_normalisation_reaches_its_loaders_and_its_batches(
    pretrained, tmp_path
):
    cfg, knobs, parts = assembled(*pretrained, "metrics=[f1]")
    own = {"mean": [0.5] * 3, "std": [0.5] * 3, "image_size": 16, "interpolation": "bilinear"}
    assert parts.normalisation == own
    images, _ = next(iter(parts.train_loader))
    assert images.shape[-2:] == (16, 16)  # data.image_size is 32
    assert next(iter(parts.val_loader))[0].shape[-2:] == (16, 16)
    assert parts.initialised is None and list(parts.scores.metrics) == ["f1"]
    assert parts.scores.metrics["f1"].num_classes == len(parts.data.classes)

    outputs = assembly.outputs(cfg, tmp_path, Checkpointer(tmp_path / "checkpoints", 1), Context())
    trainer = assembly.trainer(cfg, knobs, parts, outputs, {"seed": SEED})
    to_device = trainer.data.to_device
    half = torch.full((1, 3, 1, 1), 1 / (255 * 0.5))
    assert torch.allclose(to_device.scale, half) and torch.allclose(to_device.shift, -half * 127.5)
    assert trainer.extra_state["normalisation"] == own and trainer.extra_state["seed"] == SEED
    assert trainer.extra_state["resolved"] == knobs.resolved()
    assert trainer.scores is parts.scores


def test_init_weights_start_a_fresh_run_and_not_a_resume(tmp_path):
    _, _, source = assembled()
    file = tmp_path / "weights.pt"
    torch.save({name: t + 1 for name, t in source.model.state_dict().items()}, file)
    _, _, started = assembled(f"trainer.init_weights={file}")
    saved = torch.load(file, weights_only=True)
    assert all(torch.equal(started.model.state_dict()[k], saved[k]) for k in saved)
    assert started.initialised["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    _, _, resumed = assembled(f"trainer.init_weights={file}", initialise=False)
    assert resumed.initialised is None
    assert all(
        torch.equal(resumed.model.state_dict()[k], t) for k, t in source.model.state_dict().items()
    )


def test_a_model_that_fits_itself_to_the_data_is_fitted_with_the_runs_seed():
    cfg, _, parts = assembled("model=whitened_cnn", "memory_format=contiguous")
    fitted = build.model(cfg, SEED, num_classes=len(parts.data.classes))
    build.fit_to_data(fitted, cfg, build.splits(cfg, SEED), SEED)
    unfitted = build.model(cfg, SEED, num_classes=len(parts.data.classes))
    for name, tensor in fitted.state_dict().items():
        assert torch.equal(parts.model.state_dict()[name], tensor), name
    assert any(
        not torch.equal(t, fitted.state_dict()[name]) for name, t in unfitted.state_dict().items()
    )


def test_the_trainer_gets_the_mixer_components_watchers_and_callbacks_asked_for(tmp_path):
    cfg, knobs, parts = assembled(
        "augment.mixup_alpha=0.4",
        "+components=ema",
        "trainer.profile_steps=[1,2]",
        "+callbacks.mine._target_=repro.core.watch.profiling.SyncDebug",
    )
    checkpointer = Checkpointer(tmp_path / "checkpoints", 1)
    trainer = assembly.trainer(
        cfg, knobs, parts, assembly.outputs(cfg, tmp_path, checkpointer, Context()), {}
    )
    mixer = trainer.step.mixer
    assert (mixer.mixup_alpha, mixer.cutmix_alpha, mixer.root_seed, mixer.rank) == (
        0.4,
        0.0,
        SEED,
        0,
    )
    assert list(trainer.objective.components) == ["ema"]
    assert trainer.objective.components["ema"] is trainer.callbacks.get("ema")
    assert list(trainer.callbacks.components) == ["ema"]
    assert list(trainer.callbacks.named) == ["progress", "profiler", "mine"]
    assert trainer.callbacks.get("profiler").folder == tmp_path / "profile"
    # MixUp asked for, but the data not augmented at all: no mixing.
    cfg, knobs, plain = assembled("augment.mixup_alpha=0.4", "data.augment=false")
    outputs = assembly.outputs(cfg, tmp_path, checkpointer, Context())
    assert assembly.trainer(cfg, knobs, plain, outputs, {}).step.mixer is None


@pytest.mark.parametrize(
    ("tensorboard", "rank", "writes"), [(True, 0, True), (True, 1, False), (False, 0, False)]
)
def test_tensorboard_and_trackers_are_rank_0s_alone(tmp_path, tensorboard, rank, writes):
    cfg = compose_config(*SMALL, "logger=mlflow", f"logger.tensorboard={str(tensorboard).lower()}",
                         f"logger.mlflow.tracking_uri={tmp_path / 'mlruns'}")  # fmt: skip
    dist = Context(rank=rank, world=2)
    outputs = assembly.outputs(cfg, tmp_path, Checkpointer(tmp_path / "checkpoints", 1), dist)
    try:
        assert (outputs.metrics.writer is not None) == writes
        assert len(outputs.metrics.trackers) == (1 if rank == 0 else 0)
    finally:
        outputs.metrics.close()
