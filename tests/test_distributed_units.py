"""torchrun's pieces in one process (repro.core.runtime.distributed): the rank from the environment,
the backend, each rank's device, and what each collective sends and gives back, with
torch.distributed's calls recorded. test_distributed.py runs the real two-process jobs."""

from __future__ import annotations

import pytest
import torch

from repro.core.errors import ConfigError
from repro.core.runtime import distributed
from repro.core.runtime.distributed import Context

TWO = Context(rank=1, world=2, local_rank=1)


@pytest.fixture
def calls(monkeypatch):
    """torch.distributed as a group of two whose rank 0 holds 7s; every call recorded."""
    made = []
    dist = distributed.dist

    def broadcast_object_list(box, src):
        made.append(("broadcast_object_list", box[0], src))
        box[0] = "rank 0's"

    def all_gather_object(out, value):
        made.append(("all_gather_object", len(out), value))
        out[:] = [f"rank {rank}'s" for rank in range(len(out))]

    def all_reduce(tensor, op):
        made.append(("all_reduce", tensor, op))
        tensor.mul_(2)

    def broadcast(tensor, src):
        made.append(("broadcast", tensor.is_contiguous(), src))
        tensor.fill_(7)

    monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "broadcast", broadcast)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "barrier", lambda: made.append(("barrier",)))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: made.append(("destroy",)))
    return made


def test_a_context_is_enabled_with_two_ranks_and_rank_zero_is_the_main_one():
    assert not Context().enabled and Context().is_main
    assert Context(world=2).enabled and Context(world=2).is_main
    assert TWO.enabled and not TWO.is_main


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, Context()),
        ({"WORLD_SIZE": "1", "RANK": "0"}, Context()),
        ({"WORLD_SIZE": "2", "RANK": "1"}, Context(rank=1, world=2, local_rank=0)),
        ({"WORLD_SIZE": "3", "RANK": "2"}, Context(rank=2, world=3, local_rank=0)),
        ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}, Context(3, 4, 1)),
    ],
)
def test_the_context_comes_from_torchruns_variables(monkeypatch, variables, expected):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert distributed.from_environment() == expected


def test_the_backend_is_the_one_named_or_per_device_where_cuda_is(monkeypatch):
    assert distributed.backend_for("nccl") == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert distributed.backend_for() == "cpu:gloo,cuda:nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.backend_for("auto") == "gloo"


@pytest.mark.parametrize(("gpus", "chosen"), [(2, [1]), (1, [])])
def test_a_rank_joins_once_on_its_own_gpu_where_it_has_one(monkeypatch, gpus, chosen):
    joined, devices, initialized = [], [], [False]
    dist = distributed.dist
    monkeypatch.setattr(dist, "is_initialized", lambda: initialized[0])
    monkeypatch.setattr(dist, "init_process_group", lambda backend: joined.append(backend))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    distributed.init(Context())  # one process: no group
    distributed.init(TWO, "gloo")
    assert joined == ["gloo"] and devices == chosen
    initialized[0] = True
    distributed.init(TWO)
    assert joined == ["gloo"], "once per process"


def test_each_rank_drives_its_own_gpu_and_no_more_ranks_than_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert distributed.device_for(TWO, cpu) is cpu
    assert distributed.device_for(Context(), cuda) is cuda
    assert distributed.device_for(TWO, cuda) == torch.device("cuda", 1)
    with pytest.raises(ConfigError) as refused:
        distributed.device_for(Context(rank=2, world=3, local_rank=2), cuda)
    assert str(refused.value) == (
        "trainer.device='cuda' is not allowed: one GPU per process: torchrun started local "
        "rank 2 but only 2 GPU(s) are visible; lower --nproc_per_node or use trainer.device=cpu"
    )


def test_one_process_keeps_its_own_values(calls):
    value, tensor = {"a": 1}, torch.ones(2)
    assert distributed.broadcast(value, Context()) is value
    assert distributed.gather(value, Context()) == [value]
    assert distributed.sum_tensor(tensor, Context()) is tensor
    assert distributed.max_tensor(tensor, Context()) is tensor
    distributed.broadcast_buffers(torch.nn.BatchNorm1d(2), Context())
    distributed.barrier(Context())
    assert calls == []


def test_broadcast_and_gather_give_rank_zeros_value_and_every_ranks_in_order(calls):
    assert distributed.broadcast("mine", TWO) == "rank 0's"
    assert distributed.gather("mine", TWO) == ["rank 0's", "rank 1's"]
    assert calls == [("broadcast_object_list", "mine", 0), ("all_gather_object", 2, "mine")]


def test_sums_and_maxima_reduce_in_place_on_the_tensors_device(calls):
    tensor = torch.tensor([1.0, 3.0])
    summed = distributed.sum_tensor(tensor, TWO)
    assert summed.tolist() == [2.0, 6.0] and summed.device == tensor.device
    distributed.max_tensor(torch.zeros(1), TWO)
    ops = [call[2] for call in calls]
    assert ops == [distributed.dist.ReduceOp.SUM, distributed.dist.ReduceOp.MAX]


def test_nccl_gets_a_cpu_tensor_on_the_gpu_and_the_result_comes_back(calls, monkeypatch):
    moved = []

    def to_gpu(self):
        moved.append(self)
        return self.clone()

    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.Tensor, "cuda", to_gpu)
    tensor = torch.tensor([2.0])
    summed = distributed.sum_tensor(tensor, TWO)
    assert moved == [tensor] and calls[0][1] is not tensor
    assert summed.tolist() == [4.0] and tensor.tolist() == [2.0]


def test_every_buffer_takes_rank_zeros_values_laid_out_as_it_was(calls):
    module = torch.nn.Module()
    module.register_buffer("dense", torch.zeros(2, 3))
    module.register_buffer("strided", torch.zeros(3, 2).t())
    strided = module.strided
    distributed.broadcast_buffers(module, TWO)
    assert torch.equal(module.dense, torch.full((2, 3), 7.0))
    assert torch.equal(module.strided, torch.full((2, 3), 7.0))
    assert module.strided is strided and not strided.is_contiguous()
    assert calls == [("broadcast", True, 0), ("broadcast", True, 0)]


def test_ranks_meet_at_a_barrier_and_leave_the_group_together(calls, monkeypatch):
    distributed.barrier(TWO)
    assert calls == [("barrier",)]
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    distributed.shutdown()
    assert calls == [("barrier",)]
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    distributed.shutdown()
    assert calls == [("barrier",), ("barrier",), ("destroy",)]


def test_a_rank_other_than_zero_leaves_without_finalization(monkeypatch):
    exits, shut = [], []
    monkeypatch.setattr(distributed.os, "_exit", exits.append)
    monkeypatch.setattr("logging.shutdown", lambda: shut.append(1))
    for rank in (None, "0"):
        if rank is None:
            monkeypatch.delenv("RANK", raising=False)
        else:
            monkeypatch.setenv("RANK", rank)
        distributed.leave(3)
    assert exits == [] and shut == []
    monkeypatch.setenv("RANK", "1")
    distributed.leave(3)
    assert exits == [3] and shut == [1]
