"""trainer.grad_clip and trainer.label_smoothing reach the training step."""

from __future__ import annotations

import torch

from repro import build

from conftest import compose_config, tiny, train_in_process

RUN = tiny("trainer.max_steps=3", "optimizer.weight_decay=0")


def largest_move(run_dir, overrides) -> float:
    """How far any parameter moved from its (seeded) initial value."""
    start = build.model(compose_config(*overrides), 0).state_dict()
    final = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    names = [name for name, _ in build.model(compose_config(*overrides), 0).named_parameters()]
    return max((final[name] - start[name]).abs().max().item() for name in names)


def test_grad_clip_bounds_the_update(tmp_path):
    free = train_in_process(tmp_path / "free", *RUN)
    clipped = train_in_process(tmp_path / "clipped", *RUN, "trainer.grad_clip=1e-9")
    assert free["weights_sha256"] != clipped["weights_sha256"]
    assert largest_move(tmp_path / "free", RUN) > 1e-3
    assert largest_move(tmp_path / "clipped", RUN) < 1e-6


def test_label_smoothing_changes_the_loss_and_the_weights(tmp_path):
    plain = train_in_process(tmp_path / "plain", *RUN)
    smooth = train_in_process(tmp_path / "smooth", *RUN, "trainer.label_smoothing=0.5")
    assert smooth["weights_sha256"] != plain["weights_sha256"]
    assert smooth["train_loss"] != plain["train_loss"]
