"""Counting the operators a block makes on the meta device (repro.core.watch.operators.DeviceOps):
what would be one kernel launch each on a GPU."""

from __future__ import annotations

import torch

from repro.core.watch.operators import DeviceOps


def test_each_operator_that_makes_a_tensor_there_counts_once_and_views_not_at_all():
    with DeviceOps() as ops:
        x = torch.zeros(2, 3, device="meta")  # one
        y = x + 1  # two
        y.view(6)  # a view launches nothing
        y.detach()
        values, where = y.max(dim=0)  # one operator making two tensors: three
        torch.zeros((), device="meta").neg()  # a 0-d result: four and five
    assert ops.count == 5
    assert values.device.type == "meta" and where.dtype == torch.int64


def test_operators_on_another_device_are_not_counted():
    with DeviceOps() as ops:
        (torch.ones(3) * 2).sum()
    assert ops.count == 0
