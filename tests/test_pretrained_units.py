"""Pretrained backbones' builders in-process (repro.extras.models.pretrained), on timm's tiny test
models and weights files made here: the head, the normalisation, each refusal's words."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from repro.core.errors import ConfigError
from repro.extras.models import pretrained

NAME = "test_resnet"  # timm's own tiny model for tests


def saved_weights(tmp_path, classes: int = 7, name: str = "weights.pt", whole: bool = False):
    import timm

    source = timm.create_model(NAME, num_classes=classes)
    state = source.state_dict()
    path = tmp_path / name
    if name.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save({"model": state, "step": 3} if whole else state, path)
    return path, state


@pytest.mark.parametrize("name", ["weights.pt", "weights.safetensors", "whole.pt"])
def test_a_weights_file_loads_every_tensor_of_the_backbone(tmp_path, name):
    path, state = saved_weights(tmp_path, name=name, whole=name == "whole.pt")
    read = pretrained.read_weights(path, "model.pretrained")
    assert read.keys() == state.keys()
    assert all(torch.equal(read[key], state[key]) for key in state)
    model = pretrained.timm_model(NAME, pretrained=str(path))
    assert model.num_classes == 7, "the file's head, none asked for"
    assert all(torch.equal(model.state_dict()[key], state[key]) for key in state)


def test_a_head_for_other_classes_is_drawn_anew_and_said(tmp_path, caplog):
    path, state = saved_weights(tmp_path)
    with caplog.at_level(logging.INFO, logger=pretrained.__name__):
        model = pretrained.timm_model(NAME, pretrained=str(path), num_classes=3)
    assert model.num_classes == 3
    assert caplog.messages == [f"model: {NAME}'s head replaced: 7 -> 3 outputs"]
    head = pretrained.head_name(model)
    kept = [key for key in state if not key.startswith(head)]
    assert all(torch.equal(model.state_dict()[key], state[key]) for key in kept)


def test_without_weights_the_model_has_the_classes_asked_and_the_datas_normalisation():
    model = pretrained.timm_model(NAME, num_classes=4, drop_rate=0.25)
    assert model.num_classes == 4 and model.pretrained_normalisation == {}
    given = pretrained.timm_model(NAME, pretrained=None, num_classes=4, mean=[0.5] * 3)
    assert given.pretrained_normalisation == {"mean": [0.5] * 3}


def test_a_files_weights_bring_the_libraries_normalisation_each_value_overridable(tmp_path):
    from timm.data import resolve_model_data_config

    path, _ = saved_weights(tmp_path)
    model = pretrained.timm_model(NAME, pretrained=str(path))
    own = resolve_model_data_config(model)
    assert model.pretrained_normalisation == {
        "mean": own["mean"],
        "std": own["std"],
        "image_size": own["input_size"][-1],
        "interpolation": own["interpolation"],
    }
    chosen = pretrained.timm_model(NAME, pretrained=str(path), std=[1, 1, 1], image_size=40)
    assert chosen.pretrained_normalisation["std"] == [1, 1, 1]
    assert chosen.pretrained_normalisation["image_size"] == 40
    assert chosen.pretrained_normalisation["mean"] == own["mean"]


def test_only_timm_model_names_are_built():
    for name in ("no_such_model_anywhere", 3):
        with pytest.raises(ConfigError) as refused:
            pretrained.timm_model(name)
        assert str(refused.value) == (
            f"model.name={name!r} is not allowed: a timm model name (timm.list_models() lists them)"
        )


@pytest.mark.parametrize("key", pretrained.WEIGHT_SOURCES)
def test_weights_come_from_model_pretrained_alone(key):
    with pytest.raises(ConfigError) as refused:
        pretrained.timm_model(NAME, **{key: "https://example.org/weights"})
    assert str(refused.value) == (
        f"model.{key}='https://example.org/weights' is not allowed: not set: weights come from "
        "model.pretrained (true: timm's registry; or a local file)"
    )


def test_weights_of_another_architecture_name_what_does_not_fit(tmp_path):
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ConfigError) as refused:
        pretrained.timm_model(NAME, pretrained=str(tmp_path / "other.pt"))
    message = str(refused.value)
    assert message.startswith(f"model.pretrained='{tmp_path / 'other.pt'}' is not allowed: ")
    assert "weights of this architecture; missing or of another shape: " in message
    assert len(message.split("shape: ")[1].split(", ")) == 3, "the first three named"


ALLOWED = (
    "true, false or the path of a weights file: a state_dict saved by torch.save "
    "(.pth, .pt, .bin) or a .safetensors file"
)


def test_a_weights_file_that_cannot_be_used_is_one_line_naming_why(tmp_path):
    missing = tmp_path / "none.pt"
    with pytest.raises(ConfigError) as refused:
        pretrained.read_weights(missing, "model.pretrained")
    assert str(refused.value) == (
        f"model.pretrained='{missing}' is not allowed: {ALLOWED}; no such file"
    )
    cases = {
        "text.pt": (b"not a checkpoint", "torch.load cannot read this file"),
        "text.safetensors": (b"not safetensors", "safetensors cannot read this file"),
    }
    for name, (data, why) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConfigError) as refused:
            pretrained.read_weights(tmp_path / name, "model.weights_file")
        assert str(refused.value).endswith(f"{ALLOWED}; {why}")
        assert str(refused.value).startswith("model.weights_file=")
    for name, payload in {"list.pt": [1, 2], "mixed.pt": {"a": torch.zeros(1), "b": 3}}.items():
        torch.save(payload, tmp_path / name)
        with pytest.raises(ConfigError, match=r"; it holds no state_dict$"):
            pretrained.read_weights(tmp_path / name, "model.pretrained")
    (tmp_path / "linked.pt").symlink_to(tmp_path / "list.pt")
    with pytest.raises(ConfigError, match=r"; .*linked\.pt: a symbolic link"):
        pretrained.read_weights(tmp_path / "linked.pt", "model.pretrained")


def test_a_weights_path_may_start_at_home(tmp_path, monkeypatch):
    saved_weights(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert pretrained.read_weights("~/weights.pt", "model.pretrained").keys()


class Net(nn.Module):
    def __init__(self, classes: int = 1000, bias: bool = True) -> None:
        super().__init__()
        self.features = nn.Conv2d(3, 4, 1)
        self.block = nn.Sequential(nn.Flatten(), nn.Linear(4, classes, bias=bias))


def test_the_last_linear_layer_is_replaced_where_it_sits(caplog):
    for bias in (True, False):
        model = Net(bias=bias)
        with caplog.at_level(logging.INFO, logger=pretrained.__name__):
            pretrained._replace_last_linear(model, 5, "net")
        head = model.block[1]
        assert (head.in_features, head.out_features) == (4, 5)
        assert (head.bias is not None) is bias
    assert caplog.messages[-1] == "model: net's head replaced: 1000 -> 5 outputs"
    flat = nn.Linear(4, 3)
    wrapper = nn.Module()
    wrapper.fc = flat
    pretrained._replace_last_linear(wrapper, 2, "flat")
    assert wrapper.fc.out_features == 2
    with pytest.raises(ConfigError, match=r"a model whose classifier is an nn\.Linear"):
        pretrained._replace_last_linear(nn.Sequential(nn.Conv2d(3, 3, 1)), 2, "conv")


def test_an_unknown_torchvision_model_or_weights_name_is_one_line():
    with pytest.raises(ConfigError, match=r"^model.name='no_such' .*a torchvision model"):
        pretrained.torchvision_model("no_such")
    with pytest.raises(ConfigError) as refused:
        pretrained.torchvision_model("resnet18", weights="IMAGENET9K")
    assert str(refused.value).startswith(
        "model.weights='IMAGENET9K' is not allowed: DEFAULT or one of IMAGENET1K_V1"
    )


def test_a_torchvision_model_without_weights_takes_the_classes_and_the_given_values():
    model = pretrained.torchvision_model("resnet18", num_classes=3, image_size=64)
    assert model.fc.out_features == 3
    assert model.pretrained_normalisation == {"image_size": 64}


def test_the_weights_own_values_are_kept_unless_given():
    chosen = pretrained._overridden([1], [2], 32, "bicubic", None, [9], None, None)
    assert chosen == {"mean": [1], "std": [9], "image_size": 32, "interpolation": "bicubic"}
    assert pretrained._overridden(None, None, None, None, None, None, 8, None) == {"image_size": 8}
    assert pretrained._classes(None) == {} and pretrained._classes(4) == {"num_classes": 4}


# ---- torchvision's weights, served here in place of its download ----------------------------


@pytest.fixture
def served(monkeypatch):
    """torchvision's weights enum hands out a state made here (no network) and says how it was
    asked: the arguments `get_state_dict` got."""
    from torchvision import models
    from torchvision.models._api import WeightsEnum

    asked: list[dict] = []
    state = models.mobilenet_v3_small(num_classes=1000).state_dict()

    def get_state_dict(self, *args, **how):
        asked.append({"weights": self.name, "args": args, **how})
        return {k: v.clone() for k, v in state.items()}

    monkeypatch.setattr(WeightsEnum, "get_state_dict", get_state_dict)
    return state, asked


IMAGENET = {
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "image_size": 224,
    "interpolation": "bilinear",
}


def test_torchvision_weights_are_read_checked_and_loaded_with_the_presets_normalisation(served):
    state, asked = served
    model = pretrained.torchvision_model("mobilenet_v3_small", weights="DEFAULT", dropout=0.5)
    how = {"progress": False, "check_hash": True, "weights_only": True}
    assert asked == [{"weights": "IMAGENET1K_V1", "args": (), **how}]
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert model.classifier[-1].out_features == 1000 and model.classifier[2].p == 0.5
    assert model.pretrained_normalisation == IMAGENET


def test_torchvision_weights_for_other_classes_keep_the_backbone_and_replace_the_head(
    served, caplog
):
    state, _ = served
    given = {"mean": [0.5] * 3, "std": [0.25] * 3, "image_size": 64, "interpolation": "bicubic"}
    with caplog.at_level(logging.INFO, logger=pretrained.__name__):
        model = pretrained.torchvision_model(
            "mobilenet_v3_small", weights="IMAGENET1K_V1", num_classes=7, **given
        )
    head = model.classifier[-1]
    assert (head.in_features, head.out_features) == (1024, 7)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state if not k.startswith("classifier.3"))
    assert caplog.messages == ["model: mobilenet_v3_small's head replaced: 1000 -> 7 outputs"]
    assert model.pretrained_normalisation == given
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=pretrained.__name__):
        same = pretrained.torchvision_model(
            "mobilenet_v3_small", weights="DEFAULT", num_classes=1000
        )
    assert same.classifier[-1].out_features == 1000 and caplog.messages == []
    partly = pretrained.torchvision_model("mobilenet_v3_small", weights="DEFAULT", std=[1.0] * 3)
    assert partly.pretrained_normalisation == {**IMAGENET, "std": [1.0] * 3}


def test_a_torchvision_model_without_weights_takes_its_arguments_and_only_the_given_values():
    given = {"mean": [0.5] * 3, "std": [0.25] * 3, "interpolation": "nearest"}
    model = pretrained.torchvision_model("mobilenet_v3_small", dropout=0.5, **given)
    assert model.classifier[2].p == 0.5 and model.classifier[-1].out_features == 1000
    assert model.pretrained_normalisation == given


def test_the_refusals_of_torchvision_name_the_models_weights_and_heads_in_full():
    with pytest.raises(ConfigError) as refused:
        pretrained.torchvision_model("no_such")
    assert str(refused.value) == (
        "model.name='no_such' is not allowed: a torchvision model (models.list_models())"
    )
    with pytest.raises(ConfigError) as refused:
        pretrained.torchvision_model("alexnet", weights="IMAGENET9K")
    assert (
        str(refused.value)
        == "model.weights='IMAGENET9K' is not allowed: DEFAULT or one of IMAGENET1K_V1"
    )
    with pytest.raises(ConfigError) as refused:
        pretrained.torchvision_model("resnet50", weights="V9")
    assert refused.value.allowed == "DEFAULT or one of IMAGENET1K_V1, IMAGENET1K_V2"
    with pytest.raises(ConfigError) as refused:
        pretrained._replace_last_linear(nn.Sequential(nn.Conv2d(3, 3, 1)), 2, "conv")
    assert (refused.value.key, refused.value.value) == ("model.name", "conv")
    assert refused.value.allowed == "a model whose classifier is an nn.Linear"


# ---- timm: its registry's weights, served here in place of its download ---------------------


def test_timms_own_weights_are_asked_for_with_the_arguments_and_their_normalisation_kept(
    monkeypatch,
):
    import timm

    asked = []
    create = timm.create_model

    def create_model(name, **how):
        asked.append((name, how))
        return create(name, **{k: v for k, v in how.items() if k != "pretrained"})

    monkeypatch.setattr(timm, "create_model", create_model)
    model = pretrained.timm_model(NAME, pretrained=True, num_classes=3, drop_rate=0.25)
    assert asked == [(NAME, {"pretrained": True, "drop_rate": 0.25})]
    assert model.num_classes == 3 and model.drop_rate == 0.25
    own = timm.data.resolve_model_data_config(model)
    assert model.pretrained_normalisation == {
        "mean": own["mean"],
        "std": own["std"],
        "image_size": own["input_size"][-1],
        "interpolation": own["interpolation"],
    }
    asked.clear()
    plain = pretrained.timm_model(NAME, num_classes=4, drop_rate=0.5, interpolation="bicubic")
    assert asked == [(NAME, {"num_classes": 4, "drop_rate": 0.5})]
    assert plain.num_classes == 4 and plain.pretrained_normalisation == {"interpolation": "bicubic"}


def test_a_weights_file_that_cannot_be_used_names_the_key_and_the_path(tmp_path):
    torch.save([1, 2], tmp_path / "list.pt")
    (tmp_path / "text.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "linked.pt").symlink_to(tmp_path / "list.pt")
    for name in ("list.pt", "text.pt", "linked.pt"):
        with pytest.raises(ConfigError) as refused:
            pretrained.read_weights(tmp_path / name, "model.weights_file")
        assert (refused.value.key, refused.value.value) == (
            "model.weights_file",
            str(tmp_path / name),
        )
    with pytest.raises(ConfigError) as refused:
        pretrained.timm_model(NAME, pretrained=str(tmp_path / "list.pt"))
    assert refused.value.key == "model.pretrained"


def test_the_first_three_tensors_that_do_not_fit_are_named_in_order(tmp_path):
    import timm

    state = timm.create_model(NAME).state_dict()
    names = sorted(state)
    for name in names[:2]:
        del state[name]
    torch.save(state, tmp_path / "two.pt")
    with pytest.raises(ConfigError) as refused:
        pretrained.timm_model(NAME, pretrained=str(tmp_path / "two.pt"))
    assert refused.value.allowed == (
        f"weights of this architecture; missing or of another shape: {names[0]}, {names[1]}"
    )
