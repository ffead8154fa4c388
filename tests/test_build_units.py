"""What repro.core.build makes, in-process and without training: normalisation and pipelines,
the optimizer's parameter groups, where a head is and how deep each parameter lies, and each
builder's one-line refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from repro.core import build
from repro.core.data import transforms
from repro.core.errors import ConfigError
from repro.core.runtime.precision import Precision

from conftest import compose_config, tiny


class Net(nn.Module):
    """A stem, a body and a head, with a frozen parameter and 1-d ones."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3)
        self.frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
        self.body = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
        self.head = nn.Linear(4, 3)


def names_of(model: nn.Module, group) -> list[str]:
    params = group["params"] if isinstance(group, dict) else [group]
    ids = {id(p) for p in params}
    return [name for name, p in model.named_parameters() if id(p) in ids]


SGD = {"_target_": "torch.optim.SGD", "lr": 0.1, "weight_decay": 5e-4}


def test_one_group_of_every_trained_parameter_by_default():
    model = Net()
    groups = build._parameter_groups(model, dict(SGD))
    assert [p for p in groups] == [p for p in model.parameters() if p.requires_grad]


def test_biases_and_norm_weights_apart_without_decay_or_with_their_own_lr():
    model = Net()
    settings = {**SGD, "decay_biases_and_norms": False}
    big, small = build._parameter_groups(model, settings)
    assert names_of(model, big) == ["stem.weight", "body.0.weight", "head.weight"]
    assert names_of(model, small) == [
        "stem.bias",
        "body.0.bias",
        "body.1.weight",
        "body.1.bias",
        "head.bias",
    ]
    assert small["weight_decay"] == 0.0 and "lr" not in small
    assert "decay_biases_and_norms" not in settings, "the template's keys are taken out"
    scaled = build._parameter_groups(model, {**SGD, "lr_scale_biases_and_norms": 4})
    assert scaled[1]["lr"] == pytest.approx(0.4) and scaled[1]["weight_decay"] == pytest.approx(
        1.25e-4
    )
    both = build._parameter_groups(
        model, {**SGD, "lr_scale_biases_and_norms": 2, "decay_biases_and_norms": False}
    )
    assert both[1]["lr"] == pytest.approx(0.2) and both[1]["weight_decay"] == 0.0


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("decay_biases_and_norms", "yes", "true or false"),
        ("lr_scale_biases_and_norms", 0, "a number > 0"),
        ("lr_scale_biases_and_norms", True, "a number > 0"),
        ("layer_decay", 1.5, "null or a number in (0, 1]"),
        ("layer_decay", 0, "null or a number in (0, 1]"),
        ("head_lr", -1, "null or a number > 0"),
        ("head_lr", 0, "null or a number > 0"),
        ("head_lr", "fast", "null or a number > 0"),
    ],
)
def test_the_templates_optimizer_keys_are_checked(key, value, allowed):
    with pytest.raises(ConfigError) as refused:
        build._parameter_groups(Net(), {**SGD, key: value})
    assert str(refused.value) == f"optimizer.{key}={value!r} is not allowed: {allowed}"


def test_a_scale_or_fine_tuning_needs_a_learning_rate():
    without_lr = {"_target_": "torch.optim.SGD"}
    with pytest.raises(ConfigError) as refused:
        build._parameter_groups(Net(), {**without_lr, "lr_scale_biases_and_norms": 2})
    said = "optimizer.lr=None is not allowed: a number with lr_scale_biases_and_norms"
    assert str(refused.value) == said
    with pytest.raises(ConfigError) as refused:
        build._parameter_groups(Net(), {**without_lr, "head_lr": 0.1})
    assert (
        str(refused.value)
        == "optimizer.lr=None is not allowed: a number with layer_decay or head_lr"
    )


def test_layer_decay_shrinks_the_lr_with_depth_below_the_head():
    model = Net()
    groups = build._parameter_groups(model, {**SGD, "layer_decay": 0.5})
    by_name = {name: group for group in groups for name in names_of(model, group)}
    assert by_name["head.weight"]["lr"] == pytest.approx(0.1)
    assert by_name["body.0.weight"]["lr"] == pytest.approx(0.05)
    assert by_name["stem.weight"]["lr"] == pytest.approx(0.025)
    assert by_name["stem.weight"]["weight_decay"] == 5e-4
    assert by_name["stem.bias"]["weight_decay"] == 5e-4, "decayed unless told otherwise"
    assert "frozen" not in by_name
    undecayed = build._parameter_groups(
        model, {**SGD, "layer_decay": 1, "decay_biases_and_norms": False}
    )
    by_name = {name: group for group in undecayed for name in names_of(model, group)}
    assert by_name["stem.weight"]["lr"] == by_name["head.weight"]["lr"] == pytest.approx(0.1)
    assert by_name["stem.weight"]["weight_decay"] == 5e-4, "1 is allowed: no decay by depth"
    assert by_name["stem.bias"]["weight_decay"] == 0.0 == by_name["head.bias"]["weight_decay"]


def test_a_head_lr_sets_the_heads_and_the_small_rule_still_applies():
    model = Net()
    settings = {**SGD, "head_lr": 0.7, "lr_scale_biases_and_norms": 2}
    groups = build._parameter_groups(model, settings)
    by_name = {name: group for group in groups for name in names_of(model, group)}
    assert by_name["head.weight"]["lr"] == pytest.approx(0.7)
    assert by_name["head.bias"]["lr"] == pytest.approx(1.4)
    assert by_name["head.bias"]["weight_decay"] == pytest.approx(2.5e-4)
    assert by_name["stem.weight"]["lr"] == pytest.approx(0.1)
    lrs = sorted({round(group["lr"], 6) for group in groups})
    assert len(groups) == len({(g["lr"], g["weight_decay"]) for g in groups}) and lrs == [
        0.1,
        0.2,
        0.7,
        1.4,
    ]


def test_the_weight_decay_is_the_configs_or_the_classs_default():
    assert build._weight_decay({"weight_decay": 3}) == 3.0
    assert build._weight_decay({"_target_": "torch.optim.AdamW"}) == 0.01
    assert build._weight_decay({"_target_": "torch.optim.SGD"}) == 0.0
    assert build._weight_decay({"_target_": "torch.optim.LBFGS"}) == 0.0, "none declared"
    with pytest.raises(
        ConfigError, match=r"^optimizer._target_='torch.optim.Nope' .*cannot import"
    ):
        build._weight_decay({"_target_": "torch.optim.Nope"})


def test_the_head_is_timms_classifier_or_the_last_linear():
    assert build.head_name(Net()) == "head"
    assert build.head_name(nn.Sequential(nn.Conv2d(1, 1, 1))) is None

    class Timmish(Net):
        def __init__(self) -> None:
            super().__init__()
            self.fc_norm = nn.Linear(3, 3)

        def get_classifier(self):
            return self.head

    assert build.head_name(Timmish()) == "head"
    assert build.in_head("head.weight", "head") and build.in_head("head", "head")
    assert not build.in_head("header.weight", "head") and not build.in_head("head.weight", None)


def test_depths_go_by_top_level_module_with_the_head_deepest():
    depths, count = build.layer_ids(Net())
    assert count == 3
    assert depths == {
        "stem.weight": 0,
        "stem.bias": 0,
        "frozen": 0,  # the model's own: on the input's side
        "body.0.weight": 1,
        "body.0.bias": 1,
        "body.1.weight": 1,
        "body.1.bias": 1,
        "head.weight": 2,
        "head.bias": 2,
    }


def test_timms_own_grouping_sets_the_depths():
    import timm

    model = timm.create_model("test_resnet", num_classes=3)
    depths, count = build.layer_ids(model)
    head = build.head_name(model)
    assert all(depths[name] == count - 1 for name in depths if name.startswith(f"{head}."))
    assert min(depths.values()) == 0 and count > 2


def test_normalisation_is_the_models_own_else_the_datas():
    cfg = compose_config(*tiny())
    plain = build.normalisation(cfg)
    assert plain == {
        "mean": list(cfg.data.mean),
        "std": list(cfg.data.std),
        "image_size": cfg.data.image_size,
        "interpolation": "bilinear",
    }
    model = nn.Linear(1, 1)
    model.pretrained_normalisation = {
        "std": [1, 2, 3],
        "image_size": 40,
        "interpolation": "bicubic",
    }
    own = build.normalisation(cfg, model)
    assert own["std"] == [1.0, 2.0, 3.0] and own["mean"] == list(cfg.data.mean)
    assert own["image_size"] == 40 and own["interpolation"] == "bicubic"
    model.pretrained_normalisation = "not a dict"
    assert build.normalisation(cfg, model) == plain


@pytest.mark.parametrize(
    ("own", "key", "value", "allowed"),
    [
        ({"interpolation": "nearest"}, "model.interpolation", "nearest", "bilinear or bicubic"),
        (
            {"std": [1, 0, 1]},
            "model.std",
            [1.0, 0.0, 1.0],
            "three positive numbers (and three means)",
        ),
        ({"mean": [0.5]}, "model.std", "data's", "three positive numbers (and three means)"),
    ],
)
def test_a_normalisation_that_cannot_be_used_is_one_line(own, key, value, allowed):
    model, cfg = nn.Linear(1, 1), compose_config(*tiny())
    model.pretrained_normalisation = own
    with pytest.raises(ConfigError) as refused:
        build.normalisation(cfg, model)
    value = [float(x) for x in cfg.data.std] if value == "data's" else value
    assert str(refused.value) == f"{key}={value!r} is not allowed: {allowed}"


def kinds(pipeline: transforms.Compose) -> list[str]:
    return [type(step).__name__ for step in pipeline.steps]


def test_pipelines_follow_the_augment_group():
    cfg = compose_config(
        *tiny("augment.cutout=4", "augment.flip=alternate", "augment.crop_padding_mode=edge")
    )
    train, evaluation = build.pipelines(cfg)
    assert kinds(train) == ["RandomCrop", "HorizontalFlip", "Cutout"] and kinds(evaluation) == []
    crop, flip, cutout = train.steps
    assert (crop.size, crop.padding, crop.mode) == (
        cfg.data.image_size,
        cfg.data.crop_padding,
        "edge",
    )
    assert flip.alternate and cutout.size == 4
    plain = compose_config(*tiny("augment.crop_flip=false"))
    assert kinds(build.pipelines(plain)[0]) == []


def test_images_of_any_size_are_resized_to_the_image_size_and_a_models_size_rescales():
    cfg = compose_config(*tiny())
    size = cfg.data.image_size
    train, evaluation = build.pipelines(cfg, any_size=True)
    assert kinds(evaluation) == ["ResizeShorter", "CenterCrop"] and evaluation.steps[0].size == size
    norm = {**build.normalisation(cfg), "image_size": 2 * size, "interpolation": "bicubic"}
    train, evaluation = build.pipelines(cfg, norm=norm, any_size=True)
    assert evaluation.steps[0].size == 2 * size and evaluation.steps[0].mode == "bicubic"
    assert train.steps[1].size == 2 * size
    resized = compose_config(*tiny(f"data.resize={size + 4}"))
    _, evaluation = build.pipelines(resized, norm={**norm, "interpolation": "bilinear"})
    assert evaluation.steps[0].size == round((size + 4) * 2)


def test_a_cache_holds_the_datas_size_only():
    cfg = compose_config(*tiny())
    norm = {**build.normalisation(cfg), "image_size": cfg.data.image_size + 1}
    with pytest.raises(ConfigError, match=r"^data\.cache='memory' is not allowed: none: the model"):
        build.pipelines(cfg, resized=True, norm=norm)
    bicubic = {**build.normalisation(cfg), "interpolation": "bicubic"}
    with pytest.raises(ConfigError):
        build.pipelines(cfg, resized=True, norm=bicubic)
    train, _ = build.pipelines(cfg, resized=True)
    assert "ResizeShorter" not in kinds(train)


def test_torchvision_transforms_are_built_from_their_nodes():
    nodes = OmegaConf.create(
        [{"_target_": "torchvision.transforms.v2.ColorJitter", "brightness": 0.2}]
    )
    (jitter,) = build.torchvision_transforms(nodes)
    assert type(jitter).__name__ == "ColorJitter" and jitter.brightness == (0.8, 1.2)
    with pytest.raises(ConfigError) as refused:
        build.torchvision_transforms(OmegaConf.create([{"_target_": "x.Nope"}]))
    assert str(refused.value).startswith(
        "augment.transforms[0]='x.Nope' is not allowed: cannot build"
    )
    with pytest.raises(ConfigError) as refused:
        build.torchvision_transforms(
            OmegaConf.create([{"_target_": "torch.nn.Identity"}, {"p": 1}])
        )
    assert str(refused.value) == (
        "augment.transforms[1]={'p': 1} is not allowed: a transform given by _target_ (and its "
        "arguments)"
    )


def test_a_ranks_batch_is_the_whole_or_its_share():
    cfg = SimpleNamespace(trainer=SimpleNamespace(batch_size=12, global_batch=False))
    assert build.rank_batch_size(cfg, 5) == 12
    cfg.trainer.global_batch = True
    assert build.rank_batch_size(cfg, 3) == 4 and build.rank_batch_size(cfg, 1) == 12
    with pytest.raises(ConfigError) as refused:
        build.rank_batch_size(cfg, 5)
    assert str(refused.value) == (
        "trainer.batch_size=12 is not allowed: a multiple of the 5 ranks when "
        "trainer.global_batch=true"
    )


def test_a_model_is_built_from_its_stream_with_the_datas_classes_where_it_leaves_them():
    cfg = compose_config(*tiny())
    first, again = build.model(cfg, 3), build.model(cfg, 3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(first.state_dict().values(), again.state_dict().values(), strict=True)
    )
    other = build.model(cfg, 4)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(first.state_dict().values(), other.state_dict().values(), strict=True)
    )
    left = compose_config(*tiny("model.num_classes=null"))
    assert build.model(left, 0, num_classes=7)(torch.zeros(1, 3, 32, 32)).shape == (1, 7)
    fixed = build.model(cfg, 0, num_classes=7)
    assert fixed(torch.zeros(1, 3, 32, 32)).shape[1] == cfg.model.num_classes, "its own kept"


def test_a_model_or_objective_that_cannot_be_built_is_one_line():
    cfg = compose_config(*tiny("model._target_=torch.nn.Nope"))
    with pytest.raises(ConfigError, match=r"^model\._target_='torch\.nn\.Nope' .*could not build"):
        build.model(cfg, 0)
    cfg = compose_config(*tiny("model._target_=builtins.dict"))
    with pytest.raises(ConfigError) as refused:
        build.model(cfg, 0)
    said = "model._target_='builtins.dict' is not allowed: must build a torch nn.Module"
    assert str(refused.value) == said
    cfg = compose_config(*tiny("objective._target_=torch.nn.Nope"))
    with pytest.raises(
        ConfigError,
        match=r"^objective\._target_='torch\.nn\.Nope' is not allowed: could not build it: ",
    ):
        build.objective(cfg)
    cfg = compose_config(*tiny("objective._target_=builtins.dict"))
    with pytest.raises(ConfigError) as refused:
        build.objective(cfg)
    said = (
        "objective._target_='builtins.dict' is not allowed: must build a callable (logits, targets)"
    )
    assert str(refused.value) == said


def test_fit_images_must_be_a_whole_number():
    class Fits(nn.Linear):
        fit_images = 0

        def fit_to_data(self, images):
            raise AssertionError("not reached")

    cfg = compose_config(*tiny())
    with pytest.raises(ConfigError, match=r"^model\.fit_images=0 is not allowed: an integer >= 1"):
        build.fit_to_data(Fits(1, 1), cfg, build.splits(cfg, 0), 0)
    build.fit_to_data(nn.Linear(1, 1), cfg, None, 0)  # nothing to fit: the data is not read


def test_an_optimizer_that_cannot_be_built_is_one_line():
    cfg = compose_config(*tiny("+optimizer.momentun=0.9"))
    precision = Precision("off", torch.device("cpu"))
    with pytest.raises(
        ConfigError,
        match=r"^optimizer\._target_='torch\.optim\.SGD' .*could not build it: .*momentun",
    ):
        build.optimizer(cfg, Net(), precision)
    built = build.optimizer(compose_config(*tiny()), Net(), precision)
    assert len(built.param_groups) >= 1


def test_one_process_runs_the_model_itself_and_sync_batchnorm_needs_a_gpu():
    from repro.core.runtime.distributed import Context

    model = Net()
    assert build.data_parallel(model, True, Context(), torch.device("cpu")) is model
    with pytest.raises(ConfigError) as refused:
        build.data_parallel(model, True, Context(world=2), torch.device("cpu"))
    assert str(refused.value) == (
        "trainer.sync_batchnorm=True is not allowed: false on CPU: torch's SyncBatchNorm runs "
        "on GPUs only"
    )


def test_device_batches_are_normalised_in_the_models_format_on_a_gpu_only(monkeypatch):
    made = []
    monkeypatch.setattr(build, "DeviceBatches", lambda *args: made.append(args))
    cfg = compose_config(*tiny("memory_format=channels_last"))
    build.device_batches(cfg, torch.device("cpu"))
    build.device_batches(cfg, torch.device("cuda"), {"mean": [0, 0, 0], "std": [1, 1, 1]})
    norm = build.normalisation(cfg)
    assert made[0] == (torch.device("cpu"), norm["mean"], norm["std"], torch.contiguous_format)
    assert made[1] == (torch.device("cuda"), [0, 0, 0], [1, 1, 1], torch.channels_last)


def test_a_model_with_parameters_of_its_own_fine_tunes_by_depth():
    from torchvision.models import VisionTransformer

    vit = VisionTransformer(
        32, 16, num_layers=1, num_heads=1, hidden_dim=8, mlp_dim=8, num_classes=3
    )
    depths, count = build.layer_ids(vit)  # its class token is no module's
    assert depths["class_token"] == 0 == depths["conv_proj.weight"] and count == 3
    groups = build._parameter_groups(vit, {**SGD, "layer_decay": 0.5})
    by_name = {name: group for group in groups for name in names_of(vit, group)}
    assert by_name["class_token"]["lr"] == pytest.approx(0.025)
    assert by_name["heads.head.weight"]["lr"] == pytest.approx(0.1)


def loader_parts(*overrides: str, **context):
    from repro.core.data.loader import LoaderContext

    cfg = compose_config(*tiny(*overrides))
    return cfg, build.splits(cfg, 0), LoaderContext(root_seed=0, **context)


def test_the_loaders_take_the_ranks_batch_and_normalise_training_batches_on_a_cpu():
    cfg, data, context = loader_parts("dataloader.num_workers=1")
    train, sampler, val = build.loaders(cfg, data, context)
    assert sampler.batches_per_epoch() == len(train) == 384 // 64
    images, labels = next(iter(train))  # a worker made the batch and normalised it
    assert images.dtype == torch.float32 and images.shape == (64, 3, 32, 32)
    assert labels.shape == (64,)
    assert val.batch_sampler.batch_size == 128 and len(val) == 1
    assert next(iter(val))[0].dtype == torch.uint8  # normalised by the loop, on the device
    half, _, _ = build.loaders(*loader_parts("trainer.global_batch=true", rank=1, world=2)[:3])
    assert next(iter(half))[0].shape[0] == 32


def test_a_batch_larger_than_the_training_split_or_workers_under_the_sanitizer_are_refused(
    monkeypatch,
):
    cfg, data, context = loader_parts("trainer.batch_size=385")
    with pytest.raises(ConfigError) as refused:
        build.loaders(cfg, data, context)
    assert str(refused.value) == (
        "trainer.batch_size=385 is not allowed: at most the 384 training images (over all ranks)"
    )
    monkeypatch.setenv("TORCH_CUDA_SANITIZER", "1")
    cfg, data, _ = loader_parts("dataloader.num_workers=2")
    build.loaders(cfg, data, context)  # a CPU run: nothing of CUDA's to check
    from repro.core.data.loader import LoaderContext

    on_gpu = LoaderContext(root_seed=0, device=torch.device("cuda"))
    with pytest.raises(ConfigError) as refused:
        build.loaders(cfg, data, on_gpu)
    assert str(refused.value) == (
        "dataloader.num_workers=2 is not allowed: 0 under TORCH_CUDA_SANITIZER (its checks run "
        "in every process, and a forked worker cannot use CUDA); or dataloader=device"
    )
    cfg, data, _ = loader_parts("dataloader.num_workers=0")

    class ReachedError(Exception):
        pass

    def reached(*args):
        raise ReachedError

    monkeypatch.setattr(build, "device_batches", reached)
    with pytest.raises(ReachedError):  # 0 workers pass the check and go on to build the loaders
        build.loaders(cfg, data, on_gpu)


def test_dataloader_device_makes_the_batches_on_the_device():
    from repro.core.data import device_loader

    cfg, data, context = loader_parts("dataloader=device")
    _, sampler, val = build.loaders(cfg, data, context)
    assert isinstance(val, device_loader.DeviceEvalLoader) and len(val) == 1
    assert sampler.batches_per_epoch() == 6
    evaluated = build.evaluation_loader(cfg, data.test, build.pipelines(cfg)[1], context)
    assert isinstance(evaluated, device_loader.DeviceEvalLoader)
    cfg, data, context = loader_parts()
    plain = build.evaluation_loader(cfg, data.test, build.pipelines(cfg)[1], context)
    assert isinstance(plain, torch.utils.data.DataLoader) and plain.batch_sampler.batch_size == 128


def test_under_torchrun_the_model_runs_through_ddp_with_its_gpu_named(monkeypatch):
    from repro.core.runtime.distributed import Context

    wrapped, converted = [], []
    monkeypatch.setattr(
        build.nn.parallel,
        "DistributedDataParallel",
        lambda model, device_ids: wrapped.append((model, device_ids)) or "ddp",
    )
    monkeypatch.setattr(
        build.nn.SyncBatchNorm, "convert_sync_batchnorm", lambda model: converted.append(model)
    )
    model, two = Net(), Context(world=2)
    assert build.data_parallel(model, False, two, torch.device("cpu")) == "ddp"
    assert build.data_parallel(model, False, two, torch.device("cuda", 1)) == "ddp"
    assert wrapped == [(model, None), (model, [1])] and converted == []
    build.data_parallel(model, True, two, torch.device("cuda", 0))
    assert converted == [model] and wrapped[-1] == (None, [0])


def test_a_model_fit_to_its_data_gets_training_images_drawn_by_the_seed_normalised():
    from repro.core.runtime.seeding import torch_generator

    seen = []

    class Fits(nn.Linear):
        fit_images = 5

        def fit_to_data(self, images):
            seen.append(images)

    cfg = compose_config(*tiny())
    data = build.splits(cfg, 0)
    build.fit_to_data(Fits(1, 1), cfg, data, 3)
    drawn = torch.randperm(len(data.train), generator=torch_generator(3, "fit"))[:5]
    chosen = drawn.sort().values.tolist()
    assert chosen != sorted(range(5)), "drawn at random, not the split's first"
    norm = build.normalisation(cfg)
    mean = torch.tensor(norm["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(norm["std"]).view(1, 3, 1, 1)
    raw = torch.stack([data.train[index][0] for index in chosen]).float() / 255
    (images,) = seen
    assert images.shape == (5, 3, 32, 32)
    assert torch.allclose(images, (raw - mean) / std, atol=1e-6)
    Fits.fit_images = 10**6  # more than the split holds: all of it
    build.fit_to_data(Fits(1, 1), cfg, data, 3)
    assert len(seen[1]) == len(data.train)
    for wrong in (True, "3", 2.0):
        Fits.fit_images = wrong
        with pytest.raises(ConfigError) as refused:
            build.fit_to_data(Fits(1, 1), cfg, data, 3)
        assert str(refused.value) == f"model.fit_images={wrong!r} is not allowed: an integer >= 1"


def test_fp16_on_a_gpu_runs_the_optimizer_fused_where_it_can_and_says_so(caplog):
    import logging

    gpu_fp16 = SimpleNamespace(mode="fp16", device=torch.device("cuda"))
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="repro.core.build"):
        fused = build.optimizer(compose_config(*tiny()), model, gpu_fp16)
    assert fused.defaults["fused"] is True and fused.defaults["foreach"] is None
    said = [r.getMessage() for r in caplog.records if r.name == "repro.core.build"]
    assert said == ["amp=fp16: SGD runs fused (optimizer.fused=false to turn off)"]
    caplog.clear()
    own = compose_config(*tiny("+optimizer.fused=false"))
    assert not build.optimizer(own, model, gpu_fp16).defaults["fused"]
    cpu = build.optimizer(compose_config(*tiny()), model, Precision("off", torch.device("cpu")))
    assert not cpu.defaults.get("fused")
    rprop = compose_config(*tiny())
    rprop.optimizer = {"_target_": "torch.optim.Rprop", "lr": 0.01}
    with caplog.at_level(logging.INFO, logger="repro.core.build"):
        build.optimizer(rprop, model, gpu_fp16)
    said = [r.getMessage() for r in caplog.records if r.name == "repro.core.build"]
    assert said == [
        "amp=fp16 with Rprop (no fused form): GradScaler reads its inf flag on the host every "
        "step, a wait for the GPU"
    ]
