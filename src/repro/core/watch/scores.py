"""The `metrics` config group: torchmetrics objects that score every evaluation's predictions.

    python -m repro.train metrics=[top5,f1,class_acc,confusion_matrix] trainer.monitor=val_f1

Each option names a torchmetrics `Metric` by `_target_` (its arguments beside it) under the name
its results take: a number is a column (`val_top5`, `ema_val_top5`, summary.json's
`test_top5`), one number per class is a column per class (`val_class_acc_0` ...), and a matrix
(the confusion matrix) is no column: summary.json (`test_confusion_matrix`) and
`repro.evaluate`'s output hold it. A metric is built with `num_classes=` the data's class count
(never written to the config); a user's own is a `Metric` subclass named the same way.

Why the figures are exact and cost the evaluation no waits:
- Every state must be summed over processes (a count: `add_state(..., dist_reduce_fx="sum")`).
  The states of all metrics travel in the evaluation's one copy to the host and its one sum over
  torchrun ranks (`engine/evaluation.evaluate`), and each rank scores its own shard of the
  split, so 1 and N processes count the same images the same; torchmetrics' own sync is off.
- The metrics score a pass's logits after its last batch, not inside the batch loop: on CUDA
  `torch.bincount` (which torchmetrics uses for macro averages and the confusion matrix) reads
  its input's maximum on the host, and inside the loop that would wait for the GPU at every
  batch. So do torchmetrics' input checks: `validate_args` is turned off once the metric is
  built (its arguments checked).
"""

from __future__ import annotations

from typing import Any

import torch

from repro.core.errors import ConfigError
from repro.core.tasks.objectives import RESERVED, TOTAL
from repro.core.watch.callbacks import instantiated


class Scores:
    """A run's metrics, scoring one evaluation pass at a time: `states` of the pass's batches
    (summed over ranks by the caller), then `results`."""

    def __init__(self, metrics: dict[str, Any]) -> None:  # name -> a torchmetrics Metric
        self.metrics = metrics
        self.names: list[str] = []  # the keys of the last results

    def states(
        self, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device
    ) -> torch.Tensor:
        """Every metric zeroed on `device` and updated with a pass's (float logits, labels)
        batches, in order; then all of their states as one float64 vector on the device
        (counts: exact up to 2**53)."""
        for metric in self.metrics.values():
            metric.to(device).reset()
            for logits, labels in batches:
                metric.update(logits, labels)
        return torch.cat([getattr(metric, name).double().flatten() for metric, name in self._all()])

    def results(self, summed: torch.Tensor, taken: list[str]) -> dict[str, Any]:
        """Each metric computed from `summed` (`states` added over ranks, on the host) under its
        name: a number, a matrix as nested lists, or one number per class as `<name>_0` ..."""
        for name in self.metrics.keys() & set(taken):
            raise ConfigError("metrics", name, "a name other than the objective's terms")
        start = 0
        for metric, name in self._all():
            local = getattr(metric, name)
            total = summed[start : start + local.numel()]
            setattr(metric, name, total.to(local.dtype).view(local.shape))
            start += local.numel()
        results: dict[str, Any] = {}
        for name, metric in self.metrics.items():
            value = metric.compute()
            if value.dim() == 1:  # one per class: a number each, as a metrics.csv column takes
                results |= {f"{name}_{i}": item for i, item in enumerate(value.tolist())}
            else:
                results[name] = value.tolist()
        self.names = list(results)
        return results

    def _all(self) -> list[tuple[Any, str]]:
        """(metric, state name) of every state, in a fixed order (the order of `add_state`)."""
        return [(metric, name) for metric in self.metrics.values() for name in metric.metric_state]


def build_scores(nodes: Any, classes: int) -> Scores | None:
    """`cfg.metrics` (name -> a node naming a torchmetrics class), each built for `classes`
    classes; None without any."""
    if not nodes:
        return None  # torchmetrics takes seconds to import: only for a run that uses it
    from torchmetrics import Metric
    from torchmetrics.utilities.data import dim_zero_sum

    metrics = instantiated("metrics", nodes, num_classes=classes, sync_on_compute=False)
    for name, metric in metrics.items():
        if name in (TOTAL, *RESERVED):  # evaluation's own results
            raise ConfigError("metrics", name, f"a name other than {TOTAL}, {', '.join(RESERVED)}")
        summed = isinstance(metric, Metric) and all(
            isinstance(getattr(metric, state), torch.Tensor) and reduce is dim_zero_sum
            for state, reduce in metric._reductions.items()  # how states combine over ranks
        )
        if not summed:
            allowed = 'a torchmetrics Metric whose states are all counts (dist_reduce_fx="sum")'
            raise ConfigError(f"metrics.{name}._target_", nodes[name]._target_, allowed)
        if hasattr(metric, "validate_args"):
            metric.validate_args = False  # its checks of each batch read tensors on the host
    return Scores(metrics) if metrics else None
