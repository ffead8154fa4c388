"""A run folder's record never lies: its first .hydra/ stays, every attempt is recorded, a
finished run is not rewritten and a resume under another seed is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from repro.runs.history import DIED

from conftest import read_summary, run_cli, tiny


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) and a hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def attempts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-epoch run in its own folder, and the command that made it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    command = [*tiny("trainer.checkpoint_every_steps=2"), f"hydra.run.dir={run_dir}"]
    done = run_cli("repro.train", *command)
    assert done.returncode == 0, done.stderr
    return run_dir, command


@pytest.mark.e2e
@pytest.mark.slow
def test_rerunning_a_finished_run_changes_no_file(finished):
    run_dir, command = finished
    before = snapshot(run_dir)
    done = run_cli("repro.train", *command)
    assert done.returncode == 0, done.stderr
    assert "already complete" in done.stdout
    assert snapshot(run_dir) == before


@pytest.mark.e2e
def test_a_resume_under_another_seed_is_refused_naming_both(finished):
    run_dir, command = finished
    before = snapshot(run_dir)
    done = run_cli("repro.train", *command, "seed=5")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "seed=5" in done.stderr and "seed=0" in done.stderr
    after = snapshot(run_dir)
    assert after.pop("train.log") != before.pop("train.log")  # the refusal is logged there
    assert after == before


@pytest.mark.e2e
@pytest.mark.slow
def test_a_shorter_config_is_refused(finished):
    _, command = finished
    done = run_cli("repro.train", *command, "trainer.max_steps=2")
    assert done.returncode == 2 and "cannot be shortened" in done.stderr
    assert "6 steps" in done.stderr and "asks for 2" in done.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_an_extension_keeps_the_first_record_and_adds_its_own(tmp_path):
    run_dir = tmp_path / "run"
    command = [*tiny(), f"hydra.run.dir={run_dir}"]
    assert run_cli("repro.train", *command).returncode == 0
    first_hydra = snapshot(run_dir / ".hydra")
    done = run_cli("repro.train", *command, "trainer.epochs=2")
    assert done.returncode == 0, done.stderr

    assert snapshot(run_dir / ".hydra") == first_hydra
    first, second = attempts(run_dir)
    assert (first["attempt"], first["config"], first["start_step"], first["end_step"]) == (
        1, ".hydra", 0, 6,
    )  # fmt: skip
    assert first["result"] == second["result"] == "completed"
    assert (second["config"], second["start_step"], second["end_step"]) == ("attempts/2", 6, 12)
    assert second["command"].endswith("trainer.epochs=2")
    assert "trainer.epochs=2" in yaml.safe_load((run_dir / "attempts/2/overrides.yaml").read_text())
    assert (
        yaml.safe_load((run_dir / "attempts/2/config.yaml").read_text())["trainer"]["epochs"] == 2
    )
    assert read_summary(run_dir)["step"] == 12


@pytest.mark.e2e
@pytest.mark.slow
def test_a_refused_first_try_leaves_hydra_to_the_first_attempt_that_trains(tmp_path):
    run_dir = tmp_path / "run"
    assert (
        run_cli("repro.train", *tiny("optimizer.lr=-1"), f"hydra.run.dir={run_dir}").returncode == 2
    )
    assert not (run_dir / "attempts.jsonl").exists()
    assert run_cli("repro.train", *tiny(), f"hydra.run.dir={run_dir}").returncode == 0
    overrides = yaml.safe_load((run_dir / ".hydra/overrides.yaml").read_text())
    assert "optimizer.lr=-1" not in overrides
    assert [a["config"] for a in attempts(run_dir)] == [".hydra"]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_attempt_is_marked_died_by_the_resume_which_is_recorded(tmp_path):
    run_dir = tmp_path / "run"
    command = [*tiny("trainer.checkpoint_every_steps=2"), f"hydra.run.dir={run_dir}"]
    killed = run_cli("repro.train", *command, env={"REPRO_FAULT": "step:3"})
    assert killed.returncode != 0
    assert [a["result"] for a in attempts(run_dir)] == ["running"]  # all SIGKILL leaves
    assert run_cli("repro.train", *command).returncode == 0
    first, second = attempts(run_dir)
    assert first["result"] == DIED and second["result"] == "completed"
    assert second["start_step"] == 2
    assert second["resumed_from"] == "checkpoints/last.pt"
    assert second["skipped_checkpoints"] == [] and first["resumed_from"] is None
