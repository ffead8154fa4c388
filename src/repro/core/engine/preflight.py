"""Checks made before the first step, for mistakes that would otherwise end in a traceback
from `cross_entropy` halfway through a run, or train silently wrong.

None of them draws from a generator or changes the model, so a run's weights are the same
with or without them.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from repro.core import tasks
from repro.core.data.datasets import Splits
from repro.core.errors import UserError
from repro.core.tasks import SINGLE_LABEL, Task


def outputs_per_image(model: nn.Module, image_size: int) -> int | None:
    """The number of logits `model` gives for one RGB image; None if it does not give a
    (batch, classes) tensor. Runs on meta tensors (no memory, no arithmetic); a model that
    meta tensors cannot run goes through a copy of itself on the CPU instead."""
    was_training = model.training
    model.eval()  # dropout draws nothing, batch norm keeps its running statistics
    # A forward that draws anyway gives the generators back as they were.
    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            meta = {name: t.to("meta") for name, t in model.state_dict(keep_vars=True).items()}
            probe = torch.zeros(1, 3, image_size, image_size, device="meta")
            try:
                logits = functional_call(model, meta, (probe,))
            except Exception:  # an operation without a meta kernel, or one that reads values
                real = torch.zeros(1, 3, image_size, image_size)
                logits = copy.deepcopy(model).cpu()(real)
    finally:
        model.train(was_training)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        return None
    return int(logits.shape[1])


def check_classes(
    model: nn.Module, data: Splits, image_size: int, task: Task = SINGLE_LABEL
) -> None:
    """The model gives one output per class, and every target is one the objective's task takes
    (a label names one of the classes; a vector has one entry per class)."""
    classes = len(data.classes)
    tasks.check_targets(task, data)
    outputs = outputs_per_image(model, image_size)
    if outputs is not None and outputs != classes:
        raise UserError(
            f"the model gives {outputs} outputs per image but the data has {classes} classes: "
            f"make them equal (model.num_classes={classes}, or data.num_classes)"
        )
