"""A shard-search replica's share of the gallery: the indexes of some shards, searched for the
snapshots the ingress prepares.

Shard ``i`` belongs to share ``share_of(i, shares) = i mod shares``: a pure function of the shard
index, so every ingress replica sends a shard's work to the same share, and a share keeps its
shards across snapshots (a shard commit reloads one shard in one share).

``ShardShare.prepare(key, admitted)`` loads (or reuses) the indexes of the admitted (shard row,
comparison path) pairs the ingress planned for snapshot ``key`` (its id and the searching
generation), builds a forward path's in-memory index, reads every shard file's attribute columns
(for the hits' URIs and metadata, ``search.attributes.ItemColumns``), and holds them under
``key``; ``search(key, queries, k)`` answers from exactly that key's routes with
``search.router.search_shards``, the router's own per-shard search, with the columns of the items
it found, and returns None when it holds no such key (a restarted replica, or one that dropped it): the ingress
prepares it again and retries, so a request is never answered from another snapshot. At most
``MAX_HELD`` keys are held, the least recently used dropped first.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.serving.index_cache import IndexCache

if TYPE_CHECKING:
    from orchestrator.comparison import ComparisonPath
    from orchestrator.lineage import LineageStore
    from orchestrator.lineage.records import ShardRecord
    from orchestrator.search.attributes import ItemColumns
    from orchestrator.search.router import ShardHits, ShardRoute

#: What a share holds for one snapshot key: its routes, and each shard's attribute columns.
Held = tuple[list["ShardRoute"], dict[int, "ItemColumns"]]

#: Snapshot keys one share holds at most (the current ones, and replaced ones still answering).
MAX_HELD = 8


def share_of(shard_index: int, shares: int) -> int:
    """The share (0 … shares−1) that holds shard ``shard_index``."""
    if shares < 1:
        raise ValueError(f"shares must be at least 1, got {shares}")
    return shard_index % shares


class ShardShare:
    """Share ``share`` of ``shares`` of one gallery's shard indexes (module docstring)."""

    def __init__(self, store: LineageStore, share: int, shares: int):
        if not 0 <= share < shares:
            raise ValueError(f"share {share} of {shares}: must be 0 … {shares - 1}")
        self.store, self.share, self.shares = store, share, shares
        self._held: collections.OrderedDict[str, Held] = collections.OrderedDict()
        self.indexes = IndexCache(store)
        self._columns: dict[tuple[str | None, str | None], ItemColumns] = {}
        self._lock = threading.Lock()  # the held keys
        self._build_lock = threading.Lock()  # builds, and the caches they fill

    def prepare(self, key: str, admitted: Sequence[tuple[ShardRecord, ComparisonPath]]) -> list[tuple[int, str]]:
        """Load and hold the routes of snapshot ``key``: ``admitted`` (shard row, comparison path)
        pairs, all of this share. Returns (shard index, index kind) of each, for the ingress's
        check that one ranking can merge them (``search.router.check_one_distance_unit``)."""
        from orchestrator.search.router import load_route
        from orchestrator.stores import read_checked_embeddings

        foreign = [shard.index for shard, _path in admitted if share_of(shard.index, self.shares) != self.share]
        if foreign:
            raise ValueError(f"share {self.share} of {self.shares} was sent shards {foreign} of other shares")
        with self._build_lock:  # one build at a time; a key already held is not built again
            with self._lock:
                held = self._held.get(key)
            if held is None:  # loading takes the time: searches of held keys go on meanwhile
                routes = [load_route(shard, path, lambda _uri, shard=shard: self.indexes.load(shard),
                                     lambda shard: read_checked_embeddings(self.store, shard))
                          for shard, path in admitted]
                held = routes, {route.shard.index: self._columns_of(route.shard) for route in routes}
            with self._lock:
                self._held[key] = held
                self._held.move_to_end(key)
                while len(self._held) > MAX_HELD:
                    self._held.popitem(last=False)
            self._drop_unheld()
        routes = held[0]
        return [(route.shard.index, route.index.kind) for route in routes]

    def search(self, key: str, queries: np.ndarray, k: int, others: dict[str, np.ndarray] | None = None
               ) -> tuple[ShardHits, dict[int, ItemColumns]] | None:
        """(``ShardHits`` of the (Q, D) serving-generation ``queries`` in this share's shards of
        snapshot ``key``, {shard index: the ``ItemColumns`` of the items found there}), or None
        when ``key`` is not held. ``others``: the same queries embedded by the generations an
        interpolating path needs (``RoutePlan.query_generations``)."""
        import torch

        from orchestrator.search.router import search_shards

        with self._lock:
            held = self._held.get(key)
        if held is None:
            return None
        routes, columns = held
        hits = search_shards(routes, torch.from_numpy(np.asarray(queries)), k,
                             {name: torch.from_numpy(np.asarray(found)) for name, found in (others or {}).items()})
        return hits, {shard: columns[shard].subset(ids) for shard, ids in zip(hits.sources, hits.ids)}

    def _columns_of(self, shard: ShardRecord) -> ItemColumns:
        """The attribute columns of the shard's file, its sha256 checked against the lineage row
        (read once while held)."""
        from orchestrator.gallery import read_recorded_attributes
        from orchestrator.search.attributes import ItemColumns

        key = (shard.embeddings_uri, shard.sha256)
        if key not in self._columns:
            self._columns[key] = ItemColumns.of_attributes(*read_recorded_attributes(shard))
        return self._columns[key]

    def _drop_unheld(self) -> None:
        """Forget the indexes and files no held key's shards name."""
        with self._lock:
            uris = {uri for routes, _files in self._held.values() for route in routes
                    for uri in (route.shard.index_uri, route.shard.embeddings_uri) if uri is not None}
        self.indexes.keep(uris)
        for key in [key for key in self._columns if key[0] not in uris]:
            del self._columns[key]

