"""Counting the operators a piece of code makes on a device, without that device: with the
tensors on PyTorch's meta device (it runs no kernels), each operator that makes a tensor there
is what would be one kernel launch on a GPU."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # no public name yet

VIEWS = {"aten.view.default", "aten.unbind.int", "aten.detach.default"}  # launch nothing


class DeviceOps(TorchDispatchMode):
    """Within the block, `count` is the number of operators (views left out) that made a
    tensor on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, tuple | list) else (out,)
        made_there = any(isinstance(o, torch.Tensor) and o.device.type == "meta" for o in outs)
        self.count += made_there and str(func) not in VIEWS
        return out
