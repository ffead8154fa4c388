"""A checkpoint or run folder from someone else runs no code: a stored config builds only the
targets this checkout trusts, unless the user says trust=true."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from repro.errors import CheckpointError, UserError
from repro.evaluate import evaluate_checkpoint
from repro.predict import predict_files
from repro.runs import checkpoint, trust
from repro.runs.trust import UntrustedConfigError
from repro.verify.command import verify

from conftest import CONF, ROOT, compose_config, make_image_tree, run_cli, tiny, train_in_process

RUN = tiny("trainer.max_steps=2", "model.widths=[8,16]")
HARMFUL = (
    "pathlib.Path.touch",
    "pathlib.Path.write_text",
    "torch.hub.load",
    "importlib.import_module",
)
PLACES = ("model", "optimizer", "scheduler", "augment.transforms")


def _poisoned(config: dict, place: str, target: str, marker: Path) -> dict:
    """`config` with `place` replaced by a call of `target` that would create `marker`."""
    node = {"_target_": target, "_args_": [str(marker)]}
    if target == "pathlib.Path.write_text":
        node["_args_"].append("written")
    if place == "augment.transforms":
        config["augment"]["transforms"] = [node]
    else:
        config[place] = node
    return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train_in_process(run_dir, *RUN)
    return run_dir


def _crafted_checkpoint(trained: Path, folder: Path, place: str, target: str, marker: Path):
    state = checkpoint.load(trained / "checkpoints" / "last.pt")  # plain values and tensors
    _poisoned(state["config"], place, target, marker)
    path = folder / "crafted.pt"
    checkpoint.atomic_save(state, path)  # loads under weights_only=True, digest intact
    return path


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("target", HARMFUL)
def test_evaluate_predict_and_verify_refuse_a_harmful_target_and_create_nothing(
    target, place, trained, tmp_path
):
    marker = tmp_path / "created-by-the-config"
    ckpt = _crafted_checkpoint(trained, tmp_path, place, target, marker)
    expected = rf"crafted\.pt: .*{target.replace('.', '[.]')}.* trust=true"
    with pytest.raises(UntrustedConfigError, match=expected):
        evaluate_checkpoint(ckpt)
    with pytest.raises(UntrustedConfigError, match=expected):
        predict_files(ckpt, trained / "summary.json")  # refused before the images are looked at

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    recorded = _poisoned(yaml.safe_load((run_dir / "resolved_config.yaml").read_text()),
                         place, target, marker)  # fmt: skip
    (run_dir / "resolved_config.yaml").write_text(yaml.safe_dump(recorded))
    with pytest.raises(UntrustedConfigError, match=r"resolved_config\.yaml: .* trust=true"):
        verify(run_dir)
    assert not marker.exists()


def test_an_interpolation_in_a_stored_config_is_refused_before_it_resolves(trained, tmp_path):
    state = checkpoint.load(trained / "checkpoints" / "last.pt")
    claimed = tmp_path / "claimed"
    state["config"]["trainer"]["tta"] = f"${{record_subdir:{claimed}}}"  # would make a folder
    checkpoint.atomic_save(state, tmp_path / "crafted.pt")
    with pytest.raises(UntrustedConfigError, match=r"trainer\.tta=.* interpolation"):
        evaluate_checkpoint(tmp_path / "crafted.pt")
    assert not claimed.exists()


def test_a_resume_builds_from_the_users_config_never_the_checkpoints(tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "created-by-the-config"
    train_in_process(run_dir, *RUN, "trainer.halt_at_step=1")
    for path in (run_dir / "checkpoints").glob("step-*.pt"):
        state = checkpoint.load(path)
        _poisoned(state["config"], "model", HARMFUL[0], marker)
        path.unlink()  # last.pt is a hard link to it: write a new file
        checkpoint.atomic_save(state, path)
    (run_dir / "checkpoints" / "last.pt").unlink()
    with pytest.raises(CheckpointError, match=r"differs from the checkpoint's .*model\._target_"):
        train_in_process(run_dir, *RUN)
    assert not marker.exists()


def test_a_colleagues_model_needs_trust_and_then_works(tmp_path):
    run_dir = tmp_path / "run"
    small = [o for o in tiny("trainer.max_steps=2") if not o.startswith("model.")]
    train_in_process(run_dir, *small, "model=torchvision", "model._target_=colleague_nets.tiny_net")
    ckpt = run_dir / "checkpoints" / "last.pt"
    with pytest.raises(UntrustedConfigError, match=r"colleague_nets\.tiny_net"):
        evaluate_checkpoint(ckpt)
    assert evaluate_checkpoint(ckpt, trust=True)["images"] == 128
    images = make_image_tree(tmp_path / "images", 1, classes=("circle",), side=32)
    assert len(predict_files(ckpt, images, trust=True)) == 2
    assert verify(run_dir, steps=2, trust=True).identical


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
    assert trust.trusted("repro.models.resnet_cifar.ResNetCifar")
    for target in (
        "repro.files.write_text_atomic",  # ours, but no model
        "repro.models.small_cnn.torch.save",  # a name a model module imports
        "repro.models.small_cnn.nn",
        "torchvision.models.detection.fasterrcnn_resnet50_fpn",
        "torchvision.io.write_png",
        "torch.optim.lr_scheduler.torch",
        "builtins.exec",
        "os.system",
    ):
        assert not trust.trusted(target), target


@pytest.mark.e2e
@pytest.mark.slow
def test_the_entry_points_refuse_in_one_line(trained, tmp_path):
    marker = tmp_path / "created-by-the-config"
    ckpt = _crafted_checkpoint(trained, tmp_path, "model", "pathlib.Path.touch", marker)
    evaluated = run_cli("repro.evaluate", f"ckpt={ckpt}")
    predicted = run_cli("repro.predict", f"ckpt={ckpt}", f"images={ROOT / 'README.md'}",
                        f"out={tmp_path / 'p.csv'}")  # fmt: skip
    for done in (evaluated, predicted):
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"error: {ckpt}: model._target_='pathlib.Path.touch' is not")
    assert not marker.exists() and not (tmp_path / "p.csv").exists()


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


# ---- the unit: what counts as an interpolation (fast, in-process) --------------------------


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


# ---- the unit: the check, word for word, and where each kind of target is trusted ----------


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
    [("repro.models.small_cnn.SmallCNN", "model", True),
     ("repro.models.small_cnn.SmallCNN", None, True),
     ("repro.models.small_cnn.SmallCNN", "augment", False),
     ("repro.models.small_cnn.torch", "model", False),  # a name the module imports
     ("repro.models.nothing_here.Net", "model", False),
     ("repro.models.small_cnn.SmallCNN.forward", "model", False),
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
    [("repro.models.resnet_cifar.ResNetCifar", "model", True),  # in no YAML of conf/
     ("repro.models.resnet_cifar.ResNetCifar", "augment", False),
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
