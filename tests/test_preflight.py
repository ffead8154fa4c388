"""Before the first step: the model gives one output per class and every label is a class,
checked for any model without drawing from a generator or changing the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repro.core.data.datasets import Splits
from repro.core.data.sources import TensorImages
from repro.core.engine import preflight
from repro.core.errors import DataError, UserError
from repro.extras.models.small_cnn import SmallCNN


def splits(labels: list[int], classes: int = 4) -> Splits:
    images = torch.zeros(len(labels), 3, 8, 8, dtype=torch.uint8)
    source = TensorImages(images, torch.tensor(labels))
    return Splits(source, source, source, [f"c{i}" for i in range(classes)])


class ReadsValues(nn.Module):
    """A model meta tensors cannot run (it reads a value) and that draws from torch's generator."""

    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.head = nn.Linear(3, outputs)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.bn(x.mean(dim=(2, 3)))
        noise = torch.rand(1, device=x.device).item()  # `.item()` has no meta form
        return self.head(pooled) + noise


@pytest.mark.parametrize("model", [SmallCNN(num_classes=7, widths=[4, 8]), ReadsValues(7)])
def test_outputs_are_counted_without_touching_the_model_or_the_generator(model):
    model.train()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert preflight.outputs_per_image(model, image_size=8) == 7
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_a_model_with_the_wrong_number_of_outputs_is_named_with_both_numbers():
    with pytest.raises(UserError, match=r"gives 7 outputs per image but the data has 4 classes"):
        preflight.check_classes(ReadsValues(7), splits([0, 1, 2, 3]), image_size=8)
    preflight.check_classes(ReadsValues(4), splits([0, 1, 2, 3]), image_size=8)


@pytest.mark.parametrize("bad", [4, 9, -1])
def test_a_label_outside_the_classes_is_named(bad):
    with pytest.raises(DataError, match=rf"item 2 has label {bad}, but the data has 4 classes"):
        preflight.check_classes(ReadsValues(4), splits([0, 1, bad]), image_size=8)


def _source(labels: list[int]) -> TensorImages:
    return TensorImages(torch.zeros(len(labels), 3, 8, 8, dtype=torch.uint8), torch.tensor(labels))


@pytest.mark.parametrize(
    ("train", "val", "test", "said"),
    [
        (
            [5],
            [0],
            [0],
            "the train split's item 0 has label 5, but the data has 4 classes (labels 0..3)",
        ),
        (
            [0, 1],
            [1, -2],
            [0],
            "the val split's item 1 has label -2, but the data has 4 classes (labels 0..3)",
        ),
        (
            [0, 1],
            [],
            [3, 4],
            "the test split's item 1 has label 4, but the data has 4 classes (labels 0..3)",
        ),
    ],
)
def test_each_split_is_checked_and_named_an_empty_one_skipped(train, val, test, said):
    data = Splits(_source(train), _source(val), _source(test), ["a", "b", "c", "d"])
    with pytest.raises(DataError) as refused:
        preflight.check_classes(ReadsValues(4), data, image_size=8)
    assert str(refused.value) == said


def test_a_model_meta_tensors_can_run_is_counted_without_a_copy_on_the_cpu(monkeypatch):
    def no_copy(_):
        raise AssertionError("the CPU fallback ran: the meta path failed")

    monkeypatch.setattr(preflight.copy, "deepcopy", no_copy)
    assert preflight.outputs_per_image(SmallCNN(num_classes=5, widths=[4, 8]), image_size=8) == 5


class TupleOut(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.mean(dim=(2, 3)), x.amax(dim=(2, 3))


def test_a_model_whose_output_is_not_one_logits_tensor_is_not_counted():
    assert preflight.outputs_per_image(TupleOut(), image_size=8) is None
    preflight.check_classes(TupleOut(), splits([0, 1, 2, 3]), image_size=8)  # nothing to say
