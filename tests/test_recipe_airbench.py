"""experiment=cifar10_airbench as airbench94 trains: every image, its test-time views, its
whitening bias frozen after 3 epochs, its triangle and its 9.9 epochs, each undone by one key
(the ablations docs/benchmarks.md lists for a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from repro.core import tasks
from repro.core.engine.evaluation import predict
from repro.core.engine.schedules import warmup_linear
from repro.core.errors import ConfigError
from repro.core.runs.checkpoint import load
from repro.core.runs.position import Position
from repro.extras.recipes.schedules import triangle
from repro.extras.recipes.whitened_cnn import WhitenBiasFreeze, WhitenedCNN

from conftest import compose_config, train_in_process

# The recipe on a little synthetic data, on the CPU: 4 steps an epoch.
SMALL = [
    "experiment=cifar10_airbench",
    "data=synthetic",
    "data.train_size=256",
    "data.test_size=64",
    "trainer.batch_size=64",
    "trainer.epochs=2",
    "model.widths=[8,16,16]",
    "model.fit_images=64",
    "trainer.device=cpu",
    "amp=off",
    "memory_format=contiguous",
    "optimizer.fused=false",
    "logger.plot=false",
]


def test_the_recipe_trains_on_every_image_and_tests_its_last_weights_as_airbench94_does():
    cfg = compose_config("experiment=cifar10_airbench")
    assert (cfg.data.val_size, cfg.trainer.test_weights, cfg.trainer.tta) == (
        0,
        "last",
        "flip_translate",
    )
    assert cfg.components.whiten_bias.epochs == 3
    assert (cfg.scheduler.warmup, cfg.scheduler.start, cfg.scheduler.end) == (0.23, 0.2, 0.07)
    assert cfg.trainer.max_steps == 476 == -(-48 * 99 // 10)  # ceil(50,000 // 1024 * 9.9)
    tasks.check_config(cfg)
    best = compose_config("experiment=cifar10_airbench", "trainer.test_weights=best")
    with pytest.raises(ConfigError, match="no validation split") as refused:
        tasks.check_config(best)
    assert "\n" not in str(refused.value)
    held_out = compose_config(
        "experiment=cifar10_airbench", "data.val_size=5000", "trainer.test_weights=best"
    )
    tasks.check_config(held_out)  # the ablation that holds images out to pick the weights


def shifted(images: torch.Tensor, by: int) -> torch.Tensor:
    """Each image's rows and columns i taken from i + by, mirrored at the edge without
    repeating the border (as reflect padding does): by indexing, not padding."""
    size = images.shape[-1]
    reflect = [abs(i) if i < size else 2 * (size - 1) - i for i in range(by, size + by)]
    index = torch.tensor(reflect)
    return images[..., index, :][..., :, index]


def test_translated_views_are_airbenchs_weighted_average_and_not_the_flips_alone():
    torch.manual_seed(0)
    model = WhitenedCNN(widths=(8, 16, 16))
    model.fit_to_data(torch.randn(64, 3, 32, 32))
    model.eval()
    images = torch.randn(4, 3, 32, 32)
    flip = predict(model, images, "flip")
    views = predict(model, images, "flip_translate")
    assert not torch.allclose(views, flip, atol=1e-4)

    def mirrored(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return (model(x) + model(x.flip(-1))) / 2

    # airbench94's level 2: half the flip average, a quarter each shifted one's.
    expected = mirrored(images) / 2 + mirrored(shifted(images, 1)) / 4
    expected += mirrored(shifted(images, -1)) / 4
    assert torch.allclose(views, expected, atol=1e-5)


def test_the_triangle_starts_peaks_and_ends_where_airbench_puts_them():
    parameter = torch.nn.Parameter(torch.zeros(1))

    def factors(schedule: type, **options: float) -> list[float]:
        optimizer = torch.optim.SGD([parameter], lr=1.0)
        scheduler = schedule(optimizer, total_steps=476, **options)
        seen = []
        for _ in range(476):
            seen.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return seen

    lr = factors(triangle, warmup=0.23)
    peak = int(0.23 * 476)  # 109: airbench's int(), not round() (110)
    assert lr[0] == pytest.approx(0.2) and lr[peak] == pytest.approx(1.0)
    assert lr[peak // 2] == pytest.approx(0.2 + 0.8 * (peak // 2) / peak)
    assert lr[-1] == pytest.approx(1 - 0.93 * 366 / 367)  # one step before 0.07
    assert max(lr) == lr[peak]
    plain = factors(triangle, warmup=0.23, start=0.0, end=0.0)  # the ablation
    assert plain[0] == 0.0 and plain[-1] == pytest.approx(1 / 367)
    linear = factors(warmup_linear, warmup=0.23)
    assert max(abs(a - b) for a, b in zip(plain, linear, strict=True)) < 0.01
    with pytest.raises(ValueError, match=r"start=1\.5"):
        triangle(torch.optim.SGD([parameter], lr=1.0), 10, start=1.5)


def loop_at(position: Position, world: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        state=SimpleNamespace(position=position), dist=SimpleNamespace(world=world)
    )


def whitening_bias_over(epochs: int | None, steps: int = 6, per_epoch: int = 3) -> list:
    """The whitening bias after each of `steps` SGD steps (momentum, weight decay) of a small
    model, `WhitenBiasFreeze(epochs)` called as the loop calls it."""
    torch.manual_seed(0)
    model = WhitenedCNN(widths=(8, 16, 16))
    model.fit_to_data(torch.randn(64, 3, 32, 32))
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad],
        lr=0.1,
        momentum=0.9,
        weight_decay=0.1,
    )
    freeze, position = WhitenBiasFreeze(model, steps, epochs), Position()
    freeze.at_start(loop_at(position))
    seen = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(8, 3, 32, 32)).logsumexp(1).mean().backward()
        optimizer.step()
        position.advance(per_epoch)
        freeze.after_step(loop_at(position))
        seen.append((model[0].bias.detach().clone(), model[0].bias.requires_grad))
    return seen


def test_the_whitening_bias_trains_for_its_epochs_then_stays_as_it_was():
    frozen = whitening_bias_over(epochs=1)
    biases = [bias for bias, _ in frozen]
    assert not torch.equal(biases[0], biases[1])  # trained in the first epoch
    assert [trains for _, trains in frozen] == [True, True, False, False, False, False]
    assert all(torch.equal(biases[2], later) for later in biases[3:])  # momentum and decay too
    always = [bias for bias, _ in whitening_bias_over(epochs=None)]
    assert not torch.equal(always[2], always[-1])  # the switch off: it goes on training
    assert all(trains for _, trains in whitening_bias_over(epochs=None))


def test_a_resumed_run_past_the_epochs_freezes_the_bias_and_torchrun_is_refused():
    model = WhitenedCNN(widths=(8, 16, 16))
    freeze = WhitenBiasFreeze(model, 100, epochs=3)
    freeze.load_state_dict(freeze.state_dict())
    freeze.at_start(loop_at(Position(epoch=3, step=30)))
    assert not model[0].bias.requires_grad
    with pytest.raises(ConfigError, match=r"components\.whiten_bias\.epochs=3"):
        freeze.at_start(loop_at(Position(), world=2))
    WhitenBiasFreeze(model, 100, epochs=None).at_start(loop_at(Position(), world=2))
    for wrong in (-1, 1.5, True):
        with pytest.raises(ValueError, match="an integer >= 0"):
            WhitenBiasFreeze(model, 100, epochs=wrong)
    with pytest.raises(ValueError, match="no PatchWhitening"):
        WhitenBiasFreeze(torch.nn.Linear(2, 2), 100)


@pytest.mark.slow  # the freeze by position and a resume's at_start have unit tests above
def test_the_recipe_freezes_the_whitening_bias_across_a_resume(tmp_path):
    # Lookahead off: it would still pull the frozen bias towards its slow copy, as airbench's.
    run = (*SMALL, "components.lookahead=null", "components.whiten_bias.epochs=1")
    train_in_process(tmp_path / "frozen", *run, "trainer.halt_at_step=4")  # epoch 1's end
    last = tmp_path / "frozen" / "checkpoints" / "last.pt"
    after_epoch = load(last)["model"]["0.bias"]
    summary = train_in_process(tmp_path / "frozen", *run)  # resumed: epoch 2 frozen
    assert summary["completed"] and summary["total_steps"] == 8
    assert torch.equal(load(last)["model"]["0.bias"], after_epoch)
    trained = train_in_process(tmp_path / "trained", *run, "components.whiten_bias.epochs=null")
    assert trained["weights_sha256"] != summary["weights_sha256"]
    assert not torch.equal(
        load(tmp_path / "trained" / "checkpoints" / "last.pt")["model"]["0.bias"], after_epoch
    )
