"""The objective's task: what targets it takes, what evaluation computes from logits (argmax
accuracy, or multi-label exact match, average precision and F1), and what it refuses before
any data loads."""

from __future__ import annotations

import pytest
import torch

from repro.core import config, tasks
from repro.core.data.datasets import Splits
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.engine.evaluation import Predictions, evaluate
from repro.core.errors import ConfigError, DataError
from repro.core.runtime import distributed
from repro.core.tasks import MULTI_LABEL, SINGLE_LABEL
from repro.core.tasks.objectives import CrossEntropy, Targets
from repro.extras.multilabel.objective import MultilabelBCE

from conftest import compose_config, tiny


def test_an_objective_declares_its_task_and_one_that_does_not_is_single_label():
    assert tasks.of(CrossEntropy()) is SINGLE_LABEL
    assert tasks.of(MultilabelBCE()) is MULTI_LABEL
    assert tasks.of(lambda logits, targets: {}) is SINGLE_LABEL
    assert tasks.of_config(compose_config("objective=multilabel_bce").objective) is MULTI_LABEL
    assert tasks.monitor(compose_config()) == "val_acc"
    assert tasks.monitor(compose_config("objective=multilabel_bce")) == "val_map"
    assert tasks.monitor(compose_config("trainer.monitor=val_loss")) == "val_loss"


@pytest.mark.parametrize(
    ("task", "target", "said"),
    [
        (SINGLE_LABEL, 2, None),
        (SINGLE_LABEL, 3, "label 3, but the data has 3 classes (labels 0..2)"),
        (SINGLE_LABEL, torch.tensor([0.2, 0.3, 0.5]), None),
        (
            SINGLE_LABEL,
            torch.tensor([1.0, 1.0, 0.0]),
            "as target a float32 tensor of shape (3,); a single-label objective takes a class "
            "index or 3 class probabilities summing to 1; these sum to 2",
        ),
        (MULTI_LABEL, torch.tensor([1, 0, 1], dtype=torch.uint8), None),
        (MULTI_LABEL, torch.tensor([True, False, False]), None),
        (
            MULTI_LABEL,
            2,
            "as target a int64 tensor of shape (); a multi-label objective takes a multi-hot "
            "vector of 3 labels (0 or 1; float, uint8 or bool)",
        ),
        (
            MULTI_LABEL,
            torch.tensor([1.0, 0.0]),
            "as target a float32 tensor of shape (2,); a multi-label objective takes a multi-hot "
            "vector of 3 labels (0 or 1; float, uint8 or bool)",
        ),
        (
            MULTI_LABEL,
            torch.tensor([1.0, 2.0, 0.0]),
            "as target a float32 tensor of shape (3,); a multi-label objective takes a multi-hot "
            "vector of 3 labels (0 or 1; float, uint8 or bool); some values are outside [0, 1]",
        ),
    ],
)
def test_a_target_is_checked_against_the_task(task, target, said):
    assert task.check_target(target, 3) == said


def _splits(train, val, test, classes=3) -> Splits:
    def source(labels):
        labels = torch.as_tensor(labels, dtype=None if len(labels) else torch.int64)
        return TensorImages(torch.zeros(len(labels), 3, 4, 4, dtype=torch.uint8), labels)

    names = [f"c{i}" for i in range(classes)]
    return Splits(source(train), source(val), source(test), names)


def test_the_first_wrong_target_is_named_with_its_split_and_item():
    rows = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 3.0]])
    with pytest.raises(DataError) as refused:
        tasks.check_targets(MULTI_LABEL, _splits(rows[:2], rows, rows[:1]))
    assert str(refused.value).startswith(
        "the val split's item 2 has as target a float32 tensor of shape (3,)"
    )
    with pytest.raises(DataError) as refused:
        tasks.check_targets(
            SINGLE_LABEL, _splits(torch.tensor([0, 1]), torch.tensor([2, 0, 5]), [])
        )
    assert str(refused.value) == (
        "the val split's item 2 has label 5, but the data has 3 classes (labels 0..2)"
    )
    with pytest.raises(DataError, match="the train split's item 1 has as target a float32"):
        tasks.check_targets(SINGLE_LABEL, _splits(rows, rows, rows))  # multi-hot for CE
    soft = torch.tensor([[0.1, 0.8, 0.1], [0.5, 0.5, 0.0]])
    tasks.check_targets(SINGLE_LABEL, _splits(soft, soft, torch.tensor([0, 2])))


def test_a_split_of_files_is_checked_by_its_list_of_targets(tmp_path):
    files = ImageFiles([tmp_path / "a.png", tmp_path / "b.png"], [torch.ones(3), torch.ones(4)])
    data = Splits(files, files, files, ["a", "b", "c"])
    with pytest.raises(DataError, match="the train split's item 1 has as target"):
        tasks.check_targets(MULTI_LABEL, data)  # rows that do not stack: checked one by one


def test_average_precision_is_the_area_under_the_precision_recall_steps():
    positives = torch.tensor([True, False, True, False])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)
    assert tasks.average_precision(scores, positives) == pytest.approx(0.5 + 0.5 * 2 / 3)
    # Tied scores are one step: both images come in at once, precision 1/2 there.
    tied = torch.tensor([0.5, 0.5, 0.1], dtype=torch.float64)
    assert tasks.average_precision(tied, torch.tensor([True, False, False])) == pytest.approx(0.5)
    nowhere = tasks.average_precision(scores, torch.zeros(4, dtype=torch.bool))
    assert nowhere != nowhere  # NaN: a label that never occurs has no AP


def test_multi_label_metrics_name_each_label_and_leave_absent_ones_out_of_the_mean():
    logits = torch.tensor([[2.0, -1.0, 0.5], [1.0, 1.0, -2.0], [-1.0, 2.0, -1.0]])
    targets = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    found = MULTI_LABEL.outputs_metrics(logits, targets, ["Cat", "has wings", "x"])
    assert found["ap_cat"] == 1.0
    assert found["ap_has_wings"] == pytest.approx(0.5)  # ranked second of two predicted
    assert found["ap_x"] != found["ap_x"]
    assert found["map"] == pytest.approx(0.75)  # over the labels that occur
    assert found["f1_cat"] == 1.0
    assert found["f1_has_wings"] == pytest.approx(2 / 3)  # 1 right, 1 wrong
    assert found["f1_x"] == 0.0  # said once, never there
    exact = MULTI_LABEL.correct(MULTI_LABEL.predicted(logits), targets)
    assert float(exact) == 1.0  # image 0 says x too, 2 says has_wings: only 1 is right
    assert float(MULTI_LABEL.correct(MULTI_LABEL.predicted(logits[1:2]), targets[1:2])) == 1.0


def test_column_names_are_identifiers_and_unique():
    assert tasks.column_names(["Has Wings", "has-wings", "ünï", "?"]) == [
        "has_wings",
        "has_wings_1",
        "ünï",
        "3",
    ]


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3 * 4 * 4, 5)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layer(images.flatten(1))


def _no_autocast():
    return torch.autocast("cpu", enabled=False)


def _evaluate(images, targets, batch, objective, **options):
    batches = [
        (images[i : i + batch], targets[i : i + batch]) for i in range(0, len(images), batch)
    ]
    same = lambda x, y: (x, y)  # noqa: E731
    return evaluate(
        Linear(),
        batches,
        same,
        lambda x: x,
        _no_autocast,
        objective=objective,
        keep_predictions=True,
        **options,
    )


def test_a_multi_label_evaluation_does_not_depend_on_the_batch_size():
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(23, 3, 4, 4, generator=generator)
    targets = (torch.rand(23, 5, generator=generator) > 0.6).float()
    names = ["a", "b", "c", "d", "e"]
    whole = _evaluate(images, targets, 23, MultilabelBCE(), label_names=names)
    pieces = _evaluate(images, targets, 4, MultilabelBCE(), label_names=names)
    for key in ("map", "ap_a", "f1_e", "acc"):
        assert whole[key] == pieces[key], key
    assert whole["loss"] == pytest.approx(pieces["loss"], rel=1e-12)
    expected = MULTI_LABEL.outputs_metrics(Linear()(images).detach(), targets, names)
    assert whole["map"] == pytest.approx(expected["map"], rel=1e-9)


def test_soft_labels_count_their_most_likely_class_as_right():
    images = torch.randn(6, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    logits = Linear()(images).detach()
    chosen = logits.argmax(1)
    chosen[0] = (chosen[0] + 1) % 5  # image 0's most likely class is not the model's
    soft = torch.full((6, 5), 0.05)
    soft[torch.arange(6), chosen] = 0.8
    result = _evaluate(images, soft, 4, CrossEntropy())
    assert result["acc"] == pytest.approx(5 / 6)
    expected = CrossEntropy()(logits, Targets(soft))["loss"].double().mean()
    assert result["loss"] == pytest.approx(float(expected), rel=1e-6)
    outputs = result["predictions"].outputs()
    assert outputs.indices.tolist() == list(range(6))
    assert outputs.wrong().tolist() == [0]
    # Batches of 4 and 2 against one of 6: a CPU's matmul may round them apart in the last bit.
    torch.testing.assert_close(outputs.logits, logits)
    assert result["predictions"].confusion(5).sum() == 6


def test_predictions_of_two_ranks_are_gathered_in_the_split_order(monkeypatch):
    class Rank:
        def __init__(self, rank: int) -> None:
            self.rank, self.world, self.enabled = rank, 2, True

    shards = []
    for rank in (0, 1):  # rank r evaluated images r, r + 2, ... (EvalBatches)
        kept = Predictions(dist=Rank(rank))
        mine = torch.arange(rank, 7, 2)
        kept.labels.append(mine * 10)
        kept.logits.append(mine[:, None].float().repeat(1, 3))
        kept.predicted.append(mine)
        shards.append(kept)
    sent: dict[int, object] = {}

    def gather(value, context):
        sent[context.rank] = value
        return [sent.get(rank, value) for rank in range(context.world)]

    monkeypatch.setattr(distributed, "gather", gather)
    shards[1].outputs()  # what rank 1 sends, in place for rank 0's gather
    outputs = shards[0].outputs()
    assert outputs.indices.tolist() == list(range(7))
    assert outputs.targets.tolist() == [i * 10 for i in range(7)]
    assert outputs.logits[:, 0].tolist() == [float(i) for i in range(7)]
    assert outputs.predicted.tolist() == list(range(7))


def _refusal(*overrides: str) -> tuple[str, object, str]:
    with pytest.raises(ConfigError) as refused:
        config.validate(compose_config(*tiny(*overrides)))
    return refused.value.key, refused.value.value, refused.value.allowed


LAST = "trainer.test_weights=last (or ema with +components=ema)"


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (
            ["data.val_size=0"],
            ("trainer.test_weights", "best", f"{LAST}: data.val_size=0 leaves no validation split"),
        ),
        (
            ["data.val_size=0", "trainer.test_weights=last", "trainer.patience=3"],
            ("trainer.patience", 3, "null: data.val_size=0 leaves no validation split"),
        ),
        (
            ["data.val_size=0", "trainer.test_weights=last", "trainer.monitor=val_loss"],
            (
                "trainer.monitor",
                "val_loss",
                "auto (nothing is monitored): data.val_size=0 leaves no "
                f"validation split; test with {LAST}",
            ),
        ),
        (
            ["objective=multilabel_bce", "data=synthetic_multilabel", "metrics=[top5]"],
            (
                "metrics.top5",
                "torchmetrics.classification.MulticlassAccuracy",
                "a multi-label objective has no single class per image to score",
            ),
        ),
        (
            [
                "objective=multilabel_bce",
                "data=synthetic_multilabel",
                "+callbacks.c._target_=test_tasks.Confusion",
            ],
            (
                "callbacks.c",
                "test_tasks.Confusion",
                "a multi-label objective has no single class per image to score",
            ),
        ),
        (
            [
                "objective._target_=test_tasks.Unmixed",
                "~objective.label_smoothing",
                "augment.cutmix_alpha=1.0",
            ],
            (
                "augment.cutmix_alpha",
                1.0,
                "0: a multi-label objective must say that blending its "
                "targets means something (mixes = True, as multilabel_bce does)",
            ),
        ),
    ],
)
def test_what_the_task_or_the_missing_split_cannot_do_is_refused_before_any_data(
    overrides, refused
):
    assert _refusal(*overrides) == refused


class Confusion:
    needs_single_label = True

    def after_evaluation(self, loop, row, predictions) -> None:
        predictions.confusion(len(loop.classes))


class Unmixed:
    task = MULTI_LABEL

    def __call__(self, logits, targets):
        return {"loss": logits.sum(1)}


def test_multi_label_mixing_is_allowed_where_the_objective_says_it_blends():
    config.validate(compose_config(*tiny("objective=multilabel_bce", "augment.mixup_alpha=0.2")))
    config.validate(compose_config(*tiny("data.val_size=0", "trainer.test_weights=last")))


@pytest.mark.parametrize(("images", "refused"), [(1, True), (29, True), (30, False), (5000, False)])
def test_selecting_on_too_few_validation_images_is_refused_with_the_split_size(images, refused):
    cfg = compose_config(*tiny())
    if not refused:
        tasks.check_selection(cfg, images)
        return
    with pytest.raises(ConfigError) as caught:
        tasks.check_selection(cfg, images)
    assert caught.value.key == "trainer.test_weights"
    assert f"the validation split has {images} images, too few to tell steps apart" in str(
        caught.value
    )
    assert "at least 30 are needed" in str(caught.value)
    cfg.trainer.test_weights = "last"
    tasks.check_selection(cfg, images)  # the last weights need no selection
    cfg.trainer.patience = 2
    with pytest.raises(ConfigError, match=r"trainer\.patience"):
        tasks.check_selection(cfg, images)


def test_multilabel_bce_sums_each_labels_loss_weighs_positives_and_refuses_bad_weights():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -2.0]])
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    plain = MultilabelBCE()(logits, Targets(targets))["loss"]
    per_label = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, targets, reduction="none"
    )
    assert torch.allclose(plain, per_label.sum(1))
    weighted = MultilabelBCE(pos_weight=[1.0, 1.0, 3.0])(logits, Targets(targets))["loss"]
    # Only image 0's third label is a weighted positive: its term counts three times.
    assert torch.allclose(weighted - plain, torch.tensor([2 * float(per_label[0, 2]), 0.0]))
    mixed = MultilabelBCE()(logits, Targets(targets, targets.flip(0), 0.25))["loss"]
    blended = targets * 0.25 + targets.flip(0) * 0.75  # linear in the target: the blend's loss
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, blended, reduction="none"
    ).sum(1)
    assert torch.allclose(mixed, expected)
    with pytest.raises(ConfigError) as too_few:
        MultilabelBCE(pos_weight=[1.0, 2.0])(logits, Targets(targets))
    said = "objective.pos_weight=[1.0, 2.0] is not allowed: one number, or one per label (3)"
    assert str(too_few.value) == said
    with pytest.raises(ConfigError) as not_positive:
        MultilabelBCE(pos_weight=0.0)
    said = "objective.pos_weight=0.0 is not allowed: null or positive numbers"
    assert str(not_positive.value) == said
    # The weights follow the logits to their device (meta here: a device other than the CPU).
    on_meta = torch.zeros(2, 3, device="meta")
    loss = MultilabelBCE(pos_weight=[1.0, 2.0, 3.0])(on_meta, Targets(on_meta))["loss"]
    assert loss.device.type == "meta" and loss.shape == (2,)


def _one_at_a_time(task, held, classes):
    """The reference `_first_wrong` must agree with: each target checked on its own."""
    return next((i for i, t in enumerate(held) if task.check_target(t, classes)), None)


SOFT = [0.25, 0.75, 0.0]
TARGET_SETS = [  # (task, targets as a list of items) for 3 classes: right, then each way wrong
    (SINGLE_LABEL, [0, 1, 2, 2]),
    (SINGLE_LABEL, [0, 3, 1]),  # a label equal to the class count
    (SINGLE_LABEL, [2, 0, -1]),
    (SINGLE_LABEL, [torch.tensor(1), torch.tensor(5)]),
    (SINGLE_LABEL, [1, torch.tensor(SOFT)]),  # an index and a soft label: they do not stack
    (SINGLE_LABEL, [torch.tensor(SOFT), torch.tensor([1.5, -0.5, 0.0])]),  # sums to 1
    (SINGLE_LABEL, [torch.tensor(SOFT), torch.tensor([0.5, 0.25, 0.0])]),
    (SINGLE_LABEL, [torch.tensor(SOFT), torch.tensor([0.5, 0.5005, 0.0])]),  # within 1e-3
    (SINGLE_LABEL, [torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0])]),  # integer rows
    (SINGLE_LABEL, [torch.tensor(1.0), torch.tensor(2.0)]),  # float scalars
    (SINGLE_LABEL, [torch.tensor(1.0)]),  # a split of one image
    (SINGLE_LABEL, [torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5])]),  # two of three
    (MULTI_LABEL, [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 1.5, 0.0])]),
    (MULTI_LABEL, [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 2.5, 0.0])]),
    (MULTI_LABEL, [torch.tensor([1, 0, 1], dtype=torch.uint8), torch.tensor([0, 0, 0.0])]),
    (MULTI_LABEL, [torch.tensor([True, False, True]), torch.tensor([False, True, True])]),
    (MULTI_LABEL, [torch.ones(4), torch.ones(4)]),  # rows of another width, from the first
    (MULTI_LABEL, [torch.ones(2, 3), torch.ones(2, 3)]),  # a matrix each
    (MULTI_LABEL, [1, 2]),  # indices, not rows
    (MULTI_LABEL, [torch.ones(3), torch.ones(4)]),  # rows that do not stack
]


@pytest.mark.parametrize("task, held", TARGET_SETS)
def test_the_whole_split_check_finds_the_item_one_at_a_time_checking_finds(task, held):
    from repro.core.tasks import checks

    expected = _one_at_a_time(task, held, 3)
    assert checks._first_wrong(task, held, 3) == expected
    if all(isinstance(t, torch.Tensor) for t in held) and len({t.shape for t in held}) == 1:
        assert checks._first_wrong(task, torch.stack(held), 3) == expected  # a tensor of them


class Listed:
    """A split that keeps no list of its labels: the check reads its first item."""

    def __init__(self, labels) -> None:
        self.items = labels

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):
        return torch.zeros(3, 2, 2, dtype=torch.uint8), self.items[index]


def test_a_split_without_a_label_list_is_checked_by_its_first_item_and_empty_ones_skipped():
    fine = Listed([1, 7])  # only the first item is read
    tasks.check_targets(SINGLE_LABEL, Splits(fine, Listed([]), fine, ["a", "b", "c"]))
    with pytest.raises(DataError) as refused:
        tasks.check_targets(SINGLE_LABEL, Splits(fine, Listed([]), Listed([4, 0]), list("abc")))
    assert str(refused.value) == (
        "the test split's item 0 has label 4, but the data has 3 classes (labels 0..2)"
    )
    one = _splits([0, 1], [], [3])  # a split of one image is checked too
    with pytest.raises(DataError, match=r"^the test split's item 0 has label 3"):
        tasks.check_targets(SINGLE_LABEL, one)


def test_which_metrics_and_callbacks_need_one_class_per_image():
    from repro.core.tasks import checks

    assert checks._needs_single_label({"_target_": "torchmetrics.MulticlassF1Score"})
    assert checks._needs_single_label({"_target_": "MulticlassAccuracy"})
    assert checks._needs_single_label({"_target_": "test_tasks.Confusion"})
    assert not checks._needs_single_label({"_target_": "test_tasks.Unmixed"})  # says nothing
    multi = ["objective=multilabel_bce", "data=synthetic_multilabel"]
    config.validate(compose_config(*tiny(*multi, "+callbacks.u._target_=test_tasks.Unmixed")))
    config.validate(compose_config(*tiny(*multi, "+metrics.none=null")))


def test_mixup_is_refused_like_cutmix_for_an_objective_that_does_not_blend():
    unmixed = ["objective._target_=test_tasks.Unmixed", "~objective.label_smoothing"]
    assert _refusal(*unmixed, "augment.mixup_alpha=0.2") == (
        "augment.mixup_alpha",
        0.2,
        "0: a multi-label objective must say that blending its targets means something "
        "(mixes = True, as multilabel_bce does)",
    )


def test_too_few_validation_images_refuse_best_weights_only_when_a_test_selects_them():
    cfg = compose_config(*tiny())
    cfg.trainer.save_checkpoints = False  # no best.pt to test: nothing is selected
    tasks.check_selection(cfg, 5)
    cfg.trainer.save_checkpoints, cfg.trainer.test_after_fit = True, False
    tasks.check_selection(cfg, 5)
    cfg.trainer.test_after_fit = True
    with pytest.raises(ConfigError) as caught:
        tasks.check_selection(cfg, 5)
    assert str(caught.value).startswith(
        "trainer.test_weights='best' is not allowed: trainer.test_weights=last (or ema with "
        "+components=ema), or raise data.val_size: the validation split has 5 images"
    )
    cfg.trainer.test_weights, cfg.trainer.patience = "last", 3
    with pytest.raises(ConfigError) as caught:
        tasks.check_selection(cfg, 5)
    assert str(caught.value).startswith(
        "trainer.patience=3 is not allowed: null, or more images: the validation split has 5"
    )
