"""Search services built in the server's own process (the single-process mode of ``orchestrator
serve``, ``--search-replicas 0``, and the endpoint's tests): each snapshot's ``SearchService``,
from ``search.service.open_router``, reusing what earlier snapshots loaded.

Reused while the lineage serves the same files: an index by (URI, the sha256 the lineage holds
for it now), a shard file's attribute columns by (URI, sha256) (``search.attributes``), a model by
its hashes (``serving.model_cache``). What no current shard row names is dropped at the next build.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.serving.index_cache import IndexCache
from orchestrator.serving.model_cache import ModelCache
from orchestrator.serving.settings import ServeSettings

if TYPE_CHECKING:
    from orchestrator.lineage import LineageStore
    from orchestrator.search.attributes import ItemColumns
    from orchestrator.search.service import SearchService
    from orchestrator.serving.snapshots import LineageState


class LocalServices:
    """``build(state, generation)``: the search service of ``generation`` over a snapshot's state.

    settings: the server's ``ServeSettings``; store: its lineage reader; size, normalisation: the
    query preprocessing of the pipeline (``search.service.query_preprocessing``).
    """

    def __init__(self, settings: ServeSettings, store: LineageStore, size: int,
                 normalisation: tuple[Sequence[float], Sequence[float]]):
        self.settings, self.store, self.size, self.normalisation = settings, store, size, normalisation
        self.models = ModelCache(store)
        self.indexes = IndexCache(store)
        self._item_columns: dict[tuple[str, str], ItemColumns] = {}

    def build(self, state: LineageState, generation: str) -> SearchService:
        """The ``SearchService`` of ``generation`` over ``state``, its shard files' attribute
        columns read (and checked) and its query widths encoded now, not on a request (the first
        batch on a new snapshot waited ~5 ms for its width, more on loaded cores)."""
        from orchestrator.search.service import SearchService, open_router

        self.indexes.keep(state.uris)  # drop what no current shard row names
        for key in [key for key in self._item_columns if key[0] not in state.uris]:
            del self._item_columns[key]
        config = self.settings.config
        router = open_router(self.store, config.gallery.name, generation, metric=self.settings.metric,
                             dataset=config.data.eval_split, on_incompatible=self.settings.on_incompatible,
                             shards=state.shards, load_index=self.indexes.load, load_model=self.models.load)
        service = SearchService(router, self.size, self.normalisation, self._item_columns)
        for route in router.routes:
            service.columns_of(route.shard)
        for searching in (generation, *service.query_generations):
            service.width_of(searching)
        return service
