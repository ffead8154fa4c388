"""Text from files someone else made (a checkpoint's class names, a job's overrides, error.txt),
made safe for where it goes: the terminal (`for_terminal`), a CSV cell (`for_csv`), a Markdown
table cell (`for_markdown`), a log line (`EscapingFilter`, on Hydra's and the run's handlers).

Escaping happens where text leaves us (a print, a CSV row, the error line), not where files are
read: what a function returns stays the data as stored.
"""

from __future__ import annotations

import logging
import re

# What a terminal acts on or a reader cannot see: C0 (newline too: our messages are one line),
# DEL, C1 (\x9b is a CSI on its own), lone surrogates (undecodable bytes of a file name, which
# printing would refuse), line and paragraph separators, and the bidi marks, embeddings,
# overrides and isolates that reorder what is shown ("Trojan Source").
_UNSAFE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)
# OWASP's CSV injection rule: a spreadsheet reads a cell starting so as a formula.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
# A plain number ("-1", "-0.5", "+2e-3") is no formula: a class named "-1" keeps its name.
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def for_terminal(text: str) -> str:
    """`text` with each unsafe character written as repr writes it (ESC as the four characters
    \\x1b, a newline as \\n); printable text, any script, unchanged."""
    return _UNSAFE.sub(lambda found: repr(found.group())[1:-1], text)


def for_csv(cell: object) -> object:
    """A CSV cell no spreadsheet runs: a string that would start a formula gets a leading `'`,
    and its unsafe characters are escaped as for the terminal. Numbers stay numbers."""
    if not isinstance(cell, str):
        return cell
    formula = cell.startswith(_FORMULA) and not _NUMBER.fullmatch(cell)
    return ("'" if formula else "") + for_terminal(cell)


# What lets a Markdown table cell become more than text (CommonMark, GitHub's tables): the
# cell separator, code spans, links and images, raw HTML, and the backslash itself. Emphasis
# (`*`, `_`) only styles text, and escaping it would clutter every `val_acc`.
_MARKUP = re.compile(r"([\\`|<>\[\]])")


def for_markdown(cell: object) -> str:
    """A Markdown table cell that shows `cell` as text: its unsafe characters escaped as for
    the terminal, then each character that could make markup backslash-escaped (no link,
    image, HTML or extra column can come from a file)."""
    return _MARKUP.sub(r"\\\1", for_terminal(str(cell)))


class EscapingFilter(logging.Filter):
    """Log records as the terminal may show them: what a message carries from a file (an
    override Hydra's launcher logs, a class name) has its control characters escaped; tabs and
    newlines, which our own messages use, stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = "\n".join(
            "\t".join(for_terminal(part) for part in line.split("\t"))
            for line in message.split("\n")
        )
        if escaped != message:
            record.msg, record.args = escaped, ()
        return True
