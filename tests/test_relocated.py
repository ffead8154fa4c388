"""core/relocated.py: the engine's old module names (before core/ and extras/) still import
today's modules, for one release, with one FutureWarning per import statement; a recorded
`_target_` under an old name reads under today's."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from repro.core import relocated

from conftest import ROOT

# An old-style project's imports (a project generated at 2dd5a27), one statement a line.
OLD_PROJECT = """\
from repro.data.datasets import Splits, carve_validation
from repro.data.sources import TensorImages
from repro.errors import ConfigError
from repro.objectives import CrossEntropy, Targets
from repro.files import write_json_atomic
from repro.testkit.checks import *
import repro.api
assert Splits is repro.api.Splits and TensorImages is repro.api.TensorImages
assert ConfigError is repro.api.ConfigError and CrossEntropy is repro.api.CrossEntropy
assert sys.modules["repro.data.datasets"] is sys.modules["repro.core.data.datasets"]
assert test_data_gives_the_same_split_for_the_same_seed.__module__ == "repro.extras.testkit.checks"
"""


def run(code: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_old_projects_imports_get_todays_modules_with_one_warning_per_statement(tmp_path):
    done = run(OLD_PROJECT, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "FutureWarning" in line]
    assert [line.split(":", 2)[1] for line in warned] == ["2", "3", "4", "5", "6", "7"]
    assert warned[0] == (
        "<string>:2: FutureWarning: repro.data is now repro.core.data, internal to the engine: "
        "import what you use of it from repro.api (docs/api.md); the old name goes in the next "
        "release"
    )
    assert "repro.errors is now repro.core.errors" in warned[2]


def test_a_name_that_never_was_is_pythons_usual_error(tmp_path):
    done = run("import repro.data.no_such_module", tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: No module named 'repro.data.no_such_module'"
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("repro.models.small_cnn.SmallCNN", "repro.extras.models.small_cnn.SmallCNN"),
        ("repro.guards.text.for_terminal", "repro.core.text.for_terminal"),
        ("repro.guards.received.load_json", "repro.core.guards.received.load_json"),
        ("repro.resume.overrides.Relaunch", "repro.core.overrides.Relaunch"),
        ("repro.resume.command.main", "repro.resume.command.main"),  # still where it was
        ("repro.dataset.X", "repro.dataset.X"),  # only whole names move
        ("repro_lab.data.X", "repro_lab.data.X"),
    ],
)
def test_a_dotted_name_reads_under_todays_layout(old, new):
    assert relocated.new_name(old) == new


def test_every_old_name_leads_to_a_module_of_today():
    for old, new in relocated.RELOCATED.items():
        assert importlib.util.find_spec(new) is not None, (old, new)
        assert not (ROOT / "src" / old.replace(".", "/")).exists(), old  # and the old is gone
