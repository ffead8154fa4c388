"""`data=csv_labels`: image files and their labels from CSV files, and each mistake in them as
one line naming the file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from repro.errors import ConfigError, DataError
from repro.multilabel.csv_files import csv_labels, read_listing

from conftest import compose_config


@pytest.fixture
def root(tmp_path) -> Path:
    for name in ("a.png", "b.png", "c.png", "d.png"):
        Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / name)
    return tmp_path


def write(root: Path, name: str, *lines: str) -> None:
    (root / name).write_text("\n".join(lines) + "\n")


def cfg(root: Path, *overrides: str):
    return compose_config("data=csv_labels", f"data.root={root}", *overrides).data


def test_the_header_names_the_labels_and_each_row_is_a_path_and_its_targets(root):
    write(root, "train.csv", "path,cat, has wings", "a.png,1,0", "b.png,0,1", "c.png,1,1")
    write(root, "test.csv", "path,cat, has wings", "d.png,0.5,0")
    splits = csv_labels(cfg(root, "data.val_size=1"), 0, test_file="test.csv")
    assert splits.classes == ["cat", "has wings"]
    assert (len(splits.train), len(splits.val), len(splits.test)) == (2, 1, 1)
    assert torch.equal(splits.test.labels[0], torch.tensor([0.5, 0.0]))
    everything = csv_labels(cfg(root, "data.val_size=0"), 0)
    assert len(everything.train) == 3 and everything.test is everything.val
    assert [p.name for p in everything.train.paths] == ["a.png", "b.png", "c.png"]


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (["path"], "train.csv: the header must be path,label_a,label_b,..."),
        (["path,x,y"], "train.csv: no rows under the header"),
        (["path,x,y", "a.png,1"], "train.csv, line 2: 2 fields, the header has 3"),
        (
            ["path,x,y", "a.png,1,0", "b.png,1,yes"],
            "train.csv, line 3: label values must be numbers in [0, 1]",
        ),
        (["path,x,y", "a.png,2,0"], "train.csv, line 2: label values must be numbers in [0, 1]"),
        (["path,x,y", "z.png,1,0"], "train.csv, line 2: no image file"),
        (
            ["path,x,y", "../a.png,1,0"],
            "train.csv, line 2: ../a.png is not a path inside data.root",
        ),
        (
            ["path,x,y", "/etc/passwd,1,0"],
            "train.csv, line 2: /etc/passwd is not a path inside data.root",
        ),
    ],
)
def test_a_mistake_in_a_listing_is_one_line_naming_its_file_and_line(root, lines, said):
    write(root, "train.csv", *lines)
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert said in str(refused.value)


def test_files_whose_headers_differ_are_refused_and_a_missing_file_named(root):
    write(root, "train.csv", "path,x,y", "a.png,1,0", "b.png,0,1")
    write(root, "test.csv", "path,y,x", "c.png,1,0")
    with pytest.raises(DataError, match=r"test.csv: its header names \['y', 'x'\], the training"):
        csv_labels(cfg(root, "data.val_size=1"), 0, test_file="test.csv")
    with pytest.raises(DataError, match=r"nowhere\.csv: not a readable CSV file"):
        csv_labels(cfg(root, "data.val_size=1"), 0, test_file="nowhere.csv")
    with pytest.raises(ConfigError, match=r"data\.num_classes"):
        csv_labels(cfg(root, "data.val_size=1", "data.num_classes=3"), 0)
