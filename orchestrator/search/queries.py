"""Query inputs of a search: images encoded by the serving generation, or given embeddings.

Images go through exactly the preprocessing the gallery went through (``ImageTensorDataset``:
pixels / 255, resize to the pipeline's image size, per-channel normalisation with the training
split's statistics), so a gallery item used as a query finds itself at distance ~0.

Query files (``read_query_file``):
- ``.npy``: a uint8 array (N, H, W, 3) or (N, H, W) of images, or a float array (N, D) of
  embeddings of the serving generation;
- ``.npz``: the same under the key ``images`` or ``embeddings`` (optional ``labels`` (N,) int and
  ``ids`` (N,) int for evaluation); or, instead of ``embeddings``, one float array (N, D_g) per
  generation named ``embeddings@<generation>``: the same queries embedded by the serving generation
  and by each generation a spherical interpolation path interpolates with (``slerp``), exactly
  those (``search.query_generations``, the rule ``POST /search`` applies to its keyed
  ``embeddings``);
- ``.png`` / ``.jpg`` / ``.jpeg``: one image per file (any number of files), or a folder of them
  (every image below it, sorted by path); each query is named by its file, and images of other
  sizes are resized to the pipeline's image size (``image_size``).
Loaded with ``allow_pickle=False``: a query file can never run code.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from orchestrator.data import ImageTensorDataset, LabeledImages
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.models.bundle import CompatibleModel

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: A query file's array of one generation's embeddings of the queries: ``embeddings@<generation>``.
KEYED_PREFIX = "embeddings@"


@dataclass(frozen=True)
class QueryBatch:
    """Queries read from files: images (N, H, W, 3) uint8 or embeddings (N, D); optional labels/ids (N,)
    and names (the image file of each query)."""

    images: np.ndarray | None = None
    embeddings: np.ndarray | None = None
    labels: np.ndarray | None = None
    ids: np.ndarray | None = None
    names: tuple[str, ...] | None = None
    embeddings_by_generation: dict[str, np.ndarray] | None = None
    """Instead of ``embeddings``: generation → (N, D_g) embeddings of the same N queries."""

    def __len__(self) -> int:
        if self.embeddings_by_generation is not None:
            return len(next(iter(self.embeddings_by_generation.values())))
        return len(self.images if self.images is not None else self.embeddings)


def encode_images(model: CompatibleModel, images: np.ndarray | LabeledImages, image_size: int,
                  mean: Sequence[float], std: Sequence[float], batch_size: int = 256) -> torch.Tensor:
    """(N, H, W, 3) uint8 images (or a ``LabeledImages``) → (N, D) embeddings of ``model``."""
    if not isinstance(images, LabeledImages):
        images = as_rgb_images(images, "images")
        n = len(images)
        images = LabeledImages(images, np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64), ["query"])
    out, _labels, _ids = embed_dataset_with_ids(model, ImageTensorDataset(images, image_size, mean, std), batch_size)
    return out.embedding


def as_rgb_images(array: np.ndarray, where: str) -> np.ndarray:
    """uint8 (N, H, W, 3), or (N, H, W) grey replicated to 3 channels; ValueError naming ``where``."""
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise ValueError(f"{where}: images must be uint8, got {array.dtype}")
    if array.ndim == 3:
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"{where}: images must have shape (N, H, W, 3) or (N, H, W), got {array.shape}")
    return np.ascontiguousarray(array)


def read_query_file(paths: Sequence[str | Path], image_size: int | None = None) -> QueryBatch:
    """Queries from one ``.npy``/``.npz`` file, image files or folders of images (module docstring);
    ``image_size``: resize images of other sizes to it (None: they must share one size)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no query file given")
    paths = [f for p in paths for f in (_images_under(p) if p.is_dir() else [p])]
    for path in paths:
        if not path.is_file():
            raise ValueError(f"query file {str(path)!r} does not exist")
    suffixes = {p.suffix.lower() for p in paths}
    if suffixes <= set(IMAGE_SUFFIXES):
        images = [_read_image(p, image_size) for p in paths]
        sizes = {image.shape for image in images}
        if len(sizes) > 1:
            raise ValueError(f"query images must share one size, got {sorted(sizes)} "
                             f"({', '.join(str(p) for p in paths)})")
        return QueryBatch(images=np.stack(images), names=tuple(str(p) for p in paths))
    if len(paths) != 1 or suffixes - {".npy", ".npz"}:
        raise ValueError(f"queries: give one .npy/.npz file or image files ({', '.join(IMAGE_SUFFIXES)}), "
                         f"got {[str(p) for p in paths]}")
    path = paths[0]
    if path.suffix.lower() == ".npy":
        return _batch_from_array(np.load(path, allow_pickle=False), str(path))
    with np.load(path, allow_pickle=False) as archive:
        keys = set(archive.files)
        arrays = {key: archive[key] for key in keys}
    keyed = sorted(key for key in keys if key.startswith(KEYED_PREFIX))
    data_keys = keys & {"images", "embeddings"}
    if len(data_keys) + bool(keyed) != 1:
        raise ValueError(f"{path}: needs exactly one of the arrays 'images' or 'embeddings', or arrays "
                         f"'{KEYED_PREFIX}<generation>' only, has {sorted(keys)}")
    batch = _keyed_batch(arrays, keyed, str(path)) if keyed else _batch_from_array(arrays[data_keys.pop()], str(path))
    extras = {}
    for key in ("labels", "ids"):
        if key in arrays:
            values = np.asarray(arrays[key])
            if values.shape != (len(batch),) or not np.issubdtype(values.dtype, np.integer):
                raise ValueError(f"{path}: {key!r} must be an integer array of shape ({len(batch)},), "
                                 f"got {values.dtype} {values.shape}")
            extras[key] = values.astype(np.int64)
    return QueryBatch(batch.images, batch.embeddings, extras.get("labels"), extras.get("ids"),
                      embeddings_by_generation=batch.embeddings_by_generation)


def _keyed_batch(arrays: dict[str, np.ndarray], keys: list[str], where: str) -> QueryBatch:
    """The ``embeddings@<generation>`` arrays of a query file: each float (N, D_g), one N for all."""
    by_generation = {}
    for key in keys:
        generation = key[len(KEYED_PREFIX):]
        if not generation:
            raise ValueError(f"{where}: array {key!r} names no generation ('{KEYED_PREFIX}<generation>')")
        array = arrays[key]
        if not np.issubdtype(array.dtype, np.floating) or array.ndim != 2:
            raise ValueError(f"{where}: array {key!r} must hold float embeddings (N, D), got {array.dtype} "
                             f"{array.shape}")
        by_generation[generation] = _batch_from_array(array, f"{where}: array {key!r}").embeddings
    rows = {name: len(array) for name, array in by_generation.items()}
    if len(set(rows.values())) != 1:
        raise ValueError(f"{where}: the '{KEYED_PREFIX}<generation>' arrays must hold the same queries, got rows {rows}")
    return QueryBatch(embeddings_by_generation=by_generation)


def _batch_from_array(array: np.ndarray, where: str) -> QueryBatch:
    if array.dtype == np.uint8:
        return QueryBatch(images=as_rgb_images(array, where))
    if np.issubdtype(array.dtype, np.floating) and array.ndim == 2:
        if not np.isfinite(array).all():
            raise ValueError(f"{where}: the query embeddings contain NaN or infinite values")
        return QueryBatch(embeddings=array)
    raise ValueError(f"{where}: expected uint8 images (N, H, W[, 3]) or float embeddings (N, D), "
                     f"got {array.dtype} {array.shape}")


def _images_under(folder: Path) -> list[Path]:
    found = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        raise ValueError(f"query folder {str(folder)!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return found


def _read_image(path: Path, image_size: int | None = None) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB")
    return _resized(rgb, image_size)


def _resized(rgb, image_size: int | None) -> np.ndarray:
    """(H, W, 3) uint8 of a PIL RGB image, bilinearly resized to ``image_size`` when it has another size."""
    from PIL import Image

    if image_size is not None and rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def decode_image(data: bytes, image_size: int, where: str, max_pixels: int) -> np.ndarray:
    """(image_size, image_size, 3) uint8 of encoded image bytes (PNG, JPEG, …), read as a query image
    file is; ValueError naming ``where`` when the bytes are no image PIL can decode or the image has
    more than ``max_pixels`` pixels (checked from the header, before decoding)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise ValueError(f"{where}: image of {width}x{height} pixels, more than the {max_pixels} allowed")
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError) as error:
        raise ValueError(f"{where}: not a decodable image ({type(error).__name__}: {error})") from None
    return _resized(rgb, image_size)
