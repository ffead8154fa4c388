"""`python -m repro.manual`, in this process (test_engine_package.py runs it from a built wheel):
where the docs are found, the list of pages with their titles, a page printed whole, and an
unknown name in one line."""

from __future__ import annotations

import importlib

import pytest

from conftest import ROOT

manual = importlib.import_module("repro.manual.command")


def test_the_checkouts_docs_are_listed_with_their_titles(capsys):
    # mutmut's copy links docs/ to the checkout's: the same folder once links are followed
    assert manual.CHECKOUT.resolve() == (ROOT / "docs").resolve()
    manual.main([])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"the engine's docs: {manual.CHECKOUT}  (python -m repro.manual NAME prints one)"
    )
    names = sorted(path.stem for path in (ROOT / "docs").glob("*.md"))
    assert [line.split()[0] for line in lines[1:]] == ["README", *names]
    title = (ROOT / "docs" / "sweeps.md").read_text().splitlines()[0].removeprefix("# ")
    assert f"  {'sweeps':<16} {title.strip()}" in lines


def test_a_page_is_printed_whole_by_its_name_with_or_without_md(capsys):
    manual.main(["sweeps"])
    assert capsys.readouterr().out == (ROOT / "docs" / "sweeps.md").read_text()
    manual.main(["README.md"])
    assert capsys.readouterr().out == (ROOT / "README.md").read_text()


def test_an_unknown_page_is_one_line_naming_the_pages(capsys):
    with pytest.raises(SystemExit) as ended:
        manual.main(["nope"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: no page named 'nope'; the pages: README, ")


def test_shipped_docs_come_first_and_a_readme_beside_them_is_the_readme(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "architecture.md").write_text("# How it flows\n\ntext\n")
    (shipped / "README.md").write_text("# The wheel's README\n")
    monkeypatch.setattr(manual, "SHIPPED", shipped)
    assert manual.folder() == shipped
    assert manual.pages(shipped) == {
        "README": shipped / "README.md",
        "architecture": shipped / "architecture.md",
    }
    assert manual.title(shipped / "architecture.md") == "How it flows"
    (shipped / "README.md").unlink()
    assert manual.pages(shipped) == {"architecture": shipped / "architecture.md"}
    (tmp_path / "README.md").write_text("# Beside\n")  # a checkout: README one folder up
    assert manual.pages(shipped)["README"] == tmp_path / "README.md"
    (shipped / "untitled.md").write_text("no heading\n")
    assert manual.title(shipped / "untitled.md") == ""


def test_no_docs_anywhere_is_one_line_naming_both_places(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(manual, "SHIPPED", tmp_path / "a")
    monkeypatch.setattr(manual, "CHECKOUT", tmp_path / "b")
    with pytest.raises(SystemExit) as ended:
        manual.main([])
    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        f"error: the engine's docs are neither in {tmp_path / 'a'} nor in {tmp_path / 'b'}\n"
    )
