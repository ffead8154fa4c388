"""The test kit's pytest plugin, registered through the engine's `pytest11` entry point, so it
loads wherever the engine is installed. Loading it does nothing but register its ini options:
the kit acts only in a project whose pytest settings ask for it (`repro_testkit = true`, as a
generated project's pyproject.toml has), so an unrelated suite on the same machine keeps its
own fixtures named `data_option` and its own hooks. There, `repro.extras.testkit.active` is
registered: the kit's fixtures, parametrization and failure reports.
"""

from __future__ import annotations

import pytest

ACTIVE = "repro.extras.testkit.active"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("repro_testkit", "run the repro test kit in this project", type="bool")
    parser.addini("repro_conf", "the project's conf/ folder, from the rootdir", default="conf")


def pytest_configure(config: pytest.Config) -> None:
    if config.getini("repro_testkit"):
        config.pluginmanager.import_plugin(ACTIVE)
