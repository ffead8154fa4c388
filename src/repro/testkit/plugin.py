"""The test kit's pytest plugin, registered through the engine's `pytest11` entry point, so it
loads wherever the engine is installed, with nothing for a project to configure.

It only answers for the kit's own fixture names, so a suite that does not import the kit's
checks (the template's own) is not touched: `repro_project` (the project's conf/: the ini
option `repro_conf`, default `conf` beside pytest's rootdir), and the options each check runs
once for (`data_option`, `objective_option`, `metrics_option`, `experiment_option`,
`stateful_option`), read from that conf/ at collection, so a YAML added there is a test added.

A failed check reports its own message alone (the option, the promise, what to change), not
the traceback of the engine and libraries under it: that comes with `pytest -v`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from repro.testkit.project import Project

# fixture name -> the conf/ group whose project options parametrize it
OPTION_GROUPS = {
    "data_option": "data",
    "objective_option": "objective",
    "metrics_option": "metrics",
    "experiment_option": "experiment",
}
CHECKS = "repro.testkit.checks"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("repro_conf", "the project's conf/ folder, from the rootdir", default="conf")


def _project(config: pytest.Config, scratch: Path | None = None) -> Project:
    # Imported here, not at load: every pytest run where the engine is installed loads this
    # module, and only a suite that uses the kit should import more of the engine.
    from repro.testkit.project import Project

    return Project(Path(config.rootpath) / str(config.getini("repro_conf")), scratch)


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
