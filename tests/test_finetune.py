"""Fine-tuning a pretrained backbone: frozen, then unfrozen, with layer-wise learning rates.

A timm test network (test_resnet: BatchNorm, timm's layer grouping) starts from a weights file
on 16x16 images of three shapes; the file's head has 5 classes, the run's 3."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from repro.core import build
from repro.core.errors import ConfigError
from repro.core.runs.checkpoint import load
from repro.core.runtime.precision import Precision

from conftest import (
    compose_config,
    make_image_tree,
    read_summary,
    run_cli,
    torchrun,
    train_in_process,
)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> tuple[Path, Path]:
    """An image tree (3 classes x 12 images per split, 16x16) and a test_resnet weights file."""
    folder = tmp_path_factory.mktemp("finetune")
    tree = make_image_tree(folder / "images", per_class=12, side=16)
    torch.manual_seed(1)
    file = folder / "backbone.safetensors"
    save_file(timm.create_model("test_resnet", num_classes=5).state_dict(), str(file))
    return tree, file


def overrides(tree: Path, file: Path, *more: str) -> list[str]:
    """3 steps an epoch, 2 epochs; the first frozen; checkpoints at steps 2, 3, 4, 6."""
    return [
        "data=imagefolder", f"data.root={tree}", "data.image_size=16", "data.resize=null",
        "model=timm", "model.name=test_resnet", f"model.pretrained={file}", "model.image_size=16",
        "trainer.batch_size=12", "trainer.eval_batch_size=36", "trainer.epochs=2",
        "trainer.checkpoint_every_steps=2", "dataloader=debug", "logger.plot=false",
        "memory_format=contiguous", "+components=finetune",
        "components.finetune.freeze_epochs=1", "optimizer.layer_decay=0.7",
        "optimizer.head_lr=0.05", "optimizer.lr=0.02", *more,
    ]  # fmt: skip


@pytest.mark.parametrize("invariant", [False, True], ids=["plain", "world_invariant"])
def test_the_frozen_phase_leaves_the_backbone_and_its_batchnorm_statistics_unchanged(
    pretrained, tmp_path, invariant
):
    tree, file = pretrained
    more = ["trainer.epochs=1", "trainer.test_after_fit=false"]
    if invariant:
        more += [
            "trainer.world_invariant=true",
            "trainer.global_batch=true",
            "trainer.micro_batch=6",
        ]
        more += ["trainer.num_threads=1"]
    train_in_process(tmp_path, *overrides(tree, file, *more))
    checkpoint = load(tmp_path / "checkpoints" / "last.pt")
    trained = checkpoint["model"]
    # SGD with momentum and weight decay kept no state for a frozen weight: the head's two alone.
    assert len(checkpoint["optimizer"]["state"]) == 2
    from safetensors.torch import load_file

    original = load_file(str(file))
    backbone = [name for name in trained if not name.startswith("fc.")]
    assert any("running_mean" in name for name in backbone)
    for name in backbone:  # weights, running statistics and their counts, to the bit
        assert torch.equal(trained[name], original[name]), name
    assert trained["fc.weight"].shape == (3, original["fc.weight"].shape[1])


@pytest.mark.e2e
@pytest.mark.slow
def test_a_kill_in_each_phase_resumes_to_the_uninterrupted_weights(pretrained, tmp_path):
    tree, file = pretrained
    expected = train_in_process(tmp_path / "straight", *overrides(tree, file))["weights_sha256"]

    run_dir = tmp_path / "killed"
    command = [*overrides(tree, file), f"hydra.run.dir={run_dir}"]
    for fault in ("step:3", "step:5"):  # the last frozen step; the second after the unfreeze
        killed = run_cli("repro.train", *command, env={"REPRO_FAULT": fault})
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_cli("repro.train", *command)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 4
    assert summary["weights_sha256"] == expected


def test_layer_decay_and_head_lr_shape_the_optimizer_groups(pretrained):
    tree, file = pretrained
    cfg = compose_config(*overrides(tree, file))
    model = build.model(cfg, 0, num_classes=3)
    optimizer = build.optimizer(cfg, model, Precision("off", torch.device("cpu")))
    lr_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    named = dict(model.named_parameters())
    assert lr_of[id(named["fc.weight"])] == 0.05  # the head's own rate
    assert lr_of[id(named["conv1.0.weight"])] == pytest.approx(0.02 * 0.7**5)  # the stem
    depths = [lr_of[id(p)] for name, p in named.items() if not name.startswith("fc.")]
    assert depths == sorted(depths), "deeper layers learn faster"
    assert len(lr_of) == len(named), "every parameter is trained"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("components.finetune.freeze_steps=99", "freeze_steps=99: allowed: at most the run's 6"),
        (
            "components.finetune.freeze_epochs=3",
            "freeze_epochs=3 is not allowed: at most the run's 2",
        ),
        ("components.finetune.freeze_epochs=-1", "freeze_epochs=-1: allowed: an integer >= 0"),
        ("components.finetune.freeze_steps=2", "freeze_epochs and freeze_steps both set"),
        ("optimizer.layer_decay=1.5", "optimizer.layer_decay=1.5"),
    ],
)
def test_fine_tuning_settings_out_of_range_are_refused_in_one_line(
    pretrained, tmp_path, setting, message
):
    tree, file = pretrained
    if "freeze_steps=99" in setting:
        setting = f"{setting} components.finetune.freeze_epochs=0"
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        train_in_process(tmp_path, *overrides(tree, file, *setting.split()))


@pytest.mark.e2e
@pytest.mark.parametrize("invariant", [False, True], ids=["ddp", "world_invariant"])
@pytest.mark.slow
def test_under_torchrun_the_backbone_stays_frozen_then_trains(pretrained, tmp_path, invariant):
    """DDP keeps every parameter registered (frozen gradients are zeros, then dropped); the
    world-invariant step on 2 processes gives the weights of 1."""
    tree, file = pretrained
    more = ["trainer.global_batch=true", "trainer.keep_checkpoints=10", "trainer.num_threads=1"]
    if invariant:
        more += ["trainer.world_invariant=true", "trainer.micro_batch=6"]
    run_dir = tmp_path / "ddp"
    done = torchrun(*overrides(tree, file, *more), f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr
    from safetensors.torch import load_file

    original = load_file(str(file))
    frozen = load(run_dir / "checkpoints" / "step-00000003.pt")["model"]
    final = load(run_dir / "checkpoints" / "last.pt")["model"]
    backbone = [name for name in original if not name.startswith("fc.")]
    assert all(torch.equal(frozen[name], original[name]) for name in backbone)
    assert not torch.equal(final["conv1.0.weight"], original["conv1.0.weight"]), "unfrozen"
    if invariant:
        alone = train_in_process(tmp_path / "alone", *overrides(tree, file, *more))
        assert alone["weights_sha256"] == read_summary(run_dir)["weights_sha256"]


# ---- the unit: the freeze schedule (fast, in-process) --------------------------------------


def _head_and_backbone() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(2),
    )


def test_freeze_steps_freezes_exactly_that_many_steps():
    from types import SimpleNamespace

    from repro.extras.components.finetune import Finetune

    finetune = Finetune(_head_and_backbone(), total_steps=10, freeze_steps=3)
    frozen = [finetune.frozen_at(SimpleNamespace(step=s, epoch=0)) for s in range(6)]
    assert frozen == [True, True, True, False, False, False]  # steps 1-3 train the head only
    by_epochs = Finetune(_head_and_backbone(), total_steps=10, freeze_epochs=1)
    assert [by_epochs.frozen_at(SimpleNamespace(step=9, epoch=e)) for e in (0, 1)] == [True, False]
    assert not Finetune(_head_and_backbone(), total_steps=10).frozen_at(
        SimpleNamespace(step=0, epoch=0)
    )


def _model_with_dropout() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Dropout(0.5),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 2),
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"freeze_steps": True}, "freeze_steps=True: allowed: an integer >= 0"),
        ({"freeze_steps": "3"}, "freeze_steps='3': allowed: an integer >= 0"),
        ({"freeze_epochs": -1}, "freeze_epochs=-1: allowed: an integer >= 0"),
        ({"freeze_epochs": 1, "freeze_steps": 1},
         "freeze_epochs and freeze_steps both set: allowed: one of them"),
        ({"freeze_steps": 11}, "freeze_steps=11: allowed: at most the run's 10 steps"),
        ({"bn_eval": "yes"}, "bn_eval='yes': allowed: true or false"),
    ],
)  # fmt: skip
def test_a_finetune_setting_out_of_range_is_refused_word_for_word(arguments, message):
    from repro.extras.components.finetune import Finetune

    with pytest.raises(ValueError) as refused:
        Finetune(_model_with_dropout(), total_steps=10, **arguments)
    assert str(refused.value) == message


def test_a_model_without_a_head_is_refused_and_freezing_every_step_is_allowed():
    from repro.extras.components.finetune import Finetune

    with pytest.raises(ValueError) as refused:
        Finetune(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), total_steps=10)
    assert str(refused.value) == "the model has no classifier head (an nn.Linear) to train alone"
    assert Finetune(_model_with_dropout(), total_steps=10, freeze_steps=10).freeze_steps == 10
    assert Finetune(_model_with_dropout(), total_steps=10, freeze_steps=4).state_dict() == {
        "freeze_epochs": 0, "freeze_steps": 4,
    }  # fmt: skip


def _loop(model: torch.nn.Module, step: int, **more) -> object:
    from types import SimpleNamespace

    position = SimpleNamespace(step=step, epoch=0)
    return SimpleNamespace(model=model, state=SimpleNamespace(position=position), **more)


def test_while_frozen_only_the_backbones_batchnorm_is_in_eval_and_its_gradients_are_zero():
    from repro.extras.components.finetune import Finetune

    model = _model_with_dropout().train()
    finetune = Finetune(model, total_steps=10, freeze_steps=1)  # bn_eval by default
    conv, norm, dropout, head = model[0], model[1], model[2], model[4]
    assert finetune.norms == [norm] and not finetune.frozen

    def backward() -> None:
        model.zero_grad(set_to_none=True)
        model(torch.randn(2, 3, 6, 6)).sum().backward()

    finetune.before_step(_loop(model, step=0))  # step 1: frozen
    assert not norm.training and dropout.training and head.training
    backward()  # zeros, not None: clipping and DDP's exchange see no backbone gradient
    assert torch.equal(conv.weight.grad, torch.zeros_like(conv.weight))
    assert head.weight.grad.abs().sum() > 0
    finetune.before_step(_loop(model, step=1))  # step 2: the whole model trains
    assert norm.training
    backward()
    assert conv.weight.grad.abs().sum() > 0


def test_without_bn_eval_the_backbones_batchnorm_keeps_training_while_frozen():
    from repro.extras.components.finetune import Finetune

    model = _model_with_dropout().train()
    finetune = Finetune(model, total_steps=10, freeze_steps=1, bn_eval=False)
    finetune.before_step(_loop(model, step=0))
    assert finetune.frozen and model[1].training


def test_the_optimizer_hook_is_registered_once_and_a_frozen_step_leaves_the_backbone():
    from types import SimpleNamespace

    from repro.extras.components.finetune import Finetune

    model = _model_with_dropout().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    finetune = Finetune(model, total_steps=10, freeze_steps=1)
    data = SimpleNamespace(sampler=SimpleNamespace(batches_per_epoch=lambda: 3))
    loop = _loop(model, step=0, optimizer=optimizer, total_steps=10, data=data)
    finetune.at_start(loop)
    finetune.at_start(loop)  # a second attempt in the same process: no second hook
    assert len(optimizer._optimizer_step_pre_hooks) == 1
    before = model[0].weight.detach().clone()
    finetune.before_step(loop)
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    optimizer.step()  # weight decay and momentum would move a zero gradient's weight
    assert torch.equal(model[0].weight, before) and model[0].weight not in optimizer.state


def test_freeze_epochs_beyond_the_run_names_its_whole_epochs():
    from types import SimpleNamespace

    from repro.extras.components.finetune import Finetune

    model = _model_with_dropout()
    finetune = Finetune(model, total_steps=7, freeze_epochs=3)
    data = SimpleNamespace(sampler=SimpleNamespace(batches_per_epoch=lambda: 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError) as refused:  # 7 steps of 3 a epoch: 2 whole epochs
        finetune.at_start(_loop(model, step=0, data=data, total_steps=7, optimizer=optimizer))
    assert str(refused.value) == (
        "components.finetune.freeze_epochs=3 is not allowed: at most the run's 2 epochs"
    )
