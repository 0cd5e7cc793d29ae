"""The ingress side of the replica pools: a snapshot's search service whose queries are embedded
by encoder replicas (``serving.encoders``) and whose shards are searched by shard-search replicas
(``serving.shares``), merged here with the router's own functions.

``PooledServices(calls, gallery).build(state, generation)`` is the ingress's ``build_service``
(``serving.endpoint.GalleryEndpoint``): an encoder replica plans the snapshot (the router's
admission, ``search.router.plan_routes``), every share holding admitted shards prepares its part
under the snapshot's key (``<snapshot id>/<generation>``), and the index kinds they report are
checked to merge into one ranking (``check_one_distance_unit``), all before the snapshot is
swapped in. ``PooledService.answer`` runs ``search.router.search_merged`` with a chunk search that
fans the queries out to the shares in parallel and gathers their ``search_shards`` lists, then
``RoutePlan.result`` and ``search.service.answer_document``: the merge, the result and the answer
document of ``orchestrator search``. A share that no longer holds the key (restarted, or it
dropped it) answers None; it is sent the key's routes again and asked once more, so a request is
answered from its one snapshot or fails, never from another.

``calls`` reaches the pools (``PoolCalls``; ``serving.app.HandleCalls`` over Serve deployment
handles): each call returns a ``Pending`` whose ``result()`` waits for the answer, so the calls
to several shares run at once. A batch of requests the ingress answers together is one call to
each share.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import torch

from orchestrator.search.attributes import ItemColumns
from orchestrator.search.router import ShardHits, check_one_distance_unit, search_merged
from orchestrator.search.service import answer_document
from orchestrator.serving.shares import share_of

if TYPE_CHECKING:
    from orchestrator.comparison import ComparisonPath
    from orchestrator.lineage.records import ShardRecord
    from orchestrator.serving.encoders import EncoderPlan
    from orchestrator.serving.model_cache import ModelKey
    from orchestrator.serving.snapshots import LineageState

T = TypeVar("T", covariant=True)
#: (shard row, comparison path) pairs of the shards one share searches for a snapshot.
Admitted = list[tuple["ShardRecord", "ComparisonPath"]]


class Pending(Protocol[T]):
    """A call under way; ``result()`` waits for its answer (or raises what the callee raised)."""

    def result(self) -> T: ...


class PoolCalls(Protocol):
    """The calls of the ingress to the encoder and shard-search replicas."""

    shares: int

    def plan(self, state: LineageState, generation: str) -> Pending[EncoderPlan]: ...

    def encode(self, model_key: ModelKey, images: np.ndarray) -> Pending[np.ndarray]: ...

    def prepare(self, share: int, key: str, admitted: Sequence[tuple[ShardRecord, ComparisonPath]]
                ) -> Pending[list[tuple[int, str]]]: ...

    def search(self, share: int, key: str, queries: np.ndarray, k: int, others: dict[str, np.ndarray]
               ) -> Pending[tuple[ShardHits, dict[int, ItemColumns]] | None]: ...


class PooledServices:
    """``build(state, generation)``: the ``PooledService`` of a snapshot (module docstring)."""

    def __init__(self, calls: PoolCalls, gallery: str):
        self.calls, self.gallery = calls, gallery

    def build(self, state: LineageState, generation: str) -> PooledService:
        planned = self.calls.plan(state, generation).result()
        key = f"{state.snapshot_id}/{generation}"
        by_share: dict[int, Admitted] = {}
        for shard, path in planned.plan.admitted:
            by_share.setdefault(share_of(shard.index, self.calls.shares), []).append((shard, path))
        pending = [self.calls.prepare(share, key, admitted) for share, admitted in by_share.items()]
        kinds = dict(pair for prepared in pending for pair in prepared.result())
        check_one_distance_unit(self.gallery, [(shard, kinds[shard.index]) for shard, _path in planned.plan.admitted])
        return PooledService(self.calls, key, planned, by_share)


class PooledService:
    """A snapshot's search over the replica pools: a ``serving.protocols.SnapshotService``, as
    ``search.service.SearchService`` is in one process."""

    def __init__(self, calls: PoolCalls, key: str, planned: EncoderPlan, by_share: dict[int, Admitted]):
        self.calls, self.key, self.planned, self.by_share = calls, key, planned, by_share

    @property
    def serving(self) -> str:
        return self.planned.plan.serving

    @property
    def width(self) -> int:
        return self.planned.width

    @property
    def query_generations(self) -> tuple[str, ...]:
        return self.planned.plan.query_generations

    def width_of(self, generation: str) -> int:
        return self.planned.widths[generation]

    def encode(self, images: np.ndarray, generation: str | None = None) -> torch.Tensor:
        """(N, H, W, 3) uint8 images → (N, D) embeddings of the serving generation (or of
        ``generation``, one of ``query_generations``), by an encoder replica."""
        key = self.planned.model_key if generation is None else self.planned.model_keys[generation]
        return torch.from_numpy(self.calls.encode(key, images).result())

    def answer(self, embeddings: torch.Tensor | np.ndarray, k: int,
               queries_by_generation: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        """The answer document of the (Q, D) serving-generation ``embeddings``' top-``k``
        (``queries_by_generation``: the same queries by the ``query_generations``)."""
        plan = self.planned.plan
        columns: dict[int, list[ItemColumns]] = {}  # by shard: the columns of its hits, per chunk

        def search_chunk(chunk: torch.Tensor, other_chunks: dict[str, torch.Tensor]) -> ShardHits:
            queries = chunk.numpy()
            others = {name: np.asarray(found) for name, found in other_chunks.items()}
            pending = {share: self.calls.search(share, self.key, queries, k, others) for share in self.by_share}
            hits = ShardHits()
            for share, answer in pending.items():
                found = answer.result()
                if found is None:  # the share no longer holds this snapshot: hand it the routes again
                    self.calls.prepare(share, self.key, self.by_share[share]).result()
                    found = self.calls.search(share, self.key, queries, k, others).result()
                    if found is None:
                        raise RuntimeError(f"shard share {share} dropped snapshot {self.key} again while asked to search it")
                share_hits, share_columns = found
                hits.extend(share_hits)
                for shard, found_columns in share_columns.items():
                    columns.setdefault(shard, []).append(found_columns)
            return hits

        def attributes(shard: int, ids: np.ndarray) -> list[dict[str, Any]]:
            parts = columns.get(shard, [])
            held = parts[0] if len(parts) == 1 else ItemColumns.joined(parts)
            return held.rows(ids)

        result = plan.result(*search_merged(embeddings, k, len(plan.admitted), search_chunk, queries_by_generation))
        return answer_document(result, plan.searchable_items, attributes)

