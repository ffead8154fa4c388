"""Configs from files someone else made are data, not code.

A checkpoint's stored config and a run folder's resolved_config.yaml name `_target_`s that
Hydra would import and call. Before anything is built or imported from such a config, every
`_target_` in it must be one this checkout already trusts:

- named by a `_target_` in a YAML file under this checkout's conf/ (conf/local/, which git
  ignores, included: the place for this machine's own list);
- a model defined in this package's `models/`;
- a torchvision model builder (`torchvision.models.resnet50`) or transform class;
- a torch optimizer or learning-rate scheduler class.

Anything else is refused in one line unless the user says `trust=true`. So is a value that
OmegaConf would interpolate (`${...}`): a resolver runs code of its own, and a recorded config
holds resolved values only.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from repro.errors import UserError

PACKAGE = __name__.split(".")[0]
CONF = Path(__file__).resolve().parents[3] / "conf"  # src/repro/runs/ -> the checkout
_TARGET_LINE = re.compile(r"^\s*(?:-\s*)?_target_:\s*([\w.]+)", re.MULTILINE)
HOW_TO_TRUST = (
    "if you trust whoever made this file, add trust=true; or name the target in a YAML file "
    "under conf/ (conf/local/, kept on this machine, e.g. a line `- _target_: NAME` in "
    "conf/local/trusted.yaml)"
)


class UntrustedConfigError(UserError):
    """A config from a file names something this checkout does not trust to build."""


def check(config: Any, source: object, trust: bool = False) -> None:
    """Refuse `config` (plain containers, as stored) before anything is built from it, unless
    it names only trusted targets and holds no interpolation; `trust` skips the check. Its
    `callbacks` are not looked at: nothing rebuilds a stored config's callbacks (`watched_only`
    drops them), since they only watched the run."""
    if trust is True:
        return
    if trust is not False:
        raise UserError(f"trust={trust!r} is not allowed: true or false")
    for key, value in _leaves(watched_only(config)):
        if key == "_target_" or key.endswith("._target_"):
            if not isinstance(value, str) or not trusted(value):
                raise UntrustedConfigError(
                    f"{source}: {key}={value!r} is not a target this checkout trusts (no YAML "
                    "under conf/ names it, and it is no model of this project or torchvision, "
                    f"torchvision transform or torch optimizer or scheduler); building it could "
                    f"run any code: {HOW_TO_TRUST}"
                )
        elif isinstance(value, str) and "${" in value:
            raise UntrustedConfigError(
                f"{source}: {key}={value!r} is an interpolation, which a recorded config never "
                f"holds and whose resolver would run: {HOW_TO_TRUST}"
            )


def watched_only(config: dict[str, Any]) -> dict[str, Any]:
    """A stored config without its callbacks: what evaluating, predicting or re-training
    (verify) a recorded run builds."""
    return {key: value for key, value in config.items() if key != "callbacks"}


def trusted(target: str) -> bool:
    """Whether `target` is one this checkout trusts (see the module's docstring)."""
    if target in conf_targets():
        return True
    module, _, name = target.rpartition(".")
    if not module or not name.isidentifier():
        return False
    if module == f"{PACKAGE}.models" or module.startswith(f"{PACKAGE}.models."):
        return _defined_in_models(module, name)
    if module == "torchvision.models":
        import torchvision.models

        return name in torchvision.models.list_models()
    if module in ("torchvision.transforms", "torchvision.transforms.v2"):
        return _class_of(importlib.import_module(module), name, "torchvision.transforms")
    if module == "torch.optim":
        import torch

        found = getattr(torch.optim, name, None)
        return isinstance(found, type) and issubclass(found, torch.optim.Optimizer)
    if module == "torch.optim.lr_scheduler":
        import torch

        found = getattr(torch.optim.lr_scheduler, name, None)
        return isinstance(found, type) and issubclass(found, torch.optim.lr_scheduler.LRScheduler)
    return False


@functools.cache
def conf_targets() -> frozenset[str]:
    """Every `_target_` that a YAML file under conf/ names."""
    found: set[str] = set()
    for path in CONF.rglob("*.yaml"):
        found.update(_TARGET_LINE.findall(path.read_text(errors="replace")))
    return frozenset(found)


def _defined_in_models(module: str, name: str) -> bool:
    """A class or function defined in one of this package's model modules (not a name one of
    them imports: `models.small_cnn.torch.save` is torch's)."""
    try:  # only this package's own modules are imported here
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):  # a name inside a module, not a module
        return False
    found = getattr(importlib.import_module(module), name, None)
    return callable(found) and getattr(found, "__module__", None) == module


def _class_of(module: Any, name: str, prefix: str) -> bool:
    found = getattr(module, name, None)
    return isinstance(found, type) and found.__module__.startswith(prefix)


def _leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value inside nested dicts and lists."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{key}[{index}]")
    else:
        yield key, value
