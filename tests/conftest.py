"""Shared helpers: tiny configs, in-process runs and real command-line runs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from repro.core import config, run
from repro.core.runtime import determinism
from repro.core.runtime.launch import expand_seed_shorthand

config.register()  # the schemas and resolvers, as `python -m repro.train` registers them

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# A run that takes a second or two: few images, a narrow model, one epoch.
TINY = [
    "data.train_size=384",
    "data.val_size=128",
    "data.test_size=128",
    "trainer.batch_size=64",
    "trainer.eval_batch_size=128",
    "trainer.epochs=1",
    "model.widths=[8,16]",
    "dataloader=debug",
    "logger.plot=false",
    "logger.fingerprint_every_steps=2",
]

IMAGEFOLDER_EPOCHS = 4
# A small run on an image tree (make_image_tree): 3 classes, a few steps per epoch.
IMAGEFOLDER = [
    "data=imagefolder", "data.image_size=32", "data.resize=36", "trainer.batch_size=12",
    "trainer.eval_batch_size=16", f"trainer.epochs={IMAGEFOLDER_EPOCHS}", "model.widths=[8,16]",
    "dataloader=debug", "logger.plot=false", "optimizer.lr=0.05",
]  # fmt: skip


def tiny(*overrides: str) -> list[str]:
    return [*TINY, *overrides]


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=expand_seed_shorthand(list(overrides)))


def train_in_process(run_dir: Path, *overrides: str) -> dict[str, Any]:
    """Compose the config as the command line would and run one training in this process."""
    cfg = compose_config(*overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run.train(cfg, run_dir)


def run_cli(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
    """Run `python -m module args...` the way a user would."""
    full_env = {**os.environ, "PYTHONHASHSEED": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def torchrun(
    *args: str, nproc: int = 2, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=N -m repro.train args...` on this machine (gloo on a CPU)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "-m", "repro.train", *args,
    ]  # fmt: skip
    full_env = {**os.environ, "PYTHONHASHSEED": "0", **(env or {})}
    return subprocess.run(
        command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def sweep_said(done: subprocess.CompletedProcess, sweep_dir: Path) -> str:
    """What a sweep that failed said, for an assertion's message: the report (stdout), the
    end of stderr, and each failed job's error line and the end of its log."""
    said = [done.stdout[-2000:], done.stderr[-2000:]]
    for error in sorted(sweep_dir.glob("*/error.txt")):
        log = error.parent / "train.log"
        said += [f"{error}: {error.read_text()}", log.read_text()[-2000:] if log.exists() else ""]
    return "\n".join(said)


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


SHAPES = ("circle", "bar", "blank")


def save_as_from_a_gpu(obj: Any, path: Path) -> None:
    """torch.save `obj` with every storage tagged for a device this machine lacks, as a file
    written on a GPU machine reads here: loading it needs a map_location that is here."""
    from torch import serialization

    entry = (-1, lambda storage: "gpu_elsewhere", lambda storage, location: None)
    serialization._package_registry.insert(0, entry)  # torch offers no unregister
    try:
        torch.save(obj, path)
    finally:
        serialization._package_registry.remove(entry)


class Exploit:
    """Unpickling this runs a command that creates `marker`: a file we load must never do that."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (shlex.join(["touch", self.marker]),))


def write_checkpoint(path: Path, stored: dict, seed: int = 7, **extra: Any) -> dict:
    """A checkpoint as a run writes one for the config `stored` (a plain dict), without
    training: a fresh model of `seed` with its biases moved off their start. Returns its state."""
    from omegaconf import OmegaConf

    from repro.core import build
    from repro.core.runs.checkpoint import FORMAT, VERSION, atomic_save

    classes = len(extra.get("classes") or []) or None
    model = build.model(OmegaConf.create(stored), seed, num_classes=classes or 10)
    with torch.no_grad():
        for name, value in model.named_parameters():
            value.add_(0.25 if name.endswith("bias") else 0.0)
    marks = {"format": FORMAT, "version": VERSION, "position": {"step": 3}}
    state = {**marks, "config": stored, "root_seed": seed, "model": model.state_dict(), **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save(state, path)
    return state


def save_test_resnet(file: Path, num_classes: int = 5) -> Path:
    """Weights of timm's small test network (its own normalisation: mean and std 0.5), seeded,
    saved as safetensors: a "pretrained" model that needs no download."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(3)
    save_file(timm.create_model("test_resnet", num_classes=num_classes).state_dict(), str(file))
    return file


class StepCounter:
    """A callback with one hook and state: the steps it saw."""

    def __init__(self) -> None:
        self.steps = 0

    def after_step(self, loop: Any) -> None:
        self.steps += 1

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


def draw_shape(kind: str, height: int, width: int, rng: np.random.Generator) -> Image.Image:
    """A bright circle, a bright vertical bar or nothing, on a dim background of random shade."""
    pixels = np.full((height, width, 3), rng.integers(40, 90), dtype=np.uint8)
    if kind == "circle":
        y, x = np.ogrid[:height, :width]
        pixels[(y - height / 2) ** 2 + (x - width / 2) ** 2 < (min(height, width) / 3) ** 2] = 220
    elif kind == "bar":
        pixels[:, width // 3 : 2 * width // 3] = 220
    return Image.fromarray(pixels)


def make_image_tree(
    root: Path,
    per_class: int = 12,
    val_per_class: int | None = None,
    classes=SHAPES,
    side: int | None = None,
) -> Path:
    """An ImageFolder tree (train/<class>/*.png and val/...) of PNGs that a small network can
    tell apart: of uneven, non-square sizes, or all `side` x `side`."""
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", val_per_class or per_class)):
        for kind in classes:
            folder = root / split / kind
            folder.mkdir(parents=True)
            for i in range(count):
                height, width = (int(length) for length in rng.integers(36, 60, size=2))
                if side is not None:
                    height = width = side
                draw_shape(kind, height, width, rng).save(folder / f"{i}.png")
    return root


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """A fresh image tree of the three shapes, 12 images per class and split."""
    return make_image_tree(tmp_path / "images")


@pytest.fixture(autouse=True)
def restore_torch_globals():
    """Runs in this process change torch's global flags; put them back after each test."""
    flags = determinism.snapshot()
    threads = torch.get_num_threads()
    rng = torch.get_rng_state()
    yield
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.use_deterministic_algorithms(
        flags["deterministic_algorithms"], warn_only=flags["deterministic_warn_only"]
    )
    torch.backends.cuda.matmul.allow_tf32 = flags["tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = flags["tf32_cudnn"]
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)


@pytest.fixture
def s3_in_process(monkeypatch):
    """moto's S3 in this process, with credentials it accepts: a boto3 client to fill it."""
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        yield boto3.client("s3")


def upload(client, folder: Path, bucket: str, prefix: str) -> None:
    """Every file of `folder` into a new bucket under `prefix/`."""
    client.create_bucket(Bucket=bucket)
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
