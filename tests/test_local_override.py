"""conf/local/default.yaml: this machine's settings, loaded when present, ignored by git."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from conftest import CONF, ROOT


def readme_example() -> str:
    """The example local file that the README shows (marked `tested: local-default`), so the
    two cannot drift apart."""
    readme = ROOT.joinpath("README.md").read_text()
    return re.search(r"<!-- tested: local-default -->\n```yaml\n(.*?)```", readme, re.DOTALL).group(
        1
    )


@pytest.fixture
def conf(tmp_path) -> Path:
    """A copy of conf/ without any local file this machine may have."""
    copy = tmp_path / "conf"
    shutil.copytree(CONF, copy)
    (copy / "local" / "default.yaml").unlink(missing_ok=True)
    return copy


def compose_from(conf: Path, *overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def test_without_a_local_file_nothing_changes(conf, tmp_path):
    without = shutil.copytree(conf, tmp_path / "without_local")
    text = (without / "engine.yaml").read_text()  # the defaults list config.yaml composes
    dropped = re.sub(r"\n  - optional local: default[^\n]*", "", text)
    assert dropped != text
    (without / "engine.yaml").write_text(dropped)
    assert compose_from(conf) == compose_from(without)


def test_the_readme_example_is_loaded_and_wins_over_defaults_and_experiments(conf):
    (conf / "local" / "default.yaml").write_text(readme_example())
    cfg = compose_from(conf, "experiment=cifar10_resnet18", hydra=True)
    assert cfg.dataloader.num_workers == 6  # a group choice: dataloader=fast
    assert cfg.data.root == "/scratch/me/cifar10"  # a value, over the experiment's
    assert cfg.hydra.run.dir.startswith("/scratch/me/runs/")


def test_the_command_line_wins_over_the_local_file(conf):
    (conf / "local" / "default.yaml").write_text(readme_example())
    cfg = compose_from(conf, "dataloader=debug", "data.root=/elsewhere")
    assert cfg.dataloader.num_workers == 0 and cfg.data.root == "/elsewhere"  # debug


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_git_ignores_the_local_file_but_keeps_its_folder():
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    # conf/ is a link to the package's conf/, where git sees the files.
    assert ignored("src/repro/conf/local/default.yaml")
    assert not ignored("src/repro/conf/local/.gitkeep")
