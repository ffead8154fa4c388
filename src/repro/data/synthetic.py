"""The embedded default dataset: 3x32x32 shapes, 10 classes, made from a seed in about a second.

Each image shows one shape (the class) in a random colour, size, position and small rotation,
on a random background with a colour gradient and pixel noise. The colour carries no
information about the class, so a model has to learn the shape. No download, no cache: the
same seed always renders the same pixels.
"""

from __future__ import annotations

import numpy as np
import torch

CLASSES = (
    "disk", "square", "triangle", "ring", "plus", "cross", "diamond", "frame", "stripes", "moon",
)  # fmt: skip
SIZE = 32
_CHUNK = 4096


def _masks(label: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pixels inside shape `label`, in shape coordinates where the shape spans about [-1, 1]."""
    r2 = u * u + v * v
    box = np.maximum(np.abs(u), np.abs(v))
    if label == 0:
        return r2 <= 1.0
    if label == 1:
        return box <= 0.8
    if label == 2:
        return (v >= -0.85) & (v <= 0.75) & (np.abs(u) <= (v + 0.85) * 0.6)
    if label == 3:
        return (r2 <= 1.0) & (r2 >= 0.36)
    if label == 4:
        return ((np.abs(u) <= 0.3) | (np.abs(v) <= 0.3)) & (box <= 0.95)
    if label == 5:
        return ((np.abs(u - v) <= 0.4) | (np.abs(u + v) <= 0.4)) & (box <= 0.8)
    if label == 6:
        return np.abs(u) + np.abs(v) <= 1.0
    if label == 7:
        return (box <= 0.85) & (box >= 0.45)
    if label == 8:
        return (box <= 0.85) & (np.floor((v + 0.85) * 2.94).astype(np.int64) % 2 == 0)
    return (r2 <= 1.0) & ((u - 0.45) ** 2 + (v + 0.1) ** 2 >= 0.55)


def generate(n: int, seed: int, num_classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` images as a uint8 tensor (n, 3, 32, 32) and their int64 labels."""
    if not 2 <= num_classes <= len(CLASSES):
        raise ValueError(f"num_classes must be in 2..{len(CLASSES)}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    radius = rng.uniform(6.0, 11.0, n)
    centre = rng.uniform(-1.0, 1.0, (n, 2)) * (SIZE / 2 - radius[:, None]) + SIZE / 2 - 0.5
    radius, centre = radius.astype(np.float32), centre.astype(np.float32)
    angle = rng.uniform(-0.35, 0.35, n)
    background = rng.uniform(0.0, 1.0, (n, 3)).astype(np.float32)
    # Every channel contrasts with the background by at least 0.3.
    foreground = (background + rng.uniform(0.3, 0.7, (n, 3)).astype(np.float32)) % 1.0
    gradient = rng.uniform(-0.25, 0.25, (n, 3, 2)).astype(np.float32)
    noise_seed = int(rng.integers(2**63))

    images = np.empty((n, 3, SIZE, SIZE), dtype=np.uint8)
    grid = (np.arange(SIZE, dtype=np.float32) - SIZE / 2) / SIZE
    for start in range(0, n, _CHUNK):
        part = slice(start, min(start + _CHUNK, n))
        count = part.stop - part.start
        dy = np.arange(SIZE, dtype=np.float32)[None, :, None] - centre[part, 1, None, None]
        dx = np.arange(SIZE, dtype=np.float32)[None, None, :] - centre[part, 0, None, None]
        cos = np.cos(angle[part]).astype(np.float32)[:, None, None]
        sin = np.sin(angle[part]).astype(np.float32)[:, None, None]
        u = (cos * dx + sin * dy) / radius[part, None, None]
        v = (cos * dy - sin * dx) / radius[part, None, None]
        inside = np.zeros((count, SIZE, SIZE), dtype=bool)
        for label in range(num_classes):
            rows = np.flatnonzero(labels[part] == label)
            inside[rows] = _masks(label, u[rows], v[rows])
        shade = (
            background[part, :, None, None]
            + gradient[part, :, 0, None, None] * grid[None, None, :, None]
            + gradient[part, :, 1, None, None] * grid[None, None, None, :]
        )
        pixels = np.where(inside[:, None], foreground[part, :, None, None], shade)
        noise = np.random.default_rng([noise_seed, start]).standard_normal(
            pixels.shape, dtype=np.float32
        )
        pixels = (pixels + 0.08 * noise) * 255.0 + 0.5
        images[part] = np.clip(pixels, 0, 255).astype(np.uint8)
    return torch.from_numpy(images), torch.from_numpy(labels)
