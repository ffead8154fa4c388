"""+components=ema: a weight average, evaluated beside the weights, testable, resumed exactly."""

from __future__ import annotations

import csv
import re
import signal

import pytest
import torch

from repro.core.errors import ConfigError
from repro.core.runs import resume
from repro.extras.components.ema import WeightAverage

from conftest import read_summary, run_cli, tiny, train_in_process

TWO_EPOCHS = tiny("trainer.epochs=2", "trainer.eval_every_steps=2")


def rows(run_dir) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_ema_follows_the_weights_with_one_multi_tensor_update():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    average = WeightAverage(model, decay=0.75)
    before = [p.clone() for p in average.model.parameters()]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    model(torch.randn(4, 3))  # BatchNorm's running statistics and step count move
    average.update()
    for old, new, current in zip(
        before, average.model.parameters(), model.parameters(), strict=True
    ):
        assert torch.allclose(new, 0.75 * old + 0.25 * current)
    assert average.model[1].num_batches_tracked == model[1].num_batches_tracked == 1
    assert torch.allclose(average.model[1].running_mean, 0.25 * model[1].running_mean)


def test_ema_is_evaluated_beside_the_weights_and_can_be_tested(tmp_path):
    summary = train_in_process(
        tmp_path, *TWO_EPOCHS, "+components=ema", "components.ema.decay=0.9",
        "trainer.test_weights=ema", "trainer.monitor=ema_val_acc",
    )  # fmt: skip
    evaluations = rows(tmp_path)
    assert all(row["ema_val_acc"] != "" for row in evaluations)
    assert any(row["ema_val_acc"] != row["val_acc"] for row in evaluations)
    assert summary["test_weights"] == "ema" and "best_ema_val_acc" in summary


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["+components=ema", "components.ema.decay=1.5"], "decay=1.5"),
        (["+components=ema", "components.ema.decay=0"], "decay=0"),
        (["trainer.test_weights=ema"], "trainer.test_weights"),
        (["trainer.monitor=ema_val_acc"], "trainer.monitor"),
    ],
)
def test_an_average_that_cannot_work_or_is_missing_is_refused(overrides, said, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(said)):
        train_in_process(tmp_path, *tiny(*overrides))


def test_a_config_recorded_with_trainer_ema_decay_reads_as_the_component():
    upgraded = resume.upgrade({"trainer": {"ema_decay": 0.99, "epochs": 2}})
    assert upgraded["components"] == {"ema": {"_target_": resume.AVERAGE, "decay": 0.99}}
    assert upgraded["trainer"] == {"epochs": 2}
    assert "components" not in resume.upgrade({"trainer": {"ema_decay": None}})


EMA_ACCUMULATE = tiny(
    "trainer.epochs=2", "trainer.checkpoint_every_steps=4", "+components=ema",
    "components.ema.decay=0.99", "trainer.accumulate_steps=2",
)  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_ema_and_accumulation_resume_exactly_after_a_kill(workers, tmp_path):
    command = [*EMA_ACCUMULATE, f"dataloader.num_workers={workers}"]
    straight = run_cli("repro.train", *command, f"hydra.run.dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr
    run_dir = tmp_path / "killed"
    killed = run_cli(
        "repro.train", *command, f"hydra.run.dir={run_dir}", env={"REPRO_FAULT": "step:9"}
    )
    assert killed.returncode == -signal.SIGKILL
    resumed = run_cli("repro.train", *command, f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr
    expected, summary = read_summary(tmp_path / "straight"), read_summary(run_dir)
    assert summary["resumed_from_step"] == 8
    assert summary["weights_sha256"] == expected["weights_sha256"]
    for key in ("best_val_acc", "best_step", "test_acc", "ema_val_acc"):
        assert summary[key] == expected[key], key


@pytest.mark.parametrize("decay", [1, 1.0, "0.5", True, 0.0])
def test_a_decay_outside_the_open_unit_interval_is_refused_word_for_word(decay):
    with pytest.raises(ValueError) as refused:
        WeightAverage(torch.nn.Linear(3, 2), decay=decay)
    assert str(refused.value) == f"decay={decay!r}: allowed: a number in (0, 1)"


def test_the_average_is_a_frozen_copy_that_restores_its_state():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    average = WeightAverage(model)
    assert average.decay == 0.999 and not average.model.training
    assert not any(p.requires_grad for p in average.model.parameters())  # no gradient, ever
    assert all(p.requires_grad for p in model.parameters())  # the trained model's untouched
    with torch.no_grad():
        model[0].weight.add_(1.0)
    average.update()
    restored = WeightAverage(model)
    restored.load_state_dict(average.state_dict())
    for mine, theirs in zip(restored.model.state_dict().values(),
                            average.model.state_dict().values(), strict=True):  # fmt: skip
        assert torch.equal(mine, theirs)
