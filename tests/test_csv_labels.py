"""`data=csv_labels`: image files and their labels from CSV files, and each mistake in them as
one line naming the file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from repro.core.errors import ConfigError, DataError
from repro.extras.multilabel.csv_files import csv_labels, read_listing

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


def test_a_validation_file_is_the_validation_split_and_stands_in_for_a_missing_test_file(root):
    write(root, "train.csv", "path,x,y", "a.png,1,0", "b.png,0,1")
    write(root, "val.csv", "path,x,y", "c.png,0,0")
    write(root, "test.csv", "path,x,y", "d.png,1,1")
    splits = csv_labels(
        cfg(root, "data.val_size=1", "data.num_classes=2"), 0, val_file="val.csv"
    )  # a validation file: no row of train.csv is held out, whatever val_size says
    assert [p.name for p in splits.train.paths] == ["a.png", "b.png"]
    assert [p.name for p in splits.val.paths] == ["c.png"] and splits.test is splits.val
    both = csv_labels(cfg(root), 0, val_file="val.csv", test_file="test.csv")
    assert [p.name for p in both.test.paths] == ["d.png"]
    assert torch.equal(both.test.labels[0], torch.tensor([1.0, 1.0]))
    assert both.any_size is True and both.classes == ["x", "y"]
    write(root, "odd.csv", "path,y", "c.png,0")
    with pytest.raises(DataError) as refused:
        csv_labels(cfg(root), 0, val_file="odd.csv")
    assert str(refused.value) == "odd.csv: its header names ['y'], the training file's ['x', 'y']"


def test_the_held_out_rows_are_chosen_by_the_split_seed(root):
    lines = [f"{name},1,0" for name in ("a.png", "b.png", "c.png", "d.png")]
    write(root, "train.csv", "path,x,y", *lines)
    held = {
        seed: [p.name for p in csv_labels(cfg(root, "data.val_size=2"), seed).val.paths]
        for seed in range(8)
    }
    assert len({tuple(names) for names in held.values()}) > 1, "the seed chooses the rows"
    again = [p.name for p in csv_labels(cfg(root, "data.val_size=2"), 3).val.paths]
    assert again == held[3]


def test_targets_are_float32_rows_every_value_from_0_to_1_and_blank_lines_are_skipped(root):
    write(root, "train.csv", "path , x ,y", "a.png,0,1", "", "b.png,0.25,1.0", "")
    labels, files = read_listing(root, "train.csv")
    assert labels == ["x", "y"]
    assert [p for p in files.paths] == [root / "a.png", root / "b.png"]
    assert all(t.dtype == torch.float32 for t in files.labels)
    assert torch.equal(torch.stack(list(files.labels)), torch.tensor([[0.0, 1.0], [0.25, 1.0]]))


@pytest.mark.parametrize("value", ["-0.1", "1.01", "nan", "inf"])
def test_a_value_outside_0_to_1_is_refused_naming_the_line(root, value):
    write(root, "train.csv", "path,x,y", "a.png,1,0", f"b.png,0,{value}")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert str(refused.value) == (
        f"{root / 'train.csv'}, line 3: label values must be numbers in [0, 1]"
    )


def test_each_refusal_names_the_listing_by_its_path_under_the_root(root):
    write(root, "train.csv", "path,x,y", "a.png,1")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert str(refused.value) == f"{root / 'train.csv'}, line 2: 2 fields, the header has 3"
    write(root, "train.csv", "path,x,y", "z.png,1,0")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert str(refused.value) == f"{root / 'train.csv'}, line 2: no image file {root / 'z.png'}"
    write(root, "train.csv", "x")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert (
        str(refused.value) == f"{root / 'train.csv'}: the header must be path,label_a,label_b,..."
    )
    (root / "train.csv").write_text("")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert str(refused.value).startswith(f"{root / 'train.csv'}: the header must be")
    write(root, "train.csv", "path,x,y")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert str(refused.value) == f"{root / 'train.csv'}: no rows under the header"


def test_a_file_that_is_no_csv_text_is_one_line_saying_why(root):
    (root / "train.csv").write_bytes(b"path,x\n\xff\xfe,1\n")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    assert str(refused.value) == f"{root / 'train.csv'}: not a readable CSV file (not UTF-8 text)"
    (root / "train.csv").write_text("path,x\n" + "a" * 200_000 + ",1\n")
    with pytest.raises(DataError) as refused:
        read_listing(root, "train.csv")
    said = str(refused.value)
    assert said.startswith(f"{root / 'train.csv'}: not a readable CSV file (field larger")
    assert said.endswith(")")


def test_the_number_of_classes_must_match_the_header_or_be_null(root):
    write(root, "train.csv", "path,x,y", "a.png,1,0", "b.png,0,1")
    assert csv_labels(cfg(root, "data.val_size=1", "data.num_classes=2"), 0).classes == ["x", "y"]
    with pytest.raises(ConfigError) as refused:
        csv_labels(cfg(root, "data.val_size=1", "data.num_classes=3"), 0)
    assert f"{root / 'train.csv'} names 2 labels (or null to take them)" in str(refused.value)
    with pytest.raises(ConfigError, match=r"data\.root"):
        csv_labels(cfg(root, "data.root=null"), 0)


def test_a_listing_hard_linked_from_another_folder_under_the_root_is_read_but_not_outside(root):
    import os

    write(root, "train.csv", "path,x,y", "a.png,1,0", "b.png,0,1")
    write(root, "kept.csv", "path,x,y", "c.png,1,1")
    (root / "lists").mkdir()
    os.link(root / "kept.csv", root / "lists" / "val.csv")
    splits = csv_labels(cfg(root), 0, val_file="lists/val.csv")
    assert [p.name for p in splits.val.paths] == ["c.png"]
    outside = root.parent / f"{root.name}-outside.csv"
    outside.write_text("path,x,y\nc.png,1,1\n")
    os.link(outside, root / "lists" / "test.csv")
    with pytest.raises(DataError, match=r"lists/test\.csv: not a readable CSV file \(has a hard"):
        csv_labels(cfg(root), 0, val_file="lists/val.csv", test_file="lists/test.csv")


def test_targets_stay_float32_whatever_torchs_default_type(root):
    write(root, "train.csv", "path,x,y", "a.png,1,0.5")
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, files = read_listing(root, "train.csv")
    finally:
        torch.set_default_dtype(before)
    assert files.labels[0].dtype == torch.float32


def test_a_refused_class_count_or_missing_root_names_the_key_and_the_value(root):
    write(root, "train.csv", "path,x,y", "a.png,1,0", "b.png,0,1")
    with pytest.raises(ConfigError) as refused:
        csv_labels(cfg(root, "data.val_size=1", "data.num_classes=3"), 0)
    assert (refused.value.key, refused.value.value) == ("data.num_classes", 3)
    with pytest.raises(ConfigError) as refused:
        csv_labels(cfg(root, "data.root=null"), 0)
    assert str(refused.value) == (
        "data.root=None is not allowed: a folder path: the folder the CSV files and the paths "
        "in them are relative to"
    )
