"""Distributed data parallel under torchrun: which rank this is, and the few collectives we need.

`torchrun --nproc_per_node=N -m repro.train ...` sets RANK, WORLD_SIZE, LOCAL_RANK and a
rendezvous address; plain `python -m repro.train` sets none of them and stays single-process.
The backend follows the device: nccl on CUDA, gloo on CPU (`trainer.distributed.backend` may
name one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_environment() -> Context:
    """The torchrun context of this process (rank 0 of 1 when not under torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Context()
    return Context(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def init(context: Context, backend: str = "auto") -> None:
    """Join the process group (once per process)."""
    if not context.enabled or dist.is_initialized():
        return
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(context.local_rank)
    dist.init_process_group(backend=backend)


def device_for(context: Context, device: torch.device) -> torch.device:
    """Each rank drives its own GPU."""
    if device.type == "cuda" and context.enabled:
        return torch.device("cuda", context.local_rank)
    return device


def broadcast(value: Any, context: Context) -> Any:
    """Rank 0's value, on every rank."""
    if not context.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: Any, context: Context) -> list[Any]:
    """Every rank's value, in rank order, on every rank."""
    if not context.enabled:
        return [value]
    out: list[Any] = [None] * context.world
    dist.all_gather_object(out, value)
    return out


def _all_reduce(tensor: torch.Tensor, op: dist.ReduceOp, context: Context) -> torch.Tensor:
    if not context.enabled:
        return tensor
    on_backend = tensor.cuda() if dist.get_backend() == "nccl" else tensor  # nccl: GPU only
    dist.all_reduce(on_backend, op=op)
    return on_backend.to(tensor.device)


def sum_tensor(tensor: torch.Tensor, context: Context) -> torch.Tensor:
    """The tensor summed across ranks."""
    return _all_reduce(tensor, dist.ReduceOp.SUM, context)


def max_tensor(tensor: torch.Tensor, context: Context) -> torch.Tensor:
    """The element-wise maximum across ranks."""
    return _all_reduce(tensor, dist.ReduceOp.MAX, context)


def barrier(context: Context) -> None:
    if context.enabled:
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
