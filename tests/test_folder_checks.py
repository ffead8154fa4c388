"""The folder check itself (repro.core.guards.folders) on folders made here, no training: which links,
hard links and special files it refuses, and the words it uses. test_folder_guard.py has the
entry points refusing such folders."""

from __future__ import annotations

import os

import pytest

from repro.core.guards import folders
from repro.core.guards.folders import UnsafeFolderError


@pytest.fixture
def run(tmp_path):
    """A run folder with nested records, and a file outside it."""
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / ".hydra").mkdir()
    (folder / "metrics.csv").write_text("step\n")
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (folder / "checkpoints" / "step-00000004.pt").write_bytes(b"weights")
    (tmp_path / "elsewhere.txt").write_text("someone else's\n")
    return folder


def test_a_clean_folder_a_missing_one_and_a_file_pass(run, tmp_path):
    assert folders.problem(run) is None
    assert folders.problem(tmp_path / "not-yet") is None
    assert folders.problem(tmp_path / "elsewhere.txt") is None
    folders.check(run)
    folders.check_sweep(run)


def test_links_that_stay_inside_the_folder_pass(run):
    (run / "latest").symlink_to("checkpoints")
    (run / "checkpoints" / "up").symlink_to("..")  # the folder itself
    (run / "absolute").symlink_to(run / "metrics.csv")
    assert folders.problem(run) is None


def test_a_link_out_is_refused_naming_it_where_it_lies_and_where_it_goes(run, tmp_path):
    (run / "checkpoints" / "last.pt").symlink_to(tmp_path / "elsewhere.txt")
    target = os.path.realpath(tmp_path / "elsewhere.txt")
    assert folders.problem(run) == (
        f"{run}: checkpoints/last.pt is a link to {target}, outside the run folder: writing "
        "through it would change a file outside the run folder; remove the link (or put a "
        "copy of its target in its place), or choose another run folder"
    )
    with pytest.raises(UnsafeFolderError) as refused:
        folders.check_sweep(run)
    assert "outside the sweep folder" in str(refused.value)
    assert refused.value.noted_in_log is False


def test_a_link_to_a_neighbour_whose_name_starts_alike_is_out(run, tmp_path):
    (tmp_path / "run2").mkdir()
    (run / "metrics.csv").unlink()
    (run / "metrics.csv").symlink_to(tmp_path / "run2" / "metrics.csv")  # dangling, too
    assert "metrics.csv is a link to" in folders.problem(run)


def test_a_fifo_is_refused(run):
    os.mkfifo(run / ".hydra" / "train.log")
    assert folders.problem(run, "sweep folder") == (
        f"{run}: .hydra/train.log is not a regular file (a FIFO, a socket or a device): "
        "reading or writing it could wait forever; remove it, or choose another sweep folder"
    )


@pytest.mark.parametrize("name", ["metrics.csv", ".hydra/config.yaml", "notes.log"])
def test_a_file_written_in_place_with_a_second_name_is_refused(run, name):
    (run / name).touch()
    os.link(run / name, run / "checkpoints" / "copy")  # inside the folder, still refused
    assert folders.problem(run) == (
        f"{run}: {name} has another hard link: writing it would change that file, wherever it "
        "is, too; replace it by a copy of its own (cp, then mv over it), or choose another "
        "run folder"
    )


def test_checkpoints_linking_each_other_pass_but_not_a_file_linked_from_outside(run, tmp_path):
    step = run / "checkpoints" / "step-00000004.pt"
    os.link(step, run / "checkpoints" / "last.pt")
    os.link(step, run / "checkpoints" / "best.pt")
    assert folders.problem(run) is None
    os.link(step, tmp_path / "kept-elsewhere.pt")
    message = folders.problem(run)
    assert message.startswith(f"{run}: checkpoints/")
    assert message.endswith(
        "has a hard link outside the run folder: it is another file's contents; replace it "
        "by a copy of its own, or choose another run folder"
    )


def test_a_folder_named_like_a_record_is_not_a_record(run):
    (run / "old.log").mkdir()
    (run / "old.log" / "inside").mkdir()  # a directory has several links of its own
    (run / "run.lock").mkdir()
    assert folders.problem(run) is None


def test_the_walk_lists_every_entry_and_does_not_follow_links(run, tmp_path):
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (run / "into").symlink_to(outside)
    names = sorted(str(os.path.relpath(entry.path, run)) for entry in folders._entries(run))
    assert names == [
        ".hydra",
        ".hydra/config.yaml",
        "checkpoints",
        "checkpoints/step-00000004.pt",
        "into",
        "metrics.csv",
    ]


def test_a_file_with_one_other_name_outside_is_refused_by_that_name(run, tmp_path):
    os.link(run / "checkpoints" / "step-00000004.pt", tmp_path / "kept-elsewhere.pt")
    assert folders.problem(run) == (
        f"{run}: checkpoints/step-00000004.pt has a hard link outside the run folder: it is "
        "another file's contents; replace it by a copy of its own, or choose another run folder"
    )
    with pytest.raises(UnsafeFolderError, match="outside the run folder"):
        folders.check(run)
