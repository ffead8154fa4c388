"""The CUDA paths, checked without a GPU: `torch.cuda` is replaced by a recording fake where a
test needs one, so each defect found by review has a test that runs on any machine."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest
import torch

from repro.core import build
from repro.core.data.loader import LoaderContext
from repro.core.errors import CheckpointError, ConfigError
from repro.core.runs import checkpoint
from repro.core.runtime import compilation, determinism, distributed, seeding
from repro.core.runtime.precision import Precision

from conftest import compose_config, read_summary, tiny, train_in_process


@pytest.fixture
def fake_cuda(monkeypatch):
    """A machine with two GPUs, as far as the code under test can tell; records the calls."""
    calls = SimpleNamespace(set_device=[], seeded_all=[], set_rng=[], initialized=False)
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cuda, "set_device", lambda index: calls.set_device.append(index))
    monkeypatch.setattr(cuda, "manual_seed_all", lambda seed: calls.seeded_all.append(seed))
    monkeypatch.setattr(cuda, "is_initialized", lambda: calls.initialized)
    monkeypatch.setattr(cuda, "get_device_name", lambda device=None: "Fake GPU")
    # A generator state that says which GPU it came from.
    monkeypatch.setattr(
        cuda, "get_rng_state", lambda device: torch.full((16,), device.index, dtype=torch.uint8)
    )
    monkeypatch.setattr(
        cuda, "set_rng_state", lambda state, device: calls.set_rng.append((state, device))
    )
    return calls


# ---- 1. seeding ---------------------------------------------------------------------------


def test_a_seeded_block_leaves_the_gpu_generators_their_per_rank_seed(fake_cuda):
    seeding.seed_globals(7, rank=1)
    rank_seed = seeding.stream_seed(7, "torch", rank=1)
    assert fake_cuda.seeded_all == [rank_seed]
    before = torch.get_rng_state()
    with seeding.seeded(7, "model"):  # the model is built in such a block
        first = torch.rand(3)
    with seeding.seeded(7, "model"):
        assert torch.equal(torch.rand(3), first), "the block draws from its own stream"
    assert torch.equal(torch.get_rng_state(), before), "the CPU generator is put back"
    assert fake_cuda.seeded_all == [rank_seed], "GPU generators keep the rank's own seed"


# ---- 2. RNG state in checkpoints ----------------------------------------------------------


def test_checkpoint_holds_the_training_gpus_generator_and_resumes_with_fewer_gpus(fake_cuda):
    saved = checkpoint.capture_rng(torch.device("cuda", 1))  # rank 1 of a two-GPU run
    assert torch.equal(saved["device"], torch.full((16,), 1, dtype=torch.uint8))
    # Resumed where only one GPU is visible (CUDA_VISIBLE_DEVICES=1): this rank is cuda:0 now.
    checkpoint.restore_rng(saved, torch.device("cuda", 0))
    ((state, device),) = fake_cuda.set_rng
    assert device == torch.device("cuda", 0) and torch.equal(state, saved["device"])


def test_a_generator_state_for_another_kind_of_device_is_refused_in_one_line(fake_cuda):
    on_gpu = checkpoint.capture_rng(torch.device("cuda", 0))
    with pytest.raises(CheckpointError, match="for a CUDA device, this run trains on cpu"):
        checkpoint.restore_rng(on_gpu, torch.device("cpu"))
    on_cpu = checkpoint.capture_rng(torch.device("cpu"))
    assert on_cpu["device"] is None
    with pytest.raises(CheckpointError, match="for the CPU, this run trains on cuda"):
        checkpoint.restore_rng(on_cpu, torch.device("cuda", 0))


# ---- 3. torchrun backend ------------------------------------------------------------------


def test_torchrun_on_a_gpu_machine_gives_cpu_tensors_gloo_and_each_rank_its_gpu(
    fake_cuda, monkeypatch
):
    joined = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        distributed.dist, "init_process_group", lambda backend: joined.append(backend)
    )
    distributed.init(distributed.Context(rank=1, world=2, local_rank=1))
    assert joined == ["cpu:gloo,cuda:nccl"], "trainer.device=cpu must not get nccl"
    assert fake_cuda.set_device == [1], "rank 1 opens its CUDA context on GPU 1, not GPU 0"
    distributed.init(distributed.Context(rank=0, world=2, local_rank=0), backend="gloo")
    assert joined[-1] == "gloo", "REPRO_DIST_BACKEND names one backend for everything"


def test_torchrun_without_cuda_uses_gloo_and_more_ranks_than_gpus_is_refused(
    fake_cuda, monkeypatch
):
    assert distributed.device_for(
        distributed.Context(rank=1, world=2, local_rank=1), torch.device("cuda")
    ) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="only 2 GPU"):
        distributed.device_for(
            distributed.Context(rank=2, world=3, local_rank=2), torch.device("cuda")
        )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.backend_for("auto") == "gloo"


# ---- 5. cuBLAS workspace ------------------------------------------------------------------


@pytest.fixture
def workspace(monkeypatch):
    """A fresh tracker, as in a new process, with the variable unset."""
    monkeypatch.delenv(determinism.CUBLAS_VARIABLE, raising=False)
    fresh = determinism.CublasWorkspace()
    monkeypatch.setattr(determinism, "cublas_workspace", fresh)
    yield fresh
    os.environ.pop(determinism.CUBLAS_VARIABLE, None)


def cudnn(option: str):
    return compose_config(f"cudnn={option}").cudnn


def test_a_deterministic_job_after_cuda_started_without_the_workspace_is_refused(
    fake_cuda, workspace
):
    gpu = torch.device("cuda", 0)
    determinism.apply(cudnn("default"), gpu)  # the first job of a sequential multirun
    assert determinism.CUBLAS_VARIABLE not in os.environ
    fake_cuda.initialized = True  # it trained: cuBLAS started without the setting
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting"):
        determinism.apply(cudnn("deterministic"), gpu)
    assert determinism.snapshot()["cublas_workspace_config"] is None
    determinism.apply(cudnn("deterministic"), torch.device("cpu"))  # no cuBLAS on the CPU


def test_the_recorded_workspace_is_the_one_in_force_not_the_environments(fake_cuda, workspace):
    gpu = torch.device("cuda", 0)
    determinism.apply(cudnn("deterministic"), gpu)
    assert os.environ[determinism.CUBLAS_VARIABLE] == ":4096:8"
    determinism.apply(cudnn("default"), gpu)  # CUDA not started yet: the setting goes again
    assert determinism.CUBLAS_VARIABLE not in os.environ
    determinism.apply(cudnn("deterministic"), gpu)
    fake_cuda.initialized = True
    determinism.apply(cudnn("default"), gpu)  # too late to take it back: it stays in force
    assert determinism.snapshot()["cublas_workspace_config"] == ":4096:8"
    determinism.apply(cudnn("deterministic"), gpu)  # and a later exact job can run


def test_a_users_own_workspace_setting_is_kept(workspace, monkeypatch):
    monkeypatch.setenv(determinism.CUBLAS_VARIABLE, ":16:8")
    determinism.apply(cudnn("deterministic"), torch.device("cpu"))
    determinism.apply(cudnn("default"), torch.device("cpu"))
    assert os.environ[determinism.CUBLAS_VARIABLE] == ":16:8"


# ---- 6. resolved values on resume ---------------------------------------------------------


def test_resume_refuses_a_machine_that_resolves_the_config_otherwise(tmp_path):
    """amp=auto and trainer.device=auto resolve per machine; the checkpoint records them."""
    run = tmp_path / "run"
    train_in_process(run, *tiny("trainer.max_steps=3", "trainer.device=cpu"))
    last = run / "checkpoints" / "last.pt"
    state = checkpoint.load(last)
    assert state["resolved"] == {"device": "cpu", "amp": "off", "memory_format": "channels_last"}
    state["resolved"]["amp"] = "bf16"  # as a GPU machine with native bf16 resolves amp=auto
    checkpoint.atomic_save(state, last)
    with pytest.raises(CheckpointError, match=r"amp: 'bf16' -> 'off'"):
        train_in_process(run, *tiny("trainer.max_steps=6", "trainer.device=cpu"))
    assert checkpoint.load(last)["position"]["step"] == 3, "the checkpoint is left as it was"


# ---- 7. compiler state between jobs -------------------------------------------------------


def test_each_run_starts_with_no_compiled_graphs_from_earlier_runs(tmp_path, monkeypatch):
    def double(x):
        return x * 2

    torch.compile(double, backend="eager")(torch.ones(2))
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    assert len(_debug_get_cache_entry_list(double.__code__)) == 1
    forgotten = []
    original = compilation.forget_earlier_runs
    monkeypatch.setattr(
        compilation, "forget_earlier_runs", lambda: (forgotten.append(1), original())
    )
    train_in_process(tmp_path / "run", *tiny("trainer.max_steps=1"))
    assert forgotten == [1]
    assert _debug_get_cache_entry_list(double.__code__) == [], "the earlier graph is gone"


# ---- 8. bf16 without native support -------------------------------------------------------


def test_explicit_bf16_on_a_gpu_without_native_bf16_says_it_is_emulated(
    fake_cuda, monkeypatch, caplog
):
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    gpu = torch.device("cuda", 0)
    with caplog.at_level(logging.WARNING, logger="repro.core.runtime.precision"):
        emulated = Precision("bf16", gpu)
    assert emulated.emulated and "runs emulated" in caplog.text and "Fake GPU" in caplog.text
    assert Precision("auto", gpu).mode == "off", "auto never picks emulated bf16"
    assert not Precision("fp16", gpu).emulated


def test_the_summary_says_whether_bf16_was_emulated(tmp_path):
    train_in_process(tmp_path / "run", *tiny("trainer.max_steps=1", "amp=bf16"))
    summary = read_summary(tmp_path / "run")
    assert summary["amp"] == "bf16" and summary["amp_emulated"] is False  # CPU bf16 is native


def test_only_fp16_gets_a_grad_scaler_on_a_gpu(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    gpu = torch.device("cuda", 0)
    assert Precision("fp16", gpu).scaler.is_enabled()
    assert not Precision("bf16", gpu).scaler.is_enabled()
    assert not Precision("off", gpu).scaler.is_enabled()


# ---- fp16 without a host wait per step ----------------------------------------------------


def test_fp16_on_a_gpu_picks_the_fused_optimizer_unless_told_otherwise(fake_cuda):
    fp16 = Precision("fp16", torch.device("cuda", 0))
    model = torch.nn.Linear(2, 1, bias=False)
    for option in ("sgd", "adamw"):
        chosen = build.optimizer(compose_config(f"optimizer={option}"), model, fp16)
        assert chosen.defaults["fused"] is True and not chosen.defaults["foreach"]
    kept = build.optimizer(compose_config("+optimizer.fused=false"), model, fp16)
    assert not kept.defaults["fused"] and kept.defaults["foreach"]
    on_cpu = build.optimizer(compose_config(), model, Precision("off", torch.device("cpu")))
    assert not on_cpu.defaults.get("fused"), "nothing changes without fp16 on a GPU"


# ---- the CUDA sanitizer and loader workers (found on an H100) ------------------------------


def test_the_cuda_sanitizer_with_loader_workers_is_refused_in_one_line(monkeypatch):
    """Under TORCH_CUDA_SANITIZER every tensor op asks for the current CUDA stream, and a
    forked worker cannot initialise CUDA: say so before any worker starts."""
    cfg = compose_config(*tiny("dataloader.num_workers=2"))
    data = build.splits(cfg, 0)
    monkeypatch.setenv("TORCH_CUDA_SANITIZER", "1")
    with pytest.raises(ConfigError, match=r"dataloader.num_workers=2 .*TORCH_CUDA_SANITIZER"):
        build.loaders(cfg, data, LoaderContext(0, device=torch.device("cuda")))
    cfg.dataloader.num_workers = 0  # the main process alone: the sanitizer's way
    monkeypatch.delenv("TORCH_CUDA_SANITIZER")
    build.loaders(cfg, data, LoaderContext(0))  # and without it, as ever


# ---- trainer.sync_debug --------------------------------------------------------------------


def test_sync_debug_warns_from_the_second_step_and_is_off_after_the_run(tmp_path, monkeypatch):
    """A GPU run with trainer.sync_debug=true (the device faked: only the mode calls matter)."""
    from repro.core.engine.loop import Trainer

    steps, modes = [], []
    train_step = Trainer.train_step

    def counted(self, *batch):
        steps.append(None)
        return train_step(self, *batch)

    monkeypatch.setattr(Trainer, "train_step", counted)
    monkeypatch.setattr(Trainer, "device", property(lambda self: torch.device("cuda")))
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: modes.append((m, len(steps))))
    train_in_process(
        tmp_path / "off", *tiny("trainer.max_steps=3", "trainer.save_checkpoints=false")
    )
    assert modes == []  # off by default: not a call
    steps.clear()
    train_in_process(
        tmp_path / "on",
        *tiny("trainer.max_steps=3", "trainer.save_checkpoints=false", "trainer.sync_debug=true"),
    )
    assert modes == [("warn", 1), (0, 3)]  # on once, after the first step; off at the end
