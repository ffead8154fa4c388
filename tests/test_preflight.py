"""Before the first step: the model gives one output per class and every label is a class,
checked for any model without drawing from a generator or changing the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repro.data.datasets import Splits
from repro.data.sources import TensorImages
from repro.engine import preflight
from repro.errors import DataError, UserError
from repro.models.small_cnn import SmallCNN


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
    with pytest.raises(DataError, match=rf"label {bad}, but the data has 4 classes"):
        preflight.check_classes(ReadsValues(4), splits([0, 1, bad]), image_size=8)
