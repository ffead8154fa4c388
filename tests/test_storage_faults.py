"""A file system that refuses the run (full, read-only, over quota) is one line naming the path
and the cause; the attempt is marked failed, what is on disk stays intact, and once space is
freed the same command resumes to the uninterrupted weights."""

from __future__ import annotations

import errno
import json
import os

import pytest

from repro.engine import checkpoint
from repro.engine.fingerprint_log import FingerprintLog
from repro.errors import StorageError
from repro.files import complete_lines, write_text_atomic

from conftest import read_summary, run_cli, tiny, train_in_process

COMMAND = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2", "model.widths=[8,16]")


def test_a_refused_atomic_write_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    write_text_atomic(path, "old\n")

    def quota_exceeded(fd: int) -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(os, "fsync", quota_exceeded)  # the new text is written, not yet safe
    with pytest.raises(StorageError, match=r"cannot write .*record\.json: .* \(EDQUOT\)$"):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_last_line_torn_by_a_full_disk_is_dropped():
    assert complete_lines("1,0.5,\n2,0.4") == "1,0.5,\n"
    assert complete_lines("1,0.5,\n") == "1,0.5,\n"
    assert complete_lines("1,0.") == ""


def test_a_resume_drops_a_torn_fingerprint_line_and_stays_exact(tmp_path):
    straight = train_in_process(tmp_path / "straight", *COMMAND)
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *COMMAND, "trainer.halt_at_step=4")
    log = FingerprintLog.of_run(run_dir)
    with log.path.open("a") as handle:
        handle.write("5,0.12")  # a full disk cut this append short
    resumed = train_in_process(run_dir, *COMMAND)
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert [row.step for row in log.read()] == list(range(1, resumed["total_steps"] + 1))


@pytest.mark.e2e
def test_a_disk_that_fills_during_a_checkpoint_is_one_line_and_resumable(tmp_path):
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "run"
    done = run_cli("repro.train", *COMMAND, f"hydra.run.dir={straight_dir}")
    assert done.returncode == 0, done.stderr

    command = [*COMMAND, f"hydra.run.dir={run_dir}"]
    full = run_cli("repro.train", *command, env={"REPRO_FAULT": "checkpoint:8:ENOSPC"})
    assert full.returncode == 2
    assert "Traceback" not in full.stderr + full.stdout
    (line,) = full.stderr.strip().splitlines()
    step_file = run_dir / "checkpoints" / "step-00000008.pt"
    assert line.startswith(f"error: cannot write {step_file}: {os.strerror(errno.ENOSPC)} (ENOSPC)")
    assert "run the same command to resume" in line
    (attempt,) = (
        json.loads(text) for text in (run_dir / "attempts.jsonl").read_text().splitlines()
    )
    assert attempt["result"].startswith("failed: cannot write") and attempt["end_step"] >= 8
    # What was on disk is whole: no temporary file, every checkpoint loads, last.pt at step 6.
    folder = run_dir / "checkpoints"
    assert not list(folder.glob(".*.tmp")) and not step_file.exists()
    assert all(checkpoint.load(path) for path in folder.glob("*.pt"))
    assert checkpoint.load(folder / "last.pt")["position"]["step"] == 6

    resumed = run_cli("repro.train", *command)  # space freed: the same command
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 6
    assert summary["weights_sha256"] == read_summary(straight_dir)["weights_sha256"]
