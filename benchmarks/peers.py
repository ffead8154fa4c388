"""suite=peers: the fast recipes beside the best peers, on the same images, in one call.

    python -m benchmarks suite=peers data=imagefolder data.root=IMAGES [suite.timm_train=PATH]

(a) airbench94 (the `airbench` package, 0.1.8) against `experiment=cifar10_airbench`. The
image folder's train/ and test/ splits are written as the two files airbench's CifarLoader
reads (`cifar10/train.pt`, `cifar10/test.pt`: uint8 N x 32 x 32 x 3 images, int64 labels,
class names), so both train on the same pixels. Seeds alternate between the two (peer, ours,
ours, peer, ...), each run a fresh process; the first run of each side is its warm-up (cold
caches, autotuning), reported apart and left out of the means. airbench94 is timed with CUDA
events around `train94` (the whitening fit and training, no evaluation) and tested with its
own test-time augmentation; ours reports `train_s` and `test_acc` from summary.json.
`+suite.ours='["trainer.tta=flip"]'` adds overrides to our side of (a) alone: the recipe's
airbench94 ablations (components.whiten_bias.epochs=null ...), keys the suite's own config
does not have.
(b) timm's `train.py` (a script of timm's repository, `suite.timm_train`) against
`experiment=cifar10_resnet18 preset=fast dataloader=device`: images per second over the
steady window (timm's logged rates after its first epoch; ours from metrics.csv after the
first evaluation).

airbench94 is CUDA-only. Without a GPU the suite refuses, unless `suite.cpu=true`: then it
writes and checks the peer's files, runs our side on a few steps, and reports each peer as
not run, which is what the tests exercise.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torchvision import datasets
from torchvision.io import ImageReadMode, decode_image

from benchmarks.common import Column, Result, train_overrides
from repro.core.errors import ConfigError, UserError

COLUMNS = [
    Column("part", "part"),
    Column("side", "side"),
    Column("seed", "seed"),
    Column("train_s", "train s", "{:.2f}"),
    Column("test_acc", "test acc", "{:.4f}"),
    Column("images_per_s", "img/s", "{:.0f}"),
    Column("note", "note"),
]
# Enough for a test on a CPU: our side only, a few steps of a narrow network.
CPU_RUN = ["trainer.max_steps=2", "trainer.batch_size=16", "trainer.eval_batch_size=64",
           "model.widths=[8,16,16]", "model.fit_images=16", "trainer.device=cpu", "amp=off",
           "cudnn=default", "logger.plot=false", "logger.progress=off"]  # fmt: skip
# timm train.py's settings on our side: its resnet18 (random weights), batch 512, bf16,
# channels_last, two epochs; our fast loader (batches made on the GPU).
TIMM_MODEL = ["model=timm", "model.name=resnet18", "model.pretrained=false",
              "trainer.batch_size=512", "trainer.epochs=2", "amp=bf16",
              "memory_format=channels_last", "dataloader=device", "cudnn=benchmark"]  # fmt: skip
TIMM_RATE = re.compile(
    r"^Train: (\d+) .*?Time: [\d.]+s,\s*[\d.]+/s\s+\([\d.]+s,\s*([\d.]+)/s\)", re.MULTILINE
)

AIRBENCH_RUN = """
import json, sys, torch, airbench
from airbench.lib_airbench94 import hyp
torch.manual_seed(int(sys.argv[1]))
train = airbench.CifarLoader("cifar10", train=True, batch_size=hyp["opt"]["batch_size"],
                             aug=hyp["aug"], altflip=True)
test = airbench.CifarLoader("cifar10", train=False, batch_size=2000)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
model = airbench.train94(train, verbose=False)
end.record()
torch.cuda.synchronize()
accuracy = airbench.evaluate(model, test, tta_level=hyp["net"]["tta_level"])
print(json.dumps({"train_s": start.elapsed_time(end) / 1e3, "test_acc": accuracy}))
"""


def export_for_airbench(root: Path, folder: Path) -> dict[str, int]:
    """`root`'s train/ and test/ splits as airbench's `train.pt` and `test.pt` in `folder`:
    uint8 N x H x W x 3 images, int64 labels, the class names (torchvision's order, which is
    ours: sorted folder names). Returns the image count of each split."""
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, name in (("train", "train.pt"), ("test", "test.pt")):
        if not (root / split).is_dir():
            raise ConfigError("data.root", str(root), f"an image folder with {split}/<class>/")
        tree = datasets.ImageFolder(str(root / split))
        images = torch.stack([
            decode_image(path, mode=ImageReadMode.RGB).permute(1, 2, 0) for path, _ in tree.samples
        ])  # fmt: skip
        labels = torch.tensor(tree.targets, dtype=torch.int64)
        torch.save({"images": images, "labels": labels, "classes": tree.classes}, folder / name)
        counts[split] = len(labels)
    return counts


def timm_images_per_second(log: str) -> float | None:
    """timm's images per second over its last epoch after the first (the warm-up): the running
    average on that epoch's last log line, data waits included, as our rate is. (The first
    rate on a line is one batch's, which leaves out the waits between batches.)"""
    averages = [(int(epoch), float(rate)) for epoch, rate in TIMM_RATE.findall(log)]
    steady = [rate for epoch, rate in averages if epoch > 0]
    return steady[-1] if steady else None


def run(cfg: DictConfig, run_dir: Path) -> Result:
    suite = cfg.suite
    cuda = torch.cuda.is_available() and cfg.trainer.device != "cpu"
    if not cuda and not suite.cpu:
        raise UserError(
            "suite=peers: the peers run on a GPU only (airbench94 is CUDA-only) and none is "
            "here; suite.cpu=true runs the suite's own small check instead"
        )
    if not str(cfg.data.get("_target_", "")).endswith(".imagefolder") or not cfg.data.root:
        allowed = "data=imagefolder data.root=IMAGES (CIFAR-10 as train/ and test/ folders)"
        raise ConfigError("data", cfg.data.get("_target_"), allowed)
    root = Path(str(cfg.data.root)).expanduser()
    counts = export_for_airbench(root, run_dir / "peer_data" / "cifar10")
    rows = _airbench_part(suite, run_dir, cuda) + _timm_part(suite, root, run_dir, cuda)
    summary = _summary(rows) | {"images": counts, "cpu_mode": not cuda, "ours": _ours_extra(suite)}
    notes = [
        "each run a fresh process; the first of each side is its warm-up, out of the means",
        "airbench94: CUDA events around train94 (whitening fit and training); ours: train_s",
    ]
    return Result("peers", COLUMNS, rows, summary, notes)


def _ours_extra(suite: DictConfig) -> list[str]:
    """`suite.ours`: overrides for our side of the airbench part only (an ablation)."""
    extra = suite.get("ours") or []
    if isinstance(extra, str) or not all(isinstance(item, str) for item in extra):
        raise ConfigError("suite.ours", extra, "a list of overrides: '[\"trainer.tta=flip\"]'")
    return list(extra)


def _airbench_part(suite: DictConfig, run_dir: Path, cuda: bool) -> list[dict[str, Any]]:
    peer_ready = cuda and _importable("airbench", suite)
    extra = _ours_extra(suite)
    rows = []
    for index, seed in enumerate(range(int(suite.seeds) + 1)):  # seed 0: the warm-ups
        order = ("airbench94", "ours") if index % 2 == 0 else ("ours", "airbench94")
        for side in order:
            row = {"part": "airbench", "side": side, "seed": seed,
                   "note": "warm-up" if seed == 0 else ""}  # fmt: skip
            if side == "ours":
                folder = run_dir / "ours" / f"seed-{seed}"
                row |= _ours("cifar10_airbench", seed, folder, cuda, extra)
            elif peer_ready:
                row |= _airbench(seed, run_dir / "peer_data", suite)
            else:
                row["note"] = "not run: needs CUDA and the airbench package (0.1.8)"
            rows.append(row)
        if not cuda:
            break  # the CPU check: one seed of ours is enough
    return rows


def _timm_part(suite: DictConfig, root: Path, run_dir: Path, cuda: bool) -> list[dict[str, Any]]:
    """timm's train.py and ours on the same model (timm's resnet18, random weights), batch 512,
    bf16, channels_last, two epochs of the image folder: images per second after epoch 0."""
    script = suite.get("timm_train")
    peer: dict[str, Any] = {"part": "timm", "side": "timm train.py", "seed": 0}
    ours: dict[str, Any] = {"part": "timm", "side": "ours", "seed": 0}
    if not script or not cuda:
        peer["note"] = "not run: needs CUDA and suite.timm_train (timm's train.py)"
        return [peer]
    command = [suite.get("peer_python") or sys.executable, str(script), "--data-dir",
               str(root), "--val-split", "test", "--model", "resnet18", "--num-classes", "10",
               "--img-size", "32", "--batch-size", "512", "--epochs", "2", "--amp",
               "--amp-dtype", "bfloat16", "--channels-last", "--log-interval", "10", "-j", "12",
               "--pin-mem",
               "--output", str(run_dir / "timm_out")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=int(suite.timeout_s))
    (run_dir / "timm_train.log").write_text(done.stdout + done.stderr)
    peer["images_per_s"] = timm_images_per_second(done.stdout + done.stderr)
    peer["note"] = "" if done.returncode == 0 else f"exit {done.returncode}"
    folder = run_dir / "ours" / "timm_resnet18"
    ours |= _ours("cifar10_resnet18", 0, folder, cuda, TIMM_MODEL)
    ours["images_per_s"] = _steady_rate(folder / "metrics.csv")
    if peer.get("images_per_s") and ours.get("images_per_s"):
        ours["note"] = f"{ours['images_per_s'] / peer['images_per_s']:.2f}x timm train.py"
    return [peer, ours]


def _steady_rate(metrics: Path) -> float | None:
    """Our images per second after the first evaluation (each metrics row measures the steps
    since the one before it, so the first row holds the warm-up: cuDNN autotuning, caches)."""
    if not metrics.is_file():
        return None
    with metrics.open() as lines:
        rates = [float(row["images_per_s"]) for row in csv.DictReader(lines)]
    return statistics.median(rates[1:]) if len(rates) > 1 else None


def _ours(
    experiment: str, seed: int, folder: Path, cuda: bool, extra: list[str] | None = None
) -> dict[str, Any]:
    command = [sys.executable, "-m", "repro.train", f"experiment={experiment}",
               *train_overrides(), f"seed={seed}", "trainer.resume=never", *(extra or []),
               f"hydra.run.dir={folder}", *([] if cuda else CPU_RUN)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"note": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
    summary = json.loads((folder / "summary.json").read_text())
    return {"train_s": summary["train_s"], "test_acc": summary.get("test_acc")}


def _airbench(seed: int, folder: Path, suite: DictConfig) -> dict[str, Any]:
    python = suite.get("peer_python") or sys.executable
    done = subprocess.run([python, "-c", AIRBENCH_RUN, str(seed)], cwd=folder,
                          capture_output=True, text=True, timeout=int(suite.timeout_s))  # fmt: skip
    if done.returncode != 0:
        return {"note": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _importable(module: str, suite: DictConfig) -> bool:
    python = suite.get("peer_python") or sys.executable
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side of the airbench part: mean and spread of test accuracy and seconds, without
    the warm-ups; the ratios where both sides ran."""
    found: dict[str, Any] = {}
    for side in ("ours", "airbench94"):
        timed = [r for r in rows if r["side"] == side and r["seed"] and "train_s" in r]
        if len(timed) >= 2:
            accuracy = [r["test_acc"] for r in timed]
            found[side] = {
                "runs": len(timed),
                "test_acc_mean": statistics.mean(accuracy),
                "test_acc_stdev": statistics.stdev(accuracy),
                "train_s_mean": statistics.mean(r["train_s"] for r in timed),
            }
    if "ours" in found and "airbench94" in found:
        ours, peer = found["ours"], found["airbench94"]
        found["accuracy_points_over_peer"] = 100 * (ours["test_acc_mean"] - peer["test_acc_mean"])
        found["time_over_peer"] = ours["train_s_mean"] / peer["train_s_mean"]
    return found
