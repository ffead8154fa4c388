"""The embedded default dataset: 3x32x32 shapes in 10 classes, made from a seed in moments.

Each image shows one shape (the class) in a random colour, size, position and small rotation,
on a random background with a colour gradient and pixel noise. The colour carries no
information about the class, so a model has to learn the shape. No download, no cache: the
same seed always renders the same pixels.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch

CLASSES = (
    "disk",
    "square",
    "triangle",
    "ring",
    "plus",
    "cross",
    "diamond",
    "frame",
    "stripes",
    "moon",
)
SIZE = 32
_BLOCK = 256  # images rendered at a time: small enough to stay in cache
_NOISE_SHIFT = 2  # pixel noise: a random byte >> 2, -32..31 grey levels
_THREADS = 2  # numpy releases the GIL in its loops; more threads than this barely help


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


class _Draws(NamedTuple):
    """Every image's random parameters, drawn up front so blocks can render in any order."""

    labels: np.ndarray
    centre: np.ndarray  # (n, 2) x, y in pixels
    cos_over_radius: np.ndarray
    sin_over_radius: np.ndarray
    background: np.ndarray  # (n, 3) in [0, 1]
    foreground: np.ndarray
    gradient: np.ndarray  # (n, 3, 2): change across the image along y and x
    noise_seed: int


def _draw(n: int, seed: int, num_classes: int) -> _Draws:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    radius = rng.uniform(6.0, 11.0, n)
    centre = rng.uniform(-1.0, 1.0, (n, 2)) * (SIZE / 2 - radius[:, None]) + SIZE / 2 - 0.5
    angle = rng.uniform(-0.35, 0.35, n)
    background = rng.uniform(0.0, 1.0, (n, 3)).astype(np.float32)
    # Every channel contrasts with the background by at least 0.3.
    foreground = (background + rng.uniform(0.3, 0.7, (n, 3)).astype(np.float32)) % 1.0
    gradient = rng.uniform(-0.25, 0.25, (n, 3, 2)).astype(np.float32)
    return _Draws(
        labels,
        centre.astype(np.float32),
        (np.cos(angle) / radius).astype(np.float32),
        (np.sin(angle) / radius).astype(np.float32),
        background,
        foreground,
        gradient,
        int(rng.integers(2**63)),
    )


def _render(draws: _Draws, start: int, out: np.ndarray, num_classes: int) -> None:
    """Images start .. start + len(out) into `out` (uint8, (count, 3, SIZE, SIZE))."""
    part = slice(start, start + len(out))
    axis = np.arange(SIZE, dtype=np.float32)
    # Shape coordinates (rotated, scaled): each the sum of a per-row and a per-column term.
    dy = axis[None, :, None] - draws.centre[part, 1, None, None]  # (count, SIZE, 1)
    dx = axis[None, None, :] - draws.centre[part, 0, None, None]  # (count, 1, SIZE)
    c, s = draws.cos_over_radius[part, None, None], draws.sin_over_radius[part, None, None]
    u, v = c * dx + s * dy, c * dy - s * dx
    inside = np.zeros((len(out), SIZE, SIZE), dtype=bool)
    for label in range(num_classes):
        rows = np.flatnonzero(draws.labels[part] == label)
        inside[rows] = _masks(label, u[rows], v[rows])
    # Background: a colour plus a gradient along each axis; then the shape, blended in.
    grid = (axis - SIZE / 2) / SIZE
    gradient = draws.gradient[part]
    column = draws.background[part, :, None, None] + gradient[:, :, 0, None, None] * grid[:, None]
    pixels = column + gradient[:, :, 1, None, None] * grid
    shape = np.subtract(draws.foreground[part, :, None, None], pixels)
    np.multiply(shape, inside[:, None], out=shape)
    np.add(pixels, shape, out=pixels)
    # Uniform noise from random bytes (normal draws cost several times more), seeded per
    # block so that blocks can render on any thread.
    noise = np.random.default_rng([draws.noise_seed, start]).bytes(pixels.size)
    noise = np.frombuffer(noise, dtype=np.int8).reshape(pixels.shape) >> _NOISE_SHIFT
    np.multiply(pixels, 255.0, out=pixels)
    np.add(pixels, noise, out=pixels)
    np.clip(pixels, 0.0, 255.0, out=pixels)
    np.rint(pixels, out=pixels)
    out[...] = pixels


def generate(n: int, seed: int, num_classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` images as a uint8 tensor (n, 3, 32, 32) and their int64 labels."""
    if not 2 <= num_classes <= len(CLASSES):
        raise ValueError(f"num_classes must be in 2..{len(CLASSES)}")
    draws = _draw(n, seed, num_classes)
    images = np.empty((n, 3, SIZE, SIZE), dtype=np.uint8)
    starts = range(0, n, _BLOCK)
    with ThreadPoolExecutor(_THREADS) as pool:
        for done in [
            pool.submit(_render, draws, start, images[start : start + _BLOCK], num_classes)
            for start in starts
        ]:
            done.result()
    return torch.from_numpy(images), torch.from_numpy(draws.labels)
