"""`data.cache=memory`: image files decoded once, by worker processes, into one uint8 tensor.

Each image goes through the deterministic part of the pipeline here (its shorter side resized
to `data.resize`, or to `data.image_size` when that is null), so that a cached split holds
exactly what the per-sample path would produce before its random steps, and then takes the
in-memory fast paths (whole-batch crop and flip, `dataloader=device`). Images that still
differ in size after that (other aspect ratios) are centre-cropped to squares when
`data.resize` is set, and refused when it is not.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from repro.core.data.sources import Source, TensorImages, stack_targets
from repro.core.data.transforms import CenterCrop, ResizeShorter
from repro.core.data.workers import start_worker
from repro.core.errors import ConfigError
from repro.core.runtime.progress import progress_bar

GIB = 2**30
CHUNK = 256  # images per piece of work
PARALLEL_FROM = 2048  # fewer images decode faster than worker processes start
MAX_WORKERS = 8


def decode(
    files: Source, data_cfg: Any, name: str = "split", progress: str = "auto"
) -> TensorImages:
    """One split of image files as a uint8 (N, C, H, W) tensor, resized as the pipeline would."""
    side = data_cfg.resize or data_cfg.image_size
    budget = float(data_cfg.cache_budget_gib) * GIB
    resized = _Resized(files, side)
    # The first image sizes the split: the others, once squared to `side`, are no larger.
    estimate = len(files) * resized[0].numel()
    if estimate > budget:
        _refuse_budget(data_cfg, len(files), estimate, name)
    images: list[torch.Tensor] = []
    with progress_bar(progress) as bar:
        task = bar.add_task(f"decoding {name}", total=len(files))
        for chunk in _decoder(resized):
            images.extend(chunk)
            bar.advance(task, len(chunk))
    if any(image.shape != images[0].shape for image in images):
        if data_cfg.resize is None:
            shapes = sorted({tuple(image.shape[1:]) for image in images})
            examples = ", ".join("x".join(map(str, shape)) for shape in shapes[:3])
            allowed = (
                f"a size to cache {name} images of several sizes ({examples} ...) with "
                "data.cache=memory (or data.cache=none)"
            )
            raise ConfigError("data.resize", None, allowed)
        square = CenterCrop(side)
        images = [square(image, None) for image in images]
    return TensorImages(torch.stack(images), stack_targets(_labels(files)))


def _labels(source: Source) -> list[Any]:
    """A split's labels: its `labels` list where it keeps one (image files), else read."""
    labels = getattr(source, "labels", None)
    return list(labels) if labels is not None else [source[i][1] for i in range(len(source))]


class _Resized(Dataset):
    def __init__(self, files: Source, side: int) -> None:
        self.files, self.resize = files, ResizeShorter(side)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.resize(self.files[index][0], None)


def _decoder(resized: _Resized) -> DataLoader:
    """Chunks of decoded images, made by worker processes: small images decode faster than
    the GIL lets threads share them out."""
    workers = min(os.cpu_count() or 1, MAX_WORKERS) if len(resized) >= PARALLEL_FROM else 0
    options: dict[str, Any] = {}
    if workers:
        options = {
            "worker_init_fn": start_worker,
            "multiprocessing_context": multiprocessing.get_all_start_methods()[0],
        }
    return DataLoader(resized, CHUNK, num_workers=workers, collate_fn=_stacked, **options)


def _stacked(images: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """A chunk in one tensor (one shared-memory block from a worker) when it has one size."""
    if all(image.shape == images[0].shape for image in images):
        return torch.stack(images)
    return images


def _refuse_budget(data_cfg: Any, count: int, size: float, name: str) -> None:
    allowed = (
        f"at least {size / GIB:.2f} GiB to cache the {count} decoded {name} images "
        "(or data.cache=none)"
    )
    raise ConfigError("data.cache_budget_gib", data_cfg.cache_budget_gib, allowed)
