"""The engine as a package: its config groups travel inside it, so an installed wheel trains
and trusts what it shipped with (docs/engine.md)."""

from __future__ import annotations

import shutil
import subprocess
import zipfile

import pytest

from repro.core.runs import trust

from conftest import CONF, ROOT


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_the_wheel_holds_the_config_groups_but_no_local_file(tmp_path):
    # Built from a copy of the checkout: a local file written into the real conf/ would reach
    # every test composing a config meanwhile (xdist runs them side by side).
    source = tmp_path / "source"
    tracked_files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, tracked_files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name, follow_symlinks=False)
    # a machine's own settings must stay behind even when present
    (source / "src/repro/conf/local/default.yaml").write_text("seed:\n  value: 3\n")
    subprocess.run(
        ["uv", "build", "--wheel", "--quiet", "-o", str(tmp_path), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("repro/conf/") for n in names if n.startswith("repro/conf/")} - {
        "__init__.py"
    }  # a package, for Hydra's pkg:// search path
    tracked = {p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml")}
    assert shipped == {t for t in tracked if not t.startswith("local/")}
    assert "config.yaml" in shipped


def test_an_installed_engine_trusts_its_shipped_conf_but_not_a_local_folder(tmp_path, monkeypatch):
    checkout = trust.conf_targets()  # git-tracked files of this checkout
    # A copy outside any git checkout reads as an installed wheel's files do.
    copy = shutil.copytree(CONF, tmp_path / "conf", ignore=shutil.ignore_patterns("local"))
    (copy / "local").mkdir()
    (copy / "local" / "evil.yaml").write_text("model:\n  _target_: os.system\n")
    monkeypatch.setattr(trust, "CONF", copy)
    trust.conf_targets.cache_clear()
    try:
        assert trust.conf_targets() == checkout
        assert trust.trusted("repro.core.data.datasets.synthetic", "data")
        assert not trust.trusted("os.system", "model")
    finally:
        trust.conf_targets.cache_clear()


def test_the_engines_docs_are_listed_and_printed_and_an_unknown_page_named():
    import sys

    def manual(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "repro.manual", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    listed = manual()
    assert listed.returncode == 0 and "README" in listed.stdout
    pages = {path.stem for path in (ROOT / "docs").glob("*.md")}
    assert {line.split()[0] for line in listed.stdout.splitlines()[1:]} == pages | {"README"}
    assert manual("sweeps").stdout == (ROOT / "docs" / "sweeps.md").read_text()
    assert manual("README.md").stdout == (ROOT / "README.md").read_text()
    unknown = manual("nope")
    assert unknown.returncode != 0 and unknown.stderr.startswith("error: no page named 'nope'")
    assert "Traceback" not in unknown.stderr
