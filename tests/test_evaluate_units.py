"""evaluate.py on a checkpoint written in the test (no training): each figure recomputed by
hand from the model and the split, the per-class rows, the refusals and what the command
prints and writes."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn import functional

from repro import build, evaluate
from repro.data import synthetic
from repro.data.sources import in_memory
from repro.errors import CheckpointError, ConfigError
from repro.runs import restore

from conftest import compose_config, tiny, write_checkpoint

SEED = 7


def stored(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_config(*tiny(*overrides)), resolve=True)


# The synthetic data's classes: a checkpoint of other classes is refused. Read from the module,
# not by building the data here: torch run at import would hang the mutants forked after it.
CLASSES = list(synthetic.CLASSES)


def by_hand(file, split: str, tta: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    """The split's logits (with `tta`'s views) and labels, from the model and the images."""
    run = restore.restore(file, "cpu")
    data = build.splits(run.cfg, SEED)
    held = in_memory(getattr(data, split))
    images, labels = run.to_device(held.images, held.labels)
    with torch.no_grad():
        logits = run.model(images)
        if tta == "flip":
            logits = (logits + run.model(images.flip(-1))) / 2
    return logits, labels


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    file = tmp_path_factory.mktemp("run") / "last.pt"
    write_checkpoint(file, stored("trainer.tta=flip", "data.test_size=6"), SEED, classes=CLASSES)
    return file


@pytest.mark.parametrize("split", ["val", "test"])
def test_a_splits_loss_and_accuracy_are_the_models_on_its_images(checkpoint, split):
    result = evaluate.evaluate_checkpoint(checkpoint, split=split, tta="none")
    logits, labels = by_hand(checkpoint, split)
    assert result["loss"] == pytest.approx(functional.cross_entropy(logits, labels).item())
    assert result["acc"] == pytest.approx((logits.argmax(1) == labels).double().mean().item())
    assert (result["split"], result["images"], result["step"]) == (split, len(labels), 3)
    assert result["tta"] == "none" and "metrics" not in result and "per_class" not in result


def test_the_runs_test_time_augmentation_is_used_unless_one_is_named(checkpoint):
    result = evaluate.evaluate_checkpoint(checkpoint, split="val")
    logits, labels = by_hand(checkpoint, "val", tta="flip")
    assert result["tta"] == "flip"
    assert result["loss"] == pytest.approx(functional.cross_entropy(logits, labels).item())
    plain = evaluate.evaluate_checkpoint(checkpoint, split="val", tta="none")
    assert plain["loss"] != pytest.approx(result["loss"])


def test_each_classs_accuracy_and_the_confusion_matrix_are_counted_by_hand(checkpoint):
    result = evaluate.evaluate_checkpoint(checkpoint, split="test", tta="none", per_class=True)
    logits, labels = by_hand(checkpoint, "test")
    predicted = logits.argmax(1)
    confusion = torch.zeros(10, 10, dtype=torch.long)
    for true, guess in zip(labels.tolist(), predicted.tolist(), strict=True):
        confusion[true, guess] += 1
    assert result["confusion"] == confusion.tolist()
    rows = result["per_class"]
    assert [row["class"] for row in rows] == CLASSES
    for index, row in enumerate(rows):
        images = int((labels == index).sum())
        assert row["images"] == images
        right = int(((labels == index) & (predicted == index)).sum())
        assert row["acc"] == (right / images if images else None)
    assert any(row["acc"] is None for row in rows), "six images leave some class without one"


def test_a_checkpoint_trained_on_other_classes_is_refused(tmp_path):
    file = tmp_path / "last.pt"
    write_checkpoint(file, stored(), SEED, classes=[f"c{i}" for i in range(10)])
    with pytest.raises(CheckpointError, match=r"its outputs mean others: point data\.root"):
        evaluate.evaluate_checkpoint(file)


def test_a_runs_metrics_are_computed_on_the_split_and_named(tmp_path):
    file = tmp_path / "last.pt"
    write_checkpoint(file, stored("metrics=[top5]"), SEED)
    result = evaluate.evaluate_checkpoint(file, split="val", tta="none")
    logits, labels = by_hand(file, "val")
    top5 = (logits.topk(5, dim=1).indices == labels[:, None]).any(1).double().mean().item()
    assert result["metrics"] == ["top5"] and result["top5"] == pytest.approx(top5)


def test_classes_are_numbered_when_the_checkpoint_names_none(tmp_path):
    file = tmp_path / "last.pt"
    write_checkpoint(file, stored("data.test_size=20"), SEED)
    result = evaluate.evaluate_checkpoint(file, tta="none", per_class=True)
    assert [row["class"] for row in result["per_class"]] == [str(i) for i in range(10)]
    assert sum(row["images"] for row in result["per_class"]) == result["images"] == 20


def test_a_split_a_per_class_or_an_empty_split_not_allowed_is_refused(checkpoint, tmp_path):
    cases = {
        ("val", "yes"): "per_class='yes' is not allowed: true or false",
        ("dev", False): "split='dev' is not allowed: choose one of train, val, test",
    }
    for (split, per_class), message in cases.items():
        with pytest.raises(ConfigError) as refused:
            evaluate.evaluate_checkpoint(checkpoint, split=split, per_class=per_class)
        assert str(refused.value) == message
    file = tmp_path / "last.pt"
    write_checkpoint(file, stored("data.val_size=0"), SEED)
    with pytest.raises(ConfigError) as refused:
        evaluate.evaluate_checkpoint(file, split="val")
    assert str(refused.value) == (
        "split='val' is not allowed: a split with images (this run has no validation split)"
    )


def test_the_command_prints_its_figures_and_writes_them_as_json(checkpoint, tmp_path, capsys):
    out = tmp_path / "result.json"
    evaluate.main([f"ckpt={checkpoint}", "split=test", "per_class=true", f"out={out}"])
    printed = capsys.readouterr().out.splitlines()
    written = json.loads(out.read_text())
    assert printed[0] == (
        f"test: loss {written['loss']:.4f}  acc {written['acc']:.4f}  (6 images, checkpoint "
        "step 3, flip test-time augmentation)"
    )
    shown = [
        f"  {row['class']}: acc {'-' if row['acc'] is None else format(row['acc'], '.4f')} "
        f"({row['images']} images)"
        for row in written["per_class"]
    ]
    assert printed[1:] == shown
    assert written["tta"] == "flip" and written["split"] == "test"
    evaluate.main([f"ckpt={checkpoint}", "split=val", "tta=none"])
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("val: loss ") and line.endswith("(128 images, checkpoint step 3)")


def test_the_command_prints_each_metric_and_a_matrix_row_by_row(tmp_path, capsys):
    file = tmp_path / "last.pt"
    write_checkpoint(file, stored("metrics=[top5,confusion_matrix]", "data.test_size=4"), SEED)
    evaluate.main([f"ckpt={file}", "tta=none", f"out={tmp_path / 'r.json'}"])
    printed = capsys.readouterr().out.splitlines()
    written = json.loads((tmp_path / "r.json").read_text())
    matrix = written["confusion_matrix"]
    assert printed[1] == f"  top5: {written['top5']:.4f}"
    assert printed[2] == "  confusion_matrix:"
    assert printed[3:] == ["    " + " ".join(map(str, row)) for row in matrix]
    assert sum(map(sum, matrix)) == 4


def test_a_refused_argument_is_one_line_and_an_existing_out_is_kept(checkpoint, tmp_path, capsys):
    out = tmp_path / "result.json"
    out.write_text("kept")
    for argv in (
        [f"ckpt={checkpoint}", f"out={out}"],
        [f"ckpt={checkpoint}", "split=dev"],
        [f"ckpt={checkpoint}", "colour=red"],
    ):
        with pytest.raises(SystemExit) as ended:
            evaluate.main(argv)
        assert ended.value.code == 2
        said = capsys.readouterr().err.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("error: "), said
    assert out.read_text() == "kept"
    evaluate.main([f"ckpt={checkpoint}", f"out={out}", "overwrite=true", "tta=none"])
    assert json.loads(out.read_text())["tta"] == "none"
