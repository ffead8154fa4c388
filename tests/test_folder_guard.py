"""Writes into a run or sweep folder never leave it: a folder with a link out of it (a symlink,
or a hard link to a file written in place) is refused in one line before anything is written,
run.lock included, and the files the links point to stay as they were."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from repro.core.guards import folders
from repro.core.guards.folders import UnsafeFolderError
from repro.core.runs import history, run_lock

from conftest import run_cli, tiny, train_in_process

HALTED = tiny("trainer.checkpoint_every_steps=2", "trainer.halt_at_step=3")
LINKED = ("run.lock", "metrics.csv", "train.log", "checkpoints")  # replaced by links out


def outside_state(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder`: its bytes and modification time (links are not followed)."""
    state = {}
    for parent, _, files in os.walk(folder):
        for name in files:
            path = Path(parent) / name
            state[str(path.relative_to(folder))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return state


def refused(text: str):
    """Expect an UnsafeFolderError whose message holds `text`."""
    return pytest.raises(UnsafeFolderError, match=re.escape(text))


def names(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "step-00000002.pt").write_bytes(b"weights")
    os.link(folder / "checkpoints" / "step-00000002.pt", folder / "checkpoints" / "last.pt")
    (folder / "metrics.csv").write_text("step,val_acc\n")
    (folder / "wandb" / "run-1").mkdir(parents=True)
    (folder / "wandb" / "latest-run").symlink_to("run-1")  # inside: what wandb makes
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "file").write_text("not the run's\n")
    return folder


def test_a_clean_folder_a_link_inside_it_and_a_missing_folder_pass(run_dir, tmp_path):
    folders.check(run_dir)  # last.pt's hard link and wandb's latest-run included
    folders.check(tmp_path / "not yet made")
    folders.check_sweep(tmp_path / "elsewhere")


@pytest.mark.parametrize(
    "link", ["metrics.csv", "run.lock", "train.log", "checkpoints/", "attempts/", ".hydra/"]
)
def test_a_link_out_of_the_folder_is_refused_naming_it(run_dir, tmp_path, link):
    elsewhere = tmp_path / "elsewhere"
    path = run_dir / link.rstrip("/")
    if path.is_dir():
        shutil.rmtree(path)
    path.unlink(missing_ok=True)
    path.symlink_to(elsewhere if link.endswith("/") else elsewhere / "file")
    with refused(f"{path.name} is a link to {elsewhere}"):
        folders.check(run_dir)


def test_a_dangling_link_out_and_one_deep_inside_are_refused(run_dir, tmp_path):
    (run_dir / "run.lock").symlink_to(tmp_path / "elsewhere" / "run.lock")  # not there yet
    with refused("run.lock is a link to"):
        folders.check(run_dir)
    (run_dir / "run.lock").unlink()
    (run_dir / "checkpoints" / "best.pt").symlink_to("../../elsewhere/file")
    with refused("checkpoints/best.pt is a link to"):
        folders.check(run_dir)


def test_a_file_written_in_place_with_another_hard_link_is_refused(run_dir, tmp_path):
    (run_dir / "metrics.csv").unlink()
    os.link(tmp_path / "elsewhere" / "file", run_dir / "metrics.csv")
    with refused("metrics.csv has another hard link"):
        folders.check(run_dir)


def test_a_sweep_whose_job_folder_is_a_link_out_is_refused(run_dir, tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "1").mkdir(parents=True)
    (sweep / "0").symlink_to(run_dir)
    with refused(f"0 is a link to {run_dir}, outside the sweep"):
        folders.check_sweep(sweep)


def test_claims_and_training_refuse_an_unsafe_folder_writing_nothing(run_dir, tmp_path):
    lock = tmp_path / "elsewhere" / "run.lock"
    (run_dir / "run.lock").symlink_to(lock)
    before = names(run_dir)
    with pytest.raises(UnsafeFolderError):
        run_lock.try_claim(run_dir)
    assert history.record_subdir(str(run_dir)) is None  # Hydra writes no .hydra/ there
    with refused("run.lock is a link to"):
        train_in_process(run_dir, *tiny())
    assert not lock.exists() and names(run_dir) == before


def _replace_by_links(run_dir: Path, outside: Path) -> None:
    """Move LINKED out of `run_dir` into `outside` and leave symlinks to them in their place
    (run.lock, which a run removes on leaving, dangling)."""
    outside.mkdir()
    for name in LINKED:
        if (run_dir / name).exists():
            shutil.move(run_dir / name, outside / name)
        (run_dir / name).symlink_to(outside / name)


@pytest.fixture(scope="module")
def halted(tmp_path_factory) -> Path:
    """A real run's folder, halted after its checkpoint at step 2 (resumable)."""
    run_dir = tmp_path_factory.mktemp("halted") / "run"
    done = run_cli("repro.train", *HALTED, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr
    folders.check(run_dir)  # a real run's folder passes: last.pt's hard link included
    return run_dir


def one_error_line(done) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.e2e
@pytest.mark.slow
def test_rerunning_a_copied_run_with_links_out_changes_nothing_outside(halted, tmp_path):
    copy, outside = tmp_path / "copy", tmp_path / "outside"
    shutil.copytree(halted, copy, symlinks=True)
    _replace_by_links(copy, outside)
    before, copied = outside_state(outside), names(copy)
    line = one_error_line(run_cli("repro.train", *HALTED, f"hydra.run.dir={copy}"))
    assert line.startswith(f"error: {copy}: ")
    assert any(f": {name} is a link to {outside / name}, outside" in line for name in LINKED)
    assert outside_state(outside) == before  # nothing written, truncated or made outside
    assert not (outside / "run.lock").exists() and names(copy) == copied


@pytest.mark.e2e
@pytest.mark.slow
def test_a_multirun_into_a_sweep_whose_job_folder_links_out_changes_nothing(halted, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "0").symlink_to(halted)
    before = outside_state(halted)
    command = ["-m", *HALTED, "seed=0,1", f"hydra.sweep.dir={sweep}"]
    line = one_error_line(run_cli("repro.train", *command))
    assert f"0 is a link to {halted}, outside the sweep folder" in line
    assert outside_state(halted) == before
    assert names(sweep) == {"0"}  # no multirun.yaml, run.lock or report
