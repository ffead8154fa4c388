"""repro.verify: identical on an untouched run; names the first divergent step otherwise."""

from __future__ import annotations

import pytest

from repro import verify
from repro.engine.loop import Trainer

from conftest import run_cli, tiny, train_in_process

RUN = tiny("trainer.epochs=2", "logger.fingerprint_every_steps=3")


@pytest.fixture
def recorded(tmp_path):
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *RUN)
    return run_dir


def test_untouched_run_is_identical_on_the_command_line(recorded):
    done = run_cli("repro.verify", str(recorded))
    assert done.returncode == 0, done.stderr
    assert "identical: 12 steps" in done.stdout
    partial = run_cli("repro.verify", str(recorded), "steps=5")
    assert partial.returncode == 0 and "identical: 5 steps" in partial.stdout


def test_changed_data_is_named_before_any_step(recorded):
    resolved = recorded / "resolved_config.yaml"
    resolved.write_text(resolved.read_text().replace("generator_seed: 0", "generator_seed: 1"))
    verdict = verify.verify(recorded)
    assert not verdict.identical and verdict.steps_compared == 0
    assert verdict.divergence.startswith("the data")
    assert [line.split(":")[0] for line in verdict.data] == ["train", "val", "test"]


def test_changed_code_is_caught_at_the_step_it_changes(recorded, monkeypatch):
    original = Trainer._train_step

    def nudged(self, images, labels):
        if self.position.step == 6:  # the 7th step sees one wrong label
            labels = labels.clone()
            labels[0] = (labels[0] + 1) % 10
        return original(self, images, labels)

    monkeypatch.setattr(Trainer, "_train_step", nudged)
    verdict = verify.verify(recorded)
    assert verdict.divergence.startswith("step 7: loss"), verdict.divergence


def test_environment_differences_are_reported(recorded):
    summary = recorded / "summary.json"
    summary.write_text(summary.read_text().replace('"torch": "', '"torch": "0.0-'))
    verdict = verify.verify(recorded, steps=2)
    assert verdict.identical
    assert any(change.startswith("torch:") for change in verdict.environment)


def test_bad_arguments(recorded, tmp_path):
    assert run_cli("repro.verify", str(tmp_path / "nope")).returncode == 2
    done = run_cli("repro.verify", str(recorded), "steps=999")
    assert done.returncode == 2 and "steps=" in done.stderr and "Traceback" not in done.stderr
