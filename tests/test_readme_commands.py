"""Every code block of the README is run by a test: the commands here, as written, with
overrides appended that cut a training run to a few steps; the "Make it yours", local-settings
and "Bring your own" blocks by the tests that name their markers. A block that is not code
(a folder listing) or not run (`make test` is CI's own command) says so beside it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, make_image_tree, run_cli

README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"(<!-- (?:tested|shown): [\w-]+ -->\n)?```(\w*)\n(.*?)```", re.DOTALL)
SHORT = ["trainer.max_steps=2", "data.train_size=128", "data.val_size=32", "data.test_size=32",
         "trainer.batch_size=16", "logger.plot=false", "logger.progress=off"]  # fmt: skip
# `make` targets the README shows that a test cannot run inside the suite, and why.
NOT_RUN = {
    "test": "the suite itself: CI runs it",
    "test-all": "the suite with its slow tests",
    "format": "rewrites the files",
    "mutants": "hours; mutmut runs a module's tests once per mutant",
    "mutants-known": "minutes; it runs the slow tests once per mutant",
}


def blocks() -> list[tuple[str | None, str, str]]:
    """(marker, language, text) of every fenced block."""
    return [(marker or None, language, text) for marker, language, text in BLOCK.findall(README)]


def commands() -> list[str]:
    """The README's shell commands, one per line, continuation lines joined, comments cut."""
    found = []
    for marker, language, text in blocks():
        if language != "bash" or marker:
            continue
        for line in text.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                found.append(line)
    return found


def test_every_block_is_a_command_run_here_or_marked():
    tested_elsewhere = {
        name
        for path in (ROOT / "tests").glob("test_*.py")
        for name in re.findall(r"tested: ([\w-]+)", path.read_text())
    }
    for marker, language, text in blocks():
        if language == "bash" and not marker:
            continue  # run below
        assert marker, f"a ```{language} block with no marker: {text[:80]!r}"
        kind, name = re.match(r"<!-- (\w+): ([\w-]+) -->", marker).groups()
        if kind == "tested":
            prefixes = [tested for tested in tested_elsewhere if tested.endswith("-")]  # yours-*
            runs = name in tested_elsewhere or name.startswith(tuple(prefixes))
            assert runs, f"no test runs the block marked {name!r}"
    assert len(commands()) >= 8


def _with_brackets_dropped(command: str) -> str:
    """A synopsis's optional `[key=a|b]` arguments left out: the command as first typed."""
    return re.sub(r"\s*\[[^\]]*\]", "", command)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("readme") / "run"
    done = run_cli("repro.train", *SHORT, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir / "checkpoints"


@pytest.mark.e2e
@pytest.mark.slow
def test_the_readme_commands_run_as_written(checkpoint, tmp_path):
    ran = 0
    for command in commands():
        words = shlex.split(_with_brackets_dropped(command))
        words = [word.replace("outputs/runs/.../checkpoints", str(checkpoint)) for word in words]
        # A run folder where the command takes one: the run that made the checkpoints.
        words = [word.replace("outputs/runs/...", str(checkpoint.parent)) for word in words]
        if words[:2] == ["uv", "run"]:
            words = words[2:]  # this process's environment stands in for uv's
        if words[0] == "cd":
            continue  # into a generated project: tests/test_new_project.py runs its tests
        if words[0] == "make":
            if words[1] in NOT_RUN:
                continue
            words = (
                ["make", *words[1:], f"ARGS={shlex.join(SHORT)}"] if words[1] == "train" else words
            )
        elif words[0] == "python" and words[1] == "-m":
            words = [sys.executable, *words[1:]]
            if words[2] == "repro.train":
                words += [*SHORT, f"hydra.run.dir={tmp_path / f'run{ran}'}"]
            if "images=FOLDER_OR_FILE" in words:
                images = tmp_path / "images"
                if not images.exists():  # one tree for every predict command
                    make_image_tree(images, 2)
                words[words.index("images=FOLDER_OR_FILE")] = f"images={images / 'train'}"
                words.append(f"out={tmp_path / f'predictions{ran}.csv'}")
        elif words[0] == "python" and words[1] == "scripts/new_project.py":
            words = [sys.executable, *words[1:]]
            if "--dest" in words:
                words[words.index("--dest") + 1] = str(tmp_path / "dest" / words[2])
            else:
                words += ["--dest", str(tmp_path / words[2])]  # not ../NAME beside the checkout
        else:
            raise AssertionError(f"a README command this test does not know: {command!r}")
        done = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        ran += 1
    assert ran >= 6
