"""What an objective's task is: the targets it takes, what evaluation computes from logits,
the value a run monitors by default, and which metrics, callbacks and mixing apply.

An objective declares its task as a class attribute, `task = MULTI_LABEL`; one that declares
none is single-label, as the template's cross-entropy is:

- `SINGLE_LABEL`: a target is a class index, or a vector of class probabilities (soft labels,
  one row per image summing to 1). Predictions are the argmax class; `acc` counts the images
  whose argmax matches the label's (the soft label's argmax); `val_acc` is monitored.
- `MULTI_LABEL`: a target is a multi-hot vector (each entry 0 or 1, or a share between them,
  as mixing makes them). Predictions are the labels whose logit is above 0 (probability 0.5);
  `acc` counts the images with every label right (exact match), and the whole split's logits
  give `map` (mean average precision over the labels that occur), `ap_<label>` and
  `f1_<label>` per label; `val_map` is monitored.

Nothing here reads a config value twice or draws from a generator: the default run computes
exactly what it did before tasks existed.
"""

from repro.core.tasks.checks import MIN_VAL_TO_SELECT, check_config, check_selection, check_targets
from repro.core.tasks.task import (
    MULTI_LABEL,
    SINGLE_LABEL,
    Task,
    average_precision,
    column_names,
    monitor,
    of,
    of_config,
)

__all__ = [
    "MIN_VAL_TO_SELECT",
    "MULTI_LABEL",
    "SINGLE_LABEL",
    "Task",
    "average_precision",
    "check_config",
    "check_selection",
    "check_targets",
    "column_names",
    "monitor",
    "of",
    "of_config",
]
