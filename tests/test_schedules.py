"""The learning-rate schedules: warm-up, then their decay to zero."""

from __future__ import annotations

import math

import pytest
import torch

from repro.core.engine import schedules

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


def test_the_cosine_factors_are_the_closed_form_to_the_bit():
    # The default schedule: any change in its arithmetic would change every default run.
    total, warmup_steps = 468, 47  # the default run: 6 epochs of 78 steps, warmup 0.1
    rates = factors(schedules.warmup_cosine, total, warmup=0.1)
    for step, rate in enumerate(rates):
        if step < warmup_steps:
            assert rate == (step + 1) / warmup_steps
        else:
            progress = (step - warmup_steps) / (total - warmup_steps)
            assert rate == 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def test_warmup_linear_trains_to_a_rate_of_zero(tmp_path):
    summary = train_in_process(tmp_path, *tiny("scheduler=warmup_linear"))
    assert summary["lr"] == 0.0 and summary["completed"]  # it ends at zero


def test_without_warm_up_the_first_step_has_the_full_rate():
    for schedule in (schedules.warmup_cosine, schedules.warmup_linear):
        assert factors(schedule, 4, warmup=0.0)[:2] == [1.0, 1.0]


def test_the_defaults_warm_up_over_a_tenth_and_a_fifth_of_the_steps():
    cosine, linear = factors(schedules.warmup_cosine, 100), factors(schedules.warmup_linear, 100)
    assert cosine[:11] == pytest.approx([(step + 1) / 10 for step in range(10)] + [1.0])
    assert linear[:21] == pytest.approx([(step + 1) / 20 for step in range(20)] + [1.0])


def test_the_rate_reaches_zero_with_one_decay_step_and_stays_there_past_the_end():
    # 2 steps, one of warm-up: the factor after the last step (the rate a run logs at its
    # end) is 0, and stays 0 if the schedule is stepped further.
    for schedule in (schedules.warmup_cosine, schedules.warmup_linear):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = schedule(optimizer, 2, warmup=0.5)
        seen = []
        for _ in range(5):
            seen.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        assert seen == pytest.approx([1.0, 1.0, 0.0, 0.0, 0.0], abs=1e-12)
