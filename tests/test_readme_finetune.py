"""The README's "Fine-tune a pretrained model on your images" command, run as written on a tiny
image tree with a locally saved resnet18 weights file (ImageNet's 1000-class head); the block
marked `<!-- tested: finetune -->`.

Only IMAGES and WEIGHTS change, and overrides are appended that keep it small: 16-pixel images
(`model.image_size=16` instead of resnet18's 224), one batch per epoch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import save_file

from test_readme_byo import block

from conftest import make_image_tree

SMALL = [
    "data.image_size=16", "data.resize=null", "model.image_size=16", "trainer.batch_size=24",
    "trainer.eval_batch_size=24", "dataloader=debug", "memory_format=contiguous",
    "logger.plot=false", "logger.progress=off", "trainer.test_after_fit=false",
]  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow  # a whole README walkthrough: 13-15 s, in make test-all
def test_the_fine_tuning_walkthrough_runs_as_written(tmp_path):
    images = make_image_tree(tmp_path / "images", per_class=8, val_per_class=4, side=16)
    weights = tmp_path / "resnet18.safetensors"
    torch.manual_seed(0)
    save_file(timm.create_model("resnet18").state_dict(), str(weights))
    script = block("finetune")
    for name, value in (("IMAGES", images), ("WEIGHTS", weights)):
        script, replaced = re.subn(rf"^{name}=.*$", f"{name}={value}", script, flags=re.M)
        assert replaced == 1
    shell = 'set -euo pipefail\npython() { "$PY" "$@" "${SMALL[@]}"; }\n' + script
    env = {**os.environ, "PY": sys.executable, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        ["bash", "-c", f"SMALL=({' '.join(SMALL)})\n{shell}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (summary_file,) = (tmp_path / "outputs").rglob("summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["completed"] and summary["step"] == 5
    assert summary["normalisation"] == {
        "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "image_size": 16,
        "interpolation": "bicubic",
    }  # fmt: skip
    log = (summary_file.parent / "train.log").read_text()
    assert "resnet18's head replaced: 1000 -> 3 outputs" in log
