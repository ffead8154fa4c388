"""Text from files someone else made (a checkpoint's class names, a sweep's job folders) reaches a
CSV as data, never as a spreadsheet formula, and the terminal as text, never as escape
sequences."""

from __future__ import annotations

import csv
import json
import re

import pytest
import yaml

from repro import evaluate, predict
from repro import report as report_command
from repro.core.errors import UserError, exit_with
from repro.core.runs.checkpoint import atomic_save, load
from repro.core.sweeps import render, report
from repro.core.text import for_csv, for_terminal

from conftest import IMAGEFOLDER, make_image_tree, train_in_process

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


def _job(sweep_dir, num, overrides, summary=None, error=None):
    folder = sweep_dir / str(num)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps({**summary, "completed": True}))
    if error is not None:
        (folder / "error.txt").write_text(error)


def test_a_sweeps_files_reach_its_csv_and_the_terminal_escaped(tmp_path, capsys):
    summary = {"val_acc": 0.5, "val_margin": -0.5, "val_\x1b[8mx": 0.25, "seed": 0}
    _job(tmp_path, 0, [HYPERLINK, "seed.value=0"], summary)
    _job(tmp_path, 1, ["lr=\x1b[31mred", "seed.value=0"], error="ConfigError: \x1b]0;pwned\x07\n")
    report_command.main([str(tmp_path)])
    printed = capsys.readouterr()
    with (tmp_path / "sweep_summary.csv").open(newline="") as handle:
        header, *rows = list(csv.reader(handle))
    cells = [dict(zip(header, row, strict=True)) for row in rows]
    assert r"val_\x1b[8mx" in header
    assert cells[0]["group"] == "'" + HYPERLINK
    assert cells[0]["overrides"] == f"'{HYPERLINK} seed.value=0"
    assert cells[0]["val_margin"] == "-0.5" and cells[0]["val_acc"] == "0.5"
    assert cells[0][r"val_\x1b[8mx"] == "0.25"
    assert cells[1]["group"] == r"lr=\x1b[31mred"
    assert cells[1]["error"] == r"ConfigError: \x1b]0;pwned\x07"
    markdown = (tmp_path / "sweep_summary.md").read_text()
    # Shown as the text the terminal line shows: the backslash and brackets escaped for Markdown.
    assert r"| 1 | lr=\\x1b\[31mred |" in markdown
    assert r"FAILED: ConfigError: \\x1b\]0;" in markdown
    for text in (markdown, (tmp_path / "sweep_summary.csv").read_text(), *printed):
        assert "\x1b" not in text and "\x07" not in text
    assert printed.out == render.markdown(report.build(tmp_path))


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    """A run on a tree whose class folders are named to trick a terminal and a spreadsheet,
    and a copy of its checkpoint with a class renamed to a spreadsheet formula (sealed again:
    its digest is intact, as one crafted by someone else would be)."""
    images = make_image_tree(
        tmp_path_factory.mktemp("tree") / "images", per_class=4, classes=("@SUM(1)", RED, "plain")
    )
    run_dir = tmp_path_factory.mktemp("run")
    overrides = [o for o in IMAGEFOLDER if not o.startswith("trainer.epochs=")]
    last = "trainer.test_weights=last"  # 12 validation images: too few to select by
    train_in_process(run_dir, *overrides, "trainer.epochs=1", f"data.root={images}", last)
    ckpt = run_dir / "checkpoints" / "last.pt"
    state = load(ckpt)
    assert state["classes"] == ["@SUM(1)", RED, "plain"]
    crafted = run_dir / "crafted.pt"
    atomic_save({**state, "classes": [HYPERLINK, *state["classes"][1:]]}, crafted)
    return ckpt, crafted, images


def test_class_names_from_a_checkpoint_reach_predictions_csv_escaped(evil, tmp_path, capsys):
    _, crafted, images = evil
    out = tmp_path / "predictions.csv"
    predict.main([f"ckpt={crafted}", f"images={images / 'val'}", f"out={out}", "top_k=3"])
    printed = capsys.readouterr()
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 12
    for row in rows:  # every class on every row: top 3 of 3
        assert {row["class"], row["class_2"], row["class_3"]} == {
            "'" + HYPERLINK,
            r"cat\x1b[31m",
            "plain",
        }
        assert float(row["probability"]) >= float(row["probability_3"]) >= 0
    assert sum(r"/val/cat\x1b[31m/" in row["path"] for row in rows) == 4  # a folder's name too
    for text in (out.read_text(), *printed):
        assert "\x1b" not in text


def test_class_names_reach_the_terminal_escaped(evil, capsys):
    ckpt, crafted, _ = evil
    evaluate.main([f"ckpt={ckpt}", "split=val", "per_class=true"])
    out = capsys.readouterr().out
    assert "\n  @SUM(1): acc " in out and "\n  cat\\x1b[31m: acc " in out
    assert "\x1b" not in out
    # The crafted copy names classes the data does not have: one error line, quoting them.
    with pytest.raises(SystemExit) as stopped:
        evaluate.main([f"ckpt={crafted}", "split=val"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "\x1b" not in err
    assert f"trained on [{HYPERLINK}, cat\\x1b[31m, plain]" in err.splitlines()[-1]


INJECTED = "a|b <img src=x onerror=alert(1)> [click](http://evil.example) `code` \x1b[2J"


def test_a_sweeps_text_cannot_add_columns_links_or_html_to_its_markdown(tmp_path):
    _job(tmp_path, 0, ["seed.value=0"], {"val_acc": 0.5, "seed": INJECTED})
    _job(tmp_path, 1, [f"lr={INJECTED}", "seed.value=0"], error=f"ConfigError: {INJECTED}\n")
    report_command.main([str(tmp_path)])
    markdown = (tmp_path / "sweep_summary.md").read_text()
    for block in markdown.split("\n\n"):
        table = [line for line in block.splitlines() if line.startswith("|")]
        columns = {line.replace("\\|", "").count("|") for line in table}
        assert len(columns) <= 1, table  # each row of a table: the table's columns, no more
    for raw in ("<img", "[click]", "`code`", "\x1b"):
        assert not re.search(r"(?<!\\)" + re.escape(raw), markdown), raw  # only escaped
    assert r"\<img src=x onerror=alert(1)\>" in markdown and r"\[click\]" in markdown


def test_hydras_launcher_line_reaches_the_terminal_escaped(capsys):
    import logging.config

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from repro.core.runs import trust

    with initialize_config_dir(config_dir=str(trust.CONF), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True)
    for section in ("hydra_logging", "job_logging"):
        settings = OmegaConf.to_container(cfg.hydra[section], resolve=False)
        settings["handlers"] = {"console": settings["handlers"]["console"]}
        settings["root"]["handlers"] = ["console"]
        logging.config.dictConfig(settings)
        logging.getLogger("hydra.core.utils").info("\t#0 : %s", "lr=\x1b[2J\x1b]0;title\x07")
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out, section
        assert r"lr=\x1b[2J\x1b]0;title\x07" in out and "\t#0 : " in out, section
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})


def test_the_log_filter_escapes_each_line_and_cell_and_keeps_our_tabs_and_newlines():
    import logging

    from repro.core.text import EscapingFilter

    record = logging.makeLogRecord({"msg": "%s\t%s", "args": ("job\x1b[2J", "a\nb\x07\tc")})
    assert EscapingFilter().filter(record) is True
    assert record.getMessage() == "job\\x1b[2J\ta\nb\\x07\tc" and record.args == ()
    plain = logging.makeLogRecord({"msg": "step %d\tloss %s\nnext", "args": (3, "0.5")})
    EscapingFilter().filter(plain)
    assert (plain.msg, plain.args) == ("step %d\tloss %s\nnext", (3, "0.5"))  # left as it was
