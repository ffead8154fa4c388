"""Where the engine's modules were before its tiers became folders (core/, extras/), and the
old names kept working, with a warning, for one release.

Two readers: a recorded config (a checkpoint's, a run folder's) names its `_target_`s as the
engine named them when it trained (`new_name`, used by runs.resume.upgrade); and a project's
code, or its conf/, may still import an old name (`install`, called once by the package's
`__init__`): it gets today's module itself (not a copy: its classes are the engine's) and a
FutureWarning, shown by default, saying what to import instead. Imports nothing heavy.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

# Old dotted name -> today's; the longest old name that fits wins.
RELOCATED = {
    "repro.guards.text": "repro.core.text",
    "repro.watch.progress": "repro.core.runtime.progress",
    "repro.runs.restore": "repro.core.restore",
    "repro.runs.final_test": "repro.core.engine.final_test",
    "repro.engine.position": "repro.core.runs.position",
    "repro.resume.overrides": "repro.core.overrides",
    "repro.composition": "repro.core.composition",
    "repro.errors": "repro.core.errors",
    "repro.files": "repro.core.files",
    "repro.guards": "repro.core.guards",
    "repro.runtime": "repro.core.runtime",
    "repro.schema": "repro.core.schema",
    "repro.config": "repro.core.config",
    "repro.build": "repro.core.build",
    "repro.callbacks": "repro.core.watch.callbacks",
    "repro.objectives": "repro.core.tasks.objectives",
    "repro.tasks": "repro.core.tasks",
    "repro.data": "repro.core.data",
    "repro.runs": "repro.core.runs",
    "repro.watch": "repro.core.watch",
    "repro.sweeps": "repro.core.sweeps",
    "repro.engine": "repro.core.engine",
    "repro.components": "repro.extras.components",
    "repro.models": "repro.extras.models",
    "repro.recipes": "repro.extras.recipes",
    "repro.multilabel": "repro.extras.multilabel",
    "repro.search": "repro.extras.search",
    "repro.testkit": "repro.extras.testkit",
}


_LONGEST_FIRST = sorted(RELOCATED, key=len, reverse=True)


def new_name(dotted: str) -> str:
    """`dotted` (a module, or a name inside one) as today's layout names it."""
    if not dotted.startswith("repro."):  # every import asks: most are none of ours
        return dotted
    for old in _LONGEST_FIRST:
        if dotted == old or dotted.startswith(f"{old}."):
            return RELOCATED[old] + dotted[len(old) :]
    return dotted


class OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as today's module, with a FutureWarning."""

    def __init__(self) -> None:
        self.warned: set[tuple[str, int]] = set()  # where an import statement was named

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        today = new_name(fullname)
        if today == fullname or importlib.util.find_spec(today) is None:
            return None  # not an old name, or one that never was: Python says so as usual
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        today = new_name(spec.name)
        place = _importer()
        if place not in self.warned:  # `from repro.data.datasets import X`: one line, not two
            self.warned.add(place)
            warnings.warn_explicit(
                f"{spec.name} is now {today}, internal to the engine: import what you use of "
                "it from repro.api (docs/api.md); the old name goes in the next release",
                FutureWarning,
                *place,
            )
        return importlib.import_module(today)

    def exec_module(self, module: ModuleType) -> None:
        """Today's module is already executed."""


def _importer() -> tuple[str, int]:
    """The file and line of the import statement that asked for a module."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib")
        or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def install() -> None:
    """Put `OldNames` first among the import finders, once: before the path finder, which
    would otherwise load a second copy of a module from an old package's `__path__`."""
    if not any(isinstance(finder, OldNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldNames())
