"""`python -m repro.verify --against REV`: a refactor checked bit for bit against a
git revision, in a project made by scripts/new_project.py, as that project's CI
(`make verify-previous`) runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

NAME = "ember_lab"
SCHEDULES = Path("src") / NAME / "core" / "engine" / "schedules.py"
IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@localhost"]


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A generated project (its own git repository, one commit) whose runs are tiny."""
    dest = tmp_path_factory.mktemp("against") / NAME
    script = ROOT / "scripts" / "new_project.py"
    done = subprocess.run(
        [sys.executable, str(script), NAME, "--dest", str(dest), "--minimal"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # Git-ignored, so only the working tree has it: verify must lend it to REV's side too, or
    # the two sides train different widths and differ from step 1.
    (dest / "conf" / "local" / "default.yaml").write_text(
        "# @package _global_\nmodel:\n  widths: [8, 16]\n"
    )
    return dest


def on_branch_from_start(project: Path, branch: str) -> None:
    """Each test commits on its own branch from the first commit, whatever ran before it."""
    first = git("rev-list", "--max-parents=0", "HEAD", cwd=project)
    git("checkout", "--quiet", "-B", branch, first, cwd=project)


def commit_edit(project: Path, old: str, new: str, message: str) -> None:
    path = project / SCHEDULES
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    git("commit", "--quiet", "-am", message, cwd=project)


def verify_against(project: Path, *args: str, cwd: Path | None = None):
    env = {**os.environ, "PYTHONPATH": str((cwd or project) / "src"), "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [sys.executable, "-m", f"{NAME}.verify", "--against", *args],
        cwd=cwd or project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def make_verify_previous(project: Path) -> subprocess.CompletedProcess:
    """The generated project's CI step, with this interpreter standing in for `uv run` (and
    its `setup` prerequisite taken as done: no `uv sync` here)."""
    python_path = f"PATH={Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    run = f"env PYTHONPATH={project / 'src'} PYTHONHASHSEED=0 {python_path}"
    return subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.synced", "verify-previous", f"RUN={run}"],
        cwd=project, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def no_worktree_left(project: Path) -> bool:
    listed = git("worktree", "list", "--porcelain", cwd=project)
    return listed.count("worktree ") == 1 and not (project / ".git" / "worktrees").exists()


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_projects_ci_runs_it_and_a_first_commit_has_nothing_to_compare(project):
    workflow = (project / ".github" / "workflows" / "ci.yml").read_text()
    assert "run: make verify-previous" in workflow and "fetch-depth: 2" in workflow
    on_branch_from_start(project, "first")
    done = make_verify_previous(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no previous commit to compare with" in done.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_a_commit_that_only_renames_a_variable_is_identical(project):
    on_branch_from_start(project, "rename")
    commit_edit(project, "warmup_steps", "steps_of_warmup", "Rename a local variable")
    done = verify_against(project, "HEAD~1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical (8 steps)" in done.stdout
    assert "PYTHONHASHSEED=0, threads" in done.stdout
    assert no_worktree_left(project)


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.slow
def test_a_commit_that_changes_the_schedule_is_named_at_the_first_step_it_changes(project):
    on_branch_from_start(project, "schedule")
    cosine = "return 0.5 * (1.0 + math.cos(math.pi * progress))"
    quarter = "return math.cos(0.5 * math.pi * progress)"  # another decay, equal at 0 and 1
    commit_edit(project, cosine, quarter, "[changes results] A quarter cosine")
    done = verify_against(project, "HEAD~1")
    # 8 steps warm up for one: the first update uses the warm-up factor, the second decay(0)
    # = 1 on both sides, the third is the first whose rate differs. Its loss was computed
    # before that update, so the weights hash after it is the first thing to differ.
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first difference at step 3: weights hash" in done.stdout
    assert " at HEAD~1, " in done.stdout and "here" in done.stdout
    assert no_worktree_left(project)
    # CI: the commit says it changes results, so the step is printed and the check passes.
    ci = make_verify_previous(project)
    assert ci.returncode == 0, ci.stdout + ci.stderr
    assert "first difference at step 3" in ci.stdout
    assert "results changed, as the commit message says" in ci.stdout


@pytest.mark.slow
@pytest.mark.e2e
def test_mistakes_are_refused_in_one_line_and_leave_no_worktree(project, tmp_path):
    on_branch_from_start(project, "mistakes")
    copy = tmp_path / "not-a-checkout"
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns(".git"))
    cases = [
        (project, ["nope"], "--against nope: no such commit in this checkout"),
        (copy, ["HEAD"], "is not in a git checkout"),
        (project, ["HEAD", "steps=0"], "steps='0' is not allowed: a whole number >= 1"),
        (project, [], "--against needs a git revision"),
        # Trains REV's side, which refuses the value: named, and the worktree still goes.
        (project, ["HEAD", "trainer.epochs=0"], "training at HEAD failed: trainer.epochs=0"),
    ]
    for cwd, args, message in cases:
        done = verify_against(project, *args, cwd=cwd)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        assert message in done.stderr, done.stderr
    assert no_worktree_left(project)
