"""Numerical guards shared by the hyperbolic geometry modules (private).

Every guard here is chosen so that float32 values AND float32 gradients stay finite at the
edges of the domain (zero vectors, points at the origin, coincident points, huge norms).
"""

from __future__ import annotations

import torch

Curvature = float | torch.Tensor

#: Floor on a squared norm before ``sqrt``. The derivative of ``sqrt`` at the floor is
#: ``1 / (2 * 1e-15)``-ish, finite, and the clamp zeroes the gradient below it, so ``||0||``
#: has gradient 0 instead of NaN. ``1e-30`` is a normal float32 number.
MIN_SQUARED_NORM = 1e-30


def check_curv(curv: Curvature) -> None:
    """Raise ValueError unless a Python-number curvature is finite and > 0.

    Tensor curvatures are not value-checked: that would force a host-device sync on every call.
    A learnable curvature is kept positive by its owner (e.g. ``exp`` of a log-parameter).
    """
    if isinstance(curv, torch.Tensor):
        return
    if isinstance(curv, bool) or not isinstance(curv, (int, float)):
        raise ValueError(f"curv must be a positive float or a tensor, got {curv!r}")
    if not 0.0 < curv < float("inf"):
        raise ValueError(f"curv must be finite and > 0 (curvature is -curv), got {curv!r}")


def sqrt_curv(curv: Curvature) -> Curvature:
    """``sqrt(curv)``, differentiable when ``curv`` is a tensor."""
    return curv**0.5


def safe_norm(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Euclidean norm ``sqrt(max(sum x^2, MIN_SQUARED_NORM))``: value ~1e-15 and gradient 0 at x = 0."""
    squared = (x * x).sum(dim=dim, keepdim=keepdim)
    return torch.sqrt(torch.clamp(squared, min=MIN_SQUARED_NORM))


def boundary_eps(dtype: torch.dtype) -> float:
    """Margin kept from +-1 before ``asin``/``acos``/``artanh``: 4 ulp of 1.0 in ``dtype``.

    MERU uses 1e-8, but ``1 - 1e-8 == 1`` in float32, where the derivative of ``acos`` is
    infinite; 4 * machine-eps is representable (float32: 4.8e-7, float64: 8.9e-16).
    """
    return 4.0 * torch.finfo(dtype).eps
