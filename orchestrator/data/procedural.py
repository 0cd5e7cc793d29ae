"""A procedurally rendered, offline image set: ``shapes`` (class = object shape x fill pattern).

Every image shows one object on a background. The class is the pair (shape, fill pattern); what
varies within a class, drawn per image from the seed: position, scale, rotation, the two fill
colours, the background's colours and parameters, and pixel noise. The background *style* is the
generating factor the splits do not share: training images use the first ``num_styles -
test_styles`` styles, test images only the held-out ones, so retrieval on the test split meets
backgrounds no model has seen (the kind of shift a held-out source gives).

Rendering is plain numpy, 2x supersampled and box-filtered to ``image_size``; the same
``(split, seed, sizes)`` gives the same bytes on every machine (one ``numpy.random.Generator``
per split, float32 arithmetic in a fixed order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.data.images import LabeledImages

SHAPES = ("circle", "square", "triangle", "diamond", "star", "cross", "ring", "crescent", "hexagon", "bar")
PATTERNS = ("solid", "stripes", "checker", "dots", "rings", "split")
STYLES = ("flat", "gradient", "blobs", "fine_stripes", "checker", "speckle", "radial", "grid")
_SUPERSAMPLE = 2
_CHUNK = 256


@dataclass(frozen=True)
class RenderedShapes:
    """Rendered images with the factors that generated them (all arrays have N rows).

    images uint8 (N, S, S, 3); shape, pattern, style int64 indices into SHAPES / PATTERNS / STYLES;
    labels = shape * num_patterns + pattern.
    """

    images: np.ndarray
    labels: np.ndarray
    shape: np.ndarray
    pattern: np.ndarray
    style: np.ndarray


def split_styles(split: str, test_styles: int, num_styles: int = len(STYLES)) -> np.ndarray:
    """Background-style indices a split draws from: train the first ``num_styles - test_styles``,
    test the last ``test_styles`` (disjoint by construction)."""
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    if not isinstance(test_styles, int) or not 1 <= test_styles < num_styles:
        raise ValueError(f"test_styles: expected an int in [1, {num_styles - 1}], got {test_styles!r}")
    cut = num_styles - test_styles
    return np.arange(cut) if split == "train" else np.arange(cut, num_styles)


def render_shapes(
    split: str = "train",
    image_size: int = 32,
    num_shapes: int = 8,
    num_patterns: int = 6,
    per_class: int = 60,
    test_styles: int = 2,
    seed: int = 0,
) -> RenderedShapes:
    """Render ``per_class`` images of each of the ``num_shapes * num_patterns`` classes of a split."""
    _check_int("image_size", image_size, 8, 256)
    _check_int("num_shapes", num_shapes, 1, len(SHAPES))
    _check_int("num_patterns", num_patterns, 1, len(PATTERNS))
    _check_int("per_class", per_class, 1, 100_000)
    _check_int("seed", seed, 0, 2**63 - 1)
    styles = split_styles(split, test_styles)
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    num_classes = num_shapes * num_patterns
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), per_class)
    style = styles[rng.integers(0, styles.size, labels.size)].astype(np.int64)
    images = np.empty((labels.size, image_size, image_size, 3), dtype=np.uint8)
    for start in range(0, labels.size, _CHUNK):
        part = slice(start, start + _CHUNK)
        images[part] = _render_chunk(rng, labels[part] // num_patterns, labels[part] % num_patterns,
                                     style[part], image_size)
    return RenderedShapes(images, labels, labels // num_patterns, labels % num_patterns, style)


def load_shapes(
    split: str = "train",
    image_size: int = 32,
    num_shapes: int = 8,
    num_patterns: int = 6,
    train_per_class: int = 60,
    test_per_class: int = 20,
    test_styles: int = 2,
    seed: int = 0,
) -> LabeledImages:
    """The ``shapes`` source: ``num_shapes x num_patterns`` classes (default 48), rendered offline.

    split "train" (``train_per_class`` images per class, background styles not held out) or "test"
    (``test_per_class`` per class, only the ``test_styles`` held-out styles). ids: train items
    0..N_train-1 in label order, test items N_train + i, so the splits' ids are disjoint.
    Class names are "<shape>/<pattern>".
    """
    _check_int("train_per_class", train_per_class, 1, 100_000)
    per_class = train_per_class if split == "train" else test_per_class
    rendered = render_shapes(split, image_size, num_shapes, num_patterns, per_class, test_styles, seed)
    offset = 0 if split == "train" else num_shapes * num_patterns * train_per_class
    return LabeledImages(
        images=rendered.images,
        labels=rendered.labels,
        ids=np.arange(offset, offset + rendered.labels.size, dtype=np.int64),
        class_names=[f"{s}/{p}" for s in SHAPES[:num_shapes] for p in PATTERNS[:num_patterns]],
    )


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}: expected an int in [{low}, {high}], got {value!r}")


# --------------------------------------------------------------------------- rendering


def _render_chunk(rng: np.random.Generator, shape: np.ndarray, pattern: np.ndarray, style: np.ndarray,
                  image_size: int) -> np.ndarray:
    """(n, S, S, 3) uint8 images of one chunk; every random draw comes from ``rng`` in a fixed order."""
    n, size = shape.size, image_size * _SUPERSAMPLE
    axis = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0  # pixel centres in [-1, 1]
    y, x = np.meshgrid(axis, axis, indexing="ij")
    radius = rng.uniform(0.42, 0.72, n).astype(np.float32)
    centre = rng.uniform(-1.0, 1.0, (n, 2)).astype(np.float32) * (1.0 - radius)[:, None] * 0.8
    angle = rng.uniform(0.0, 2 * np.pi, n).astype(np.float32)
    cos, sin = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    dx, dy = x[None] - centre[:, 0, None, None], y[None] - centre[:, 1, None, None]
    u = (cos * dx + sin * dy) / radius[:, None, None]  # object frame: the object spans about [-1, 1]
    v = (-sin * dx + cos * dy) / radius[:, None, None]
    colours = _object_colours(rng, n)  # (n, 2, 3)
    background = _backgrounds(rng, style, x, y)
    mask = np.zeros((n, size, size), dtype=bool)
    fill = np.zeros((n, size, size), dtype=bool)
    for k in range(len(SHAPES)):
        rows = np.flatnonzero(shape == k)
        if rows.size:
            mask[rows] = _shape_mask(k, u[rows], v[rows])
    for k in range(len(PATTERNS)):
        rows = np.flatnonzero(pattern == k)
        if rows.size:
            fill[rows] = _pattern(k, u[rows], v[rows])
    obj = np.where(fill[..., None], colours[:, None, None, 0], colours[:, None, None, 1])
    image = np.where(mask[..., None], obj, background)
    image = image.reshape(n, image_size, _SUPERSAMPLE, image_size, _SUPERSAMPLE, 3).mean(axis=(2, 4))
    image = image + rng.normal(0.0, 0.04, image.shape).astype(np.float32)
    return np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectorised HSV -> RGB, all inputs in [0, 1] with the same shape; output (..., 3)."""
    k = (np.stack([5.0, 3.0, 1.0], axis=-1) + h[..., None] * 6.0) % 6.0
    return v[..., None] - v[..., None] * s[..., None] * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def _object_colours(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 2, 3): two saturated colours per object, hues at least a third of the circle apart and
    values apart, so every fill pattern stays visible whatever the colours."""
    hue = rng.uniform(0.0, 1.0, n)
    second = (hue + rng.uniform(1 / 3, 2 / 3, n)) % 1.0
    sat = rng.uniform(0.6, 1.0, (n, 2))
    bright = rng.uniform(0.85, 1.0, n)
    dark = rng.uniform(0.25, 0.5, n)
    hues, values = np.stack([hue, second], 1), np.stack([bright, dark], 1)
    swap = rng.random(n) < 0.5  # which of the two pattern phases is the bright one
    values[swap] = values[swap][:, ::-1]
    return _hsv_to_rgb(hues, sat, values).astype(np.float32)


def _polygon(u: np.ndarray, v: np.ndarray, sides: int, size: float) -> np.ndarray:
    theta = np.arctan2(v, u) % (2 * np.pi / sides) - np.pi / sides
    return np.hypot(u, v) * np.cos(theta) < size * np.cos(np.pi / sides)


def _shape_mask(kind: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean mask of shape ``SHAPES[kind]`` in the object frame (object radius about 1)."""
    r = np.hypot(u, v)
    name = SHAPES[kind]
    if name == "circle":
        return r < 0.9
    if name == "square":
        return np.maximum(np.abs(u), np.abs(v)) < 0.72
    if name == "triangle":
        return _polygon(u, v, 3, 1.0)
    if name == "diamond":
        return np.abs(u) / 0.6 + np.abs(v) < 1.0
    if name == "star":
        return r < 0.95 * (0.6 + 0.4 * np.cos(5 * np.arctan2(v, u)))
    if name == "cross":
        return ((np.abs(u) < 0.3) & (np.abs(v) < 0.95)) | ((np.abs(v) < 0.3) & (np.abs(u) < 0.95))
    if name == "ring":
        return (r < 0.95) & (r > 0.5)
    if name == "crescent":
        return (r < 0.95) & (np.hypot(u - 0.45, v) > 0.7)
    if name == "hexagon":
        return _polygon(u, v, 6, 0.92)
    return (np.abs(u) < 0.95) & (np.abs(v) < 0.42)  # bar


def _pattern(kind: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean phase of fill pattern ``PATTERNS[kind]`` (True: first colour), in the object frame."""
    name = PATTERNS[kind]
    if name == "solid":
        return np.ones(u.shape, dtype=bool)
    if name == "stripes":
        return np.floor(u / 0.38) % 2 == 0
    if name == "checker":
        return (np.floor(u / 0.45) + np.floor(v / 0.45)) % 2 == 0
    if name == "dots":
        return np.hypot((u / 0.5) % 1.0 - 0.5, (v / 0.5) % 1.0 - 0.5) > 0.3
    if name == "rings":
        return np.floor(np.hypot(u, v) / 0.3) % 2 == 0
    return v > 0.0  # split: two halves


def _backgrounds(rng: np.random.Generator, style: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n, S, S, 3) float backgrounds in muted colours; each image draws the same number of random
    values whatever its style, so one image's style never shifts another image's draws."""
    n = style.size
    base = _hsv_to_rgb(rng.uniform(0, 1, (n, 2)), rng.uniform(0.1, 0.45, (n, 2)), rng.uniform(0.3, 0.75, (n, 2)))
    params = rng.uniform(0.0, 1.0, (n, 6)).astype(np.float32)
    blobs = rng.uniform(-1.0, 1.0, (n, 4, 2)).astype(np.float32)
    speckle = rng.random((n,) + x.shape).astype(np.float32)
    mix = np.zeros((n,) + x.shape, dtype=np.float32)
    for i in range(n):
        mix[i] = _background_mix(STYLES[int(style[i])], params[i], blobs[i], speckle[i], x, y)
    return base[:, None, None, 0] * (1 - mix[..., None]) + base[:, None, None, 1] * mix[..., None]


def _background_mix(name: str, p: np.ndarray, blobs: np.ndarray, speckle: np.ndarray,
                    x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(S, S) weight in [0, 1] of a background's second colour for style ``name``."""
    angle = p[0] * 2 * np.pi
    along = np.cos(angle) * x + np.sin(angle) * y
    if name == "flat":
        return np.zeros_like(x)
    if name == "gradient":
        return (along + 1.5) / 3.0
    if name == "blobs":
        dist = np.min([np.hypot(x - bx, y - by) for bx, by in blobs], axis=0)
        return (dist < 0.25 + 0.25 * p[1]).astype(np.float32)
    if name == "fine_stripes":
        return (np.floor(along / (0.08 + 0.06 * p[1])) % 2).astype(np.float32)
    if name == "checker":
        cell = 0.2 + 0.3 * p[1]
        return ((np.floor(x / cell) + np.floor(y / cell)) % 2).astype(np.float32)
    if name == "speckle":
        return (speckle < 0.3).astype(np.float32)
    if name == "radial":
        return np.clip(np.hypot(x - (p[1] - 0.5), y - (p[2] - 0.5)) / 1.5, 0.0, 1.0)
    period = 0.3 + 0.3 * p[1]  # grid: thin lines
    return ((np.abs((x / period) % 1.0 - 0.5) > 0.4) | (np.abs((y / period) % 1.0 - 0.5) > 0.4)).astype(np.float32)
