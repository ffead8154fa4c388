"""Pretrained backbones from the libraries made for them: `model=timm`, `model=torchvision_weights`.

    python -m repro.train model=timm model.name=resnet18 model.pretrained=weights.safetensors

Each builder returns the library's model with its weights (timm: its hub or cache, or a local
file read without running code; torchvision: a `weights` enum name, through torchvision's cache
under TORCH_HOME). A class count other than the pretrained head's replaces the head (drawn from
the run's `model` stream, as every model's weights are) and says so in one log line.

The model carries what its weights were trained with as `pretrained_normalisation` (mean, std,
image size, interpolation, from the library's data config), each value overridden by the
builder's argument of that name; `repro.core.build.normalisation` completes it from `data.*`, and the
pipelines use it.
It is never written into the config: a run records it in summary.json and every checkpoint.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repro.core.build import head_name
from repro.core.errors import ConfigError
from repro.core.guards import received

log = logging.getLogger(__name__)

WEIGHT_FILES = (".safetensors", ".pth", ".pt", ".bin")
# timm arguments that say where weights come from or where downloads go: a config (perhaps
# one stored in a file from someone else) names weights by `pretrained` alone, so their source
# is timm's own registry or a local file, never a URL or folder of the config's choosing.
WEIGHT_SOURCES = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "checkpoint_path")
WEIGHTS_FROM = (
    "not set: weights come from model.pretrained (true: timm's registry; or a local file)"
)


def timm_model(
    name: str,
    pretrained: bool | str = False,
    num_classes: int | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
    image_size: int | None = None,
    interpolation: str | None = None,
    **kwargs: Any,
) -> nn.Module:
    """`timm.create_model(name, **kwargs)`; `pretrained`: false, true (timm's hub or cache) or
    the path of a weights file. Extra arguments go to timm."""
    import timm
    from timm.data import resolve_model_data_config

    if not isinstance(name, str) or not timm.is_model(name):
        raise ConfigError("model.name", name, "a timm model name (timm.list_models() lists them)")
    for key in WEIGHT_SOURCES:
        if key in kwargs:
            raise ConfigError(f"model.{key}", kwargs[key], WEIGHTS_FROM)
    if pretrained is True:
        model = timm.create_model(name, pretrained=True, **kwargs)
    elif pretrained is False or pretrained is None:
        model = timm.create_model(name, **_classes(num_classes), **kwargs)
    else:
        weights = read_weights(pretrained, "model.pretrained")
        model = timm.create_model(name, **kwargs)
        _load_backbone(model, weights, "model.pretrained", pretrained)
    if num_classes is not None and num_classes != model.num_classes:
        old = model.num_classes
        model.reset_classifier(num_classes)
        log.info("model: %s's head replaced: %d -> %d outputs", name, old, num_classes)
    own = resolve_model_data_config(model) if pretrained not in (False, None) else {}
    side = (own.get("input_size") or [None])[-1]
    weights_own = (own.get("mean"), own.get("std"), side, own.get("interpolation"))
    model.pretrained_normalisation = _overridden(*weights_own, mean, std, image_size, interpolation)
    return model


def torchvision_model(
    name: str,
    weights: str | None = None,
    num_classes: int | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
    image_size: int | None = None,
    interpolation: str | None = None,
    **kwargs: Any,
) -> nn.Module:
    """`torchvision.models.get_model(name)` with `weights` (an enum name: DEFAULT,
    IMAGENET1K_V1, ResNet18_Weights.IMAGENET1K_V1) read from torchvision's cache, downloaded
    there only if missing, and loaded with `weights_only=True`."""
    from torchvision import models

    try:
        builder = models.get_model_builder(name)
    except (ValueError, TypeError):
        raise ConfigError(
            "model.name", name, "a torchvision model (models.list_models())"
        ) from None
    if weights is None:
        model = builder(**_classes(num_classes), **kwargs)
        model.pretrained_normalisation = _overridden(
            None, None, None, None, mean, std, image_size, interpolation
        )
        return model
    enum = models.get_model_weights(name)
    try:
        chosen = enum.verify(weights)
    except (ValueError, KeyError):
        allowed = f"DEFAULT or one of {', '.join(member.name for member in enum)}"
        raise ConfigError("model.weights", weights, allowed) from None
    model = builder(num_classes=len(chosen.meta["categories"]), **kwargs)
    state = chosen.get_state_dict(progress=False, check_hash=True, weights_only=True)
    model.load_state_dict(state)
    if num_classes is not None and num_classes != len(chosen.meta["categories"]):
        _replace_last_linear(model, num_classes, name)
    preset = chosen.transforms()
    own = (list(preset.mean), list(preset.std), preset.crop_size[0], preset.interpolation.value)
    model.pretrained_normalisation = _overridden(*own, mean, std, image_size, interpolation)
    return model


def read_weights(path: str | os.PathLike, key: str) -> dict[str, torch.Tensor]:
    """A state dict from a .safetensors file or a torch.save file (tensors only: read with
    `weights_only=True`, so a file holding code is refused)."""
    file = Path(str(path)).expanduser()
    allowed = (
        "true, false or the path of a weights file: a state_dict saved by torch.save "
        f"({', '.join(WEIGHT_FILES[1:])}) or a {WEIGHT_FILES[0]} file"
    )
    if not file.is_file():
        raise ConfigError(key, str(path), f"{allowed}; no such file")
    safetensors = file.suffix == ".safetensors"
    try:
        if safetensors:
            from safetensors.torch import load_file

            state: Any = load_file(str(file))
        else:
            state = received.load_checkpoint(file)
    except received.ReceivedFileError as error:
        raise ConfigError(key, str(path), f"{allowed}; {error}") from None
    except Exception:  # not the reader's words: torch's run to a paragraph asking for an issue
        reader = "safetensors" if safetensors else "torch.load"
        raise ConfigError(key, str(path), f"{allowed}; {reader} cannot read this file") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a whole training checkpoint
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ConfigError(key, str(path), f"{allowed}; it holds no state_dict")
    return state


def _classes(num_classes: int | None) -> dict[str, int]:
    return {} if num_classes is None else {"num_classes": num_classes}


def _load_backbone(model: nn.Module, weights: dict[str, torch.Tensor], key: str, path: Any) -> None:
    """Load `weights` into `model`, its head first resized to the file's (the caller then
    replaces it for the run's classes). A missing or mismatched tensor is the user's error."""
    head = head_name(model)
    outputs = weights.get(f"{head}.weight") if head else None
    if outputs is not None and hasattr(model, "reset_classifier"):
        model.reset_classifier(len(outputs))  # the file's classes, until the caller's replace
    own = model.state_dict()
    wrong = sorted(n for n in own if n not in weights or weights[n].shape != own[n].shape)
    if wrong:
        allowed = (
            f"weights of this architecture; missing or of another shape: {', '.join(wrong[:3])}"
        )
        raise ConfigError(key, str(path), allowed)
    model.load_state_dict({name: weights[name] for name in own})


def _replace_last_linear(model: nn.Module, num_classes: int, name: str) -> None:
    """A new classifier for `num_classes`: the last nn.Linear, replaced where it sits."""
    head = head_name(model)
    if head is None:
        raise ConfigError("model.name", name, "a model whose classifier is an nn.Linear")
    parent, _, attribute = head.rpartition(".")
    old = model.get_submodule(head)
    owner = model.get_submodule(parent) if parent else model
    setattr(owner, attribute, nn.Linear(old.in_features, num_classes, bias=old.bias is not None))
    log.info("model: %s's head replaced: %d -> %d outputs", name, old.out_features, num_classes)


def _overridden(*values: Any) -> dict[str, Any]:
    """The weights' own (mean, std, image size, interpolation), each replaced by an argument
    given; what is still None is left to `data.*`."""
    own, given = values[:4], values[4:]
    keys = ("mean", "std", "image_size", "interpolation")
    chosen = {key: g if g is not None else o for key, o, g in zip(keys, own, given, strict=True)}
    return {key: value for key, value in chosen.items() if value is not None}
