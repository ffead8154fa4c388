"""The learning-rate schedules: warm-up, then their decay to zero."""

from __future__ import annotations

import math

import pytest
import torch

from repro.engine import schedules
from repro.errors import ConfigError

from conftest import tiny, train_in_process


def factors(schedule, total_steps: int, **options) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = schedule(optimizer, total_steps, **options)
    rates = []
    for _ in range(total_steps):
        rates.append(optimizer.param_groups[0]["lr"] / 2.0)
        optimizer.step()
        scheduler.step()
    return rates


def test_both_warm_up_linearly_then_decay_to_zero_along_their_curve():
    cosine = factors(schedules.warmup_cosine, 110, warmup=10 / 110)
    linear = factors(schedules.warmup_linear, 110, warmup=10 / 110)
    for rates in (cosine, linear):
        assert rates[:10] == pytest.approx([(step + 1) / 10 for step in range(10)])
        assert rates[10] == 1.0 and rates[-1] < 0.011
    # Halfway through the decay (step 60 of steps 10..110): the cosine at 0.5, as the line.
    assert cosine[60] == pytest.approx(0.5) and linear[60] == pytest.approx(0.5)
    assert cosine[35] == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert linear[35] == pytest.approx(0.75)
    assert factors(schedules.constant, 5) == [1.0] * 5


def test_warmup_linear_trains_to_a_rate_of_zero_and_a_bad_warmup_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"scheduler\.warmup"):
        factors(schedules.warmup_linear, 10, warmup=1.5)
    summary = train_in_process(tmp_path, *tiny("scheduler=warmup_linear"))
    assert summary["lr"] == 0.0 and summary["completed"]  # it ends at zero
