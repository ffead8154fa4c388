"""`python -m repro.manual [NAME]`: where the engine's docs are and what each covers; with a
NAME (`sweeps`, `README`), that page, printed. In a project: `make docs [ARGS=NAME]`."""

from __future__ import annotations

import sys
from pathlib import Path

from repro.core.errors import UserError, exit_with

# In the wheel, hatch puts README.md and docs/ here; in a template checkout they are at its root.
SHIPPED = Path(__file__).resolve().parent / "docs"
CHECKOUT = Path(__file__).resolve().parents[3] / "docs"


def folder() -> Path:
    for candidate in (SHIPPED, CHECKOUT):
        if (candidate / "architecture.md").is_file():
            return candidate
    raise UserError(f"the engine's docs are neither in {SHIPPED} nor in {CHECKOUT}")


def pages(where: Path) -> dict[str, Path]:
    """Name -> file: README first (the one shipped beside the docs, else the checkout's, one
    folder up), then every other *.md of `where`."""
    found = {path.stem: path for path in sorted(where.glob("*.md"))}
    readme = found.pop("README", where.parent / "README.md")
    return {"README": readme, **found} if readme.is_file() else found


def title(path: Path) -> str:
    first = next((line for line in path.read_text().splitlines() if line.startswith("# ")), "")
    return first.removeprefix("# ").strip()


def main(argv: list[str]) -> None:
    try:
        where = folder()
        found = pages(where)
        if not argv:
            print(f"the engine's docs: {where}  (python -m repro.manual NAME prints one)")
            for name, path in found.items():
                print(f"  {name:<16} {title(path)}")
            return
        name = argv[0].removesuffix(".md")
        if name not in found:
            raise UserError(f"no page named {argv[0]!r}; the pages: {', '.join(found)}")
        sys.stdout.write(found[name].read_text())
    except UserError as error:
        exit_with(error)
