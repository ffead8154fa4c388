"""User errors as one line (repro.core.errors), in this process: what `exit_with` prints and notes
in the run's log, the message a DataLoader worker's error carries, and a refused write."""

from __future__ import annotations

import errno
import logging

import pytest

from repro.core.errors import DataError, StorageError, UserError, exit_with, one_line


class RefusedError(UserError):
    noted_in_log = False  # as a run lock's: the folder's log is another process's


@pytest.fixture
def run_log(tmp_path):
    """train.log as a run has it: a file handler on the root logger, beside a console one."""
    root = logging.getLogger()
    log_file = logging.FileHandler(tmp_path / "train.log")
    log_file.setFormatter(logging.Formatter("%(name)s %(levelname)s %(levelno)d %(message)s"))
    console = logging.StreamHandler()
    root.addHandler(log_file), root.addHandler(console)
    yield tmp_path / "train.log"
    root.removeHandler(log_file), root.removeHandler(console)
    log_file.close()


def _exit(error: UserError, capsys, **code: int) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        exit_with(error, **code)
    out, err = capsys.readouterr()
    assert out == ""
    return stop.value.code, err


def test_the_error_is_one_escaped_line_on_stderr_and_in_the_runs_log(run_log, capsys):
    code, said = _exit(DataError("no images in /data/\x1b[2Jx"), capsys)
    assert code == 2 and said == "error: no images in /data/\\x1b[2Jx\n"
    assert run_log.read_text() == "repro ERROR 40 no images in /data/\\x1b[2Jx\n"


def test_an_error_about_another_processs_folder_stays_out_of_its_log(run_log, capsys):
    code, said = _exit(RefusedError("the folder is in use"), capsys, code=3)
    assert code == 3 and said == "error: the folder is in use\n"
    assert run_log.read_text() == ""


WORKER = (
    "Caught DataError in DataLoader worker process 0.\n"
    "Original Traceback (most recent call last):\n"
    '  File "loader.py", line 3, in fetch\n'
    "repro.core.errors.DataError: {message}\n"
)


@pytest.mark.parametrize(
    "message",
    ["image 7 cannot be decoded", "a: b DataError: c", "DataError: twice"],
)
def test_a_workers_error_is_its_own_last_line(message):
    assert one_line(DataError(WORKER.format(message=message))) == message
    assert one_line(DataError(message)) == message  # raised here: as it is


def test_a_workers_last_line_of_another_error_type_is_kept_whole():
    wrapped = WORKER.replace("repro.core.errors.DataError: {message}", "KeyError: 'label 3'")
    assert one_line(DataError(wrapped)) == "KeyError: 'label 3'"


def test_a_refused_write_names_the_path_the_cause_and_its_code():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert str(StorageError("/runs/a", full)) == (
        "cannot write /runs/a: No space left on device (ENOSPC)"
    )
    said = StorageError("/runs/a", OSError(errno.EACCES, "Permission denied"), doing="read")
    assert str(said) == "cannot read /runs/a: Permission denied (EACCES)"
    assert said.path == "/runs/a" and said.error.errno == errno.EACCES
    assert str(StorageError("/x", OSError("no errno here"))) == "cannot write /x: no errno here"
    assert str(StorageError("/x", OSError(0, "odd"))) == "cannot write /x: odd"
