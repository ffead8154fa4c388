"""Distributed data parallel under torchrun: which rank this is, and the few collectives we need.

`torchrun --nproc_per_node=N -m repro.train ...` sets RANK, WORLD_SIZE, LOCAL_RANK and a
rendezvous address; plain `python -m repro.train` sets none of them and stays single-process.
The group joins before the config is read (the ranks agree on their run folder through it), so
the backend cannot wait for `trainer.device`: on a machine with CUDA it is gloo for CPU tensors
and nccl for CUDA tensors, and every collective goes to the backend of the device its tensors
live on, which is the training device. REPRO_DIST_BACKEND may name one backend instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from repro.core.errors import ConfigError


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


def backend_for(requested: str = "auto") -> str:
    """`auto`: gloo for CPU tensors, plus nccl for CUDA tensors where CUDA is present. A run
    with `trainer.device=cpu` on a GPU machine then communicates through gloo alone."""
    if requested != "auto":
        return requested
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init(context: Context, backend: str = "auto") -> None:
    """Join the process group (once per process)."""
    if not context.enabled or dist.is_initialized():
        return
    if torch.cuda.is_available() and context.local_rank < torch.cuda.device_count():
        # Whatever CUDA work a rank does (all of its training, or a stray context on a CPU
        # run) goes to its own GPU, not every rank's to GPU 0.
        torch.cuda.set_device(context.local_rank)
    dist.init_process_group(backend=backend_for(backend))


def device_for(context: Context, device: torch.device) -> torch.device:
    """Each rank drives its own GPU."""
    if device.type != "cuda" or not context.enabled:
        return device
    visible = torch.cuda.device_count()
    if context.local_rank >= visible:
        raise ConfigError(
            "trainer.device",
            "cuda",
            f"one GPU per process: torchrun started local rank "
            f"{context.local_rank} but only {visible} GPU(s) are visible; lower --nproc_per_node "
            "or use trainer.device=cpu",
        )
    return torch.device("cuda", context.local_rank)


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
    forced_nccl = dist.get_backend() == "nccl" and not tensor.is_cuda  # nccl takes GPU tensors
    on_backend = tensor.cuda() if forced_nccl else tensor
    dist.all_reduce(on_backend, op=op)
    return on_backend.to(tensor.device)


def sum_tensor(tensor: torch.Tensor, context: Context) -> torch.Tensor:
    """The tensor summed across ranks."""
    return _all_reduce(tensor, dist.ReduceOp.SUM, context)


def max_tensor(tensor: torch.Tensor, context: Context) -> torch.Tensor:
    """The element-wise maximum across ranks."""
    return _all_reduce(tensor, dist.ReduceOp.MAX, context)


def broadcast_buffers(module: torch.nn.Module, context: Context) -> None:
    """Rank 0's buffers (BatchNorm running statistics ...) on every rank.

    DDP broadcasts them at the start of each forward, so after the last step every rank holds
    its own update; evaluating then would mix the ranks' models. Training is unaffected: the
    next forward broadcasts rank 0's buffers anyway.
    """
    if not context.enabled:
        return
    for buffer in module.buffers():
        dense = buffer.contiguous()  # the backends send dense memory only
        dist.broadcast(dense, src=0)
        if dense.data_ptr() != buffer.data_ptr():
            buffer.copy_(dense)


def barrier(context: Context) -> None:
    if context.enabled:
        dist.barrier()


def shutdown() -> None:
    """After a run that ended normally: the ranks meet, then the process group goes, so that
    no rank tears its connections down while another still uses them."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def leave(code: int) -> None:
    """End a torchrun rank other than 0 here, once its output is flushed, without Python's
    finalization: gloo's threads may abort the process there ("terminate called without an
    active exception", exit code -6; seen now and then in CI on a loaded machine, always on
    rank 1, after the run had completed). Such a rank writes no file, so nothing is lost. Rank 0 and a
    plain process return, and exit as usual."""
    if int(os.environ.get("RANK", "0")) == 0:
        return
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
