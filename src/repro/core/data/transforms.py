"""Per-sample image transforms on uint8 CHW tensors.

Random transforms draw only from the `keys` they are handed (`seeding.SampleKeys`: the
sample's stream seed, epoch and index), as pure functions of those keys and a draw number of
their own, never from a global generator: a sample comes out the same whichever worker made
it. Deterministic transforms ignore `keys`.

`Compose.batch` applies the same pipeline to a whole uint8 NCHW batch with tensor ops (on
any device), with the keys of the whole batch as tensors: the draws are the per-sample ones,
computed for every sample at once, so both paths give the same bytes and no Python runs per
sample. The keys may live on the host while the batch is on a GPU: a step then sends its
draws over in one copy (a few kilobytes), which costs a GPU less than hashing them there
in a few dozen small kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.nn import functional

from repro.core.runtime.seeding import SampleKeys
from repro.core.runtime.transfer import host_to_device

Transform = Callable[[torch.Tensor, "SampleKeys | None"], torch.Tensor]

# Each random transform's own draw numbers, so no two draws of a sample coincide.
CROP_TOP, CROP_LEFT, FLIP, TORCHVISION_SEED_LOW, TORCHVISION_SEED_HIGH = 0, 1, 2, 3, 4
CUTOUT_TOP, CUTOUT_LEFT = 5, 6


class Compose:
    def __init__(self, steps: Sequence[Transform]) -> None:
        self.steps = list(steps)

    def __call__(self, image: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        for step in self.steps:
            image = step(image, keys)
        return image

    @property
    def batchable(self) -> bool:
        """Whether every step has a whole-batch form (resizing has none: sizes may differ)."""
        return all(hasattr(step, "batch") for step in self.steps)

    def split(self) -> tuple[Compose, Compose]:
        """(per-sample steps, the longest tail of steps with a whole-batch form): image files
        are decoded and resized one by one, then cropped and flipped as one batch."""
        tail = len(self.steps)
        while tail > 0 and hasattr(self.steps[tail - 1], "batch"):
            tail -= 1
        return Compose(self.steps[:tail]), Compose(self.steps[tail:])

    def batch(self, images: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        """The pipeline on a uint8 (N, C, H, W) batch; `keys` holds the samples' keys."""
        for step in self.steps:
            images = step.batch(images, keys)  # type: ignore[attr-defined]
        return images


def pad(images: torch.Tensor, padding: int, mode: str = "zeros") -> torch.Tensor:
    """`images` (..., H, W) with `padding` pixels added on each side: zeros, the image
    mirrored about its border pixels (`reflect`: ... 2 1 | 0 1 2 ..., as torchvision's
    "reflect"; padding below the side's length) or the border pixels repeated (`edge`)."""
    height, width = images.shape[-2:]
    if mode == "zeros":
        out = images.new_zeros((*images.shape[:-2], height + 2 * padding, width + 2 * padding))
        out[..., padding : padding + height, padding : padding + width] = images
        return out
    rows = _padded_source(height, padding, mode).to(images.device)
    cols = _padded_source(width, padding, mode).to(images.device)
    return images.index_select(-2, rows).index_select(-1, cols)


def _padded_source(length: int, padding: int, mode: str) -> torch.Tensor:
    """For each position of a padded side, the position of the original it copies."""
    position = torch.arange(-padding, length + padding)
    if mode == "edge":
        return position.clamp(0, length - 1)
    position = position.abs()  # reflect: -1 -> 1, and length -> length - 2 below
    return torch.where(position >= length, 2 * (length - 1) - position, position)


class RandomCrop:
    """A random `size` crop after padding each side by `padding` (`pad`'s `mode`; zeros by
    default; a crop inside the image copies nothing)."""

    def __init__(self, size: int, padding: int = 0, mode: str = "zeros") -> None:
        self.size, self.padding, self.mode = size, padding, mode

    def draw(self, keys: SampleKeys | None, height: int, width: int) -> tuple[Any, Any]:
        """The crop's top-left corner in unpadded coordinates (negative inside the padding):
        ints for one sample, tensors for a batch."""
        assert keys is not None
        top = keys.integers(CROP_TOP, height + 2 * self.padding - self.size + 1) - self.padding
        left = keys.integers(CROP_LEFT, width + 2 * self.padding - self.size + 1) - self.padding
        return top, left

    def __call__(self, image: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        _, height, width = image.shape
        top, left = self.draw(keys, height, width)
        if 0 <= top <= height - self.size and 0 <= left <= width - self.size:
            return image[:, top : top + self.size, left : left + self.size]
        top, left = top + self.padding, left + self.padding
        padded = pad(image, self.padding, self.mode)
        return padded[:, top : top + self.size, left : left + self.size]

    def batch(self, images: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        """Every sample's crop in one gather from a window view of the padded batch."""
        n, _, height, width = images.shape
        top, left = self.draw(keys, height, width)
        padded = pad(images, self.padding, self.mode) if self.padding else images
        # (n, C, rows, cols, size, size): every crop position as a view, nothing copied.
        windows = padded.unfold(2, self.size, 1).unfold(3, self.size, 1)
        top, left = on_device_of(images, top + self.padding, left + self.padding)
        samples = torch.arange(n, device=images.device)
        return windows[samples, :, top, left]


class HorizontalFlip:
    """A mirror image with probability `p`; or, with `alternate`, each sample flipped at
    random in the first epoch and then the other way in every epoch after: the network sees
    every image both ways in any two epochs in a row, which random flips leave to chance."""

    def __init__(self, p: float = 0.5, alternate: bool = False) -> None:
        self.p, self.alternate = p, alternate

    def draw(self, keys: SampleKeys | None) -> Any:
        """Whether to flip: a bool for one sample, a bool tensor for a batch."""
        assert keys is not None
        if not self.alternate:
            return keys.below(FLIP, self.p)
        first = replace(keys, epoch=0).below(FLIP, self.p)  # the sample's first-epoch draw
        return first ^ (keys.epoch % 2 == 1)

    def __call__(self, image: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        return image.flip(-1) if self.draw(keys) else image

    def batch(self, images: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        (flips,) = on_device_of(images, self.draw(keys))
        flips = flips.view(-1, 1, 1, 1)
        return torch.where(flips, images.flip(-1), images).contiguous()


# Kept by the module, not by a step: a step travels to DataLoader workers, a GPU table must not.
_CUTOUT_BANDS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


class Cutout:
    """Cutout (DeVries and Taylor, 2017): a random `size` x `size` square of the image, wholly
    inside it, set to zero (black)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def draw(self, keys: SampleKeys | None, height: int, width: int) -> tuple[Any, Any]:
        """The square's top-left corner: ints for one sample, tensors for a batch."""
        assert keys is not None
        top = keys.integers(CUTOUT_TOP, height - self.size + 1)
        left = keys.integers(CUTOUT_LEFT, width - self.size + 1)
        return top, left

    def __call__(self, image: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        top, left = self.draw(keys, *image.shape[-2:])
        image = image.clone()
        image[:, top : top + self.size, left : left + self.size] = 0
        return image

    def batch(self, images: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        n, _, height, width = images.shape
        top, left = on_device_of(images, *self.draw(keys, height, width))
        rows = self.bands(height, images.device)[top].view(n, 1, height, 1)
        cols = self.bands(width, images.device)[left].view(n, 1, 1, width)
        return images.masked_fill(rows & cols, 0)

    def bands(self, length: int, device: torch.device) -> torch.Tensor:
        """Row t: the square's rows (or columns) when it starts at t, as a mask of `length`;
        looked up by corner, a batch's mask takes a few operations, not a dozen."""
        key = (self.size, length, device)
        if key not in _CUTOUT_BANDS:  # sent to a GPU once, not per batch
            span = torch.arange(length) - torch.arange(length - self.size + 1).view(-1, 1)
            _CUTOUT_BANDS[key] = ((span >= 0) & (span < self.size)).to(device)
        return _CUTOUT_BANDS[key]


def on_device_of(like: torch.Tensor, *draws: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`draws`, one value per sample each and all of one dtype, on the device of `like`: as
    they are if they are there, else in one copy (from the host, where the loaders hash)."""
    if all(draw.device == like.device for draw in draws):
        return draws
    assert len({(draw.dtype, draw.device) for draw in draws}) == 1, "one dtype, one device"
    return host_to_device(torch.stack(draws), like.device).unbind()


class ResizeShorter:
    """Resize so the shorter side is `size` (antialiased; `mode`: bilinear or bicubic, as
    the pretrained model was trained with), keeping the aspect ratio."""

    def __init__(self, size: int, mode: str = "bilinear") -> None:
        self.size, self.mode = size, mode

    def __call__(self, image: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        height, width = image.shape[-2:]
        if min(height, width) == self.size:
            return image
        scale = self.size / min(height, width)
        shape = (max(self.size, round(height * scale)), max(self.size, round(width * scale)))
        resized = functional.interpolate(
            image[None].float(), size=shape, mode=self.mode, antialias=True, align_corners=False
        )
        return resized[0].round_().clamp_(0, 255).to(torch.uint8)


class CenterCrop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        height, width = image.shape[-2:]
        top, left = (height - self.size) // 2, (width - self.size) // 2
        return image[..., top : top + self.size, left : left + self.size]

    def batch(self, images: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        return self(images, None).contiguous()


class TorchvisionSteps:
    """torchvision.transforms.v2 transforms, run on one sample with torch's CPU generator
    seeded from the sample's keys and put back afterwards: they draw from that generator, so
    this makes their draws a pure function of (seed, epoch, index), whichever process or
    worker runs them, and leaves the training's own random state untouched."""

    def __init__(self, transforms: Sequence[Callable[[torch.Tensor], torch.Tensor]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        assert keys is not None
        # torch's CPU generator seeds its Mersenne Twister from a seed's low 32 bits alone: 32
        # bits are all the seed there is (draw TORCHVISION_SEED_HIGH stays reserved, unused).
        seed = keys.bits(TORCHVISION_SEED_LOW)
        generator = torch.default_generator
        saved = generator.get_state()
        generator.manual_seed(seed)
        try:
            for transform in self.transforms:
                image = transform(image)
        finally:
            generator.set_state(saved)
        return image


def build(
    augment: bool,
    image_size: int,
    resize: int | None,
    crop_padding: int,
    *,
    crop_flip: bool = True,
    flip: str = "random",
    padding_mode: str = "zeros",
    cutout: int = 0,
    extra: Sequence[Callable[[torch.Tensor], torch.Tensor]] = (),
    resized: bool = False,
    interpolation: str = "bilinear",
) -> Compose:
    """Train (augment=True) or eval pipeline for square `image_size` inputs: resize (unless
    the images were `resized` already, as a decoded cache holds them), then random crop and
    flip (`crop_flip`; `flip`: random or alternate; the crop pads with `padding_mode`), a
    `cutout` square and any torchvision
    transforms (`extra`) for training, or a centre crop for evaluation."""
    steps: list[Transform] = []
    if resize is not None and not resized:
        steps.append(ResizeShorter(resize, interpolation))
    if augment:
        if crop_flip:
            steps += [
                RandomCrop(image_size, crop_padding, padding_mode),
                HorizontalFlip(alternate=flip == "alternate"),
            ]
        if cutout:
            steps.append(Cutout(cutout))
        if extra:
            steps.append(TorchvisionSteps(extra))
    elif resize is not None:
        steps.append(CenterCrop(image_size))
    return Compose(steps)
