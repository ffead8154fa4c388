"""The kit's pytest plugin loads wherever the engine is installed, but acts only in a project
that asks for it (`repro_testkit = true`): a foreign suite with its own `data_option` and
`repro_project` fixtures keeps them, its tests run, none is skipped."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

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


KIT_NAMES = (
    "data_option",
    "objective_option",
    "metrics_option",
    "experiment_option",
    "stateful_option",
    "repro_project",
)


def foreign_suite(rng: random.Random) -> tuple[str, int]:
    """A suite that uses some of the kit's fixture names for its own ends, each by a fixture,
    a parametrization or an argument default; and how many tests it holds."""
    names = rng.sample(KIT_NAMES, rng.randint(1, len(KIT_NAMES)))
    lines, tests = ["import pytest", ""], 0
    for index, name in enumerate(names):
        style = rng.choice(["fixture", "params", "parametrize"])
        values = [f"theirs-{index}-{n}" for n in range(rng.randint(1, 3))]
        if style == "fixture":
            lines += ["@pytest.fixture", f"def {name}():", f"    return {values[0]!r}", ""]
            values = values[:1]
        elif style == "params":
            lines += [f"@pytest.fixture(params={values!r})", f"def {name}(request):"]
            lines += ["    return request.param", ""]
        else:
            lines += [f"@pytest.mark.parametrize({name!r}, {values!r})"]
        lines += [
            f"def test_{index}({name}):",
            f"    assert {name}.startswith('theirs-{index}-')",
            "",
        ]
        tests += len(values)
    return "\n".join(lines), tests


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_foreign_suites_drawn_at_random_are_left_alone(tmp_path, seed):
    """The plugin, fuzzed: whichever of the kit's names a foreign suite uses, and however."""
    text, tests = foreign_suite(random.Random(seed))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_theirs.py").write_text(text)
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n")
    done = pytest_in(tmp_path)
    assert done.returncode == 0 and f"{tests} passed" in done.stdout, text + done.stdout[-2000:]
    assert "skipped" not in done.stdout
