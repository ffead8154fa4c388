"""Construction shared by the entry points: model, datasets, loaders, device batches, the
optimizer and its parameter groups (where a model's classifier head is, how deep each
parameter lies: the pretrained models and the fine-tuning component ask here too)."""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader

from repro.core.data import device_loader, transforms
from repro.core.data.datasets import Source, Splits, build_splits
from repro.core.data.loader import LoaderContext, eval_loader, train_loader
from repro.core.data.samplers import EpochBatches
from repro.core.errors import ConfigError, UserError
from repro.core.runtime import distributed
from repro.core.runtime.memory_format import FORMATS
from repro.core.runtime.precision import Precision
from repro.core.runtime.seeding import seeded, torch_generator
from repro.core.runtime.transfer import DeviceBatches, prefetched
from repro.core.schema import OptimizerExtras
from repro.core.tasks.objectives import Checked, Objective

log = logging.getLogger(__name__)


def model(cfg: Any, root_seed: int, num_classes: int | None = None) -> nn.Module:
    """Instantiate `cfg.model` with torch's generator seeded from the `model` stream.

    `num_classes` is the class count the data implies: a model whose config leaves its own to
    the data (`num_classes: null`, as `${data.num_classes}` is for an image folder) gets it as
    an argument. It is never written into the config, so a resume compares only what the user
    asked for.
    """
    implied = {}
    if num_classes is not None and cfg.model.get("num_classes", 0) is None:
        implied["num_classes"] = num_classes
    with seeded(root_seed, "model"):
        try:
            built = instantiate(cfg.model, **implied)
        except Exception as error:  # instantiate wraps import and argument errors alike
            if isinstance(error.__cause__, UserError):  # a builder's own one-line refusal
                raise error.__cause__ from None
            target = cfg.model.get("_target_")
            raise ConfigError("model._target_", target, f"could not build it: {error}") from None
    if not isinstance(built, nn.Module):
        raise ConfigError(
            "model._target_", cfg.model.get("_target_"), "must build a torch nn.Module"
        )
    return built


INTERPOLATIONS = ("bilinear", "bicubic")


def normalisation(cfg: Any, model: nn.Module | None = None) -> dict[str, Any]:
    """What the model's inputs are made with: mean, std, image size and the resize's
    interpolation. A pretrained model carries its own (`models/pretrained.py`, the user's
    overrides applied); what it leaves out comes from `data.*` (bilinear: the resize's)."""
    own = getattr(model, "pretrained_normalisation", None)
    own = own if isinstance(own, dict) else {}
    chosen = {
        "mean": [float(x) for x in own.get("mean", cfg.data.mean)],
        "std": [float(x) for x in own.get("std", cfg.data.std)],
        "image_size": int(own.get("image_size", cfg.data.image_size)),
        "interpolation": str(own.get("interpolation", "bilinear")),
    }
    if chosen["interpolation"] not in INTERPOLATIONS:
        allowed = " or ".join(INTERPOLATIONS)
        raise ConfigError("model.interpolation", chosen["interpolation"], allowed)
    if len(chosen["mean"]) != 3 or len(chosen["std"]) != 3 or min(chosen["std"]) <= 0:
        raise ConfigError("model.std", chosen["std"], "three positive numbers (and three means)")
    return chosen


def objective(cfg: Any) -> Objective:
    """Instantiate `cfg.objective`: what training minimises and evaluation reports (its first
    result is checked, so a wrong one fails in one line at the first step)."""
    target = str(cfg.objective.get("_target_"))
    try:
        built = instantiate(cfg.objective)
    except Exception as error:  # instantiate wraps import and argument errors alike
        raise ConfigError("objective._target_", target, f"could not build it: {error}") from None
    if not callable(built):
        raise ConfigError("objective._target_", target, "must build a callable (logits, targets)")
    return Checked(built, target)


def fit_to_data(model: nn.Module, cfg: Any, data: Splits, root_seed: int) -> None:
    """A model that starts from statistics of its training data (a `fit_to_data` method, as
    the whitening layer of `whitened_cnn` has) gets `fit_images` training images drawn at
    random by the run's seed (the first ones of a split ordered by class would be one or two
    classes), in stored order, through the evaluation transform (no augmentation) and
    normalised as batches are, on the CPU: the same on every rank, device and loader."""
    fit = getattr(model, "fit_to_data", None)
    if fit is None:
        return
    wanted = getattr(model, "fit_images", len(data.train))
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
        raise ConfigError("model.fit_images", wanted, "an integer >= 1")
    count = min(len(data.train), wanted)
    drawn = torch.randperm(len(data.train), generator=torch_generator(root_seed, "fit"))
    chosen = drawn[:count].sort().values.tolist()
    norm = normalisation(cfg, model)
    _, eval_transform = pipelines(cfg, resized=data.resized, any_size=data.any_size, norm=norm)
    images = torch.stack([eval_transform(data.train[index][0], None) for index in chosen])
    normalised, _ = device_batches(cfg, torch.device("cpu"), norm)(images, torch.zeros(count))
    fit(normalised)


def optimizer(cfg: Any, model: nn.Module, precision: Precision) -> torch.optim.Optimizer:
    """Instantiate `cfg.optimizer` over the model's parameters. With amp=fp16 on a GPU and
    `optimizer.fused` unset, the fused implementation where torch has one: GradScaler then
    finds infs inside the step, instead of reading a flag on the host (a wait for the GPU)
    every step."""
    settings = OmegaConf.to_container(cfg.optimizer, resolve=True)
    params: Any = _parameter_groups(model, settings)
    options: dict[str, Any] = {}
    wants_fused = precision.mode == "fp16" and precision.device.type == "cuda"
    if wants_fused and cfg.optimizer.get("fused") is None:
        target = get_class(cfg.optimizer._target_)
        if "fused" in inspect.signature(target).parameters:
            options = {"fused": True, "foreach": None}
            log.info("amp=fp16: %s runs fused (optimizer.fused=false to turn off)", target.__name__)
        else:
            log.warning(
                "amp=fp16 with %s (no fused form): GradScaler reads its inf flag on the host "
                "every step, a wait for the GPU",
                target.__name__,
            )
    # A partial, called here: Hydra would turn the groups' dicts of tensors into configs.
    try:
        return instantiate(settings, _partial_=True)(params, **options)
    except Exception as error:  # an unknown class, argument or value: the user's to fix
        target = settings.get("_target_")
        raise ConfigError("optimizer._target_", target, f"could not build it: {error}") from None


def splits(cfg: Any, root_seed: int) -> Splits:
    """The configured dataset's splits; what they imply (their classes) stays out of `cfg`."""
    progress = OmegaConf.select(cfg, "logger.progress", default="auto")
    return build_splits(cfg.data, root_seed, progress)


def pipelines(
    cfg: Any, resized: bool = False, any_size: bool = False, norm: dict[str, Any] | None = None
) -> tuple[transforms.Compose, transforms.Compose]:
    """The train and eval transforms; `resized`: the images were resized already (cached);
    `any_size`: they come in any size (image files), so even with `data.resize` null they
    are resized, to the image size: a batch needs one size. `norm` (`normalisation`) may set
    another image size than `data.image_size`: the resize keeps data's ratio to it."""
    data, norm = cfg.data, norm or normalisation(cfg)
    size, resize, pad = norm["image_size"], data.resize, data.crop_padding
    if resized and (size != data.image_size or norm["interpolation"] != "bilinear"):
        allowed = "none: the model's image size or interpolation is not data's (the cache's)"
        raise ConfigError("data.cache", "memory", allowed)
    if size != data.image_size:  # the model's own size: data's images are resized to it
        resize = size if resize is None else round(resize * size / data.image_size)
    if resize is None and any_size:
        resize = size
    augment = cfg.get("augment")  # absent from the configs of older checkpoints
    crop_flip = augment is None or bool(augment.crop_flip)
    cutout = augment.cutout if augment is not None else 0
    flip = augment.get("flip", "random") if augment is not None else "random"
    padding_mode = augment.get("crop_padding_mode", "zeros") if augment is not None else "zeros"
    extra = torchvision_transforms(augment.transforms) if augment is not None else []
    train = transforms.build(
        data.augment, size, resize, pad,
        crop_flip=crop_flip, flip=flip, padding_mode=padding_mode, cutout=cutout, extra=extra,
        resized=resized, interpolation=norm["interpolation"],
    )  # fmt: skip
    evaluation = transforms.build(
        False, size, resize, pad, resized=resized, interpolation=norm["interpolation"]
    )
    return train, evaluation


def _parameter_groups(model: nn.Module, settings: dict[str, Any]) -> list[Any]:
    """The trained parameters (a frozen one, such as a fixed whitening layer, needs no
    optimizer state), in one group, or two when the parameters of one dimension (biases and
    normalisation weights) get no weight decay (`decay_biases_and_norms=false`) or a scaled
    learning rate (`lr_scale_biases_and_norms`). Both keys are the template's: they are taken
    out of `settings` before the optimizer class sees them."""
    decay_all = settings.pop("decay_biases_and_norms", OptimizerExtras.decay_biases_and_norms)
    if not isinstance(decay_all, bool):
        raise ConfigError("optimizer.decay_biases_and_norms", decay_all, "true or false")
    scale = settings.pop("lr_scale_biases_and_norms", OptimizerExtras.lr_scale_biases_and_norms)
    if not isinstance(scale, int | float) or isinstance(scale, bool) or scale <= 0:
        raise ConfigError("optimizer.lr_scale_biases_and_norms", scale, "a number > 0")
    layer_decay = settings.pop("layer_decay", OptimizerExtras.layer_decay)
    head_lr = settings.pop("head_lr", OptimizerExtras.head_lr)
    trained = [p for p in model.parameters() if p.requires_grad]
    if layer_decay is not None or head_lr is not None:
        return _fine_tuning_groups(model, settings, layer_decay, head_lr, (decay_all, scale))
    if decay_all and scale == 1:
        return trained
    small: dict[str, Any] = {"params": [p for p in trained if p.ndim <= 1]}
    if scale != 1:
        if "lr" not in settings:
            raise ConfigError("optimizer.lr", None, "a number with lr_scale_biases_and_norms")
        # A larger step at the same decay per step: lr x weight_decay is kept.
        small["lr"] = settings["lr"] * scale
        small["weight_decay"] = _weight_decay(settings) / scale
    if not decay_all:
        small["weight_decay"] = 0.0
    return [{"params": [p for p in trained if p.ndim > 1]}, small]


def _fine_tuning_groups(
    model: nn.Module,
    settings: dict[str, Any],
    layer_decay: Any,
    head_lr: Any,
    small_rule: tuple[bool, float],
) -> list[dict[str, Any]]:
    """One group per (learning rate, weight decay): `lr x layer_decay ** (depth below the
    head)` (depths: `layer_ids`), the head at `head_lr` when given, and the rule
    for biases and norm weights on top (`small_rule`: decay them, their lr scale)."""
    if layer_decay is not None and (
        not isinstance(layer_decay, int | float) or not 0 < layer_decay <= 1
    ):
        raise ConfigError("optimizer.layer_decay", layer_decay, "null or a number in (0, 1]")
    if head_lr is not None and (not isinstance(head_lr, int | float) or head_lr <= 0):
        raise ConfigError("optimizer.head_lr", head_lr, "null or a number > 0")
    if "lr" not in settings:
        raise ConfigError("optimizer.lr", None, "a number with layer_decay or head_lr")
    depths, count = layer_ids(model)
    head, decay = head_name(model), _weight_decay(settings)
    (decay_small, scale), groups = small_rule, {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        lr = settings["lr"] * (layer_decay or 1.0) ** (count - 1 - depths[name])
        if head_lr is not None and in_head(name, head):
            lr = head_lr
        weight_decay = decay
        if parameter.ndim <= 1:
            lr, weight_decay = lr * scale, (decay / scale if decay_small else 0.0)
        groups.setdefault((lr, weight_decay), []).append(parameter)
    return [{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]


def head_name(model: nn.Module) -> str | None:
    """The classifier's module name: timm's `get_classifier()`, else the last nn.Linear."""
    modules = dict(model.named_modules())
    if hasattr(model, "get_classifier"):
        head = model.get_classifier()
        found = [name for name, module in modules.items() if module is head]
        if found:
            return found[0]
    linear = [name for name, module in modules.items() if isinstance(module, nn.Linear)]
    return linear[-1] if linear else None


def in_head(parameter_name: str, head: str | None) -> bool:
    return head is not None and (parameter_name.startswith(f"{head}.") or parameter_name == head)


def layer_ids(model: nn.Module) -> tuple[dict[str, int], int]:
    """Parameter name -> its depth (0 = the input's side) and the number of depths, the head
    the deepest: timm's own grouping where the model has one (`group_matcher`), else one depth
    per top-level child module holding parameters, in registration order (the model's own
    parameters, a class token or position embeddings, lie on the input's side: depth 0)."""
    head = head_name(model)
    names = [name for name, _ in model.named_parameters()]
    if hasattr(model, "group_matcher"):
        from timm.models import group_parameters

        ids = dict(group_parameters(model, model.group_matcher(coarse=False), reverse=True))
    else:
        children = [
            child
            for child, module in model.named_children()
            if next(module.parameters(), None) is not None
        ]
        top = {child: depth for depth, child in enumerate(children)}
        ids = {name: top.get(name.split(".")[0], 0) for name in names}
    deepest = max((ids[n] for n in names if n in ids and not in_head(n, head)), default=-1) + 1
    ids = {name: deepest if in_head(name, head) else ids.get(name, deepest) for name in names}
    return ids, deepest + 1


def _weight_decay(settings: dict[str, Any]) -> float:
    """The optimizer's weight decay: as configured, or its class's default."""
    if "weight_decay" in settings:
        return float(settings["weight_decay"])
    try:
        target = get_class(settings["_target_"])
    except Exception as error:  # a misspelt class: the user's to fix, in one line
        raise ConfigError(
            "optimizer._target_", settings["_target_"], f"cannot import it: {error}"
        ) from None
    default = inspect.signature(target).parameters.get("weight_decay")
    return float(default.default) if default is not None else 0.0


def torchvision_transforms(nodes: Any) -> list[Any]:
    """`augment.transforms`: each node instantiated by its `_target_`."""
    built = []
    for position, node in enumerate(nodes):
        key = f"augment.transforms[{position}]"
        if not isinstance(node, DictConfig) or "_target_" not in node:
            raise ConfigError(key, node, "a transform given by _target_ (and its arguments)")
        try:
            built.append(instantiate(node))
        except Exception as error:  # an unknown class or a wrong argument: the user's to fix
            raise ConfigError(key, node.get("_target_"), f"cannot build it: {error}") from None
    return built


def rank_batch_size(cfg: Any, world: int) -> int:
    """Images per step on one rank: trainer.batch_size, or its share with trainer.global_batch."""
    size = cfg.trainer.batch_size
    if not cfg.trainer.global_batch:
        return size
    if size % world:
        allowed = f"a multiple of the {world} ranks when trainer.global_batch=true"
        raise ConfigError("trainer.batch_size", size, allowed)
    return size // world


def loaders(
    cfg: Any, data: Splits, context: LoaderContext, norm: dict[str, Any] | None = None
) -> tuple[DataLoader, EpochBatches, DataLoader]:
    """Train loader, its sampler, validation loader; each yields (uint8 images, labels), or
    for CPU training with workers, training images already normalised (`device_batches`)."""
    norm = norm or normalisation(cfg)
    train_and_eval = pipelines(cfg, resized=data.resized, any_size=data.any_size, norm=norm)
    batch, dl, device = rank_batch_size(cfg, context.world), cfg.dataloader, context.device
    if dl.on_device:  # dataloader=device: the split lives on the device, batches made there
        return device_loader.loaders(cfg, data, train_and_eval, batch, context)  # type: ignore[return-value]
    if dl.num_workers and os.environ.get("TORCH_CUDA_SANITIZER") and device.type == "cuda":
        allowed = (
            "0 under TORCH_CUDA_SANITIZER (its checks run in every process, and a forked "
            "worker cannot use CUDA); or dataloader=device"
        )
        raise ConfigError("dataloader.num_workers", dl.num_workers, allowed)
    train_transform, eval_transform = train_and_eval
    prepare = device_batches(cfg, device, norm)
    in_workers = prepare if device.type == "cpu" else None  # a GPU normalises faster
    train, sampler = train_loader(data, train_transform, batch, dl, context, in_workers)
    if sampler.batches_per_epoch() == 0:
        allowed = f"at most the {len(data.train)} training images (over all ranks)"
        raise ConfigError("trainer.batch_size", cfg.trainer.batch_size, allowed)
    val = evaluation_loader(cfg, data.val, eval_transform, context, norm)
    return prefetched(train, prepare, context.pin_memory), sampler, val


def evaluation_loader(
    cfg: Any,
    source: Source,
    eval_transform: transforms.Compose,
    context: LoaderContext,
    norm: dict[str, Any] | None = None,
) -> Any:
    """A split in stored order, pass after pass, for evaluation (validation, or the test
    after training): made on the device with `dataloader=device`, else by a DataLoader whose
    batches a CUDA prefetcher copies ahead."""
    batch = cfg.trainer.eval_batch_size
    if cfg.dataloader.on_device:
        return device_loader.DeviceEvalLoader(source, eval_transform, batch, context)
    loader = eval_loader(source, eval_transform, batch, cfg.dataloader, context)
    return prefetched(loader, device_batches(cfg, context.device, norm), context.pin_memory)


def data_parallel(
    model: nn.Module, sync_batchnorm: bool, dist: distributed.Context, device: torch.device
) -> nn.Module:
    """The module the loop runs forward through: DDP under torchrun, the model itself otherwise."""
    if not dist.enabled:
        return model
    if sync_batchnorm and device.type != "cuda":
        allowed = "false on CPU: torch's SyncBatchNorm runs on GPUs only"
        raise ConfigError("trainer.sync_batchnorm", True, allowed)
    if sync_batchnorm:  # in place: the optimizer's parameters stay the same objects
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def device_batches(
    cfg: Any, device: torch.device, norm: dict[str, Any] | None = None
) -> DeviceBatches:
    """Copy and normalise batches on `device`. On a GPU, straight into the model's memory
    format: one pass, and the training thread has nothing left to convert. On a CPU, in NCHW
    (strided float writes measured slower there than normalising, then converting)."""
    layout = FORMATS[cfg.memory_format.name] if device.type == "cuda" else torch.contiguous_format
    norm = norm or normalisation(cfg)
    return DeviceBatches(device, norm["mean"], norm["std"], layout)
