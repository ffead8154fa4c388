"""The `data` group: a builder per option, and the template's three.

A `data` option names its builder by `_target_`: any callable `builder(data_cfg, seed) ->
Splits`, called with the option's config node and the run's root seed (use it only to hold out
a validation split, `carve_validation`: the images themselves should not depend on it). Each
split is a `Source` (repro.core.data.sources): anything with `__len__`, `__getitem__` giving (uint8
CHW image, int label) and `subset(indices)`; `TensorImages` and `ImageFiles` are two. Keys
of the option that the schema does not declare are the builder's own keyword arguments:

    def csv_images(cfg, seed: int, *, labels_file: str = "labels.csv") -> Splits: ...
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from repro.core.data import synthetic as shapes
from repro.core.data.cache import decode
from repro.core.data.sources import IMAGE_SUFFIXES, ImageFiles, Source, TensorImages, in_memory
from repro.core.errors import ConfigError, DataError
from repro.core.runtime.seeding import torch_generator
from repro.core.schema import DataConfig


@dataclass
class Splits:
    train: Source
    val: Source
    test: Source
    classes: list[str]
    resized: bool = False  # the images were resized already (a decoded cache holds them so)
    any_size: bool = False  # images come in any size (files): resized even if data.resize is null


def carve_validation(pool: Source, val_size: int, split_seed: int) -> tuple[Source, Source]:
    """Split a pool into train and validation with a generator seeded from the run's seed;
    with `val_size` 0, every image trains and the validation split is empty."""
    if not 0 <= val_size < len(pool):
        raise ConfigError("data.val_size", val_size, f"must be between 0 and {len(pool) - 1}")
    order = torch.randperm(len(pool), generator=torch_generator(split_seed, "split"))
    return pool.subset(order[val_size:].sort().values), pool.subset(order[:val_size].sort().values)


def synthetic(cfg: Any, split_seed: int) -> Splits:
    """Procedurally generated shapes (repro.core.data.synthetic)."""
    # The images are a fixed benchmark made from data.generator_seed; the run's seed only
    # chooses which of them are held out, as for any real dataset.
    classes = cfg.num_classes
    if classes is None or not 2 <= classes <= len(shapes.CLASSES):
        raise ConfigError("data.num_classes", classes, f"2..{len(shapes.CLASSES)} for synthetic")
    size = cfg.train_size + cfg.val_size
    pool = TensorImages(*shapes.generate(size, cfg.generator_seed, classes))
    test = TensorImages(*shapes.generate(cfg.test_size, cfg.generator_seed + 1_000_003, classes))
    train, val = carve_validation(pool, cfg.val_size, split_seed)
    return Splits(train, val, test, list(shapes.CLASSES[:classes]))


def cifar10(cfg: Any, split_seed: int) -> Splits:
    """CIFAR-10 through torchvision, from (or downloaded into) data.root."""
    from torchvision.datasets import CIFAR10

    root = folder(cfg, "the folder CIFAR-10 is in (or is downloaded into)")
    try:
        train = CIFAR10(str(root), train=True, download=cfg.download)
        test = CIFAR10(str(root), train=False, download=cfg.download)
    except (RuntimeError, OSError) as error:
        hint = "set data.download=true on a machine with internet" if not cfg.download else ""
        raise DataError(f"data.root={cfg.root}: CIFAR-10 unavailable ({error}) {hint}") from None

    def to_source(ds: Any) -> TensorImages:
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        return TensorImages(images, torch.tensor(ds.targets))

    fit, val = carve_validation(to_source(train), cfg.val_size, split_seed)
    return Splits(fit, val, to_source(test), list(train.classes))


def imagefolder(cfg: Any, split_seed: int) -> Splits:
    """train/ (and val/, test/ when present); without val/, data.val_size images of train/."""
    expected = "a folder holding train/ (and val/, test/), one subfolder per class"
    root = folder(cfg, expected)
    if not (root / "train").is_dir():
        raise DataError(f"data.root={cfg.root}: not found or incomplete; expected {expected}")
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if len(classes) < 2:
        raise DataError(f"data.root={cfg.root}: train/ has {len(classes)} class folders; need 2+")
    if cfg.num_classes is not None and cfg.num_classes != len(classes):
        allowed = f"{root / 'train'} has {len(classes)} classes (or null to infer)"
        raise ConfigError("data.num_classes", cfg.num_classes, allowed)

    def read(folder: Path) -> ImageFiles:
        missing = [c for c in classes if not (folder / c).is_dir()]
        if missing:
            raise DataError(f"{folder}: missing class folders {missing}")
        files = ImageFiles.from_folder(folder, classes)
        if len(files) == 0:
            raise DataError(f"{folder}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        return files

    train = read(root / "train")
    if (root / "val").is_dir():
        val = read(root / "val")
    else:
        train, val = carve_validation(train, cfg.val_size, split_seed)
    test = read(root / "test") if (root / "test").is_dir() else val
    return Splits(train, val, test, classes, any_size=True)


def folder(cfg: Any, expected: str) -> Path:
    """`data.root` as a path; one line if the option needs one and none is set."""
    if not cfg.get("root"):
        raise ConfigError("data.root", cfg.get("root"), f"a folder path: {expected}")
    return Path(cfg.root).expanduser()


def builder(cfg: Any) -> Callable[[Any, int], Splits]:
    """The callable `data._target_` names."""
    try:
        found = get_method(str(cfg._target_))
    except Exception as error:  # an unknown module or name: the user's to fix
        raise ConfigError("data._target_", cfg._target_, f"cannot import it: {error}") from None
    try:
        inspect.signature(found).bind_partial(cfg, 0)  # its own settings are checked apart
    except (TypeError, ValueError):  # ValueError: a builtin without a signature
        allowed = "a builder that takes (data config, seed) and returns Splits"
        raise ConfigError("data._target_", cfg._target_, allowed) from None
    return found


def _keep_fraction(source: Source, fraction: float, split_seed: int, split: str) -> Source:
    """A seeded subset of `fraction` of a split (at least one image), in the original order."""
    keep = max(1, round(len(source) * fraction))
    order = torch.randperm(len(source), generator=torch_generator(split_seed, f"fraction/{split}"))
    return source.subset(order[:keep].sort().values)


def build_splits(cfg: Any, split_seed: int, progress: str = "auto") -> Splits:
    """The splits `data._target_` builds, cut to `data.fraction` of every split, and decoded
    into memory with `data.cache=memory` (a progress bar as `logger.progress` says)."""
    build = builder(cfg)
    built = build(cfg, split_seed, **check_settings(build, cfg))
    if not isinstance(built, Splits):
        allowed = "a builder that returns repro.core.data.datasets.Splits"
        raise ConfigError(
            "data._target_", cfg._target_, f"returned {type(built).__name__}; use {allowed}"
        )
    splits = _keep_fractions(built, cfg, split_seed)
    if cfg.get("cache", "none") == "memory":  # absent from configs of older checkpoints
        return decode_splits(splits, cfg, progress)
    return splits


def _keep_fractions(splits: Splits, cfg: Any, split_seed: int) -> Splits:
    fraction = cfg.get("fraction", 1.0)  # absent from configs stored by older checkpoints
    if fraction >= 1:
        return splits
    train = _keep_fraction(splits.train, fraction, split_seed, "train")
    val = _keep_fraction(splits.val, fraction, split_seed, "val")
    # Without test/, ImageFolder evaluates on val/: keep the same images for both.
    same = splits.test is splits.val
    test = val if same else _keep_fraction(splits.test, fraction, split_seed, "test")
    return Splits(train, val, test, splits.classes, splits.resized, splits.any_size)


def decode_splits(splits: Splits, data_cfg: Any, progress: str = "auto") -> Splits:
    """Every split of `splits` not in memory (image files) decoded into it (a split used
    twice, once); `progress` shows a bar as `logger.progress` says."""
    decoded: dict[int, TensorImages] = {}
    for name in ("train", "val", "test"):
        source = getattr(splits, name)
        # An empty split (data.val_size=0) has nothing to decode and is never read.
        if in_memory(source) is None and id(source) not in decoded and len(source):
            decoded[id(source)] = decode(source, data_cfg, name, progress)
    if not decoded:
        return splits
    sources = {name: getattr(splits, name) for name in ("train", "val", "test")}
    chosen = {name: decoded.get(id(source), source) for name, source in sources.items()}
    images, labels = next(iter(decoded.values())).tensors()
    for name, source in chosen.items():  # in memory too, so the device loader takes the split
        if in_memory(source) is None and not len(source):
            chosen[name] = TensorImages(images[:0], labels[:0])
    return replace(splits, **chosen, resized=True)


# ---- a data option's own settings ----------------------------------------------------------
# The keys of `data` that the schema (`DataConfig`) does not declare, such as
# `labels_file: labels.csv`, go to the option's builder as keyword arguments, so its signature
# names and types them, and `check_settings` holds them against it before any data is read:
# a mistyped key, a wrong type or a missing setting is one line. The `data` node is left open
# for them, so composition does not type the declared keys either: `typed_data` does.

DECLARED = tuple(item.name for item in dataclasses.fields(DataConfig))


def typed_data(data: DictConfig) -> None:
    """Type the declared keys of `data` in place as DataConfig says; one line for a value
    that is missing or of the wrong type."""
    _refuse_missing(data)
    declared = {name: data[name] for name in DECLARED if name in data}
    try:
        checked = OmegaConf.merge(OmegaConf.structured(DataConfig), declared)
    except ValidationError as error:
        kind = DataConfig.__annotations__.get(str(error.key), "any")
        raise ConfigError(f"data.{error.key}", declared.get(error.key), _describe(kind)) from None
    for name in declared:  # "32" given for an int is 32 from here on
        data[name] = checked[name]


def _refuse_missing(data: DictConfig) -> None:
    """One line for a key of `data` left `???`; `in` and `items()` would skip or raise on it."""
    for name in data:
        if OmegaConf.is_missing(data, name):
            raise ConfigError(f"data.{name}", "???", "a value: the data option must set it")


def own_settings(data: DictConfig) -> dict[str, Any]:
    """The option's own settings, as plain Python values."""
    _refuse_missing(data)
    return {
        str(key): OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        for key, value in data.items()
        if key not in DECLARED
    }


def check_settings(builder: Callable[..., Any], data: DictConfig) -> dict[str, Any]:
    """The settings, once each is found to be an argument of `builder` (past its first two,
    the config and the seed) of the type it declares, and every argument it requires given."""
    target = data._target_
    parameters = list(inspect.signature(builder).parameters.values())[2:]
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    named = {
        p.name: p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    try:
        hints = typing.get_type_hints(builder)
    except Exception:  # an annotation that does not resolve types nothing
        hints = {}
    given = own_settings(data)
    for key, value in given.items():
        if key not in named and not open_ended:
            close = difflib.get_close_matches(key, [*named, *DECLARED], n=1)
            hint = f"; did you mean data.{close[0]}?" if close else ""
            takes = ", ".join(named) or "none"
            raise ConfigError(
                f"data.{key}", value, f"not a key of {target} (its own: {takes}){hint}"
            )
        if key in hints and not _fits(value, hints[key]):
            raise ConfigError(
                f"data.{key}", value, f"{_describe(hints[key])}, as {target} declares"
            )
    for name, parameter in named.items():
        if parameter.default is inspect.Parameter.empty and name not in given:
            raise ConfigError(f"data.{name}", None, f"a value: {target} requires it")
    return given


def settings_that_may_change(data: DictConfig) -> tuple[str, ...]:
    """`data.<key>` of the option's own settings that say where or how to read, not what (a
    cache folder, an endpoint): its builder lists them as `may_change`, and a resume takes
    other values for them."""
    try:
        named = getattr(builder(data), "may_change", ())
    except ConfigError:  # a builder that cannot be imported is reported where it is built
        return ()
    return tuple(f"data.{key}" for key in named if isinstance(key, str))


def _fits(value: Any, hint: Any) -> bool:
    """Whether a config value can be an argument annotated `hint` (simple types only; any
    other annotation is taken on trust)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        return numeric and (hint is float or isinstance(value, int))
    if hint in (str, Path):
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        return isinstance(value, list | tuple)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def _describe(hint: Any) -> str:
    """`a value of type int`, for an annotation or its text."""
    return f"a value of type {getattr(hint, '__name__', hint)}"
