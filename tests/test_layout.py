"""The shape of the code: the core (src/repro/core/, the machinery) imports nothing beside it
(the tools, the optional parts in extras/, the api, the benchmarks), folders of a dozen modules
at most, no import cycle between modules, a loop of few fields. The tiers themselves are
import-linter's contracts (pyproject.toml), checked by tests/test_layers.py."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from repro.core.engine.loop import Trainer

from conftest import ROOT, TINY

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "repro"
NAME = PACKAGE.name
CORE = f"{NAME}.core"
CORE_LINES = 7400  # src/repro/core/ alone, since issue 67 made the tiers folders (the run itself,
# core/run.py, and the old names of core/relocated.py included)
# (7450 for the package less its areas before: the tools train, evaluate, predict and report
# counted then)
FOLDER_MODULES = 12


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def is_core(name: str) -> bool:
    return name == CORE or name.startswith(f"{CORE}.")


def imported(name: str, path: Path) -> set[str]:
    """What a module imports, anywhere in it (a function's import counts), absolute names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                package = name.split(".")[: -node.level] if path.stem != "__init__" else None
                base = ".".join([*(package or name.split(".")[: 1 - node.level]), base])
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            docstrings |= set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
               tokenize.DEDENT, tokenize.ENDMARKER}  # fmt: skip
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines |= set(range(token.start[0], token.end[0] + 1)) - docstrings
    return len(lines)


def test_the_core_never_imports_the_recipes_or_the_benchmarks():
    offenders = {
        name: sorted(
            target
            for target in imported(name, path)
            if target.startswith("benchmarks")
            or (target.startswith(f"{NAME}.") and not is_core(target))
        )
        for name, path in modules().items()
        if is_core(name)
    }
    assert not {name: found for name, found in offenders.items() if found}


def test_the_package_has_no_import_cycle():
    known = modules()
    graph = {
        name: {target for target in imported(name, path) if target in known and target != name}
        for name, path in known.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target] if target in path else [name, target]
            if not state.get(target):
                cycle = visit(target, [*path, target])
                if cycle:
                    return cycle
        state[name] = 2
        return None

    for name in sorted(graph):
        if not state.get(name):
            cycle = visit(name, [name])
            assert cycle is None, " -> ".join(cycle)


def test_the_core_is_small_and_no_folder_holds_more_than_a_dozen_modules():
    core = {name: path for name, path in modules().items() if is_core(name)}
    total = sum(code_lines(path) for path in core.values())
    assert total <= CORE_LINES, f"the core has {total} lines of code"
    folders: dict[Path, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {str(folder): count for folder, count in folders.items() if count > FOLDER_MODULES}
    assert not crowded


def test_the_loop_has_few_fields():
    assert len(dataclasses.fields(Trainer)) <= 14


def test_code_lines_leave_out_docstrings_comments_and_blank_lines(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Doc\nstring."""\n\n# a comment\nx = (1,\n     2)  # trailing\n')
    assert code_lines(sample) == 2


# A component is removable: its module, its YAML and the recipe that opts into it go, and the
# rest still imports, composes and trains (the rest's own tests then pass: checked by hand,
# see the issue 31 note).
REMOVABLE = {
    "ema": ["src/{name}/extras/components/ema.py", "src/{name}/conf/components/ema.yaml"],
    "lookahead": ["src/{name}/extras/recipes/lookahead.py", "src/{name}/conf/components/lookahead.yaml",
                  "src/{name}/conf/experiment/cifar10_airbench.yaml"],
}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("component", sorted(REMOVABLE))
@pytest.mark.slow
def test_deleting_a_component_and_its_yaml_leaves_the_rest_working(component, tmp_path):
    copy = tmp_path / "project"
    # conf/ ships inside the package: copying src/ copies it.
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    paths = [copy / rel.format(name=NAME) for rel in REMOVABLE[component]]
    if not paths[0].exists():
        pytest.skip(f"{component}: not in this project (new_project.py --minimal)")
    for path in paths:
        path.unlink()
    package = copy / "src" / NAME
    # Every module but a package's __main__ (importing one runs its command; its imports are
    # its command module's, imported here).
    left = [".".join([NAME, *path.relative_to(package).with_suffix("").parts])
            for path in sorted(package.rglob("*.py"))
            if path.name not in ("__init__.py", "__main__.py")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONHASHSEED": "0"}
    imports = f"import importlib\nfor name in {left!r}: importlib.import_module(name)"
    done = subprocess.run([sys.executable, "-c", imports], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", f"{NAME}.train", *TINY, f"hydra.run.dir={run_dir}"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["completed"]
    asked = subprocess.run(
        [sys.executable, "-m", f"{NAME}.train", *TINY, f"+components={component}",
         f"hydra.run.dir={tmp_path / 'asked'}"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert asked.returncode != 0 and f"components/{component}" in asked.stderr  # named, gone


# Libraries a run on the built-in data never uses, imported only where used (issue 41): scipy
# (about 0.9 s) for a sweep's t intervals, torchvision for decoding image files.
NOT_AT_START = ("scipy", "torchvision")


@pytest.mark.slow
def test_starting_a_training_run_imports_neither_scipy_nor_torchvision():
    # A fresh interpreter: the entry point's modules, then Hydra's plugin scan, which imports
    # every module under hydra_plugins (repro's sweepers too) on every run.
    probe = (
        "import sys\nimport repro.train\nfrom hydra.core.plugins import Plugins\n"
        "Plugins.instance()\nloaded = {name.split('.')[0] for name in sys.modules}\n"
        f"print(*sorted(loaded & {set(NOT_AT_START)!r}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == []


def test_the_commands_help_imports_no_torch(tmp_path):
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "repro.train", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "== Configuration groups ==" in done.stdout, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "hydra" in imported and not {"torch", "numpy"} & imported
