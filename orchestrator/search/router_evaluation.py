"""Batch search for evaluation: CMC@k and mAP of what a router actually returns.

The router's hits (through the shards' FAISS indexes, merged, with any skipped shards left out)
are scored against the gallery's labels. With ``k`` = the gallery size the result is the
full-ranking CMC/mAP of ``orchestrator.metrics`` (exact for flat indexes, so it equals the
brute-force mixed-gallery evaluation; approximate indexes show their loss). ``num_relevant``
counts the relevant items of the WHOLE gallery, skipped shards included, so items a refused shard
hides count as misses rather than shrinking the denominator.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from orchestrator.metrics import RetrievalResult, ranked_list_metrics
from orchestrator.search.router import SearchRouter


@dataclass(frozen=True)
class SearchEvaluation:
    """Retrieval quality of one router on labelled queries, and how much of the gallery it saw."""

    result: RetrievalResult
    k: int
    searched_items: int
    gallery_items: int
    skipped: tuple[str, ...]

    def as_row(self) -> dict[str, float | int | str]:
        row: dict[str, float | int | str] = {f"cmc@{k}": v for k, v in self.result.cmc.items()}
        row.update({"map": self.result.mean_ap, "k": self.k, "searched_items": self.searched_items,
                    "gallery_items": self.gallery_items})
        if self.skipped:
            row["skipped"] = "; ".join(self.skipped)
        return row


def evaluate_search(router: SearchRouter, queries: torch.Tensor | np.ndarray, query_labels: np.ndarray,
                    gallery_ids: np.ndarray, gallery_labels: np.ndarray, k: int | None = None,
                    query_ids: np.ndarray | None = None, ks: Sequence[int] = (1, 5),
                    queries_by_generation: Mapping[str, torch.Tensor | np.ndarray] | None = None) -> SearchEvaluation:
    """Search ``queries`` (N_q, D) and score the top-``k`` lists (None: the whole gallery).

    gallery_ids, gallery_labels: (N_g,) every gallery item's id and label (all shards).
    query_ids: (N_q,) when the queries are gallery items: each query's own hit is removed
               (leave-one-out), so ``k + 1`` items are fetched.
    queries_by_generation: the same queries embedded by the router's ``query_generations``.
    """
    gallery_ids, gallery_labels = np.asarray(gallery_ids, dtype=np.int64), np.asarray(gallery_labels, dtype=np.int64)
    query_labels = np.asarray(query_labels, dtype=np.int64)
    depth = len(gallery_ids) if k is None else k
    fetched = router.search(queries, depth + (query_ids is not None), queries_by_generation)
    hit_ids = fetched.ids
    if query_ids is not None:
        hit_ids = _drop_own_hit(hit_ids, np.asarray(query_ids, dtype=np.int64))
    order = np.argsort(gallery_ids)
    position = np.searchsorted(gallery_ids, hit_ids, sorter=order).clip(0, len(gallery_ids) - 1)
    found = order[position]
    known = (hit_ids >= 0) & (gallery_ids[found] == hit_ids)
    if ((hit_ids >= 0) & ~known).any():
        raise ValueError("the search returned item ids that are not in the given gallery ids")
    retrieved_labels = np.where(known, gallery_labels[found], -1)
    counts = np.bincount(gallery_labels, minlength=int(max(gallery_labels.max(), query_labels.max())) + 1)
    num_relevant = counts[query_labels]
    if query_ids is not None:  # the query itself is a gallery item of its own label
        num_relevant = num_relevant - np.isin(query_ids, gallery_ids).astype(np.int64)
    result = ranked_list_metrics(retrieved_labels, query_labels, num_relevant, ks)
    return SearchEvaluation(result, depth, router.searchable_items, len(gallery_ids),
                            tuple(s.describe() for s in router.skipped))


def _drop_own_hit(hit_ids: np.ndarray, query_ids: np.ndarray) -> np.ndarray:
    """(Q, k+1) hits → (Q, k): each row without the query's own id, else without its last hit."""
    own = hit_ids == query_ids[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), hit_ids.shape[1] - 1)
    keep = np.ones(hit_ids.shape, dtype=bool)
    keep[np.arange(len(hit_ids)), drop] = False
    return hit_ids[keep].reshape(len(hit_ids), hit_ids.shape[1] - 1)
