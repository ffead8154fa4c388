"""scripts/new_project.py: a renamed, self-contained copy that trains, with one fresh commit."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from project_parts import ADDED_DATASETS, ADDED_OBJECTIVE, CONF, SOURCES

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "new_project.py"
TEMPLATE = "repro"  # the package this project calls itself (new projects rewrite it, too)
# Another name than this package's own that holds no word of it (uv.lock writes ember_lab as
# ember-lab, where a project named lab would find its own name), so any project passes too.
NAME = next(name for name in ("ember_lab", "sample_kit") if TEMPLATE not in name.split("_"))
OLD_WORD = re.compile(rf"\b{TEMPLATE}\b", re.IGNORECASE)  # "reproducible" does not match


def new_project(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("new") / NAME
    done = new_project(NAME, "--dest", str(dest), "--own-engine")
    assert done.returncode == 0, done.stderr
    return dest


@pytest.mark.e2e
def test_the_package_is_renamed_everywhere(project):
    assert (project / "src" / NAME / "train.py").is_file()
    assert not (project / "src" / TEMPLATE).exists()
    left = {
        str(path.relative_to(project)): OLD_WORD.findall(path.read_text(errors="replace"))
        for path in files(project)
        if path.name != "TEMPLATE.md"
    }
    assert {path: found for path, found in left.items() if found} == {}
    pyproject = (project / "pyproject.toml").read_text()
    assert (
        f'name = "{NAME}"' in pyproject
        and f'packages = ["src/{NAME}", "src/hydra_plugins"]' in pyproject
    )
    normalised = NAME.replace("_", "-")  # as uv writes it
    assert f'name = "{normalised}"' in (project / "uv.lock").read_text()
    assert (
        f"_target_: {NAME}.extras.models"
        in (project / "conf" / "model" / "small_cnn.yaml").read_text()
    )
    assert f"python -m {NAME}.train" in (project / "README.md").read_text()
    assert f"{NAME.upper()}_DATA" in (project / "conf" / "data" / "cifar10.yaml").read_text()
    assert "## Reproducibility" in (project / "README.md").read_text()  # only the name changed
    workflow = (project / ".github" / "workflows" / "ci.yml").read_text()
    assert f"name: {NAME} CI" in workflow and "run: make test" in workflow
    assert "run: make lint" in workflow and "enable-cache: true" in workflow
    hooks = (project / ".pre-commit-config.yaml").read_text()
    assert hooks.startswith(f"# {NAME}:") and "id: ruff-format" in hooks


@pytest.mark.e2e
def test_fresh_history_provenance_and_nothing_left_over(project):
    assert git("rev-list", "--count", "HEAD", cwd=project).strip() == "1"
    assert git("status", "--porcelain", cwd=project) == ""  # every file is in that commit
    template_md = (project / "TEMPLATE.md").read_text()
    version = re.search(r'__version__ = "(.+)"', (ROOT / "src/repro/__init__.py").read_text())
    assert f"version: {version.group(1)}" in template_md
    if (ROOT / ".git").exists():
        assert git("rev-parse", "HEAD", cwd=ROOT).strip() in template_md
    assert re.search(r"uncommitted changes in the template: (yes|no)", template_md)
    names = {p.name for p in project.rglob("*")}
    assert not names & {".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".whl"}
    assert [p.name for p in (project / "outputs").iterdir()] == [".gitkeep"]
    assert [p.name for p in (project / "conf" / "local").iterdir()] == [".gitkeep"]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_new_project_trains_from_its_own_code(project, tmp_path):
    # The current venv has every dependency, so PYTHONPATH stands in for a second `uv sync`.
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "PYTHONHASHSEED": "0"}
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", f"{NAME}.train", "debug=fast", "dataloader=debug",
         f"hydra.run.dir={run_dir}"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (run_dir / "summary.json").is_file() and not (run_dir / "checkpoints").exists()
    resolved = (run_dir / "resolved_config.yaml").read_text()  # only the new project has NAME
    assert f"_target_: {NAME}.extras.models.small_cnn.SmallCNN" in resolved


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_the_lock_file_still_matches_the_project(project):
    done = subprocess.run(
        ["uv", "lock", "--check", "--offline"], cwd=project, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.e2e
def test_a_generated_project_starts_projects_too(project, tmp_path):
    done = subprocess.run(
        [sys.executable, str(project / "scripts" / "new_project.py"), "grandchild",
         "--dest", str(tmp_path / "grandchild"), "--own-engine"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    made = tmp_path / "grandchild"
    assert 'name = "grandchild"' in (made / "uv.lock").read_text()
    assert f"`{NAME}` template" in (made / "TEMPLATE.md").read_text()
    assert not [p for p in files(made) if NAME in p.read_text() and p.name != "TEMPLATE.md"]


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["2fast", "my-exp", "class", "torch", "hydra", "test", "os"])
def test_bad_names_are_refused_in_one_line(name, tmp_path):
    done = new_project(name, "--dest", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_non_empty_destination_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    done = new_project(NAME, "--dest", str(tmp_path))
    assert done.returncode == 2 and "not an empty folder" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def load_script():
    spec = importlib.util.spec_from_file_location("new_project", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
@pytest.mark.parametrize("use_git", [True, False], ids=["git", "no-git"])
def test_ignored_files_stay_behind_and_dest_defaults_to_a_sibling(use_git, tmp_path, monkeypatch):
    """A fake template full of things not to copy, with or without git; no git identity."""
    template = tmp_path / "template"
    keep = {
        ".gitignore": (ROOT / ".gitignore").read_text(),
        f"src/{TEMPLATE}/__init__.py": '__version__ = "9.9"\n',
        f"src/{TEMPLATE}/conf/local/.gitkeep": "", "outputs/.gitkeep": "",
        "README.md": f"# {TEMPLATE}\n",
    }  # fmt: skip
    for rel, text in keep.items():
        (template / rel).parent.mkdir(parents=True, exist_ok=True)
        (template / rel).write_text(text)
    (template / "conf").symlink_to(f"src/{TEMPLATE}/conf")  # as in the template
    if use_git:
        git("init", "--quiet", cwd=template)
        git("add", "--all", cwd=template)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t", cwd=template)
    junk = [
        "outputs/runs/a/summary.json", ".venv/bin/python", f"src/{TEMPLATE}/__pycache__/x.pyc",
        ".pytest_cache/v", ".ruff_cache/v", ".whl/x.whl", "conf/local/default.yaml", "data/x.bin",
    ]  # fmt: skip
    for rel in junk:
        (template / rel).parent.mkdir(parents=True, exist_ok=True)
        (template / rel).write_text("junk")
    script = load_script()
    monkeypatch.setattr(script, "ROOT", template)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))  # no identity
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    assert script.main(["zebra", "--own-engine"]) == 0
    made = tmp_path / "zebra"  # ../NAME next to the template
    copied = {str(p.relative_to(made)) for p in files(made)}
    # The link is copied as a link, renamed, and nothing else came through it.
    assert os.readlink(made / "conf") == "src/zebra/conf"
    assert {rel for rel in copied if not rel.startswith("conf/")} == {
        ".gitignore", "src/zebra/__init__.py", "src/zebra/conf/local/.gitkeep", "outputs/.gitkeep",
        "README.md", "TEMPLATE.md",
    }  # fmt: skip
    assert (made / "README.md").read_text() == "# zebra\n"
    assert git("log", "--format=%an", cwd=made).strip() == "new_project.py"
    assert "version: 9.9" in (made / "TEMPLATE.md").read_text()
    expected = "uncommitted changes in the template: " + ("no" if use_git else "unknown")
    assert expected in (made / "TEMPLATE.md").read_text()


@pytest.fixture(scope="module")
def minimal(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("minimal") / NAME
    done = new_project(NAME, "--dest", str(dest), "--minimal")
    assert done.returncode == 0, done.stderr
    return dest


@pytest.mark.e2e
@pytest.mark.slow
def test_minimal_leaves_the_recipes_and_benchmarks_behind_and_its_tests_collect(minimal):
    assert (
        not (minimal / "benchmarks").exists()
        and not (minimal / "src" / NAME / "extras" / "recipes").exists()
    )
    assert not list((minimal / "tests").glob("test_recipe_*")) and (minimal / "tests").is_dir()
    assert not (minimal / "conf" / "model" / "whitened_cnn.yaml").exists()
    assert (minimal / "conf" / "model" / "small_cnn.yaml").is_file()
    makefile = (minimal / "Makefile").read_text()
    assert "bench" not in makefile and "ruff check src tests scripts\n" in makefile
    assert "--minimal" in (minimal / "TEMPLATE.md").read_text()
    env = {**os.environ, "PYTHONPATH": str(minimal / "src"), "PYTHONHASHSEED": "0"}
    pytest_in = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    # Every test module imports without the recipes; the layout checks pass there too.
    collected = subprocess.run([*pytest_in, "--collect-only"], cwd=minimal, env=env,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    layout = subprocess.run([*pytest_in, "tests/test_layout.py"], cwd=minimal, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert layout.returncode == 0, layout.stdout[-3000:]


@pytest.mark.e2e
def test_a_longer_name_still_passes_lint(project):
    """The rename lengthens lines; the generated project is formatted with the template's
    ruff settings, so its `make lint` (ruff check and ruff format --check) passes."""
    for check in (["check"], ["format", "--check"]):
        done = subprocess.run([sys.executable, "-m", "ruff", *check, "src", "tests", "scripts"],
                              cwd=project, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:]


@pytest.mark.e2e
def test_a_project_made_before_make_setup_still_passes_the_format_check(tmp_path):
    """With no ruff at hand (no venv yet, none on PATH) the generator runs the ruff uv.lock pins
    through uv, so the lines a shorter name lets join are joined, and `make lint` passes."""
    path = os.pathsep.join(
        folder for folder in os.environ["PATH"].split(os.pathsep)
        if not (Path(folder) / "ruff").exists()
    )  # fmt: skip
    uv = shutil.which("uv", path=path)
    if uv is None:
        pytest.skip("no uv on PATH but beside a ruff")
    pinned = re.search(r'\nname = "ruff"\nversion = "([^"]+)"', (ROOT / "uv.lock").read_text())
    assert pinned, "uv.lock pins ruff"
    fetch = [uv, "tool", "run", f"ruff@{pinned.group(1)}", "--version"]
    if subprocess.run(fetch, capture_output=True, timeout=300).returncode != 0:
        pytest.skip("uv cannot fetch ruff here (offline, no cache)")
    dest = tmp_path / "lab"  # shorter than the template's name: lines join
    # -S: no site-packages, so no ruff module either, as with a system Python before setup.
    command = [sys.executable, "-S", str(SCRIPT), "lab", "--dest", str(dest), "--own-engine"]
    done = subprocess.run(command, env={**os.environ, "PATH": path}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "note:" not in done.stdout, done.stdout + done.stderr
    folders = ["src", "tests", "scripts", "benchmarks"]
    check = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", *folders],
                           cwd=dest, capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout[-2000:]


# --- the default: a project that holds only its own code and depends on the engine ----------

LAB = "lab_exp"  # no word of the template's name in it


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed (the generator builds the engine's wheel with it)")
    dest = tmp_path_factory.mktemp("lab") / LAB
    done = new_project(LAB, "--dest", str(dest))
    assert done.returncode == 0, done.stderr
    return dest


def own_python_lines(project: Path) -> int:
    tracked = git("ls-files", "src", "tests", cwd=project).split()
    return sum(
        len((project / rel).read_text().splitlines()) for rel in tracked if rel.endswith(".py")
    )


@pytest.mark.e2e
def test_a_project_holds_its_own_code_and_the_engine_pinned_by_hash(lab):
    tracked = git("ls-files", cwd=lab).split()
    assert len(tracked) <= 40 and own_python_lines(lab) <= 400
    assert not [rel for rel in tracked if rel.startswith(f"src/{TEMPLATE}")]  # no engine copy
    (wheel,) = [rel for rel in tracked if rel.startswith("engine/")]
    assert re.fullmatch(rf"engine/{TEMPLATE}-[\w.+]+-py3-none-any\.whl", wheel)
    lock = (lab / "uv.lock").read_text()
    entry = lock.split(f'\nname = "{TEMPLATE}"\n', 1)[1].split("[[package]]", 1)[0]
    assert f'source = {{ path = "{wheel}" }}' in entry and 'hash = "sha256:' in entry
    with zipfile.ZipFile(lab / wheel) as shipped:  # the engine's docs travel with it
        names = set(shipped.namelist())
    assert {
        f"{TEMPLATE}/manual/docs/{page}" for page in ("README.md", "engine.md", "sweeps.md")
    } <= names
    assert {f"src/{LAB}/stripes.py", f"src/{LAB}/logit_penalty.py", f"src/{LAB}/confusion.py",
            f"src/{LAB}/mixer.py", "conf/config.yaml", "conf/experiment/mixer_adamw.yaml",
            "Makefile", ".github/workflows/ci.yml"} <= set(tracked)  # fmt: skip


@pytest.mark.e2e
def test_a_project_composes_the_engines_groups_and_its_own_option_wins(lab, tmp_path):
    from hydra import compose, initialize_config_dir

    conf = shutil.copytree(lab / "conf", tmp_path / "conf")
    (conf / "optimizer").mkdir()
    (conf / "optimizer" / "sgd.yaml").write_text("defaults:\n  - adamw\n  - _self_\nlr: 0.123\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=["model=resnet18_cifar", "amp=bf16"])
    assert cfg.data._target_ == f"{LAB}.stripes.stripes" and cfg.data.noise == 0.1
    assert cfg.objective._target_ == f"{LAB}.logit_penalty.LogitPenalty"
    assert cfg.callbacks.confusion._target_ == f"{LAB}.confusion.ConfusionLog"
    assert cfg.model._target_.startswith(f"{TEMPLATE}.extras.models.") and cfg.amp.mode == "bf16"
    assert cfg.optimizer.lr == 0.123  # the project's sgd, not the engine's


PLAIN = """# @package _global_
defaults:
  - override /data: synthetic
  - override /objective: cross_entropy
callbacks:
  confusion: null
trainer:
  epochs: 3
"""


@pytest.mark.e2e
def test_an_experiments_choices_win_over_the_projects_and_the_kit_names_a_dropped_one(
    lab, tmp_path
):
    from hydra import compose, initialize_config_dir

    from repro.extras.testkit.project import Project

    conf = shutil.copytree(lab / "conf", tmp_path / "conf")
    (conf / "experiment" / "plain.yaml").write_text(PLAIN)
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        default = compose("config")
        plain = compose("config", overrides=["experiment=plain"])
        chosen = compose("config", overrides=["experiment=plain", "data=stripes"])
    assert default.data._target_ == f"{LAB}.stripes.stripes" and default.callbacks.confusion
    assert plain.data._target_ == f"{TEMPLATE}.core.data.datasets.synthetic"
    assert plain.objective._target_ == f"{TEMPLATE}.core.tasks.objectives.CrossEntropy"
    assert plain.callbacks.confusion is None and plain.trainer.epochs == 3
    assert chosen.data._target_ == f"{LAB}.stripes.stripes"  # the command line wins over both
    project = Project(conf)
    assert project.dropped_choices("plain") == []
    summary = project.train(tmp_path / "run", "experiment=plain")  # no code of the project's
    resolved = (tmp_path / "run" / "resolved_config.yaml").read_text()
    assert f"_target_: {TEMPLATE}.core.data.datasets.synthetic" in resolved
    assert f"{LAB}.confusion" not in resolved and summary["weights_sha256"]

    # A project that makes its choices in config.yaml (after the engine's list, experiments
    # included) would run the wrong data silently: the kit names each choice it drops.
    (conf / "project" / "default.yaml").unlink()
    (conf / "config.yaml").write_text(
        "defaults:\n  - engine\n  - override data: stripes\n  - override objective: "
        "logit_penalty\n  - _self_\nhydra:\n  searchpath:\n    - pkg://"
        f"{TEMPLATE}.conf\ncallbacks:\n  confusion:\n    _target_: {LAB}.confusion.ConfusionLog\n"
    )
    dropped = project.dropped_choices("plain")
    assert dropped[:2] == [
        "data=synthetic (composed: stripes)",
        "objective=cross_entropy (composed: logit_penalty)",
    ]
    assert len(dropped) == 3 and dropped[2].startswith("callbacks.confusion: None (composed: ")
    from repro.extras.testkit import (
        checks,  # the kit's check fails such a project, naming the choice
    )

    with pytest.raises(
        AssertionError,
        match=r"^experiment=plain is not what runs: it asks for "
        r"data=synthetic \(composed: stripes\); objective=cross_entropy",
    ):
        checks.test_experiment_runs_what_it_says_and_survives_a_kill(project, "plain")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_fresh_clone_of_a_project_sets_up_trains_and_tests_within_its_budget(lab, tmp_path):
    clone = tmp_path / "clone"
    git("clone", "--quiet", str(lab), str(clone), cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    times = {}
    for target in ("setup", "train", "test"):
        started = time.perf_counter()
        done = subprocess.run(["make", target], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=1200)  # fmt: skip
        times[target] = time.perf_counter() - started
        assert done.returncode == 0, f"make {target}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert times["test"] <= 90, times
    assert len(git("ls-files", cwd=clone).split()) <= 40 and own_python_lines(clone) <= 400
    (summary,) = (clone / "outputs" / "runs").glob("**/summary.json")
    assert json.loads(summary.read_text())["val_acc"] >= 0.95  # the first `make train` learns
    # The project's own entry point trained; the engine's, typed here, refuses in one line.
    done = subprocess.run(
        ["uv", "run", "--locked", "python", "-m", "repro.train"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"error: this folder is the project {LAB}: train it with `python -m {LAB}.train` "
        "(`python -m repro.train` trains the engine's own defaults, not its conf/)"
    ], done.stderr[-2000:]

    # The template's daily commands, as the project's README gives them.
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        ["make", "sweep", f"ARGS=debug=fast hydra.sweep.dir={sweep}"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(job.name for job in sweep.iterdir() if (job / "summary.json").is_file()) == [
        "0",
        "1",
        "2",
        "3",
        "4",
    ]
    assert (sweep / "sweep_summary.md").is_file() and "joblib" in (
        sweep / "multirun.yaml"
    ).read_text()
    done = subprocess.run(
        ["make", "docs", "ARGS=sweeps"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    page = [line for line in done.stdout.splitlines() if not line.startswith("make")]
    assert done.returncode == 0 and page[0].startswith("# "), done.stderr[-2000:]
    readme = (clone / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for command in (
        "make train",
        "make test",
        "make sweep",
        "adaptive_seeds",
        "repro.evaluate",
        "repro.predict",
        "repro.export",
        "repro.resume",
        "make upgrade",
        "make docs",
    ):
        assert command.replace("repro", TEMPLATE) in readme, command


def clone_and_set_up(lab: Path, into: Path) -> tuple[Path, dict[str, str]]:
    """A fresh clone of the project, `make setup` done; the environment for its make."""
    clone = into / "clone"
    git("clone", "--quiet", str(lab), str(clone), cwd=into)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(["make", "setup"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return clone, env


def make(clone: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=1200
    )


def add_parts(clone: Path) -> None:
    """The user's multi-label dataset, its objective, metric, callback and experiment, and SAM."""
    for module, text in SOURCES.items():
        (clone / "src" / LAB / f"{module}.py").write_text(text)
    stripes = (clone / "conf" / "data" / "stripes.yaml").read_text()
    for rel, text in CONF.items():
        target = clone / "conf" / rel
        target.parent.mkdir(exist_ok=True)
        if text is None:
            text = stripes.replace(f"{LAB}.stripes.stripes", f"{LAB}.crossings.crossings")
        target.write_text(text.format(name=LAB, engine=TEMPLATE))


def kit_failures(out: str) -> dict[tuple[str, str], str]:
    """(check, option) -> the report pytest printed for it, from its "___ name ___" header on."""
    found = {}
    for block in re.split(r"^_{3,} ", out, flags=re.MULTILINE)[1:]:
        header = re.match(r"(\w+)\[([\w=]+)\] _+", block)
        if header:
            found[header.groups()] = block.split("\n=", 1)[0]
    return found


@pytest.mark.e2e
@pytest.mark.slow
def test_a_project_checks_the_users_own_parts_and_names_each_broken_promise(lab, tmp_path):
    clone, env = clone_and_set_up(lab, tmp_path)
    add_parts(clone)
    done = make(clone, env, "test", "ARGS=-rA")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    passed = set(re.findall(r"^PASSED tests/test_parts\.py::(\w+)\[([\w=]+)\]", out, re.MULTILINE))
    checked = {option for _, option in passed}
    mine = {"crossings", "bce", "sam", "label_recall", "callbacks=label_log"}
    assert mine <= checked, sorted(passed)
    metric = "test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes"
    assert (metric, "label_recall") in passed and "DeprecationWarning" not in out
    assert not (clone / "tests" / "conftest.py").exists()

    # Two breaks of the promises, each named in a few lines (the traceback needs -v).
    (clone / "src" / LAB / "shifted.py").write_text(ADDED_DATASETS.format(name=LAB))
    stripes = (clone / "conf" / "data" / "stripes.yaml").read_text()
    for option, global_draw in (("steady", "false"), ("jitter", "true")):
        yaml = stripes.replace(f"{LAB}.stripes.stripes", f"{LAB}.shifted.shifted")
        (clone / "conf" / "data" / f"{option}.yaml").write_text(
            yaml.replace("noise: 0.1", f"global_draw: {global_draw}")
        )
    (clone / "src" / LAB / "alternating.py").write_text(ADDED_OBJECTIVE)
    (clone / "conf" / "objective" / "alternating.yaml").write_text(
        f"_target_: {LAB}.alternating.Alternating\n"
    )
    done = make(clone, env, "test", "ARGS=-rA -k 'steady or jitter or alternating'")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-4000:]
    failed = kit_failures(out)
    assert {option for _, option in failed} == {"jitter", "alternating"}, out[-4000:]
    for (_, option), report in failed.items():
        assert len(report.strip().splitlines()) <= 6, report  # a few lines, no traceback
        assert f"={option}" in report and "Traceback" not in report, report
    item = failed["test_data_gives_the_same_item_every_time_an_index_is_read", "jitter"]
    assert re.search(r"data=jitter: \w+ item \d+ read twice gave other pixels", item)
    assert "no draws from torch's, numpy's or Python's global generators" in item
    world = failed["test_objective_gives_the_same_steps_on_1_and_2_processes", "alternating"]
    assert "objective=alternating: 1 and 2 processes trained differently, first at step 1" in world
    kill = failed["test_objective_resumes_bit_for_bit_after_a_kill", "alternating"]
    assert "killed and rerun, it trained differently" in kill and "state_dict()" in kill
    steady = {
        check
        for check, option in re.findall(
            r"^PASSED tests/test_parts\.py::(\w+)\[(\w+)\]", out, re.MULTILINE
        )
        if option == "steady"
    }
    assert len(steady) == 3, out[-4000:]


def scratch_template(into: Path) -> Path:
    """A git copy of this checkout as it is (uncommitted changes included, as the project's
    engine was built from them): the template a project upgrades to, one commit at a time."""
    tree = into / "template"
    for rel in load_script().template_files():
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_symlink():
            target.symlink_to(os.readlink(ROOT / rel))
        else:
            shutil.copyfile(ROOT / rel, target)
    git("init", "--quiet", cwd=tree)
    commit(tree, "as the project's engine")
    return tree


def commit(tree: Path, message: str) -> None:
    git("add", "--all", cwd=tree)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", message, cwd=tree)


ENGINE_RECORDS = ("uv.lock", "pyproject.toml", "README.md")  # where an upgrade writes


def users_files(project: Path) -> dict[str, bytes]:
    """Every tracked file but the engine's wheel and the files that record the engine."""
    tracked = git("ls-files", cwd=project).split()
    return {
        rel: (project / rel).read_bytes()
        for rel in tracked
        if not rel.startswith("engine/") and rel not in ENGINE_RECORDS
    }


@pytest.mark.e2e
@pytest.mark.slow
def test_an_upgrade_says_identical_or_explains_what_differs(lab, tmp_path):
    clone, env = clone_and_set_up(lab, tmp_path)
    (clone / "src" / LAB / "shifted.py").write_text(ADDED_DATASETS.format(name=LAB))  # the user's
    commit(clone, "a dataset of mine")
    template = scratch_template(tmp_path)
    mine = users_files(clone)

    def upgrade(message: str, change: Callable[[Path], None], *args: str):
        change(template)
        commit(template, message)
        command = ["make", "upgrade", f"ENGINE={template}@HEAD", *args]
        return subprocess.run(
            command, cwd=clone, env=env, capture_output=True, text=True, timeout=1200
        )

    def a_comment(tree: Path) -> None:
        with (tree / "src" / TEMPLATE / "train.py").open("a") as handle:
            handle.write("# a comment that changes no result\n")

    done = upgrade("a doc fix", a_comment)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the default config: identical (8 steps)" in done.stdout
    assert users_files(clone) == mine
    first = git("rev-parse", "--short=12", "HEAD", cwd=template).strip()
    for record in ("pyproject.toml", "README.md"):  # the new engine's commit, recorded
        assert first in (clone / record).read_text(), record
    where = f"import importlib.util; print(importlib.util.find_spec('{TEMPLATE}.train').origin)"
    installed = subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-c", where],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    source = Path(installed.stdout.strip()).read_text()
    assert "a comment that changes no result" in source  # the new engine is in use
    commit(clone, "the engine with a doc fix")

    def another_lr(tree: Path) -> None:
        sgd = tree / "src" / TEMPLATE / "conf" / "optimizer" / "sgd.yaml"
        sgd.write_text(re.sub(r"(?m)^lr: .*$", "lr: 0.0123", sgd.read_text()))

    old_lr = re.search(
        r"(?m)^lr: (.*)$",
        (template / "src" / TEMPLATE / "conf" / "optimizer" / "sgd.yaml").read_text(),
    ).group(1)
    done = upgrade("another default lr", another_lr, "ARGS=experiments=all")
    out = done.stdout
    assert done.returncode != 0, out[-3000:] + done.stderr[-3000:]  # make: 2
    assert "the default config: differs, first at step 1:" in out, out[-3000:]
    assert f"    optimizer.lr: {float(old_lr)} -> 0.0123" in out, out[-3000:]
    assert "experiment=mixer_adamw: identical (8 steps)" in out  # adamw: no lr of sgd's
    second = git("rev-parse", "--short=12", "HEAD", cwd=template).strip()
    assert (
        f"the template's commits from {first} to {second}:\n  {second} another default lr\n" in out
    )
    assert f'git commit -am "Engine @ {second} [changes results]"' in out
    assert "roll back: git checkout -- engine uv.lock pyproject.toml README.md" in out
    assert users_files(clone) == mine and second in (clone / "README.md").read_text()
