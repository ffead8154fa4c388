"""The README's "Bring your own model and dataset" commands, run as written on a tiny image tree.

The blocks come out of README.md (marked `<!-- tested: byo -->` and `<!-- tested: byo-model -->`),
so the section and this test cannot drift apart. Only two things change: IMAGES points at a
generated folder, and every `python` call gets overrides appended that cut it to two steps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, make_image_tree

SMALL = [
    "trainer.max_steps=2", "trainer.batch_size=8", "trainer.eval_batch_size=32",
    "dataloader=debug", "logger.plot=false", "logger.progress=off",
    "trainer.test_weights=last",  # the tree's 8 validation images: too few to select by
]  # fmt: skip
CLASSES = ("circle", "bar")  # two class folders: num_classes must come out as 2


def block(marker: str) -> str:
    """The fenced code block that follows `<!-- tested: MARKER -->` in the README."""
    readme = (ROOT / "README.md").read_text()
    found = re.findall(rf"<!-- tested: {marker} -->\n```\w*\n(.*?)```", readme, re.DOTALL)
    assert len(found) == 1, f"expected one block marked {marker!r} in README.md"
    return found[0]


@pytest.mark.e2e
@pytest.mark.slow  # a whole README walkthrough: 13-15 s, in make test-all
def test_the_bring_your_own_commands_train(tmp_path):
    model_code = block("byo-model")
    module_name = re.match(r"# (\w+\.py)\n", model_code).group(1)
    (tmp_path / module_name).write_text(model_code)
    images = make_image_tree(tmp_path / "images", 16, 4, CLASSES)
    script, replaced = re.subn(r"^IMAGES=.*$", f"IMAGES={images}", block("byo"), flags=re.M)
    assert replaced == 1
    commands = script.count("python -m repro.train")
    assert commands >= 2
    shell = 'set -euo pipefail\npython() { "$PY" "$@" "${SMALL[@]}"; }\n' + script
    env = {**os.environ, "PY": sys.executable, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        ["bash", "-c", f"SMALL=({' '.join(SMALL)})\n{shell}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summaries = sorted((tmp_path / "outputs").rglob("summary.json"))
    assert len(summaries) == commands
    targets = set()
    for path in summaries:
        summary = json.loads(path.read_text())
        assert summary["completed"]
        assert summary["data"]["classes"] == 2  # inferred from the generated class folders
        resolved = (path.parent / "resolved_config.yaml").read_text()
        targets |= set(re.findall(r"_target_: (\S+)", resolved))
    assert {"torchvision.models.mobilenet_v3_small", "mynets.tiny_net"} <= targets
