"""`data.cache=memory`: image files decoded once, in parallel, into one uint8 tensor.

Each image goes through the deterministic part of the pipeline here (its shorter side resized
to `data.resize`, or to `data.image_size` when that is null), so that a cached split holds
exactly what the per-sample path would produce before its random steps, and then takes the
in-memory fast paths (whole-batch crop and flip, `dataloader=device`). Images that still
differ in size after that (other aspect ratios) are centre-cropped to squares when
`data.resize` is set, and refused when it is not.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from rich.progress import Progress

from repro.data.sources import ImageFiles, TensorImages
from repro.data.transforms import CenterCrop, ResizeShorter
from repro.errors import ConfigError

if TYPE_CHECKING:
    from repro.data.datasets import Splits

GIB = 2**30


def decode_splits(splits: Splits, data_cfg: Any) -> Splits:
    """Every image-file split of `splits` decoded into memory (a split used twice, once)."""
    decoded: dict[int, TensorImages] = {}
    for name in ("train", "val", "test"):
        source = getattr(splits, name)
        if isinstance(source, ImageFiles) and id(source) not in decoded:
            decoded[id(source)] = decode(source, data_cfg, name)
    if not decoded:
        return splits
    sources = {name: getattr(splits, name) for name in ("train", "val", "test")}
    chosen = {name: decoded.get(id(source), source) for name, source in sources.items()}
    return replace(splits, **chosen, resized=True)


def decode(files: ImageFiles, data_cfg: Any, name: str = "split") -> TensorImages:
    """One split of image files as a uint8 (N, C, H, W) tensor, resized as the pipeline would."""
    side = data_cfg.resize or data_cfg.image_size
    resize = ResizeShorter(side)
    budget = float(data_cfg.cache_budget_gib) * GIB

    def load(index: int) -> torch.Tensor:
        return resize(files[index][0], None)

    first = load(0)
    estimate = len(files) * first.numel()
    if estimate > budget:
        _refuse_budget(data_cfg, len(files), estimate, name)
    images: list[torch.Tensor] = [first]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool, _progress() as progress:
        task = progress.add_task(f"decoding {name}", total=len(files), completed=1)
        for image in pool.map(load, range(1, len(files)), chunksize=64):
            images.append(image)
            progress.advance(task)
    shapes = {tuple(image.shape) for image in images}
    if len(shapes) > 1:
        if data_cfg.resize is None:
            examples = ", ".join("x".join(map(str, shape[1:])) for shape in sorted(shapes)[:3])
            allowed = (
                f"a size to cache {name} images of several sizes ({examples} ...) with "
                "data.cache=memory (or data.cache=none)"
            )
            raise ConfigError("data.resize", None, allowed)
        square = CenterCrop(side)
        images = [square(image, None) for image in images]
    total = len(images) * images[0].numel()
    if total > budget:
        _refuse_budget(data_cfg, len(images), total, name)
    labels = torch.tensor(files.labels, dtype=torch.long)
    return TensorImages(torch.stack(images), labels)


def _refuse_budget(data_cfg: Any, count: int, size: float, name: str) -> None:
    allowed = (
        f"at least {size / GIB:.2f} GiB to cache the {count} decoded {name} images "
        "(or data.cache=none)"
    )
    raise ConfigError("data.cache_budget_gib", data_cfg.cache_budget_gib, allowed)


def _progress() -> Progress:
    """A bar on a terminal; nothing in a log file."""
    return Progress(transient=True, disable=not sys.stdout.isatty())
