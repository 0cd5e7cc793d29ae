"""Poincaré ball of curvature ``-curv``: ``{x in R^d : ||x|| < 1/sqrt(curv)}`` (binary_hyperbolic.md §2.1).

Metric ``lambda_x^2 g^E`` with ``lambda_x = 2 / (1 - curv ||x||^2)`` (eqs. 18-19). ``curv`` is a positive
float or a 0-d tensor (differentiable). All tensors are ``(..., d)``.

Numerical guards: norms are ``sqrt(max(||.||^2, 1e-30))`` (finite value and zero gradient at 0);
conformal denominators ``1 - curv ||x||^2`` are floored at ``4 * finfo(dtype).eps`` so points on the
boundary (e.g. ``expmap0`` of a huge vector in float32) give large but finite distances; the
``artanh`` argument is kept ``4 eps`` below 1; the Möbius denominator is floored at 1e-15 (geoopt).
"""

from __future__ import annotations

import torch

from orchestrator.geometry._numerics import (
    MIN_SQUARED_NORM,
    Curvature,
    boundary_eps,
    check_curv,
    safe_norm,
    sqrt_curv,
)

#: Floor on the Möbius-addition denominator (geoopt's value; ``1/1e-15^2`` is finite in float32).
_MIN_MOBIUS_DENOMINATOR = 1e-15


def _conformal_denominator(squared_norm: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """``max(1 - curv ||x||^2, 4 eps)`` = ``2 / lambda_x`` with the boundary guard."""
    return torch.clamp(1.0 - curv * squared_norm, min=boundary_eps(squared_norm.dtype))


def mobius_add(x: torch.Tensor, y: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Möbius addition ``x (+)_c y`` (binary_hyperbolic.md eq. 21): ``(..., d), (..., d) -> (..., d)``.

    ``((1 + 2c<x,y> + c||y||^2) x + (1 - c||x||^2) y) / (1 + 2c<x,y> + c^2 ||x||^2 ||y||^2)``.
    """
    check_curv(curv)
    xy = (x * y).sum(dim=-1, keepdim=True)
    x2 = (x * x).sum(dim=-1, keepdim=True)
    y2 = (y * y).sum(dim=-1, keepdim=True)
    numerator = (1.0 + 2.0 * curv * xy + curv * y2) * x + (1.0 - curv * x2) * y
    denominator = 1.0 + 2.0 * curv * xy + curv**2 * x2 * y2
    return numerator / torch.clamp(denominator, min=_MIN_MOBIUS_DENOMINATOR)


def _distance(
    diff_sq: torch.Tensor, x_sq: torch.Tensor, y_sq: torch.Tensor, curv: Curvature
) -> torch.Tensor:
    """Arcosh closed form from ``||x-y||^2``, ``||x||^2``, ``||y||^2`` (broadcasting)."""
    sk = sqrt_curv(curv)
    diff_norm = torch.sqrt(torch.clamp(diff_sq, min=MIN_SQUARED_NORM))
    scale = torch.sqrt(_conformal_denominator(x_sq, curv) * _conformal_denominator(y_sq, curv))
    return 2.0 / sk * torch.asinh(sk * diff_norm / scale)


def distance(x: torch.Tensor, y: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Geodesic distance, elementwise: ``(..., d), (..., d) -> (...)``.

    ``d_c = (1/sqrt c) arcosh(1 + 2c||x-y||^2 / ((1 - c||x||^2)(1 - c||y||^2)))`` (binary_hyperbolic.md
    §2.1; equals eq. 20 ``(2/sqrt c) artanh(sqrt(c) ||(-x) (+)_c y||)``). Decision: NOT the printed
    eq. 2/29/48, which squares the norm and drops a sign (spec typo warning). Evaluated through the
    exact identity ``arcosh(1 + delta) = 2 asinh(sqrt(delta/2))``, i.e.
    ``(2/sqrt c) asinh(sqrt(c)||x-y|| / sqrt((1 - c||x||^2)(1 - c||y||^2)))``, which has no ``arcosh'(1)``
    singularity at ``x == y`` and no cancellation in ``1 + delta`` for nearby points.
    As ``c -> 0`` it tends to ``2||x-y||`` (the metric factor ``lambda_x -> 2``).
    """
    check_curv(curv)
    diff = x - y
    return _distance((diff * diff).sum(dim=-1), (x * x).sum(dim=-1), (y * y).sum(dim=-1), curv)


def pairwise_distance(x: torch.Tensor, y: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """All geodesic distances (same closed form as :func:`distance`): ``(N, d), (M, d) -> (N, M)``.

    ``||x-y||^2 = ||x||^2 + ||y||^2 - 2<x,y>`` via one matmul; no (N, M, d) tensor is built.
    """
    check_curv(curv)
    x_sq = (x * x).sum(dim=-1)
    y_sq = (y * y).sum(dim=-1)
    diff_sq = x_sq.unsqueeze(-1) + y_sq.unsqueeze(-2) - 2.0 * (x @ y.transpose(-1, -2))
    return _distance(diff_sq, x_sq.unsqueeze(-1), y_sq.unsqueeze(-2), curv)


def expmap0(v: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Exponential map at the origin ``tanh(sqrt(c)||v||) v / (sqrt(c)||v||)``: ``(..., d) -> (..., d)``.

    In float32 ``tanh`` saturates to 1 for ``sqrt(c)||v|| > ~9``, i.e. the point lands on the boundary;
    use :func:`clip_to_ball` (on the output) when such points must stay strictly inside.
    """
    check_curv(curv)
    rate = sqrt_curv(curv) * safe_norm(v, keepdim=True)
    return torch.tanh(rate) / rate * v


def logmap0(x: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Logarithmic map at the origin ``artanh(sqrt(c)||x||) x / (sqrt(c)||x||)``: ``(..., d) -> (..., d)``.

    Guard: the ``artanh`` argument is clamped to ``1 - 4 eps_dtype`` (boundary points stay finite).
    """
    check_curv(curv)
    rate = sqrt_curv(curv) * safe_norm(x, keepdim=True)
    bounded = torch.clamp(rate, max=1.0 - boundary_eps(rate.dtype))
    return torch.atanh(bounded) / rate * x


def clip_to_ball(x: torch.Tensor, curv: Curvature, eps: float = 1e-3) -> torch.Tensor:
    """Radially shrink points so that ``||x||^2 <= (1 - eps)/curv``: ``(..., d) -> (..., d)``.

    The margin is binary_hyperbolic.md eq. 31 (``||x||^2 <= 1 - delta``, ``delta = 1e-3``) at curvature
    ``curv``. Points already inside are returned unchanged.
    """
    check_curv(curv)
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")
    max_norm = ((1.0 - eps) / curv) ** 0.5
    factor = torch.clamp(max_norm / safe_norm(x, keepdim=True), max=1.0)
    return x * factor
