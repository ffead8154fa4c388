"""Each config value has one source: the YAML option of its group. The schema gives types."""

from __future__ import annotations

from dataclasses import MISSING as NO_DEFAULT
from dataclasses import fields

import pytest
from omegaconf import MISSING, OmegaConf

from repro import schema

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
