"""Killed at any moment and resumed with the same command, a run ends with the same weights."""

from __future__ import annotations

import signal

import pytest

from conftest import read_summary, run_cli, tiny

# 6 batches per epoch, 2 epochs, a checkpoint every 4 steps: kills land between checkpoints,
# on one, right after an epoch end and while a checkpoint file is being written.
RESUMABLE = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=4", "logger.plot=false")


@pytest.fixture(scope="module")
def straight_hash(tmp_path_factory):
    """weights_sha256 of an uninterrupted run for a number of workers, each run once, when asked.

    Lazily: `make test` runs only the SIGTERM case, which needs the run without workers.
    """
    hashes = {}

    def of(workers: int) -> str:
        if workers not in hashes:
            run_dir = tmp_path_factory.mktemp("straight") / f"w{workers}"
            command = [*RESUMABLE, f"dataloader.num_workers={workers}", f"hydra.run.dir={run_dir}"]
            done = run_cli("repro.train", *command)
            assert done.returncode == 0, done.stderr
            hashes[workers] = read_summary(run_dir)["weights_sha256"]
        return hashes[workers]

    return of


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("workers", "fault"),
    [
        (0, "step:5"),  # mid-epoch, a step after a checkpoint
        (0, "step:7"),  # right after the epoch-end checkpoint at step 6
        (0, "checkpoint:8"),  # while step 8's checkpoint is half written
        (2, "step:5"),  # a step after the first checkpoint, as every case here is
        (2, "step:10"),  # mid-second-epoch
        (2, "checkpoint:6"),  # while the epoch-end checkpoint is half written
    ],
)
@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_weights(
    workers, fault, straight_hash, tmp_path
):
    run_dir = tmp_path / "run"
    command = [*RESUMABLE, f"dataloader.num_workers={workers}", f"hydra.run.dir={run_dir}"]
    killed = run_cli("repro.train", *command, env={"REPRO_FAULT": fault})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (run_dir / "summary.json").exists()

    resumed = run_cli("repro.train", *command)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["weights_sha256"] == straight_hash(workers)
    kill_step = int(fault.split(":")[1])
    if kill_step >= 4:
        assert summary["resumed_from_step"] is not None
        assert summary["resumed_from_step"] <= kill_step
    steps = [int(line.split(",")[0]) for line in (run_dir / "fingerprints.csv").read_text().split()]
    assert steps == list(range(1, summary["total_steps"] + 1)), "one fingerprint per step"
    assert not list((run_dir / "checkpoints").glob(".*.tmp")), "half-written files are cleared"


@pytest.mark.e2e
@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_resume_is_exact(straight_hash, tmp_path):
    run_dir = tmp_path / "run"
    command = [*RESUMABLE, "dataloader.num_workers=0", f"hydra.run.dir={run_dir}"]
    stopped = run_cli("repro.train", *command, env={"REPRO_FAULT": "step:5:SIGTERM"})
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    summary = read_summary(run_dir)
    assert summary["stopped_by_signal"] == signal.SIGTERM and not summary["completed"]
    assert summary["step"] == 5  # the step the signal arrived in, between checkpoints 4 and 6
    assert (run_dir / "checkpoints" / "step-00000005.pt").exists()

    resumed = run_cli("repro.train", *command)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 5
    assert summary["weights_sha256"] == straight_hash(0)
