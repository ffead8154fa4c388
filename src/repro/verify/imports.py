"""The imports of a project's own code that reach past `repro.api`, the engine's stable
surface, one line each, with what to import instead. `make upgrade` (repro.verify.upgrade)
stops before its runs on a project that has any; the test kit warns of them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE = __name__.split(".")[0]
SURFACE = f"{PACKAGE}.api"


def surface_names() -> frozenset[str]:
    """The names `repro.api` declares (its `__all__`), read from its source: a tool does not
    import the surface that sits above it."""
    spec = importlib.util.find_spec(SURFACE)
    if spec is None or spec.origin is None:
        return frozenset()
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def internal_imports(root: Path) -> list[str]:
    """`file:line: what it imports; what to import instead` for every import under `root` of
    a module of the engine other than `repro.api`. A file that does not parse is skipped:
    Python names its error when the project runs."""
    public = surface_names()
    found = []
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            for module, names in _imported(node):
                if _internal(module):
                    found.append(f"{path}:{node.lineno}: {_advice(module, names, public)}")
    return found


def _imported(node: ast.AST) -> list[tuple[str, list[str]]]:
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [(node.module, [alias.name for alias in node.names])]
    if isinstance(node, ast.Import):
        return [(alias.name, []) for alias in node.names]
    return []


def _internal(module: str) -> bool:
    inside = module.startswith(f"{PACKAGE}.")
    return inside and not (module == SURFACE or module.startswith(f"{SURFACE}."))


def _advice(module: str, names: list[str], public: frozenset[str]) -> str:
    shown = f"from {module} import {', '.join(names)}" if names else f"import {module}"
    offered = [name for name in names if name in public]
    if names and len(offered) == len(names):
        return f"{shown}: internal to the engine; use from {SURFACE} import {', '.join(names)}"
    missing = ", ".join(name for name in names if name not in public) or module
    return f"{shown}: internal to the engine, and {SURFACE} does not offer {missing}"
