"""The `metrics` group: torchmetrics' figures equal NumPy's on the same predictions, reach
metrics.csv, summary.json, the trackers, the sweep report and repro.evaluate, pick best.pt, and
come out the same from 1 and 2 processes."""

from __future__ import annotations

import contextlib
import csv
import json

import numpy as np
import pytest
import torch
import yaml
from hydra.errors import HydraException
from omegaconf import OmegaConf
from torch import nn

from repro import evaluate as evaluate_command
from repro.core.engine.evaluation import evaluate, evaluation_columns
from repro.core.errors import ConfigError, UserError, one_line
from repro.core.runs.checkpoint import load
from repro.core.sweeps import report
from repro.core.watch.scores import build_scores

from conftest import compose_config, read_summary, run_cli, tiny, torchrun, train_in_process

ALL = "metrics=[top5,f1,class_acc,confusion_matrix]"
PRECISION = "torchmetrics.classification.MulticlassPrecision"
CLASSES = 10


def numpy_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, object]:
    """Top-5 accuracy, macro F1 (over the classes that occur), per-class accuracy and the
    confusion matrix, written out in NumPy."""
    predicted = logits.argmax(1)
    confusion = np.zeros((CLASSES, CLASSES), dtype=np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    top5 = (np.argsort(-logits, axis=1)[:, :5] == labels[:, None]).any(1).mean()
    hits = np.diag(confusion)
    wrong_guesses, missed = confusion.sum(0) - hits, confusion.sum(1) - hits
    occurs = hits + wrong_guesses + missed > 0
    f1 = (2 * hits / (2 * hits + wrong_guesses + missed))[occurs].mean()
    guessed = np.maximum(hits + wrong_guesses, 1)  # a class never predicted: precision 0
    precision = (hits / guessed)[occurs].mean()
    return {"top5": top5, "f1": f1, "class_acc": hits / confusion.sum(1), "confusion": confusion,
            "precision": precision}  # fmt: skip


def test_the_metrics_equal_numpy_on_the_same_predictions():
    torch.manual_seed(0)
    model = nn.Linear(16, CLASSES)
    with torch.no_grad():
        model.weight += torch.eye(CLASSES, 16)  # it tells the classes apart, not perfectly
    labels = torch.arange(103) % CLASSES  # every class occurs; a last batch of 23 images
    images = torch.randn(103, 16) + nn.functional.one_hot(labels, 16)
    batches = list(zip(images.split(40), labels.split(40), strict=True))
    # Besides the options, any torchmetrics class whose states are counts, as a user adds one.
    own = [f"+metrics.precision.{key}" for key in ("_target_=" + PRECISION, "average=macro")]
    scores = build_scores(compose_config(ALL, *own).metrics, CLASSES)

    def one_pass():
        return evaluate(
            model, batches, lambda x, y: (x, y), lambda x: x, contextlib.nullcontext,
            scores=scores,
        )  # fmt: skip

    result = one_pass()
    with torch.no_grad():
        expected = numpy_metrics(model(images).numpy(), labels.numpy())
    assert result["confusion_matrix"] == expected["confusion"].tolist()
    assert result["top5"] == pytest.approx(expected["top5"], rel=1e-6)
    assert 0.2 < result["f1"] == pytest.approx(expected["f1"], rel=1e-6)
    assert result["precision"] == pytest.approx(expected["precision"], rel=1e-6)
    per_class = [result[f"class_acc_{i}"] for i in range(CLASSES)]  # a number per class
    assert per_class == pytest.approx(expected["class_acc"].tolist(), rel=1e-6)
    assert result["acc"] == np.trace(expected["confusion"]) / len(labels)
    assert one_pass() == result  # each pass starts from zero

    columns = evaluation_columns("val", result)
    assert "val_confusion_matrix" not in columns  # a matrix is no column
    assert [columns[f"val_class_acc_{i}"] for i in range(CLASSES)] == per_class
    assert columns["val_top5"] == result["top5"] and columns["val_f1"] == result["f1"]


def test_no_metric_is_built_by_default():
    cfg = compose_config()
    assert not cfg.metrics and build_scores(cfg.metrics, CLASSES) is None


# 12 steps, an evaluation and a checkpoint every 2, every checkpoint kept: best.pt's weights
# can be compared with those of the step file it was written at.
MONITORED = tiny(
    "trainer.epochs=2", "trainer.eval_every_steps=2", "trainer.checkpoint_every_steps=2",
    "trainer.keep_checkpoints=10", ALL, "trainer.monitor=val_f1", "trainer.monitor_mode=max",
)  # fmt: skip


def read_rows(run_dir):
    with (run_dir / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.e2e
@pytest.mark.slow
def test_val_f1_picks_best_pt_and_every_output_holds_the_metrics(tmp_path, capsys):
    mlflow = pytest.importorskip("mlflow")
    store, run_dir = f"file:{tmp_path / 'mlruns'}", tmp_path / "run"
    summary = train_in_process(
        run_dir, *MONITORED, "logger=mlflow", f"logger.mlflow.tracking_uri={store}"
    )
    rows = read_rows(run_dir)
    per_class = [f"val_class_acc_{i}" for i in range(CLASSES)]
    assert list(rows[0])[5 : 7 + CLASSES] == ["val_top5", "val_f1", *per_class]
    f1 = [float(row["val_f1"]) for row in rows]
    best = int(rows[f1.index(max(f1))]["step"])  # the first of the highest
    assert summary["best_step"] == best and summary["best_val_f1"] == max(f1)
    checkpoints = run_dir / "checkpoints"
    best_weights = load(checkpoints / "best.pt")["model"]
    at_best = load(checkpoints / f"step-{best:08d}.pt")["model"]
    assert all(torch.equal(best_weights[name], at_best[name]) for name in at_best)

    # The test after training (best.pt's weights): every metric, the matrix included.
    matrix = np.array(summary["test_confusion_matrix"])
    assert matrix.sum() == 128 and np.trace(matrix) / 128 == summary["test_acc"]
    assert {"test_top5", "test_f1", "test_class_acc_9"} <= set(summary)

    # repro.evaluate on best.pt's validation split gives the row of its step, and prints it.
    out = tmp_path / "val.json"
    evaluate_command.main([f"ckpt={checkpoints / 'best.pt'}", "split=val", f"out={out}"])
    printed, written = capsys.readouterr().out, json.loads(out.read_text())
    row = next(row for row in rows if int(row["step"]) == best)
    assert written["f1"] == float(row["val_f1"]) and written["top5"] == float(row["val_top5"])
    assert all(written[column[4:]] == float(row[column]) for column in per_class)
    assert sum(map(sum, written["confusion_matrix"])) == 128
    assert f"  f1: {written['f1']:.4f}" in printed and "  confusion_matrix:\n    " in printed

    # The tracker got every row and the summary's numbers.
    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    run_id = (run_dir / ".mlflow_run_id").read_text().strip()
    assert [m.value for m in client.get_metric_history(run_id, "val_f1")] == f1
    assert client.get_run(run_id).data.metrics["final/test_f1"] == summary["test_f1"]

    # The sweep report summarises them as it does the accuracy.
    for job in (0, 1):
        (tmp_path / "sweep" / str(job) / ".hydra").mkdir(parents=True)
        (tmp_path / "sweep" / str(job) / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump([f"seed={job}"])
        )
        (tmp_path / "sweep" / str(job) / "summary.json").write_text(json.dumps(summary))
    built = report.build(tmp_path / "sweep")
    assert {"val_f1", "test_top5", "test_class_acc_0"} <= set(built.metrics)
    assert built.groups["all"]["test_f1"]["mean"] == pytest.approx(summary["test_f1"])


# A config mistake about metrics is one line, before any file is written.
REFUSED = {
    "no such class": (
        ["metrics=[f1]", "metrics.f1._target_=torchmetrics.classification.NoSuchScore"],
        ["metrics.f1._target_='torchmetrics.classification.NoSuchScore'", "could not build it"],
    ),
    "a wrong argument": (
        ["metrics=[top5]", "metrics.top5.top_k=11"],  # more than the 10 classes
        ["metrics.top5._target_=", "could not build it", "top_k"],
    ),
    "states that are not counts": (
        ["+metrics.auroc._target_=torchmetrics.classification.MulticlassAUROC"],
        ["metrics.auroc._target_=", 'states are all counts (dist_reduce_fx="sum")'],
    ),
    "a name evaluation takes": (
        ["+metrics.acc._target_=torchmetrics.classification.MulticlassAccuracy"],
        ["metrics='acc'", "a name other than loss, acc"],
    ),
    "no class at all": (["+metrics.f1=3"], ["metrics.f1=3", "a class given by _target_"]),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_metric_mistake_is_one_line_before_any_work(case, tmp_path):
    overrides, expected = REFUSED[case]
    with pytest.raises(UserError) as raised:
        train_in_process(tmp_path, *tiny(*overrides))
    message = one_line(raised.value)
    assert "\n" not in message
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"
    assert not any(tmp_path.iterdir()), "no file may be written"


def test_an_unknown_metric_option_is_named_when_the_config_is_composed():
    with pytest.raises(HydraException, match="metrics/top3"):
        compose_config(*tiny("metrics=[top5,top3]"))


# 2 epochs of 6 global batches of 64, in micro-batches of 16, the thread count fixed.
INVARIANT = tiny(
    "trainer.epochs=2", "trainer.global_batch=true", "trainer.world_invariant=true",
    "trainer.micro_batch=16", "trainer.num_threads=1", "dataloader.num_workers=0",
    "trainer.eval_every_steps=3", ALL,
)  # fmt: skip
TIMING = ("images_per_s", "data_wait_frac", "train_s")  # the only columns that may differ


@pytest.mark.e2e
@pytest.mark.slow
def test_one_and_two_processes_give_the_same_figures(tmp_path):
    done = run_cli("repro.train", *INVARIANT, f"hydra.run.dir={tmp_path / 'one'}")
    assert done.returncode == 0, done.stderr[-3000:]
    done = torchrun(*INVARIANT, f"hydra.run.dir={tmp_path / 'two'}")
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = read_summary(tmp_path / "one"), read_summary(tmp_path / "two")
    assert two["world_size"] == 2 and two["weights_sha256"] == one["weights_sha256"]

    def figures(run_dir):
        return [{k: v for k, v in row.items() if k not in TIMING} for row in read_rows(run_dir)]

    assert figures(tmp_path / "two") == figures(tmp_path / "one")
    assert "val_f1" in figures(tmp_path / "one")[0]
    tested = {key: value for key, value in one.items() if key.startswith("test_")}
    assert tested == {key: two[key] for key in tested}
    # Each rank counted its own half of the test split: every image once.
    assert sum(map(sum, two["test_confusion_matrix"])) == 128


# ---- the unit: which user metrics can be summed over ranks (fast, in-process) -------------


def _user_metric(reduce: str) -> type:
    from torchmetrics import Metric

    class UserMetric(Metric):
        def __init__(self, num_classes: int, **kwargs) -> None:
            super().__init__(**kwargs)
            self.add_state("seen", torch.tensor(0.0), dist_reduce_fx=reduce)

        def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
            self.seen += len(target)

        def compute(self) -> torch.Tensor:
            return self.seen

    return UserMetric


@pytest.mark.parametrize("reduce", ["max", "min", "mean", "cat"])
def test_a_user_metric_whose_state_is_not_summed_over_ranks_is_refused(reduce, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "UserMetric", _user_metric(reduce), raising=False)
    nodes = OmegaConf.create({"mine": {"_target_": f"{__name__}.UserMetric"}})
    with pytest.raises(UserError, match=r"metrics\.mine\._target_=.*states are all counts"):
        build_scores(nodes, classes=3)


def test_a_user_metric_of_counts_is_accepted(monkeypatch):
    monkeypatch.setattr(__import__(__name__), "UserMetric", _user_metric("sum"), raising=False)
    nodes = OmegaConf.create({"mine": {"_target_": f"{__name__}.UserMetric"}})
    assert list(build_scores(nodes, classes=3).metrics) == ["mine"]


def test_built_metrics_sync_through_evaluation_only_and_skip_their_per_batch_checks():
    scores = build_scores(compose_config(ALL).metrics, CLASSES)
    assert scores.names == []  # no results yet
    for metric in scores.metrics.values():
        # The evaluation sums the states over ranks once; torchmetrics' own sync would sum them
        # again, and its input checks read tensors on the host at every batch.
        assert metric.sync_on_compute is False and metric.validate_args is False
    logits, labels = torch.eye(CLASSES)[[0, 1, 1]] * 5, torch.tensor([0, 1, 2])
    summed = scores.states([(logits, labels)], torch.device("cpu"))
    result = scores.results(summed, taken=["loss", "acc"])
    matrix = result["confusion_matrix"]
    assert matrix[2][1] == 1 and all(type(v) is int for row in matrix for v in row)  # counts
    assert scores.names == list(result)
    with pytest.raises(ConfigError) as clash:
        scores.results(summed, taken=["top5"])
    assert str(clash.value) == (
        "metrics='top5' is not allowed: a name other than the objective's terms"
    )


def test_a_disabled_metric_is_left_out_and_none_left_builds_nothing():
    assert build_scores(OmegaConf.create({"top5": None}), CLASSES) is None


def test_a_reserved_metric_name_or_a_metric_of_other_states_is_refused_word_for_word(monkeypatch):
    node = {"_target_": "torchmetrics.classification.MulticlassAccuracy"}
    with pytest.raises(ConfigError) as reserved:
        build_scores(OmegaConf.create({"confusion": node}), CLASSES)
    assert str(reserved.value) == (
        "metrics='confusion' is not allowed: a name other than loss, acc, confusion, map"
    )
    monkeypatch.setattr(__import__(__name__), "UserMetric", _user_metric("max"), raising=False)
    with pytest.raises(ConfigError) as other:
        build_scores(OmegaConf.create({"mine": {"_target_": f"{__name__}.UserMetric"}}), 3)
    assert str(other.value) == (
        f"metrics.mine._target_='{__name__}.UserMetric' is not allowed: a torchmetrics Metric "
        'whose states are all counts (dist_reduce_fx="sum")'
    )


# ---- the unit: evaluation's confusion matrix and plain prediction --------------------------


def test_the_confusion_matrix_counts_true_by_predicted_and_sums_over_the_ranks(monkeypatch):
    from repro.core.engine import evaluation
    from repro.core.runtime.distributed import Context

    empty = evaluation.Predictions().confusion(3)  # a rank whose shard was empty
    assert empty.dtype == torch.int64 and empty.tolist() == [[0] * 3] * 3
    kept = evaluation.Predictions([torch.tensor([0, 2]), torch.tensor([2])],
                                  [torch.tensor([1, 2]), torch.tensor([0])])  # fmt: skip
    assert kept.confusion(3).tolist() == [[0, 1, 0], [0, 0, 0], [1, 0, 1]]
    summed = []
    job = Context(rank=0, world=2)

    def over_ranks(counts, dist):
        summed.append((counts.tolist(), dist))
        return counts * 2  # the other rank counted the same

    monkeypatch.setattr(evaluation.distributed, "sum_tensor", over_ranks)
    kept.dist = job
    assert kept.confusion(3).tolist() == [[0, 2, 0], [0, 0, 0], [2, 0, 2]]
    assert evaluation.Predictions(dist=job).confusion(2).tolist() == [[0, 0], [0, 0]]
    assert summed == [([[0, 1, 0], [0, 0, 0], [1, 0, 1]], job), ([[0, 0], [0, 0]], job)]


def test_prediction_without_tta_is_the_models_own_logits_in_float32():
    from repro.core.engine.evaluation import predict

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).double()
    images = torch.rand(2, 1, 3, 4, dtype=torch.float64)
    got = predict(model, images)  # tta left at its default: none
    assert got.dtype == torch.float32 and torch.equal(got, model(images).float())
    assert not torch.equal(got, predict(model, images, "flip"))  # the model is not symmetric
