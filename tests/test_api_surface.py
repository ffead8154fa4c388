"""`repro.api`, what experiments import: it offers the names a project's parts need, the
skeleton and every example import nothing else of the engine, an import past it is named one
line at a time (by `make upgrade` and the test kit), and `main` trains a project's own conf/."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import pytest

import repro.api
from repro.core import errors, files
from repro.core.data import datasets, sources
from repro.core.errors import UserError
from repro.verify import imports, upgrade

from conftest import ROOT, TINY

SURFACE = {"repro.api", "repro.api.testkit"}


def test_every_declared_name_is_offered_and_is_the_engines_own_object():
    assert sorted(repro.api.__all__) == sorted(set(repro.api.__all__))
    for name in repro.api.__all__:
        assert hasattr(repro.api, name), name
    assert repro.api.Splits is datasets.Splits and repro.api.TensorImages is sources.TensorImages
    assert repro.api.DataError is errors.DataError
    assert repro.api.write_json_atomic is files.write_json_atomic
    assert imports.surface_names() == frozenset(repro.api.__all__)  # read without importing


def engine_imports(source: str) -> set[str]:
    """The modules of the engine a piece of Python source imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name == "repro" or name.startswith("repro.")}


def examples() -> dict[str, str]:
    """Every place a user copies code from: the skeleton, the README's and docs' Python
    blocks, the parts tests/test_make_it_yours.py writes into a project."""
    found = {
        str(path.relative_to(ROOT)): path.read_text()
        for path in sorted((ROOT / "scripts" / "skeleton").rglob("*.py"))
    }
    found["tests/project_parts.py"] = (ROOT / "tests" / "project_parts.py").read_text()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
        for number, block in enumerate(blocks):
            found[f"{page.relative_to(ROOT)} block {number}"] = block
    return found


def test_the_skeleton_and_every_example_import_only_the_surface():
    reaching = {
        where: sorted(engine_imports(source) - SURFACE)
        for where, source in examples().items()
        if engine_imports(source) - SURFACE
    }
    assert reaching == {}
    assert any(engine_imports(source) for source in examples().values())  # some do import


def test_each_import_past_the_surface_is_one_line_saying_what_to_import_instead(tmp_path):
    lab = tmp_path / "src" / "lab"
    lab.mkdir(parents=True)
    (lab / "data.py").write_text(
        "from repro.data.datasets import Splits, carve_validation\n"
        "import repro.core.build\n"
        "from repro.api import TensorImages\n"
        "def f():\n    from repro.core.build import head_name, Splits\n"
    )
    (lab / "broken.py").write_text("from repro.data import (\n")  # Python's to name
    path = lab / "data.py"
    assert imports.internal_imports(tmp_path / "src") == [
        f"{path}:1: from repro.data.datasets import Splits, carve_validation: internal to the "
        "engine; use from repro.api import Splits, carve_validation",
        f"{path}:2: import repro.core.build: internal to the engine, and repro.api does not "
        "offer repro.core.build",
        f"{path}:5: from repro.core.build import head_name, Splits: internal to the engine, "
        "and repro.api does not offer head_name",
    ]


def test_make_upgrade_stops_before_anything_on_a_project_reaching_past_the_surface(
    tmp_path, capsys
):
    (tmp_path / "src" / "lab").mkdir(parents=True)
    (tmp_path / "src" / "lab" / "a.py").write_text("from repro.errors import DataError\n")
    with pytest.raises(UserError) as refused:
        upgrade.check_surface(tmp_path)
    assert str(refused.value) == (
        "1 import(s) of the project's code reach past repro.api (above): import those names "
        "from it, then upgrade"
    )
    said = capsys.readouterr().err.splitlines()
    assert said == [
        f"{tmp_path / 'src' / 'lab' / 'a.py'}:1: from repro.errors import DataError: internal "
        "to the engine; use from repro.api import DataError"
    ]
    (tmp_path / "src" / "lab" / "a.py").write_text("from repro.api import DataError\n")
    upgrade.check_surface(tmp_path)  # nothing reaching past: no refusal


def test_the_test_kit_warns_of_each_import_past_the_surface(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\nrepro_testkit = true\n")
    (tmp_path / "src" / "lab").mkdir(parents=True)
    (tmp_path / "src" / "lab" / "a.py").write_text("from repro.files import atomic_path\n")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "default"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    line = "a.py:1: from repro.files import atomic_path: internal to the engine; use from "
    assert sum(line in said for said in done.stdout.splitlines()) == 1, done.stdout[-2000:]


def test_main_trains_a_projects_own_config_from_its_own_entry_point(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(
        "defaults:\n  - engine\n  - _self_\nhydra:\n  searchpath:\n    - pkg://repro.conf\n"
        "trainer:\n  epochs: 1\n"
    )
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "train.py").write_text(
        "from pathlib import Path\n\nfrom repro.api import main\n\n"
        'if __name__ == "__main__":\n    main(Path(__file__).resolve().parents[1] / "conf")\n'
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("PYTHONHASHSEED", None)  # main pins it for the project's own command
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.train",
            *TINY,
            "dataloader.num_workers=0",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["epoch"] == 1
    assert summary["env"]["pythonhashseed"] == "0"
    history = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "hydra.run.dir" not in history and "data.train_size=384" in history
