"""Hydra's composition errors as one line of ours: an override of a key the config lacks
(`objective.gama=3`) names the key and the closest one of its node, instead of Hydra's
several lines."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from repro.core.config import did_you_mean
from repro.core.errors import UserError, exit_with


def unknown_override(error: BaseException) -> UserError | None:
    """Hydra's several lines for an override of a key its node lacks (`objective.gama=3`), as
    one line naming the key and the closest key of that node; None for any other error."""
    cause = error.__cause__
    known_kind = isinstance(cause, ConfigAttributeError | ConfigKeyError)
    if not isinstance(error, ConfigCompositionException) or not known_kind:
        return None
    node, key = cause.parent_node, cause.key
    if not isinstance(node, DictConfig) or key is None or key in node:
        return None
    where = str(cause.full_key).rpartition(".")[0]
    prefix = f"{where}." if where else ""
    if not node:  # `callbacks.x=...` where no callback is named yet
        return UserError(f"{cause.full_key}: {where} has no keys yet; add one with +{prefix}{key}")
    hint = did_you_mean(key, node.keys(), prefix)
    return UserError(f"{cause.full_key}: not a key of {where or 'the config'}; {hint}")


@contextlib.contextmanager
def one_line_composition_errors() -> Iterator[None]:
    """Around `hydra.main`: an override of a key the config lacks exits with our one line
    (`unknown_override`) instead of Hydra's several.

    Hydra composes the config and prints its errors inside `hydra.main`, through
    `hydra._internal.utils.run_and_report`, which no public hook reaches; composing once more
    beforehand would cost every run's start-up a tenth of a second. So that reporter is wrapped
    for the block (hydra-core is pinned in uv.lock; a release without it gets Hydra's message).
    """
    from hydra._internal import utils

    original = getattr(utils, "run_and_report", None)
    if original is None:
        yield
        return

    def run_and_report(func: Callable[[], Any]) -> Any:
        def explained() -> Any:
            try:
                return func()
            except ConfigCompositionException as error:
                ours = unknown_override(error)
                if ours is None:
                    raise
                exit_with(ours)  # a SystemExit: Hydra's `except Exception` lets it through

        return original(explained)

    utils.run_and_report = run_and_report
    try:
        yield
    finally:
        utils.run_and_report = original
