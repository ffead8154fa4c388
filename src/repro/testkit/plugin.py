"""The test kit's pytest plugin, registered through the engine's `pytest11` entry point, so it
loads wherever the engine is installed, with nothing for a project to configure.

It only answers for the kit's own fixture names, so a suite that does not import the kit's
checks (the template's own) is not touched: `repro_project` (the project's conf/: the ini
option `repro_conf`, default `conf` beside pytest's rootdir), and the options each check runs
once for (`data_option`, `objective_option`, `experiment_option`, `stateful_option`), read from
that conf/ at collection, so a YAML added there is a test added.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from repro.testkit.project import Project

# fixture name -> the conf/ group whose project options parametrize it
OPTION_GROUPS = {
    "data_option": "data", "objective_option": "objective", "experiment_option": "experiment",
}  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("repro_conf", "the project's conf/ folder, from the rootdir", default="conf")


def _project(config: pytest.Config) -> Project:
    # Imported here, not at load: every pytest run where the engine is installed loads this
    # module, and only a suite that uses the kit should import more of the engine.
    from repro.testkit.project import Project

    return Project(Path(config.rootpath) / str(config.getini("repro_conf")))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    wanted = [name for name in (*OPTION_GROUPS, "stateful_option") if name in metafunc.fixturenames]
    if not wanted:
        return
    project = _project(metafunc.config)
    for name in wanted:
        group = OPTION_GROUPS.get(name)
        options = project.options(group) if group else project.stateful_options()
        # An empty list skips the check with pytest's own reason ("got empty parameter set").
        metafunc.parametrize(name, options, ids=options)


@pytest.fixture(scope="session")
def repro_project(pytestconfig: pytest.Config) -> Project:
    return _project(pytestconfig)
