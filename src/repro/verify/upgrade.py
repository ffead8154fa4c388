"""Move a project to another engine and say whether results changed, and why: `make upgrade
ENGINE=/path/to/template[@COMMIT]`, which runs `python -m repro.verify.upgrade ENGINE[@COMMIT]
[steps=N] [experiments=all|NAME,NAME] [key=value ...]` in the project's folder.

1. Builds the engine's wheel from the template checkout at ENGINE (its working tree as it is,
   or COMMIT of it, exported with `git archive` into a temporary folder).
2. Composes and trains each config checked (the project's default; with `experiments=`, each
   experiment too: `debug=fast`, `steps` optimizer steps, every step fingerprinted) under the
   engine installed now.
3. Puts the new wheel in engine/ (under the name pyproject.toml gives it), runs `uv lock
   --upgrade-package <engine>` and `uv sync`, and composes and trains the same under the new.
4. For each config: "identical", or the first step that differs and the resolved config's
   differences key by key (repro.verify.explain); then the template's commits between the two
   engines. Exit 0 when every config is identical, 1 otherwise, with the commit message to use.
5. Records the new engine's commit in pyproject.toml (`[tool.repro] engine_commit`) and the
   README.

Only engine/, uv.lock, and the commit in pyproject.toml and README.md change (and .venv): the
files the user wrote are otherwise never written. The upgrade stays in place either way; since
it refuses to start unless those files are as git has them, one git command rolls it back.
Every training runs in a child process, from the project's folder, with one PYTHONHASHSEED.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from repro.core.errors import BARE, ConfigError, UserError, exit_with, warnings_to_stderr
from repro.core.guards import received
from repro.core.runs.fingerprint_log import FingerprintLog
from repro.verify import explain, imports
from repro.verify.against import CONFIG, DEFAULT_STEPS, EVERY_STEP, PACKAGE, Side, difference

USAGE = (
    "make upgrade ENGINE=/path/to/template[@COMMIT] "
    "[ARGS='steps=N experiments=all|NAME,NAME key=value ...']"
)
TOUCHED = ("engine", "uv.lock", "pyproject.toml", "README.md")
ROLLBACK = f"git checkout -- {' '.join(TOUCHED)} && make setup"


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


def source_tree(engine: str, scratch: Path) -> tuple[Path, str, str]:
    """(the folder to build the wheel from, a description, its commit): ENGINE itself (its
    HEAD, `-dirty` with uncommitted changes), or ENGINE@COMMIT exported into `scratch` (the
    checkout's own working tree is not touched)."""
    path, _, commit = engine.partition("@")
    tree = Path(path).expanduser().resolve()
    if not (tree / "pyproject.toml").is_file():
        raise ConfigError("ENGINE", engine, "a checkout of the template (it has pyproject.toml)")
    if not commit:
        head = _git(tree, "rev-parse", "--short=12", "HEAD") or "unknown"
        dirty = "-dirty" if _git(tree, "status", "--porcelain") else ""
        return tree, f"{tree} (working tree at {head}{dirty})", head + dirty
    full = run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], tree, f"ENGINE {engine}")
    export = scratch / "engine-source"
    export.mkdir()
    archive = subprocess.run(["git", "archive", full.strip()], cwd=tree, capture_output=True)
    if archive.returncode != 0:
        raise UserError(f"git archive {commit} in {tree} failed")
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive.stdout, check=True)
    return export, f"{tree} at {full.strip()[:12]}", full.strip()[:12]


def _git(tree: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def build_wheel(tree: Path, into: Path) -> Path:
    run(
        [uv(), "build", "--wheel", "--quiet", "--out-dir", str(into), str(tree)],
        tree,
        "building the engine's wheel",
    )
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
    command = ["git", "status", "--porcelain", "--", *TOUCHED]
    done = subprocess.run(command, cwd=project, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"{project} is not a git checkout: the upgrade's rollback needs one")
    if done.stdout.strip():
        changed = ", ".join(line[3:] for line in done.stdout.splitlines())
        raise UserError(
            f"{changed} has uncommitted changes: commit them or run `{ROLLBACK}` first, so "
            "that the upgrade can be rolled back"
        )


def entry_point(project: Path, *arguments: str) -> subprocess.CompletedProcess:
    """`python -m <engine>.train` on the project's conf/, with the engine installed now."""
    command = [
        sys.executable,
        "-m",
        f"{PACKAGE}.train",
        f"--config-path={project / 'conf'}",
        *arguments,
    ]
    return subprocess.run(command, cwd=project, capture_output=True, text=True)


def _failed(done: subprocess.CompletedProcess, what: str) -> UserError:
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return UserError(f"{what} failed: {last.removeprefix('error: ')}")


class Check:
    """One config checked: its overrides, and each engine's resolved config and short run."""

    def __init__(self, name: str, chosen: list[str], project: Path) -> None:
        self.name, self.chosen = name, chosen
        self.sides = [Side("the old engine", project), Side("the new engine", project)]
        self.configs = ["", ""]

    def run(self, which: int, project: Path, overrides: list[str], scratch: Path) -> None:
        """Compose (`--cfg job`: the config as `make train` composes it) and train, under the
        engine installed now (`which`: 0 old, 1 new)."""
        side = self.sides[which]
        composed = entry_point(project, *self.chosen, "--cfg", "job")
        if composed.returncode != 0:
            raise _failed(composed, f"composing {self.name} under {side.name}")
        self.configs[which] = composed.stdout
        run_dir = scratch / f"{self.name.replace('=', '-').replace(' ', '-')}-{which}"
        done = entry_point(project, *overrides, *self.chosen, f"hydra.run.dir={run_dir}")
        if done.returncode != 0:
            raise _failed(done, f"training {self.name} under {side.name}")
        side.rows = FingerprintLog.of_run(run_dir).read()
        side.summary = received.load_json(run_dir / "summary.json", root=run_dir)

    def report(self) -> str | None:
        """None when identical; else the first step that differs and the config's changes."""
        found = difference(*self.sides)
        if found is None:
            print(f"{self.name}: identical ({len(self.sides[1].rows)} steps)")
            return None
        print(f"{self.name}: differs, first at {found}")
        changes = explain.config_changes(*self.configs)
        print("  resolved config, old -> new:" if changes else "  resolved config: the same")
        for line in changes:
            print(f"    {line}")
        return found


def parse(argv: list[str], project: Path) -> tuple[str, int, list[Check], list[str]]:
    """(ENGINE, steps, the configs to check, train overrides) from `ENGINE[@COMMIT] [steps=N]
    [experiments=all|NAME,NAME] [key=value ...]`."""
    if not argv or not argv[0]:
        raise UserError(f"the template checkout to upgrade to is missing: {USAGE}")
    steps, extra, named = DEFAULT_STEPS, [], []
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key == "steps":
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(key, value, f"a whole number >= 1 ({USAGE})")
            steps = int(value)
        elif key == "experiments":
            named = experiments(value, project)
        else:
            extra.append(arg)
    checks = [Check("the default config", [], project)]
    checks += [Check(f"experiment={name}", [f"experiment={name}"], project) for name in named]
    return argv[0], steps, checks, [*CONFIG, EVERY_STEP, f"trainer.max_steps={steps}", *extra]


def experiments(value: str, project: Path) -> list[str]:
    """`all` (every conf/experiment/*.yaml of the project) or names, comma-separated."""
    own = sorted(path.stem for path in (project / "conf" / "experiment").glob("*.yaml"))
    names = own if value == "all" else [n for n in value.strip("[]").split(",") if n]
    unknown = [name for name in names if name not in own]
    if unknown or not names:
        allowed = f"all, or names of conf/experiment/*.yaml: {', '.join(own) or 'none there'}"
        raise ConfigError("experiments", value, allowed)
    return names


def check_surface(project: Path) -> None:
    """Refuse, before anything is built, a project whose code imports the engine past
    `repro.api`: the next engine may have moved what it imports. One line per import."""
    reaching = imports.internal_imports(project / "src")
    for line in reaching:
        print(line, file=sys.stderr)
    if reaching:
        raise UserError(
            f"{len(reaching)} import(s) of the project's code reach past {imports.SURFACE} "
            "(above): import those names from it, then upgrade"
        )


def main(argv: list[str]) -> None:
    warnings_to_stderr(BARE)
    project = Path.cwd()
    try:
        engine, steps, checks, overrides = parse(argv, project)
        check_surface(project)
        check_committed(project)
        target, old_commit = pinned_wheel(project), explain.recorded_commit(project)
        with tempfile.TemporaryDirectory(prefix=f"{PACKAGE}-upgrade-") as folder:
            scratch = Path(folder)
            tree, described, new_commit = source_tree(engine, scratch)
            print(f"building the engine from {described} ...", flush=True)
            wheel = build_wheel(tree, scratch / "wheel")
            for which, name in enumerate(("old", "new")):
                if which:
                    install(wheel, target, project)
                    run([uv(), "lock", "--upgrade-package", PACKAGE], project, "uv lock")
                    run([uv(), "sync", "--locked", "--all-extras"], project, "uv sync")
                print(
                    f"training {len(checks)} config(s), {steps} steps each, under the {name} "
                    "engine ...",
                    flush=True,
                )
                for check in checks:
                    check.run(which, project, overrides, scratch)
    except UserError as error:
        exit_with(error)
    differ = [check.name for check in checks if check.report() is not None]
    source = engine.partition("@")[0]
    print(f"the template's commits from {old_commit or 'an unrecorded commit'} to {new_commit}:")
    for line in explain.commits_between(Path(source).expanduser(), old_commit, new_commit):
        print(f"  {line}")
    recorded = explain.record_commit(project, old_commit, new_commit)
    written = ", ".join(["engine/", "uv.lock", *recorded])
    if not differ:
        print(
            f"identical: every config checked trains the same steps; the new engine is in "
            f"{written} (commit them)"
        )
        raise SystemExit(0)
    print(
        f"results change for {', '.join(differ)}; the new engine is in {written}: commit them "
        f'as `git commit -am "Engine @ {new_commit} [changes results]"`, or roll back: '
        f"{ROLLBACK}"
    )
    raise SystemExit(1)


if __name__ == "__main__":  # each training pins PYTHONHASHSEED alike (the user's value kept)
    main(sys.argv[1:])
