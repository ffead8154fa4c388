"""train.log's handler (repro.core.watch.logfile.RunLogFile): a file system that refuses its lines
costs one warning on the console, not a traceback a line; any other error is logging's own."""

from __future__ import annotations

import errno
import logging

from repro.core.watch.logfile import RunLogFile


class Refusing:
    """A stream whose writes fail as `error` says."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def write(self, text: str) -> None:
        raise self.error

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _record(text: str) -> logging.LogRecord:
    return logging.makeLogRecord({"msg": text, "levelno": logging.INFO, "levelname": "INFO"})


def test_a_refused_line_is_one_warning_for_the_whole_run(tmp_path, capsys):
    handler = RunLogFile(tmp_path / "train.log")
    handler.stream.close()
    handler.stream = Refusing(OSError(errno.ENOSPC, "No space left on device"))
    for text in ("first", "second", "third"):
        handler.emit(_record(text))
    out, err = capsys.readouterr()
    assert out == (
        f"warning: cannot write {tmp_path / 'train.log'}: No space left on device (ENOSPC); "
        "log lines go to the console only\n"
    )
    assert err == "" and handler.refused
    assert RunLogFile.refused is False  # each handler its own


def test_an_error_that_is_not_the_file_systems_is_reported_as_logging_does(tmp_path, capsys):
    handler = RunLogFile(tmp_path / "train.log")
    handler.stream.close()
    handler.stream = Refusing(ValueError("a bug, not a full disk"))
    handler.emit(_record("line"))
    out, err = capsys.readouterr()
    assert out == "" and not handler.refused
    assert "--- Logging error ---" in err and "a bug, not a full disk" in err
    assert "Message: 'line'" in err  # logging's own report names the record


class Console:
    """A stdout that keeps what was written and whether each write was flushed."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def write(self, text: str) -> None:
        self.events.append("write")

    def flush(self) -> None:
        self.events.append("flush")


def test_the_warning_is_flushed_at_once_not_held_behind_the_runs_output(tmp_path, monkeypatch):
    handler = RunLogFile(tmp_path / "train.log")
    handler.stream.close()
    handler.stream = Refusing(OSError(errno.EACCES, "Permission denied"))
    console = Console()
    monkeypatch.setattr("sys.stdout", console)
    handler.emit(_record("line"))
    assert console.events[-1] == "flush" and "write" in console.events
