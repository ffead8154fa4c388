"""Why an upgrade's results differ: what `make upgrade` prints beside "identical" or the first
step that differs. The resolved configs under the old and the new engine, key by key; the
template's commits between the two engines; and the commit the project records (pyproject's
`[tool.repro] engine_commit`, and the README's mention of it), moved to the new one."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from repro.core.files import write_text_atomic

COMMIT = re.compile(r"[0-9a-f]{7,40}")  # what git log is given: never an option
COMMIT_LINE = re.compile(r'^engine_commit = "([^"]*)"', re.MULTILINE)
MOST_COMMITS = 40  # a longer log is cut, with the count of the rest


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict) or not node:
        return {prefix: node} if prefix else {}
    found: dict[str, Any] = {}
    for key, value in node.items():
        found |= _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def config_changes(old: str, new: str) -> list[str]:
    """Each key whose value differs between two YAML configs, `key: old -> new`, sorted; a key
    only one side has shows `(absent)` on the other."""
    from omegaconf import OmegaConf

    sides = [_leaves(OmegaConf.to_container(OmegaConf.create(text))) for text in (old, new)]
    absent = "(absent)"
    return [
        f"{key}: {sides[0].get(key, absent)} -> {sides[1].get(key, absent)}"
        for key in sorted(sides[0].keys() | sides[1].keys())
        if sides[0].get(key, absent) != sides[1].get(key, absent)
    ]


def commits_between(tree: Path, old: str | None, new: str) -> list[str]:
    """The template's commits after `old` up to `new` (`git log --oneline old..new`), or one
    line saying why they cannot be listed."""
    if old and not COMMIT.fullmatch(old.removesuffix("-dirty")):  # pyproject's text: data
        return [f"(no commit list: engine_commit {old!r} in pyproject.toml is no commit)"]
    if not old or old.endswith("-dirty") or new.endswith("-dirty"):
        which = "the old engine's" if not old or old.endswith("-dirty") else "the new engine's"
        return [f"(no commit list: {which} wheel was built from uncommitted changes or no commit)"]
    done = subprocess.run(
        ["git", "log", "--abbrev=12", "--format=%h %s", f"{old}..{new}"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return [f"(no commit list: {old} is not a commit of {tree})"]
    lines = done.stdout.splitlines()
    if len(lines) > MOST_COMMITS:
        lines = [*lines[:MOST_COMMITS], f"... and {len(lines) - MOST_COMMITS} earlier commits"]
    return lines or ["(none: the same commit)"]


def recorded_commit(project: Path) -> str | None:
    """The template commit pyproject.toml says the engine's wheel was built from."""
    found = COMMIT_LINE.search((project / "pyproject.toml").read_text(encoding="utf-8"))
    return found.group(1) if found else None


def record_commit(project: Path, old: str | None, new: str) -> list[str]:
    """Write `new` where pyproject.toml and the README name `old`; returns the files changed."""
    if not old or old == new:
        return []
    changed = []
    for name in ("pyproject.toml", "README.md"):
        path = project / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if name == "pyproject.toml":
            updated = COMMIT_LINE.sub(f'engine_commit = "{new}"', text, count=1)
        else:
            updated = re.sub(rf"\b{re.escape(old)}(?![\w-])", new, text)
        if updated != text:
            write_text_atomic(path, updated)
            changed.append(name)
    return changed
