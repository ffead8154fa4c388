"""components.lookahead (a recipe): slow weights pulled towards the trained ones, trained on
from there; a component of the loop, by `_target_`."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from repro.core.errors import ConfigError
from repro.core.runs import resume
from repro.core.runs.checkpoint import load
from repro.extras.recipes.lookahead import Lookahead

from conftest import tiny, train_in_process


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))


def train_a_little(net: nn.Module) -> None:
    """Move every weight and the BatchNorm statistics, as a step would."""
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.add_(torch.randn_like(parameter))
    net(torch.randn(8, 4))  # running statistics and the step count move


def snapshot(net: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in net.state_dict().items()}


def test_pulls_come_on_the_cadence_and_at_the_last_step_and_the_model_trains_on_from_them():
    net = model()
    start = snapshot(net)
    lookahead = Lookahead(net, every=3, decay=0.75, ramp="constant", total_steps=7)
    for step in (1, 2):
        train_a_little(net)
        trained = snapshot(net)
        lookahead.pull(step)  # off the cadence: nothing moves
        assert all(torch.equal(net.state_dict()[name], trained[name]) for name in trained)
    train_a_little(net)
    trained = snapshot(net)
    lookahead.pull(3)
    for name, now in net.state_dict().items():
        if name.endswith("num_batches_tracked"):  # an integer: left to training
            assert torch.equal(now, trained[name])
        else:
            assert torch.allclose(now, 0.75 * start[name] + 0.25 * trained[name]), name
    pulled = {name: tensor.clone() for name, tensor in lookahead.state_dict().items()}
    train_a_little(net)
    lookahead.pull(7)  # the run's last step, off the cadence: pulled all the same
    slow = lookahead.state_dict()
    assert list(slow) == [name for name in net.state_dict() if "num_batches" not in name]
    assert not all(torch.equal(slow[name], pulled[name]) for name in slow)
    assert all(torch.equal(net.state_dict()[name], slow[name]) for name in slow)


def test_the_cubic_ramp_grows_from_no_pull_to_the_decay():
    lookahead = Lookahead(model(), every=5, decay=0.8, ramp="cubic", total_steps=100)
    assert [lookahead.decay_at(step) for step in (0, 50, 100)] == [0.0, 0.1, 0.8]
    assert Lookahead(model(), 100, every=5, decay=0.8, ramp="constant").decay_at(50) == 0.8


TARGET = "repro.extras.recipes.lookahead.Lookahead"
LOOKAHEAD = (f"+components.lookahead._target_={TARGET}", "+components.lookahead.every=4",
             "+components.lookahead.ramp=cubic")  # fmt: skip
RUN = tiny("trainer.epochs=2", *LOOKAHEAD)


@pytest.mark.slow
def test_a_run_with_lookahead_trains_otherwise_and_resumes_exactly_between_two_pulls(tmp_path):
    straight = train_in_process(tmp_path / "straight", *RUN)
    plain = train_in_process(tmp_path / "plain", *tiny("trainer.epochs=2"))
    assert straight["weights_sha256"] != plain["weights_sha256"]
    train_in_process(tmp_path / "resumed", *RUN, "trainer.halt_at_step=6")
    halted = load(tmp_path / "resumed" / "checkpoints" / "last.pt")
    # Step 6 is between the pulls at 4 and 8: the slow weights are not the model's.
    assert any(not torch.equal(slow, halted["model"][name]) for name, slow in
               halted["components"]["lookahead"].items())  # fmt: skip
    resumed = train_in_process(tmp_path / "resumed", *RUN)
    assert resumed["resumed_from_step"] == 6
    assert resumed["weights_sha256"] == straight["weights_sha256"]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("+components.lookahead.every=0", "every=0"),
        ("+components.lookahead.decay=1", "decay=1"),
        ("+components.lookahead.decay=-0.1", "decay=-0.1"),
        ("+components.lookahead.ramp=linear", "ramp='linear'"),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_component(override, said, tmp_path):
    target = f"+components.lookahead._target_={TARGET}"
    with pytest.raises(ConfigError, match=rf"components\.lookahead.*{re.escape(said)}.*allowed"):
        train_in_process(tmp_path, *tiny(target, override))


def test_a_config_recorded_with_the_old_trainer_keys_reads_as_the_component():
    trainer = {"epochs": 2, "lookahead_every": 5, "lookahead_decay": 0.7, "lookahead_ramp": "cubic"}
    old = {"trainer": trainer, "model": {"_target_": "repro.models.resnet9.ResNet9"}}
    upgraded = resume.upgrade(old)
    assert upgraded["components"] == {
        "lookahead": {"_target_": TARGET, "every": 5, "decay": 0.7, "ramp": "cubic"}
    }
    assert upgraded["trainer"] == {"epochs": 2}
    assert upgraded["model"]["_target_"] == "repro.extras.recipes.resnet9.ResNet9"
    off = resume.upgrade({"trainer": {"lookahead_every": None, "lookahead_decay": 0.5}})
    assert off == {"trainer": {}, "objective": off["objective"]} and "components" not in off


def test_a_checkpoint_from_before_components_resumes_its_lookahead(tmp_path):
    """Checkpoints once held the slow weights top-level, under `lookahead`."""
    net = model()
    written = Lookahead(net, 10, every=3)
    train_a_little(net)
    written.pull(3)
    from repro.core.watch.callbacks import Callbacks

    fresh = Lookahead(model(), 10, every=3)
    Callbacks(components={"lookahead": fresh}).load_components({"lookahead": written.state_dict()})
    assert all(torch.equal(a, b) for a, b in zip(fresh.slow, written.slow, strict=True))


def test_the_defaults_and_the_edges_of_each_setting():
    net = model()
    plain = Lookahead(net, total_steps=10)
    assert (plain.every, plain.decay, plain.ramp) == (5, 0.5, "constant")
    assert Lookahead(net, 10, every=1, decay=0.0).every == 1  # every step; a full pull
    refused = {
        "every": (0, True, 2.0),
        "decay": (1.0, -0.1),
        "ramp": ("linear",),
    }
    said = {
        "every": "allowed: an integer >= 1 (steps between pulls)",
        "decay": "allowed: a number in [0, 1)",
        "ramp": "allowed: constant | cubic",
    }
    for setting, values in refused.items():
        for value in values:
            with pytest.raises(ValueError) as error:
                Lookahead(net, 10, **{setting: value})
            assert str(error.value) == f"{setting}={value!r}: {said[setting]}"


def test_as_a_component_it_pulls_after_the_loops_optimizer_steps():
    from types import SimpleNamespace

    net = model()
    lookahead = Lookahead(net, total_steps=4, every=2, decay=0.5)
    start = snapshot(net)
    train_a_little(net)
    trained = snapshot(net)
    lookahead.after_step(SimpleNamespace(state=SimpleNamespace(position=SimpleNamespace(step=2))))
    weight = net.state_dict()["0.weight"]
    assert torch.allclose(weight, 0.5 * start["0.weight"] + 0.5 * trained["0.weight"])
