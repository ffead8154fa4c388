"""What a task allows, checked before the first step: the config's metrics, callbacks, mixing
and selection (before any data loads), then every split's targets."""

from __future__ import annotations

from typing import Any

import torch

from repro.core.data.sources import stack_targets
from repro.core.errors import ConfigError, DataError
from repro.core.tasks.task import Task, of, target_of

# Fewer validation images than this cannot tell steps apart: one image is more than 3% of the
# accuracy, so `trainer.test_weights=best` and early stopping would pick noise.
MIN_VAL_TO_SELECT = 30


def check_config(cfg: Any) -> None:
    """Before any data loads: metrics and callbacks that need one class per image refused for a
    multi-label objective, and selection refused where there is no validation split."""
    objective = target_of(cfg.objective)
    task = of(objective)
    augment = cfg.get("augment") or {}
    mixing = [key for key in ("mixup_alpha", "cutmix_alpha") if augment.get(key)]
    if mixing and not task.single_label and not getattr(objective, "mixes", False):
        allowed = (
            f"0: a {task.name} objective must say that blending its targets means something "
            "(mixes = True, as multilabel_bce does)"
        )
        raise ConfigError(f"augment.{mixing[0]}", augment[mixing[0]], allowed)
    if not task.single_label:
        for group in ("metrics", "callbacks"):
            for name, node in (cfg.get(group) or {}).items():
                if node is not None and _needs_single_label(node):
                    allowed = f"a {task.name} objective has no single class per image to score"
                    raise ConfigError(f"{group}.{name}", node.get("_target_"), allowed)
    if cfg.data.get("val_size") == 0:
        check_selection(cfg, 0)


def _needs_single_label(node: Any) -> bool:
    """A torchmetrics multiclass metric, or a class that says `needs_single_label = True`."""
    if str(node.get("_target_")).rsplit(".", 1)[-1].startswith("Multiclass"):
        return True
    return bool(getattr(target_of(node), "needs_single_label", False))


def check_selection(cfg: Any, val_images: int) -> None:
    """What picks weights or stops a run from the validation split needs one big enough:
    with none, `trainer.test_weights=best`, a named monitor and `trainer.patience` are
    refused; with fewer than MIN_VAL_TO_SELECT images, `best` and `patience` are."""
    trainer = cfg.trainer
    choose = "trainer.test_weights=last (or ema with +components=ema)"
    if val_images == 0:
        why = "data.val_size=0 leaves no validation split"
        if trainer.test_after_fit and trainer.test_weights == "best":
            raise ConfigError("trainer.test_weights", "best", f"{choose}: {why}")
        if trainer.patience is not None:
            raise ConfigError("trainer.patience", trainer.patience, f"null: {why}")
        if str(trainer.monitor) != "auto":
            allowed = f"auto (nothing is monitored): {why}; test with {choose}"
            raise ConfigError("trainer.monitor", trainer.monitor, allowed)
        return
    if val_images >= MIN_VAL_TO_SELECT:
        return
    why = (
        f"the validation split has {val_images} images, too few to tell steps apart (one "
        f"image is over 3% of the accuracy; at least {MIN_VAL_TO_SELECT} are needed to select)"
    )
    selecting = trainer.save_checkpoints and trainer.test_after_fit
    if selecting and trainer.test_weights == "best":
        raise ConfigError(
            "trainer.test_weights", "best", f"{choose}, or raise data.val_size: {why}"
        )
    if trainer.patience is not None:
        raise ConfigError("trainer.patience", trainer.patience, f"null, or more images: {why}")


def check_targets(task: Task, splits: Any) -> None:
    """Every split's targets fit the task and the class count, before the first batch:
    checked whole where a split keeps its labels (in memory, or a list), else on its first
    item; one line naming the split and the item."""
    classes = len(splits.classes)
    for split in ("train", "val", "test"):
        source = getattr(splits, split)
        if len(source) == 0:
            continue
        held = getattr(source, "labels", None)
        if not isinstance(held, torch.Tensor | list):  # a source that keeps no list: its first
            held = [source[0][1]]
        item = _first_wrong(task, held, classes)
        if item is not None:
            problem = task.check_target(held[item], classes)
            raise DataError(f"the {split} split's item {item} has {problem}")


def _first_wrong(task: Task, held: torch.Tensor | list[Any], classes: int) -> int | None:
    """The first item whose target the task refuses, looked for a whole tensor at a time where
    the targets stack into one."""
    try:
        targets = stack_targets(held)
    except (RuntimeError, TypeError, ValueError):  # rows of other sizes: one at a time
        return next((i for i, t in enumerate(held) if task.check_target(t, classes)), None)
    if targets.dim() == 1 and not targets.is_floating_point() and task.single_label:
        bad = (targets < 0) | (targets >= classes)
    elif targets.dim() == 2 and task.check_target(targets[0], classes) is None:
        values = targets.double()
        bad = ((values < 0) | (values > 1)).any(1)
        if task.single_label:
            bad |= (values.sum(1) - 1).abs() > 1e-3
    else:
        return 0 if task.check_target(targets[0], classes) is not None else None
    found = torch.nonzero(bad).flatten()
    return int(found[0]) if len(found) else None
