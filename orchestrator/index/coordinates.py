"""The float coordinates the compressed indexes quantise, and exact distances between them.

Per space (``coordinates``; float64 ``(N, D) -> (N, d)``):

* ``poincare``: the ball coordinates as they are (``d = D``);
* ``lorentz``: full points ``(N, d+1)``, time first, mapped to the Poincaré ball of the same
  curvature with the isometry ``lorentz.to_poincare`` (binary_hyperbolic.md Remark 3.3: bit-planes
  are defined on the ball; distances are unchanged, so retrieval is the same);
* ``euclidean``: as they are (the paper binarises its Euclidean baseline unchanged, §4.2);
* ``cosine``: L2-normalised (zero vectors stay zero, as in ``ShardIndex``), the points the cosine
  distance compares; the paper's hyperspherical baseline is binarised the same way.

``exact_distance`` is each space's retrieval distance between coordinates: the Poincaré geodesic
distance for both hyperbolic spaces (``poincare.distance``, float64; equal to the Lorentz one by the
isometry), L2 for euclidean, ``1 - cos`` for cosine, as ``ShardIndex`` returns them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from orchestrator.geometry import lorentz, poincare
from orchestrator.geometry.spaces import Space

_HYPERBOLIC = (Space.LORENTZ, Space.POINCARE)
#: Same floor as ``F.normalize``'s ``eps``: a zero vector stays zero.
_NORMALIZE_EPS = 1e-12


def check_embeddings(embeddings: np.ndarray, space: Space, curv: float) -> None:
    """ValueError unless float64 ``(N, D)`` gallery rows are valid points of ``space``."""
    n, dim = embeddings.shape
    if space is Space.LORENTZ and dim < 2:
        raise ValueError(f"lorentz embeddings must be (N, d+1) with d >= 1 (time first), got dim {dim}")
    if dim < 1:
        raise ValueError(f"embeddings must have at least one column, got shape {embeddings.shape}")
    if space is Space.POINCARE and n:
        radius_sq = (embeddings * embeddings).sum(axis=1).max()
        if radius_sq * curv >= 1.0:
            raise ValueError(
                f"poincare embeddings must lie inside the ball of radius 1/sqrt(curv) = {1 / math.sqrt(curv):.6g}, "
                f"max norm is {math.sqrt(radius_sq):.6g}"
            )


def coordinates(x: np.ndarray, space: Space, curv: float) -> np.ndarray:
    """float64 ``(N, D) -> (N, d)`` coordinates of ``space`` (module docstring)."""
    if space is Space.LORENTZ:
        return lorentz.to_poincare(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)), curv).numpy()
    if space is Space.COSINE:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), _NORMALIZE_EPS)
    return x


def exact_distance(space: Space, curv: float, queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Retrieval distance of each query to its candidates: ``(Q, d), (Q, F, d) -> (Q, F)`` float64."""
    queries = np.broadcast_to(queries[:, None, :], candidates.shape).astype(np.float64)
    candidates = candidates.astype(np.float64)
    if space in _HYPERBOLIC:
        return poincare.distance(torch.from_numpy(queries), torch.from_numpy(candidates), curv).numpy()
    if space is Space.EUCLIDEAN:
        return np.sqrt(((queries - candidates) ** 2).sum(axis=-1))
    return 1.0 - (queries * candidates).sum(axis=-1)
