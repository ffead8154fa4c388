"""Callbacks: code that watches the training loop, each named by `_target_` under `callbacks`.

    python -m repro.train +callbacks.confusion._target_=repro.confusion.ConfusionMatrix

A callback is any object with some of these methods (dispatched by name: no base class needed;
`Callback` below documents them and does nothing):

- `after_step(loop)`: after each optimizer step; `loop.position` says where the run is;
- `after_evaluation(loop, row, predictions)`: after each evaluation and its metrics row;
  `predictions.confusion(classes)` gives the confusion matrix of that validation pass;
- `at_checkpoint(loop)`: just before a checkpoint is written (flush what must match it);
- `at_end(loop, summary)`: once, after training, with what summary.json holds;
- `state_dict()` / `load_state_dict(state)`: a callback with state has it saved in every
  checkpoint and restored on resume, so a resumed run's callbacks go on as if never stopped.

Every rank calls its callbacks (a collective such as `predictions.confusion` needs them all);
write files on `loop.dist.is_main` only, atomically (`repro.files`), so a run killed and resumed
leaves the files an uninterrupted run leaves. Callbacks only watch: adding or removing one does
not change the weights, and a run may resume with other callbacks than it started with.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from repro.errors import ConfigError

log = logging.getLogger(__name__)

HOOKS = ("after_step", "after_evaluation", "at_checkpoint", "at_end")


class Callback:
    """The interface, for reading and for subclassing; every method does nothing."""

    def after_step(self, loop: Any) -> None: ...

    def after_evaluation(self, loop: Any, row: dict[str, float], predictions: Any) -> None: ...

    def at_checkpoint(self, loop: Any) -> None: ...

    def at_end(self, loop: Any, summary: dict[str, Any]) -> None: ...


class Callbacks:
    """A run's callbacks by name, called in the config's order; each hook calls only the
    callbacks that have it, so an unused hook costs the loop next to nothing."""

    def __init__(self, named: dict[str, Any] | None = None) -> None:
        self.named = dict(named or {})
        self._hooked = {
            hook: [
                getattr(callback, hook)
                for callback in self.named.values()
                if hasattr(callback, hook)
            ]
            for hook in HOOKS
        }

    def after_step(self, loop: Any) -> None:
        for call in self._hooked["after_step"]:
            call(loop)

    def after_evaluation(self, loop: Any, row: dict[str, float], predictions: Any) -> None:
        for call in self._hooked["after_evaluation"]:
            call(loop, row, predictions)

    def at_checkpoint(self, loop: Any) -> None:
        for call in self._hooked["at_checkpoint"]:
            call(loop)

    def at_end(self, loop: Any, summary: dict[str, Any]) -> None:
        for call in self._hooked["at_end"]:
            call(loop, summary)

    def state_dict(self) -> dict[str, Any]:
        return {
            name: callback.state_dict()
            for name, callback in self.named.items()
            if hasattr(callback, "state_dict")
        }

    def load_state_dict(self, states: dict[str, Any]) -> None:
        """Each stateful callback's saved state; one the checkpoint has none for (added on
        resume) starts afresh."""
        for name, callback in self.named.items():
            if not hasattr(callback, "load_state_dict"):
                continue
            if name in states:
                callback.load_state_dict(states[name])
            else:
                log.info("callbacks.%s: no state in the checkpoint; it starts afresh", name)


def build(nodes: Any) -> Callbacks:
    """`cfg.callbacks`: name -> a node with a `_target_` (a null node is left out, so that
    `callbacks.NAME=null` turns one off)."""
    built = {}
    for name, node in (nodes or {}).items():
        if node is None:
            continue
        key = f"callbacks.{name}"
        if not isinstance(node, DictConfig) or "_target_" not in node:
            raise ConfigError(key, node, "a callback given by _target_ (and its arguments)")
        try:
            built[str(name)] = instantiate(node)
        except Exception as error:  # an unknown class or a wrong argument: the user's to fix
            raise ConfigError(
                f"{key}._target_", node.get("_target_"), f"could not build it: {error}"
            ) from None
    return Callbacks(built)
