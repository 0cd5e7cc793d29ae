"""A search router opened from the lineage: the deployed generation, its models and the shards.

``open_router(store, gallery)`` reads who serves (``LineageStore.current_deployment`` unless a
generation is named), the gallery's shard rows, the generation tree and the recorded
compatibility values, loads the models it needs (card and weights checked against the lineage's
hashes, ``orchestrator.integrity``) and the shards' indexes (each file's sha256 checked; for a
shard on a forward path its embeddings file instead, mapped into the serving space), and returns
a ``SearchRouter``. ``SearchService`` adds the query encoder of a
pipeline file (its image size and the training split's normalisation, as the gallery was
embedded) for image queries.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from orchestrator.gallery import read_recorded_attributes
from orchestrator.integrity import load_checked_generation
from orchestrator.lineage import LineageStore
from orchestrator.lineage.records import GenerationRecord, ShardRecord
from orchestrator.models.bundle import CompatibleModel
from orchestrator.search.admission import CompatibilityCriterion
from orchestrator.search.attributes import ItemColumns
from orchestrator.search.router import OnIncompatible, RoutePlan, SearchResult, SearchRouter, plan_routes
from orchestrator.stores import load_checked_shard, read_checked_embeddings


def open_plan(store: LineageStore, gallery: str, serving: str | None = None, *, metric: str = "map",
              dataset: str | None = None, on_incompatible: OnIncompatible = "refuse",
              storage_options: Mapping[str, Any] | None = None, shards: Sequence[ShardRecord] | None = None,
              load_model: Callable[[GenerationRecord], CompatibleModel] | None = None
              ) -> tuple[RoutePlan, dict[str, CompatibleModel]]:
    """The route plan of ``gallery`` for ``serving`` (None: the deployed generation) and the models
    it needs (the serving generation's, every shard generation's, their ancestors'); see
    ``open_router``. ``load_model``: generation row → its model, checked against the lineage's
    hashes (default ``load_checked_generation``; a server reuses the models it already holds)."""
    if serving is None:
        deployment = store.current_deployment()
        if deployment is None:
            raise ValueError("no generation is deployed yet: run the pipeline first, or name the serving generation")
        serving = deployment.generation
    records = {g.name: g for g in store.list_generations()}
    if serving not in records:
        raise ValueError(f"serving generation {serving!r} is not in the lineage (known: {sorted(records)})")
    if gallery not in {g.name for g in store.galleries()}:
        raise ValueError(f"gallery {gallery!r} is not in the lineage (known: {sorted(g.name for g in store.galleries())})")
    shards = store.shards(gallery) if shards is None else list(shards)
    parents = {name: record.parent for name, record in records.items()}
    needed = {serving} | {s.generation for s in shards if s.generation}
    ancestor = parents.get(serving)
    while ancestor is not None:  # an adapter path runs through the serving generation's ancestors
        needed.add(ancestor)
        ancestor = parents.get(ancestor)
    if load_model is None:
        def load_model(record: GenerationRecord) -> CompatibleModel:
            return load_checked_generation(store, record, storage_options)[0]
    models = {name: load_model(records[name]) for name in sorted(needed)}
    criterion = CompatibilityCriterion.from_records(store.compatibility_values(dataset), metric, dataset)
    return plan_routes(serving, models, parents, shards, criterion, on_incompatible), models


def open_router(store: LineageStore, gallery: str, serving: str | None = None, *, metric: str = "map",
                dataset: str | None = None, on_incompatible: OnIncompatible = "refuse",
                storage_options: Mapping[str, Any] | None = None,
                shards: Sequence[ShardRecord] | None = None,
                load_index: Callable[[ShardRecord], Any] | None = None,
                load_model: Callable[[GenerationRecord], CompatibleModel] | None = None) -> SearchRouter:
    """The router of ``gallery`` for ``serving`` (None: the deployed generation); see the module
    docstring. ``shards``: the gallery's shard rows as already read (a server's snapshot); None
    reads them now. ``load_index``: shard row → its index, checked against the lineage's hashes
    (default ``stores.load_checked_shard``: a shard file's index or a store's rows; a server reuses the indexes it
    loaded for an earlier snapshot);
    ``load_model`` likewise for models (``open_plan``).
    ValueError names what is missing (no deployment, unknown gallery or generation)."""
    plan, models = open_plan(store, gallery, serving, metric=metric, dataset=dataset, on_incompatible=on_incompatible,
                             storage_options=storage_options, shards=shards, load_model=load_model)
    by_uri = {shard.index_uri: shard for shard, _path in plan.admitted}
    if load_index is None:
        def load_index(shard: ShardRecord) -> Any:
            return load_checked_shard(store, shard, storage_options)
    return SearchRouter.of_plan(plan, models, lambda uri: load_index(by_uri[uri]),
                                read_embeddings=lambda shard: read_checked_embeddings(store, shard, storage_options))


@dataclass
class SearchService:
    """A router plus the serving generation's image encoder.

    normalisation: per-channel (mean, std) of the training split; image_size: the pipeline's.
    """

    router: SearchRouter
    image_size: int
    normalisation: tuple[Sequence[float], Sequence[float]]
    item_columns: dict[tuple[str, str], ItemColumns] = field(default_factory=dict, repr=False)
    """The attribute columns of the shard files already read (sha256 checked), by (URI, sha256);
    a server shares one dict between the services of its snapshots, so a file is read once while
    it is served."""
    _widths: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    @property
    def width(self) -> int:
        """D, the width of the serving generation's embeddings (of one blank image, encoded)."""
        return self.width_of(self.serving)

    @property
    def query_generations(self) -> tuple[str, ...]:
        """The generations whose embeddings of a query a search needs besides the serving one's
        (``SearchRouter.query_generations``: spherical interpolation paths); usually none."""
        return self.router.query_generations

    def width_of(self, generation: str) -> int:
        """The width of ``generation``'s embeddings (the serving one or one of ``query_generations``),
        encoded once (a server asks it of every request: ``serving.local`` asks it while it builds)."""
        width = self._widths.get(generation)
        if width is None:
            blank = np.zeros((1, self.image_size, self.image_size, 3), dtype=np.uint8)
            width = int(self.encode(blank, None if generation == self.serving else generation).shape[1])
            self._widths[generation] = width
        return width

    def encode(self, images: np.ndarray, generation: str | None = None) -> torch.Tensor:
        """(N, H, W, 3) uint8 images → (N, D) embeddings of the serving generation, or of
        ``generation`` (one of the router's models: a generation of ``query_generations``)."""
        from orchestrator.search.queries import encode_images

        mean, std = self.normalisation
        model = self.router.model if generation is None else self.router.models[generation]
        return encode_images(model, images, self.image_size, mean, std)

    def encode_for_search(self, images: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(N, H, W, 3) uint8 images → (the serving generation's (N, D) embeddings, {generation: its
        (N, D_g) embeddings} for each of ``query_generations``): what ``search`` takes. An image
        query is embedded by a second generation only when a path interpolates with it."""
        return self.encode(images), {name: self.encode(images, name) for name in self.query_generations}

    @property
    def serving(self) -> str:
        """The generation whose queries this service searches."""
        return self.router.serving

    def search_images(self, images: np.ndarray, k: int) -> SearchResult:
        queries, others = self.encode_for_search(images)
        return self.router.search(queries, k, others)

    def answer(self, embeddings: torch.Tensor | np.ndarray, k: int,
               queries_by_generation: Mapping[str, torch.Tensor | np.ndarray] | None = None) -> dict[str, Any]:
        """``search_answer`` of this service (what a server's snapshot answers a request with)."""
        return search_answer(self, embeddings, k, queries_by_generation)

    def item_attributes(self, shard_index: int, ids: np.ndarray) -> list[dict[str, Any]]:
        """Per item of ``ids`` (n,) of a searched shard, {"uri": …, metadata…} (``ItemColumns.rows``),
        from its file (read and sha256-checked against the lineage once)."""
        return self.columns_of(next(r.shard for r in self.router.routes if r.shard.index == shard_index)).rows(ids)

    def columns_of(self, record: ShardRecord) -> ItemColumns:
        """The ``ItemColumns`` of a shard row's file, read on first use."""
        key = (record.embeddings_uri, record.sha256)
        if key not in self.item_columns:
            self.item_columns[key] = ItemColumns.of_attributes(*read_recorded_attributes(record))
        return self.item_columns[key]


def search_answer(service: SearchService, embeddings: torch.Tensor | np.ndarray, k: int,
                  queries_by_generation: Mapping[str, torch.Tensor | np.ndarray] | None = None) -> dict[str, Any]:
    """The top-``k`` hits of the (Q, D) serving-generation ``embeddings`` (and the same queries by
    the router's ``query_generations``) as ``orchestrator search --json`` and the server's ``POST
    /search`` return them (``answer_document``)."""
    return answer_document(service.router.search(embeddings, k, queries_by_generation),
                           service.router.searchable_items, service.item_attributes)


def answer_document(result: SearchResult, searchable_items: int,
                    attributes: Callable[[int, np.ndarray], Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """A search's answer: the serving generation, each generation's comparison path, the items
    searched, the shards not searched, and per query its hits (id, distance, shard, generation, the
    item's source URI and metadata from ``attributes``: (shard index, hit ids (n,)) → per hit
    {...}, ``SearchResult.rows``)."""
    return {"serving": result.serving, "paths": result.paths, "searched_items": searchable_items,
            "not_searched": [s.describe() for s in result.skipped], "results": result.rows(attributes)}


def service_for_pipeline(config, serving: str | None = None, *, metric: str = "map",
                         on_incompatible: OnIncompatible = "refuse",
                         train_images: Callable[[], Any] | None = None) -> SearchService:
    """The search service of a validated ``PipelineConfig``: its lineage, gallery, evaluation
    split (the criterion's dataset) and query preprocessing (normalisation of its training split)."""
    store = LineageStore(config.lineage, storage=config.storage, readonly=True)
    router = open_router(store, config.gallery.name, serving, metric=metric, dataset=config.data.eval_split,
                         on_incompatible=on_incompatible)
    return SearchService(router, *query_preprocessing(config, train_images))


def query_preprocessing(config, train_images: Callable[[], Any] | None = None
                        ) -> tuple[int, tuple[Sequence[float], Sequence[float]]]:
    """(image size, per-channel (mean, std) of the training split) with which a validated
    ``PipelineConfig``'s gallery was embedded, and so its image queries are."""
    from orchestrator.data import channel_statistics, load_source

    images = train_images() if train_images is not None else load_source(
        config.data.source, **config.data.loader_kwargs(config.data.train_split))
    size = config.data.image_size or int(images.images.shape[1])
    return size, channel_statistics(images)
