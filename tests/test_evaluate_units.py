"""evaluate.py on a checkpoint written in the test (no training): each figure recomputed by
hand from the model and the split, the per-class rows, the refusals and what the command
prints and writes."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn import functional

from repro import evaluate
from repro.core import build, restore
from repro.core.data import synthetic
from repro.core.data.sources import in_memory
from repro.core.errors import CheckpointError, ConfigError
from repro.core.runs.trust import UntrustedConfigError

from conftest import IMAGEFOLDER, SHAPES, compose_config, make_image_tree, tiny, write_checkpoint

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
    assert "confusion" not in result, "classes are counted only with per_class"


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


def test_each_classs_accuracy_is_its_right_answers_over_its_images(checkpoint):
    result = evaluate.evaluate_checkpoint(checkpoint, split="val", tta="none", per_class=True)
    for index, row in enumerate(result["per_class"]):
        counts = result["confusion"][index]
        assert row["images"] == sum(counts)
        assert row["acc"] == (counts[index] / sum(counts) if sum(counts) else None)
    assert any(row["acc"] and row["images"] > 1 for row in result["per_class"])


def test_the_stored_download_is_never_followed_and_the_users_is(checkpoint, monkeypatch):
    asked, real = [], build.splits
    monkeypatch.setattr(
        build, "splits", lambda cfg, seed: asked.append(cfg.data.download) or real(cfg, seed)
    )
    evaluate.evaluate_checkpoint(checkpoint, split="val", tta="none")
    evaluate.evaluate_checkpoint(checkpoint, split="val", tta="none", download=True)
    assert asked == [False, True]


def test_a_batch_size_given_sizes_the_loaders_batches(checkpoint, monkeypatch):
    batches, real = [], evaluate.Batches
    monkeypatch.setattr(
        evaluate, "Batches", lambda loader: batches.append(len(loader)) or real(loader)
    )
    result = evaluate.evaluate_checkpoint(checkpoint, split="val", tta="none", batch_size=5)
    assert batches == [26] and result["images"] == 128  # 25 of five, and three


def test_a_model_from_code_this_checkout_does_not_know_runs_only_when_trusted(tmp_path):
    file = tmp_path / "last.pt"
    small = [o for o in tiny("data.test_size=4") if not o.startswith("model.")]
    write_checkpoint(
        file, stored_of(*small, "model=torchvision", "model._target_=colleague_nets.tiny_net"), SEED
    )
    with pytest.raises(UntrustedConfigError, match=r"colleague_nets\.tiny_net"):
        evaluate.evaluate_checkpoint(file, tta="none")
    assert evaluate.evaluate_checkpoint(file, tta="none", trust=True)["images"] == 4


def stored_of(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_config(*overrides), resolve=True)


@pytest.fixture
def multilabel(tmp_path):
    """A multi-label checkpoint, with its labels named or not."""

    def write(named: bool):
        file = tmp_path / f"named_{named}.pt"
        config = stored(
            "objective=multilabel_bce", "data=synthetic_multilabel", "data.test_size=16"
        )
        write_checkpoint(file, config, SEED, **({"classes": CLASSES} if named else {}))
        return file

    return write


@pytest.mark.parametrize("named", [True, False])
def test_each_labels_average_precision_and_f1_are_listed_with_per_class(multilabel, named):
    result = evaluate.evaluate_checkpoint(multilabel(named), tta="none", per_class=True)
    columns = [name.lower() for name in CLASSES]
    assert [row["label"] for row in result["per_label"]] == CLASSES
    for row, column in zip(result["per_label"], columns, strict=True):
        assert (row["ap"], row["f1"]) == (result[f"ap_{column}"], result[f"f1_{column}"])
    assert "per_class" not in result and "confusion" not in result and 0 <= result["map"] <= 1


def test_the_command_prints_the_mean_and_each_labels_precision(multilabel, tmp_path, capsys):
    out = tmp_path / "r.json"
    evaluate.main([f"ckpt={multilabel(True)}", "tta=none", "per_class=true", f"out={out}"])
    printed = capsys.readouterr().out.splitlines()
    written = json.loads(out.read_text())
    assert printed[0].startswith(f"test: loss {written['loss']:.4f}  acc {written['acc']:.4f}")
    assert f"  map {written['map']:.4f}  (16 images" in printed[0]
    shown = [f"  {r['label']}: ap {r['ap']:.4f} f1 {r['f1']:.4f}" for r in written["per_label"]]
    assert printed[1:] == shown


def test_the_command_passes_each_argument_on(checkpoint, monkeypatch, capsys):
    calls, guarded = [], []

    def record(*args):
        calls.append(args)
        return {"split": "val", "loss": 1.0, "acc": 0.5, "images": 2, "step": 3, "tta": "none"}

    @contextlib.contextmanager
    def offline(why, allowed):
        guarded.append((why, allowed))
        yield

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", record)
    monkeypatch.setattr(evaluate, "offline", offline)
    evaluate.main([f"ckpt={checkpoint}"])
    given = ["split=val", "device=cpu", "data.root=/data/moved", "batch_size=5", "tta=flip"]
    evaluate.main([f"ckpt={checkpoint}", *given, "per_class=true", "trust=true", "download=true"])
    defaults = (checkpoint, "test", "auto", None, None, None, False, False, False)
    assert calls == [
        defaults,
        (checkpoint, "val", "cpu", "/data/moved", 5, "flip", True, True, True),
    ]
    why = f"the config comes from ckpt={checkpoint}"
    assert guarded == [(why, False), (why, True)]


@pytest.mark.parametrize("progress", ["off", None])
def test_a_memory_cached_run_decodes_the_split_evaluated_alone(tmp_path, monkeypatch, progress):
    tree = make_image_tree(tmp_path / "images", per_class=2, val_per_class=3, side=40)
    config = stored_of(*IMAGEFOLDER, "data.root=/data/moved/away", "data.cache=memory")
    if progress is None:  # an older checkpoint's config, from before logger.progress
        del config["logger"]["progress"]
    else:
        config["logger"]["progress"] = progress
    file = tmp_path / "last.pt"
    write_checkpoint(file, config, SEED, classes=sorted(SHAPES))
    decoded, told = [], []
    real_decode, real_pipelines = evaluate.decode, build.pipelines

    def decode(source, data, split, shown):
        decoded.append((len(source), split, shown))
        return real_decode(source, data, split, shown)

    def pipelines(cfg, resized, any_size, norm):
        told.append((resized, any_size, norm))
        return real_pipelines(cfg, resized, any_size, norm)

    monkeypatch.setattr(evaluate, "decode", decode)
    monkeypatch.setattr(build, "pipelines", pipelines)
    result = evaluate.evaluate_checkpoint(file, split="val", data_root=str(tree), tta="none")
    assert decoded == [(9, "val", progress or "auto")] and result["images"] == 9
    assert told == [(True, True, restore.restore(file, "cpu", str(tree)).normalisation)]
    assert 0 <= result["acc"] <= 1


def test_files_not_cached_are_read_one_by_one(tmp_path, monkeypatch):
    tree = make_image_tree(tmp_path / "images", per_class=2, val_per_class=3)
    file = tmp_path / "last.pt"
    config = stored_of(*IMAGEFOLDER, f"data.root={tree}", "data.resize=null")
    write_checkpoint(file, config, SEED, classes=sorted(SHAPES))
    monkeypatch.setattr(evaluate, "decode", lambda *args: pytest.fail("decoded without a cache"))
    result = evaluate.evaluate_checkpoint(file, split="val", tta="none")
    assert result["images"] == 9, "images of several sizes, each resized to the model's"


def test_other_classes_at_the_root_given_are_refused_naming_it(tmp_path):
    tree = make_image_tree(tmp_path / "images", per_class=1)
    file = tmp_path / "last.pt"
    write_checkpoint(
        file, stored_of(*IMAGEFOLDER, "data.root=/data/moved"), SEED, classes=["a", "b", "c"]
    )
    with pytest.raises(CheckpointError) as refused:
        evaluate.evaluate_checkpoint(file, split="val", data_root=str(tree))
    assert str(refused.value).startswith(f"data.root={tree}: the data has the classes [bar, blank")


def test_a_memory_cached_run_of_data_held_in_memory_decodes_nothing(tmp_path, monkeypatch):
    file = tmp_path / "last.pt"
    write_checkpoint(file, stored("data.cache=memory", "data.test_size=8"), SEED)
    monkeypatch.setattr(evaluate, "decode", lambda *args: pytest.fail("decoded a held split"))
    logits, labels = by_hand(file, "test")
    result = evaluate.evaluate_checkpoint(file, tta="none")
    assert result["loss"] == pytest.approx(functional.cross_entropy(logits, labels).item())
