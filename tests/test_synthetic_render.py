"""The built-in dataset as its docstring draws it (repro.core.data.synthetic): each shape's outline,
the ranges of the random parameters, and every pixel re-rendered one image at a time."""

from __future__ import annotations

import numpy as np
import pytest

from repro.core.data import synthetic

# (class, u, v, inside): points on and just past each outline, in shape coordinates.
OUTLINES = [
    (0, 1.0, 0.0, True),
    (0, 0.0, -1.0, True),
    (0, 1.2, 0.0, False),
    (0, 0.75, 0.7, False),
    (1, 0.8, 0.0, True),
    (1, -0.8, -0.8, True),
    (1, 0.81, 0.5, False),
    (1, 0.2, -0.81, False),
    (2, 0.0, -0.85, True),
    (2, 0.0, 0.75, True),
    (2, 0.0, 0.76, False),
    (2, 0.0, -0.86, False),
    (2, 0.59, 0.15, True),
    (2, -0.59, 0.15, True),
    (2, 0.61, 0.15, False),
    (2, -0.61, 0.15, False),
    (3, 0.0, 0.0, False),
    (3, 0.6, 0.0, True),  # r2 == 0.36 exactly: the hole's edge is the ring's
    (3, 0.59, 0.0, False),
    (3, 0.0, 0.61, True),
    (3, 1.0, 0.0, True),
    (3, 0.0, -1.01, False),
    (4, 0.3, 0.9, True),
    (4, -0.3, -0.9, True),
    (4, 0.31, 0.9, False),
    (4, 0.9, 0.3, True),
    (4, 0.9, -0.31, False),
    (4, 0.95, 0.0, True),
    (4, 0.0, -0.96, False),
    (5, 0.8, 0.8, True),
    (5, 0.05, 0.45, True),  # |u - v| == 0.4 exactly
    (5, 0.05, -0.45, True),  # |u + v| == 0.4 exactly
    (5, 0.6, 0.25, True),
    (5, 0.6, 0.15, False),
    (5, 0.6, -0.25, True),
    (5, -0.6, -0.25, True),
    (5, 0.81, 0.81, False),
    (5, 0.0, 0.41, False),
    (6, 0.5, 0.5, True),
    (6, -0.5, -0.5, True),
    (6, 0.5, 0.51, False),
    (6, 1.0, 0.0, True),
    (6, -1.01, 0.0, False),
    (7, 0.0, 0.0, False),
    (7, 0.45, 0.0, True),
    (7, 0.44, 0.0, False),
    (7, 0.85, 0.2, True),
    (7, 0.86, 0.0, False),
    (7, 0.1, -0.6, True),
    (8, 0.0, -0.85, True),
    (8, 0.0, -0.52, True),
    (8, 0.0, -0.5, False),
    (8, 0.0, -0.2, False),
    (8, 0.0, 0.0, True),
    (8, 0.85, 0.85, True),
    (8, 0.86, 0.0, False),
    (9, -0.5, 0.0, True),
    (9, 0.45, 0.7, True),  # above the bite, whose centre is below the disk's
    (9, 0.45, -0.1, False),
    (9, 0.9, 0.0, False),
    (9, -0.2, 0.5, True),
    (9, 0.0, -1.0, True),
    (9, -1.01, 0.0, False),
]


@pytest.mark.parametrize(("label", "u", "v", "inside"), OUTLINES)
def test_each_shape_has_its_outline(label, u, v, inside):
    assert bool(synthetic._masks(label, np.float64(u), np.float64(v))) is inside


def test_the_random_parameters_stay_in_their_ranges_and_reach_their_ends():
    n = 20_000
    draws = synthetic._draw(n, seed=1, num_classes=7)
    assert set(draws.labels.tolist()) == set(range(7))
    radius = 1 / np.hypot(draws.cos_over_radius, draws.sin_over_radius).astype(np.float64)
    assert 6.0 - 1e-4 <= radius.min() < 6.01 and 10.99 < radius.max() <= 11.0 + 1e-4
    angle = np.arctan2(draws.sin_over_radius, draws.cos_over_radius)
    assert -0.35 - 1e-6 <= angle.min() < -0.349 and 0.349 < angle.max() <= 0.35 + 1e-6
    # The shape's box (radius on each side of the centre) stays inside the image.
    reach = np.abs(draws.centre - (synthetic.SIZE / 2 - 0.5)) + radius[:, None]
    assert reach.max() <= synthetic.SIZE / 2 + 1e-3 and reach.max() > synthetic.SIZE / 2 - 0.01
    assert draws.centre.shape == (n, 2) and draws.centre.std(axis=0).min() > 2
    for colour in (draws.background, draws.foreground):
        assert colour.shape == (n, 3) and colour.min() >= 0 and colour.max() < 1
        assert colour.min() < 0.001 and colour.max() > 0.999
    contrast = (draws.foreground - draws.background) % 1.0
    assert contrast.min() >= 0.3 - 1e-6 and contrast.max() <= 0.7 + 1e-6
    assert contrast.min() < 0.301 and contrast.max() > 0.699
    assert draws.gradient.shape == (n, 3, 2)
    assert -0.25 <= draws.gradient.min() < -0.249 and 0.249 < draws.gradient.max() <= 0.25
    noise_seeds = [synthetic._draw(1, seed, 10).noise_seed for seed in range(8)]
    assert len(set(noise_seeds)) == 8 and max(noise_seeds) > 2**60
    # float32 throughout: the pixels are what float32 arithmetic renders.
    for array in (draws.centre, draws.cos_over_radius, draws.sin_over_radius, draws.gradient):
        assert array.dtype == np.float32
    assert draws.background.dtype == draws.foreground.dtype == np.float32


def rendered_one_by_one(draws, index: int, count: int) -> np.ndarray:
    """Image `index` of `count`, pixel by pixel from the docstring's recipe."""
    size, block = synthetic.SIZE, synthetic._BLOCK
    start = index // block * block
    in_block = min(block, count - start)
    noise_bytes = np.random.default_rng([draws.noise_seed, start]).bytes(in_block * 3 * size**2)
    noise = np.frombuffer(noise_bytes, np.int8).reshape(in_block, 3, size, size)[index - start]
    noise = noise.astype(np.int64) // 4  # the byte's top six bits
    image = np.empty((3, size, size), np.uint8)
    centre_x, centre_y = draws.centre[index]
    c, s = draws.cos_over_radius[index], draws.sin_over_radius[index]
    for y in range(size):
        for x in range(size):
            dx, dy = np.float32(x) - centre_x, np.float32(y) - centre_y
            inside = synthetic._masks(int(draws.labels[index]), c * dx + s * dy, c * dy - s * dx)
            for channel in range(3):
                along_y, along_x = draws.gradient[index, channel]
                colour = draws.background[index, channel] + along_y * (y - size / 2) / size
                colour += along_x * (x - size / 2) / size
                if inside:
                    colour = draws.foreground[index, channel]
                value = colour * 255 + noise[channel, y, x]
                image[channel, y, x] = min(255, max(0, round(value)))
    return image


def test_every_pixel_is_the_shape_on_its_background_plus_noise():
    count = 300  # a full block and a partial one
    images, labels = synthetic.generate(count, seed=5, num_classes=10)
    draws = synthetic._draw(count, 5, 10)
    assert images.shape == (count, 3, 32, 32) and np.array_equal(labels.numpy(), draws.labels)
    for index in (0, 7, 255, 256, 299):
        expected = rendered_one_by_one(draws, index, count).astype(np.int64)
        difference = np.abs(images[index].numpy().astype(np.int64) - expected)
        # float32 against float64 arithmetic: a grey level at most, where it rounds otherwise.
        assert difference.max() <= 1, index
        assert (difference > 0).mean() < 0.01, index


@pytest.mark.parametrize("classes", [2, 3, 10])
def test_any_number_of_classes_from_two_to_ten(classes):
    _, labels = synthetic.generate(300, seed=0, num_classes=classes)
    assert sorted(set(labels.tolist())) == list(range(classes))


@pytest.mark.parametrize("classes", [0, 1, 11])
def test_other_numbers_of_classes_are_refused(classes):
    with pytest.raises(ValueError, match=r"num_classes must be in 2\.\.10"):
        synthetic.generate(10, seed=0, num_classes=classes)
