"""Files someone else made are data, not code: what a stored config or record may decide.

A checkpoint's stored config and a run folder's resolved_config.yaml name `_target_`s that
Hydra would import and call. Before anything is built or imported from such a config, every
`_target_` in it must be one this checkout already trusts:

- named by a `_target_` key in a YAML file under this checkout's conf/ that git tracks (read
  with a YAML parser: a record a run writes, or a string inside a YAML, adds nothing), in
  the section it names it for (a model option's target builds a model, not a transform), or
  in conf/local/trusted.yaml, this machine's own list (git ignores conf/local/), anywhere;
- a model defined in this package's `models/`;
- a torchvision model builder (`torchvision.models.resnet50`) or transform class;
- a torch optimizer or learning-rate scheduler class.

Anything else is refused in one line unless the user says `trust=true`. So is a value that
OmegaConf would interpolate (`${...}`, anywhere in a string): a resolver runs code of its own,
and a recorded config holds resolved values only. `as_data` then drops what a stored config
may not decide on this machine (trackers, downloads, callbacks).

The overrides a sweep or run folder recorded are checked the same way by
`repro.resume.overrides`, before `repro.resume` or the Optuna sweeper relaunch them.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from repro.errors import UserError

PACKAGE = __name__.split(".")[0]
# The engine's config groups ship inside the package (the checkout's top-level conf/ is a link
# to them), so an engine installed from a wheel reads the same files it was built with.
CONF = Path(__file__).resolve().parents[1] / "conf"  # src/repro/runs/ -> src/repro/conf
LOCAL_LIST = Path("local") / "trusted.yaml"  # under conf/
HOW_TO_TRUST = (
    "if you trust whoever made this file, add trust=true; or name the target in a YAML file "
    "that git tracks under conf/, or in this machine's own list, conf/local/trusted.yaml (a "
    "line `- _target_: NAME`)"
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
            place = _section(key)
            if not isinstance(value, str) or not trusted(value, place):
                raise UntrustedConfigError(
                    f"{source}: {key}={value!r} is not a target this checkout trusts there (no "
                    "YAML of conf/ names it, and it is no model of this project or torchvision "
                    "under model, torchvision transform under augment, torch optimizer or "
                    f"scheduler under optimizer or scheduler); building it could run any code: "
                    f"{HOW_TO_TRUST}"
                )
        elif isinstance(value, str) and interpolates(value):
            raise UntrustedConfigError(
                f"{source}: {key}={value!r} is an interpolation, which a recorded config never "
                f"holds and whose resolver would run: {HOW_TO_TRUST}"
            )


def as_data(config: Any, source: object, trust: bool = False) -> dict[str, Any]:
    """A stored config, checked (`check`), as a tool may rebuild a run from it: the values
    that decide results are the file's; what acts on this machine beyond the tool's own
    output is this checkout's default: no callbacks, no tracker, no download."""
    if not isinstance(config, dict):
        raise UntrustedConfigError(f"{source}: holds no config (a mapping of keys to values)")
    stored = copy.deepcopy(watched_only(config))
    check(stored, source, trust)
    # Sections are mappings of settings (the preset, a name): anything else is no config of ours.
    misshapen = [k for k, v in stored.items() if not isinstance(v, dict) and k != "preset"]
    if misshapen:  # one line here, not a traceback where it is first used
        raise UntrustedConfigError(
            f"{source}: not a config of this template ({', '.join(map(str, misshapen))}: not "
            "a mapping of settings)"
        )
    if isinstance(stored.get("data"), dict):
        stored["data"]["download"] = False
    if isinstance(stored.get("logger"), dict):
        stored["logger"].update(mlflow=None, wandb=None)
    return stored


def watched_only(config: dict[str, Any]) -> dict[str, Any]:
    """A stored config without its callbacks: what evaluating, predicting or re-training
    (verify) a recorded run builds."""
    return {key: value for key, value in config.items() if key != "callbacks"}


def trusted(target: str, place: str | None = None) -> bool:
    """Whether `target` is one this checkout trusts (see the module's docstring) at `place`,
    the top-level section it is built in (None: anywhere its kind belongs). A kind is
    trusted only where the template builds that kind: a model builder in `augment` would
    still fetch its weights."""
    places = conf_targets().get(target, frozenset())
    if None in places or (place is None and places) or place in places:
        return True
    module, _, name = target.rpartition(".")
    if not module or not name.isidentifier():
        return False
    if module == f"{PACKAGE}.models" or module.startswith(f"{PACKAGE}.models."):
        return place in (None, "model") and _defined_in_models(module, name)
    if module == "torchvision.models":
        import torchvision.models

        return place in (None, "model") and name in torchvision.models.list_models()
    if module in ("torchvision.transforms", "torchvision.transforms.v2"):
        transform = _class_of(importlib.import_module(module), name, "torchvision.transforms")
        return place in (None, "augment") and transform
    if module == "torch.optim" and place in (None, "optimizer"):
        import torch

        found = getattr(torch.optim, name, None)
        return isinstance(found, type) and issubclass(found, torch.optim.Optimizer)
    if module == "torch.optim.lr_scheduler" and place in (None, "scheduler"):
        import torch

        found = getattr(torch.optim.lr_scheduler, name, None)
        return isinstance(found, type) and issubclass(found, torch.optim.lr_scheduler.LRScheduler)
    return False


@functools.cache
def conf_targets() -> dict[str, frozenset[str | None]]:
    """Every `_target_` key's value in the YAML files of conf/ that git tracks (all of conf/
    but conf/local/ where git tracks none of it: an installed engine), with the sections it
    is built in: its group's (conf/model/x.yaml: `model`), or its top-level key in a
    `_global_` file; a target of conf/local/trusted.yaml, anywhere (None)."""
    found: dict[str, set[str | None]] = {}
    for path in [*_tracked_yaml(CONF), CONF / LOCAL_LIST]:
        try:
            text = path.read_text()
            parsed = yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not ours to judge here: Hydra says what is wrong with a broken option
        relative = path.relative_to(CONF)
        anywhere = relative == LOCAL_LIST
        group = (
            None if len(relative.parts) == 1 or "@package _global_" in text else relative.parts[0]
        )
        for key, value in _leaves(parsed):
            if (key == "_target_" or key.endswith("._target_")) and isinstance(value, str):
                place = None if anywhere else group or _section(key)
                found.setdefault(value, set()).add(place)
    return {target: frozenset(places) for target, places in found.items()}


def _section(key: str) -> str:
    """The top-level section of a dotted key: `augment.transforms[0]._target_` -> augment."""
    return key.split(".", 1)[0].split("[", 1)[0]


def _tracked_yaml(conf: Path) -> list[Path]:
    """conf/'s YAML files that git tracks: a file a run could write there is never one."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(conf), "ls-files", "-z", "--", "."],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no git, or not a git checkout
        listed = ""
    tracked = [conf / name for name in listed.split("\0") if name.endswith(".yaml")]
    if tracked:
        return tracked
    # Nothing tracked: no checkout's conf/ but an installed engine's (in a project's .venv,
    # which its git ignores), whose files are the wheel's: all of them but local/.
    return sorted(p for p in conf.rglob("*.yaml") if (conf / "local") not in p.parents)


def interpolates(value: str) -> bool:
    """Whether OmegaConf would resolve something in `value` (`${` anywhere in it)."""
    return "${" in value


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
