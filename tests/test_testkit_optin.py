"""The kit's pytest plugin loads wherever the engine is installed, but acts only in a project
that asks for it (`repro_testkit = true`): a foreign suite with its own `data_option` and
`repro_project` fixtures keeps them, its tests run, none is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FOREIGN_TEST = """
import pytest


@pytest.fixture(params=["theirs-a", "theirs-b"])
def data_option(request):
    return request.param


@pytest.fixture
def repro_project():
    return "their own project"


def test_their_own_fixtures(data_option, repro_project):
    assert data_option.startswith("theirs-") and repro_project == "their own project"


@pytest.mark.parametrize("objective_option", ["mine"])
def test_their_own_parametrization(objective_option):
    assert objective_option == "mine"
"""


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_foreign_suite_keeps_its_own_fixtures_of_the_kits_names(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_theirs.py").write_text(FOREIGN_TEST)
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n")
    done = pytest_in(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "3 passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-3000:]


def test_a_project_that_asks_for_the_kit_gets_its_options(tmp_path):
    for option in ("stripes", "synthetic"):
        (tmp_path / "conf" / "data").mkdir(parents=True, exist_ok=True)
        (tmp_path / "conf" / "data" / f"{option}.yaml").write_text("{}\n")
    (tmp_path / "conf" / "config.yaml").write_text("defaults:\n  - data: synthetic\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_kit.py").write_text(
        "def test_each_data_option(data_option):\n    assert data_option\n"
    )
    settings = "[tool.pytest.ini_options]\ntestpaths = ['tests']\nrepro_testkit = true\n"
    (tmp_path / "pyproject.toml").write_text(settings)
    done = pytest_in(tmp_path, "--collect-only")
    assert "test_each_data_option[stripes]" in done.stdout, done.stdout[-3000:]
    assert "test_each_data_option[synthetic]" in done.stdout
