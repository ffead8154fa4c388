"""A task: the targets an objective takes and what evaluation computes from its logits."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Task:
    name: str
    monitor: str  # the column `trainer.monitor=auto` follows (higher is better)
    single_label: bool  # predictions are one class per image (confusion matrix, top-k)
    needs_outputs: bool  # evaluation keeps the split's logits for `outputs_metrics`

    def check_target(self, target: Any, classes: int) -> str | None:
        """What is wrong with one sample's target for `classes` classes (the words after
        "has"), or None."""
        if self.single_label and _is_index(target):
            if 0 <= int(target) < classes:
                return None
            return (
                f"label {int(target)}, but the data has {classes} classes (labels 0..{classes - 1})"
            )
        values = torch.as_tensor(target)
        if self.single_label:
            wanted = f"a class index or {classes} class probabilities summing to 1"
        else:
            wanted = f"a multi-hot vector of {classes} labels (0 or 1; float, uint8 or bool)"
        said = f"as target {_described(values)}; a {self.name} objective takes {wanted}"
        integral = values.dtype in (torch.uint8, torch.bool) and not self.single_label
        if values.shape != (classes,) or not (values.is_floating_point() or integral):
            return said
        values = values.double()
        if bool(((values < 0) | (values > 1)).any()):
            return f"{said}; some values are outside [0, 1]"
        if self.single_label and abs(float(values.sum()) - 1) > 1e-3:
            return f"{said}; these sum to {float(values.sum()):.4g}"
        return None

    def correct(self, predicted: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """How many of a batch's predictions (`predicted`) are right, as a float64 count on
        their device: the class (a soft label's most likely one), or every label."""
        if self.single_label:
            wanted = targets if targets.dim() == 1 else targets.argmax(1)
            return (predicted == wanted).sum().double()
        return (predicted.bool() == (targets > 0.5)).all(1).sum().double()

    def predicted(self, logits: torch.Tensor) -> torch.Tensor:
        """Each image's prediction: its class, or its 0/1 labels."""
        return logits.argmax(1) if self.single_label else (logits > 0).to(torch.uint8)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Softmax over the classes, or each label's sigmoid."""
        return logits.softmax(1) if self.single_label else logits.sigmoid()

    def outputs_metrics(
        self, logits: torch.Tensor, targets: torch.Tensor, labels: list[str]
    ) -> dict[str, float]:
        """The metrics a whole split's logits give (multi-label: `map`, `ap_*`, `f1_*`),
        computed on the host in float64, the same however the split was batched or sharded."""
        if not self.needs_outputs:
            return {}
        logits, positives = logits.double().cpu(), targets.cpu() > 0.5
        names = column_names(labels)
        precisions = [average_precision(logits[:, i], positives[:, i]) for i in range(len(names))]
        found = [value for value in precisions if value == value]  # labels that occur
        result = {"map": sum(found) / len(found) if found else float("nan")}
        result |= {f"ap_{name}": value for name, value in zip(names, precisions, strict=True)}
        said = logits > 0
        true_pos = (said & positives).sum(0).double()
        wrong = (said ^ positives).sum(0).double()
        f1 = torch.where(true_pos > 0, 2 * true_pos / (2 * true_pos + wrong), 0.0)
        return result | {
            f"f1_{name}": value for name, value in zip(names, f1.tolist(), strict=True)
        }


SINGLE_LABEL = Task("single-label", "val_acc", single_label=True, needs_outputs=False)
MULTI_LABEL = Task("multi-label", "val_map", single_label=False, needs_outputs=True)


def _is_index(target: Any) -> bool:
    if isinstance(target, int) and not isinstance(target, bool):
        return True
    return isinstance(target, torch.Tensor) and target.dim() == 0 and not target.is_floating_point()


def _described(values: torch.Tensor) -> str:
    return f"a {str(values.dtype).removeprefix('torch.')} tensor of shape {tuple(values.shape)}"


def average_precision(scores: torch.Tensor, positives: torch.Tensor) -> float:
    """The area under the precision-recall steps of one label (images tied on a score count as
    one step); NaN when the label never occurs."""
    total = int(positives.sum())
    if total == 0:
        return float("nan")
    order = torch.argsort(scores, descending=True, stable=True)
    ranked, hits = scores[order], positives[order].double()
    true_pos, false_pos = hits.cumsum(0), (1 - hits).cumsum(0)
    ends = torch.cat([torch.nonzero(ranked[1:] != ranked[:-1]).flatten(), torch.tensor([-1])])
    true_pos, false_pos = true_pos[ends], false_pos[ends]
    recall = true_pos / total
    gained = recall - torch.cat([torch.zeros(1, dtype=recall.dtype), recall[:-1]])
    return float((gained * true_pos / (true_pos + false_pos)).sum())


def column_names(labels: list[str]) -> list[str]:
    """Label names as parts of a column name: letters, digits and underscores, unique."""
    names: list[str] = []
    for index, label in enumerate(labels):
        name = re.sub(r"\W+", "_", str(label)).strip("_").lower() or str(index)
        names.append(name if name not in names else f"{name}_{index}")
    return names


def of(objective: Any) -> Task:
    """The task an objective (built, or its class) declares; single-label if none."""
    task = getattr(objective, "task", SINGLE_LABEL)
    return task if isinstance(task, Task) else SINGLE_LABEL


def of_config(node: Any) -> Task:
    """The task of the objective a config names, read from its class before anything is
    built; single-label for one that cannot be imported (its build says why)."""
    return of(target_of(node))


def target_of(node: Any) -> Any:
    """What a node's `_target_` names, or None where it cannot be imported (its build says
    why in one line)."""
    from hydra.utils import get_object

    try:
        return get_object(str(node.get("_target_")))
    except Exception:  # an import error, or no _target_
        return None


def monitor(cfg: Any) -> str:
    """`trainer.monitor`, with `auto` resolved to what the objective's task monitors."""
    named = str(cfg.trainer.monitor)
    return of_config(cfg.objective).monitor if named == "auto" else named
