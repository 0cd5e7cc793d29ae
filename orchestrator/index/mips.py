"""The MIPS-to-L2 reduction (Bachrach et al. 2014): a maximum-inner-product search as an L2 search.

The hyperbolic spaces are searched by an inner product (``shard_index``, ``stores.vectors``): the
gallery holds ``x = [x_t, x_s]`` and a query is searched as ``q = [-q_t, q_s]``, so ``q · x =
<q, x>_L``. That is exact for a scan, but an HNSW graph or IVF cells are built from gallery-gallery
similarities, which on ``[x_t, x_s]`` are Euclidean inner products, not Lorentz ones. The reduction
gives every gallery row the same Euclidean norm ``M`` (the largest of the rows, slightly raised)::

    gallery  x' = [x, sqrt(M² − |x|²)]        (N, D) → (N, D+1),  |x'| = M
    query    q' = [q, 0]                      (Q, D) → (Q, D+1)
    |q' − x'|² = |q|² + M² − 2 q·x

so for one query the L2 order of the rows is exactly their inner-product order (geodesic order),
and gallery-gallery L2 is the ambient distance of points on a sphere of radius ``M``, which HNSW
graphs and k-means cells handle. The float32 L2 loses digits to the large ``M²``: searchers fetch
more candidates than asked and rank them by the exact distance.
"""
from __future__ import annotations

import numpy as np

from orchestrator.geometry.spaces import Space

#: ``M²`` is the rows' largest squared norm times this, so no row's added coordinate is the root of
#: a rounding-negative number.
NORM_MARGIN = 1.0 + 1e-6


def uses_mips(space: Space | str, approximate: bool) -> bool:
    """Whether a search of ``space`` goes through this reduction: an approximate index (graph or
    cells) over a hyperbolic space. Euclidean rows are searched by L2 already; cosine rows are unit
    vectors, whose inner-product order is their L2 order; an exact scan needs no graph."""
    return approximate and Space.parse(space).hyperbolic


def mips_gallery(vectors: np.ndarray) -> np.ndarray:
    """Gallery rows ``(N, D)`` → ``(N, D+1)`` float64 ``[x, sqrt(M² − |x|²)]``, every row of norm ``M``."""
    vectors = np.asarray(vectors, dtype=np.float64)
    squared = (vectors * vectors).sum(axis=1, keepdims=True)
    bound = squared.max(initial=0.0) * NORM_MARGIN
    return np.concatenate([vectors, np.sqrt(np.maximum(bound - squared, 0.0))], axis=1)


def mips_queries(queries: np.ndarray) -> np.ndarray:
    """Query vectors ``(Q, D)`` (as the inner product is taken with them) → ``(Q, D+1)`` ``[q, 0]``."""
    queries = np.asarray(queries)
    return np.concatenate([queries, np.zeros((len(queries), 1), dtype=queries.dtype)], axis=1)
