"""User-facing errors: one clear line, a non-zero exit, no traceback."""

from __future__ import annotations

import errno
import logging
import sys

from repro.core.text import for_terminal


class UserError(Exception):
    """A mistake in the user's input (config, path, data, checkpoint), not a bug."""

    noted_in_log = True  # false where the run folder's log is another process's


class ConfigError(UserError):
    """A config value that is not allowed: names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        super().__init__(f"{key}={value!r} is not allowed: {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


class DataError(UserError):
    """Missing or unreadable data."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used."""


class StorageError(UserError):
    """A file system that refused us (full, read-only, permission lost, over quota): names
    the path and the OS error."""

    def __init__(self, path: object, error: OSError, doing: str = "write") -> None:
        code = errno.errorcode.get(error.errno or 0)
        reason = f"{error.strerror or error}" + (f" ({code})" if code else "")
        super().__init__(f"cannot {doing} {path}: {reason}")
        self.path, self.error = path, error


def one_line(error: BaseException) -> str:
    """The message of an error, without the worker traceback a DataLoader wraps around it."""
    message = str(error)
    if "Original Traceback" in message:  # raised in a DataLoader worker and re-raised here
        last = message.strip().splitlines()[-1]
        message = last.split(f"{type(error).__name__}: ", 1)[-1]
    return message


# A command's own lines on stderr: `LEVEL logger: message`, or the bare message where the
# command's lines are its report (verify).
NAMED = "%(levelname)s %(name)s: %(message)s"
BARE = "%(message)s"


def warnings_to_stderr(line_format: str = NAMED) -> None:
    """Show the warnings a command's modules log (and worse) on stderr, in `line_format`."""
    logging.basicConfig(level=logging.WARNING, format=line_format)


def exit_with(error: UserError, code: int = 2) -> None:
    """Print the error as one line on stderr, note it in the run's log files, and exit."""
    message = for_terminal(one_line(error))  # it may quote a file's values: no escape sequences
    record = logging.makeLogRecord(
        {"name": "repro", "levelno": logging.ERROR, "levelname": "ERROR", "msg": message}
    )
    for handler in logging.getLogger().handlers if error.noted_in_log else ():
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
    # One write, newline included (print writes the line and its end apart): the ranks of a
    # torchrun job share stderr, and their lines must not run into each other.
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(code)
