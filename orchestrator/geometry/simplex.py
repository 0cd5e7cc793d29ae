"""Fixed d-Simplex classifier prototypes (stationary_dsimplex.md §4.1).

The construction is deterministic, so every party that builds it with the same ``num_classes`` gets
bit-identical prototypes: it is the shared interface between model generations.
"""

from __future__ import annotations

import math

import torch

_NORMALIZATIONS = ("unit", "frobenius")
#: Additive guard in the normalisation denominators, as in both the paper and the released code.
_NORM_EPS = 1e-8


def dsimplex_vertices(
    num_classes: int,
    normalization: str = "unit",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Vertices of a regular simplex centred at 0 in ``R^(K-1)``; returns ``(K, K-1)``, row j = prototype j.

    Construction (stationary_dsimplex.md §4.1, Appendix D): ``v_i = e_i`` for ``i < K`` and
    ``v_K = (1 - sqrt(K))/(K-1) * 1``, then subtract the mean vertex. Every pair of rows has cosine
    ``-1/(K-1)`` and the rows sum to 0.

    ``normalization``:
      * ``"unit"`` (default): each row divided by ``its norm + 1e-8`` (released code; the reported
        results use it). Decision: default, because the spec says the results were produced with it.
      * ``"frobenius"``: the whole matrix divided by ``its Frobenius norm + 1e-8`` (paper App. D), so
        each row has norm ``1/sqrt(K)``.

    Built in float64 on the CPU and cast once, so the result does not depend on ``device``.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
    if normalization not in _NORMALIZATIONS:
        raise ValueError(
            f"normalization must be one of {_NORMALIZATIONS}, got {normalization!r}"
        )
    dim = num_classes - 1
    vertices = torch.zeros(num_classes, dim, dtype=torch.float64)
    vertices[:-1] = torch.eye(dim, dtype=torch.float64)
    vertices[-1] = (1.0 - math.sqrt(num_classes)) / dim
    vertices -= vertices.mean(dim=0, keepdim=True)
    if normalization == "unit":
        vertices /= vertices.norm(dim=1, keepdim=True) + _NORM_EPS
    else:
        vertices /= torch.linalg.norm(vertices) + _NORM_EPS
    return vertices.to(dtype=dtype, device=device)
