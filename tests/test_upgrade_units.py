"""`make upgrade` (repro.verify.upgrade), its parts in this process (test_verify.py and
test_new_project.py run it in a generated project): the arguments and experiments, the
engine's source tree and wheel, the pinned wheel replaced, the clean checkout it needs, each
config's composed and trained sides and its report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from repro.core.errors import ConfigError, UserError
from repro.core.runs.fingerprint_log import Row
from repro.verify import upgrade

IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@localhost"]
ADDED = [*upgrade.CONFIG, upgrade.EVERY_STEP]


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def project(tmp_path) -> Path:
    """A project folder with two experiments, committed."""
    folder = tmp_path / "lab"
    (folder / "conf" / "experiment").mkdir(parents=True)
    for name in ("small", "big"):
        (folder / "conf" / "experiment" / f"{name}.yaml").write_text("# @package _global_\n")
    (folder / "engine").mkdir()
    (folder / "engine" / "repro-0.1.0-py3-none-any.whl").write_bytes(b"old wheel")
    (folder / "pyproject.toml").write_text(
        '[tool.uv.sources]\nrepro = { path = "engine/repro-0.1.0-py3-none-any.whl" }\n'
    )
    (folder / "uv.lock").write_text("lock\n")
    (folder / "README.md").write_text("# lab\n")
    _git("init", "--quiet", cwd=folder)
    _git("add", ".", cwd=folder)
    _git("commit", "--quiet", "-m", "start", cwd=folder)
    return folder


def test_the_engine_steps_experiments_and_overrides_are_read(project):
    engine, steps, checks, overrides = upgrade.parse(["/t@abc", "amp=bf16"], project)
    assert (engine, steps) == ("/t@abc", 8)
    assert [(c.name, c.chosen) for c in checks] == [("the default config", [])]
    assert overrides == [*ADDED, "trainer.max_steps=8", "amp=bf16"]
    _, steps, checks, overrides = upgrade.parse(["/t", "steps=3", "experiments=all"], project)
    assert steps == 3 and overrides == [*ADDED, "trainer.max_steps=3"]
    assert [c.chosen for c in checks] == [[], ["experiment=big"], ["experiment=small"]]
    assert checks[2].name == "experiment=small"
    _, _, checks, _ = upgrade.parse(["/t", "experiments=[small]"], project)
    assert [c.name for c in checks] == ["the default config", "experiment=small"]
    assert [side.name for side in checks[1].sides] == ["the old engine", "the new engine"]


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["/t", "steps=0"], "steps"),
        (["/t", "steps=x"], "steps"),
        (["/t", "experiments=huge"], "experiments"),
        (["/t", "experiments="], "experiments"),
    ],
)
def test_a_wrong_setting_is_one_line_naming_what_is_allowed(project, argv, key):
    with pytest.raises(ConfigError) as refused:
        upgrade.parse(argv, project)
    assert refused.value.key == key
    if key == "experiments":
        assert "all, or names of conf/experiment/*.yaml: big, small" in str(refused.value)


def test_no_engine_or_no_experiments_at_all_is_named(tmp_path):
    for argv in ([], [""]):
        with pytest.raises(UserError, match="the template checkout to upgrade to is missing"):
            upgrade.parse(argv, tmp_path)
    with pytest.raises(ConfigError, match="none there"):
        upgrade.experiments("all", tmp_path)


def test_a_command_that_fails_or_cannot_start_is_one_line_naming_it(tmp_path):
    assert upgrade.run([sys.executable, "-c", "print('out')"], tmp_path, "echo") == "out\n"
    failing = [sys.executable, "-c", "import sys; sys.exit('first\\nlast words')"]
    with pytest.raises(UserError, match=r"^uv lock failed: last words$"):
        upgrade.run(failing, tmp_path, "uv lock")
    with pytest.raises(UserError, match=r"^silent failed: no message$"):
        upgrade.run([sys.executable, "-c", "raise SystemExit(3)"], tmp_path, "silent")
    with pytest.raises(UserError, match=r"^missing: "):
        upgrade.run([str(tmp_path / "no-such-program")], tmp_path, "missing")


def test_the_checkout_must_be_committed_where_the_upgrade_writes(project, tmp_path):
    upgrade.check_committed(project)
    (project / "notes.txt").write_text("the user's, untouched by the upgrade\n")
    upgrade.check_committed(project)  # not a file the upgrade writes
    (project / "uv.lock").write_text("edited\n")
    with pytest.raises(UserError) as refused:
        upgrade.check_committed(project)
    assert str(refused.value).startswith("uv.lock has uncommitted changes: commit them or run")
    assert upgrade.ROLLBACK in str(refused.value)
    outside = tmp_path / "plain"
    outside.mkdir()
    with pytest.raises(UserError, match="is not a git checkout"):
        upgrade.check_committed(outside)


def test_the_engines_tree_is_its_working_tree_or_a_commit_exported(project, tmp_path):
    engine = project  # any checkout with pyproject.toml stands in for the template
    head = _git("rev-parse", "--short=12", "HEAD", cwd=engine)
    tree, described, commit = upgrade.source_tree(str(engine), tmp_path)
    assert (tree, described, commit) == (engine, f"{engine} (working tree at {head})", head)
    (engine / "README.md").write_text("# changed\n")
    assert upgrade.source_tree(str(engine), tmp_path)[2] == head + "-dirty"
    _git("commit", "--quiet", "-am", "two", cwd=engine)
    tree, described, commit = upgrade.source_tree(f"{engine}@HEAD~1", tmp_path)
    assert tree == tmp_path / "engine-source" and commit == head
    assert described == f"{engine} at {head}"
    assert (tree / "README.md").read_text() == "# lab\n"  # the commit's, not the tree's
    with pytest.raises(UserError, match=r"^ENGINE .*@nope failed"):
        upgrade.source_tree(f"{engine}@nope", tmp_path / "x")
    with pytest.raises(ConfigError, match="a checkout of the template"):
        upgrade.source_tree(str(tmp_path / "empty"), tmp_path)


def test_the_pinned_wheel_is_found_and_replaced_under_its_name_or_a_new_one(
    project, tmp_path, capsys
):
    pinned = upgrade.pinned_wheel(project)
    assert pinned == project / "engine" / "repro-0.1.0-py3-none-any.whl"
    same = tmp_path / "repro-0.1.0-py3-none-any.whl"
    same.write_bytes(b"new wheel, same version")
    before = (project / "pyproject.toml").read_text()
    upgrade.install(same, pinned, project)
    assert pinned.read_bytes() == b"new wheel, same version"
    assert (project / "pyproject.toml").read_text() == before and capsys.readouterr().out == ""
    newer = tmp_path / "repro-0.2.0-py3-none-any.whl"
    newer.write_bytes(b"next version")
    upgrade.install(newer, pinned, project)
    assert not pinned.exists()
    assert (project / "engine" / newer.name).read_bytes() == b"next version"
    assert '"engine/repro-0.2.0-py3-none-any.whl"' in (project / "pyproject.toml").read_text()
    assert capsys.readouterr().out == (
        "pyproject.toml: the engine's wheel is now engine/repro-0.2.0-py3-none-any.whl "
        "(a new version)\n"
    )
    (project / "pyproject.toml").write_text("[project]\nname = 'lab'\n")
    with pytest.raises(UserError, match=r"names no wheel for repro in \[tool.uv.sources\]"):
        upgrade.pinned_wheel(project)


def _entry_point(outcomes: dict[str, tuple[int, str]], calls: list[tuple[str, ...]]):
    """A stand-in for `python -m <engine>.train`: `--cfg job` prints a config, a training
    writes its fingerprints and summary."""

    def entry_point(project: Path, *arguments: str) -> subprocess.CompletedProcess:
        calls.append(arguments)
        kind = "compose" if "--cfg" in arguments else "train"
        code, text = outcomes[kind]
        if kind == "train" and code == 0:
            run_dir = Path(next(a for a in arguments if a.startswith("hydra.run.dir="))[14:])
            run_dir.mkdir(parents=True)
            (run_dir / "fingerprints.csv").write_text("1,0.5,\n")
            (run_dir / "summary.json").write_text('{"weights_sha256": "w"}')
        stdout = text if code == 0 else ""
        return subprocess.CompletedProcess(arguments, code, stdout, "" if code == 0 else text)

    return entry_point


def test_a_check_composes_then_trains_each_side_and_reports_identical(
    project, tmp_path, monkeypatch, capsys
):
    calls: list[tuple[str, ...]] = []
    fake = _entry_point({"compose": (0, "model:\n  width: 8\n"), "train": (0, "")}, calls)
    monkeypatch.setattr(upgrade, "entry_point", fake)
    check = upgrade.Check("experiment=small", ["experiment=small"], project)
    for which in (0, 1):
        check.run(which, project, ["trainer.max_steps=1"], tmp_path)
    assert calls[0] == ("experiment=small", "--cfg", "job")
    assert calls[1] == (
        "trainer.max_steps=1",
        "experiment=small",
        f"hydra.run.dir={tmp_path / 'experiment-small-0'}",
    )
    assert check.configs == ["model:\n  width: 8\n"] * 2
    assert check.sides[1].rows == [Row(1, "0.5", "")]
    assert check.report() is None
    assert capsys.readouterr().out == "experiment=small: identical (1 steps)\n"


@pytest.mark.parametrize("failing", ["compose", "train"])
def test_a_side_that_fails_is_one_line_naming_the_config_and_the_engine(
    project, tmp_path, monkeypatch, failing
):
    outcomes = {"compose": (0, "a: 1\n"), "train": (0, ""), failing: (1, "x\nerror: it broke")}
    monkeypatch.setattr(upgrade, "entry_point", _entry_point(outcomes, []))
    check = upgrade.Check("the default config", [], project)
    doing = "composing" if failing == "compose" else "training"
    with pytest.raises(
        UserError, match=f"^{doing} the default config under the new engine failed: it broke$"
    ):
        check.run(1, project, [], tmp_path)


def test_a_check_that_differs_names_the_step_and_the_configs_changes(project, capsys):
    check = upgrade.Check("the default config", [], project)
    for side, loss in zip(check.sides, ("0.5", "0.6"), strict=True):
        side.rows, side.summary = [Row(1, loss, "")], {"weights_sha256": "w"}
    check.configs = ["lr: 0.1\nwd: 0\n", "lr: 0.2\nwd: 0\n"]
    assert check.report() == "step 1: loss 0.5 the old engine, 0.6 the new engine"
    assert capsys.readouterr().out.splitlines() == [
        "the default config: differs, first at step 1: loss 0.5 the old engine, 0.6 the new engine",
        "  resolved config, old -> new:",
        "    lr: 0.1 -> 0.2",
    ]
    check.configs = ["lr: 0.1\n"] * 2
    check.report()
    assert capsys.readouterr().out.splitlines()[1:] == ["  resolved config: the same"]


def test_uv_is_found_on_the_path_or_named_as_needed(monkeypatch):
    monkeypatch.setattr(upgrade.shutil, "which", lambda name: f"/opt/bin/{name}")
    assert upgrade.uv() == "/opt/bin/uv"
    monkeypatch.setattr(upgrade.shutil, "which", lambda name: None)
    with pytest.raises(UserError) as refused:
        upgrade.uv()
    assert str(refused.value) == "uv is needed to build and lock the engine (pip install uv)"


def test_the_wheel_is_built_by_uv_into_its_folder_and_must_be_one(tmp_path, monkeypatch):
    commands, made = [], ["repro-0.3.0-py3-none-any.whl"]

    def run(command, cwd, what):
        commands.append((command, cwd, what))
        into = Path(command[command.index("--out-dir") + 1])
        into.mkdir(parents=True, exist_ok=True)
        for name in made:
            (into / name).write_bytes(b"wheel")
        return ""

    monkeypatch.setattr(upgrade, "run", run)
    monkeypatch.setattr(upgrade, "uv", lambda: "uv")
    tree, into = tmp_path / "tree", tmp_path / "wheels"
    assert upgrade.build_wheel(tree, into) == into / "repro-0.3.0-py3-none-any.whl"
    assert commands == [
        (
            ["uv", "build", "--wheel", "--quiet", "--out-dir", str(into), str(tree)],
            tree,
            "building the engine's wheel",
        )
    ]
    made.append("repro-0.4.0-py3-none-any.whl")
    with pytest.raises(UserError) as refused:
        upgrade.build_wheel(tree, into)
    assert str(refused.value) == f"building the engine's wheel gave 2 wheels in {into}"
    made.clear()
    (into / "other-1.0-py3-none-any.whl").write_bytes(b"not the engine")
    for wheel in into.glob("repro-*.whl"):
        wheel.unlink()
    with pytest.raises(UserError, match=r"gave 0 wheels"):
        upgrade.build_wheel(tree, into)


def test_the_entry_point_is_the_engines_train_on_the_projects_conf(tmp_path, monkeypatch):
    seen = {}

    def fake_run(command, **options):
        seen.update(command=command, **options)
        return subprocess.CompletedProcess(command, 0, "out", "")

    monkeypatch.setattr(upgrade.subprocess, "run", fake_run)
    done = upgrade.entry_point(tmp_path, "a=1", "--cfg", "job")
    assert done.stdout == "out"
    assert seen == {
        "command": [
            sys.executable,
            "-m",
            "repro.train",
            f"--config-path={tmp_path / 'conf'}",
            "a=1",
            "--cfg",
            "job",
        ],
        "cwd": tmp_path,
        "capture_output": True,
        "text": True,
    }


def test_a_failed_childs_last_line_is_said_without_its_error_prefix():
    done = subprocess.CompletedProcess([], 1, "", "warning\nerror: data.root is missing\n")
    assert str(upgrade._failed(done, "training x")) == "training x failed: data.root is missing"
    silent = subprocess.CompletedProcess([], 1, "", "  \n")
    assert str(upgrade._failed(silent, "composing")) == "composing failed: no message"


@pytest.fixture
def engine(tmp_path) -> Path:
    """A template checkout with two commits."""
    folder = tmp_path / "template"
    folder.mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname = 'repro'\n")
    _git("init", "--quiet", cwd=folder)
    _git("add", ".", cwd=folder)
    _git("commit", "--quiet", "-m", "first", cwd=folder)
    (folder / "README.md").write_text("more\n")
    _git("add", ".", cwd=folder)
    _git("commit", "--quiet", "-m", "faster loader", cwd=folder)
    return folder


WHEEL = "repro-0.1.0-py3-none-any.whl"


def upgraded(project, engine, monkeypatch, losses, argv=(), at="", wheel=WHEEL):
    """main() with the children stood in for: the wheel build (giving `wheel`), uv, and each
    training (whose losses are `losses`, one per training in order), each checking it is
    handed the project, the engine's tree and the scratch folder main made. Returns (exit
    code, commands run)."""
    commands, trained = [], iter(losses)

    def build_wheel(tree, into):
        assert into.name == "wheel" and tree in (engine, into.parent / "engine-source")
        into.mkdir(parents=True)
        (into / wheel).write_bytes(b"new engine")
        return into / wheel

    real_run = upgrade.run

    def run(command, cwd, what):
        if command[0] == "git":  # the engine's commit, read for real
            return real_run(command, cwd, what)
        assert cwd == project
        commands.append((command[1:], what))
        return ""

    def entry_point(given, *arguments):
        assert given == project
        if "--cfg" in arguments:
            return subprocess.CompletedProcess(arguments, 0, "lr: 0.1\n", "")
        run_dir = Path(next(a for a in arguments if a.startswith("hydra.run.dir="))[14:])
        run_dir.mkdir(parents=True)
        (run_dir / "fingerprints.csv").write_text(f"1,{next(trained)},\n")
        (run_dir / "summary.json").write_text('{"weights_sha256": "w"}')
        commands.append((list(arguments), "train"))
        return subprocess.CompletedProcess(arguments, 0, "", "")

    monkeypatch.setattr(upgrade, "build_wheel", build_wheel)
    monkeypatch.setattr(upgrade, "run", run)
    monkeypatch.setattr(upgrade, "uv", lambda: "uv")
    monkeypatch.setattr(upgrade, "entry_point", entry_point)
    monkeypatch.chdir(project)
    with pytest.raises(SystemExit) as ended:
        upgrade.main([f"{engine}{at}", "steps=1", *argv])
    return ended.value.code, commands


def test_an_upgrade_that_changes_nothing_trains_both_sides_and_says_identical(
    project, engine, monkeypatch, capsys
):
    head = _git("rev-parse", "--short=12", "HEAD", cwd=engine)
    code, commands = upgraded(project, engine, monkeypatch, ["0.5", "0.5"])
    assert code == 0
    trained = [args for args, what in commands if what == "train"]
    assert [c for c in commands if c[1] != "train"] == [
        (["lock", "--upgrade-package", "repro"], "uv lock"),
        (["sync", "--locked", "--all-extras"], "uv sync"),
    ]
    assert commands.index((["lock", "--upgrade-package", "repro"], "uv lock")) == 1
    assert len(trained) == 2 and trained[0][-1].endswith("the-default-config-0")
    assert trained[1][-1].endswith("the-default-config-1") and "trainer.max_steps=1" in trained[0]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"building the engine from {engine} (working tree at {head}) ..."
    assert out[1] == "training 1 config(s), 1 steps each, under the old engine ..."
    assert out[2] == "training 1 config(s), 1 steps each, under the new engine ..."
    assert out[3] == "the default config: identical (1 steps)"
    assert out[4] == f"the template's commits from an unrecorded commit to {head}:"
    assert out[-1].startswith("identical: every config checked trains the same steps; the new ")
    assert out[-1].endswith(" (commit them)") and "engine/, uv.lock" in out[-1]
    wheel = project / "engine" / "repro-0.1.0-py3-none-any.whl"
    assert wheel.read_bytes() == b"new engine"


def test_an_upgrade_that_changes_results_names_the_configs_and_how_to_commit_or_roll_back(
    project, engine, monkeypatch, capsys
):
    head = _git("rev-parse", "--short=12", "HEAD", cwd=engine)
    code, _ = upgraded(
        project, engine, monkeypatch, ["0.5", "0.5", "0.5", "0.6"], ["experiments=small"]
    )
    assert code == 1
    out = capsys.readouterr().out.splitlines()
    assert "training 2 config(s), 1 steps each, under the old engine ..." in out
    assert "the default config: identical (1 steps)" in out
    assert out[-1].startswith("results change for experiment=small; the new engine is in engine/")
    assert out[-1].endswith(
        f'commit them as `git commit -am "Engine @ {head} [changes results]"`, or roll back: '
        f"{upgrade.ROLLBACK}"
    )


def test_an_upgrade_refused_before_it_starts_is_one_line_and_changes_nothing(
    project, engine, monkeypatch, capsys
):
    (project / "uv.lock").write_text("edited\n")
    code, commands = upgraded(project, engine, monkeypatch, [])
    assert code == 2 and commands == []
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "uv.lock has uncommitted changes" in said[0]
    assert (project / "engine" / "repro-0.1.0-py3-none-any.whl").read_bytes() == b"old wheel"


def test_an_upgrade_to_a_commit_lists_the_commits_since_the_recorded_one_and_records_it(
    project, engine, monkeypatch, capsys
):
    first = _git("rev-parse", "--short=12", "HEAD~1", cwd=engine)
    second = _git("rev-parse", "--short=12", "HEAD", cwd=engine)
    (engine / "later.txt").write_text("a third commit, not asked for\n")
    _git("add", ".", cwd=engine)
    _git("commit", "--quiet", "-m", "later work", cwd=engine)
    with (project / "pyproject.toml").open("a") as toml:
        toml.write(f'\n[tool.repro]\nengine_commit = "{first}"\n')
    (project / "README.md").write_text(f"# lab\n\nengine_commit {first}\n")
    _git("commit", "--quiet", "-am", "recorded", cwd=project)
    losses = ["0.5", "0.5", "0.6", "0.7"]  # old: default, small; new: default, small
    newer = "repro-0.2.0-py3-none-any.whl"
    code, _ = upgraded(
        project, engine, monkeypatch, losses, ["experiments=small"], "@HEAD~1", newer
    )
    assert code == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"building the engine from {engine} at {second} ..."
    assert "pyproject.toml: the engine's wheel is now engine/" + newer + " (a new version)" in out
    start = out.index(f"the template's commits from {first} to {second}:")
    assert out[start + 1] == f"  {second} faster loader"
    assert out[-1].startswith(
        "results change for the default config, experiment=small; the new engine is in "
        "engine/, uv.lock, pyproject.toml, README.md: commit them"
    )
    assert f'engine_commit = "{second}"' in (project / "pyproject.toml").read_text()
    assert f"engine_commit {second}" in (project / "README.md").read_text()
    assert (project / "engine" / newer).read_bytes() == b"new engine"


def test_an_engine_that_is_no_template_checkout_or_has_no_commit_yet_is_named(tmp_path):
    with pytest.raises(ConfigError) as refused:
        upgrade.source_tree(str(tmp_path / "nowhere"), tmp_path)
    assert str(refused.value) == (
        f"ENGINE='{tmp_path / 'nowhere'}' is not allowed: a checkout of the template (it has "
        "pyproject.toml)"
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "pyproject.toml").write_text("[project]\n")
    tree, described, commit = upgrade.source_tree(str(bare), tmp_path)
    assert tree == bare and (described, commit) == (f"{bare} (working tree at unknown)", "unknown")


def test_steps_and_experiments_are_refused_word_for_word(project, tmp_path):
    with pytest.raises(ConfigError) as refused:
        upgrade.parse(["/t", "steps=3=4"], project)
    assert (
        str(refused.value) == f"steps='3=4' is not allowed: a whole number >= 1 ({upgrade.USAGE})"
    )
    _, _, checks, _ = upgrade.parse(["/t", "experiments=[small,big]"], project)
    assert [c.name for c in checks][1:] == ["experiment=small", "experiment=big"]
    with pytest.raises(ConfigError) as refused:
        upgrade.experiments("huge", project)
    assert str(refused.value) == (
        "experiments='huge' is not allowed: all, or names of conf/experiment/*.yaml: big, small"
    )
    with pytest.raises(ConfigError) as refused:
        upgrade.experiments("all", tmp_path)
    assert str(refused.value) == (
        "experiments='all' is not allowed: all, or names of conf/experiment/*.yaml: none there"
    )


def test_every_uncommitted_file_the_upgrade_writes_is_named(project):
    (project / "uv.lock").write_text("edited\n")
    (project / "README.md").write_text("# edited\n")
    with pytest.raises(UserError) as refused:
        upgrade.check_committed(project)
    assert str(refused.value) == (
        "README.md, uv.lock has uncommitted changes: commit them or run "
        f"`{upgrade.ROLLBACK}` first, so that the upgrade can be rolled back"
    )


def test_an_upgrade_outside_a_git_checkout_is_refused_naming_the_folder(
    tmp_path, engine, monkeypatch, capsys
):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "pyproject.toml").write_text(
        f'[tool.uv.sources]\nrepro = {{ path = "engine/{WHEEL}" }}\n'
    )
    code, commands = upgraded(plain, engine, monkeypatch, [])
    assert code == 2 and commands == []
    assert capsys.readouterr().err == (
        f"error: {plain} is not a git checkout: the upgrade's rollback needs one\n"
    )
