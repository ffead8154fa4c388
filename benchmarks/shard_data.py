"""suite=data on sharded data (`data=shards`): reading from shards against reading the same
images as an image folder.

The folder side is `suite.folder`, the image folder the shards were packed from, or (null)
the shards' images written out as one (train/<class>/, val/<class>/) under the run folder,
untimed: image files' bytes as they are, pixel shards' (`pack --pixels`) as PNGs. Then, per
worker count, images per second of the template's training batches (`build.loaders` then
`to_device`, as the loop receives them) from the shards and from the folder, alternating
(A B B A) so that drift hits both; `shards_over_folder` is the median of the repetitions'
ratios. Bytes per image: what each reads from storage per image (a shard's tar headers and
label members included; a file whole).
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from benchmarks import common
from benchmarks.common import Column, Result
from benchmarks.folder_data import images_per_s
from repro.core import build
from repro.core.data.datasets import Splits
from repro.core.data.loader import LoaderContext
from repro.core.errors import ConfigError
from repro.core.runtime.devices import select_device
from repro.shards.dataset import NPY_MAGIC, decode_bytes

COLUMNS = [
    Column("loader", "workers"),
    Column("shards_images_per_s", "shards images/s", "{:.0f}"),
    Column("folder_images_per_s", "folder images/s", "{:.0f}"),
    Column("shards_over_folder", "shards / folder", "{:.2f}"),
    Column("shard_bytes_per_image", "shard bytes/image", "{:.0f}"),
    Column("folder_bytes_per_image", "folder bytes/image", "{:.0f}"),
]
OWN = ("window", "cache_dir", "cache_gib", "endpoint_url")


def as_folder(data: Splits, root: Path) -> Path:
    """The shards' train and val images as an image folder at `root`: their files' bytes
    unchanged, decoded pixels as PNG (the same pixels)."""
    for split in ("train", "val"):
        source = getattr(data, split)
        for position, row in enumerate(source.rows.tolist()):
            shard, offset, size, label = row[:4]
            path = source.store.path(source.shards[shard])
            with path.open("rb") as handle:
                handle.seek(offset)
                image = handle.read(size)
            if image.startswith(NPY_MAGIC):
                image = encode_png(decode_bytes(image, "a pixel sample"))
            ext = "png" if image.startswith(b"\x89PNG") else "jpg"
            target = root / split / data.classes[label] / f"{position:08d}.{ext}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(image)
    return root


def encode_png(image: Any) -> bytes:
    from torchvision.io import encode_png as encode

    return bytes(encode(image).numpy())


def folder_config(cfg: DictConfig, root: Path) -> DictConfig:
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        for key in OWN:
            cfg.data.pop(key, None)
        cfg.data._target_, cfg.data.root = "repro.core.data.datasets.imagefolder", str(root)
    return cfg


def measure(sides: dict[str, tuple[DictConfig, Splits]], workers: int, suite: Any) -> dict:
    rates: dict[str, list[float]] = {name: [] for name in sides}
    streams = {}
    for name, (cfg, data) in sides.items():
        cfg = copy.deepcopy(cfg)
        cfg.dataloader.num_workers, cfg.dataloader.on_device = workers, False
        device, seed = select_device(cfg.trainer.device), int(cfg.seed.value)
        train, sampler, _ = build.loaders(cfg, data, LoaderContext(seed, device=device))
        streams[name] = (common.endless(train, sampler), build.device_batches(cfg, device))
    try:
        for stream, to_device in streams.values():
            images_per_s(stream, to_device, suite.warmup_batches)
        for repeat in range(suite.repeats):
            names = list(streams) if repeat % 2 == 0 else list(streams)[::-1]
            for name in names:
                stream, to_device = streams[name]
                rates[name].append(images_per_s(stream, to_device, suite.batches))
    finally:
        for stream, _ in streams.values():
            stream.close()
    ratios = [s / f for s, f in zip(rates["shards"], rates["folder"], strict=True)]
    return {
        "loader": workers,
        "shards_images_per_s": statistics.median(rates["shards"]),
        "folder_images_per_s": statistics.median(rates["folder"]),
        "shards_over_folder": statistics.median(ratios),
    }


def run(cfg: DictConfig, run_dir: Path, data: Splits) -> Result:
    suite = cfg.suite
    given = suite.get("folder")
    root = Path(given).expanduser() if given else as_folder(data, run_dir / "as_folder")
    folder_cfg = folder_config(cfg, root)
    folder_data = build.splits(folder_cfg, int(cfg.seed.value))
    if len(folder_data.train) != len(data.train):
        allowed = f"an image folder of the shards' images ({len(data.train)} for training)"
        raise ConfigError("suite.folder", given, allowed)
    train = data.train
    shard_bytes = sum(train.shards[i].size for i in set(train.rows[:, 0].tolist())) / len(train)
    folder_files = list((root / "train").rglob("*.*"))
    folder_bytes = sum(p.stat().st_size for p in folder_files) / len(folder_files)
    sides = {"shards": (cfg, data), "folder": (folder_cfg, folder_data)}
    workers = [loader for loader in suite.loaders if loader != "device"]
    rows = [measure(sides, int(count), suite) for count in workers]
    for row in rows:
        row["shard_bytes_per_image"], row["folder_bytes_per_image"] = shard_bytes, folder_bytes
    summary = {
        "device": str(select_device(cfg.trainer.device)),
        "batch_size": int(cfg.trainer.batch_size),
        "images": len(train),
        "shards_over_folder": {str(row["loader"]): row["shards_over_folder"] for row in rows},
    }
    notes = [
        f"{cfg.data.root}: {len(train)} training images in {len(train.shards)} shards, against "
        f"the same images as the image folder {root}; rates: medians of {suite.repeats} alternating "
        f"repetitions of {suite.batches} batches after {suite.warmup_batches} untimed"
    ]
    return Result("data", COLUMNS, rows, summary, notes)
