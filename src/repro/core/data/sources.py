"""Image sources: indexable collections of (uint8 CHW image, label), before any transform."""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from repro.core.errors import DataError
from repro.core.guards import received


class Source(Protocol):
    """One split: what a data builder returns three of (repro.core.data.datasets.Splits)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]: ...  # uint8 CHW, label

    def subset(self, indices: torch.Tensor) -> Source: ...  # these images, in this order


def in_memory(source: Source) -> TensorImages | None:
    """The split as one uint8 (N, C, H, W) tensor and its labels, where its source holds it
    so (a `tensors()` method, as TensorImages has), else None. Such a split takes the fast
    paths: whole-batch augmentation, `dataloader=device`, a digest of the tensor."""
    tensors = getattr(source, "tensors", None)
    return TensorImages(*tensors()) if callable(tensors) else None


class TensorImages:
    """Images already in memory as one uint8 (N, C, H, W) tensor (synthetic, CIFAR-10), and
    their targets: class indices (N,), or one row per image (multi-hot, soft labels ...)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        assert images.dtype == torch.uint8 and images.dim() == 4
        indices = (
            labels.dim() == 1 and not labels.is_floating_point() and labels.dtype != torch.bool
        )
        self.images, self.labels = images, labels.long() if indices else labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        label = self.labels[index]
        return self.images[index], int(label) if label.dim() == 0 else label

    def subset(self, indices: torch.Tensor) -> TensorImages:
        return TensorImages(self.images[indices], self.labels[indices])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images, self.labels


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm"}
# Decoded by torchvision.io (libjpeg-turbo, libpng ...): on CIFAR-10 JPEGs 2.4-3x faster than
# PIL here, with the same pixels. The others go through PIL, as everything will once
# torchvision drops its decoders (deprecated in 0.29 in favour of TorchCodec, which needs
# FFmpeg on the machine); until then its warning, once per image, is silenced.
TORCHVISION_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}
warnings.filterwarnings(
    "ignore", "The image decoding and encoding capabilities of TorchVision", DeprecationWarning
)


@functools.cache
def torchvision_decoder() -> Any:
    """torchvision.io's decoder to RGB; None for a torchvision without its own decoders (PIL then
    decodes every file). Imported on first use, not with this module: every run imports this
    module, and runs on in-memory data (the built-in dataset, CIFAR-10) decode no file."""
    try:
        from torchvision.io import ImageReadMode, decode_image
    except ImportError:
        return None
    return functools.partial(decode_image, mode=ImageReadMode.RGB)


def decode_file(path: Path) -> torch.Tensor:
    """An image file as a uint8 RGB (3, H, W) tensor; DataError naming the file if unreadable."""
    try:
        data = received.read_bytes(path, "image")
        received.check_pixels(data, path)
    except received.ReceivedFileError as error:
        raise DataError(str(error)) from None
    try:
        if path.suffix.lower() in TORCHVISION_SUFFIXES and (decode := torchvision_decoder()):
            return decode(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        with Image.open(io.BytesIO(data)) as image:
            pixels = np.asarray(image.convert("RGB"))
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()
    except (UnidentifiedImageError, OSError, RuntimeError) as error:
        raise DataError(f"{path}: not a readable image ({error.__class__.__name__})") from None


def stack_targets(targets: torch.Tensor | Sequence[Any]) -> torch.Tensor:
    """Targets as one tensor, as the dataset gave them: class indices as int64, tensors (a
    multi-hot row, soft labels) stacked with their own dtype."""
    if isinstance(targets, torch.Tensor):
        return targets
    if len(targets) and isinstance(targets[0], torch.Tensor):
        return torch.stack(list(targets))
    return torch.tensor(list(targets), dtype=torch.int64)


def target_text(target: Any) -> str:
    """A target as text for a digest or a comparison: a class index as its number, a tensor
    (a multi-hot row, soft labels) as its dtype, shape and values."""
    if isinstance(target, torch.Tensor) and target.dim() > 0:
        return f"{str(target.dtype).removeprefix('torch.')}{tuple(target.shape)}{target.tolist()}"
    return str(int(target))


class ImageFiles:
    """Image files on disk, decoded to RGB on access (`decode_file`), and a target for each
    (a class index, or a tensor such as a multi-hot row)."""

    def __init__(self, paths: list[Path], labels: list[Any]) -> None:
        self.paths, self.labels = paths, labels
        torchvision_decoder()  # imported here, so that forked workers inherit it

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, indices: torch.Tensor) -> ImageFiles:
        chosen = indices.tolist()
        return ImageFiles([self.paths[i] for i in chosen], [self.labels[i] for i in chosen])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        return decode_file(self.paths[index]), self.labels[index]

    @classmethod
    def from_folder(cls, root: Path, classes: list[str]) -> ImageFiles:
        """Every image under root/<class>/, classes in the given order."""
        paths: list[Path] = []
        labels: list[int] = []
        for label, name in enumerate(classes):
            found = (root / name).rglob("*")
            files = sorted(p for p in found if p.suffix.lower() in IMAGE_SUFFIXES)
            paths += files
            labels += [label] * len(files)
        return cls(paths, labels)
