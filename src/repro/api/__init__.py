"""What an experiment imports: the engine's stable surface.

A project's datasets, objectives, callbacks, components, metrics and models import from this
package and from nowhere else in `repro`; its entry point calls `main`, and its tests take the
test kit's checks from `repro.api.testkit`. Every name below keeps its meaning from one release
to the next. A change to one is announced a release ahead: the old name goes on working and
warns (a FutureWarning, shown by default, naming its replacement) for one release before it
goes (docs/api.md). Everything else in the package (core/, extras/ and the tools) is the
engine's own and may move between releases; `repro.verify.upgrade` (a project's `make
upgrade`) names each import of a project that reaches past this package.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from repro.core.data.datasets import Splits, carve_validation, folder
from repro.core.data.sources import ImageFiles, Source, TensorImages, decode_file
from repro.core.errors import CheckpointError, ConfigError, DataError, StorageError, UserError
from repro.core.files import atomic_path, write_json_atomic, write_text_atomic
from repro.core.restore import Restored, restore
from repro.core.runtime import launch
from repro.core.tasks import MULTI_LABEL, SINGLE_LABEL, Task
from repro.core.tasks.objectives import TOTAL, Batch, CrossEntropy, Objective, Targets
from repro.core.watch.callbacks import Callback
from repro.core.watch.metrics import weights_sha256

__all__ = [
    "MULTI_LABEL",
    "SINGLE_LABEL",
    "TOTAL",
    "Batch",
    "Callback",
    "CheckpointError",
    "ConfigError",
    "CrossEntropy",
    "DataError",
    "ImageFiles",
    "Objective",
    "Restored",
    "Source",
    "Splits",
    "StorageError",
    "Targets",
    "Task",
    "TensorImages",
    "UserError",
    "atomic_path",
    "carve_validation",
    "decode_file",
    "folder",
    "main",
    "restore",
    "weights_sha256",
    "write_json_atomic",
    "write_text_atomic",
]


def main(config_path: str | os.PathLike[str]) -> None:
    """Train with a project's own config: `config_path` is its conf/ folder, whose config.yaml
    composes the engine's groups; the command line holds Hydra's overrides (and `-m` for a
    sweep), as for `python -m repro.train`. A project's `NAME/train.py` calls it under
    `if __name__ == "__main__":`."""
    module = getattr(sys.modules["__main__"].__spec__, "name", None)
    if module:  # `python -m NAME.train`: PYTHONHASHSEED is pinned for that same command
        launch.start(module)
        launch.record_command(module)
    conf = Path(config_path).resolve()
    sys.argv = [sys.argv[0], f"--config-path={conf}", *sys.argv[1:]]
    from repro import train  # the tool itself: importing it registers the schemas

    train.command_line()
