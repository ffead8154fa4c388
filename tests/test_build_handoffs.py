"""What repro.core.build hands on, in-process and without training: the model's seed stream and the
class count it leaves to the data, the objective as the loop calls it, the optimizer's resolved
settings, the transforms an older or partial augment config makes, the images a model is fitted
on, what the loaders pass to the pipelines, the workers and the transfer, and the depths a
model's own grouping or its layout gives."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict
from torch import nn

from repro.core import build
from repro.core.data.loader import LoaderContext
from repro.core.runtime.memory_format import FORMATS
from repro.core.runtime.precision import Precision
from repro.core.runtime.seeding import seeded
from repro.core.tasks.objectives import Checked

from conftest import compose_config, tiny

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def kinds(pipeline) -> list[str]:
    return [type(step).__name__ for step in pipeline.steps]


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


def test_a_model_is_built_in_the_model_stream_and_given_classes_only_where_it_has_the_key():
    cfg = compose_config(*tiny())
    with seeded(5, "model"):
        expected = instantiate(cfg.model)
    assert same_weights(build.model(cfg, 5), expected)
    cfg.model = OmegaConf.create({"_target_": "torch.nn.Flatten"})  # no num_classes at all
    assert isinstance(build.model(cfg, 0, num_classes=7), nn.Flatten)


def test_the_objective_is_the_configs_checked_under_its_target():
    cfg = compose_config(*tiny("objective.label_smoothing=0.25"))
    built = build.objective(cfg)
    assert isinstance(built, Checked) and built.target == "repro.core.tasks.objectives.CrossEntropy"
    assert type(built.objective).__name__ == "CrossEntropy"
    assert built.objective.label_smoothing == 0.25


def test_the_optimizer_sees_its_settings_resolved_and_fuses_only_for_fp16_on_a_gpu():
    cfg = compose_config(*tiny("optimizer.weight_decay=${optimizer.lr}"))
    built = build.optimizer(cfg, nn.Linear(2, 2), Precision("off", CPU))
    assert built.defaults["weight_decay"] == built.defaults["lr"] == cfg.optimizer.lr
    for mode, device in (("bf16", CUDA), ("fp16", CPU)):
        precision = SimpleNamespace(mode=mode, device=device)
        plain = build.optimizer(compose_config(*tiny()), nn.Linear(2, 2), precision)
        assert not plain.defaults.get("fused"), (mode, device)


def plain(cfg):
    """The config as an older checkpoint holds it: without the schema's types and defaults."""
    return OmegaConf.create(OmegaConf.to_container(cfg))


def test_a_config_without_augment_or_its_newer_keys_crops_and_flips_at_random_with_zeros():
    older = compose_config(*tiny())
    with open_dict(older):
        del older["augment"]
    train, _ = build.pipelines(older)
    assert kinds(train) == ["RandomCrop", "HorizontalFlip"]
    assert train.steps[0].mode == "zeros" and not train.steps[1].alternate
    partial = plain(
        compose_config(*tiny("augment.flip=alternate", "augment.crop_padding_mode=edge"))
    )
    del partial.augment["flip"], partial.augment["crop_padding_mode"]
    train, _ = build.pipelines(partial)
    assert train.steps[0].mode == "zeros" and not train.steps[1].alternate


def test_the_pipelines_add_torchvision_steps_and_skip_the_resize_of_a_cache():
    cfg = compose_config(*tiny("data.resize=36"))
    cfg.augment.transforms = [{"_target_": "torchvision.transforms.v2.ColorJitter"}]
    train, evaluation = build.pipelines(cfg)
    assert kinds(train) == ["ResizeShorter", "RandomCrop", "HorizontalFlip", "TorchvisionSteps"]
    assert kinds(evaluation) == ["ResizeShorter", "CenterCrop"]
    assert evaluation.steps[1].size == cfg.data.image_size
    train, evaluation = build.pipelines(cfg, resized=True)
    assert kinds(train)[:2] == ["RandomCrop", "HorizontalFlip"]
    assert kinds(evaluation) == ["CenterCrop"]
    norm = {**build.normalisation(cfg), "interpolation": "bicubic"}
    train, evaluation = build.pipelines(cfg, norm=norm)
    assert train.steps[0].mode == "bicubic" == evaluation.steps[0].mode


class Fits(nn.Linear):
    """A model fitted to its data, which takes every image it is given (no `fit_images`)."""

    def __init__(self) -> None:
        super().__init__(1, 1)
        self.seen: list[torch.Tensor] = []

    def fit_to_data(self, images: torch.Tensor) -> None:
        self.seen.append(images)


def normalised(images: torch.Tensor, norm: dict) -> torch.Tensor:
    mean = torch.tensor(norm["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(norm["std"]).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


def test_a_model_is_fit_on_every_training_image_as_its_own_normalisation_makes_them():
    cfg = compose_config(*tiny())
    data = build.splits(cfg, 0)
    model = Fits()
    own = {"mean": [0.5, 0.4, 0.3], "std": [0.25, 0.5, 1.0], "image_size": 16}
    model.pretrained_normalisation = own
    build.fit_to_data(model, cfg, data, 3)
    norm = build.normalisation(cfg, model)
    _, evaluation = build.pipelines(cfg, norm=norm)
    raw = torch.stack([evaluation(data.train[index][0], None) for index in range(len(data.train))])
    (images,) = model.seen
    assert images.shape == (len(data.train), 3, 16, 16)
    assert torch.allclose(images, normalised(raw, norm), atol=1e-6)
    one = Fits()
    one.fit_images = 1
    build.fit_to_data(one, cfg, data, 3)
    assert one.seen[0].shape == (1, 3, 32, 32)


def test_a_model_is_fit_on_images_of_any_size_resized_and_on_a_cache_as_it_holds_them():
    cfg = compose_config(*tiny())
    norm = build.normalisation(cfg)
    images = torch.randint(0, 256, (4, 3, 40, 48), dtype=torch.uint8)
    files = SimpleNamespace(train=[(image, 0) for image in images], resized=False, any_size=True)
    model = Fits()
    build.fit_to_data(model, cfg, files, 0)
    assert model.seen[0].shape == (4, 3, 32, 32)
    cached = replace(build.splits(cfg, 0), resized=True)
    resizing = compose_config(*tiny("data.resize=36"))
    model = Fits()
    build.fit_to_data(model, resizing, cached, 0)
    raw = torch.stack([cached.train[index][0] for index in range(len(cached.train))])
    assert torch.allclose(model.seen[0], normalised(raw, norm), atol=1e-6), "not resized again"


def test_the_loaders_hand_on_the_cache_the_norm_the_workers_batches_and_the_pin(monkeypatch):
    cfg = compose_config(*tiny())
    data = replace(build.splits(cfg, 0), resized=True, any_size=True)
    norm = {**build.normalisation(cfg), "mean": [0.0] * 3, "std": [1.0] * 3}
    piped, made, fed, sent = [], [], [], []
    pipelines, train_loader = build.pipelines, build.train_loader
    monkeypatch.setattr(
        build, "pipelines", lambda cfg, **given: piped.append(given) or pipelines(cfg, **given)
    )
    monkeypatch.setattr(build, "DeviceBatches", lambda *args: made.append(args) or len(made))
    monkeypatch.setattr(
        build, "train_loader", lambda *args: fed.append(args[-1]) or train_loader(*args)
    )
    monkeypatch.setattr(
        build, "prefetched", lambda loader, prepare, pin: sent.append((prepare, pin)) or loader
    )
    build.loaders(cfg, data, LoaderContext(root_seed=0, device=CUDA, pin_memory=True), norm)
    assert piped == [{"resized": True, "any_size": True, "norm": norm}]
    layout = FORMATS[cfg.memory_format.name]
    assert made == [(CUDA, [0.0] * 3, [1.0] * 3, layout)] * 2
    assert fed == [None], "a GPU normalises its own batches"
    assert sorted(sent) == [(1, True), (2, True)]
    build.loaders(cfg, data, LoaderContext(root_seed=0), norm)
    assert made[2:] == [(CPU, [0.0] * 3, [1.0] * 3, torch.contiguous_format)] * 2
    assert fed[1:] == [3], "on a CPU the workers normalise"
    assert sorted(sent[2:]) == [(3, False), (4, False)]


def test_the_splits_are_the_datas_under_the_seed_with_the_loggers_progress(monkeypatch):
    said = []
    monkeypatch.setattr(build, "build_splits", lambda *args: said.append(args))
    cfg = compose_config(*tiny("logger.progress=false"))
    build.splits(cfg, 4)
    older = plain(cfg)
    del older.logger["progress"]
    build.splits(older, 5)
    assert cfg.logger.progress != "auto"
    assert said == [(cfg.data, 4, cfg.logger.progress), (older.data, 5, "auto")]


class Grouped(nn.Module):
    """A model with timm's own grouping: each block of its body is a depth of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3)
        self.body = nn.Sequential(nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1))
        self.head = nn.Linear(4, 3)

    def group_matcher(self, coarse: bool = False) -> dict[str, str]:
        return {"stem": r"^stem", "blocks": r"^body" if coarse else r"^body\.(\d+)"}


def test_depths_follow_the_models_own_grouping_then_its_layout():
    depths, count = build.layer_ids(Grouped())
    assert count == 4
    assert {name: depth for name, depth in depths.items() if name.endswith("weight")} == {
        "stem.weight": 0,
        "body.0.weight": 1,
        "body.1.weight": 2,
        "head.weight": 3,
    }
    gapped = nn.Sequential()
    gapped.add_module("stem", nn.Conv2d(3, 4, 3))
    gapped.add_module("act", nn.ReLU())  # holds no parameter: no depth of its own
    gapped.add_module("head", nn.Linear(4, 3))
    depths, count = build.layer_ids(gapped)
    assert (depths["stem.weight"], depths["head.weight"], count) == (0, 1, 2)
    assert build.layer_ids(nn.Sequential(nn.Linear(2, 2))) == ({"0.weight": 0, "0.bias": 0}, 1)
    head_first = nn.Sequential()
    head_first.add_module("head", nn.Linear(4, 3))
    head_first.add_module("stem", nn.Conv2d(3, 4, 3))
    depths, count = build.layer_ids(head_first)
    assert (depths["head.weight"], depths["stem.weight"], count) == (2, 1, 3), "the head deepest"


def test_an_evaluation_on_the_device_takes_the_eval_batch_size():
    cfg = compose_config(*tiny("dataloader=device", "trainer.eval_batch_size=48"))
    data = build.splits(cfg, 0)
    context = LoaderContext(root_seed=0)
    evaluated = build.evaluation_loader(cfg, data.test, build.pipelines(cfg)[1], context)
    assert evaluated.batch_size == 48 and len(evaluated) == 3
