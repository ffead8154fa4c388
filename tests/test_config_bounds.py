"""Every bounded config value is checked at both sides of each of its bounds. The cases come
from the tables in repro.core.config, so a key added there is tested without a new line here."""

from __future__ import annotations

import copy
import functools

import pytest
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import ValidationError

from repro.core import config
from repro.core.errors import ConfigError

from conftest import compose_config


@functools.cache
def _composed():
    return compose_config("data.root=/data")


def _refused_key(key: str, value: object) -> str | None:
    """The key validate names when `key` is set to `value` (None if nothing is refused)."""
    cfg = copy.deepcopy(_composed())  # composed once: Hydra takes a second to do it
    try:
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, force_add=True)
    except ValidationError as error:  # the schema's type refuses it, as Hydra would
        return error.full_key
    try:
        config.validate(cfg)
    except ConfigError as error:
        return error.key
    return None


def _minimum_cases():
    for key, (lowest, nullable) in config.MINIMUM.items():
        yield key, lowest, True
        yield key, lowest - 1, False
        yield key, None, nullable


def _between_cases():
    for key, (interval, nullable) in config.BETWEEN.items():
        low, high = (float(end) for end in interval[1:-1].split(","))
        yield key, low, interval[0] == "["
        yield key, high, interval[-1] == "]"
        yield key, low - 0.01, False
        yield key, high + 0.01, False
        yield key, None, nullable


@pytest.mark.parametrize(("key", "value", "allowed"), [*_minimum_cases(), *_between_cases()])
def test_a_bound_is_where_the_table_says(key, value, allowed):
    refused = _refused_key(key, value)
    if allowed:
        assert refused != key, f"{key}={value!r} should be allowed"
    else:
        assert refused == key, f"{key}={value!r} should be refused naming {key}"


@pytest.mark.parametrize(("interval", "inside", "outside"), [
    ("[0, 1)", [0, 0.5], [1, -0.1]),
    ("(0, 1]", [1, 1e-9], [0, 1.1]),
])  # fmt: skip
def test_interval_ends_follow_their_brackets(interval, inside, outside):
    assert all(config.inside(value, interval) for value in inside)
    assert not any(config.inside(value, interval) for value in outside)
    assert not config.inside(True, interval) and not config.inside("0.5", interval)
