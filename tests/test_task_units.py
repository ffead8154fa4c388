"""tasks/task.py by hand: a target's check at its edges, a batch's right answers, the
predictions and probabilities of each task, and a split's multi-label metrics worked out here."""

from __future__ import annotations

import math

import pytest
import torch

from repro.core.tasks import task as tasks
from repro.core.tasks.task import MULTI_LABEL, SINGLE_LABEL

# Scores and labels whose precision-recall steps are worked out by hand: images tied on a
# score count as one step, the last image is a positive of its own step.
SCORES = torch.tensor([0.9, 0.8, 0.8, 0.3], dtype=torch.float64)


@pytest.mark.parametrize(
    ("positives", "expected"),
    [
        # steps (recall gained, precision): (1/2, 1) then (1/2, 2/3)
        ([1, 1, 0, 0], 1 / 2 + 1 / 2 * 2 / 3),
        # (1/3, 1), (1/3, 2/3), (1/3, 3/4): the last step counts
        ([1, 1, 0, 1], 1 / 3 + 1 / 3 * 2 / 3 + 1 / 3 * 3 / 4),
        # the tie's positive comes second in the split: the same step
        ([1, 0, 1, 0], 1 / 2 + 1 / 2 * 2 / 3),
        ([0, 0, 0, 1], 1 / 4),
    ],
)
def test_average_precision_takes_a_tie_as_one_step_and_counts_the_last(positives, expected):
    found = tasks.average_precision(SCORES, torch.tensor(positives, dtype=torch.bool))
    assert found == pytest.approx(expected, abs=1e-12)


def test_a_label_that_never_occurs_has_no_average_precision_and_none_at_all_no_mean():
    assert math.isnan(tasks.average_precision(SCORES, torch.zeros(4, dtype=torch.bool)))
    logits, targets = torch.randn(4, 2), torch.zeros(4, 2)
    result = MULTI_LABEL.outputs_metrics(logits, targets, ["a", "b"])
    assert math.isnan(result["map"]) and math.isnan(result["ap_a"]) and math.isnan(result["ap_b"])


def test_multi_label_metrics_by_hand_with_a_soft_half_and_a_zero_logit():
    logits = torch.tensor([[2.0, 0.0, -1.0], [1.0, -3.0, -2.0], [-1.0, 0.5, -0.5]])
    # A target of exactly 0.5 is not a positive; a logit of exactly 0 is not a positive said.
    targets = torch.tensor([[1.0, 0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    result = MULTI_LABEL.outputs_metrics(logits, targets, ["Cat", "X-ray", "none"])
    assert list(result) == ["map", "ap_cat", "ap_x_ray", "ap_none", "f1_cat", "f1_x_ray", "f1_none"]
    # cat: scores 2, 1, -1 for positives 1, 0, 1: (1/2, 1) then (1/2, 2/3) at the last image.
    assert result["ap_cat"] == pytest.approx(1 / 2 + 1 / 2 * 2 / 3)
    # x_ray: only image 3 is positive and scores highest.
    assert result["ap_x_ray"] == pytest.approx(1.0)
    assert math.isnan(result["ap_none"])
    assert result["map"] == pytest.approx((result["ap_cat"] + 1.0) / 2)
    # cat: said positive for images 1 and 2 (logits 2, 1), true 1 and 3: tp 1, wrong 2.
    assert result["f1_cat"] == pytest.approx(2 / (2 + 2))
    # x_ray: said positive only for image 3 (0.5; the 0 of image 1 is not), true only 3.
    assert result["f1_x_ray"] == pytest.approx(1.0)
    assert result["f1_none"] == 0.0  # never said, never true: 0, not 0/0


def test_the_metrics_need_a_name_for_every_label():
    with pytest.raises(ValueError):
        MULTI_LABEL.outputs_metrics(torch.randn(3, 3), torch.ones(3, 3), ["a", "b"])
    assert SINGLE_LABEL.outputs_metrics(torch.randn(3, 3), torch.ones(3), ["a"]) == {}


def test_right_answers_of_a_batch_for_each_kind_of_target():
    predicted = torch.tensor([0, 2, 1, 1])
    assert SINGLE_LABEL.correct(predicted, torch.tensor([0, 2, 2, 1])).item() == 3.0
    soft = torch.tensor([[0.8, 0.2, 0.0], [0.1, 0.2, 0.7], [0.5, 0.1, 0.4], [0.0, 1.0, 0.0]])
    counted = SINGLE_LABEL.correct(predicted, soft)
    assert counted.item() == 3.0 and counted.dtype == torch.float64
    said = torch.tensor([[1, 0], [0, 0], [1, 1]], dtype=torch.uint8)
    hot = torch.tensor([[1.0, 0.5], [0.0, 0.0], [1.0, 0.6]])  # 0.5 is not a positive
    assert MULTI_LABEL.correct(said, hot).item() == 3.0
    assert MULTI_LABEL.correct(said, torch.ones(3, 2)).item() == 1.0


def test_predictions_and_probabilities_of_each_task():
    logits = torch.tensor([[0.0, 1.0, -1.0], [2.0, 0.0, 3.0]])
    assert torch.equal(SINGLE_LABEL.predicted(logits), torch.tensor([1, 2]))
    said = MULTI_LABEL.predicted(logits)
    assert said.dtype == torch.uint8
    assert torch.equal(said, torch.tensor([[0, 1, 0], [1, 0, 1]], dtype=torch.uint8))
    assert torch.allclose(SINGLE_LABEL.probabilities(logits), torch.softmax(logits, 1))
    assert torch.allclose(MULTI_LABEL.probabilities(logits), torch.sigmoid(logits))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8])
def test_a_multi_hot_row_of_other_integers_is_refused(dtype):
    said = MULTI_LABEL.check_target(torch.tensor([1, 0, 1], dtype=dtype), 3)
    kind = str(dtype).removeprefix("torch.")
    assert said == (
        f"as target a {kind} tensor of shape (3,); a multi-label objective takes a multi-hot "
        "vector of 3 labels (0 or 1; float, uint8 or bool)"
    )
    for accepted in (torch.uint8, torch.bool, torch.float16):
        assert MULTI_LABEL.check_target(torch.tensor([1, 0, 1], dtype=accepted), 3) is None


def test_a_bool_or_uint8_row_is_not_class_probabilities():
    said = SINGLE_LABEL.check_target(torch.tensor([1, 0], dtype=torch.uint8), 2)
    assert said is not None and said.startswith("as target a uint8 tensor of shape (2,)")


def test_an_objective_whose_task_is_not_a_task_is_single_label():
    class Odd:
        task = "multi-label"

    class Declared:
        task = MULTI_LABEL

    assert tasks.of(Odd()) is SINGLE_LABEL and tasks.of(Odd) is SINGLE_LABEL
    assert tasks.of(Declared()) is MULTI_LABEL and tasks.of(object()) is SINGLE_LABEL


def test_column_names_drop_edge_underscores_but_keep_edge_letters():
    named = tasks.column_names(["X-ray", "_x_", "Ax", "?", "x_ray"])
    assert named == ["x_ray", "x", "ax", "3", "x_ray_4"]
