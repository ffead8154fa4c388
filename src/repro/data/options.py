"""A data option's own settings: the keys of `data` that the schema (`DataConfig`) does not
declare, such as `labels_file: labels.csv`. They go to the option's builder as keyword
arguments, so its signature names and types them, and `check` holds them against it before
any data is read: a mistyped key, a wrong type or a missing setting is one line.

    def csv_images(cfg, seed: int, *, labels_file: str = "labels.csv") -> Splits: ...

The schema's own keys are typed here too (`typed`): the `data` node is left open for the
settings, so composition does not type it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from repro.errors import ConfigError
from repro.schema import DataConfig

DECLARED = tuple(item.name for item in dataclasses.fields(DataConfig))


def typed(data: DictConfig) -> None:
    """Type the declared keys of `data` in place as DataConfig says; one line for a value
    that is missing or of the wrong type."""
    for name in DECLARED:
        if name in data and OmegaConf.is_missing(data, name):
            raise ConfigError(f"data.{name}", "???", "a value: the data option must set it")
    declared = {name: data[name] for name in DECLARED if name in data}
    try:
        checked = OmegaConf.merge(OmegaConf.structured(DataConfig), declared)
    except ValidationError as error:
        kind = DataConfig.__annotations__.get(str(error.key), "any")
        raise ConfigError(f"data.{error.key}", declared.get(error.key), _describe(kind)) from None
    for name in declared:  # "32" given for an int is 32 from here on
        data[name] = checked[name]


def settings(data: DictConfig) -> dict[str, Any]:
    """The option's own settings, as plain Python values."""
    return {
        str(key): OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        for key, value in data.items()
        if key not in DECLARED
    }


def check(builder: Callable[..., Any], data: DictConfig) -> dict[str, Any]:
    """The settings, once each is found to be an argument of `builder` (past its first two,
    the config and the seed) of the type it declares, and every argument it requires given."""
    target = data._target_
    parameters = list(inspect.signature(builder).parameters.values())[2:]
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    named = {
        p.name: p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    try:
        hints = typing.get_type_hints(builder)
    except Exception:  # an annotation that does not resolve types nothing
        hints = {}
    given = settings(data)
    for key, value in given.items():
        if key not in named and not open_ended:
            close = difflib.get_close_matches(key, [*named, *DECLARED], n=1)
            hint = f"; did you mean data.{close[0]}?" if close else ""
            takes = ", ".join(named) or "none"
            raise ConfigError(
                f"data.{key}", value, f"not a key of {target} (its own: {takes}){hint}"
            )
        if key in hints and not _fits(value, hints[key]):
            raise ConfigError(
                f"data.{key}", value, f"{_describe(hints[key])}, as {target} declares"
            )
    for name, parameter in named.items():
        if parameter.default is inspect.Parameter.empty and name not in given:
            raise ConfigError(f"data.{name}", None, f"a value: {target} requires it")
    return given


def _fits(value: Any, hint: Any) -> bool:
    """Whether a config value can be an argument annotated `hint` (simple types only; any
    other annotation is taken on trust)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        return numeric and (hint is float or isinstance(value, int))
    if hint in (str, Path):
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        return isinstance(value, list | tuple)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def _describe(hint: Any) -> str:
    """`a value of type int`, for an annotation or its text."""
    return f"a value of type {getattr(hint, '__name__', hint)}"
