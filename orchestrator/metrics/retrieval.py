"""Retrieval accuracy M(Φ^Q, Φ^G): CMC@k and full-ranking mAP.

This is the metric M inside every compatibility number of the specs (HBCT §11, d-Simplex §8.1,
λ-orthogonality §4, prototype perturbation §9). Each query ranks the whole gallery by
``orchestrator.geometry.Geometry.pairwise_distance`` (ascending; the smaller the distance, the closer)
and is scored against the gallery labels:

- CMC@k (HBCT §11): 1 if at least one of the k highest-ranked gallery items has the query's label,
  else 0; averaged over queries.
- AP (HBCT §11, "mAP@1.0"): ``AP = (1/R) Σ_{j: item j relevant} Precision@j`` over the full ranking,
  where ``R`` is the number of relevant (same-label) gallery items. mAP is the mean AP over queries.

Decisions (the specs leave these open):

- Leave-one-out: when ids are given, gallery items whose id equals the query's id are removed from
  that query's ranking before anything is counted (they take no rank and are never relevant),
  because with Q = G the query would otherwise retrieve itself (HBCT §11, λ-orthogonality §4).
  The same rule applies to cross retrieval (new query vs. old gallery of the same images), as HBCT §11
  recommends.
- Queries with no relevant gallery item (after leave-one-out) count as misses for CMC (the
  denominator of CMC is all queries, the literal definition) and are left out of the mAP average,
  because their AP is 0/0. If no query has a relevant item, ``mean_ap`` is NaN.
- Ties in distance are broken by gallery order: the ranking is a stable sort by distance, so among
  equal distances the item with the smaller gallery index ranks first. This is deterministic, but
  it differs from scikit-learn's ``average_precision_score``, which scores a block of tied items
  together; with continuous embeddings exact ties do not occur.
- Queries are processed in chunks so that the (chunk, N_g) working set stays within about
  ``_WORKSPACE_BYTES``; a 10^6-item gallery therefore needs about 1 GiB, whatever N_q is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from orchestrator.geometry.geometry import Geometry
from orchestrator.geometry.spaces import Space

__all__ = [
    "RetrievalResult",
    "cmc_at_k",
    "default_chunk_size",
    "map_of_average_precisions",
    "mean_average_precision",
    "paired_difference_standard_error",
    "ranked_list_metrics",
    "retrieval_metrics",
    "retrieval_metrics_from_distances",
]


# Memory budget of one chunk of queries: the distances, the sort values and indices, the gathered
# masks and their cumulative sums take about _BYTES_PER_PAIR bytes per (query, gallery) pair.
_WORKSPACE_BYTES = 1 << 30
_BYTES_PER_PAIR = 48


@dataclass(frozen=True)
class RetrievalResult:
    """Retrieval accuracy of one (query model, gallery model) pair.

    Attributes:
        cmc: ``{k: CMC@k}`` in [0, 1] for each requested k; the denominator is all queries.
        mean_ap: mean full-ranking AP in [0, 1] over the queries that have at least one relevant
            gallery item (NaN if none has).
        num_queries: number of queries N_q.
        num_queries_with_relevant: number of queries that entered the mAP average.
        average_precisions: (N_q,) float64, each query's AP; NaN for a query with no relevant
            gallery item (``mean_ap`` is their mean over the others). Paired differences of two
            results on the same queries give the noise of a difference in mAP (the deployment gate).
    """

    cmc: dict[int, float]
    mean_ap: float
    num_queries: int
    num_queries_with_relevant: int
    average_precisions: np.ndarray = field(repr=False, compare=False)


def default_chunk_size(num_gallery: int) -> int:
    """Number of queries per chunk so that one chunk's working set fits in about 1 GiB.

    Each (query, gallery) pair costs about ``_BYTES_PER_PAIR`` bytes (distance, sort value and
    index, relevance and validity masks and their cumulative sums), so the chunk holds
    ``_WORKSPACE_BYTES // (_BYTES_PER_PAIR * num_gallery)`` queries, and at least one.
    """
    if num_gallery < 1:
        raise ValueError(f"num_gallery must be >= 1, got {num_gallery}")
    return max(1, _WORKSPACE_BYTES // (_BYTES_PER_PAIR * num_gallery))


def retrieval_metrics(
    queries: torch.Tensor | np.ndarray,
    gallery: torch.Tensor | np.ndarray,
    query_labels: torch.Tensor | np.ndarray | Sequence[int],
    gallery_labels: torch.Tensor | np.ndarray | Sequence[int],
    space: Space | str,
    curv: float | torch.Tensor = 1.0,
    ks: Sequence[int] = (1, 5),
    query_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    gallery_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    chunk_size: int | None = None,
) -> RetrievalResult:
    """CMC@k and full-ranking mAP of ``queries`` against ``gallery`` (HBCT §11).

    Args:
        queries: (N_q, D) query embeddings; for Lorentz, D = d + 1 (time first).
        gallery: (N_g, D) gallery embeddings in the same space.
        query_labels: (N_q,) integer class labels.
        gallery_labels: (N_g,) integer class labels.
        space: the space both embeddings live in; sets the ranking distance.
        curv: positive curvature magnitude (hyperbolic spaces only).
        ks: the k values of CMC@k, each >= 1.
        query_ids, gallery_ids: (N_q,), (N_g,) integer item ids, both or neither. A gallery item
            with the query's id is removed from that query's ranking (leave-one-out).
        chunk_size: queries per chunk; ``default_chunk_size(N_g)`` when None.

    Returns:
        ``RetrievalResult``; see the module docstring for ties and queries without relevant items.
    """
    space = Space.parse(space)
    queries_t = _as_embeddings(queries, "queries")
    gallery_t = _as_embeddings(gallery, "gallery").to(device=queries_t.device)
    if gallery_t.shape[1] != queries_t.shape[1]:
        raise ValueError(
            f"gallery must have the same dimension as queries ({queries_t.shape[1]}), "
            f"got shape {tuple(gallery_t.shape)}"
        )
    if gallery_t.dtype != queries_t.dtype:
        common = torch.promote_types(queries_t.dtype, gallery_t.dtype)
        queries_t, gallery_t = queries_t.to(common), gallery_t.to(common)
    num_queries, num_gallery = queries_t.shape[0], gallery_t.shape[0]

    geometry = Geometry(space, curv)

    def distances(start: int, stop: int) -> torch.Tensor:
        return geometry.pairwise_distance(queries_t[start:stop], gallery_t)

    return retrieval_metrics_from_distances(distances, num_queries, num_gallery, query_labels, gallery_labels, ks,
                                            query_ids, gallery_ids, chunk_size, device=queries_t.device,
                                            what=f"space {space.value!r}")


DistanceRows = Callable[[int, int], torch.Tensor]
"""``rows(start, stop)`` → (stop − start, N_g) distances of queries ``start:stop`` to the whole gallery."""


def retrieval_metrics_from_distances(
    distance_rows: DistanceRows,
    num_queries: int,
    num_gallery: int,
    query_labels: torch.Tensor | np.ndarray | Sequence[int],
    gallery_labels: torch.Tensor | np.ndarray | Sequence[int],
    ks: Sequence[int] = (1, 5),
    query_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    gallery_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    chunk_size: int | None = None,
    device: torch.device | str = "cpu",
    what: str = "the distance rows",
) -> RetrievalResult:
    """CMC@k and mAP from distances the caller computes chunk by chunk (same rules as
    ``retrieval_metrics``): for galleries whose parts are compared in different ways, e.g. shards
    of a mixed-generation gallery, each searched along its own compatibility path.

    distance_rows: ``rows(start, stop)`` → (stop − start, N_g) distances (smaller = closer).
    """
    device = torch.device(device)
    q_labels = _as_index_vector(query_labels, "query_labels", num_queries, device)
    g_labels = _as_index_vector(gallery_labels, "gallery_labels", num_gallery, device)
    if (query_ids is None) != (gallery_ids is None):
        raise ValueError(
            "query_ids and gallery_ids must be given together, got "
            f"query_ids={'None' if query_ids is None else 'given'}, "
            f"gallery_ids={'None' if gallery_ids is None else 'given'}"
        )
    q_ids = g_ids = None
    if query_ids is not None:
        q_ids = _as_index_vector(query_ids, "query_ids", num_queries, device)
        g_ids = _as_index_vector(gallery_ids, "gallery_ids", num_gallery, device)
    ks = _validate_ks(ks)
    if chunk_size is None:
        chunk_size = default_chunk_size(num_gallery)
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")

    hits = {k: 0 for k in ks}
    average_precisions = []
    with torch.no_grad():
        for start in range(0, num_queries, chunk_size):
            stop = min(start + chunk_size, num_queries)
            distances = distance_rows(start, stop)
            if tuple(distances.shape) != (stop - start, num_gallery):
                raise ValueError(f"distance rows {start}:{stop} must have shape {(stop - start, num_gallery)}, "
                                 f"got {tuple(distances.shape)}")
            if torch.isnan(distances).any():
                raise ValueError(f"distances in {what} contain NaN; check that queries and gallery "
                                 "are valid points of the space")
            chunk_hits, chunk_ap = _score_chunk(
                distances.to(device),
                q_labels[start:stop],
                g_labels,
                None if q_ids is None else q_ids[start:stop],
                g_ids,
                ks,
            )
            for k in ks:
                hits[k] += chunk_hits[k]
            average_precisions.append(chunk_ap.cpu().numpy())
    return _result(hits, np.concatenate(average_precisions), num_queries)


def map_of_average_precisions(average_precisions: np.ndarray) -> float:
    """mAP from (N_q,) per-query APs: their mean over the queries with a relevant item (NaN marks
    the others; NaN when none has one)."""
    scored = average_precisions[~np.isnan(average_precisions)]
    return float(scored.mean()) if scored.size else math.nan


def _result(hits: dict[int, int], average_precisions: np.ndarray, num_queries: int) -> RetrievalResult:
    """``RetrievalResult`` from CMC hit counts and (N_q,) per-query APs (NaN: no relevant item)."""
    return RetrievalResult(
        cmc={k: hits[k] / num_queries for k in hits},
        mean_ap=map_of_average_precisions(average_precisions),
        num_queries=num_queries,
        num_queries_with_relevant=int((~np.isnan(average_precisions)).sum()),
        average_precisions=average_precisions,
    )


def paired_difference_standard_error(after: np.ndarray, before: np.ndarray) -> float | None:
    """Standard error of the mean of ``after − before`` over the queries where both are defined.

    after, before: (N_q,) per-query scores of the same queries in the same order (e.g.
        ``RetrievalResult.average_precisions`` of two galleries); NaN marks a query without one.

    SE = std(d, ddof=1) / sqrt(n), d the n paired differences: the sampling noise of a difference
    in mAP measured on a sample of queries, far smaller than two unpaired errors when both rankings
    move together. None when fewer than two queries pair.
    """
    after, before = np.asarray(after, dtype=np.float64), np.asarray(before, dtype=np.float64)
    if after.shape != before.shape or after.ndim != 1:
        raise ValueError(f"after and before must be (N_q,) of one length, got {after.shape} and {before.shape}")
    differences = (after - before)[~(np.isnan(after) | np.isnan(before))]
    if differences.size < 2:
        return None
    return float(differences.std(ddof=1) / math.sqrt(differences.size))


def cmc_at_k(
    queries: torch.Tensor | np.ndarray,
    gallery: torch.Tensor | np.ndarray,
    query_labels: torch.Tensor | np.ndarray | Sequence[int],
    gallery_labels: torch.Tensor | np.ndarray | Sequence[int],
    space: Space | str,
    k: int = 1,
    **kwargs,
) -> float:
    """CMC@k alone; ``kwargs`` are those of ``retrieval_metrics`` (curv, ids, chunk_size)."""
    result = retrieval_metrics(
        queries, gallery, query_labels, gallery_labels, space, ks=(k,), **kwargs
    )
    return result.cmc[k]


def mean_average_precision(
    queries: torch.Tensor | np.ndarray,
    gallery: torch.Tensor | np.ndarray,
    query_labels: torch.Tensor | np.ndarray | Sequence[int],
    gallery_labels: torch.Tensor | np.ndarray | Sequence[int],
    space: Space | str,
    **kwargs,
) -> float:
    """Full-ranking mAP alone; ``kwargs`` are those of ``retrieval_metrics`` (curv, ids, chunk_size)."""
    result = retrieval_metrics(
        queries, gallery, query_labels, gallery_labels, space, ks=(1,), **kwargs
    )
    return result.mean_ap


def ranked_list_metrics(
    retrieved_labels: np.ndarray,
    query_labels: np.ndarray | Sequence[int],
    num_relevant: np.ndarray | Sequence[int],
    ks: Sequence[int] = (1, 5),
) -> RetrievalResult:
    """CMC@k and mAP@K from the top-K lists a search returned (rather than from full distances).

    retrieved_labels: (N_q, K) labels of each query's hits in rank order; −1 for an empty slot
                      (never relevant). Leave-one-out is the caller's: drop the query's own hit.
    query_labels:     (N_q,) labels (≥ 0).
    num_relevant:     (N_q,) R, the number of relevant items in the WHOLE gallery per query.

    AP@K = (1/R) Σ_{j ≤ K, item j relevant} Precision@j: the full-ranking AP of the module
    docstring restricted to the first K ranks, with the same 1/R normalisation, so with K ≥ the
    gallery size it equals ``retrieval_metrics``'s mAP, and for smaller K it is a lower bound of
    it. Queries with R = 0 are left out of the mean (NaN if none has R > 0); CMC counts all queries.
    """
    retrieved = np.asarray(retrieved_labels)
    if retrieved.ndim != 2:
        raise ValueError(f"retrieved_labels must be (N_q, K), got shape {retrieved.shape}")
    labels = np.asarray(query_labels)
    relevant_total = np.asarray(num_relevant)
    n, depth = retrieved.shape
    for name, array in (("query_labels", labels), ("num_relevant", relevant_total)):
        if array.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {array.shape}")
    ks = _validate_ks(ks)
    if max(ks) > depth:
        raise ValueError(f"CMC@{max(ks)} needs at least {max(ks)} hits per query, the lists hold {depth}")
    relevant = (retrieved == labels[:, None]) & (retrieved >= 0)
    if (relevant.sum(axis=1) > relevant_total).any():
        raise ValueError("num_relevant is smaller than the relevant hits found for some query")
    hits = {k: int(relevant[:, :k].any(axis=1).sum()) for k in ks}
    precision = np.cumsum(relevant, axis=1) / np.arange(1, depth + 1)
    has_relevant = relevant_total > 0
    ap = np.full(n, np.nan)
    ap[has_relevant] = (precision * relevant).sum(axis=1)[has_relevant] / relevant_total[has_relevant]
    return _result(hits, ap, n)


def _score_chunk(
    distances: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_labels: torch.Tensor,
    query_ids: torch.Tensor | None,
    gallery_ids: torch.Tensor | None,
    ks: tuple[int, ...],
) -> tuple[dict[int, int], torch.Tensor]:
    """Scores one chunk: ``distances`` (n, N_g) of n queries to the full gallery.

    Returns ``({k: number of CMC@k hits}, (n,) float64 AP per query, NaN where it has no relevant
    item)``.
    """
    num_gallery = distances.shape[1]
    order = torch.sort(distances, dim=1, stable=True).indices  # (n, N_g)
    del distances
    relevant = query_labels[:, None] == gallery_labels[None, :]  # (n, N_g)
    if query_ids is not None:
        kept = query_ids[:, None] != gallery_ids[None, :]
        relevant &= kept
        # rank[i, j]: 1-based position of the j-th sorted item among the kept items.
        rank = torch.gather(kept, 1, order).cumsum(dim=1)
    else:
        rank = torch.arange(1, num_gallery + 1, device=order.device).expand_as(order)
    sorted_relevant = torch.gather(relevant, 1, order)  # (n, N_g)
    del relevant, order
    num_relevant = sorted_relevant.sum(dim=1)  # (n,)

    # Best (smallest) rank of a relevant item; N_g + 1 when there is none.
    first_hit = torch.where(sorted_relevant, rank, gallery_labels.new_tensor(rank.shape[1] + 1))
    first_hit = first_hit.min(dim=1).values
    hits = {k: int((first_hit <= k).sum()) for k in ks}

    # AP = (1/R) Σ_{relevant j} (number of relevant items up to j) / rank_j.
    cumulative_relevant = sorted_relevant.cumsum(dim=1)
    rows, cols = sorted_relevant.nonzero(as_tuple=True)
    precision = cumulative_relevant[rows, cols].double() / rank[rows, cols].double()
    precision_sum = torch.zeros(num_relevant.shape[0], dtype=torch.float64, device=precision.device)
    precision_sum.index_add_(0, rows, precision)
    ap = precision_sum / num_relevant.double()  # 0/0 = NaN: no relevant item
    return hits, ap


def _as_embeddings(x: torch.Tensor | np.ndarray, name: str) -> torch.Tensor:
    """(N, D) floating tensor; numpy arrays keep their float precision."""
    tensor = torch.as_tensor(x)
    if tensor.ndim != 2 or tensor.shape[0] < 1 or tensor.shape[1] < 1:
        raise ValueError(f"{name} must have shape (N, D) with N, D >= 1, got {tuple(tensor.shape)}")
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} contains non-finite values")
    return tensor.detach()


def _as_index_vector(
    x: torch.Tensor | np.ndarray | Sequence[int], name: str, length: int, device: torch.device
) -> torch.Tensor:
    """(length,) int64 tensor on ``device``."""
    tensor = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    if tensor.ndim != 1 or tensor.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},), got {tuple(tensor.shape)}")
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {tensor.dtype}")
    return tensor.to(device=device, dtype=torch.int64)


def _validate_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in ks):
        raise ValueError(f"ks must be a non-empty sequence of ints >= 1, got {ks!r}")
    return tuple(sorted({int(k) for k in ks}))
