"""Callbacks: code the training loop calls, each named by `_target_` under `callbacks`.

    python -m repro.train +callbacks.confusion._target_=repro.confusion.ConfusionMatrix

A callback is any object with some of these methods (dispatched by name: no base class needed;
`Callback` below documents them and does nothing; a `_target_` that builds an object with none
of them, nor `__enter__`, is refused: the loop would never call it):

- `at_start(loop)`, `before_step(loop)`: when the loop starts; before each step's batch;
- `after_step(loop)`: after each optimizer step; `loop.state.position` says where the run is;
- `extra_metrics(loop)`: at each evaluation, columns to add to its row;
- `after_evaluation(loop, row, predictions)`: after each evaluation and its metrics row;
  `predictions.confusion(classes)` gives the confusion matrix of that validation pass;
- `at_checkpoint(loop)`: just before a checkpoint is written (flush what must match it);
- `at_end(loop, summary)`: once, after training, with what summary.json holds;
- `state_dict()` / `load_state_dict(state)`: a callback with state has it saved in every
  checkpoint and restored on resume, so a resumed run's callbacks go on as if never stopped.

`loop.stop(reason)` ends the run after the current step, as a completed one. What else `loop`
offers, and which parts of it are stable: docs/callbacks.md.

`components` are built the same way, by `_target_` under `components`, with two more
arguments, `model` and `total_steps`: they are parts of the loop that change the weights
(lookahead is one), so they are recorded like any setting that changes results, a run resumes
only with the same ones, and their `state_dict` is required.

Every rank calls its callbacks (a collective such as `predictions.confusion` needs them all);
write files on `loop.dist.is_main` only, atomically (`repro.core.files`), so a run killed and resumed
leaves the files an uninterrupted run leaves. A callback that does not call `loop.stop` does
not change the weights, and a run may resume with other callbacks than it started with.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from repro.core.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

HOOKS = ("at_start", "before_step", "after_step", "extra_metrics", "after_evaluation",
         "at_checkpoint", "at_end")  # fmt: skip
STATE = ("state_dict", "load_state_dict")
# What the loop calls an object through: a hook, or entering it as a context manager.
CALLED = (*HOOKS, "__enter__")


class Callback:
    """The interface, for reading and for subclassing; every method does nothing."""

    def at_start(self, loop: Any) -> None:
        """The loop starts (or resumes) training at `loop.state.position`."""

    def before_step(self, loop: Any) -> None:
        """A step is about to fetch its batch."""

    def after_step(self, loop: Any) -> None:
        """An optimizer step is done; `loop.state.position` counts it."""

    def extra_metrics(self, loop: Any) -> dict[str, float]:
        """An evaluation's row is being made: columns to add to it."""
        return {}

    def after_evaluation(self, loop: Any, row: dict[str, float], predictions: Any) -> None:
        """An evaluation's row is written; `predictions.confusion(classes)` on every rank."""

    def at_checkpoint(self, loop: Any) -> None:
        """A checkpoint is about to be taken."""

    def at_end(self, loop: Any, summary: dict[str, Any]) -> None:
        """Training is over; `summary` is what summary.json holds."""


class Callbacks:
    """A run's callbacks by name, called in order: first the config's `components` (the
    weight average, lookahead): their state must be in the checkpoint a run resumes from;
    then the `named` ones (what only watches: the template's progress bar,
    profiler and sync debugging, and the config's `callbacks`). Each hook calls only those
    that have it, so an unused hook costs the loop next to nothing. One that is a context
    manager is entered when the loop starts and left when it stops, with its error if any."""

    def __init__(
        self, named: dict[str, Any] | None = None, components: dict[str, Any] | None = None
    ) -> None:
        self.named, self.components = dict(named or {}), dict(components or {})
        everyone = [*self.components.values(), *self.named.values()]
        self._hooked = {
            hook: [getattr(callback, hook) for callback in everyone if hasattr(callback, hook)]
            for hook in HOOKS
        }
        self._managers = [callback for callback in everyone if hasattr(callback, "__enter__")]

    def get(self, name: str) -> Any:
        """The component or callback of that name, or None."""
        return self.components.get(name, self.named.get(name))

    @contextlib.contextmanager
    def running(self, loop: Any) -> Iterator[None]:
        """Around the loop: the context managers entered, then `at_start`."""
        with contextlib.ExitStack() as stack:
            for manager in self._managers:
                stack.enter_context(manager)
            for call in self._hooked["at_start"]:
                call(loop)
            yield

    def before_step(self, loop: Any) -> None:
        for call in self._hooked["before_step"]:
            call(loop)

    def after_step(self, loop: Any) -> None:
        for call in self._hooked["after_step"]:
            call(loop)

    def extra_metrics(self, loop: Any) -> dict[str, float]:
        """Columns the components add to an evaluation's row (the average's `ema_val_...`)."""
        extra: dict[str, float] = {}
        for call in self._hooked["extra_metrics"]:
            extra |= call(loop)
        return extra

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
        """The named callbacks' states (a checkpoint's `callbacks` entry)."""
        return {
            name: cb.state_dict() for name, cb in self.named.items() if hasattr(cb, "state_dict")
        }

    def load_state_dict(self, states: dict[str, Any]) -> None:
        """Each stateful named callback's saved state; one the checkpoint has none for (added
        on resume) starts afresh."""
        for name, callback in self.named.items():
            if not hasattr(callback, "load_state_dict"):
                continue
            if name in states:
                callback.load_state_dict(states[name])
            else:
                log.info("callbacks.%s: no state in the checkpoint; it starts afresh", name)

    def components_state(self) -> dict[str, Any]:
        """The components' states by name (a checkpoint's `components` entry)."""
        return {name: component.state_dict() for name, component in self.components.items()}

    def load_components(self, state: dict[str, Any]) -> None:
        """Each component's state: one the checkpoint lacks cannot be resumed. A checkpoint
        written before components held the average and lookahead top-level, as `ema` and
        `lookahead`."""
        saved = state.get("components") or {}
        for name, component in self.components.items():
            found = saved.get(name, state.get(name))
            if found is None:
                raise CheckpointError(f"the checkpoint holds no components.{name} state to resume")
            try:
                component.load_state_dict(found)
            except (ValueError, KeyError, RuntimeError) as error:
                raise CheckpointError(f"components.{name}: {error}") from None


def build(
    nodes: Any, builtin: dict[str, Any] | None = None, components: dict[str, Any] | None = None
) -> Callbacks:
    """The template's `builtin` watchers, then `cfg.callbacks`: name -> a node with
    a `_target_` (a null node is left out, so that `callbacks.NAME=null` turns one off)."""
    built = dict(builtin or {})
    found = instantiated("callbacks", nodes)
    # Else `+callbacks.x._target_=builtins.print` (its None) is taken and never called.
    allowed = f"a class with a callback method ({', '.join((*HOOKS, *STATE))}) or __enter__"
    check_interface("callbacks", nodes, found, (), (*CALLED, *STATE), allowed)
    return Callbacks(built | found, components)


def build_components(nodes: Any, model: Any, total_steps: int) -> dict[str, Any]:
    """`cfg.components`: name -> a part of the loop built with the model and the run's length."""
    found = instantiated("components", nodes, model=model, total_steps=total_steps)
    # No hook is required: a component may be a part the objective uses (a teacher).
    allowed = "a class with state_dict and load_state_dict (a resume needs its state)"
    check_interface("components", nodes, found, STATE, (), allowed)
    return found


def check_interface(
    group: str, nodes: Any, found: dict[str, Any], every: tuple, some: tuple, allowed: str
) -> None:
    """Each object built for `group` has `every` method and one at least of `some` (if any):
    else the loop would never call it, or (a component without its state) could not resume
    it."""
    for name, built in found.items():
        lacks_one = some and not any(hasattr(built, m) for m in some)
        if not all(hasattr(built, m) for m in every) or lacks_one:
            said = f"{allowed}; it built {type(built).__name__}"
            raise ConfigError(f"{group}.{name}._target_", nodes[name]._target_, said)


def instantiated(group: str, nodes: Any, **arguments: Any) -> dict[str, Any]:
    """Each node of `group` by `_target_`, left out when null; a bad one is the user's to fix."""
    built: dict[str, Any] = {}
    for name, node in (nodes or {}).items():
        if node is None:
            continue
        key = f"{group}.{name}"
        if not isinstance(node, DictConfig) or "_target_" not in node:
            raise ConfigError(key, node, "a class given by _target_ (and its arguments)")
        try:
            built[str(name)] = instantiate(node, **arguments)
        except Exception as error:  # an unknown class or a wrong argument: the user's to fix
            cause = error.__cause__ or error  # Hydra wraps the class's own error
            said = " ".join(str(cause).split())  # an import error's spans several lines
            raise ConfigError(
                f"{key}._target_", node.get("_target_"), f"could not build it: {said}"
            ) from None
    return built
