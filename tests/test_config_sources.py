"""Each config value has one source: the YAML option of its group. The schema gives types."""

from __future__ import annotations

from dataclasses import MISSING as NO_DEFAULT
from dataclasses import fields

import pytest
from omegaconf import MISSING, OmegaConf

from repro.core import config, schema

from conftest import CONF, compose_config

SECTIONS = {
    "seed": schema.SeedConfig, "cudnn": schema.CudnnConfig,
    "dataloader": schema.DataLoaderConfig, "memory_format": schema.MemoryFormatConfig,
    "amp": schema.AmpConfig, "data": schema.DataConfig, "trainer": schema.TrainerConfig,
    "logger": schema.LoggerConfig,
}  # fmt: skip
OPTIONS = [
    (group, path.stem) for group in SECTIONS for path in sorted((CONF / group).glob("*.yaml"))
]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_sets_every_value_the_schema_leaves_open(group, option):
    extra = ["data.root=/somewhere"] if (group, option) == ("data", "imagefolder") else []
    cfg = compose_config(f"{group}={option}", *extra)
    assert OmegaConf.missing_keys(cfg[group]) == set()


@pytest.mark.parametrize("group", SECTIONS)
def test_a_schema_default_is_never_a_second_copy_of_a_value_every_option_sets(group):
    options = [OmegaConf.load(path) for path in sorted((CONF / group).glob("*.yaml"))]
    for spec in fields(SECTIONS[group]):
        if all(spec.name in option for option in options):
            default = spec.default if spec.default is not NO_DEFAULT else None
            assert default == MISSING, f"{group}.{spec.name} is set by every option"


def test_the_declared_defaults_are_each_sections_keys_with_a_value_of_their_own():
    declared = schema.declared_defaults()
    assert declared == {
        "dataloader.on_device": False,
        "augment.flip": "random",
        "augment.crop_padding_mode": "zeros",
        "augment.cutout": 0,
        "trainer.profile_steps": None,
        "trainer.tta": "none",
        "trainer.init_weights": None,
        "logger.tensorboard": False,
        "optimizer.decay_biases_and_norms": True,
        "optimizer.lr_scale_biases_and_norms": 1.0,
        "optimizer.layer_decay": None,
        "optimizer.head_lr": None,
        "data.root": None,
        "data.download": False,
        "data.fraction": 1.0,
        "data.cache": "none",
        "data.cache_budget_gib": 8.0,
        "data.train_size": None,
        "data.test_size": None,
        "data.generator_seed": None,
    }
    assert MISSING not in declared.values() and NO_DEFAULT not in declared.values()
    assert not any(key.startswith(("logger.mlflow", "logger.wandb")) for key in declared)
    for key, value in declared.items():
        section, name = key.split(".")
        owner = schema.OptimizerExtras if section == "optimizer" else SECTIONS.get(section)
        owner = owner or schema.AugmentConfig
        assert {f.name: f.default for f in fields(owner)}[name] == value, key


def test_the_data_section_is_open_its_declared_keys_at_their_defaults():
    opened = schema._open(schema.DataConfig)
    assert opened == {f.name: f.default for f in fields(schema.DataConfig)}
    assert opened["root"] is None and opened["num_classes"] == MISSING
    assert schema._open(schema.SeedConfig) == {"mode": MISSING, "value": MISSING}


def test_registering_stores_both_schemas_at_the_top_and_the_run_folders_resolver(monkeypatch):
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    monkeypatch.setattr(store, "repo", {})  # as before any entry point registered them
    for resolver in ("record_subdir", "run_id", "run_stamp"):
        OmegaConf.clear_resolver(resolver)
    config.register()
    config.register()  # safe twice
    assert store.list("schema") == ["bench.yaml", "train.yaml"]
    train, bench = store.load("schema/train.yaml"), store.load("schema/bench.yaml")
    assert train.package == bench.package == "_global_"
    assert "suite" not in train.node and "suite" in bench.node
    for resolver in ("record_subdir", "run_id", "run_stamp"):
        assert OmegaConf.has_resolver(resolver), resolver
