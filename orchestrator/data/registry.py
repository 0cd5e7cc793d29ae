"""The data sources by name: the one registry of the loaders a pipeline file can name.

- In-memory sources (``SOURCE_NAMES``: ``orchestrator.data.sources``) load a whole split as a
  ``LabeledImages``: ``load_source(name, **options)``.
- Streamed sources (``STREAMED_SOURCES``: ``orchestrator.data.gallery_sources``) read a gallery
  in pieces and never load it whole; only a gallery can use them: ``open_gallery_source``. One of
  them, ``ray_data`` (``orchestrator.data.ray_data_read``), is a Ray Data read whose snapshot the
  pipeline writes and opens.

A loader's keyword parameters are its source's options (``loader_parameters``): the pipeline
configuration checks a file's options against them, and ``loader_kwargs`` builds the keyword
arguments of one split from a file's options.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from orchestrator.data.images import LabeledImages
from orchestrator.data.procedural import load_shapes
from orchestrator.data.sources import load_cifar, load_digits, load_image_folder, load_parquet, load_tiny_imagenet

if TYPE_CHECKING:
    from orchestrator.data.gallery_sources import GallerySource

LOADERS: dict[str, Callable[..., LabeledImages]] = {
    "digits": load_digits,
    "cifar10": partial(load_cifar, variant="cifar10"),
    "cifar100": partial(load_cifar, variant="cifar100"),
    "tiny_imagenet": load_tiny_imagenet,
    "image_folder": load_image_folder,
    "parquet": load_parquet,
    "shapes": load_shapes,
}
SOURCE_NAMES = tuple(LOADERS)
#: The option of each source that names data which must already be there (nothing downloads it):
#: a command checks a local one exists before it creates anything (``orchestrator.outside``).
EXISTING_DATA_OPTIONS: dict[str, str] = {
    "image_folder": "root", "tiny_imagenet": "root", "parquet": "path_or_url",
    "parquet_dataset": "path", "image_files": "path",
}
#: A gallery read by Ray Data (``orchestrator.data.ray_data_read``): its options are a
#: ``RayDataRead``; the pipeline opens it over its snapshot (``orchestrator.pipeline.gallery.snapshot``).
RAY_DATA = "ray_data"
#: The streamed sources by name: (module, class), imported when a file names one (pyarrow and fsspec
#: load with them; checking a file of an in-memory source needs neither).
_STREAMED: dict[str, tuple[str, str]] = {
    "parquet_dataset": ("orchestrator.data.gallery_sources", "ParquetDatasetSource"),
    "image_files": ("orchestrator.data.gallery_sources", "ImageFilesSource"),
    RAY_DATA: ("orchestrator.data.ray_data_read", "RayDataRead"),
}
STREAMED_SOURCES = tuple(_STREAMED)
# split names of the loaders that take a `split` argument (see orchestrator.data.sources)
SPLITS: dict[str, tuple[str, ...]] = {
    "digits": ("train", "test", "all"),
    "cifar10": ("train", "test"),
    "cifar100": ("train", "test"),
    "tiny_imagenet": ("train", "val"),
    "shapes": ("train", "test"),
}


def load_source(name: str, **options: Any) -> LabeledImages:
    """Load a dataset by name (one of ``SOURCE_NAMES``) with the named loader's keyword options."""
    if name not in LOADERS:
        raise ValueError(f"name: unknown data source {name!r}; known: {', '.join(SOURCE_NAMES)}")
    return LOADERS[name](**options)


def open_gallery_source(kind: str, options: dict[str, Any]) -> GallerySource:
    """A streamed gallery source by kind (``STREAMED_SOURCES``) with its options."""
    if kind not in STREAMED_SOURCES:
        raise ValueError(f"source: unknown gallery source {kind!r}; known: {', '.join(STREAMED_SOURCES)}")
    if kind == RAY_DATA:
        raise ValueError("source: a ray_data gallery is opened over its snapshot, under the pipeline's storage "
                         "(orchestrator.pipeline.gallery.snapshot.open_snapshot)")
    return _streamed(kind)(**options)


def _streamed(kind: str) -> Callable[..., Any]:
    module, name = _STREAMED[kind]
    return getattr(importlib.import_module(module), name)


def loader_parameters(source: str) -> dict[str, inspect.Parameter] | None:
    """The keyword parameters of a source's loader (in-memory or streamed); None for an unknown source."""
    loader = LOADERS.get(source) or (_streamed(source) if source in _STREAMED else None)
    return None if loader is None else dict(inspect.signature(loader).parameters)


def loader_kwargs(
    source: str, options: Mapping[str, Any], split: str, image_size: int | None, split_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``load_source(source, **kwargs)`` for one split.

    ``options`` merged with ``split_options[split]``; ``split`` passed when the loader takes one,
    ``image_size`` when it takes one and is not None.
    """
    kwargs = {**options, **dict((split_options or {}).get(split) or {})}
    parameters = loader_parameters(source) or {}
    if "split" in parameters:
        kwargs["split"] = split
    if "image_size" in parameters and image_size is not None:
        kwargs["image_size"] = image_size
    return kwargs
