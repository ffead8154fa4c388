"""Summary statistics with Student-t confidence intervals."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


@dataclass
class Summary:
    count: int
    mean: float
    std: float  # sample standard deviation (n - 1); nan for one value
    min: float
    max: float
    ci_low: float  # 95% confidence interval of the mean (t distribution); nan for one value
    ci_high: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: list[float], confidence: float = 0.95) -> Summary:
    count = len(values)
    mean = statistics.fmean(values)
    if count < 2:
        return Summary(count, mean, math.nan, min(values), max(values), math.nan, math.nan)
    std = statistics.stdev(values)
    from scipy import stats  # late: ~0.9 s, and Hydra's plugin scan imports this module every run

    half = stats.t.ppf(0.5 + confidence / 2, count - 1) * std / math.sqrt(count)
    return Summary(count, mean, std, min(values), max(values), mean - half, mean + half)


@dataclass
class Difference:
    """mean(b) - mean(a) with a confidence interval: Welch's (unequal variances) from
    `difference_of_means`, or the paired one from `paired_difference`."""

    difference: float
    ci_low: float
    ci_high: float
    dof: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def difference_of_means(a: list[float], b: list[float], confidence: float = 0.95) -> Difference:
    diff = statistics.fmean(b) - statistics.fmean(a)
    if len(a) < 2 or len(b) < 2:
        return Difference(diff, math.nan, math.nan, math.nan)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(diff, diff, diff, math.inf)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy import stats  # late, as in summarize

    half = stats.t.ppf(0.5 + confidence / 2, dof) * se
    return Difference(diff, diff - half, diff + half, dof)


def paired_difference(a: list[float], b: list[float], confidence: float = 0.95) -> Difference:
    """The mean of b[i] - a[i] over matched pairs (the same seed in both groups) with a t
    interval of the per-pair differences: what the seed does to both cancels out."""
    s = summarize([y - x for x, y in zip(a, b, strict=True)], confidence)
    return Difference(s.mean, s.ci_low, s.ci_high, s.count - 1 if s.count > 1 else math.nan)
