"""train.log's handler. A line the file system refuses (a full disk, a lost permission) is
dropped with one warning on the console, not a traceback for every line: the run's own
writes, which do fail it, name the path and the cause once."""

from __future__ import annotations

import logging
import sys

from repro.core.errors import StorageError


class RunLogFile(logging.FileHandler):
    """A FileHandler that survives a file system refusing its writes."""

    refused = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        if not self.refused:
            self.refused = True
            lost = StorageError(self.baseFilename, error)
            print(f"warning: {lost}; log lines go to the console only", flush=True)
