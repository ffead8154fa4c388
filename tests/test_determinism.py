"""The `cudnn` knob in-process (repro.core.runtime.determinism): each of torch's flags follows its own
key, and cuBLAS's workspace is set, kept or refused as the process can still give it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from repro.core.errors import ConfigError
from repro.core.runtime import determinism

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)
VARIABLE = determinism.CUBLAS_VARIABLE
FLAGS = ("benchmark", "deterministic", "tf32_matmul", "tf32_cudnn")


def knobs(**chosen: bool) -> SimpleNamespace:
    values = dict.fromkeys((*FLAGS, "deterministic_algorithms", "warn_only"), False)
    return SimpleNamespace(**{**values, **chosen})


@pytest.fixture(autouse=True)
def fresh_workspace(monkeypatch):
    """Each test starts as a new process would: the variable unset, nothing tracked yet.
    (conftest's restore_torch_globals puts torch's flags back after each test.)"""
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.setattr(determinism, "cublas_workspace", determinism.CublasWorkspace())
    yield
    os.environ.pop(VARIABLE, None)


@pytest.fixture
def cuda_started(monkeypatch):
    """Says whether CUDA has started, as the test decides."""
    state = SimpleNamespace(started=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state.started)
    return state


@pytest.mark.parametrize("flag", FLAGS)
def test_each_flag_follows_its_own_key(flag):
    determinism.apply(knobs(**{flag: True}), CPU)
    snapshot = determinism.snapshot()
    expected = {
        "cudnn_benchmark": flag == "benchmark",
        "cudnn_deterministic": flag == "deterministic",
        "tf32_matmul": flag == "tf32_matmul",
        "tf32_cudnn": flag == "tf32_cudnn",
    }
    assert {key: snapshot[key] for key in expected} == expected


@pytest.mark.parametrize(("enabled", "warn_only"), [(True, False), (True, True), (False, False)])
def test_deterministic_algorithms_and_warn_only_reach_torch(enabled, warn_only):
    determinism.apply(knobs(deterministic_algorithms=not enabled, warn_only=False), CPU)
    determinism.apply(knobs(deterministic_algorithms=enabled, warn_only=warn_only), CPU)
    assert torch.are_deterministic_algorithms_enabled() is enabled
    assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
    snapshot = determinism.snapshot()
    assert snapshot["deterministic_algorithms"] is enabled
    assert snapshot["deterministic_warn_only"] is warn_only


def test_torch_is_asked_to_change_its_algorithms_only_when_they_change(monkeypatch):
    calls = []
    real = torch.use_deterministic_algorithms

    def counted(mode, *, warn_only=False):
        calls.append((mode, warn_only))
        real(mode, warn_only=warn_only)

    monkeypatch.setattr(torch, "use_deterministic_algorithms", counted)
    determinism.apply(knobs(deterministic_algorithms=True), CPU)
    determinism.apply(knobs(deterministic_algorithms=True), CPU)
    determinism.apply(knobs(deterministic_algorithms=True, warn_only=True), CPU)
    determinism.apply(knobs(deterministic_algorithms=True, warn_only=True), CPU)
    assert calls == [(True, False), (True, True)]


def test_the_workspace_is_set_for_an_exact_job_and_cleared_after_it(cuda_started):
    determinism.apply(knobs(deterministic_algorithms=True), GPU)
    assert os.environ[VARIABLE] == ":4096:8" == determinism.snapshot()["cublas_workspace_config"]
    determinism.apply(knobs(deterministic_algorithms=True), GPU)
    assert os.environ[VARIABLE] == ":4096:8"
    determinism.apply(knobs(), GPU)
    assert VARIABLE not in os.environ and determinism.snapshot()["cublas_workspace_config"] is None
    determinism.apply(knobs(), GPU)  # nothing to clear twice
    assert VARIABLE not in os.environ


def test_a_users_workspace_is_never_changed(cuda_started, monkeypatch):
    monkeypatch.setenv(VARIABLE, ":16:8")
    for needed in (True, False, True):
        determinism.apply(knobs(deterministic_algorithms=needed), GPU)
        assert os.environ[VARIABLE] == ":16:8"
    monkeypatch.setenv(VARIABLE, ":0:0")  # not a deterministic one, but the user's to choose
    determinism.apply(knobs(deterministic_algorithms=False), GPU)
    assert os.environ[VARIABLE] == ":0:0"


def test_once_cuda_started_its_workspace_is_in_force_whatever_the_environment_says(cuda_started):
    determinism.apply(knobs(deterministic_algorithms=True), GPU)
    cuda_started.started = True
    os.environ[VARIABLE] = ":16:8"  # changed behind cuBLAS's back after it started
    assert determinism.snapshot()["cublas_workspace_config"] == ":16:8"  # first seen now
    os.environ.pop(VARIABLE)
    assert determinism.cublas_workspace.in_force() == ":16:8", "read once, when first seen"
    determinism.apply(knobs(), GPU)
    assert VARIABLE not in os.environ, "nothing is set or cleared once CUDA has started"


@pytest.mark.parametrize("started_with", [None, ":0:0"])
def test_an_exact_gpu_job_is_refused_when_cuda_started_without_a_deterministic_workspace(
    cuda_started, monkeypatch, started_with
):
    if started_with is not None:
        monkeypatch.setenv(VARIABLE, started_with)
    cuda_started.started = True
    with pytest.raises(ConfigError) as refused:
        determinism.apply(knobs(deterministic_algorithms=True), GPU)
    message = str(refused.value)
    assert message.startswith("cudnn.deterministic_algorithms=True")
    assert f"this process started CUDA with {VARIABLE}={started_with!r} (an earlier job" in message
    assert message == (
        f"cudnn.deterministic_algorithms=True is not allowed: this process started CUDA with "
        f"{VARIABLE}={started_with!r} (an earlier job in it) and cuBLAS reads it only then: run "
        "each job in its own process (hydra/launcher=joblib or submitit) or export "
        f"{VARIABLE}=:4096:8 before starting"
    )
    determinism.apply(knobs(deterministic_algorithms=True), CPU)  # cuBLAS plays no part
    determinism.apply(knobs(deterministic_algorithms=False), GPU)  # nor in an inexact job


@pytest.mark.parametrize("workspace", determinism.DETERMINISTIC_WORKSPACES)
def test_a_deterministic_workspace_in_force_lets_an_exact_job_run(
    cuda_started, monkeypatch, workspace
):
    monkeypatch.setenv(VARIABLE, workspace)
    cuda_started.started = True
    determinism.apply(knobs(deterministic_algorithms=True), GPU)
    assert torch.are_deterministic_algorithms_enabled()
    assert determinism.snapshot()["cublas_workspace_config"] == workspace


def test_the_snapshot_names_every_flag():
    assert sorted(determinism.snapshot()) == sorted(
        [
            "cudnn_benchmark",
            "cudnn_deterministic",
            "deterministic_algorithms",
            "deterministic_warn_only",
            "tf32_matmul",
            "tf32_cudnn",
            "cublas_workspace_config",
        ]
    )
