"""repro.verify.explain: what `make upgrade` prints beside its verdict (the keys whose values
changed, the template's commits between the two engines) and the commit it records."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from repro.verify import explain


def git(tree: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, list[str]]:
    """A git tree with 43 commits, `commit 0` to `commit 42`, and their 12-digit hashes."""
    tree = tmp_path_factory.mktemp("template")
    git(tree, "init", "-q")
    hashes = []
    for number in range(43):
        git(tree, "commit", "-q", "--allow-empty", "-m", f"commit {number}")
        hashes.append(git(tree, "rev-parse", "--short=12", "HEAD"))
    return tree, hashes


def test_each_changed_key_is_listed_sorted_with_absent_on_the_side_without_it():
    old = "optimizer:\n  lr: 0.2\n  momentum: 0.9\ntrainer:\n  epochs: 3\n  gone: 1\nz: 1\n"
    new = "a: [1, 2]\noptimizer:\n  lr: 0.1\n  momentum: 0.9\ntrainer:\n  epochs: 3\n  warmup: 2\nz: 1\n"
    assert explain.config_changes(old, new) == [
        "a: (absent) -> [1, 2]",
        "optimizer.lr: 0.2 -> 0.1",
        "trainer.gone: 1 -> (absent)",
        "trainer.warmup: (absent) -> 2",
    ]
    assert explain.config_changes(old, old) == []
    # An empty section is a value of its own; a list is compared whole.
    assert explain.config_changes("a: {}\nb: [1]\n", "a: {x: 1}\nb: [2]\n") == [
        "a: {} -> (absent)",
        "a.x: (absent) -> 1",
        "b: [1] -> [2]",
    ]
    assert explain.config_changes("a: null\n", "a: 0\n") == ["a: None -> 0"]
    # A key set to null on one side only is still a change: absent is not null.
    assert explain.config_changes("a: 1\n", "a: 1\nb: null\n") == ["b: (absent) -> None"]
    assert explain.config_changes("a: 1\nb: null\n", "a: 1\n") == ["b: None -> (absent)"]


def test_the_leaves_of_a_config_are_its_dotted_keys():
    assert explain._leaves({"a": {"b": 1, "c": {"d": [2]}}, "e": {}}) == {
        "a.b": 1,
        "a.c.d": [2],
        "e": {},
    }
    assert explain._leaves({}) == {} and explain._leaves(5) == {}
    assert explain._leaves({}, "p") == {"p": {}} and explain._leaves(5, "p") == {"p": 5}
    assert explain._leaves({1: {2: "x"}}) == {"1.2": "x"}


def test_the_commits_after_the_old_engine_up_to_the_new_are_listed_newest_first(template):
    tree, hashes = template
    assert explain.commits_between(tree, hashes[0], hashes[2]) == [
        f"{hashes[2]} commit 2",
        f"{hashes[1]} commit 1",
    ]
    assert explain.commits_between(tree, hashes[5][:7], hashes[6]) == [f"{hashes[6]} commit 6"]
    assert explain.commits_between(tree, hashes[3], hashes[3]) == ["(none: the same commit)"]


def test_a_log_longer_than_forty_commits_is_cut_with_the_count_of_the_rest(template):
    tree, hashes = template
    listed = explain.commits_between(tree, hashes[0], hashes[42])
    assert len(listed) == 41 and explain.MOST_COMMITS == 40
    assert listed[0] == f"{hashes[42]} commit 42" and listed[39] == f"{hashes[3]} commit 3"
    assert listed[40] == "... and 2 earlier commits"
    assert len(explain.commits_between(tree, hashes[1], hashes[41])) == 40  # exactly forty: whole


OLD_UNCOMMITTED = (
    "(no commit list: the old engine's wheel was built from uncommitted changes or no commit)"
)
NEW_UNCOMMITTED = OLD_UNCOMMITTED.replace("old engine", "new engine")


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (None, "abcdef1", OLD_UNCOMMITTED),
        ("", "abcdef1", OLD_UNCOMMITTED),
        ("abcdef1-dirty", "abcdef2", OLD_UNCOMMITTED),
        ("abcdef1", "abcdef2-dirty", NEW_UNCOMMITTED),
        ("abcdef1-dirty", "abcdef2-dirty", OLD_UNCOMMITTED),
    ],
)
def test_an_engine_from_no_commit_or_uncommitted_changes_lists_none_saying_which(
    template, old, new, said
):
    tree, _ = template
    assert explain.commits_between(tree, old, new) == [said]


@pytest.mark.parametrize(
    "old", ["--output=/tmp/x", "abcdef", "ABCDEF1", "abcdefg", "a" * 41, "abcdef1 HEAD", "-dirty"]
)
def test_a_recorded_commit_that_is_no_commit_name_never_reaches_git(template, old):
    tree, hashes = template
    assert explain.commits_between(tree, old, hashes[1]) == [
        f"(no commit list: engine_commit {old!r} in pyproject.toml is no commit)"
    ]


def test_a_commit_name_the_template_does_not_have_is_named(template):
    tree, hashes = template
    assert explain.commits_between(tree, "0123456789ab", hashes[1]) == [
        f"(no commit list: 0123456789ab is not a commit of {tree})"
    ]
    assert explain.commits_between(tree, "a" * 40, hashes[1])[0].endswith(f"of {tree})")


def test_the_recorded_commit_is_pyprojects_first_engine_commit_at_a_line_start(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '# engine_commit = "no"\n  engine_commit = "indented"\n[tool.repro]\n'
        'engine_commit = "abc1234"\nengine_commit = "second"\n'
    )
    assert explain.recorded_commit(tmp_path) == "abc1234"
    (tmp_path / "pyproject.toml").write_text('[tool.repro]\nengine_commit = ""\n')
    assert explain.recorded_commit(tmp_path) == ""
    (tmp_path / "pyproject.toml").write_text("[tool.repro]\n")
    assert explain.recorded_commit(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('engine_commit = "été1"\n', encoding="utf-8")
    assert explain.recorded_commit(tmp_path) == "été1"


def test_the_new_commit_is_written_where_pyproject_and_the_readme_name_the_old(tmp_path):
    old, new = "abc1234-dirty", "def5678"
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.repro]\nengine_commit = "{old}"\nengine_commit = "{old}"\n'
    )
    (tmp_path / "README.md").write_text(f"Built from {old}, not x{old} or {old}x; {old}.\n")
    assert explain.record_commit(tmp_path, old, new) == ["pyproject.toml", "README.md"]
    assert (tmp_path / "pyproject.toml").read_text() == (
        f'[tool.repro]\nengine_commit = "{new}"\nengine_commit = "{old}"\n'
    )  # the first line only: the one recorded_commit reads
    assert (
        tmp_path / "README.md"
    ).read_text() == f"Built from {new}, not x{old} or {old}x; {new}.\n"


def test_a_commit_inside_a_longer_name_is_left_and_an_unchanged_file_is_not_rewritten(tmp_path):
    (tmp_path / "pyproject.toml").write_text('engine_commit = "abc1234"\n')
    (tmp_path / "README.md").write_text("abc1234-dirty and abc1234_x and abc12345\n")
    before = (tmp_path / "README.md").stat().st_mtime_ns
    assert explain.record_commit(tmp_path, "abc1234", "fed4321") == ["pyproject.toml"]
    assert (tmp_path / "README.md").read_text() == "abc1234-dirty and abc1234_x and abc12345\n"
    assert (tmp_path / "README.md").stat().st_mtime_ns == before
    (tmp_path / "README.md").unlink()
    assert explain.record_commit(tmp_path, "fed4321", "0a0a0a0") == ["pyproject.toml"]
    assert not (tmp_path / "README.md").exists()
    (tmp_path / "pyproject.toml").unlink()  # a project without one: its README still moves
    (tmp_path / "README.md").write_text("0a0a0a0\n")
    assert explain.record_commit(tmp_path, "0a0a0a0", "1b1b1b1") == ["README.md"]
    assert (tmp_path / "README.md").read_text() == "1b1b1b1\n"


@pytest.mark.parametrize(
    ("old", "new"), [(None, "abc1234"), ("", "abc1234"), ("abc1234", "abc1234")]
)
def test_nothing_is_written_without_an_old_commit_or_when_it_is_the_new_one(tmp_path, old, new):
    text = 'engine_commit = "fff0000"\n'  # even where pyproject says another: nothing moves
    (tmp_path / "pyproject.toml").write_text(text)
    (tmp_path / "README.md").write_text("abc1234\n")
    assert explain.record_commit(tmp_path, old, new) == []
    assert (tmp_path / "pyproject.toml").read_text() == text


def test_a_commit_with_regex_characters_is_matched_as_written(tmp_path):
    (tmp_path / "README.md").write_text("a.c and abc\n")
    assert explain.record_commit(tmp_path, "a.c", "new") == ["README.md"]
    assert (tmp_path / "README.md").read_text() == "new and abc\n"
