"""What the interval of a difference b - a says, in words: which config is better, that no
difference is shown, or that the two numbers are not the same quantity. One helper for the sweep
report (every metric between every two groups) and the adaptive seed sweeper (its one metric),
so both answer alike. It imports nothing heavy: Hydra's plugin scan imports the sweeper, and
with it this module, on every run.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass

NO_DIFFERENCE = "no difference shown"
SPLITS = ("train_", "val_", "test_", "ema_val_")  # a split's columns (report.PREFIXES)
TOTAL = (
    "loss"  # the objective's total, which training minimises (repro.core.tasks.objectives.TOTAL)
)
TIMES = ("wall_s", "train_s")  # costs: lower is better, and no split's quantity
# Columns whose name says which side is better: the evaluation's accuracy and the scores of the
# metrics group's options (conf/metrics; class_acc_<n> per class) count images right.
HIGHER = ("acc", "top5", "f1")
# data keys that leave the images and labels of every split as they are: how files are read
# (download, cache), the training batches' augmentation (augment, crop_padding), and the
# normalisation (mean, std: the same pixels scaled, like any other choice of model input).
DATA_KEYS_KEEPING_SPLITS = (
    "download", "cache", "cache_budget_gib", "augment", "crop_padding", "mean", "std",
)  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    better: str | None  # "a" or "b" where one is shown better, else None
    verdict: str  # in words

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def side(ci_low: float, ci_high: float) -> str | None:
    """Where b lies against a, "higher" or "lower", when the interval of b - a excludes 0; None
    when it holds 0 or is no interval: nan (fewer than two values), or of no width (every seed
    gave the same difference: no spread, which says nothing of seeds to come)."""
    if math.isnan(ci_low) or math.isnan(ci_high) or ci_low == ci_high:
        return None
    return "higher" if ci_low > 0 else "lower" if ci_high < 0 else None


def _split_and_name(metric: str) -> tuple[str, str]:
    """("val_", "loss") for val_loss and best_val_loss (the best of a column: the same
    quantity); ("", metric) for a time or a number of no split."""
    metric = metric.removeprefix("best_")
    split = next((s for s in SPLITS if metric.startswith(s)), "")
    return ("", metric) if metric in TIMES else (split, metric.removeprefix(split))


def higher_is_better(metric: str, modes: Mapping[str, str] | None = None) -> bool | None:
    """Whether a higher `metric` is better: where its name says (times and the loss lower,
    HIGHER higher), else as `modes` says (monitored column -> trainer.monitor_mode, max or min,
    as the jobs set it), else None: not known (an objective's term may be a penalty or not)."""
    split, name = _split_and_name(metric)
    if name in TIMES or (split and name == TOTAL):
        return False
    if split and (name in HIGHER or name.removeprefix("class_acc_").isdigit()):
        return True
    mode = (modes or {}).get(metric.removeprefix("best_"))
    return {"max": True, "min": False}.get(mode or "")


def incomparable(metric: str, keys: Iterable[str], terms: Collection[str] = ()) -> str | None:
    """Why `metric` is not the same quantity in two configs whose overrides differ in `keys`
    (overrides or their keys: `objective=focal`, `+objective.gamma`, `data.val_size` ...), or
    None where it is.

    - A data key (`data`, `data.*` but DATA_KEYS_KEEPING_SPLITS) changes the images or labels
      of the splits (their source, size, count, classes or share): every split's column then
      measures other data.
    - An objective key (`objective`, `objective.*`) changes what the loss and the objective's
      terms measure, in every split: the total, `terms` (the names the jobs' train_<term>
      columns show) and every train_ column but the time. Accuracy and the metrics group's
      scores judge predictions the same way under any objective: they stay comparable.
    Times and numbers of no split stay comparable. The training augmentation (`augment.*`)
    counts as neither: val_ and test_ columns are the same quantity, and train_ columns change
    with it as they do with any other training setting.
    """
    split, name = _split_and_name(metric)
    if not split:
        return None
    names = {key.lstrip("+~").split("=", 1)[0] for key in keys}
    for key in names:
        # A key outside data. comes back from removeprefix as it is, which ends the test.
        if key == "data" or key.removeprefix("data.") not in (key, *DATA_KEYS_KEEPING_SPLITS):
            return "the data differ"
    is_term = split == "train_" or name == TOTAL or name in terms
    if is_term and any(key == "objective" or key.startswith("objective.") for key in names):
        return "the objective differs"
    return None


def verdict(
    metric: str, ci_low: float, ci_high: float, a: str = "a", b: str = "b", *,
    keys: Iterable[str] = (), terms: Collection[str] = (), modes: Mapping[str, str] | None = None,
) -> Verdict:  # fmt: skip
    """What the interval [ci_low, ci_high] of metric(b) - metric(a) says of the configs named `a`
    and `b`: "<b> better than <a>" (or the reverse) where it excludes 0, by the metric's
    direction (`higher_is_better`); "<b> higher than <a>" where that is not known;
    NO_DIFFERENCE where it holds 0; and "not comparable: <why>" where the configs differ in
    `keys` that change what the metric measures (`incomparable`), whatever the interval says."""
    if why := incomparable(metric, keys, terms):
        return Verdict(None, f"not comparable: {why}")
    where = side(ci_low, ci_high)
    if where is None:
        return Verdict(None, NO_DIFFERENCE)
    higher = higher_is_better(metric, modes)
    if higher is None:
        high, low = (b, a) if where == "higher" else (a, b)
        return Verdict(None, f"{high} higher than {low} (which is better is not known)")
    winner = "b" if (where == "higher") == higher else "a"
    best, other = (b, a) if winner == "b" else (a, b)
    return Verdict(winner, f"{best} better than {other}")
