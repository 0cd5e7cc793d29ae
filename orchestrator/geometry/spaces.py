"""Embedding spaces and their retrieval distance (smaller = closer)."""

from __future__ import annotations

from enum import Enum

import torch
import torch.nn.functional as F

from orchestrator.geometry import lorentz, poincare
from orchestrator.geometry._numerics import Curvature


class Space(str, Enum):
    """Where embeddings live; the value is the string used in configs."""

    EUCLIDEAN = "euclidean"
    COSINE = "cosine"
    LORENTZ = "lorentz"
    POINCARE = "poincare"

    @classmethod
    def parse(cls, space: Space | str) -> Space:
        """Return the member for a ``Space`` or its string value; ValueError naming a bad value."""
        try:
            return cls(space)
        except ValueError:
            valid = [member.value for member in cls]
            raise ValueError(f"space must be one of {valid}, got {space!r}") from None


def pairwise_distance(
    space: Space | str,
    queries: torch.Tensor,
    gallery: torch.Tensor,
    curv: Curvature = 1.0,
) -> torch.Tensor:
    """Distances between every query and every gallery item: ``(Nq, D), (Ng, D) -> (Nq, Ng)``.

    * euclidean: L2 distance;
    * cosine: ``1 - cos``; zero vectors are normalised to 0 (``F.normalize``), so their cosine is 0
      and their distance 1 to everything;
    * lorentz: geodesic distance, ``D = d+1`` full points, time first (``lorentz.pairwise_distance``);
    * poincare: geodesic distance in the ball of radius ``1/sqrt(curv)`` (``poincare.pairwise_distance``).

    ``curv`` is used by the hyperbolic spaces only.
    """
    space = Space.parse(space)
    if queries.dim() != 2 or gallery.dim() != 2 or queries.shape[1] != gallery.shape[1]:
        raise ValueError(
            "queries and gallery must be (Nq, D) and (Ng, D) with the same D, got "
            f"queries {tuple(queries.shape)} and gallery {tuple(gallery.shape)}"
        )
    if space is Space.EUCLIDEAN:
        return torch.cdist(queries, gallery)
    if space is Space.COSINE:
        return 1.0 - F.normalize(queries, dim=1) @ F.normalize(gallery, dim=1).T
    if space is Space.LORENTZ:
        return lorentz.pairwise_distance(queries, gallery, curv)
    return poincare.pairwise_distance(queries, gallery, curv)
