"""`data=csv_labels`: image files listed in CSV files, each row a path and one 0/1 per label.

    data.root/train.csv        path,airplane,automobile,...,animal,vehicle,has_wings
                               train/cat/0001.jpg,0,0,0,1,0,0,0,0,0,0,1,0,0

The header names the labels (after the first column, the image's path relative to data.root).
`train_file` is required; `val_file` and `test_file` may be null: without a validation file,
`data.val_size` rows of the training file are held out (seeded by the run's seed; 0 keeps
every row for training), and without a test file the validation split stands in for it. A value
may be any number in [0, 1] (a soft label); anything else, a row of the wrong length, a path
that leaves data.root (absolute, or through ..), a missing image or a header that differs
between files is one line naming the file and its line.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import torch

from repro.core.data.datasets import Splits, carve_validation, folder
from repro.core.data.sources import ImageFiles
from repro.core.errors import ConfigError, DataError
from repro.core.guards import received


def csv_labels(
    cfg: Any,
    split_seed: int,
    *,
    train_file: str = "train.csv",
    val_file: str | None = None,
    test_file: str | None = None,
) -> Splits:
    """The splits the CSV files list, with the labels their header names."""
    root = folder(cfg, "the folder the CSV files and the paths in them are relative to")
    labels, train = read_listing(root, train_file)
    val: Any = None
    if val_file is not None:
        val = _same_labels(labels, *read_listing(root, val_file), val_file)
    if val is None:
        train, val = carve_validation(train, cfg.val_size, split_seed)
    test = val
    if test_file is not None:
        test = _same_labels(labels, *read_listing(root, test_file), test_file)
    if cfg.num_classes is not None and cfg.num_classes != len(labels):
        allowed = f"{root / train_file} names {len(labels)} labels (or null to take them)"
        raise ConfigError("data.num_classes", cfg.num_classes, allowed)
    return Splits(train, val, test, labels, any_size=True)


def read_listing(root: Path, name: str) -> tuple[list[str], ImageFiles]:
    """The label names of `root/name`'s header and its rows as image files with float32
    targets."""
    listing = root / name
    try:
        rows = list(csv.reader(io.StringIO(received.read_text(listing, "table", root))))
    except received.ReceivedFileError as error:
        raise DataError(f"{listing}: not a readable CSV file ({error.why})") from None
    except csv.Error as error:
        raise DataError(f"{listing}: not a readable CSV file ({error})") from None
    if not rows or len(rows[0]) < 2:
        raise DataError(f"{listing}: the header must be path,label_a,label_b,...")
    labels = [name.strip() for name in rows[0][1:]]
    paths, targets = [], []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(labels) + 1:
            said = f"{len(row)} fields, the header has {len(labels) + 1}"
            raise DataError(f"{listing}, line {line}: {said}")
        named = Path(row[0])
        if named.is_absolute() or ".." in named.parts:
            raise DataError(f"{listing}, line {line}: {row[0]} is not a path inside data.root")
        path = root / named
        if not path.is_file():
            raise DataError(f"{listing}, line {line}: no image file {path}")
        paths.append(path)
        targets.append(_target(row[1:], f"{listing}, line {line}"))
    if not paths:
        raise DataError(f"{listing}: no rows under the header")
    return labels, ImageFiles(paths, targets)


def _target(values: list[str], where: str) -> torch.Tensor:
    try:
        numbers = [float(value) for value in values]
    except ValueError:
        raise DataError(f"{where}: label values must be numbers in [0, 1]") from None
    if any(not 0 <= number <= 1 for number in numbers):
        raise DataError(f"{where}: label values must be numbers in [0, 1]")
    return torch.tensor(numbers, dtype=torch.float32)


def _same_labels(labels: list[str], found: list[str], files: ImageFiles, name: str) -> ImageFiles:
    if found != labels:
        raise DataError(f"{name}: its header names {found}, the training file's {labels}")
    return files
