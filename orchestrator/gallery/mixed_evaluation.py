"""Retrieval quality of a gallery whose shards hold embeddings of different generations.

The serving generation's queries rank ALL gallery items at once: each shard's items are compared
along the ``comparison_path`` from the serving generation to the shard's generation (raw
embeddings in a shared space, queries mapped by backward adapters, or the shard's embeddings
mapped by forward maps into the serving generation's space), and the distances of all
shards form one (N_q, N_g) ranking, exactly what a search over the sharded index returns when it
merges per-shard results by distance. A shard whose generation the serving one cannot search
raises ``IncomparableGenerations``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.gallery.shard_files import ShardEmbeddings
from orchestrator.geometry.geometry import Geometry
from orchestrator.metrics import retrieval_metrics_from_distances
from orchestrator.models.bundle import CompatibleModel


@dataclass(frozen=True)
class MixedGalleryResult:
    """CMC@k and mAP of one serving generation over a mixed gallery, and what the gallery held.

    items_by_generation: generation name → number of gallery items it embedded.
    average_precisions:  (N_q,) each query's AP (NaN: no relevant item), in the queries' order.
    """

    serving: str
    cmc: dict[int, float]
    mean_ap: float
    num_queries: int
    average_precisions: np.ndarray = field(repr=False, compare=False)
    items_by_generation: dict[str, int] = field(default_factory=dict)

    @property
    def fraction_by_generation(self) -> dict[str, float]:
        total = sum(self.items_by_generation.values())
        return {name: count / total for name, count in self.items_by_generation.items()}

    def as_row(self) -> dict[str, float | str | int]:
        row: dict[str, float | str | int] = {"serving": self.serving, "queries": self.num_queries}
        row.update({f"cmc@{k}": v for k, v in self.cmc.items()})
        row["map"] = self.mean_ap
        row.update({f"items:{name}": count for name, count in self.items_by_generation.items()})
        return row


def comparable_shards(serving: str, shards: Sequence[ShardEmbeddings], models: Mapping[str, CompatibleModel],
                      parents: Mapping[str, str | None]) -> tuple[list[ShardEmbeddings], dict[str, str]]:
    """The shards ``serving``'s queries can be compared with (a ``comparison_path`` exists), and, per
    generation left out, why (no common distance: the router leaves its items out too)."""
    reasons: dict[str, str] = {}
    for name in sorted({s.generation for s in shards}):
        try:
            comparison_path(serving, name, models, parents)
        except IncomparableGenerations as refused:
            reasons[name] = refused.reason
    return [s for s in shards if s.generation not in reasons], reasons


def evaluate_mixed_gallery(
    serving: str,
    queries: torch.Tensor,
    query_labels: np.ndarray,
    query_ids: np.ndarray | None,
    shards: Sequence[ShardEmbeddings],
    models: Mapping[str, CompatibleModel],
    parents: Mapping[str, str | None],
    ks: Sequence[int] = (1, 5),
    queries_by_generation: Mapping[str, torch.Tensor] | None = None,
) -> MixedGalleryResult:
    """Rank every gallery item (all ``shards``) for each query of the ``serving`` generation.

    queries:     (N_q, D) the serving generation's query embeddings.
    query_ids:   (N_q,) ids for leave-one-out when the queries are gallery items, else None.
    shards:      the gallery's shard files (any generations); models must hold each of their
                 generations (and any generation on an adapter path) and ``serving``.
    queries_by_generation: the same queries embedded by the generations a spherical
                 interpolation path needs (``query_generations_of``), as the router takes them.
    """
    if not shards:
        raise ValueError("evaluate_mixed_gallery: the gallery has no shards")
    groups: dict[str, list[ShardEmbeddings]] = {}
    for shard in shards:
        groups.setdefault(shard.generation, []).append(shard)
    parts = []  # (path, aligned queries, aligned gallery) per generation
    labels, ids, counts = [], [], {}
    for generation, members in groups.items():
        gallery = torch.from_numpy(np.concatenate([s.embeddings for s in members]))
        path = comparison_path(serving, generation, models, parents)
        aligned_queries, aligned_gallery = path.align(queries, gallery, queries_by_generation)
        parts.append((path, aligned_queries.double(), aligned_gallery.double()))
        labels.append(np.concatenate([s.labels for s in members]))
        ids.append(np.concatenate([s.ids for s in members]))
        counts[generation] = int(gallery.shape[0])
    gallery_labels, gallery_ids = np.concatenate(labels), np.concatenate(ids)

    def rows(start: int, stop: int) -> torch.Tensor:
        return torch.cat([Geometry(path.space, path.curv).pairwise_distance(q[start:stop], g)
                          for path, q, g in parts], dim=1)

    result = retrieval_metrics_from_distances(
        rows, len(queries), len(gallery_labels), query_labels, gallery_labels, ks,
        query_ids=query_ids, gallery_ids=None if query_ids is None else gallery_ids,
        what=f"the mixed gallery served by {serving!r}")
    return MixedGalleryResult(serving, result.cmc, result.mean_ap, result.num_queries, result.average_precisions,
                              counts)
