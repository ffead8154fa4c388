"""The test kit in a project that asked for it (`repro_testkit = true`; see `plugin`): the
fixture `repro_project` (the project's conf/: the ini option `repro_conf`, default `conf`
beside pytest's rootdir), and the options each check runs once for (`data_option`,
`objective_option`, `metrics_option`, `experiment_option`, `stateful_option`), read from that
conf/ at collection, so a YAML added there is a test added.

A failed check reports its own message alone (the option, the promise, what to change), not
the traceback of the engine and libraries under it: that comes with `pytest -v`. An import of
the project's own code (src/) that reaches past `repro.api` is a warning, one line each: the
next engine may move what it names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from repro.extras.testkit.project import Project
from repro.verify.imports import internal_imports

# fixture name -> the conf/ group whose project options parametrize it
OPTION_GROUPS = {
    "data_option": "data",
    "objective_option": "objective",
    "metrics_option": "metrics",
    "experiment_option": "experiment",
}
CHECKS = "repro.extras.testkit.checks"


def _project(config: pytest.Config, scratch: Path | None = None) -> Project:
    return Project(Path(config.rootpath) / str(config.getini("repro_conf")), scratch)


def pytest_configure(config: pytest.Config) -> None:
    for line in internal_imports(Path(config.rootpath) / "src"):
        config.issue_config_time_warning(pytest.PytestWarning(line), stacklevel=2)


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
def repro_project(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Project:
    return _project(pytestconfig, tmp_path_factory.mktemp("runs"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A kit check's failure as its message alone, unless pytest runs with -v."""
    outcome = yield
    report = outcome.get_result()
    function = getattr(item, "function", None)
    if (
        report.failed
        and call.excinfo is not None
        and call.excinfo.errisinstance(AssertionError)
        and getattr(function, "__module__", "") == CHECKS
        and item.config.get_verbosity() < 1
    ):
        report.longrepr = f"{call.excinfo.value}\n(pytest -v shows the traceback)"
