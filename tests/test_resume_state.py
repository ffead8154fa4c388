"""A resume restores every part of a run's state, including those that no default run
exercises: the global generators (dropout) and the fp16 loss scaler."""

from __future__ import annotations

import pytest
import torch

from repro.runs import checkpoint
from repro.runtime import precision

from conftest import tiny, train_in_process

SMALL = [o for o in tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2")
         if not o.startswith("model.")]  # fmt: skip


def test_a_resumed_run_with_dropout_ends_on_the_straight_weights(tmp_path):
    dropout = [*SMALL, "model=torchvision", "model._target_=colleague_nets.dropout_net"]
    straight = train_in_process(tmp_path / "straight", *dropout)
    train_in_process(tmp_path / "run", *dropout, "trainer.halt_at_step=5")
    resumed = train_in_process(tmp_path / "run", *dropout)
    assert resumed["resumed_from_step"] == 5
    assert resumed["weights_sha256"] == straight["weights_sha256"]


@pytest.fixture
def fp16_on_cpu(monkeypatch):
    """Let amp=fp16 run on the CPU (autocast and an enabled GradScaler), as it runs on a GPU."""
    monkeypatch.setattr(precision, "_supports", lambda device, mode: True)


@pytest.mark.slow
def test_the_loss_scalers_state_survives_a_resume(fp16_on_cpu, tmp_path):
    fp16 = [*SMALL, "model=small_cnn", "model.widths=[8,16]", "amp=fp16"]
    straight = train_in_process(tmp_path / "straight", *fp16)
    train_in_process(tmp_path / "run", *fp16, "trainer.halt_at_step=5")
    resumed = train_in_process(tmp_path / "run", *fp16)
    assert resumed["amp"] == "fp16" and resumed["resumed_from_step"] == 5
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    scalers = [
        checkpoint.load(folder / "checkpoints" / "last.pt")["scaler"]
        for folder in (tmp_path / "straight", tmp_path / "run")
    ]
    assert scalers[0]["_growth_tracker"] == straight["step"]  # enabled: it counted every step
    assert scalers[1] == scalers[0]


def test_fp16_on_cpu_is_still_refused_without_the_test_switch():
    with pytest.raises(Exception, match="fp16"):
        precision.Precision("fp16", torch.device("cpu"))
