"""The `data` group's builders and their settings (repro.core.data.datasets), in-process on tiny
sources: the held-out split, the template's builders' refusals, fractions, the decoded
cache's hand-over, and an option's own settings held against its builder's signature."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from omegaconf import OmegaConf

from repro.core.data import datasets, synthetic
from repro.core.data.datasets import Splits
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.errors import ConfigError, DataError
from repro.core.runtime.seeding import torch_generator


def held(count: int, first: int = 0) -> TensorImages:
    """`count` one-pixel images whose pixel and label are their number."""
    numbers = torch.arange(first, first + count)
    return TensorImages(numbers.to(torch.uint8).view(-1, 1, 1, 1), numbers)


def numbers(source) -> list[int]:
    return source.labels.tolist() if isinstance(source, TensorImages) else list(source.labels)


# ---- the held-out split -------------------------------------------------------------------


def test_the_validation_split_is_the_seeded_permutations_head_each_split_in_order():
    train, val = datasets.carve_validation(held(10), 3, split_seed=5)
    order = torch.randperm(10, generator=torch_generator(5, "split"))
    assert numbers(val) == sorted(order[:3].tolist())
    assert numbers(train) == sorted(order[3:].tolist())
    again_train, _ = datasets.carve_validation(held(10), 3, split_seed=5)
    assert numbers(again_train) == numbers(train)


def test_no_validation_split_trains_on_every_image():
    train, val = datasets.carve_validation(held(4), 0, split_seed=1)
    assert numbers(train) == [0, 1, 2, 3] and len(val) == 0


@pytest.mark.parametrize("size", [-1, 4, 9])
def test_a_validation_split_must_leave_an_image_to_train_on(size):
    with pytest.raises(ConfigError) as refused:
        datasets.carve_validation(held(4), size, split_seed=1)
    assert str(refused.value) == f"data.val_size={size} is not allowed: must be between 0 and 3"


# ---- the template's builders --------------------------------------------------------------


def synthetic_cfg(**chosen):
    values = {"num_classes": 4, "train_size": 20, "val_size": 5, "test_size": 7}
    return SimpleNamespace(**{**values, "generator_seed": 3, **chosen})


def test_synthetic_images_come_from_their_own_seed_and_the_runs_seed_holds_out():
    splits = datasets.synthetic(synthetic_cfg(), split_seed=9)
    pool, _ = synthetic.generate(25, 3, 4)
    test, test_labels = synthetic.generate(7, 3 + 1_000_003, 4)
    assert splits.classes == ["disk", "square", "triangle", "ring"]
    assert torch.equal(splits.test.images, test) and torch.equal(splits.test.labels, test_labels)
    assert len(splits.train) == 20 and len(splits.val) == 5
    order = torch.randperm(25, generator=torch_generator(9, "split"))
    assert torch.equal(splits.val.images, pool[order[:5].sort().values])
    other = datasets.synthetic(synthetic_cfg(), split_seed=10)
    assert torch.equal(other.test.images, test) and not torch.equal(
        other.val.images, splits.val.images
    )


@pytest.mark.parametrize("classes", [None, 1, 11])
def test_synthetic_refuses_a_number_of_classes_it_cannot_draw(classes):
    with pytest.raises(ConfigError) as refused:
        datasets.synthetic(synthetic_cfg(num_classes=classes), split_seed=0)
    assert str(refused.value) == f"data.num_classes={classes} is not allowed: 2..10 for synthetic"


def test_synthetic_takes_two_and_ten_classes():
    assert len(datasets.synthetic(synthetic_cfg(num_classes=2), 0).classes) == 2
    assert len(datasets.synthetic(synthetic_cfg(num_classes=10), 0).classes) == 10


def tree(root: Path, layout: dict[str, list[str]]) -> Path:
    for split, names in layout.items():
        for name in names:
            (root / split / name).parent.mkdir(parents=True, exist_ok=True)
            (root / split / name).write_bytes(b"")
    return root


def folder_cfg(root, **chosen):
    return OmegaConf.create({"root": str(root), "num_classes": None, "val_size": 1, **chosen})


def test_an_image_folder_gives_its_classes_sorted_and_its_splits(tmp_path):
    layout = {
        "train": ["b/1.png", "b/2.png", "a/1.png", "a/2.jpg"],
        "val": ["a/v.png", "b/v.png"],
        "test": ["a/t.png", "b/t.png", "b/u.png"],
    }
    splits = datasets.imagefolder(folder_cfg(tree(tmp_path, layout)), 0)
    assert splits.classes == ["a", "b"] and splits.any_size and not splits.resized
    assert [len(splits.train), len(splits.val), len(splits.test)] == [4, 2, 3]
    assert numbers(splits.train) == [0, 0, 1, 1]


def test_without_val_a_part_of_train_is_held_out_and_without_test_val_is_tested(tmp_path):
    root = tree(tmp_path, {"train": ["a/1.png", "a/2.png", "b/1.png", "b/2.png", "b/3.png"]})
    splits = datasets.imagefolder(folder_cfg(root), 3)
    assert len(splits.train) == 4 and len(splits.val) == 1 and splits.test is splits.val
    files = ImageFiles.from_folder(root / "train", ["a", "b"])
    _, held_out = datasets.carve_validation(files, 1, 3)
    assert splits.val.paths == held_out.paths, "held out by the run's seed"


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({}, "not found or incomplete; expected a folder holding train/"),
        ({"train": ["a/1.png"]}, "train/ has 1 class folders; need 2+"),
        ({"train": ["a/1.png", "b/1.png"], "val": ["a/1.png"]}, "missing class folders ['b']"),
        ({"train": ["a/1.txt", "b/1.txt"]}, "train: no images (.bmp, .gif, .jpeg, .jpg, "),
    ],
)
def test_an_image_folder_that_cannot_be_read_is_one_data_error(tmp_path, layout, message):
    (tmp_path / "data").mkdir()
    root = tree(tmp_path / "data", layout)
    with pytest.raises(DataError) as refused:
        datasets.imagefolder(folder_cfg(root), 0)
    assert message in str(refused.value)


def test_an_image_folder_with_another_number_of_classes_than_asked_is_refused(tmp_path):
    root = tree(tmp_path, {"train": ["a/1.png", "b/1.png", "c/1.png"]})
    with pytest.raises(ConfigError) as refused:
        datasets.imagefolder(folder_cfg(root, num_classes=2), 0)
    assert str(refused.value) == (
        f"data.num_classes=2 is not allowed: {root / 'train'} has 3 classes (or null to infer)"
    )
    assert len(datasets.imagefolder(folder_cfg(root, num_classes=3), 0).classes) == 3


@pytest.mark.parametrize("root", [None, ""])
def test_a_builder_reading_files_needs_a_root(root):
    with pytest.raises(ConfigError) as refused:
        datasets.folder(OmegaConf.create({"root": root}), "images")
    assert str(refused.value) == f"data.root={root!r} is not allowed: a folder path: images"
    assert datasets.folder(OmegaConf.create({"root": "~/x"}), "images") == Path.home() / "x"


def test_cifar10_unavailable_says_how_to_get_it(tmp_path):
    cfg = OmegaConf.create({"root": str(tmp_path), "download": False, "val_size": 1})
    with pytest.raises(DataError) as refused:
        datasets.cifar10(cfg, 0)
    assert str(refused.value).startswith(f"data.root={tmp_path}: CIFAR-10 unavailable (")
    assert str(refused.value).endswith("set data.download=true on a machine with internet")


# ---- which builder, and fractions ---------------------------------------------------------


def two_splits(cfg, seed):
    return Splits(held(40), held(16, 40), held(24, 60), ["x", "y"])


def by_seed(cfg, seed):
    """The builder's seed decides its validation split, as carve_validation's does."""
    train, val = datasets.carve_validation(held(20), 5, seed)
    return Splits(train, val, held(2, 50), ["x", "y"])


def one_argument(cfg):
    return None


def test_the_builder_is_the_callable_target_names():
    assert datasets.builder(OmegaConf.create({"_target_": f"{__name__}.two_splits"})) is two_splits
    for target, allowed in [
        ("no_such_module.build", "cannot import it: "),
        (f"{__name__}.one_argument", "a builder that takes (data config, seed) and returns Splits"),
        ("builtins.len", "a builder that takes (data config, seed) and returns Splits"),
    ]:
        with pytest.raises(ConfigError) as refused:
            datasets.builder(OmegaConf.create({"_target_": target}))
        assert str(refused.value).startswith(f"data._target_={target!r} is not allowed: {allowed}")


def data_cfg(target="two_splits", **chosen):
    return OmegaConf.create({"_target_": f"{__name__}.{target}", **chosen})


def not_splits(cfg, seed):
    return [1, 2]


def test_a_builder_must_return_splits():
    with pytest.raises(ConfigError) as refused:
        datasets.build_splits(data_cfg("not_splits"), 0)
    assert str(refused.value) == (
        f"data._target_='{__name__}.not_splits' is not allowed: returned list; use a builder "
        "that returns repro.core.data.datasets.Splits"
    )


def test_a_fraction_keeps_a_seeded_part_of_every_split_in_order():
    splits = datasets.build_splits(data_cfg(fraction=0.25), split_seed=4)
    assert [len(splits.train), len(splits.val), len(splits.test)] == [10, 4, 6]
    for name, size, first in (("train", 40, 0), ("val", 16, 40), ("test", 24, 60)):
        order = torch.randperm(size, generator=torch_generator(4, f"fraction/{name}"))
        kept = round(size * 0.25)
        assert numbers(getattr(splits, name)) == sorted((order[:kept] + first).tolist()), name
    whole = datasets.build_splits(data_cfg(fraction=1.0), split_seed=4)
    assert [len(whole.train), len(whole.val), len(whole.test)] == [40, 16, 24]
    built = two_splits(None, 0)
    assert datasets._keep_fractions(built, OmegaConf.create({"fraction": 1.0}), 4) is built
    assert datasets._keep_fractions(built, OmegaConf.create({}), 4) is built, "older configs"
    tiny = datasets.build_splits(data_cfg(fraction=0.01), split_seed=4)
    assert [len(tiny.train), len(tiny.val), len(tiny.test)] == [1, 1, 1]


def test_the_builder_gets_the_runs_seed():
    first = datasets.build_splits(data_cfg("by_seed"), split_seed=1)
    assert numbers(first.val) == numbers(by_seed(None, 1).val)
    assert numbers(datasets.build_splits(data_cfg("by_seed"), split_seed=2).val) != numbers(
        first.val
    )


def val_tested(cfg, seed):
    val = held(8, 10)
    return Splits(held(10), val, val, ["x", "y"], resized=True, any_size=True)


def test_a_fraction_keeps_one_split_used_twice_the_same(tmp_path):
    splits = datasets.build_splits(data_cfg("val_tested", fraction=0.5), split_seed=2)
    assert splits.test is splits.val and len(splits.val) == 4
    assert splits.resized and splits.any_size and splits.classes == ["x", "y"]


# ---- the decoded cache --------------------------------------------------------------------


def test_files_are_decoded_once_per_split_and_an_empty_split_stays_in_memory(monkeypatch):
    decoded = []

    def decode(source, cfg, name, progress):
        assert cfg is settings
        decoded.append((name, len(source), progress))
        return held(len(source), 100 * len(decoded))

    monkeypatch.setattr(datasets, "decode", decode)
    files = ImageFiles([Path(f"{i}.png") for i in range(3)], [0, 1, 0])
    empty = ImageFiles([], [])
    splits = Splits(files, empty, files, ["a", "b"], any_size=True)
    settings = SimpleNamespace()
    out = datasets.decode_splits(splits, settings, progress="on")
    assert decoded == [("train", 3, "on")]
    assert out.train is out.test and numbers(out.train) == [100, 101, 102]
    assert isinstance(out.val, TensorImages) and len(out.val) == 0 == len(out.val.images)
    assert out.val.images.shape[1:] == out.train.images.shape[1:]
    assert out.resized and out.any_size
    in_memory = Splits(held(2), held(1), held(1), ["a"])
    assert datasets.decode_splits(in_memory, SimpleNamespace()) is in_memory
    assert len(decoded) == 1
    held_empty = held(0)
    mixed = datasets.decode_splits(Splits(files, held_empty, held(1), ["a", "b"]), settings)
    assert mixed.val is held_empty, "an empty split already in memory is kept as it is"


def test_build_splits_decodes_only_with_data_cache_memory(monkeypatch):
    asked = []

    def decode_splits(splits, cfg, progress):
        assert isinstance(splits, Splits) and cfg.cache == "memory"
        asked.append(progress)
        return splits

    monkeypatch.setattr(datasets, "decode_splits", decode_splits)
    datasets.build_splits(data_cfg(cache="none"), 0)
    datasets.build_splits(data_cfg(), 0)
    assert asked == []
    datasets.build_splits(data_cfg(cache="memory"), 0, progress="off")
    assert asked == ["off"]


# ---- an option's own settings -------------------------------------------------------------


def labelled(cfg, seed, *, labels_file: str, folds: int = 5, scale: float | None = None):
    return two_splits(cfg, seed)


def open_ended(cfg, seed, **anything):
    return two_splits(cfg, seed)


open_ended.may_change = ("endpoint", 3, "cache_dir")


def settings(target="labelled", **own):
    return OmegaConf.create({"_target_": f"{__name__}.{target}", "val_size": 1, **own})


def test_the_settings_the_schema_does_not_declare_go_to_the_builder():
    cfg = settings(labels_file="a.csv", folds=3, scale=2)
    assert datasets.own_settings(cfg) == {"labels_file": "a.csv", "folds": 3, "scale": 2}
    assert datasets.check_settings(labelled, cfg) == {
        "labels_file": "a.csv",
        "folds": 3,
        "scale": 2,
    }
    nested = settings("open_ended", shards={"train": [1, 2]})
    assert datasets.own_settings(nested) == {"shards": {"train": [1, 2]}}
    assert type(datasets.own_settings(nested)["shards"]) is dict


@pytest.mark.parametrize(
    ("own", "message"),
    [
        (
            {"labels_file": "a.csv", "label_file": "b.csv"},
            "data.label_file='b.csv' is not allowed: not a key of "
            f"{__name__}.labelled (its own: labels_file, folds, scale); did you mean "
            "data.labels_file?",
        ),
        (
            {"labels_file": "a.csv", "zzz": 1},
            f"data.zzz=1 is not allowed: not a key of {__name__}.labelled (its own: "
            "labels_file, folds, scale)",
        ),
        (
            {"labels_file": 3},
            f"data.labels_file=3 is not allowed: a value of type str, as {__name__}.labelled "
            "declares",
        ),
        (
            {"labels_file": "a.csv", "folds": 2.5},
            "data.folds=2.5 is not allowed: a value of type int",
        ),
        ({}, f"data.labels_file=None is not allowed: a value: {__name__}.labelled requires it"),
    ],
)
def test_a_setting_the_builder_does_not_take_as_given_is_one_line(own, message):
    with pytest.raises(ConfigError) as refused:
        datasets.check_settings(labelled, settings(**own))
    assert str(refused.value).startswith(message)
    if "zzz" in message:
        assert str(refused.value) == message, "no closest key: nothing more said"


def test_a_builder_with_keyword_arguments_takes_any_setting():
    cfg = settings("open_ended", anything=1, at_all="x")
    assert datasets.check_settings(open_ended, cfg) == {"anything": 1, "at_all": "x"}


def test_a_builder_taking_nothing_of_its_own_says_none():
    with pytest.raises(ConfigError, match=r"\(its own: none\)"):
        datasets.check_settings(two_splits, settings("two_splits", extra=1))


def unresolvable(cfg, seed, *, thing: NoSuchType = None):  # noqa: F821
    return two_splits(cfg, seed)


def test_an_annotation_that_does_not_resolve_types_nothing():
    assert datasets.check_settings(unresolvable, settings("unresolvable", thing=3)) == {"thing": 3}


def test_the_settings_that_may_change_are_the_builders_named_strings():
    assert datasets.settings_that_may_change(settings("open_ended")) == (
        "data.endpoint",
        "data.cache_dir",
    )
    assert datasets.settings_that_may_change(settings("labelled")) == ()
    assert datasets.settings_that_may_change(settings("no_such_builder")) == ()


@pytest.mark.parametrize(
    ("value", "hint", "fits"),
    [
        (3, int, True),
        (3.0, int, False),
        (True, int, False),
        (3, float, True),
        (2.5, float, True),
        (False, float, False),
        (True, bool, True),
        (1, bool, False),
        ("a", str, True),
        ("a", Path, True),
        (3, str, False),
        (None, int | None, True),
        (None, int, False),
        (4, int | None, True),
        ("x", int | None, False),
        ([1], list, True),
        ([1], list[int], True),
        ((1,), tuple[int, ...], True),
        ({"a": 1}, list, False),
        ({"a": 1}, dict, True),
        ({"a": 1}, dict[str, int], True),
        ([1], dict, False),
        (object(), set, True),
    ],
)
def test_a_value_fits_a_simple_annotation(value, hint, fits):
    assert datasets._fits(value, hint) is fits


def test_the_declared_keys_are_typed_in_place_and_a_missing_one_is_named():
    data = OmegaConf.create({"_target_": "x", "image_size": "32", "fraction": 1, "extra": "y"})
    datasets.typed_data(data)
    assert data.image_size == 32 and isinstance(data.fraction, float) and data.extra == "y"
    with pytest.raises(ConfigError) as missing:
        datasets.typed_data(OmegaConf.create({"image_size": "???"}))
    assert str(missing.value) == (
        "data.image_size='???' is not allowed: a value: the data option must set it"
    )
    with pytest.raises(ConfigError, match=r"^data\.labels_file='\?\?\?' is not allowed: a value"):
        datasets.own_settings(OmegaConf.create({"labels_file": "???"}))
    with pytest.raises(ConfigError) as wrong:
        datasets.typed_data(OmegaConf.create({"image_size": "big"}))
    assert str(wrong.value) == "data.image_size='big' is not allowed: a value of type int"


class FakeCifar:
    """torchvision's CIFAR10 as far as the builder reads it: HWC uint8 data and targets."""

    made: ClassVar[list] = []

    def __init__(self, root: str, train: bool, download: bool) -> None:
        FakeCifar.made.append((root, train, download))
        count = 12 if train else 4
        self.data = (
            (torch.arange(count * 4 * 4 * 3) % 256).to(torch.uint8).view(count, 4, 4, 3).numpy()
        )
        self.targets = [index % 3 for index in range(count)] if train else [2, 1, 0, 2]
        self.classes = ["plane", "car", "bird"]


def test_cifar10_comes_from_torchvision_as_chw_tensors_with_a_seeded_validation_split(
    tmp_path, monkeypatch
):
    import torchvision.datasets

    FakeCifar.made = []
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCifar)
    cfg = OmegaConf.create({"root": str(tmp_path), "download": True, "val_size": 3})
    splits = datasets.cifar10(cfg, 5)
    assert FakeCifar.made == [(str(tmp_path), True, True), (str(tmp_path), False, True)]
    train = FakeCifar(str(tmp_path), True, True)
    chw = torch.from_numpy(train.data).permute(0, 3, 1, 2)
    fit, val = datasets.carve_validation(TensorImages(chw, torch.tensor(train.targets)), 3, 5)
    assert torch.equal(splits.train.images, fit.images) and torch.equal(
        splits.val.images, val.images
    )
    assert splits.train.images.is_contiguous() and splits.train.images.shape[1:] == (3, 4, 4)
    assert splits.val.labels.tolist() == val.labels.tolist()
    assert splits.test.labels.tolist() == [2, 1, 0, 2] and splits.test.images.shape == (4, 3, 4, 4)
    assert splits.classes == ["plane", "car", "bird"]


def test_cifar10_missing_says_to_download_only_when_it_may_not(tmp_path, monkeypatch):
    import torchvision.datasets

    def missing(root, train, download):
        raise RuntimeError("Dataset not found")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", missing)
    for download, hint in [
        (False, " set data.download=true on a machine with internet"),
        (True, " "),
    ]:
        cfg = OmegaConf.create({"root": str(tmp_path), "download": download, "val_size": 1})
        with pytest.raises(DataError) as refused:
            datasets.cifar10(cfg, 0)
        assert str(refused.value) == (
            f"data.root={tmp_path}: CIFAR-10 unavailable (Dataset not found){hint}"
        )
    with pytest.raises(ConfigError) as refused:
        datasets.cifar10(OmegaConf.create({"root": None, "download": False, "val_size": 1}), 0)
    assert str(refused.value).endswith(
        "a folder path: the folder CIFAR-10 is in (or is downloaded into)"
    )


def test_an_image_folder_without_a_root_says_what_it_needs():
    with pytest.raises(ConfigError) as refused:
        datasets.imagefolder(
            OmegaConf.create({"root": None, "num_classes": None, "val_size": 1}), 0
        )
    assert str(refused.value) == (
        "data.root=None is not allowed: a folder path: a folder holding train/ (and val/, "
        "test/), one subfolder per class"
    )
