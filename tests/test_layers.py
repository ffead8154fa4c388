"""The tiers of src/repro as import-linter's contracts (pyproject.toml): they hold, a planted
import from the core into a tool breaks them, no package imports another that imports it back,
and docs/architecture.md's picture of the layers is the one the contracts draw."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from conftest import ROOT

PACKAGE = ROOT / "src" / "repro"
LINT = Path(sys.executable).with_name("lint-imports")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- layers: drawn from pyproject.toml's [tool.importlinter] by tests/test_layers.py -->"
END = "<!-- end of layers -->"


def contracts() -> dict[str, dict]:
    toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {contract["id"]: contract for contract in toml["tool"]["importlinter"]["contracts"]}


def lint(tree: Path) -> subprocess.CompletedProcess:
    """lint-imports on the package under `tree`/src, with the checkout's contracts."""
    env = {"PYTHONPATH": str(tree / "src"), "PATH": str(LINT.parent), "HOME": str(tree)}
    return subprocess.run(
        [str(LINT), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_checkout_keeps_every_contract():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"Contracts: {len(contracts())} kept, 0 broken." in done.stdout


def test_an_import_from_the_core_into_a_tool_breaks_the_contracts(tmp_path):
    shutil.copytree(
        PACKAGE, tmp_path / "src" / "repro", ignore=shutil.ignore_patterns("__pycache__")
    )
    planted = tmp_path / "src" / "repro" / "core" / "files.py"
    planted.write_text(planted.read_text() + "\n\ndef _late():\n    import repro.train  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    broken = {
        line.removesuffix(" BROKEN")
        for line in done.stdout.splitlines()
        if line.endswith(" BROKEN")
    }
    names = {contract["id"]: contract["name"] for contract in contracts().values()}
    # The import climbs from the bottom of the core to a tool, which imports the whole core.
    assert broken == {names["tiers"], names["core-never-imports-up"], names["core-layers"]}
    assert "repro.core.files -> repro.train" in done.stdout


def package_of(module: str) -> str | None:
    """The folder (dotted, at any depth) holding `module`, or a top-level module of repro."""
    parts = module.split(".")
    if parts[0] != "repro" or len(parts) < 2:
        return None
    for size in range(len(parts) - 1, 0, -1):
        path = PACKAGE.parent.joinpath(*parts[: size + 1])
        if path.is_dir():
            return ".".join(parts[: size + 1])
        if path.with_suffix(".py").is_file():
            return ".".join(parts[:size]) if size > 1 else ".".join(parts[:2])
    return None


def package_edges() -> dict[str, set[str]]:
    """Package -> the packages it imports, a package and those inside it not compared."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = package_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for target in filter(None, map(package_of, names)):
                nested = target.startswith(f"{here}.") or str(here).startswith(f"{target}.")
                if here and target != here and not nested:
                    edges.setdefault(here, set()).add(target)
    return edges


def test_no_package_imports_one_that_imports_it_back():
    edges = package_edges()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, ()))
        return False

    cycles = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and reaches(b, a))
    assert cycles == []
    assert edges["repro.core.engine"] >= {"repro.core.runs", "repro.core.data"}  # edges seen


def drawn_layers() -> str:
    """The tiers and the core's layers, top to bottom, as the contracts list them."""
    found = contracts()
    independent = ", ".join(name.rsplit(".", 1)[1] for name in found["extras-apart"]["modules"])
    lines = ["```text", "top: may import what is below it, never what is above"]
    for layer in found["tiers"]["layers"]:
        names = [name.strip().removeprefix("repro.") for name in re.split("[:|]", layer)]
        note = f"   (apart: {independent})" if names == ["extras"] else ""
        lines.append(f"  {'  '.join(names)}{note}")
        if names == ["core"]:
            for inner in found["core-layers"]["layers"]:
                parts = [
                    name.strip().removeprefix("repro.core.") for name in re.split("[:|]", inner)
                ]
                lines.append(f"      {'  '.join(parts)}")
    return "\n".join([*lines, "bottom", "```"])


def test_the_architecture_page_draws_the_layers_the_contracts_hold():
    text = ARCHITECTURE.read_text()
    assert BEGIN in text and END in text
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == drawn_layers(), f"docs/architecture.md should show:\n{drawn_layers()}"


if __name__ == "__main__":  # prints the picture to paste into docs/architecture.md
    print(drawn_layers())
