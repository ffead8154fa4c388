"""Move a project to another engine and say whether results changed: `make upgrade
ENGINE=/path/to/template[@COMMIT]`, which runs `python -m repro.verify.upgrade ENGINE[@COMMIT]
[steps=N] [key=value ...]` in the project's folder.

1. Builds the engine's wheel from the template checkout at ENGINE (its working tree as it is,
   or COMMIT of it, exported with `git archive` into a temporary folder).
2. Trains a short config (the project's default, `debug=fast`, `steps` optimizer steps, every
   step fingerprinted) under the engine installed now.
3. Puts the new wheel in engine/ (under the name pyproject.toml gives it), runs `uv lock
   --upgrade-package <engine>` and `uv sync`, and trains the same config under the new engine.
4. Compares the two fingerprints.csv step by step (repro.verify's comparison) and prints
   "identical" (exit 0) or the first step that differs (exit 1).

Only engine/ and uv.lock change (and .venv): the files the user wrote are never written. The
upgrade stays in place either way; since it refuses to start unless engine/ and uv.lock are as
git has them, `git checkout -- engine uv.lock && make setup` always rolls it back.
Both trainings run in child processes, from the project's folder, with one PYTHONHASHSEED.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from repro.errors import BARE, ConfigError, UserError, exit_with, warnings_to_stderr
from repro.runs.fingerprint_log import FingerprintLog
from repro.verify.against import CONFIG, DEFAULT_STEPS, EVERY_STEP, PACKAGE, Side, difference

USAGE = "make upgrade ENGINE=/path/to/template[@COMMIT] [ARGS='steps=N key=value ...']"

ROLLBACK = "git checkout -- engine uv.lock && make setup"


def run(command: list[str], cwd: Path, what: str) -> str:
    """stdout of a command that must succeed; one line naming `what` failed otherwise."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1800)
    except OSError as error:
        raise UserError(f"{what}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"{what} failed: {last}")
    return done.stdout


def uv() -> str:
    found = shutil.which("uv")
    if found is None:
        raise UserError("uv is needed to build and lock the engine (pip install uv)")
    return found


def source_tree(engine: str, scratch: Path) -> tuple[Path, str]:
    """(the folder to build the wheel from, a description): ENGINE itself, or ENGINE@COMMIT
    exported into `scratch` (the checkout's own working tree is not touched)."""
    path, _, commit = engine.partition("@")
    tree = Path(path).expanduser().resolve()
    if not (tree / "pyproject.toml").is_file():
        raise ConfigError("ENGINE", engine, "a checkout of the template (it has pyproject.toml)")
    if not commit:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=tree,
                              capture_output=True, text=True)  # fmt: skip
        return tree, f"{tree} (working tree at {head.stdout.strip() or 'unknown commit'})"
    full = run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], tree, f"ENGINE {engine}")
    export = scratch / "engine-source"
    export.mkdir()
    archive = subprocess.run(["git", "archive", full.strip()], cwd=tree, capture_output=True)
    if archive.returncode != 0:
        raise UserError(f"git archive {commit} in {tree} failed")
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive.stdout, check=True)
    return export, f"{tree} at {full.strip()[:12]}"


def build_wheel(tree: Path, into: Path) -> Path:
    run([uv(), "build", "--wheel", "--quiet", "--out-dir", str(into), str(tree)], tree,
        "building the engine's wheel")  # fmt: skip
    wheels = sorted(into.glob(f"{PACKAGE}-*.whl"))
    if len(wheels) != 1:
        raise UserError(f"building the engine's wheel gave {len(wheels)} wheels in {into}")
    return wheels[0]


def pinned_wheel(project: Path) -> Path:
    """The wheel pyproject.toml's [tool.uv.sources] names: the file the new one replaces."""
    text = (project / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(rf'^{PACKAGE}\s*=\s*\{{\s*path\s*=\s*"([^"]+\.whl)"', text, re.MULTILINE)
    if found is None:
        raise UserError(f"pyproject.toml names no wheel for {PACKAGE} in [tool.uv.sources]")
    return project / found.group(1)


def install(wheel: Path, pinned: Path, project: Path) -> None:
    """The new wheel in place of the pinned one. Under the same name (the engine's version
    unchanged) pyproject.toml is not written; a new version's wheel has its own name (uv reads
    the version from it), so the one path in [tool.uv.sources] is changed, and said so."""
    shutil.copyfile(wheel, pinned.parent / wheel.name)
    if wheel.name != pinned.name:
        toml = project / "pyproject.toml"
        old = pinned.relative_to(project).as_posix()
        new = (pinned.parent / wheel.name).relative_to(project).as_posix()
        toml.write_text(toml.read_text(encoding="utf-8").replace(f'"{old}"', f'"{new}"'), "utf-8")
        pinned.unlink()
        print(f"pyproject.toml: the engine's wheel is now {new} (a new version)")


def check_committed(project: Path) -> None:
    """engine/ and uv.lock as git has them, so that the rollback is one git command."""
    done = subprocess.run(["git", "status", "--porcelain", "--", "engine", "uv.lock"],
                          cwd=project, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise UserError(f"{project} is not a git checkout: the upgrade's rollback needs one")
    if done.stdout.strip():
        raise UserError("engine/ or uv.lock has uncommitted changes: commit them or run "
                        f"`{ROLLBACK}` first, so that the upgrade can be rolled back")  # fmt: skip


def train(side: Side, project: Path, overrides: list[str], run_dir: Path) -> None:
    """The short run with the engine installed in the project's environment now."""
    command = [sys.executable, "-m", f"{PACKAGE}.train", f"--config-path={project / 'conf'}",
               *overrides, f"hydra.run.dir={run_dir}"]  # fmt: skip
    done = subprocess.run(command, cwd=project, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"training under {side.name} failed: {last.removeprefix('error: ')}")
    side.rows = FingerprintLog.of_run(run_dir).read()
    side.summary = json.loads((run_dir / "summary.json").read_text())


def parse(argv: list[str]) -> tuple[str, int, list[str]]:
    """(ENGINE, steps, train overrides) from `ENGINE[@COMMIT] [steps=N] [key=value ...]`."""
    if not argv or not argv[0]:
        raise UserError(f"the template checkout to upgrade to is missing: {USAGE}")
    steps, extra = DEFAULT_STEPS, []
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key == "steps":
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(key, value, f"a whole number >= 1 ({USAGE})")
            steps = int(value)
        else:
            extra.append(arg)
    return argv[0], steps, [*CONFIG, EVERY_STEP, f"trainer.max_steps={steps}", *extra]


def main(argv: list[str]) -> None:
    warnings_to_stderr(BARE)
    project = Path.cwd()
    old, new = Side("the old engine", project), Side("the new engine", project)
    try:
        engine, steps, overrides = parse(argv)
        check_committed(project)
        target = pinned_wheel(project)
        with tempfile.TemporaryDirectory(prefix=f"{PACKAGE}-upgrade-") as scratch:
            tree, described = source_tree(engine, Path(scratch))
            print(f"building the engine from {described} ...", flush=True)
            wheel = build_wheel(tree, Path(scratch) / "wheel")
            print(f"training {steps} steps under the old engine ...", flush=True)
            train(old, project, overrides, Path(scratch) / "old")
            install(wheel, target, project)
            run([uv(), "lock", "--upgrade-package", PACKAGE], project, "uv lock")
            run([uv(), "sync", "--locked", "--extra", "dev"], project, "uv sync")
            print(f"training {steps} steps under the new engine ...", flush=True)
            train(new, project, overrides, Path(scratch) / "new")
    except UserError as error:
        exit_with(error)
    found = difference(old, new)
    if found is None:
        print(f"identical ({len(new.rows)} steps): every loss and weights hash matches; the "
              "new engine is in engine/ and uv.lock (commit them)")  # fmt: skip
        raise SystemExit(0)
    print(f"differs: first at {found}")
    print(f"the new engine is in engine/ and uv.lock; to roll back: {ROLLBACK}")
    raise SystemExit(1)


if __name__ == "__main__":  # each training pins PYTHONHASHSEED alike (the user's value kept)
    main(sys.argv[1:])
