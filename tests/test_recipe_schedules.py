"""airbench's triangular schedule (repro.extras.recipes.schedules), factor by factor: its defaults,
its edges and the values it refuses."""

from __future__ import annotations

import pytest
import torch

from repro.extras.recipes.schedules import triangle, triangle_factor


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def test_the_defaults_are_airbenchs_and_the_factor_holds_at_end_past_the_run():
    factor = triangle(_optimizer(), total_steps=100).lr_lambdas[0]
    assert factor(0) == pytest.approx(0.2) and factor(23) == 1.0  # peak at int(0.23 * 100)
    assert factor(22) == pytest.approx(0.2 + 0.8 * 22 / 23)
    assert factor(24) == pytest.approx(1 - 0.93 / 77)
    assert factor(100) == pytest.approx(0.07) and factor(150) == pytest.approx(0.07)


def test_a_warmup_over_the_whole_run_peaks_at_its_end_without_dividing_by_zero():
    factor = triangle_factor(10, warmup=1.0, start=0.5, end=0.0)
    assert factor(5) == pytest.approx(0.75) and factor(10) == 1.0 and factor(11) == 0.0
    assert triangle_factor(10, warmup=0.0, start=0.5, end=0.0)(0) == 1.0  # no warmup at all


@pytest.mark.parametrize("start, end", [(0, 0), (1, 1), (0.0, 1.0)])
def test_start_and_end_anywhere_in_0_to_1_are_taken(start, end):
    factor = triangle(_optimizer(), 10, start=start, end=end).lr_lambdas[0]
    assert factor(0) == start and factor(10) == end


@pytest.mark.parametrize(
    "options, said",
    [
        ({"start": -0.01}, "start=-0.01: allowed: a number in [0, 1] (of the base lr)"),
        ({"end": 1.01}, "end=1.01: allowed: a number in [0, 1] (of the base lr)"),
        ({"start": 0.5, "end": -1}, "end=-1: allowed: a number in [0, 1] (of the base lr)"),
    ],
)
def test_a_start_or_end_outside_0_to_1_is_named(options, said):
    with pytest.raises(ValueError) as refused:
        triangle(_optimizer(), 10, **options)
    assert str(refused.value) == said
