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
from pathlib import Path

import numpy as np
from PIL import Image

from conftest import ROOT

SMALL = [
    "trainer.max_steps=2", "trainer.batch_size=8", "trainer.eval_batch_size=32",
    "dataloader=debug", "logger.plot=false", "logger.progress=off",
]  # fmt: skip


def block(marker: str) -> str:
    """The fenced code block that follows `<!-- tested: MARKER -->` in the README."""
    readme = (ROOT / "README.md").read_text()
    found = re.findall(rf"<!-- tested: {marker} -->\n```\w*\n(.*?)```", readme, re.DOTALL)
    assert len(found) == 1, f"expected one block marked {marker!r} in README.md"
    return found[0]


def make_images(root: Path) -> Path:
    """Two classes (dark, bright) of small PNGs of uneven sizes, in train/ and val/."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("val", 4)):
        for label, level in (("dark", 60), ("bright", 190)):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                size = (int(rng.integers(36, 56)), int(rng.integers(36, 56)), 3)
                pixels = np.clip(rng.normal(level, 30, size), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def test_the_bring_your_own_commands_train(tmp_path):
    model_code = block("byo-model")
    module_name = re.match(r"# (\w+\.py)\n", model_code).group(1)
    (tmp_path / module_name).write_text(model_code)
    script, replaced = re.subn(
        r"^IMAGES=.*$", f"IMAGES={make_images(tmp_path / 'images')}", block("byo"), flags=re.M
    )
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
        assert json.loads(path.read_text())["completed"]
        resolved = (path.parent / "resolved_config.yaml").read_text()
        targets |= set(re.findall(r"_target_: (\S+)", resolved))
        assert "num_classes: 2" in resolved  # inferred from the generated class folders
    assert {"torchvision.models.mobilenet_v3_small", "mynets.tiny_net"} <= targets
