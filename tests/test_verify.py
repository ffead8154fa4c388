"""repro.verify: identical on an untouched run; names the first divergent step otherwise."""

from __future__ import annotations

import json

import pytest

from repro.core.engine.loop import Trainer
from repro.core.runtime import threads
from repro.verify import command as verify

from conftest import run_cli, tiny, train_in_process

RUN = tiny("trainer.epochs=2", "logger.fingerprint_every_steps=3")


@pytest.fixture
def recorded(tmp_path):
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *RUN)
    return run_dir


@pytest.mark.e2e
@pytest.mark.slow
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
    original = Trainer.train_step

    def nudged(self, images, labels):
        if self.state.position.step == 6:  # the 7th step sees one wrong label
            labels = labels.clone()
            labels[0] = (labels[0] + 1) % 10
        return original(self, images, labels)

    monkeypatch.setattr(Trainer, "train_step", nudged)
    verdict = verify.verify(recorded)
    assert verdict.divergence.startswith("step 7: loss"), verdict.divergence


@pytest.mark.slow  # the order and marks: test_verify_units; here, through a real rerun
def test_environment_differences_are_reported_those_that_change_results_first(recorded):
    summary_path = recorded / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["env"]["python"] = "0.0"
    summary["env"]["cpu_capability"] = "NONE"
    summary["env"]["packages"]["rich"] = "0.0"
    summary_path.write_text(json.dumps(summary))
    verdict = verify.verify(recorded, steps=2)
    assert verdict.identical
    keys = [change.split(":")[0] for change in verdict.environment]
    assert keys == ["cpu_capability", "packages.rich", "python"]
    marked = [change.endswith("(changes floating-point results)") for change in verdict.environment]
    assert marked == [True, False, False]


def test_the_rerun_uses_the_recorded_thread_count_unless_told(tmp_path, monkeypatch):
    run_dir = tmp_path / "one-thread"
    train_in_process(run_dir, *RUN, "trainer.num_threads=1")
    applied = []
    original = threads.apply
    monkeypatch.setattr(threads, "apply", lambda n: applied.append(n) or original(n))
    assert verify.verify(run_dir, steps=2).identical
    told = verify.verify(run_dir, steps=2, threads=2)
    assert applied == [1, 2]
    assert any(c.startswith("num_threads: 1 recorded, 2 now") for c in told.environment)


@pytest.mark.e2e
@pytest.mark.slow
def test_bad_arguments(recorded, tmp_path):
    assert run_cli("repro.verify", str(tmp_path / "nope")).returncode == 2
    done = run_cli("repro.verify", str(recorded), "steps=999")
    assert done.returncode == 2 and "steps=" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("repro.verify", str(recorded), "threads=0")
    assert done.returncode == 2 and "threads=N with N >= 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_run_recorded_before_newer_keys_existed_verifies(recorded):
    resolved = recorded / "resolved_config.yaml"
    lines = resolved.read_text().splitlines(keepends=True)
    newer = ("  tta:", "  cutout:", "  init_weights:", "  decay_biases_and_norms:", "  flip:",
             "  lr_scale_biases_and_norms:", "  crop_padding_mode:",
             "  profile_steps:")  # fmt: skip
    resolved.write_text("".join(line for line in lines if not line.startswith(newer)))
    assert "tta" not in resolved.read_text()
    assert verify.verify(recorded, steps=2).identical
