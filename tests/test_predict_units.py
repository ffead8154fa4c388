"""predict.py on a checkpoint written in the test (no training): which files are read, each
row's classes and probabilities recomputed by hand from the model, a multi-label run's rows,
the refusals and the CSV the command writes."""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from repro import predict
from repro.core import restore
from repro.core.data import synthetic
from repro.core.errors import ConfigError, DataError
from repro.core.runs.trust import UntrustedConfigError

from conftest import compose_config, tiny, write_checkpoint

SEED = 7


def stored(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_config(*tiny(*overrides)), resolve=True)


# The synthetic data's classes: a checkpoint of other classes is refused. Read from the module,
# not by building the data here: torch run at import would hang the mutants forked after it.
CLASSES = list(synthetic.CLASSES)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Five 32x32 images (the run's size, so nothing is resized), one of them in a subfolder
    and one with an upper-case suffix, beside a file that is no image."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    (root / "inner").mkdir()
    for name in ("b.png", "a.jpg", "inner/c.png", "D.PNG", "e.jpeg"):
        pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / name)  # a JPEG's loss is read back by both
    (root / "notes.txt").write_text("no image")
    return root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    file = tmp_path_factory.mktemp("run") / "last.pt"
    write_checkpoint(file, stored(), SEED, classes=CLASSES)
    return file


def probabilities_by_hand(file, paths, tta: str = "none") -> torch.Tensor:
    run = restore.restore(file, "cpu")
    pixels = [np.asarray(Image.open(path).convert("RGB")) for path in paths]
    batch = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).contiguous()
    inputs, _ = run.to_device(batch, torch.zeros(len(paths), dtype=torch.long))
    with torch.no_grad():
        logits = run.model(inputs)
        if tta == "flip":
            logits = (logits + run.model(inputs.flip(-1))) / 2
    return logits.softmax(1)


def test_a_folder_gives_its_image_files_in_sorted_order_and_a_file_itself(images):
    found = predict.image_files(images)
    names = ["D.PNG", "a.jpg", "b.png", "e.jpeg", "inner/c.png"]
    assert found == [images / name for name in names]
    assert predict.image_files(images / "b.png") == [images / "b.png"]
    assert predict.image_files(images / "notes.txt") == [images / "notes.txt"]  # as asked


def test_a_missing_path_or_a_folder_without_images_is_refused(tmp_path):
    with pytest.raises(DataError) as refused:
        predict.image_files(tmp_path / "gone")
    assert str(refused.value) == f"images={tmp_path / 'gone'}: no such file or folder"
    (tmp_path / "notes.txt").write_text("no image")
    with pytest.raises(DataError) as refused:
        predict.image_files(tmp_path)
    assert str(refused.value) == (
        f"images={tmp_path}: no image files (.bmp, .gif, .jpeg, .jpg, .png, .ppm, .tif, .tiff, "
        ".webp) under it"
    )


@pytest.mark.parametrize("tta", ["none", "flip"])
def test_each_rows_classes_and_probabilities_are_the_models(checkpoint, images, tta):
    paths = predict.image_files(images)
    rows = predict.predict_files(checkpoint, images, top_k=3, tta=tta, batch_size=2)
    expected = probabilities_by_hand(checkpoint, paths, tta)
    assert [row["path"] for row in rows] == [str(path) for path in paths]
    for row, probabilities in zip(rows, expected, strict=True):
        best = probabilities.topk(3)
        ranked = ["class", "probability", "class_2", "probability_2", "class_3", "probability_3"]
        assert list(row) == ["path", *ranked]
        for rank, suffix in enumerate(("", "_2", "_3")):
            assert row[f"class{suffix}"] == CLASSES[int(best.indices[rank])]
            assert row[f"probability{suffix}"] == pytest.approx(float(best.values[rank]), abs=2e-6)
            assert row[f"probability{suffix}"] == round(row[f"probability{suffix}"], 6)


def test_one_class_per_row_by_default_and_classes_numbered_without_names(tmp_path, images):
    file = tmp_path / "last.pt"
    write_checkpoint(file, stored(), SEED)
    rows = predict.predict_files(file, images / "b.png")
    assert list(rows[0]) == ["path", "class", "probability"]
    assert rows[0]["class"] in [str(i) for i in range(10)]
    expected = probabilities_by_hand(file, [images / "b.png"])[0]
    assert rows[0]["class"] == str(int(expected.argmax()))


def test_a_multi_label_runs_rows_name_the_labels_over_one_half_and_each_probability(
    tmp_path, images
):
    file = tmp_path / "last.pt"
    labels = [f"tag {i}" for i in range(10)]
    write_checkpoint(file, stored("objective=multilabel_bce"), SEED, classes=labels)
    rows = predict.predict_files(file, images)
    run = restore.restore(file, "cpu")
    paths = predict.image_files(images)
    pixels = torch.from_numpy(np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths]))
    inputs, _ = run.to_device(pixels.permute(0, 3, 1, 2).contiguous(), torch.zeros(5).long())
    with torch.no_grad():
        expected = run.model(inputs).sigmoid()
    for row, probabilities, path in zip(rows, expected, paths, strict=True):
        assert list(row) == ["path", "labels", *[f"p_tag_{i}" for i in range(10)]]
        said = [labels[i] for i, value in enumerate(probabilities) if value > 0.5]
        assert row["labels"] == ";".join(said)
        assert row["path"] == str(path)
        for i, value in enumerate(probabilities.tolist()):
            assert row[f"p_tag_{i}"] == pytest.approx(value, abs=2e-6)
            assert row[f"p_tag_{i}"] == round(row[f"p_tag_{i}"], 6)
    assert any(row["labels"] for row in rows) and any(";" in row["labels"] for row in rows)


def test_every_class_may_be_asked_for(checkpoint, images):
    rows = predict.predict_files(checkpoint, images / "b.png", top_k=10)
    assert sorted(rows[0][f"class{'' if rank == 1 else f'_{rank}'}"] for rank in range(1, 11)) == (
        sorted(CLASSES)
    )


@pytest.mark.parametrize("top_k", [0, 11, 2.0, "3"])
def test_a_top_k_outside_the_classes_is_refused(checkpoint, images, top_k):
    with pytest.raises(ConfigError) as refused:
        predict.predict_files(checkpoint, images, top_k=top_k)
    assert str(refused.value) == (
        f"top_k={top_k!r} is not allowed: an integer from 1 to the 10 classes"
    )


def test_the_command_writes_one_csv_row_per_image_and_says_where(
    checkpoint, images, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "rows.csv"
    predict.main([f"ckpt={checkpoint}", f"images={images}", f"out={out}", "top_k=2"])
    assert capsys.readouterr().out.strip() == f"5 images: predictions in {out}"
    with out.open(newline="") as file:
        written = list(csv.DictReader(file))
    rows = predict.predict_files(checkpoint, images, top_k=2)
    assert written == [{key: str(value) for key, value in row.items()} for row in rows]
    flipped = tmp_path / "flipped.csv"
    predict.main([f"ckpt={checkpoint}", f"images={images}", f"out={flipped}", "tta=flip"])
    with flipped.open(newline="") as file:
        written = list(csv.DictReader(file))
    rows = predict.predict_files(checkpoint, images, tta="flip")
    assert written == [{key: str(value) for key, value in row.items()} for row in rows]
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    predict.main([f"ckpt={checkpoint}", f"images={images / 'b.png'}"])
    assert (tmp_path / "predictions.csv").read_text().splitlines()[0] == "path,class,probability"


def test_a_cell_that_would_run_in_a_spreadsheet_is_written_as_text(tmp_path, images):
    file = tmp_path / "last.pt"
    classes = [f"=cmd{i}" for i in range(10)]
    write_checkpoint(file, stored(), SEED, classes=classes)
    # The synthetic data's class names are not these: predict reads no split, so it runs.
    out = tmp_path / "rows.csv"
    predict.main([f"ckpt={file}", f"images={images / 'b.png'}", f"out={out}"])
    with out.open(newline="") as written:
        (row,) = list(csv.DictReader(written))
    assert row["class"].startswith("'=cmd") and row["probability"][0].isdigit()


def test_a_refused_argument_is_one_line_and_an_existing_out_is_kept(
    checkpoint, images, tmp_path, capsys
):
    out = tmp_path / "rows.csv"
    out.write_text("kept")
    for argv in (
        [f"ckpt={checkpoint}", f"images={images}", f"out={out}"],
        [f"ckpt={checkpoint}", f"out={tmp_path / 'new.csv'}"],
        [f"ckpt={checkpoint}", f"images={images}", "top_k=0", f"out={tmp_path / 'new.csv'}"],
        [f"ckpt={checkpoint}", f"images={images}", "split=val"],
    ):
        with pytest.raises(SystemExit) as ended:
            predict.main(argv)
        assert ended.value.code == 2
        said = capsys.readouterr().err.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("error: "), said
    assert out.read_text() == "kept" and not (tmp_path / "new.csv").exists()
    said = "images=None is not allowed: a folder of image files (or one file)"
    with pytest.raises(SystemExit):
        predict.main([f"ckpt={checkpoint}", f"out={tmp_path / 'new.csv'}"])
    assert said in capsys.readouterr().err
    predict.main([f"ckpt={checkpoint}", f"images={images}", f"out={out}", "overwrite=true"])
    assert out.read_text().startswith("path,class,probability")


def test_a_model_from_code_this_checkout_does_not_know_runs_only_when_trusted(
    tmp_path, images, capsys, monkeypatch
):
    file = tmp_path / "last.pt"
    small = [o for o in tiny() if not o.startswith("model.")]
    colleague = compose_config(
        *small, "model=torchvision", "model._target_=colleague_nets.tiny_net"
    )
    colleague = OmegaConf.to_container(colleague, resolve=True)
    write_checkpoint(file, colleague, SEED)
    with pytest.raises(UntrustedConfigError, match=r"colleague_nets\.tiny_net"):
        predict.predict_files(file, images / "b.png")
    assert len(predict.predict_files(file, images / "b.png", trust=True)) == 1
    guarded = []

    @contextlib.contextmanager
    def offline(why):
        guarded.append(why)
        yield

    monkeypatch.setattr(predict, "offline", offline)
    out = tmp_path / "rows.csv"
    with pytest.raises(SystemExit):
        predict.main([f"ckpt={file}", f"images={images}", f"out={out}"])
    assert "colleague_nets.tiny_net" in capsys.readouterr().err and not out.exists()
    predict.main([f"ckpt={file}", f"images={images}", f"out={out}", "trust=true"])
    assert len(out.read_text().splitlines()) == 1 + 5
    assert guarded == [f"the config comes from ckpt={file}"] * 2


def test_files_of_any_size_are_resized_to_the_runs_image_size(checkpoint, tmp_path):
    rng = np.random.default_rng(2)
    for name, shape in (("wide.png", (40, 48, 3)), ("square.png", (64, 64, 3))):
        pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / name)
    rows = predict.predict_files(checkpoint, tmp_path)  # one batch: one size after the resize
    assert [row["path"] for row in rows] == [
        str(tmp_path / "square.png"),
        str(tmp_path / "wide.png"),
    ]


def test_a_label_is_said_only_over_one_half():
    row = predict._labels_row(Path("x.png"), torch.tensor([0.5, 0.75, 0.25]), ["a", "b", "c"])
    assert row == {"path": "x.png", "labels": "b", "p_a": 0.5, "p_b": 0.75, "p_c": 0.25}


def test_files_are_sized_as_the_runs_recorded_normalisation_says(tmp_path, images, monkeypatch):
    file = tmp_path / "last.pt"
    own = {"mean": [0.1, 0.2, 0.3], "std": [0.5] * 3, "image_size": 16, "interpolation": "bicubic"}
    write_checkpoint(file, stored(), SEED, normalisation=own)  # a pretrained model's own
    shapes, real = [], predict.predict
    monkeypatch.setattr(
        predict,
        "predict",
        lambda model, batch, tta: shapes.append(batch.shape) or real(model, batch, tta),
    )
    assert len(predict.predict_files(file, images)) == 5
    assert shapes == [(5, 3, 16, 16)]
