"""runs/trust.py in this process: which targets this checkout trusts and where, what a stored
config may hold, and what `as_data` leaves a tool to act on. (Checkpoints that carry a harmful
target through the entry points: test_trust.py.)"""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from repro.core.errors import UserError
from repro.core.runs import trust
from repro.core.runs.trust import UntrustedConfigError

from conftest import CONF, compose_config, tiny


@pytest.mark.parametrize(
    "option",
    [f"model={p.stem}" for p in sorted((CONF / "model").glob("*.yaml"))]
    + [f"experiment={p.stem}" for p in sorted((CONF / "experiment").glob("*.yaml"))]
    + [f"augment={p.stem}" for p in sorted((CONF / "augment").glob("*.yaml"))]
    + [
        f"{group}={p.stem}"
        for group in ("optimizer", "scheduler")
        for p in sorted((CONF / group).glob("*.yaml"))
    ],
)
def test_every_config_the_template_writes_is_trusted_as_it_is_stored(option):
    cfg = compose_config(option, "data.root=/data")
    trust.check(OmegaConf.to_container(cfg, resolve=True), option)  # raises if not


def test_only_what_builds_a_model_optimizer_schedule_or_transform_is_trusted_by_kind():
    assert trust.trusted("torchvision.models.resnet50")
    assert trust.trusted("torchvision.transforms.v2.ColorJitter")
    assert trust.trusted("torch.optim.RMSprop")
    assert trust.trusted("torch.optim.lr_scheduler.OneCycleLR")
    assert trust.trusted("repro.extras.models.resnet_cifar.ResNetCifar")
    for target in (
        "repro.core.files.write_text_atomic",  # ours, but no model
        "repro.extras.models.small_cnn.torch.save",  # a name a model module imports
        "repro.extras.models.small_cnn.nn",
        "torchvision.models.detection.fasterrcnn_resnet50_fpn",
        "torchvision.io.write_png",
        "torch.optim.lr_scheduler.torch",
        "builtins.exec",
        "os.system",
    ):
        assert not trust.trusted(target), target


def test_a_target_named_in_conf_local_is_trusted_on_this_machine(tmp_path, monkeypatch):
    assert not trust.trusted("theirnets.Net")
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "trusted.yaml").write_text("- _target_: theirnets.Net\n")
    monkeypatch.setattr(trust, "CONF", tmp_path)
    trust.conf_targets.cache_clear()
    try:
        assert trust.trusted("theirnets.Net")
        assert not trust.trusted("theirnets.Other")
    finally:
        monkeypatch.undo()
        trust.conf_targets.cache_clear()


@pytest.mark.parametrize(
    "value", ["${oc.env:HOME}", "x${oc.env:HOME}", "cache/${now:%H}/run", "a $ b ${c}"]
)
def test_an_interpolation_anywhere_in_a_string_is_refused(value):
    assert trust.interpolates(value)
    stored = {"trainer": {"tta": value}}
    with pytest.raises(UntrustedConfigError, match=r"trainer\.tta=.*an interpolation"):
        trust.check(stored, "crafted.pt")


@pytest.mark.parametrize("value", ["flip", "$HOME", "{x}", "$ {x}", "costs $5"])
def test_a_string_without_an_interpolation_passes(value):
    assert not trust.interpolates(value)
    trust.check({"trainer": {"tta": value}}, "crafted.pt")  # no refusal


def test_a_refused_target_or_interpolation_is_one_line_naming_the_key_and_the_way_out():
    bad = {"model": {"_target_": "os.system"}}
    with pytest.raises(UntrustedConfigError) as refused:
        trust.check(bad, "runs/a/last.pt")
    assert str(refused.value) == (
        "runs/a/last.pt: model._target_='os.system' is not a target this checkout trusts there "
        "(no YAML of conf/ names it, and it is no model of this project or torchvision under "
        "model, torchvision transform under augment, torch optimizer or scheduler under "
        f"optimizer or scheduler); building it could run any code: {trust.HOW_TO_TRUST}"
    )
    with pytest.raises(UntrustedConfigError) as refused:
        trust.check({"augment": {"transforms": [{"_target_": 3}]}}, "f")
    assert "f: augment.transforms[0]._target_=3 is not a target" in str(refused.value)
    with pytest.raises(UntrustedConfigError) as refused:
        trust.check({"data": {"root": "a${oc.env:HOME}"}}, "f")
    assert str(refused.value) == (
        "f: data.root='a${oc.env:HOME}' is an interpolation, which a recorded config never holds "
        f"and whose resolver would run: {trust.HOW_TO_TRUST}"
    )
    trust.check(bad, "f", trust=True)  # trusted by the user: not looked at
    for flag in ("yes", 1, None):
        with pytest.raises(UserError) as refused:
            trust.check({}, "f", trust=flag)
        assert str(refused.value) == f"trust={flag!r} is not allowed: true or false"


def test_a_stored_config_as_data_acts_on_nothing_beyond_the_tools_output():
    stored = {"data": {"root": "d", "download": True}, "preset": "fast",
              "logger": {"mlflow": {"uri": "http://x"}, "wandb": {"project": "p"}, "plot": True},
              "callbacks": {"x": {"_target_": "os.system"}}}  # fmt: skip
    kept = copy.deepcopy(stored)
    assert trust.as_data(stored, "f") == {
        "data": {"root": "d", "download": False}, "preset": "fast",
        "logger": {"mlflow": None, "wandb": None, "plot": True},
    }  # fmt: skip
    assert stored == kept
    with pytest.raises(UntrustedConfigError) as refused:
        trust.as_data([1], "f")
    assert str(refused.value) == "f: holds no config (a mapping of keys to values)"
    with pytest.raises(UntrustedConfigError) as refused:
        trust.as_data({"data": 3, "seed": [1], "preset": "x"}, "f")
    assert str(refused.value) == (
        "f: not a config of this template (data, seed: not a mapping of settings)"
    )
    assert trust.as_data({"data": {}, "logger": {}}, "f") == {
        "data": {"download": False}, "logger": {"mlflow": None, "wandb": None},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("target", "place", "trusted"),
    [("repro.extras.models.small_cnn.SmallCNN", "model", True),
     ("repro.extras.models.small_cnn.SmallCNN", None, True),
     ("repro.extras.models.small_cnn.SmallCNN", "augment", False),
     ("repro.extras.models.small_cnn.torch", "model", False),  # a name the module imports
     ("repro.extras.models.nothing_here.Net", "model", False),
     ("repro.extras.models.small_cnn.SmallCNN.forward", "model", False),
     ("torchvision.models.resnet18", "model", True),
     ("torchvision.models.resnet18", "augment", False),
     ("torchvision.models.resnet_eighteen", "model", False),
     ("torchvision.transforms.RandomCrop", "augment", True),
     ("torchvision.transforms.v2.RandomCrop", None, True),
     ("torchvision.transforms.RandomCrop", "model", False),
     ("torchvision.transforms.functional", "augment", False),  # a module, not a class
     ("torch.optim.SGD", "optimizer", True), ("torch.optim.SGD", None, True),
     ("torch.optim.SGD", "scheduler", False), ("torch.optim.lr_scheduler", "optimizer", False),
     ("torch.optim.lr_scheduler.StepLR", "scheduler", True),
     ("torch.optim.lr_scheduler.StepLR", "optimizer", False),
     ("torch.optim.lr_scheduler.math", "scheduler", False),
     ("os.system", None, False), ("system", None, False), ("os.1x", None, False)],
)  # fmt: skip
def test_each_kind_of_target_is_trusted_only_where_the_template_builds_that_kind(
    target, place, trusted
):
    assert trust.trusted(target, place) is trusted


def test_the_leaves_of_a_config_are_named_by_their_dotted_keys():
    nested = {"a": {"b": [1, {"c": 2}], "d": (3,)}, "e": 4, 5: {"f": 6}}
    assert list(trust._leaves(nested)) == [
        ("a.b[0]", 1), ("a.b[1].c", 2), ("a.d[0]", 3), ("e", 4), ("5.f", 6),
    ]  # fmt: skip
    assert list(trust._leaves(7)) == [("", 7)]
    assert trust._section("augment.transforms[0]._target_") == "augment"
    assert trust._section("model[1]") == "model" and trust._section("seed") == "seed"


def test_conf_targets_are_trusted_in_their_groups_section():
    found = trust.conf_targets()
    small_cnn = compose_config(*tiny()).model._target_
    assert found[small_cnn] == frozenset({"model"})
    assert all(isinstance(places, frozenset) for places in found.values())


@pytest.mark.parametrize(
    ("target", "place", "trusted"),
    [("repro.extras.models.resnet_cifar.ResNetCifar", "model", True),  # in no YAML of conf/
     ("repro.extras.models.resnet_cifar.ResNetCifar", "augment", False),
     ("torchvision.models.vgg11", "model", True), ("torchvision.models.vgg11", "optimizer", False),
     ("torch.optim.Adagrad", "optimizer", True), ("torch.optim.NoSuchOptimizer", "optimizer", False),
     ("torchvision.transforms.ColorJitter", "augment", True),
     ("torchvision.transforms.NoSuchTransform", "augment", False)],
)  # fmt: skip
def test_a_kind_not_named_in_conf_is_trusted_by_where_it_is_built(target, place, trusted):
    assert target not in trust.conf_targets()
    assert trust.trusted(target, place) is trusted


def test_a_target_this_machine_trusts_anywhere_is_trusted_in_every_section(monkeypatch):
    monkeypatch.setattr(trust, "conf_targets", lambda: {"lab.Net": frozenset({None}),
                                                        "lab.Aug": frozenset({"augment"})})  # fmt: skip
    assert trust.trusted("lab.Net", "model") and trust.trusted("lab.Net", None)
    assert trust.trusted("lab.Aug", None) and not trust.trusted("lab.Aug", "model")


def test_a_top_level_target_and_nested_lists_are_checked_in_their_section():
    with pytest.raises(UntrustedConfigError, match=r"f: _target_='os.system' is not a target"):
        trust.check({"_target_": "os.system"}, "f")
    trust.check({"augment": [[{"_target_": "torchvision.transforms.ColorJitter"}]]}, "f")
    assert trust._section("augment[0][1]._target_") == "augment"
    with pytest.raises(UntrustedConfigError):
        trust.as_data({"model": {"_target_": "os.system"}}, "f")  # checked unless trusted


def test_only_the_yaml_git_tracks_under_conf_is_read_and_local_is_left_to_its_own_list(tmp_path):
    import subprocess

    conf = tmp_path / "repo" / "conf"
    (conf / "local").mkdir(parents=True)
    (conf / "model").mkdir()
    for name in ("a.yaml", "model/b.yaml", "untracked.yaml", "local/trusted.yaml", "notes.txt"):
        (conf / name).write_text("x: 1\n")
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    subprocess.run(
        ["git", "-C", str(conf), "add", "a.yaml", "model/b.yaml", "notes.txt"], check=True
    )
    assert sorted(trust._tracked_yaml(conf)) == [conf / "a.yaml", conf / "model" / "b.yaml"]
    installed = tmp_path / "site" / "conf"  # an installed engine's: no git, all but local/
    (installed / "local").mkdir(parents=True)
    (installed / "model").mkdir()
    for name in ("a.yaml", "model/b.yaml", "local/trusted.yaml"):
        (installed / name).write_text("x: 1\n")
    assert trust._tracked_yaml(installed) == [installed / "a.yaml", installed / "model" / "b.yaml"]


def test_an_installed_projects_conf_is_trusted_and_nothing_else_beside_it(tmp_path, monkeypatch):
    import importlib.metadata
    import sys
    from types import SimpleNamespace

    for project in ("lab", "nolab"):
        (tmp_path / project / "src" / project).mkdir(parents=True)
        (tmp_path / project / "src" / project / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path / project / "src"))
    (tmp_path / "lab" / "conf").mkdir()  # nolab ships no conf/
    entries = [SimpleNamespace(module=name) for name in ("missing_pkg", "lab", "nolab", "lab")]
    asked = []

    def entry_points(group):
        asked.append(group)
        return entries

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert trust.config_dirs() == [trust.CONF, (tmp_path / "lab" / "conf").resolve()]
    assert asked == ["repro.projects"] and "lab" not in sys.modules  # located, not imported


def test_where_a_stored_config_reaches_the_network_or_a_cache_is_this_machines_choice():
    data = {"root": "d", "download": True, "endpoint_url": "http://x", "cache_dir": "/c"}
    assert trust.as_data({"data": data}, "f")["data"] == {
        "root": "d",
        "download": False,
        "endpoint_url": None,
        "cache_dir": None,
    }


def test_a_name_a_model_module_imports_is_not_its_model_and_each_target_is_judged_where_built():
    assert not trust.trusted("repro.extras.models.small_cnn.Sequence", "model")  # collections.abc's
    stored = {"augment": {"transforms": [{"_target_": "torchvision.models.resnet18"}]}}
    with pytest.raises(UntrustedConfigError, match=r"augment\.transforms\[0\]\._target_="):
        trust.check(stored, "f")  # a model builder, trusted under model, not under augment
