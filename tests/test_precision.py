"""The `amp` knob (repro.core.runtime.precision), in this process: which modes a device can run,
what `auto` picks, the refusal and the warning word for word, the scaler and autocast."""

from __future__ import annotations

import logging

import pytest
import torch

from repro.core.errors import ConfigError
from repro.core.runtime import precision
from repro.core.runtime.precision import Precision

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch):
    """A GPU as torch would describe one (no kernel runs on it here); `native` says whether
    it computes bf16 natively."""
    state = {"native": True, "bf16": True}

    def bf16_supported(including_emulation: bool = True) -> bool:
        return state["bf16"] and (including_emulation or state["native"])

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"Old GPU {device}")
    return state


def test_the_cpu_runs_bf16_or_nothing_and_auto_picks_nothing():
    assert Precision("auto", CPU).mode == "off" and Precision("off", CPU).dtype is None
    chosen = Precision("bf16", CPU)
    assert (chosen.mode, chosen.dtype, chosen.emulated) == ("bf16", torch.bfloat16, False)
    with pytest.raises(ConfigError) as refused:
        Precision("fp16", CPU)
    said = "amp='fp16' is not allowed: cpu cannot run it; allowed here: off, auto, bf16"
    assert str(refused.value) == said


# The fake GPU's fp16 scaler finds no CUDA and says so: expected here.
@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_auto_picks_bf16_on_a_gpu_that_computes_it_natively(gpu):
    assert Precision("auto", GPU).mode == "bf16"
    gpu["native"] = False
    assert Precision("auto", GPU).mode == "off"
    assert Precision("fp16", GPU).dtype is torch.float16


def test_a_gpu_without_bf16_offers_fp16_only(gpu):
    gpu["bf16"] = False
    with pytest.raises(ConfigError) as refused:
        Precision("bf16", GPU)
    said = "amp='bf16' is not allowed: cuda cannot run it; allowed here: off, auto, fp16"
    assert str(refused.value) == said


def test_emulated_bf16_is_named_with_the_gpu_and_what_is_faster(gpu, caplog):
    gpu["native"] = False
    with caplog.at_level(logging.WARNING, logger="repro.core.runtime.precision"):
        emulated = Precision("bf16", GPU)
    assert emulated.emulated and emulated.device == GPU
    assert caplog.messages == [
        "amp=bf16 on Old GPU cuda:0 runs emulated (no native bf16 on this GPU) and slowly; "
        "amp=fp16 or amp=off is faster here"
    ]
    caplog.clear()
    gpu["native"] = True
    assert not Precision("bf16", GPU).emulated and caplog.messages == []


def test_an_older_torch_without_the_emulation_argument_is_asked_plainly(monkeypatch):
    asked = []

    def supported(**keywords: object) -> bool:
        asked.append(keywords)
        if keywords:
            raise TypeError("is_bf16_supported() got an unexpected keyword argument")
        return True

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    assert precision.native_bf16() is True
    assert asked == [{"including_emulation": False}, {}]


def test_only_fp16_scales_its_loss():
    assert not Precision("bf16", CPU).scaler.is_enabled()
    assert not Precision("off", CPU).scaler.is_enabled()


def test_autocast_runs_in_the_modes_dtype_and_not_at_all_when_off():
    with Precision("bf16", CPU).autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with Precision("off", CPU).autocast():
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
