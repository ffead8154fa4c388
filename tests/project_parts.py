"""What a user adds to a generated project, as file texts: the parts the test kit must pass
(a multi-label dataset with its objective, a metric and a callback, and SAM as an objective)
and two that break a promise (a draw in __getitem__, a call count in an objective)."""

# A multi-label dataset, the metric and callback written for it, and SAM: all keep the promises.
CROSSINGS = '''"""Crossed stripes: each image sums the stripes of one to three angles; its target is the
multi-hot row of the angles it shows (a multi-label dataset, drawn from a fixed seed)."""

from __future__ import annotations

import math
from typing import Any

import torch
from repro.api import Splits, TensorImages, carve_validation


def crossings(cfg: Any, seed: int, *, noise: float = 0.1) -> Splits:
    def split(size: int, offset: int) -> TensorImages:
        generator = torch.Generator().manual_seed(cfg.generator_seed + offset)
        targets = (torch.rand(size, cfg.num_classes, generator=generator) < 0.3).float()
        targets[targets.sum(1) == 0, 0] = 1.0  # every image shows at least one angle
        angles = torch.arange(cfg.num_classes) * (math.pi / 2) / max(cfg.num_classes - 1, 1)
        axis = torch.arange(cfg.image_size, dtype=torch.float32)
        y, x = torch.meshgrid(axis, axis, indexing="ij")
        along = x * angles.cos()[:, None, None] + y * angles.sin()[:, None, None]  # [C, H, W]
        phase = torch.rand(size, cfg.num_classes, generator=generator) * 2 * math.pi
        waves = (0.8 * along[None] + phase[:, :, None, None]).sin() * targets[:, :, None, None]
        wave = waves.sum(1) / targets.sum(1)[:, None, None]
        wave = wave + noise * torch.randn(wave.shape, generator=generator)
        gray = ((wave.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return TensorImages(gray[:, None].expand(-1, 3, -1, -1).contiguous(), targets)

    train, val = carve_validation(split(cfg.train_size + cfg.val_size, 0), cfg.val_size, seed)
    classes = [f"{90 * k // max(cfg.num_classes - 1, 1)}deg" for k in range(cfg.num_classes)]
    return Splits(train, val, split(cfg.test_size, 1), classes)
'''

RECALL = '''"""A metric of multi-label predictions: the share of true labels the model finds."""

from __future__ import annotations

import torch
from torchmetrics import Metric


class LabelRecall(Metric):
    def __init__(self, num_classes: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("found", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("present", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        present = targets > 0.5
        self.found += (present & (logits > 0)).sum()
        self.present += present.sum()

    def compute(self) -> torch.Tensor:
        return self.found.double() / self.present.clamp(min=1)
'''

SAM = '''"""Sharpness-aware minimisation as an objective: the loss at weights pushed a step `rho` up
the gradient (the step itself held fixed), so the trainer's backward gives SAM's gradient."""

from __future__ import annotations

import torch
from repro.api import Batch, CrossEntropy, Targets
from torch.func import functional_call


class SharpnessAware(CrossEntropy):
    def __init__(self, rho: float = 0.05) -> None:
        super().__init__(0.0)
        self.rho = rho

    def __call__(
        self, logits: torch.Tensor, targets: Targets, batch: Batch
    ) -> dict[str, torch.Tensor]:
        clean = super().__call__(logits, targets)["loss"]
        if not batch.training:
            return {"loss": clean}
        named = {n: p for n, p in batch.model.named_parameters() if p.requires_grad}
        grads = torch.autograd.grad(clean.mean(), list(named.values()), retain_graph=True)
        norm = torch.sqrt(sum((g * g).sum() for g in grads)) + 1e-12
        pushed = {n: p + self.rho * g / norm for (n, p), g in zip(named.items(), grads, strict=True)}
        sharp = super().__call__(functional_call(batch.model, pushed, (batch.images,)), targets)
        return {"loss": sharp["loss"], "clean": clean.detach()}
'''

LABEL_LOG = '''"""A callback for multi-label runs: how often each label is predicted, at every evaluation."""

from __future__ import annotations

from typing import Any

from repro.api import write_json_atomic


class LabelLog:
    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def after_evaluation(self, loop: Any, row: dict, predictions: Any) -> None:
        predicted = predictions.outputs().predicted  # every rank takes part
        self.counts[str(loop.state.position.step)] = predicted.sum(0).int().tolist()
        if loop.dist.is_main:
            write_json_atomic(loop.run_dir / "label_counts.json", self.counts)

    def state_dict(self) -> dict:
        return {"counts": self.counts}

    def load_state_dict(self, state: dict) -> None:
        self.counts = state["counts"]
'''

# How the user's conf/ names them: the experiment pairs the dataset with its objective, metric
# and callback, so the kit checks each of them together.
CONF = {
    "data/crossings.yaml": None,  # the project's stripes.yaml, with the builder replaced
    "objective/bce.yaml": "_target_: {engine}.extras.multilabel.objective.MultilabelBCE\n",
    "objective/sam.yaml": "_target_: {name}.sam.SharpnessAware\nrho: 0.05\n",
    "metrics/label_recall.yaml": "label_recall:\n  _target_: {name}.recall.LabelRecall\n",
    "callbacks/label_log.yaml": "label_log:\n  _target_: {name}.label_log.LabelLog\n",
    "experiment/crossings.yaml": """# @package _global_
defaults:
  - /callbacks: label_log
  - override /data: crossings
  - override /objective: bce
  - override /metrics: [label_recall]

callbacks:
  confusion: null
""",
}
SOURCES = {"crossings": CROSSINGS, "recall": RECALL, "sam": SAM, "label_log": LABEL_LOG}


# Two datasets a user might add: `steady` draws each item's shift from a generator seeded by its
# index (allowed), `jitter` from torch's global generator in __getitem__ (the promise broken).
ADDED_DATASETS = '''"""Stripes shifted per item: once as the promise allows, once as it does not."""

from __future__ import annotations

from typing import Any

import torch
from repro.api import Splits

from {name}.stripes import stripes


class Shifted:
    def __init__(self, source: Any, global_draw: bool) -> None:
        self.source, self.global_draw = source, global_draw
        self.labels = source.labels

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.source[index]
        generator = None if self.global_draw else torch.Generator().manual_seed(index)
        return image + (torch.rand((), generator=generator) * 8).to(torch.uint8), label

    def subset(self, indices: torch.Tensor) -> Shifted:
        return Shifted(self.source.subset(indices), self.global_draw)


def shifted(cfg: Any, seed: int, *, global_draw: bool = False) -> Splits:
    data = stripes(cfg, seed)
    train, val, test = (Shifted(s, global_draw) for s in (data.train, data.val, data.test))
    return Splits(train, val, test, data.classes)
'''


# An objective a user might add that keeps state across calls: on one process it sees both
# micro-batches of a step, on two each process sees one, so its loss depends on the world size.
ADDED_OBJECTIVE = '''"""Cross-entropy scaled by whether this is an odd call."""

from __future__ import annotations

import torch
from repro.api import CrossEntropy, Targets


class Alternating(CrossEntropy):
    def __init__(self) -> None:
        super().__init__(0.0)
        self.calls = 0

    def __call__(self, logits: torch.Tensor, targets: Targets) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"loss": super().__call__(logits, targets)["loss"] * (1 + 0.5 * (self.calls % 2))}
'''
