"""Check a refactor bit for bit: `python -m repro.verify --against REV [steps=N] [threads=N]
[key=value ...]`.

Trains the same short config twice on this machine, with the same PYTHONHASHSEED and thread
count: once with the code and configs of git revision REV (checked out in a temporary worktree,
removed afterwards whatever happens) and once with the working tree as it is, uncommitted
changes included. Then compares their fingerprints.csv step by step (the loss to full precision
and the weights' hash at every step) and prints "identical (N steps)", exit code 0, or the first
step where they differ, exit code 1. A commit that only renames or moves code gives identical;
one that changes what is computed (a schedule, an initialisation, an order of operations)
names the step it first shows in.

The config is the debug preset `debug=fast` cut to `steps` optimizer steps (8 by default);
overrides appended on the command line choose another one (both sides get the same). Each side
runs its own `python -m <package>.train` from the working tree's folder, so relative data paths
and the git-ignored `conf/local/` settings are the same for both; only the code and the tracked
configs differ. Imports nothing heavy: the training runs in child processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from repro.core.errors import BARE, ConfigError, UserError, exit_with, warnings_to_stderr
from repro.core.guards import received
from repro.core.runs.fingerprint_log import FingerprintLog, Row, first_divergence

USAGE = "python -m repro.verify --against REV [steps=N] [threads=N] [key=value ...]"
PACKAGE = __name__.split(".")[0]
TREE = Path(__file__).resolve().parents[3]  # src/<package>/verify/against.py -> the tree
DEFAULT_STEPS = 8
# Short, and every step fingerprinted: the first step that differs is named exactly.
CONFIG = ("debug=fast", "dataloader=debug")
EVERY_STEP = "logger.fingerprint_every_steps=1"


class Side:
    """One of the two trainings: the tree its code comes from and what it recorded."""

    def __init__(self, name: str, tree: Path) -> None:
        self.name, self.tree = name, tree
        self.rows: list[Row] = []
        self.summary: dict = {}

    def train(self, overrides: list[str], run_dir: Path) -> None:
        """`python -m <package>.train` with this side's code, run from the working tree."""
        env = dict(os.environ)  # PYTHONHASHSEED included: pinned before this process started
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.tree / "src"), *filter(None, [env.get("PYTHONPATH")])]
        )
        command = [sys.executable, "-m", f"{PACKAGE}.train", *overrides, f"hydra.run.dir={run_dir}"]
        done = subprocess.run(command, cwd=TREE, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise UserError(f"training {self.name} failed: {last.removeprefix('error: ')}")
        self.rows = FingerprintLog.of_run(run_dir).read()
        self.summary = received.load_json(run_dir / "summary.json", root=run_dir)

    def threads(self) -> str:
        return str(self.summary.get("env", {}).get("num_threads", "?"))


def git(*args: str, cwd: Path) -> str | None:
    """git's stdout, or None where git fails or is not installed."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[tuple[Path, str]]:
    """REV checked out in a temporary folder: (the project's folder in it, the commit). The
    worktree is removed on every exit path, an error or Ctrl-C included."""
    prefix = git("rev-parse", "--show-prefix", cwd=TREE)  # "" at the top of the checkout
    if prefix is None:
        raise UserError(f"--against {rev}: {TREE} is not in a git checkout")
    commit = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=TREE)
    if not commit:
        raise UserError(f"--against {rev}: no such commit in this checkout")
    with tempfile.TemporaryDirectory(prefix="repro-against-") as scratch:
        checkout = Path(scratch) / "tree"
        if git("worktree", "add", "--detach", "--quiet", str(checkout), commit, cwd=TREE) is None:
            raise UserError(f"--against {rev}: git could not check out {commit[:12]}")
        try:
            yield checkout / prefix, commit
        finally:
            git("worktree", "remove", "--force", str(checkout), cwd=TREE)
    git("worktree", "prune", cwd=TREE)  # in case the removal above could not finish


def share_local_settings(tree: Path) -> None:
    """This machine's git-ignored conf/local/ settings, for the other side to use too."""
    local = TREE / "conf" / "local"
    if local.is_dir() and (tree / "conf").is_dir():
        shutil.copytree(local, tree / "conf" / "local", dirs_exist_ok=True)


def difference(then: Side, now: Side) -> str | None:
    """The first step at which the two runs differ, or None where they are identical."""
    found = first_divergence(then.rows, now.rows, (then.name, now.name))
    if found is None and len(then.rows) != len(now.rows):
        longer = max(then, now, key=lambda side: len(side.rows))
        step = min(len(then.rows), len(now.rows)) + 1
        found = f"step {step}: trained {longer.name} only"
    if found is None and then.summary["weights_sha256"] != now.summary["weights_sha256"]:
        found = f"step {now.rows[-1].step if now.rows else 0}: the final weights_sha256"
    return found


def parse(argv: list[str]) -> tuple[str, int, list[str]]:
    """(REV, steps, overrides for train) from `--against REV [steps=N] [threads=N] ...`."""
    first, _, rev = argv[0].partition("=")
    rest = argv[1:]
    if first == "--against" and not rev and rest and "=" not in rest[0]:
        rev, rest = rest[0], rest[1:]
    if not rev:
        raise UserError(f"--against needs a git revision: {USAGE}")
    steps, extra = DEFAULT_STEPS, []
    for arg in rest:
        key, _, value = arg.partition("=")
        if key in ("steps", "threads") and (not value.isdigit() or int(value) < 1):
            raise ConfigError(key, value, f"a whole number >= 1 ({USAGE})")
        if key == "steps":
            steps = int(value)
        else:
            extra.append(f"trainer.num_threads={value}" if key == "threads" else arg)
    return rev, steps, [*CONFIG, EVERY_STEP, f"trainer.max_steps={steps}", *extra]


def main(argv: list[str]) -> None:
    warnings_to_stderr(BARE)
    try:
        rev, steps, overrides = parse(argv)
        with worktree(rev) as (tree, commit), tempfile.TemporaryDirectory() as runs:
            share_local_settings(tree)
            then, now = Side(f"at {rev}", tree), Side("here", TREE)
            for side in (then, now):
                label = f"{rev} ({commit[:12]})" if side is then else "the working tree"
                print(f"training {label}: {steps} steps ...", flush=True)
                side.train(overrides, Path(runs) / ("then" if side is then else "now"))
    except UserError as error:
        exit_with(error)
    print(
        f"same machine, PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED')}, "
        f"threads {then.threads()} {then.name}, {now.threads()} {now.name}"
    )
    found = difference(then, now)
    if found is None:
        print(f"identical ({len(now.rows)} steps): every loss and weights hash matches")
        raise SystemExit(0)
    print(f"first difference at {found}")
    raise SystemExit(1)
