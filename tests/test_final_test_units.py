"""runs/final_test.py: the test split evaluated once after training, on a trainer assembled in
this process (no training: its weights are the initial ones), each figure checked against a
pass written out here by hand."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch.nn import functional

from repro.core import build
from repro.core.data.loader import Batches
from repro.core.engine import assembly, final_test
from repro.core.runs.checkpoint import BEST_FILE, FORMAT, VERSION, Checkpointer, atomic_save
from repro.core.runtime.distributed import Context

from conftest import compose_config, tiny

SEED = 5
# 40 test images in batches of 16: the last batch is short.
SIZES = ("data.train_size=64", "data.val_size=32", "data.test_size=40")
BATCHES = ("trainer.batch_size=32", "trainer.eval_batch_size=16")
SMALL = tiny(*SIZES, *BATCHES, "trainer.test_after_fit=true", "memory_format=contiguous")


def assembled(tmp_path, *overrides: str):
    """A run's config, trainer and parts as train.py makes them, at step 0."""
    cfg = compose_config(*SMALL, *overrides)
    knobs = assembly.apply_knobs(cfg, Context())
    parts = assembly.build_parts(cfg, knobs, SEED, build.splits(cfg, SEED))
    checkpointer = Checkpointer(tmp_path / "checkpoints", 1)
    outputs = assembly.outputs(cfg, tmp_path, checkpointer, Context())
    saved = {"classes": list(parts.data.classes)}
    return cfg, assembly.trainer(cfg, knobs, parts, outputs, saved), parts


def finished(trainer):
    trainer.state.position.step = trainer.total_steps
    return trainer


def by_hand(cfg, trainer, parts, model, tta="none", smoothing=0.0) -> tuple[float, float, int]:
    """Mean cross-entropy, accuracy and count over the test split, one batch at a time."""
    _, transform = build.pipelines(
        cfg, parts.data.resized, parts.data.any_size, parts.normalisation
    )
    loader = build.evaluation_loader(
        cfg, parts.data.test, transform, parts.context, parts.normalisation
    )
    model.eval()
    loss, right, count = 0.0, 0, 0
    with torch.no_grad(), Batches(loader) as batches:  # the loader repeats: one pass
        for images, labels in batches.take(len(loader)):
            images, labels = trainer.data.to_device(images, labels)
            logits = model(images).float()
            if tta == "flip":
                logits = (logits + model(images.flip(-1)).float()) / 2
            losses = functional.cross_entropy(
                logits, labels, reduction="none", label_smoothing=smoothing
            )
            loss += losses.double().sum().item()
            right += (logits.argmax(1) == labels).sum().item()
            count += len(labels)
    return loss / count, right / count, count


def test_a_finished_run_tests_its_last_weights_on_the_whole_test_split(tmp_path, caplog):
    cfg, trainer, parts = assembled(tmp_path, "trainer.test_weights=last")
    loss, acc, count = by_hand(cfg, trainer, parts, trainer.model)
    assert count == 40
    with caplog.at_level(logging.INFO, logger="repro.core.engine.final_test"):
        result = final_test.test_after_fit(cfg, finished(trainer), parts)
    assert list(result) == ["test_loss", "test_acc", "test_weights"]
    assert result["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert result["test_acc"] == pytest.approx(acc, abs=1e-12)
    assert result["test_weights"] == "last"
    said = [r.getMessage() for r in caplog.records if r.name == "repro.core.engine.final_test"]
    assert said == [f"test (last weights) | loss {result['test_loss']:.4f} acc {acc:.4f}"]


def test_the_runs_tta_objective_and_metrics_reach_the_test(tmp_path):
    metrics = "metrics=[f1,confusion_matrix]"
    tested = ("trainer.test_weights=last", "trainer.tta=flip", "objective.label_smoothing=0.2")
    cfg, trainer, parts = assembled(tmp_path, *tested, metrics)
    loss, acc, _ = by_hand(cfg, trainer, parts, trainer.model, tta="flip", smoothing=0.2)
    plain, _, _ = by_hand(cfg, trainer, parts, trainer.model)
    result = final_test.test_after_fit(cfg, finished(trainer), parts)
    assert result["test_loss"] == pytest.approx(loss, rel=1e-5) and loss != pytest.approx(plain)
    assert result["test_acc"] == pytest.approx(acc, abs=1e-12)
    named = ["test_loss", "test_acc", "test_f1", "test_confusion_matrix", "test_weights"]
    assert list(result) == named
    matrix = result["test_confusion_matrix"]  # a matrix too: summary.json keeps it
    classes = len(parts.data.classes)
    assert len(matrix) == classes and sum(map(sum, matrix)) == 40
    assert sum(matrix[k][k] for k in range(classes)) == round(acc * 40)


def test_only_a_run_that_trained_to_its_end_or_stopped_early_is_tested(tmp_path):
    cfg, trainer, parts = assembled(tmp_path, "trainer.test_weights=last")
    trainer.state.position.step = trainer.total_steps - 1
    assert final_test.test_after_fit(cfg, trainer, parts) == {}  # stopped by a signal or a halt
    trainer.state.stopped_early = True
    assert final_test.test_after_fit(cfg, trainer, parts)["test_weights"] == "last"
    trainer.state.stopped_early = False
    trainer.state.position.step = trainer.total_steps + 1
    assert "test_acc" in final_test.test_after_fit(cfg, trainer, parts)
    cfg.trainer.test_after_fit = False
    assert final_test.test_after_fit(cfg, trainer, parts) == {}


def test_without_a_test_split_nothing_is_tested_and_it_says_so(tmp_path, caplog):
    cfg, trainer, parts = assembled(tmp_path, "trainer.test_weights=last")
    empty = parts.data.test.subset(torch.arange(0))
    parts.data = dataclasses.replace(parts.data, test=empty)
    with caplog.at_level(logging.INFO, logger="repro.core.engine.final_test"):
        assert final_test.test_after_fit(cfg, finished(trainer), parts) == {}
    said = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "repro.core.engine.final_test"
    ]
    assert said == [
        (
            "WARNING",
            "no test split (the validation split stood in for it and is empty): not tested",
        )
    ]
    one = build.splits(cfg, SEED).test.subset(torch.arange(1))  # a split of one image is tested
    parts.data = dataclasses.replace(parts.data, test=one)
    assert final_test.test_after_fit(cfg, trainer, parts)["test_acc"] in (0.0, 1.0)


def test_best_weights_are_this_runs_best_pt_as_a_copy_and_the_average_is_the_ema(tmp_path, caplog):
    cfg, trainer, parts = assembled(tmp_path, "trainer.test_weights=best", "+components=ema")
    best = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.state.position.step = 3
    folder = trainer.outputs.checkpointer.folder
    folder.mkdir(parents=True, exist_ok=True)
    atomic_save({"format": FORMAT, "version": VERSION, **trainer.state_dict()}, folder / BEST_FILE)
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter.mul_(-1.5)
    trainer.state.best.step = 3
    finished(trainer)
    loss, acc, _ = by_hand(cfg, trainer, parts, _with(trainer.model, best))
    with caplog.at_level(logging.INFO, logger="repro.core.engine.final_test"):
        result = final_test.test_after_fit(cfg, trainer, parts)
    assert result["test_weights"] == "best"
    assert result["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert result["test_acc"] == pytest.approx(acc, abs=1e-12)
    now = trainer.model.state_dict()  # best.pt went into a copy, the weights are the last
    assert not all(torch.equal(now[k], best[k]) for k in best)
    said = [r.getMessage() for r in caplog.records if r.name == "repro.core.engine.final_test"]
    assert said[0].startswith("test (best weights) | loss ")

    trainer.state.best.step = 4  # best.pt holds another step: the last weights, saying why
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="repro.core.engine.final_test"):
        assert final_test.test_after_fit(cfg, trainer, parts)["test_weights"] == "last"
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == final_test.__name__]
    assert said[0] == (
        "WARNING",
        f"no {folder / BEST_FILE} of the best step (4) in this run folder (checkpoints off, or "
        "resumed from another folder's checkpoint): testing the last weights",
    )
    assert said[1][1].startswith("test (last weights) | loss ") and len(said) == 2

    cfg.trainer.test_weights = "ema"
    average = trainer.callbacks.get("ema").model
    loss, _, _ = by_hand(cfg, trainer, parts, average)
    result = final_test.test_after_fit(cfg, trainer, parts)
    assert result["test_weights"] == "ema" and result["test_loss"] == pytest.approx(loss, rel=1e-5)


def _with(model, weights):
    import copy

    other = copy.deepcopy(model)
    other.load_state_dict(weights)
    return other


def test_the_test_split_is_loaded_and_evaluated_with_the_runs_own_parts(tmp_path, monkeypatch):
    cfg, trainer, parts = assembled(tmp_path, "trainer.test_weights=last")
    seen: dict[str, tuple] = {}

    def spy(name, real):
        def called(*args, **named):
            seen[name] = (args, named)
            return real(*args, **named)

        return called

    monkeypatch.setattr(final_test.build, "pipelines", spy("pipelines", build.pipelines))
    monkeypatch.setattr(
        final_test.build, "evaluation_loader", spy("loader", build.evaluation_loader)
    )
    monkeypatch.setattr(final_test, "evaluate", spy("evaluate", final_test.evaluate))
    final_test.test_after_fit(cfg, finished(trainer), parts)
    data = parts.data
    assert seen["pipelines"][0] == (cfg, data.resized, data.any_size, parts.normalisation)
    args = seen["loader"][0]
    assert args[1] is data.test and args[3] is parts.context and args[4] == parts.normalisation
    args, named = seen["evaluate"]
    assert args[5] is trainer.dist and args[6] == trainer.settings.tta
    assert named["label_names"] == trainer.classes == list(data.classes)


def test_a_multi_label_run_is_tested_on_its_labels_and_says_its_mean_precision(tmp_path, caplog):
    multi = ("objective=multilabel_bce", "data=synthetic_multilabel", "trainer.test_weights=last")
    cfg, trainer, parts = assembled(tmp_path, *multi)
    with caplog.at_level(logging.INFO, logger="repro.core.engine.final_test"):
        result = final_test.test_after_fit(cfg, finished(trainer), parts)
    names = [f"test_ap_{name}" for name in parts.data.classes]
    assert set(names) <= set(result) and "test_map" in result
    said = [r.getMessage() for r in caplog.records if r.name == "repro.core.engine.final_test"]
    loss, acc, mean = result["test_loss"], result["test_acc"], result["test_map"]
    assert said == [f"test (last weights) | loss {loss:.4f} acc {acc:.4f} map {mean:.4f}"]
