"""PYTHONHASHSEED is fixed before the training interpreter starts, and a user's value wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, read_summary, tiny


def run_without_hash_seed(run_dir, value: str | None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if value is not None:
        env["PYTHONHASHSEED"] = value
    overrides = [*tiny("trainer.max_steps=1"), f"hydra.run.dir={run_dir}"]
    command = [sys.executable, "-m", "repro.train", *overrides]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return read_summary(run_dir)["env"]["pythonhashseed"]


# Two trainings in processes of their own: in test-all. make test keeps the re-exec itself
# (test_launch.py) and the value recorded (test_seeding.py, test_environment.py).
@pytest.mark.e2e
@pytest.mark.slow
def test_entry_point_pins_the_hash_seed_and_respects_the_users(tmp_path):
    assert run_without_hash_seed(tmp_path / "unset", None) == "0"
    assert run_without_hash_seed(tmp_path / "user", "123") == "123"
