"""trainer.grad_clip, objective.label_smoothing and optimizer.decay_biases_and_norms reach the
training step."""

from __future__ import annotations

import torch

from repro.core import build
from repro.core.runtime.precision import Precision

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
    smooth = train_in_process(tmp_path / "smooth", *RUN, "objective.label_smoothing=0.5")
    assert smooth["weights_sha256"] != plain["weights_sha256"]
    assert smooth["train_loss"] != plain["train_loss"]


def test_biases_and_norm_weights_can_be_left_out_of_weight_decay():
    lr, decay = 0.5, 0.1
    for decay_all in (True, False):
        cfg = compose_config(f"optimizer.decay_biases_and_norms={decay_all}", f"optimizer.lr={lr}",
                             f"optimizer.weight_decay={decay}", "optimizer.momentum=0",
                             "optimizer.nesterov=false")  # fmt: skip
        model = build.model(cfg, 0)
        assert any(p.ndim == 1 for p in model.parameters()), "BatchNorm weights and biases"
        optimizer = build.optimizer(cfg, model, Precision("off", torch.device("cpu")))
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)  # what moves them is the decay alone
        optimizer.step()
        for name, parameter in model.named_parameters():
            decayed = decay_all or parameter.ndim > 1
            expected = before[name] * (1 - lr * decay) if decayed else before[name]
            assert torch.allclose(parameter, expected, rtol=0, atol=1e-7), (decay_all, name)


def test_biases_and_norm_weights_can_take_a_larger_step_at_the_same_decay_per_step():
    lr, decay, scale = 0.5, 0.1, 4.0
    cfg = compose_config(f"optimizer.lr_scale_biases_and_norms={scale}", f"optimizer.lr={lr}",
                         f"optimizer.weight_decay={decay}", "optimizer.momentum=0",
                         "optimizer.nesterov=false")  # fmt: skip
    model = build.model(cfg, 0)
    frozen = model.get_parameter(next(n for n, p in model.named_parameters() if p.ndim > 1))
    frozen.requires_grad_(False)  # a fixed layer: no optimizer state, never moved
    optimizer = build.optimizer(cfg, model, Precision("off", torch.device("cpu")))
    assert all(p is not frozen for group in optimizer.param_groups for p in group["params"])
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    for name, parameter in model.named_parameters():
        if parameter is frozen:
            assert torch.equal(parameter, before[name])
            continue
        step = lr * scale if parameter.ndim == 1 else lr
        expected = before[name] - step - lr * decay * before[name]  # the same decay either way
        assert torch.allclose(parameter, expected, rtol=0, atol=1e-6), name


def test_leaving_norms_out_of_decay_trains_otherwise_and_resumes_exactly(tmp_path):
    run = tiny("trainer.epochs=2", "optimizer.decay_biases_and_norms=false")
    straight = train_in_process(tmp_path / "straight", *run)
    assert straight["weights_sha256"] != train_in_process(tmp_path / "all", *tiny(
        "trainer.epochs=2"))["weights_sha256"]  # fmt: skip
    train_in_process(tmp_path / "resumed", *run, "trainer.halt_at_step=7")
    resumed = train_in_process(tmp_path / "resumed", *run)
    assert resumed["resumed_from_step"] == 7
    assert resumed["weights_sha256"] == straight["weights_sha256"]
