"""What the parts of one gallery's update share (``GalleryContext``): the file, the lineage, the
gallery's source, its folders, and the generations' models, each loaded once."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from orchestrator.comparison import query_generations_of
from orchestrator.config import PipelineConfig
from orchestrator.data import ImageTensorDataset, LabeledImages, load_source
from orchestrator.data.gallery_sources import GallerySource, MemorySource
from orchestrator.data.registry import RAY_DATA, STREAMED_SOURCES, open_gallery_source
from orchestrator.gallery import ShardEmbeddings
from orchestrator.geometry.geometry import Geometry
from orchestrator.integrity import load_checked_generation
from orchestrator.lineage import LineageStore
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.pipeline.gallery.snapshot import open_snapshot
from orchestrator.storage import join_uri
from orchestrator.storage.locations import StorageRoot


class GalleryContext:
    """What the parts of a gallery's update share: the pipeline file, the lineage, the gallery's
    source (opened once), its storage folders, and the generations' models (loaded once each,
    sha256-checked).

    normalisation: the training split's per-channel (mean, std), shared by every generation.
    eval_images:   the query set of the evaluation (the evaluation split).
    ensure_ray:    called before the first work on Ray (scoring, embedding): connects to or starts
                   the file's Ray then, so that steps with nothing to do on Ray start none. Default:
                   nothing (the caller has connected).
    """

    def __init__(self, config: PipelineConfig, store: LineageStore, storage: str,
                 normalisation: tuple[tuple[float, ...], tuple[float, ...]], eval_images: Callable[[], LabeledImages],
                 say: Callable[[str], None], ensure_ray: Callable[[], None] = lambda: None):
        self.config, self.store, self.say = config, store, say
        self.ensure_ray = ensure_ray
        self.spec = config.gallery
        self.name = config.gallery.name
        self.locations = StorageRoot(storage)  # plan files record locations as the lineage does
        self.root = join_uri(storage, "galleries", self.name)
        self.reports = join_uri(storage, "reports")
        self.mean, self.std = normalisation
        self._eval_images = eval_images
        self._source: GallerySource | None = None
        self._models: dict[str, Any] = {}

    @property
    def source(self) -> GallerySource:
        """The gallery's items: a streamed source (Parquet dataset, image files, a Ray Data read's
        snapshot) read in pieces, or an in-memory data source's split; opened once (a listing, no
        image is read; a Ray Data read's snapshot is written by Ray workers the first time)."""
        if self._source is None:
            kind, options = self.config.gallery_source
            if kind == RAY_DATA:  # its snapshot, written by Ray Data workers the first time
                self._source = open_snapshot(self.store, self.name, self.root, options, self.ensure_ray, self.say)
            elif kind in STREAMED_SOURCES:
                self._source = open_gallery_source(kind, options)
            else:
                source, kwargs = self.config.gallery_loader_kwargs()
                self._source = MemorySource(load_source(source, **kwargs), f"{source}:{self.spec.split}")
        return self._source

    @property
    def image_size(self) -> int:
        if self.config.data.image_size:
            return self.config.data.image_size
        if isinstance(self.source, MemorySource):
            return int(self.source.images.images.shape[1])
        raise ValueError("data.image_size: required with a streamed gallery (the size its images are resized to)")

    def labelled_sample(self, max_items: int) -> LabeledImages | None:
        """A deterministic labelled sample of at most ``max_items`` gallery items (None: no labels)."""
        return self.source.labelled_sample(max_items, self.image_size)

    def model(self, name: str):
        """Generation ``name``'s model in eval mode (loaded once, checked against the lineage)."""
        if name not in self._models:
            self._models[name], _card = load_checked_generation(self.store, self.store.get_generation(name))
            self._models[name].eval()
        return self._models[name]

    def models_for(self, parents: dict[str, str | None]) -> dict[str, Any]:
        """Every loaded model plus their ancestors (an adapter path may pass through them)."""
        for name in list(self._models):
            ancestor = parents.get(name)
            while ancestor is not None:
                self.model(ancestor)
                ancestor = parents.get(ancestor)
        return dict(self._models)

    def queries(self, generation: str, gallery: ShardEmbeddings) -> tuple[torch.Tensor, np.ndarray, np.ndarray | None]:
        """The evaluation split embedded by ``generation``, with ids for leave-one-out when the
        queries are the gallery's own items (same source and split): then they are ``gallery``,
        the gallery ``generation`` just embedded, not embedded a second time."""
        if self.config.gallery.source is None and self.spec.split == self.config.data.eval_split:
            return torch.from_numpy(gallery.embeddings), gallery.labels, gallery.ids
        images = self._eval_images()
        size = self.config.data.image_size or int(images.images.shape[1])
        out, labels, _ids = embed_dataset_with_ids(self.model(generation), ImageTensorDataset(images, size, self.mean, self.std))
        return out.embedding, labels.numpy(), None

    def other_queries(self, generation: str, items: LabeledImages, parents: dict[str, str | None]
                      ) -> dict[str, torch.Tensor]:
        """The queries of ``queries(generation, …)`` (``items`` when they are the gallery's own)
        embedded by each generation that ``generation``'s spherical interpolation paths take them
        from too (``comparison.query_generations_of``; usually none), as the router takes them."""
        needed = query_generations_of(generation, self.models_for(parents), parents)
        return {name: self.queries(name, self.embed_locally(name, items))[0] for name in needed}

    def embed_locally(self, generation: str, items: LabeledImages) -> ShardEmbeddings:
        """``items`` (the evaluation's labelled sample) embedded by ``generation`` in this process."""
        model = self.model(generation)
        out, labels, ids = embed_dataset_with_ids(model, ImageTensorDataset(items, self.image_size, self.mean, self.std))
        geometry = Geometry(model.space, model.curv)
        return ShardEmbeddings(ids.numpy(), labels.numpy(), out.embedding.numpy().astype(np.float32),
                               geometry.uncertainty(out.embedding).numpy().astype(np.float32), generation,
                               geometry.space.value, geometry.curv)

