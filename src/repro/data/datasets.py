"""Build the train, validation and test sources of the configured dataset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from repro.data import synthetic
from repro.data.cache import decode_splits
from repro.data.sources import IMAGE_SUFFIXES, ImageFiles, TensorImages
from repro.errors import ConfigError, DataError
from repro.runtime.seeding import torch_generator

Source = TensorImages | ImageFiles


@dataclass
class Splits:
    train: Source
    val: Source
    test: Source
    classes: list[str]
    resized: bool = False  # the images were resized already (a decoded cache holds them so)


def _carve_validation(pool: Source, val_size: int, split_seed: int) -> tuple[Source, Source]:
    """Split a pool into train and validation with a generator seeded from the run's seed."""
    if not 0 < val_size < len(pool):
        raise ConfigError("data.val_size", val_size, f"must be between 1 and {len(pool) - 1}")
    order = torch.randperm(len(pool), generator=torch_generator(split_seed, "split"))
    return pool.subset(order[val_size:].sort().values), pool.subset(order[:val_size].sort().values)


def _synthetic(cfg: Any, split_seed: int) -> Splits:
    # The images are a fixed benchmark made from data.generator_seed; the run's seed only
    # chooses which of them are held out, as for any real dataset.
    classes = cfg.num_classes
    if classes is None or not 2 <= classes <= len(synthetic.CLASSES):
        raise ConfigError("data.num_classes", classes, f"2..{len(synthetic.CLASSES)} for synthetic")
    size = cfg.train_size + cfg.val_size
    pool = TensorImages(*synthetic.generate(size, cfg.generator_seed, classes))
    test = TensorImages(*synthetic.generate(cfg.test_size, cfg.generator_seed + 1_000_003, classes))
    train, val = _carve_validation(pool, cfg.val_size, split_seed)
    return Splits(train, val, test, list(synthetic.CLASSES[:classes]))


def _cifar10(cfg: Any, split_seed: int) -> Splits:
    from torchvision.datasets import CIFAR10

    root = Path(cfg.root).expanduser()
    try:
        train = CIFAR10(str(root), train=True, download=cfg.download)
        test = CIFAR10(str(root), train=False, download=cfg.download)
    except (RuntimeError, OSError) as error:
        hint = "set data.download=true on a machine with internet" if not cfg.download else ""
        raise DataError(f"data.root={cfg.root}: CIFAR-10 unavailable ({error}) {hint}") from None

    def to_source(ds: Any) -> TensorImages:
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        return TensorImages(images, torch.tensor(ds.targets))

    fit, val = _carve_validation(to_source(train), cfg.val_size, split_seed)
    return Splits(fit, val, to_source(test), list(train.classes))


def _imagefolder(cfg: Any, split_seed: int) -> Splits:
    """train/ (and val/, test/ when present); without val/, data.val_size images of train/."""
    root = Path(cfg.root).expanduser()
    expected = "a folder holding train/ (and val/, test/), one subfolder per class"
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
        train, val = _carve_validation(train, cfg.val_size, split_seed)
    test = read(root / "test") if (root / "test").is_dir() else val
    return Splits(train, val, test, classes)


BUILDERS = {"synthetic": _synthetic, "cifar10": _cifar10, "imagefolder": _imagefolder}


def _keep_fraction(source: Source, fraction: float, split_seed: int, split: str) -> Source:
    """A seeded subset of `fraction` of a split (at least one image), in the original order."""
    keep = max(1, round(len(source) * fraction))
    order = torch.randperm(len(source), generator=torch_generator(split_seed, f"fraction/{split}"))
    return source.subset(order[:keep].sort().values)


def build_splits(cfg: Any, split_seed: int, progress: str = "auto") -> Splits:
    """The dataset named by `data.name`, cut to `data.fraction` of every split, and decoded
    into memory with `data.cache=memory` (a progress bar as `logger.progress` says)."""
    splits = _keep_fractions(BUILDERS[cfg.name](cfg, split_seed), cfg, split_seed)
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
    return Splits(train, val, test, splits.classes)
