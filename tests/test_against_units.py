"""`python -m repro.verify --against REV`, its parts in this process (test_verify_against.py runs
the command in a generated project): the arguments, the worktree of REV and its removal, the
local settings lent to it, what counts as a difference, and what main prints and exits with."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.core.errors import BARE, ConfigError, UserError
from repro.core.runs.fingerprint_log import Row
from repro.verify import against

IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@localhost"]
ADDED = [*against.CONFIG, against.EVERY_STEP]


def test_the_revision_steps_and_threads_are_read_and_the_rest_passed_on():
    assert against.parse(["--against", "HEAD~1"]) == ("HEAD~1", 8, [*ADDED, "trainer.max_steps=8"])
    assert against.parse(["--against=v1", "steps=3", "threads=2", "amp=bf16"]) == (
        "v1",
        3,
        [*ADDED, "trainer.max_steps=3", "trainer.num_threads=2", "amp=bf16"],
    )
    # A first argument that is a setting is not a revision.
    with pytest.raises(UserError, match=r"--against needs a git revision: python -m repro"):
        against.parse(["--against", "steps=3"])
    with pytest.raises(UserError, match="needs a git revision"):
        against.parse(["--against"])
    for wrong in ("steps=0", "steps=x", "threads=", "threads=-1"):
        with pytest.raises(ConfigError) as refused:
            against.parse(["--against", "main", wrong])
        assert refused.value.key == wrong.partition("=")[0]
        assert "a whole number >= 1" in str(refused.value)


def _side(name: str, losses: list[str], hashes: dict[int, str], final: str) -> against.Side:
    side = against.Side(name, Path("."))
    side.rows = [Row(i + 1, loss, hashes.get(i + 1, "")) for i, loss in enumerate(losses)]
    side.summary = {"weights_sha256": final, "env": {"num_threads": 2}}
    return side


def test_a_difference_is_the_first_step_where_a_loss_a_hash_the_length_or_the_end_differ():
    then = _side("at v1", ["1.0", "0.9", "0.8"], {2: "a" * 64}, "f")
    assert (
        against.difference(then, _side("here", ["1.0", "0.9", "0.8"], {2: "a" * 64}, "f")) is None
    )
    assert against.difference(then, _side("here", ["1.0", "0.7", "0.8"], {}, "f")) == (
        "step 2: loss 0.9 at v1, 0.7 here"
    )
    assert against.difference(then, _side("here", ["1.0", "0.9", "0.8"], {2: "b" * 64}, "f")) == (
        f"step 2: weights hash {'a' * 16} at v1, {'b' * 16} here"
    )
    assert against.difference(then, _side("here", ["1.0", "0.9"], {}, "f")) == (
        "step 3: trained at v1 only"
    )
    assert against.difference(_side("at v1", ["1.0"], {}, "f"), then) == (
        "step 2: trained at v1 only"
    )
    assert against.difference(then, _side("here", ["1.0", "0.9", "0.8"], {}, "g")) == (
        "step 3: the final weights_sha256"
    )
    assert against.difference(_side("a", [], {}, "f"), _side("b", [], {}, "g")) == (
        "step 0: the final weights_sha256"
    )
    assert then.threads() == "2" and against.Side("x", Path(".")).threads() == "?"


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A git repository with two commits, standing in for the working tree; the project in
    its `project/` folder, as in a monorepo."""
    tree = tmp_path / "repo"
    project = tree / "project"
    (project / "conf").mkdir(parents=True)
    _git("init", "--quiet", cwd=tree)
    (project / "code.py").write_text("first\n")
    (project / "conf" / "config.yaml").write_text("{}\n")  # tracked: the worktree has conf/
    _git("add", ".", cwd=tree)
    _git("commit", "--quiet", "-m", "one", cwd=tree)
    (project / "code.py").write_text("second\n")
    _git("commit", "--quiet", "-am", "two", cwd=tree)
    monkeypatch.setattr(against, "TREE", project)
    return project


def test_git_says_none_where_it_fails_or_is_missing(tmp_path, monkeypatch, checkout):
    assert against.git("rev-parse", "--show-prefix", cwd=checkout) == "project/"
    assert against.git("rev-parse", "--verify", "no-such-rev", cwd=checkout) is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert against.git("status", cwd=checkout) is None


def test_the_revision_is_checked_out_beside_and_removed_whatever_happens(checkout):
    first = _git("rev-parse", "HEAD~1", cwd=checkout)
    with against.worktree("HEAD~1") as (tree, commit):
        assert commit == first and tree.name == "project"
        assert (tree / "code.py").read_text() == "first\n"
        kept = tree.parent
    assert not kept.exists()
    with pytest.raises(KeyboardInterrupt), against.worktree("HEAD") as (tree, _):
        kept = tree.parent
        raise KeyboardInterrupt
    assert not kept.exists()
    listed = _git("worktree", "list", "--porcelain", cwd=checkout)
    assert listed.count("worktree ") == 1  # only the checkout itself


def test_a_tree_outside_git_or_an_unknown_revision_is_one_line(checkout, tmp_path, monkeypatch):
    unknown = pytest.raises(UserError, match=r"^--against v9: no such commit in this checkout$")
    with unknown, against.worktree("v9"):
        pass
    monkeypatch.setattr(against, "TREE", tmp_path)
    outside = pytest.raises(UserError, match=r"^--against v9: .* is not in a git checkout$")
    with outside, against.worktree("v9"):
        pass


def test_this_machines_local_settings_are_lent_to_the_other_side(checkout, tmp_path):
    (checkout / "conf" / "local").mkdir()
    (checkout / "conf" / "local" / "default.yaml").write_text("model: {}\n")
    other = tmp_path / "other"
    (other / "conf").mkdir(parents=True)
    against.share_local_settings(other)
    assert (other / "conf" / "local" / "default.yaml").read_text() == "model: {}\n"
    bare = tmp_path / "bare"
    bare.mkdir()
    against.share_local_settings(bare)  # a tree without conf/ gets nothing
    assert list(bare.iterdir()) == []


def _trained(losses: dict[str, list[str]]):
    def train(side: against.Side, overrides: list[str], run_dir: Path) -> None:
        key = "then" if side.name.startswith("at ") else "now"
        assert run_dir.name == key and overrides[-1] == "trainer.max_steps=2"
        if key == "now":
            assert side.tree == against.TREE
        else:  # the revision's worktree, lent this machine's local settings
            assert side.tree.name == "project" and side.tree != against.TREE
            assert (side.tree / "conf" / "local" / "mine.yaml").read_text() == "x: 1\n"
        side.rows = [Row(i + 1, loss, "") for i, loss in enumerate(losses[key])]
        side.summary = {"weights_sha256": "w", "env": {"num_threads": 1 if key == "then" else 3}}

    return train


@pytest.mark.parametrize("same", [True, False])
def test_main_prints_both_trainings_and_says_identical_or_where_they_differ(
    checkout, monkeypatch, capsys, same
):
    first = _git("rev-parse", "HEAD~1", cwd=checkout)
    now = ["1.0", "0.5"] if same else ["1.0", "0.6"]
    monkeypatch.setattr(against.Side, "train", _trained({"then": ["1.0", "0.5"], "now": now}))
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    (checkout / "conf" / "local").mkdir()
    (checkout / "conf" / "local" / "mine.yaml").write_text("x: 1\n")
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a fresh process
    with pytest.raises(SystemExit) as ended:
        against.main(["--against", "HEAD~1", "steps=2"])
    assert logging.root.handlers[0].formatter._fmt == BARE  # its warnings: bare lines
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        f"training HEAD~1 ({first[:12]}): 2 steps ...",
        "training the working tree: 2 steps ...",
        "same machine, PYTHONHASHSEED=0, threads 1 at HEAD~1, 3 here",
    ]
    if same:
        assert ended.value.code == 0
        assert lines[3:] == ["identical (2 steps): every loss and weights hash matches"]
    else:
        assert ended.value.code == 1
        assert lines[3:] == ["first difference at step 2: loss 0.5 at HEAD~1, 0.6 here"]


def test_main_says_a_mistake_in_one_line_and_exits_2(checkout, capsys):
    with pytest.raises(SystemExit) as ended:
        against.main(["--against", "v9"])
    assert ended.value.code == 2
    assert capsys.readouterr().err == "error: --against v9: no such commit in this checkout\n"


class Finished:
    """What subprocess.run returns: an exit code and what the child wrote."""

    def __init__(self, returncode: int, stderr: str = "") -> None:
        self.returncode, self.stderr, self.stdout = returncode, stderr, ""


def test_a_side_trains_with_its_trees_code_from_the_working_tree_and_reads_what_it_wrote(
    tmp_path, monkeypatch
):
    calls = []

    def run(command, **how):
        calls.append((command, how))
        run_dir = Path(command[-1].removeprefix("hydra.run.dir="))
        run_dir.mkdir(parents=True)
        (run_dir / "fingerprints.csv").write_text("1,0.5,aa\n2,0.25,bb\n")
        (run_dir / "summary.json").write_text('{"weights_sha256": "w", "env": {"num_threads": 4}}')
        return Finished(0)

    monkeypatch.setattr(against.subprocess, "run", run)
    monkeypatch.setenv("PYTHONPATH", "/before")
    monkeypatch.setenv("PYTHONHASHSEED", "5")
    side = against.Side("at v1", tmp_path / "tree")
    assert side.rows == [] and side.summary == {}
    side.train(["a=1", "b=2"], tmp_path / "runs" / "then")
    ((command, how),) = calls
    assert command == [
        sys.executable,
        "-m",
        "repro.train",
        "a=1",
        "b=2",
        f"hydra.run.dir={tmp_path / 'runs' / 'then'}",
    ]
    assert how["cwd"] == against.TREE and how["capture_output"] and how["text"]
    assert how["env"]["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "tree" / "src"), "/before"])
    assert how["env"]["PYTHONHASHSEED"] == "5"
    assert [tuple(r) for r in side.rows] == [(1, "0.5", "aa"), (2, "0.25", "bb")]
    assert side.summary["weights_sha256"] == "w" and side.threads() == "4"
    monkeypatch.delenv("PYTHONPATH")
    side.train(["a=1"], tmp_path / "runs" / "again")
    assert calls[1][1]["env"]["PYTHONPATH"] == str(tmp_path / "tree" / "src")


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        ("Traceback ...\nerror: data.root=None is not allowed\n", "data.root=None is not allowed"),
        ("  KeyError: 'x'  \n", "KeyError: 'x'"),
        ("", "no message"),
    ],
)
def test_a_failed_training_is_one_line_from_the_last_line_it_wrote(
    tmp_path, monkeypatch, stderr, said
):
    monkeypatch.setattr(against.subprocess, "run", lambda command, **how: Finished(1, stderr))
    with pytest.raises(UserError) as refused:
        against.Side("here", tmp_path).train([], tmp_path / "run")
    assert str(refused.value) == f"training here failed: {said}"


def test_a_count_of_one_is_allowed_and_a_value_with_equals_signs_is_not_a_count():
    assert against.parse(["--against", "v1", "steps=1", "threads=1"])[1] == 1
    with pytest.raises(ConfigError) as refused:
        against.parse(["--against", "v1", "steps=3=4"])
    assert (refused.value.key, refused.value.value) == ("steps", "3=4")
    overrides = against.parse(["--against", "v1", "data.root=/a=b"])[2]
    assert overrides[-1] == "data.root=/a=b"


def test_local_settings_are_lent_to_a_tree_that_already_has_some(checkout, tmp_path):
    (checkout / "conf" / "local").mkdir()
    (checkout / "conf" / "local" / "mine.yaml").write_text("x: 1\n")
    other = tmp_path / "other"
    (other / "conf" / "local").mkdir(parents=True)
    (other / "conf" / "local" / "theirs.yaml").write_text("y: 2\n")
    against.share_local_settings(other)
    assert sorted(p.name for p in (other / "conf" / "local").iterdir()) == [
        "mine.yaml",
        "theirs.yaml",
    ]
