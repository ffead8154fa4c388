"""Text from files someone else made (a checkpoint's class names, a sweep's job folders) reaches a
CSV as data, never as a spreadsheet formula, and the terminal as text, never as escape
sequences."""

from __future__ import annotations

import pytest

from repro.errors import UserError, exit_with
from repro.escape import for_csv, for_terminal

HYPERLINK = '=HYPERLINK("http://evil","x")'
RED = "cat\x1b[31m"  # turns the rest of the terminal red


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("cat\x1b[31m", r"cat\x1b[31m"),  # ESC: the four characters \x1b, as repr writes them
        ("a\x9b2Jb", r"a\x9b2Jb"),  # CSI alone, a C1 control
        ("x\x7fy\x00z", r"x\x7fy\x00z"),  # DEL and NUL
        ("file\u202egnp.exe", r"file\u202egnp.exe"),  # right-to-left override
        ("\u2066isolate\u2069", r"\u2066isolate\u2069"),
        ("one\ntwo\r\tthree", r"one\ntwo\r\tthree"),  # our lines are one line
        ("name\udcff", r"name\udcff"),  # an undecodable byte of a file name
        ("chat, Katze, 猫, кошка: 100% C:\\data", "chat, Katze, 猫, кошка: 100% C:\\data"),
        ("", ""),
    ],
)
def test_the_terminal_gets_control_characters_as_visible_escapes(text, shown):
    assert for_terminal(text) == shown
    assert for_terminal(shown) == shown  # escaping twice changes nothing


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("@SUM(1)", "'@SUM(1)"),
        ("-2+3", "'-2+3"),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("\t=1", r"'\t=1"),  # tab and carriage return start a formula too, then are escaped
        ("\r=1", r"'\r=1"),
        ("-", "'-"),
        ("-inf", "'-inf"),
        ("cat\x1b[31m", r"cat\x1b[31m"),
        ("a\n=1", r"a\n=1"),  # no second line to start a formula in
        ("cat", "cat"),
        ("a=b", "a=b"),  # only the first character counts
        # A plain number in a string is no formula: a class named "-1" keeps its name.
        ("-1", "-1"),
        ("-0.5", "-0.5"),
        ("+2e-3", "+2e-3"),
        (-0.5, -0.5),  # numbers we write stay numbers
        (3, 3),
        (None, None),
    ],
)
def test_a_csv_cell_never_starts_a_formula_and_numbers_stay_numbers(cell, written):
    got = for_csv(cell)
    assert got == written and type(got) is type(written)


def test_the_error_line_is_escaped_and_ordinary_text_unchanged(capsys):
    with pytest.raises(SystemExit) as stopped:
        exit_with(UserError(f"data.root=/d: the data has the classes [{RED}, dog\u202e]\nnext"))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    said = r"data.root=/d: the data has the classes [cat\x1b[31m, dog\u202e]\nnext"
    assert err == f"error: {said}\n"  # one line
    with pytest.raises(SystemExit):
        exit_with(UserError("out='p.csv' is not allowed: a file, 猫"))
    assert capsys.readouterr().err == "error: out='p.csv' is not allowed: a file, 猫\n"
